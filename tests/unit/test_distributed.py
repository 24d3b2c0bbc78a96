"""Strategy logic on plain values: DeepSpeed JSON reconciliation, precision, LR-schedule sizing, collective faults."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, main_here, tiny_flags

from qa_train.config.flags import parse_args
from qa_train.config.settings import ConfigError
from qa_train.strategy.build import (
    check_launcher_overrides,
    fsdp_config_error,
    main_process_prints,
    process_group_kwargs,
    resolve_mixed_precision,
)
from qa_train.strategy.checks import LaunchError, check_launch_env, check_recompute, check_world
from qa_train.strategy.deepspeed_json import (
    check_launch_json,
    deepspeed_top_level_keys,
    reconcile_deepspeed,
    scheduler_steps_per_update,
    uses_deepspeed_optimizer,
)
from qa_train.strategy.faults import collective_fault
from qa_train.strategy.sharded import num_parameters

SOURCE = "ds_configs/test.json"
ARGS = parse_args(
    [
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "2",
        "--max_grad_norm",
        "0.5",
        "--learning_rate",
        "2e-5",
        "--weight_decay",
        "0.01",
    ]
)


def shipped(name: str) -> dict:
    return json.loads((ROOT / "ds_configs" / f"{name}.json").read_text())


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3", "zero2_offload", "zero3_offload"])
def test_shipped_configs_take_every_value_from_the_flags(name: str) -> None:
    cfg = shipped(name)
    reconcile_deepspeed(cfg, ARGS, world_size=4, mixed_precision="bf16", source=SOURCE)
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (8, 2)
    assert cfg["gradient_clipping"] == 0.5
    if "optimizer" in cfg:
        params = cfg["optimizer"]["params"]
        assert (params["lr"], params["betas"], params["eps"], params["weight_decay"]) == (
            2e-5,
            [0.9, 0.999],
            1e-8,
            0.01,
        )


def test_values_equal_to_the_flags_are_accepted() -> None:
    cfg = {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.5,
        "train_batch_size": 64,
        "bf16": {"enabled": True},
    }
    before = copy.deepcopy(cfg)
    reconcile_deepspeed(cfg, ARGS, world_size=4, mixed_precision="bf16", source=SOURCE)
    assert cfg == before


@pytest.mark.parametrize(
    ("cfg", "mixed_precision", "message"),
    [
        (
            {"train_micro_batch_size_per_gpu": 16},
            "no",
            r"ds_configs/test.json: 'train_micro_batch_size_per_gpu' is 16 but --per_device_train_batch_size is 8",
        ),
        (
            {"gradient_accumulation_steps": 4},
            "no",
            r"'gradient_accumulation_steps' is 4 but --gradient_accumulation_steps is 2",
        ),
        ({"gradient_clipping": 1.0}, "no", r"'gradient_clipping' is 1.0 but --max_grad_norm is 0.5"),
        ({"train_batch_size": 32}, "no", r"'train_batch_size' is 32 but the flags give 64"),
        ({"fp16": {"enabled": True}}, "bf16", r"fp16 is enabled but --mixed_precision resolved to bf16"),
        ({"bf16": {"enabled": "true"}}, "no", r"bf16 is enabled but --mixed_precision resolved to no"),
    ],
)
def test_every_contradiction_is_refused_naming_the_json_key_and_flag(
    cfg: dict, mixed_precision: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        reconcile_deepspeed(cfg, ARGS, world_size=4, mixed_precision=mixed_precision, source=SOURCE)


def test_optimizer_values_set_in_the_json_equal_to_the_flags_are_kept() -> None:
    cfg = {"optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "betas": [0.9, 0.999], "eps": "auto"}}}
    reconcile_deepspeed(cfg, ARGS, world_size=1, mixed_precision="no", source=SOURCE)
    assert cfg["optimizer"]["params"] == {"lr": 2e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"lr": 0.375}, r"optimizer 'lr' is 0.375 but --learning_rate is 2e-05"),
        ({"betas": [0.8, 0.999]}, r"optimizer 'betas' is \[0.8, 0.999\] but --adam_beta1/--adam_beta2 is"),
        ({"weight_decay": 0.0}, r"optimizer 'weight_decay' is 0.0 but --weight_decay is 0.01"),
    ],
)
def test_an_optimizer_value_in_the_json_against_the_flag_is_refused(params: dict, message: str) -> None:
    """DeepSpeed trained with the JSON's lr 0.375 while metrics.json recorded --learning_rate (issue 38, case 9)."""
    cfg = {"optimizer": {"type": "AdamW", "params": params}}
    with pytest.raises(ConfigError, match=rf"^ds_configs/test.json: {message}.*set \"\w+\": \"auto\" in the JSON"):
        reconcile_deepspeed(cfg, ARGS, world_size=1, mixed_precision="no", source=SOURCE)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"zero_optimization": {"stage": 2},}', "not valid JSON: line 1, column 36: Expecting property name enclosed"),
        ("[1, 2]", "not a DeepSpeed config (a JSON object of settings)"),
        (
            '{"zero_optimisation": {"stage": 3}}',
            "no 'zero_optimization' section, which accelerate needs (is 'zero_optimisation' it, misspelt?)",
        ),
        ('{"fp16": {"enabled": "auto"}}', "no 'zero_optimization' section, which accelerate needs"),
        (
            '{"zero_optimization": {}, "train_micro_batch_size_per_gpu": "eight"}',
            '\'train_micro_batch_size_per_gpu\' is "eight": neither a number nor "auto"',
        ),
        ('{"zero_optimization": {}, "gradient_clipping": null}', "'gradient_clipping' is null: neither a number nor"),
        ('{"zero_optimization": {}, "fp16": true}', "'fp16' must be a JSON object, got true"),
        ('{"zero_optimization": {}, "optimizer": {"params": {"lr": "fast"}}}', "optimizer 'lr' is \"fast\": neither"),
        (
            '{"zero_optimization": {}, "optimizer": {"params": {"betas": [0.9, "x"]}}}',
            "optimizer 'betas' is [0.9, \"x\"]",
        ),
        (
            '{"zero_optimization": {}, "bf16": {"enabled": "yes"}}',
            "bf16 is enabled but --mixed_precision resolved to no",
        ),
        ('{"zero_optimization": {"stage": 4}}', "zero_optimization 'stage' is 4; DeepSpeed's ZeRO stages are 0 to 3"),
        ('{"zero_optimization": {"stage": "two"}}', "zero_optimization 'stage' is \"two\"; DeepSpeed's ZeRO stages"),
        ('{"zero_optimization": {"stagee": 2}}', "zero_optimization: unknown key 'stagee' (did you mean stage?)"),
        (
            '{"zero_optimization": {"stage": 2}, "bf_16": {"enabled": true}}',
            "unknown key 'bf_16' (did you mean bf16?), which DeepSpeed would ignore",
        ),
        (
            '{"zero_optimization": {"stage": 2}, "gradient_clippin": 1.0}',
            "unknown key 'gradient_clippin' (did you mean gradient_clipping?), which DeepSpeed would ignore",
        ),
        (
            '{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}',
            "'train_micro_batch_size_per_gpu' is 4 but --per_device_train",
        ),
    ],
)
def test_a_launchs_deepspeed_json_is_refused_in_one_line_naming_it(
    text: str, message: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each failed with a traceback (JSONDecodeError, AttributeError inside Accelerator(), DeepSpeed's pydantic error
    at prepare), or was refused only after featurisation and the model load (issue 38's reconciliation)."""
    path = tmp_path / "ds.json"
    path.write_text(text)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(path))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError) as err:
        check_launch_json(ARGS, "no")
    assert str(err.value).startswith(f"{path}: {message}") and "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["zero1", "zero2", "zero3", "zero2_offload", "zero3_offload"])
def test_the_shipped_deepspeed_jsons_pass_the_launch_check(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(ROOT / "ds_configs" / f"{name}.json"))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for precision in ("no", "bf16"):
        check_launch_json(ARGS, precision)


def test_a_deepspeed_key_far_from_any_it_reads_is_said_not_refused(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """DeepSpeed ignores a top-level key it does not read; a "comment" is no typo, but it has no effect either."""
    path = tmp_path / "ds.json"
    path.write_text('{"comment": "ours", "zero_optimization": {"stage": 2}, "steps_per_print": 10}')
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(path))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    with caplog.at_level(logging.WARNING, logger="qa_train"):
        check_launch_json(ARGS, "no")
    said = [r.getMessage() for r in caplog.records if r.name == "qa_train"]
    assert said == [f"{path}: 'comment' is not a key DeepSpeed reads: it has no effect"]


def test_the_recorded_deepspeed_keys_are_the_ones_its_config_reads() -> None:
    """The recording (deepspeed_top_level_keys) must see what DeepSpeedConfig reads however it asks: `get`
    (steps_per_print), `in cfg.keys()` (optimizer), [] after `in` (torch_autocast), a pydantic section (compile)."""
    known = deepspeed_top_level_keys()
    assert known is not None
    assert {"steps_per_print", "optimizer", "scheduler", "torch_autocast", "compile", "bf16", "fp16"} <= known
    assert {"gradient_clipping", "train_batch_size", "zero_optimization", "sequence_parallel_size"} <= known
    for name in ("zero1", "zero2", "zero3", "zero2_offload", "zero3_offload"):
        assert set(json.loads((ROOT / "ds_configs" / f"{name}.json").read_text())) <= known


def test_a_launchs_missing_deepspeed_json_is_named(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`accelerate launch` hands the YAML's path on unchecked; accelerate then failed inside Accelerator()."""
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", "ds_configs/zero_2.json")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^ds_configs/zero_2.json: no such file \(a relative path is from the"):
        check_launch_json(ARGS, "no")


@pytest.mark.parametrize(
    ("flag", "env", "bf16_capable", "expected"),
    [
        ("fp16", {"ACCELERATE_MIXED_PRECISION": "bf16"}, True, "fp16"),  # the flag wins
        ("auto", {"ACCELERATE_MIXED_PRECISION": "fp16"}, True, "fp16"),  # then the accelerate config
        ("auto", {"ACCELERATE_MIXED_PRECISION": "no"}, True, "bf16"),  # then the device
        ("auto", {}, False, "no"),
        ("no", {"ACCELERATE_MIXED_PRECISION": "fp16"}, True, "no"),
    ],
)
def test_mixed_precision_resolution(flag: str, env: dict, bf16_capable: bool, expected: str) -> None:
    assert resolve_mixed_precision(flag, env, True, bf16_capable) == expected


@pytest.mark.parametrize(
    ("flag", "env", "said"),
    [
        ("fp16", {}, "--mixed_precision fp16: "),
        ("auto", {"ACCELERATE_MIXED_PRECISION": "fp16"}, "the accelerate config's mixed_precision: fp16: "),
    ],
)
def test_fp16_without_cuda_is_refused_naming_where_it_came_from(flag: str, env: dict, said: str) -> None:
    """accelerate (1.15) on CPU applies neither autocast nor a loss scaler for fp16: single and DDP runs trained
    in fp32 under the fp16 label (with the gradient-norm guard off, as a scaler would skip overflows), FSDP2
    computed in fp16 unscaled, and DeepSpeed failed with a traceback."""
    with pytest.raises(ConfigError) as err:
        resolve_mixed_precision(flag, env, False, False)
    assert str(err.value).startswith(said) and "use --mixed_precision bf16 or no" in str(err.value)
    assert resolve_mixed_precision("bf16", env, False, False) == "bf16"


@pytest.mark.parametrize("value", ["fp8", "bf61"])
def test_a_precision_from_the_environment_qa_train_cannot_train_in_is_refused(value: str) -> None:
    """The accelerate config's fp8 (or a typo set by hand) trained in bf16 on a GPU, or fp32, without a word."""
    with pytest.raises(ConfigError) as err:
        resolve_mixed_precision("auto", {"ACCELERATE_MIXED_PRECISION": value}, True, True)
    assert str(err.value) == (
        f"the accelerate config's mixed_precision: {value} (ACCELERATE_MIXED_PRECISION): qa_train trains in no, "
        "fp16 or bf16; set one of them, or pass --mixed_precision"
    )
    assert resolve_mixed_precision("bf16", {"ACCELERATE_MIXED_PRECISION": value}, True, True) == "bf16"  # the flag wins
    assert resolve_mixed_precision("auto", {"ACCELERATE_MIXED_PRECISION": "BF16"}, True, True) == "bf16"


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        (
            "FSDP_STATE_DICT_TYPE",
            "SHARDED",
            "fsdp_state_dict_type: SHARDED: accelerate cannot read it (KeyError: 'SHARDED')",
        ),
        (
            "FSDP_OFFLOAD_PARAMS",
            "nope",
            "fsdp_offload_params: nope: accelerate cannot read it (ValueError: invalid truth",
        ),
        ("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER", "fsdp_auto_wrap_policy: TRANSFORMER: accelerate cannot read it"),
    ],
)
def test_an_fsdp_config_value_accelerate_cannot_read_is_named(
    variable: str, value: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accelerate launch turns fsdp_config into FSDP_* variables unchecked, and Accelerator() failed on every rank
    with a KeyError or ValueError traceback from its FSDP plugin, which make_accelerator now turns into this line."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    for name in [n for n in os.environ if n.startswith("FSDP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    monkeypatch.setenv(variable, value)
    with pytest.raises((KeyError, ValueError)) as raised:
        FullyShardedDataParallelPlugin()
    refused = fsdp_config_error(raised.value)
    assert refused is not None and str(refused).startswith(f"the accelerate config's {said}")
    assert fsdp_config_error(ValueError(value)) is None  # raised anywhere else: left as it is


@pytest.mark.usefixtures("in_process")
def test_a_launchers_accumulation_against_the_flag_is_refused_before_any_window(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Accelerator() takes ACCELERATE_GRADIENT_ACCUMULATION_STEPS over the value it is given: with 4 there, the run
    trained 4 micro-batches per step (epoch 0.128 after 4 steps, not 0.032) while it planned and reported a global
    batch of 12; a DeepSpeed config's YAML-only gradient_accumulation_steps was refused after featurisation."""
    import qa_train.trainer

    monkeypatch.setattr(qa_train.trainer, "featurize_splits", lambda *a: pytest.fail("featurised"))
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    code, _, err = main_here(tiny_flags(tmp_path / "out", "--max_train_steps", "1"), capsys)
    assert (code, err) == (
        2,
        "qa_train: error: ACCELERATE_GRADIENT_ACCUMULATION_STEPS=4 (accelerate launch sets it from a config's "
        "gradient_accumulation_steps) but --gradient_accumulation_steps is 1: accelerate would use it instead of "
        "the flag; drop it from the config and pass --gradient_accumulation_steps 4\n",
    )


@pytest.mark.parametrize(
    ("env", "refused"),
    [
        ({"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "2"}, False),  # ARGS' own 2
        ({"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "auto"}, False),
        ({"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "x"}, True),
        ({"ACCELERATE_GRADIENT_CLIPPING": "0.5"}, False),
        ({"ACCELERATE_GRADIENT_CLIPPING": "1.0"}, True),
    ],
)
def test_launcher_overrides_equal_to_the_flags_pass(env: dict, refused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "ACCELERATE_GRADIENT_CLIPPING"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if refused:
        with pytest.raises(ConfigError, match=f"^{next(iter(env))}="):
            check_launcher_overrides(ARGS)
    else:
        check_launcher_overrides(ARGS)


def fake_accelerator(processes: int, ds_config: dict | None) -> SimpleNamespace:
    plugin = None if ds_config is None else SimpleNamespace(deepspeed_config=ds_config)
    return SimpleNamespace(num_processes=processes, state=SimpleNamespace(deepspeed_plugin=plugin))


def fsdp_accelerator(activation_checkpointing: bool) -> SimpleNamespace:
    plugin = SimpleNamespace(activation_checkpointing=activation_checkpointing)
    return SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin))


def test_fsdp_activation_checkpointing_with_the_flag_is_refused_naming_both() -> None:
    with pytest.raises(LaunchError, match="--gradient_checkpointing.*fsdp_activation_checkpointing"):
        check_recompute(fsdp_accelerator(True), gradient_checkpointing=True)


@pytest.mark.parametrize(
    "accelerator,flag",
    [
        (fsdp_accelerator(True), False),
        (fsdp_accelerator(False), True),
        (SimpleNamespace(state=SimpleNamespace()), True),
    ],
)
def test_one_recompute_alone_is_accepted(accelerator: SimpleNamespace, flag: bool) -> None:
    check_recompute(accelerator, gradient_checkpointing=flag)


@pytest.mark.parametrize(
    "seen,distributed_type,why",
    [
        (1, "NO", "this one sees a world of 1"),
        # `accelerate launch --multi_gpu` without CUDA (accelerate 1.15): each rank sees the whole world, but no
        # wrapper; the line said "started WORLD_SIZE=2 processes but this one sees a world of 2".
        (2, "NO", "they run without a data-parallel strategy"),
    ],
)
def test_a_launch_of_separate_models_is_refused_saying_which_way(
    monkeypatch: pytest.MonkeyPatch, seen: int, distributed_type: str, why: str
) -> None:
    from accelerate.utils import DistributedType

    monkeypatch.setenv("WORLD_SIZE", "2")
    accelerator = SimpleNamespace(num_processes=seen, distributed_type=DistributedType(distributed_type))
    with pytest.raises(LaunchError) as err:
        check_world(accelerator)
    assert str(err.value).startswith(f"the launcher started WORLD_SIZE=2 processes but {why}")
    assert "sees a world of 2" not in str(err.value)
    check_world(SimpleNamespace(num_processes=2, distributed_type=DistributedType.MULTI_CPU))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"WORLD_SIZE": "2"},
            "WORLD_SIZE=2 without MASTER_ADDR: no launcher started this process (torchrun, accelerate launch and "
            "qa-train launch set both), and it cannot join a process group; unset it to train in one process, or "
            "start the run with qa-train launch",
        ),
        ({"LOCAL_RANK": "0", "RANK": "0"}, "LOCAL_RANK=0 without MASTER_ADDR: no launcher started this process"),
        ({"RANK": "1"}, "RANK=1: a world of 1 (WORLD_SIZE unset) has ranks 0 to 0; unset it to train in one process"),
        ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "n1"}, "RANK=2: a world of 2 (WORLD_SIZE=2) has ranks 0 to 1"),
        ({"RANK": "x"}, "RANK='x': not a number 0 or more, as a launcher sets it; unset it"),
        ({"WORLD_SIZE": "-1"}, "WORLD_SIZE='-1': not a number 0 or more"),
        ({"LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE=0: a world has 1 process or more; unset it"),
        ({"ACCELERATE_USE_DEEPSPEED": "true"}, "ACCELERATE_USE_DEEPSPEED=true without a launcher (LOCAL_RANK unset)"),
    ],
)
def test_launch_variables_left_without_a_launcher_are_refused_naming_them(env: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_launch_env(env)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"},
        {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"},
    ],
)
def test_what_a_launcher_sets_is_accepted(env: dict) -> None:
    check_launch_env(env)


@pytest.mark.usefixtures("in_process")
@pytest.mark.parametrize(
    ("variables", "said"),
    [
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 without MASTER_ADDR"),  # was torch's ValueError from Accelerator()
        ({"RANK": "1"}, "RANK=1: a world of 1"),  # trained; a refusal said nothing, as rank 1's
    ],
)
def test_a_run_without_a_launcher_refuses_its_launch_variables_in_one_line(
    variables: dict, said: str, tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    code, _, err = main_here(tiny_flags(tmp_path / "out", "--max_train_steps", "1"), capsys)
    assert code == 2 and err.startswith(f"qa_train: error: {said}") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("in_process")
def test_an_inductor_cache_that_cannot_be_made_is_refused_before_the_run(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """torch makes TORCHINDUCTOR_CACHE_DIR when torch._dynamo is imported, compiled or not: one under a file failed
    with a NotADirectoryError traceback once the data was read."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "file" / "inductor"))
    code, _, err = main_here(tiny_flags(tmp_path / "out", "--max_train_steps", "1"), capsys)
    assert (code, err) == (
        2,
        f"qa_train: error: TORCHINDUCTOR_CACHE_DIR={tmp_path}/file/inductor: cannot be created (Not a directory); "
        "torch makes it at start-up, compiled or not: point it at a folder you can write, or unset it\n",
    )
    assert not (tmp_path / "out").exists()


def test_schedule_steps_per_update_follow_who_steps_the_scheduler() -> None:
    """accelerate steps a torch scheduler once per process per update; DeepSpeed's own optimizer, once."""
    assert scheduler_steps_per_update(fake_accelerator(4, None)) == 4
    assert scheduler_steps_per_update(fake_accelerator(4, {"zero_optimization": {"stage": 2}})) == 4
    with_optimizer = fake_accelerator(4, {"optimizer": {"type": "AdamW"}})
    assert uses_deepspeed_optimizer(with_optimizer) and scheduler_steps_per_update(with_optimizer) == 1


def test_num_parameters_counts_zero3_placeholders_at_their_real_size() -> None:
    model = torch.nn.Linear(4, 3)
    assert num_parameters(model) == 15
    model.weight.ds_numel = 1200  # ZeRO-3 leaves an empty tensor and records the full size here
    assert num_parameters(model) == 1203


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("offload", [True, False])
def test_fsdp_offload_is_read_from_either_fsdp_versions_policy(version: int, offload: bool) -> None:
    """FSDP2 states its offload as a CPUOffloadPolicy, with no offload_params field: metrics.json called an
    offloading FSDP2 run "none", and any FSDP2 policy object is true, offloading or not."""
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    from qa_train.strategy.build import detect_strategy

    plugin = FullyShardedDataParallelPlugin(fsdp_version=version, cpu_offload=offload)
    accelerator = SimpleNamespace(distributed_type=DistributedType.FSDP, state=SimpleNamespace(fsdp_plugin=plugin))
    assert detect_strategy(accelerator).offload == ("optimizer+params" if offload else "none")


def test_a_cpu_rank_on_one_thread_with_cores_to_spare_is_warned(monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerate launch on a machine without a GPU, without --cpu, sets OMP_NUM_THREADS=1: a lone rank trained on
    1 of the 2 cores here without a word."""
    import os

    from qa_train.strategy.checks import cpu_thread_warning

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    line = cpu_thread_warning("cpu", threads=1, local_processes=2)
    assert line is not None and "1 thread per process where the cores allow 4" in line and "OMP_NUM_THREADS=4" in line
    assert cpu_thread_warning("cpu", threads=1, local_processes=8) is None  # each rank has its one core
    assert cpu_thread_warning("cpu", threads=2, local_processes=4) is None
    assert cpu_thread_warning("cuda", threads=1, local_processes=1) is None  # the GPU does the work


@pytest.mark.parametrize(
    ("backend", "seconds", "expected"),
    [
        ("gloo", 600, {"backend": "gloo", "timeout": timedelta(seconds=600)}),  # accelerate's to_kwargs would drop 600
        ("gloo", 1800, {"backend": "gloo", "timeout": timedelta(seconds=1800)}),
        (None, 600, {"timeout": timedelta(seconds=600)}),  # on GPUs accelerate picks NCCL itself
        (None, 45.5, {"timeout": timedelta(seconds=45.5)}),
    ],
)
def test_the_process_group_gets_the_timeout_asked_for(backend: str | None, seconds: float, expected: dict) -> None:
    assert process_group_kwargs(backend, seconds).to_kwargs() == expected


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "1e12"])
def test_ddp_timeout_must_be_a_positive_finite_number_of_seconds(value: str) -> None:
    """inf and 1e12 passed a positivity check, then datetime.timedelta raised OverflowError with a traceback."""
    assert parse_args([]).system.ddp_timeout == 1800  # transformers' Trainer's default
    said = f"--ddp_timeout: must be a positive number of seconds up to 1e9, got {float(value):g}"
    with pytest.raises(ConfigError, match=re.escape(said)):
        parse_args(["--ddp_timeout", value])


@pytest.mark.parametrize("value", ["0.0001", "0.01", "0.999"])
def test_a_ddp_timeout_under_a_second_is_refused_before_the_ranks_connect(value: str) -> None:
    """Under a launch the ranks failed to form their process group (TCPStore's or gloo's connect timed out after
    0 ms or 10 ms) with a traceback on every rank."""
    said = f"--ddp_timeout: {float(value):g} s is too short for the ranks even to connect"
    with pytest.raises(ConfigError, match=re.escape(said)):
        parse_args(["--ddp_timeout", value])
    assert parse_args(["--ddp_timeout", "1"]).system.ddp_timeout == 1


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        # gloo's own words (torch 2.13), as the waiting rank and then its peer see them
        (
            "[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to "
            "complete",
            "timeout",
        ),
        ("Application timeout caused pair closure", "timeout"),
        (
            "[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:18609. This is "
            "typically caused by a remote worker crashing.",
            "peer",
        ),
        (
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600042 "
            "milliseconds before timing out.",
            "timeout",
        ),
        ("CUDA out of memory. Tried to allocate 2.00 GiB", None),
        ("shape '[8, 192]' is invalid for input of size 100", None),
    ],
)
def test_a_collective_fault_is_told_from_any_other_error(message: str, expected: str | None) -> None:
    assert collective_fault(RuntimeError(message)) == expected


def test_library_prints_come_from_the_main_process_and_a_failure_shows_every_rank_s(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """DeepSpeed on CPU prints its op load from every rank inside Accelerator(): rank 0 alone says it, and another
    rank's print is shown after all when the block fails."""
    for rank, fails, shown in [("0", False, True), ("1", False, False), ("1", True, True)]:
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(RuntimeError) if fails else contextlib.nullcontext(), main_process_prints():
            print("DeepSpeed op loaded")
            if fails:
                raise RuntimeError("no group")
        assert (capsys.readouterr().out == "DeepSpeed op loaded\n") is shown, (rank, fails)
