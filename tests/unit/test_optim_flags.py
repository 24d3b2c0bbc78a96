"""--optim's Trainer names, --tf32 and --trust_remote_code: what each builds, and each refusal where the launch
cannot honour it (one line, before any data is read)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
from conftest import TINY

from qa_train.config.flags import parse_args
from qa_train.config.settings import ConfigError


def test_adafactor_is_trainers_at_the_learning_rate_and_steps_the_weights() -> None:
    from transformers.optimization import Adafactor

    from qa_train.model.optimization import param_groups, torch_optimizer

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    o = parse_args(["--optim", "adafactor", "--learning_rate", "0.01", "--weight_decay", "0.1"]).optim
    opt = torch_optimizer(param_groups(model, o.weight_decay), o)
    assert isinstance(opt, Adafactor) and [g["lr"] for g in opt.param_groups] == [0.01, 0.01]
    assert opt.defaults["relative_step"] is False and opt.defaults["scale_parameter"] is False  # as Trainer sets
    before = model[0].weight.detach().clone()
    model(torch.randn(8, 4)).pow(2).sum().backward()
    opt.step()
    assert not torch.equal(before, model[0].weight)
    plain = torch_optimizer(param_groups(model, 0.0), parse_args(["--optim", "adamw_torch"]).optim)
    assert type(plain) is torch.optim.AdamW and plain.defaults["fused"] is False


def _accelerator(distributed: str, device: str = "cpu", deepspeed: dict | None = None) -> types.SimpleNamespace:
    from accelerate.utils import DistributedType

    plugin = types.SimpleNamespace(deepspeed_config=deepspeed) if deepspeed is not None else None
    return types.SimpleNamespace(
        distributed_type=DistributedType[distributed],
        device=torch.device(device),
        state=types.SimpleNamespace(deepspeed_plugin=plugin),
    )


@pytest.mark.parametrize(
    ("optim", "accelerator", "says"),
    [
        ("adafactor", _accelerator("FSDP"), "--optim adafactor: transformers' Adafactor cannot step FSDP2's sharded"),
        ("adamw_bnb_8bit", _accelerator("NO"), "--optim adamw_bnb_8bit: bitsandbytes' 8-bit AdamW runs on CUDA"),
        (
            "adafactor",
            _accelerator("DEEPSPEED", deepspeed={"optimizer": {"type": "AdamW"}}),
            "--optim adafactor: the DeepSpeed JSON brings its own optimizer",
        ),
    ],
)
def test_an_optimizer_the_launch_cannot_honour_is_refused(
    optim: str, accelerator: types.SimpleNamespace, says: str
) -> None:
    from qa_train.strategy.checks import check_optimizer

    with pytest.raises(ConfigError, match=f"^{says}"):
        check_optimizer(accelerator, optim)


def test_adafactor_is_taken_under_ddp_and_zero_without_an_optimizer_section() -> None:
    from qa_train.strategy.checks import check_optimizer

    check_optimizer(_accelerator("MULTI_CPU"), "adafactor")
    check_optimizer(_accelerator("DEEPSPEED", deepspeed={"zero_optimization": {"stage": 3}}), "adafactor")
    check_optimizer(_accelerator("DEEPSPEED", deepspeed={"optimizer": {}}), "adamw_torch")  # the JSON's own


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a run with no TF32 to enable")
def test_tf32_without_an_ampere_gpu_is_refused_naming_the_flag() -> None:
    from qa_train.strategy.build import enable_tf32

    with pytest.raises(ConfigError, match=r"^--tf32: TF32 is an Ampere-or-newer NVIDIA GPU's .* drop the flag$"):
        enable_tf32()


def test_tf32_is_set_as_trainer_sets_it_where_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' enable_tf32 is what runs (the GPU check, run on a device, is test_gpu.py's)."""
    import transformers.utils.import_utils as hf

    from qa_train.strategy.build import enable_tf32

    calls: list[bool] = []
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    monkeypatch.setattr(hf, "is_torch_tf32_available", lambda: True)
    monkeypatch.setattr(hf, "enable_tf32", calls.append)
    enable_tf32()
    assert calls == [True]
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")  # qa-train launch --cpu: no GPU work at all
    with pytest.raises(ConfigError, match="^--tf32: "):
        enable_tf32()


def _remote_code_model(folder: Path) -> Path:
    """A model folder whose config names its own code (auto_map), as a hub repo with custom code has it."""
    folder.mkdir()
    (folder / "custom_config.py").write_text(
        "from transformers import BertConfig\n\n\nclass CustomConfig(BertConfig):\n    model_type = 'custom-bert'\n"
    )
    (folder / "custom_model.py").write_text(
        "from transformers import BertForQuestionAnswering\n\nfrom .custom_config import CustomConfig\n\n\n"
        "class CustomForQA(BertForQuestionAnswering):\n    config_class = CustomConfig\n"
    )
    config = json.loads((TINY / "config.json").read_text())
    config.update(
        model_type="custom-bert",
        auto_map={
            "AutoConfig": "custom_config.CustomConfig",
            "AutoModelForQuestionAnswering": "custom_model.CustomForQA",
        },
    )
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_trust_remote_code_builds_the_models_own_class(tmp_path: Path) -> None:
    from qa_train.model.modeling import load_model_config, loading, qa_model_class

    folder = _remote_code_model(tmp_path / "custom")
    args = parse_args(["--config_name", str(folder), "--tokenizer_name", str(TINY), "--trust_remote_code"]).model
    config = load_model_config(args)
    assert type(config).__name__ == "CustomConfig"
    assert qa_model_class(config).__name__ == "CustomForQA"
    untrusted = parse_args(["--config_name", str(folder), "--tokenizer_name", str(TINY)]).model
    # As the trainer loads it: transformers' ValueError becomes one line naming the flag.
    with pytest.raises(ConfigError, match=r"^--config_name .*custom: cannot load it \(ValueError: .*trust_remote_code"):
        with loading("--config_name", str(folder)):
            load_model_config(untrusted)


def test_a_warm_up_longer_than_the_run_is_refused_naming_both_numbers() -> None:
    from qa_train.model.optimization import step_plan

    optim = parse_args(["--num_warmup_steps", "50", "--max_train_steps", "10"]).optim
    with pytest.raises(ConfigError) as err:
        step_plan(optim, batches_per_epoch=4)
    assert str(err.value) == (
        "--num_warmup_steps: 50 is more than the run's 10 optimizer steps: lower it, or give --warmup_ratio "
        "(a share of all steps) instead"
    )
    assert step_plan(parse_args(["--num_warmup_steps", "10", "--max_train_steps", "10"]).optim, 4).warmup_steps == 10


def test_the_warm_up_refusal_is_one_line_and_exit_2_from_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], in_process: None
) -> None:
    """Raised once the data is featurised (the total depends on it), inside run(): main() must still say it in one
    line and exit 2, as a flag refused up front."""
    from conftest import error_lines, tiny_flags

    from qa_train import __main__ as entry
    from qa_train import run as run_module
    from qa_train.model.optimization import step_plan

    monkeypatch.setattr(run_module, "run", lambda args, splits: step_plan(args.optim, batches_per_epoch=2))
    flags = tiny_flags(tmp_path / "out", "--no_eval", "--num_warmup_steps", "9", "--max_train_steps", "3")
    assert entry.main(flags) == 2
    assert error_lines(capsys.readouterr().err) == [
        "qa_train: error: --num_warmup_steps: 9 is more than the run's 3 optimizer steps: lower it, or give "
        "--warmup_ratio (a share of all steps) instead"
    ]


class ModelLoaded(BaseException):
    """Raised by a stubbed load_model: the run got that far (past every except Exception of main)."""


def test_a_global_batch_beyond_the_training_windows_is_said_before_the_model_loads(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    in_process: None,
    own_logging: None,
) -> None:
    """3 windows at 8 per device x 2 trained one step an epoch of 16 windows, 13 of them pads that train nothing
    (the summary said global batch 16), without a word. Said, not refused: a smoke test on a few questions trains."""
    from conftest import main_here, tiny_flags

    import qa_train.trainer

    def load_model(*args: object) -> None:
        raise ModelLoaded

    monkeypatch.setattr(qa_train.trainer, "load_model", load_model)
    flags = ["--no_eval", "--max_train_samples", "3", "--gradient_accumulation_steps", "2", "--max_train_steps", "1"]
    with pytest.raises(ModelLoaded):
        main_here(tiny_flags(tmp_path / "out", *flags), capsys)
    assert (
        "WARNING qa_train: --per_device_train_batch_size: a global batch of 16 windows (8 per device x 2 accumulation "
        "x 1 process(es)) is more than the 3 training windows: every step pads them with 13 windows that train "
        "nothing (lower it or --gradient_accumulation_steps to 3 windows in all at most to spare their compute)"
    ) in capsys.readouterr().err
    from qa_train.model.optimization import global_batch_waste

    assert global_batch_waste(parse_args(["--max_train_steps", "0"]).optim, 3, 8, 2) is None  # no step to pad
    assert global_batch_waste(parse_args([]).optim, 16, 8, 2) is None
