"""On one CUDA GPU: every config, and compiled runs, train in bf16 and export a model that answers as evaluation
did; FSDP and ZeRO-3 resume after a kill, and continue a checkpoint of 2 CPU processes; bf16 follows fp32; offload
takes model states off the GPU.

    pytest -m gpu tests/integration/test_gpu.py          # on a GPU machine (tools/gpu_session.sh tests)

pyproject's addopts deselect the `gpu` marker, so CPU machines and CI neither run nor count these.
Each test launches the real entry point through `qa-train launch` (accelerate launch on GPUs),
one process on one GPU; they are independent, so `-n 4` (pytest-xdist) runs them side by side.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import ASSETS, PY, ROOT, base_env, error_lines, export_answers, read_metrics, run_ok, tiny_flags
from safetensors.torch import load_file
from strategy_runs import STEPS, launch_cmd, step_log
from test_strategies import kill_after_checkpoint

from qa_train.strategy.launch import free_port

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CONFIGS = ["single", "ddp", "fsdp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload"]
BERT_BASE = ASSETS / "bert-base-shape"
# The export (fp32 weights), reloaded and run under bf16 autocast, must give evaluation's answer for at least this
# share of questions: DeepSpeed's bf16 mode evaluates with bf16 parameters, LayerNorm and softmax included, where
# autocast keeps fp32, so near-tied spans may flip.
SAME_ANSWER_SHARE = 0.95
# bf16 autocast against fp32 over 50 steps: each 10-step mean loss within this relative distance (H100,
# 2026-11-22: at most 0.03%).
BF16_LOSS_RTOL = 0.01
# Resume on GPU is not bitwise (atomics in embedding and attention backward): per-step loss and final
# weights (relative norm of the difference) within these.
RESUME_LOSS_RTOL, RESUME_WEIGHT_RTOL = 2e-2, 1e-2


def gpu_cmd(config: str, out: Path, *flags: str) -> list[str]:
    return [
        PY,
        "-m",
        "qa_train.cli",
        "launch",
        "--config_file",
        f"accelerate_configs/{config}.yaml",
        "--num_processes",
        "1",
        "--main_process_port",
        str(free_port()),
        "--",
        *flags,
        "--output_dir",
        str(out),
    ]


def tiny_gpu_flags(out: Path, steps: int, *extra: str) -> list[str]:
    return tiny_flags(
        out,
        "--max_train_steps",
        str(steps),
        "--logging_steps",
        "1",
        "--mixed_precision",
        "bf16",
        "--disable_tqdm",
        *extra,
    )


@pytest.mark.parametrize("config", CONFIGS)
def test_config_trains_in_bf16_and_export_answers_like_evaluation(config: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_ok(gpu_cmd(config, out, *tiny_gpu_flags(out, 30)), base_env(tmp_path))
    assert_learned_and_export_answers_like_evaluation(out, config)


@pytest.mark.parametrize(
    "how",
    [["--torch_compile"], ["--torch_compile_regional"], ["--torch_compile_mode", "reduce-overhead"]],
    ids=["whole", "regional", "cuda-graphs"],
)
def test_compiled_run_trains_in_bf16_and_export_answers_like_evaluation(how: list[str], tmp_path: Path) -> None:
    """inductor's Triton kernels over dynamic padding, in training and in evaluation (a second graph, without
    gradients); with reduce-overhead, CUDA graphs whose outputs the next replay overwrites."""
    out = tmp_path / "run"
    run_ok(gpu_cmd("single", out, *tiny_gpu_flags(out, 30, *how)), base_env(tmp_path))
    assert_learned_and_export_answers_like_evaluation(out, " ".join(how))
    m = read_metrics(out)
    print(f"{' '.join(how)}: {m['compiled_graphs']} graph(s) compiled in {m['compile_time_s']} s")
    assert 0 < m["compile_time_s"] < m["train_runtime_s"] and m["compiled_graphs"] >= 1


def test_dynamic_padding_compiles_one_graph_across_the_size_guards() -> None:
    """BERT-base's shape at batch x width on both sides of inductor's mix-order-reduction size test
    (batch x width x 768 >= 5 Mi): compile_model keeps one graph for all of them, where torch's default
    recompiles the whole model at the first batch across it (the 2026-11-26 H100 two-epoch run: 4 graphs)."""
    from torch._dynamo.utils import counters
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    from qa_train.config.settings import SystemArgs
    from qa_train.model.modeling import compile_model

    torch._dynamo.reset()
    model = AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(BERT_BASE)).cuda()
    compile_model(model, SystemArgs(torch_compile=True), dynamic=True)
    before = counters["stats"]["unique_graphs"]
    for batch, width in [(64, 384), (64, 96), (16, 200), (64, 256), (8, 40)]:  # tokens 24576, 6144, 3200, ...
        ids = torch.randint(1000, 2000, (batch, width), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                start_positions=ids[:, 0] % width,
                end_positions=ids[:, 1] % width,
            )
        out.loss.backward()
    assert counters["stats"]["unique_graphs"] - before == 1, "a batch shape recompiled the model"


def assert_learned_and_export_answers_like_evaluation(out: Path, label: str) -> None:
    m = read_metrics(out)
    assert m["train_steps"] == 30 and m["mixed_precision"] == "bf16" and m["world_size"] == 1
    assert m["peak_memory_source"] == "cuda_max_allocated" and m["peak_memory_gb"]["max"] > 0
    # MFU is rounded to 4 places: a 0.9M-parameter model's can read 0.0, its achieved TFLOP/s not.
    assert m["mfu"] is not None and 0 <= m["mfu"] < 1 and m["tflops_per_device"] > 0
    losses = step_log(out)
    assert losses[30]["train/loss"] < losses[1]["train/loss"], "bf16 training did not learn"

    evaluated = json.loads((out / "eval_predictions.json").read_text())
    reloaded = export_answers(out / "final", device="cuda", mixed_precision="bf16")
    assert sorted(reloaded) == sorted(evaluated)
    same = sum(reloaded[q] == evaluated[q] for q in evaluated) / len(evaluated)
    print(f"{label}: {same:.1%} of {len(evaluated)} answers equal after reload")
    assert same >= SAME_ANSWER_SHARE, f"{label}: only {same:.1%} of answers equal after reload"


@pytest.mark.parametrize("config", ["fsdp", "zero3"])
def test_kill_and_resume_on_gpu_matches_uninterrupted(config: str, tmp_path: Path) -> None:
    env = base_env(tmp_path)

    def flags(out: Path) -> list[str]:
        return tiny_gpu_flags(out, STEPS, "--no_eval", "--checkpointing_steps", "4")

    reference, out = tmp_path / "reference", tmp_path / "killed"
    run_ok(gpu_cmd(config, reference, *flags(reference)), env)
    kill_after_checkpoint(gpu_cmd(config, out, *flags(out)), env, out, ranks=1)
    run_ok(gpu_cmd(config, out, *flags(out), "--resume_from_checkpoint", "latest"), env)

    ours, ref = step_log(out), step_log(reference)
    assert sorted(ours) == list(range(1, STEPS + 1))
    for step in ref:
        assert ours[step]["train/lr"] == ref[step]["train/lr"], f"LR differs at step {step}"
        assert ours[step]["train/loss"] == pytest.approx(ref[step]["train/loss"], rel=RESUME_LOSS_RTOL)
    resumed, expected = (
        load_file(out / "final" / "model.safetensors"),
        load_file(reference / "final" / "model.safetensors"),
    )
    worst = max(
        float((resumed[k].float() - t.float()).norm() / t.float().norm().clamp_min(1e-12)) for k, t in expected.items()
    )
    print(f"{config}: worst relative weight difference after resume {worst:.2e}")
    assert worst <= RESUME_WEIGHT_RTOL


@pytest.mark.parametrize("config", ["fsdp", "zero3"])
def test_a_checkpoint_of_two_cpu_processes_continues_on_one_gpu(config: str, tmp_path: Path) -> None:
    """A world-size change on a one-GPU machine: the step-4 checkpoint of 2 CPU processes (gloo) continues on the GPU
    as 1 process with accumulation 2 (FSDP2's files resharded by torch.distributed.checkpoint, ZeRO-3's converted),
    the same windows at every step; fp32 on both, so the GPU follows the CPU run's losses to the GPU's rounding."""
    env = base_env(tmp_path)
    reference, out = tmp_path / "cpu", tmp_path / "gpu"
    run_ok(launch_cmd(config, reference), env)  # 2 CPU processes, STEPS steps, a checkpoint every 4
    flags = tiny_flags(out, "--max_train_steps", str(STEPS), "--logging_steps", "1", "--no_eval", "--disable_tqdm")
    step_4 = reference / "checkpoints" / "step_00000004"
    said = run_ok(gpu_cmd(config, out, *flags, "--mixed_precision", "no", "--resume_from_checkpoint", str(step_4)), env)
    assert "--gradient_accumulation_steps 1 -> 2 keeps its global batch of 16" in said.stdout + said.stderr
    m = read_metrics(out)
    assert (m["world_size"], m["global_batch_size"], m["device"].startswith("cpu")) == (1, 16, False)
    ours, ref = step_log(out), step_log(reference)
    assert sorted(ours) == list(range(5, STEPS + 1))
    for step in ours:
        assert ours[step]["train/lr"] == ref[step]["train/lr"], f"LR differs at step {step}"
        assert ours[step]["train/loss"] == pytest.approx(ref[step]["train/loss"], rel=RESUME_LOSS_RTOL)


def test_bf16_loss_follows_fp32(tmp_path: Path) -> None:
    env, runs = base_env(tmp_path), {}
    for precision in ("bf16", "no"):
        out = tmp_path / precision
        flags = [
            *tiny_flags(out, "--max_train_steps", "50", "--logging_steps", "10", "--no_eval", "--disable_tqdm"),
            "--mixed_precision",
            precision,
        ]
        run_ok(gpu_cmd("single", out, *flags), env)
        runs[precision] = step_log(out)
        assert read_metrics(out)["mixed_precision"] == precision
    bf16, fp32 = runs["bf16"], runs["no"]
    assert sorted(bf16) == sorted(fp32) == [10, 20, 30, 40, 50]
    gaps = {s: abs(bf16[s]["train/loss"] - fp32[s]["train/loss"]) / fp32[s]["train/loss"] for s in fp32}
    print("bf16 vs fp32 relative loss gap per 10 steps:", {s: f"{g:.2%}" for s, g in gaps.items()})
    assert fp32[50]["train/loss"] < fp32[10]["train/loss"]
    assert max(gaps.values()) <= BF16_LOSS_RTOL


def test_offload_configs_hold_less_cuda_memory_than_single(tmp_path: Path) -> None:
    """BERT-base shape (110M parameters): model states (16 bytes a parameter under mixed-precision Adam) dwarf
    the activations of a small batch, so moving them to the host must show in CUDA's peak."""
    env, peaks = base_env(tmp_path), {}
    for config in ("single", "zero2_offload", "zero3_offload"):
        out = tmp_path / config
        flags = [
            *tiny_flags(out, "--max_train_steps", "5", "--no_eval", "--disable_tqdm"),
            "--config_name",
            str(BERT_BASE),
            "--max_seq_length",
            "128",
            "--doc_stride",
            "32",
            "--per_device_train_batch_size",
            "4",
            "--learning_rate",
            "3e-5",
            "--mixed_precision",
            "bf16",
            "--save_final_model",
            "false",
        ]
        run_ok(gpu_cmd(config, out, *flags), env)
        m = read_metrics(out)
        peaks[config], params = m["peak_memory_gb"]["max"], m["num_parameters"]
    print("CUDA peak GiB:", peaks)
    assert peaks["single"] * 2**30 >= 16 * params, "single must hold 16 bytes of model states per parameter"
    assert peaks["zero3_offload"] < peaks["zero2_offload"] < peaks["single"]


@pytest.mark.oom_alone
def test_a_batch_too_large_for_the_gpu_is_one_line_and_exit_7(tmp_path: Path) -> None:
    """CUDA's own out-of-memory error at the first step (BERT-base shape, 1,024 windows of 512 tokens: about 160
    GiB of bf16 activations, more than an H100 or H200 holds), said in one line with what to change. It fills the
    GPU before it fails: tools/gpu_session.sh runs it alone (marker oom_alone)."""
    out = tmp_path / "run"
    flags = [
        *tiny_flags(out, "--max_train_steps", "2", "--no_eval", "--disable_tqdm"),
        "--config_name",
        str(BERT_BASE),
        "--max_seq_length",
        "512",
        "--doc_stride",
        "128",
        "--pad_to_max_length",
        "--per_device_train_batch_size",
        "1024",
        "--mixed_precision",
        "bf16",
    ]
    proc = subprocess.run(
        gpu_cmd("single", out, *flags), cwd=ROOT, env=base_env(tmp_path), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 7, proc.stderr[-3000:]
    [line] = error_lines(proc.stderr)
    assert line.startswith("qa_train: error: rank 0: out of memory at training step 1 (a "), line
    assert " GiB GPU; a micro-batch of 1024 windows x 512 tokens): lower --per_device_train_batch_size" in line, line
    assert not (out / "metrics.json").exists()


@pytest.mark.parametrize("config", ["single", "fsdp", "zero3"])
def test_gradient_checkpointing_lowers_the_cuda_peak_and_trains_alike(config: str, tmp_path: Path) -> None:
    """BERT-base shape, 8 x 384 in bf16: activations are most of the peak, so recomputing each layer must show in
    CUDA's figure, under FSDP's and ZeRO-3's parameter gathering too (CPU tests hold the tensor count and, for
    FSDP and ZeRO-3 on two processes, the losses); the losses follow the run without it (not bitwise on a GPU:
    atomics in backward)."""
    env, runs = base_env(tmp_path), {}
    for recompute in ("false", "true"):
        out = tmp_path / recompute
        flags = [
            *tiny_flags(out, "--max_train_steps", "5", "--logging_steps", "1", "--no_eval", "--disable_tqdm"),
            "--config_name",
            str(BERT_BASE),
            "--max_seq_length",
            "384",
            "--pad_to_max_length",
            "--per_device_train_batch_size",
            "8",
            "--learning_rate",
            "3e-5",
            "--mixed_precision",
            "bf16",
            "--save_final_model",
            "false",
            "--gradient_checkpointing",
            recompute,
        ]
        run_ok(gpu_cmd(config, out, *flags), env)
        runs[recompute] = (read_metrics(out)["peak_memory_gb"]["max"], step_log(out))
    (plain_peak, plain), (recomputed_peak, recomputed) = runs["false"], runs["true"]
    print(f"{config}: CUDA peak {plain_peak:.2f} GiB, with checkpointing {recomputed_peak:.2f} GiB")
    assert recomputed_peak < 0.8 * plain_peak
    for step in plain:
        assert recomputed[step]["train/loss"] == pytest.approx(plain[step]["train/loss"], rel=RESUME_LOSS_RTOL)


def test_training_steps_do_not_wait_for_the_gpu(tmp_path: Path) -> None:
    """Between logging steps nothing of qa_train's or accelerate's makes the host wait for the GPU: the next
    batch is copied without blocking and the token counts are read on the host; evaluation copies its logits
    to the host once every DRAIN_EVERY batches, not each batch. tools/sync_sites.py records every
    synchronizing CUDA operation of the loop (torch.cuda.set_sync_debug_mode) with its step, phase and line;
    those of transformers' models are printed, not asserted."""
    from qa_train.evaluation import DRAIN_EVERY

    out, sites_file = tmp_path / "run", tmp_path / "sites.json"
    # 250 demo questions, one window a batch: one evaluation at step 20 of more than 4 x DRAIN_EVERY batches.
    flags = tiny_gpu_flags(
        out,
        40,
        "--logging_steps",
        "10",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "20",
        "--per_device_eval_batch_size",
        "1",
        "--save_final_model",
        "false",
    )
    proc = run_ok([PY, "tools/sync_sites.py", str(sites_file), "--", *flags], base_env(tmp_path))
    print(proc.stdout[proc.stdout.find("synchronizing operations") :])
    sites = json.loads(sites_file.read_text())
    ours = [s for s in sites if "/qa_train/" in s[2] or "/accelerate/" in s[2]]
    in_step = [s for s in ours if s[1] in ("loader", "step")]
    assert not in_step, f"the step waits for the GPU at: {sorted({f'{f}:{n}' for _, _, f, n in in_step})}"
    # Step 1 also asks every rank whether a stop came during start-up.
    assert {step for step, phase, *_ in sites if phase == "after"} <= {1, 10, 20, 30, 40}
    in_eval = [s for s in ours if s[1] == "eval"]
    batches = json.loads((out / "metrics.json").read_text())["num_eval_features"]
    assert batches > 4 * DRAIN_EVERY
    # Three copies (start, end, feature index) per drain, and a few of the evaluation's own.
    assert len(in_eval) <= 3 * -(-batches // DRAIN_EVERY) + 8, f"{len(in_eval)} waits in {batches} batches"
