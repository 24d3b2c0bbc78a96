"""The memory planner: DeepSpeed's own estimators, the tensors autograd really keeps, and `plan`'s answers."""

from __future__ import annotations

import contextlib
import functools
import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, TINY, write_config
from fake_runs import fake_metrics, rewrite

from qa_train.studies import memory_model as memplan
from qa_train.studies import plan_command, planner
from qa_train.studies.memory_model import GIB, Setup
from qa_train.studies.planner_check import check_run

BERT_BASE_SHAPE = ROOT / "qa_train" / "assets" / "bert-base-shape"


@functools.lru_cache(maxsize=1)
def shape_and_model(config_dir: str | Path):
    from transformers import AutoModelForQuestionAnswering

    config = planner.load_shape_config(None, str(config_dir))
    return planner.model_shape(config), AutoModelForQuestionAnswering.from_config(config)


@pytest.mark.parametrize(("gpus", "nodes"), [(1, 1), (8, 1), (16, 2)])
def test_model_states_agree_with_deepspeeds_estimators(gpus: int, nodes: int) -> None:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs, model_to_params
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    shape, model = shape_and_model(BERT_BASE_SHAPE)
    total, largest = model_to_params(model)  # DeepSpeed counts the real model's parameters its own way
    assert (shape.num_parameters, shape.largest_layer_params) == (total, largest) == (108_893_186, 23_440_896)
    setup = Setup(gpus, nodes, 32, 384)
    per_node = gpus // nodes
    # Our YAMLs build the model whole before partitioning (zero3_init_flag: false), so zero_init=False.
    expected = {
        "zero2": estimate_zero2_model_states_mem_needs(total, per_node, nodes, cpu_offload=False),
        "zero2_offload": estimate_zero2_model_states_mem_needs(total, per_node, nodes, cpu_offload=True),
        "zero3": estimate_zero3_model_states_mem_needs(
            total, largest, per_node, nodes, cpu_offload=False, zero_init=False
        )[:2],
        "zero3_offload": estimate_zero3_model_states_mem_needs(
            total, largest, per_node, nodes, cpu_offload=True, cpu_offload_params=True, zero_init=False
        )[:2],
    }
    for config, (cpu_bytes, gpu_bytes) in expected.items():
        gpu, _, host = memplan.model_states(config, shape, setup)
        gpu -= memplan.reduce_buckets(config, shape, setup)  # DeepSpeed's estimators leave its buffers out
        assert gpu == pytest.approx(gpu_bytes, rel=0.01), config
        assert host == pytest.approx(cpu_bytes, rel=0.01), config


def test_the_planners_reduce_bucket_is_the_one_our_zero_configs_set() -> None:
    """accelerate's "auto" would be hidden_size^2 elements (0.59M for BERT-base): about 150 reductions a step,
    each a trip through DeepSpeed's Python, where an explicit bucket makes 3
    (docs/benchmarks/2026-11-22-cpu-zero-reduce-bucket.md)."""
    for name in memplan.REDUCE_BUCKETS:
        cfg = json.loads((ROOT / "ds_configs" / f"{name}.json").read_text())
        assert cfg["zero_optimization"]["reduce_bucket_size"] == memplan.ZERO_REDUCE_BUCKET, name


def test_our_zero3_configs_build_the_model_whole_as_the_planner_assumes() -> None:
    for name in ("zero3", "zero3_offload"):
        cfg = yaml.safe_load((ROOT / "accelerate_configs" / f"{name}.yaml").read_text())
        assert cfg["deepspeed_config"]["zero3_init_flag"] is False, name


def test_the_zero_papers_yardsticks_and_communication_volumes() -> None:
    shape = memplan.ModelShape(
        12,
        768,
        12,
        3072,
        num_parameters=1_000_000,
        largest_layer_params=100_000,
        matmul_params=800_000,
        hidden_dropout=0.1,
        attention_dropout=0.1,
    )
    p, n = 1_000_000, 8
    setup = Setup(n, 1, 8, 128)
    states = {c: memplan.model_states(c, shape, setup)[0] for c in memplan.CONFIGS}
    buckets = 2 * memplan.ZERO_REDUCE_BUCKET * 2  # two bf16 reduce buckets, allocated whole on CUDA
    assert states["zero1"] == 4 * p + 16 * p / n + buckets and states["zero2"] == 2 * p + 18 * p / n + buckets
    assert states["zero3"] == 18 * p / n + 4 * 100_000 + buckets / 2 and states["zero2_offload"] == 2 * p
    assert states["ddp"] == 20 * p + 2 * 800_000  # fp32 weights, gradients, buckets, Adam; autocast's 16-bit copies
    volumes = {c: memplan.comm_volume(c, shape, setup)[0] for c in memplan.CONFIGS}
    assert volumes["ddp"] == 2 * 7 / 8 * 4 * p  # ring all-reduce of fp32 gradients
    assert volumes["zero2"] == volumes["zero1"] == 2 * 7 / 8 * 2 * p
    assert volumes["zero3"] == volumes["fsdp"] == 3 * 7 / 8 * 2 * p
    assert memplan.comm_volume("single", shape, Setup(1, 1, 8, 128))[0] == 0


def autograd_saved_bytes(model, batch: int, seq: int, precision: str = "no") -> int:
    """Bytes of the distinct tensors autograd saves in one training forward pass, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(5, 3000, (batch, seq))
    mask = torch.ones_like(ids)
    mask[:, seq * 3 // 4 :] = 0  # padding, as QA batches have
    label = torch.zeros(batch, dtype=torch.long)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
        model(
            input_ids=ids,
            attention_mask=mask,
            token_type_ids=torch.zeros_like(ids),
            start_positions=label,
            end_positions=label,
        )
    return sum(saved.values())


@pytest.mark.parametrize(
    ("sizes", "attention", "precision"),
    [
        ({}, "sdpa", "no"),  # the tiny BERT, no dropout: flash
        (
            {
                "num_hidden_layers": 3,
                "hidden_size": 256,
                "num_attention_heads": 4,
                "intermediate_size": 1024,
                "hidden_dropout_prob": 0.1,
                "attention_probs_dropout_prob": 0.1,
            },
            "sdpa",
            "no",
        ),  # dropout: math kernel
        (
            {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024},
            "eager",
            "no",
        ),
        (
            {"num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024},
            "sdpa",
            "bf16",
        ),
    ],
)
def test_activation_count_matches_what_autograd_saves(
    sizes: dict, attention: str, precision: str, tmp_path: Path
) -> None:
    from transformers import AutoModelForQuestionAnswering

    config = planner.load_shape_config(None, str(write_config(tmp_path / "model", **sizes)))
    shape = planner.model_shape(config)
    model = AutoModelForQuestionAnswering.from_config(config, attn_implementation=attention)
    batch, seq = 4, 128
    measured = autograd_saved_bytes(model, batch, seq, precision)
    # bf16 under autocast is what DDP does on GPUs; CPU autocast keeps the same tensors (no dropout here).
    setup = Setup(1, 1, batch, seq, precision, attention, "cpu" if precision == "no" else "cuda")
    counted = memplan.saved_activation_bytes(shape, setup, autocast=precision == "bf16")
    if precision == "bf16":  # autocast also keeps a 16-bit copy of every matmul weight (DDP's "+ 2M")
        counted += 2 * shape.matmul_params
    assert counted == pytest.approx(measured, rel=0.05)


@pytest.mark.parametrize(
    ("sizes", "attention", "precision"),
    [
        ({}, "sdpa", "no"),
        (
            {
                "hidden_size": 256,
                "num_attention_heads": 4,
                "intermediate_size": 1024,
                "hidden_dropout_prob": 0.1,
                "attention_probs_dropout_prob": 0.1,
            },
            "sdpa",
            "no",
        ),
        ({"hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024}, "eager", "no"),
        ({"hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024}, "sdpa", "bf16"),
    ],
)
def test_checkpointed_count_matches_what_autograd_keeps_and_recomputes(
    sizes: dict, attention: str, precision: str, tmp_path: Path
) -> None:
    """With --gradient_checkpointing the saved_tensors_hooks probe sees what checkpointing keeps: each layer's inputs
    (torch.utils.checkpoint saves them through autograd, outside its own hooks), and the embeddings' and QA head's
    tensors; what a layer saves inside the checkpoint goes to the checkpoint's hooks and is recomputed. The
    recompute (one layer at a time) saves what the layer's forward saves without checkpointing, measured here as
    what a third layer adds to a two-layer model. The planner's peak is the two together."""
    from transformers import AutoModelForQuestionAnswering

    from qa_train.model.modeling import enable_checkpointing

    batch, seq = 4, 128
    saved = {}
    for layers in (2, 3):
        config = planner.load_shape_config(
            None, str(write_config(tmp_path / f"l{layers}", num_hidden_layers=layers, **sizes))
        )
        model = AutoModelForQuestionAnswering.from_config(config, attn_implementation=attention)
        saved[layers] = autograd_saved_bytes(model, batch, seq, precision)
        if layers == 2:
            shape = planner.model_shape(config)
            enable_checkpointing(model)
            kept = autograd_saved_bytes(model, batch, seq, precision)
    one_layer = saved[3] - saved[2]
    if precision == "bf16":  # autocast's 16-bit copies of the layer's weights: model states in the plan ("+ 2M")
        one_layer -= 2 * (4 * shape.hidden**2 + 2 * shape.hidden * shape.intermediate)
    setup = Setup(
        1, 1, batch, seq, precision, attention, "cpu" if precision == "no" else "cuda", gradient_checkpointing=True
    )
    counted_kept, counted_recompute = memplan.checkpointed_bytes(shape, setup, autocast=precision == "bf16")
    assert counted_kept == pytest.approx(kept, rel=0.05)
    assert kept < saved[2] / 3  # two layers' inputs instead of two layers' tensors
    peak = memplan.saved_activation_bytes(shape, setup, autocast=precision == "bf16")
    assert peak == counted_kept + counted_recompute == pytest.approx(kept + one_layer, rel=0.05)


def test_checkpointing_plans_less_by_the_layers_it_recomputes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """BERT-base shape, batch 4 x 384 on CPU: the plan with --gradient_checkpointing keeps 12 layer inputs and one
    layer's tensors instead of 12 layers' tensors; model states are the same."""
    shape, _ = shape_and_model(BERT_BASE_SHAPE)
    plain, recomputed = Setup(1, 1, 4, 384, "no", "sdpa", "cpu"), Setup(1, 1, 4, 384, "no", "sdpa", "cpu", True)
    per_layer, once = memplan.layer_and_once_bytes(shape, plain, autocast=False)
    kept, recompute = memplan.checkpointed_bytes(shape, recomputed)
    assert kept == pytest.approx(12 * 4 * 4 * 384 * 768 + once, rel=0.01)  # 12 fp32 layer inputs, then as before
    assert recompute >= per_layer
    cal = memplan.CPU_CALIBRATION
    saved = cal.activation_scale * (
        memplan.saved_activation_bytes(shape, plain) - memplan.saved_activation_bytes(shape, recomputed)
    )
    before, after = memplan.estimate("single", shape, plain), memplan.estimate("single", shape, recomputed)
    assert after.model_states == before.model_states
    assert before.activations - after.activations == pytest.approx(saved)
    assert after.activations < before.activations / 4
    cpu = [
        "--config_name",
        str(BERT_BASE_SHAPE),
        "--device",
        "cpu",
        "--num_gpus",
        "1",
        "--gpu_memory_gib",
        "64",
        "--per_device_train_batch_size",
        "4",
        "--max_seq_length",
        "384",
        "--json",
    ]
    for flags, expected in (([], before), (["--gradient_checkpointing"], after)):
        code, out, _ = run_plan([*cpu, *flags], capsys)
        payload = json.loads(out)
        assert code == 0 and payload["setup"]["gradient_checkpointing"] == bool(flags)
        assert payload["estimates"][0]["activations"] == pytest.approx(expected.activations)
    mpnet = tmp_path / "mpnet"
    mpnet.mkdir()
    (mpnet / "config.json").write_text(json.dumps({"model_type": "mpnet"}))
    code, _, err = run_plan(["--config_name", str(mpnet), *cpu[2:], "--gradient_checkpointing"], capsys)
    assert code == 2 and "--gradient_checkpointing: MPNetForQuestionAnswering" in err and "Traceback" not in err


def test_check_plans_a_run_with_the_checkpointing_it_trained_with(tmp_path: Path) -> None:
    """`plan --check` reads the flag from metrics.json's args (a run from before the flag has none: off)."""
    estimates = {}
    for flag in (False, True):
        run = rewrite(
            fake_metrics(tmp_path / f"gc-{flag}", "single", 1, 40.0, 0.9),
            {"config_name": str(TINY), "tokenizer_name": str(TINY), "gradient_checkpointing": flag},
            host_rss_baseline_gb={"per_rank": [0.4], "max": 0.4, "mean": 0.4},
        )
        estimates[flag] = check_run(run).estimate_gib
    shape = planner.model_shape(planner.load_shape_config(None, str(TINY)))
    setups = [Setup(1, 1, 8, 192, "no", "sdpa", "cpu", flag) for flag in (False, True)]  # fake_metrics' batch
    planned = [memplan.estimate("single", shape, s).total / GIB for s in setups]
    assert planned[1] < planned[0] and [estimates[False], estimates[True]] == pytest.approx(planned)


def run_plan(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """qa_train.studies.planner's main in this process (test_plan_runs.py runs the real command line)."""
    try:
        code = plan_command.main(argv)
    except SystemExit as stop:  # argparse's refusals
        code = int(stop.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


FLAGS = ["--num_gpus", "8", "--per_device_train_batch_size", "32", "--max_seq_length", "384"]


def test_recommends_the_first_config_that_fits_in_the_stated_order(capsys: pytest.CaptureFixture) -> None:
    code, out, _ = run_plan(["--model_name_or_path", "bert-base-uncased", "--gpu_memory_gib", "80", *FLAGS], capsys)
    assert code == 0 and "108.9M parameters" in out
    assert "recommended: ddp (the first that fits in 72 of 80 GiB, 10% kept for the CUDA context, NCCL and " in out
    # At 16 GiB the DDP replica (model states + activations) no longer fits BERT-large; ZeRO-1 is next in the order.
    code, out, _ = run_plan(
        ["--model_name_or_path", "bert-large-uncased", "--gpu_memory_gib", "16", *FLAGS, "--json"], capsys
    )
    payload = json.loads(out)
    totals = {e["config"]: e["model_states"] + e["activations"] for e in payload["estimates"]}
    assert totals["ddp"] > 16 * 0.9 * GIB >= totals["zero1"] and payload["recommended"] == "zero1"
    code, out, _ = run_plan(["--model_name_or_path", "bert-large-uncased", "--gpu_memory_gib", "4", *FLAGS], capsys)
    assert "nothing fits in 3.6 GiB per device" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model_name_or_path", "bert-base-uncased", "--num_gpus", "0"], "--num_gpus must be positive, got 0"),
        (
            ["--model_name_or_path", "bert-base-uncased", "--num_gpus", "6", "--num_nodes", "4"],
            "--num_gpus 6 does not split evenly over --num_nodes 4",
        ),
        (["--num_gpus", "8"], "give exactly one of --model_name_or_path and --config_name"),
        (
            ["--model_name_or_path", "some-org/unknown-model", "--num_gpus", "8"],
            "--model_name_or_path some-org/unknown-model: no config for it on this machine",
        ),
        (
            ["--model_name_or_path", "bert-base-uncased", "--num_gpus", "8", "--max_seq_length", "1024"],
            "--max_seq_length 1024: the model has 512 position embeddings",
        ),
        (
            [
                "--model_name_or_path",
                "bert-base-uncased",
                "--num_gpus",
                "2",
                "--device",
                "cpu",
                "--mixed_precision",
                "bf16",
            ],
            "--mixed_precision bf16: CPU training here is fp32",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(flags: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    code, _, err = run_plan([*flags, "--gpu_memory_gib", "80", "--per_device_train_batch_size", "8"], capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_check_says_why_a_run_has_no_estimate_or_measurement(tmp_path: Path) -> None:
    """`plan --check` over a sweep dir: every run is a row, and a missing figure says why instead of stopping the
    table (a strategy without a formula used to end in a ValueError traceback)."""
    from qa_train.studies.planner_check import check_runs
    from qa_train.studies.sweep import Point

    root = tmp_path / "runs"
    tiny = {"config_name": str(TINY)}
    rewrite(
        fake_metrics(root / "cpu-now", "ddp", 2, 40.0, 0.9),
        tiny,
        host_rss_baseline_gb={"per_rank": [0.4, 0.5], "max": 0.5, "mean": 0.45},
    )
    rewrite(fake_metrics(root / "cpu-old", "ddp", 2, 40.0, 0.9), tiny)  # from before the baseline was written
    rewrite(fake_metrics(root / "gpu", "zero2", 2, 40.0, 0.9, gpu=1.5), tiny)
    rewrite(fake_metrics(root / "zero3-opt", "zero3", 2, 40.0, 0.9, offload="optimizer"), tiny)
    rewrite(fake_metrics(root / "elsewhere", "single", 1, 40.0, 0.9), {"config_name": str(tmp_path / "gone")})
    failed = root / "ddp-p2-r1"
    failed.mkdir()
    Point("ddp", "ddp", 2).write(failed)  # a sweep's failed run: no metrics.json
    rows = {r[0]: r for r in (line.strip("|").split(" | ") for line in check_runs([root]).splitlines()[2:])}
    rows = {name.strip(): [c.strip() for c in cells] for name, *cells in rows.values()}
    assert (
        rows["cpu-now"][3] == "0.500"
        and rows["cpu-now"][5] == "planned at full length; dynamic padding ran shorter batches"
    )
    assert rows["cpu-old"][3:5] == ["—", "—"] and "no idle host-RSS baseline" in rows["cpu-old"][5]
    assert rows["gpu"][3] == "1.500" and rows["gpu"][4] != "—"  # CUDA's peak needs no baseline
    assert rows["zero3-opt"][2] == "—" and "no formula for zero3+offload(optimizer)" in rows["zero3-opt"][5]
    assert rows["elsewhere"][2] == "—" and "no config for it on this machine" in rows["elsewhere"][5]
    assert rows["ddp-p2-r1"][1:5] == ["—"] * 4 and "no metrics.json" in rows["ddp-p2-r1"][5]


@pytest.mark.parametrize(
    ("memory", "message"),
    [
        ("nan", "--gpu_memory_gib must be positive, got nan"),
        ("inf", "--gpu_memory_gib must be a finite number of GiB, got inf"),
    ],
)
def test_a_gpu_memory_that_is_no_number_is_refused(memory: str, message: str, capsys: pytest.CaptureFixture) -> None:
    """nan used to plan "nothing fits in nan GiB" and inf to make every config fit in "inf of inf GiB"."""
    code, _, err = run_plan(["--model_name_or_path", "bert-base-uncased", "--gpu_memory_gib", memory, *FLAGS], capsys)
    assert code == 2 and message in err and "Traceback" not in err


def test_a_model_training_refuses_is_one_line_not_a_plan(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A config without a QA head was a ValueError traceback; RoBERTa's 514 positions hold 512 tokens, as training
    counts them (513 and 514 were planned, then refused by training); SDPA for a model without it likewise."""
    clip = tmp_path / "clip"
    clip.mkdir()
    (clip / "config.json").write_text(json.dumps({"model_type": "clip"}))
    roberta = write_config(tmp_path / "roberta", model_type="roberta", max_position_embeddings=514, pad_token_id=1)
    deberta = write_config(tmp_path / "deberta", model_type="deberta-v2")
    memory = ["--gpu_memory_gib", "80", "--num_gpus", "2", "--per_device_train_batch_size", "8"]
    for flags, message in [
        (["--config_name", str(clip)], "model type 'clip' has no question-answering head"),
        (
            ["--config_name", str(roberta), "--max_seq_length", "513"],
            "--max_seq_length 513: the model has 512 position",
        ),
        (
            ["--config_name", str(deberta), "--max_seq_length", "128", "--attn_implementation", "sdpa"],
            "--attn_implementation sdpa: DebertaV2ForQuestionAnswering does not support",
        ),
    ]:
        code, _, err = run_plan([*flags, *memory], capsys)
        assert code == 2 and message in err and "Traceback" not in err, flags
    code, out, _ = run_plan(["--config_name", str(roberta), "--max_seq_length", "512", *memory], capsys)
    assert code == 0 and "recommended: ddp" in out


def test_attention_is_what_training_resolves_auto_to(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Training's --attn_implementation auto (its default) is eager for DeBERTa, which keeps the s x s
    probabilities: the plan and `plan --check` of such a run used to count SDPA's activations (0.19 against
    0.34 GiB here)."""
    deberta = write_config(
        tmp_path / "deberta", model_type="deberta-v2", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1
    )
    code, out, _ = run_plan(
        [
            "--config_name",
            str(deberta),
            "--gpu_memory_gib",
            "80",
            "--num_gpus",
            "1",
            "--per_device_train_batch_size",
            "32",
            "--max_seq_length",
            "384",
            "--json",
        ],
        capsys,
    )
    payload = json.loads(out)
    assert code == 0 and payload["setup"]["attention"] == "eager"
    shape = planner.model_shape(planner.load_shape_config(None, str(deberta)))
    eager = memplan.estimate("single", shape, Setup(1, 1, 32, 384, "bf16", "eager")).total
    sdpa = memplan.estimate("single", shape, Setup(1, 1, 32, 384, "bf16", "sdpa")).total
    assert eager > 1.5 * sdpa
    run = rewrite(
        fake_metrics(tmp_path / "runs" / "deberta", "single", 1, 40.0, 0.9, gpu=1.0),
        {"config_name": str(deberta), "attn_implementation": "auto"},
        device="cuda",
        mixed_precision="bf16",
        per_device_train_batch_size=32,
        max_seq_length=384,
    )
    assert check_run(run).estimate_gib == pytest.approx(eager / GIB)


def test_on_cpu_offload_is_not_planned(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """On CPU processes the host is the device: ZeRO-2 offload used to "fit" in 1.5 GiB at 0.91 GiB while its own
    host column said 2.43 GiB of that same memory. FSDP runs on CPU processes and is planned there."""
    cpu = [
        "--model_name_or_path",
        "bert-base-uncased",
        "--device",
        "cpu",
        "--per_device_train_batch_size",
        "4",
        "--max_seq_length",
        "128",
    ]
    code, out, _ = run_plan([*cpu, "--num_gpus", "1", "--gpu_memory_gib", "1.5"], capsys)
    assert code == 0 and "nothing fits in 1.35 GiB" in out and "offload" not in out
    code, out, _ = run_plan([*cpu, "--num_gpus", "2", "--gpu_memory_gib", "80", "--json"], capsys)
    assert [e["config"] for e in json.loads(out)["estimates"]] == ["ddp", "zero1", "zero2", "fsdp", "zero3"]
    # CPU processes have no CUDA context or NCCL: the 10% the planner still keeps is said as a margin (the line
    # used to give GPU reasons on a CPU plan).
    code, out, _ = run_plan([*cpu, "--num_gpus", "2", "--gpu_memory_gib", "16"], capsys)
    assert code == 0 and "CUDA" not in out and "NCCL" not in out
    assert "recommended: ddp (the first that fits in 14.4 of 16 GiB, 10% kept free as a margin, in the order " in out
    run = rewrite(
        fake_metrics(tmp_path / "zero2-offload", "zero2", 2, 40.0, 0.9, offload="optimizer"),
        {"config_name": str(TINY)},
        host_rss_baseline_gb={"per_rank": [0.4, 0.5], "max": 0.5, "mean": 0.45},
    )
    check = check_run(run)
    assert check.estimate_gib is None and check.measured_gib == pytest.approx(0.5)
    assert "offloading to the host frees nothing" in check.why


def test_calibration_tool_reads_the_measured_figure(tmp_path: Path) -> None:
    """tools/calibrate_planner.py multiplied measured_gib's (value, why) pair by 2^30: a billion-fold tuple, a
    MemoryError before any fit."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("calibrate_planner", ROOT / "tools" / "calibrate_planner.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    run = rewrite(
        fake_metrics(tmp_path / "tiny-b8-s192", "single", 1, 40.0, 0.9),
        {"config_name": str(TINY), "attn_implementation": "sdpa"},
        host_rss_baseline_gb={"per_rank": [0.4], "max": 0.4, "mean": 0.4},
    )
    states, tensors, measured, _ = tool.terms(run)
    assert measured == pytest.approx(0.5 * GIB) and states > 0 and tensors > 0
    old = rewrite(
        fake_metrics(tmp_path / "old", "single", 1, 40.0, 0.9),
        {"config_name": str(TINY), "attn_implementation": "sdpa"},
    )
    with pytest.raises(SystemExit, match="no idle host-RSS baseline"):
        tool.terms(old)


def test_check_counts_the_vocabulary_a_from_scratch_run_grew_to(tmp_path: Path) -> None:
    """Training from --config_name grows vocab_size to the tokenizer's (3,707 tokens for the tiny BERT's): a config
    of 1,000 trains the tiny BERT's 937,346 parameters, which the check used to plan as 590,850."""
    small = write_config(tmp_path / "small-vocab", vocab_size=1000)
    estimates = {}
    for name, config in (("small-vocab", small), ("tiny", TINY)):
        run = rewrite(
            fake_metrics(tmp_path / "runs" / name, "single", 1, 40.0, 0.9),
            {"config_name": str(config), "tokenizer_name": str(TINY)},
            host_rss_baseline_gb={"per_rank": [0.4], "max": 0.4, "mean": 0.4},
        )
        estimates[name] = check_run(run).estimate_gib
    assert estimates["small-vocab"] == pytest.approx(estimates["tiny"])
