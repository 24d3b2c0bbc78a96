"""Out of memory in a run: one line that says where (a training step, an evaluation batch, building the model,
saving), the allocation that failed, and what to change; exit 7, no traceback, nothing recorded as finished.

The runs are main() in this process with the model's forward replaced: the first raises CUDA's own error type with
the text torch gives it, the second makes a real allocation the CPU allocator refuses."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import psutil
import pytest
import torch
from conftest import TINY, error_lines, tiny_flags
from oom_faults import CUDA_OOM, cuda_oom, fail_forward

from qa_train import __main__ as entry

TRAINING_ADVICE = (
    "lower --per_device_train_batch_size and raise --gradient_accumulation_steps (2 now) to keep the "
    "global batch, add --gradient_checkpointing, or shard the model states with a zero2, zero3 or fsdp "
    "config (zero2_offload and zero3_offload move them to host memory); `qa-train plan "
    "--config_name {tiny} --num_gpus 1 --gpu_memory_gib {gib} --device cpu --per_device_train_batch_size "
    "8 --max_seq_length 192` estimates each config's peak for this run"
)

pytestmark = pytest.mark.usefixtures("own_logging")


@pytest.fixture
def run_main(tmp_path: Path, in_process: None, capsys: pytest.CaptureFixture[str]):
    """main() here, as rank 0 with its own feature cache: (exit code, its one error line)."""

    def run(*extra: str) -> tuple[int, str]:
        capsys.readouterr()
        code = entry.main(tiny_flags(tmp_path / "out", "--disable_tqdm", *extra))
        [line] = error_lines(capsys.readouterr().err)
        return code, line

    return run


def host_oom() -> None:
    torch.empty(10**13, dtype=torch.uint8)  # 9,313 GiB: refused by the allocator, not faked


def test_a_training_step_out_of_gpu_memory_says_the_step_batch_and_what_to_change(
    run_main, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fail_forward(monkeypatch, training=True, fail=cuda_oom)
    code, line = run_main("--max_train_steps", "4", "--gradient_accumulation_steps", "2")
    assert code == 7
    advice = TRAINING_ADVICE.format(tiny=TINY, gib=f"{psutil.virtual_memory().total / 2**30:.0f}")
    assert re.fullmatch(
        r"qa_train: error: rank 0: out of memory at training step 1 \(a 2\.25 GiB allocation on a "
        r"79\.11 GiB GPU; a micro-batch of 8 windows x \d+ tokens\): " + re.escape(advice),
        line,
    ), line
    assert not (tmp_path / "out" / "metrics.json").exists() and not (tmp_path / "out" / "final").exists()
    # The planner command in the line runs as it stands.
    from qa_train.studies import plan_command

    command = shlex.split(re.search(r"`(qa-train plan [^`]+)`", line)[1])
    assert plan_command.main(command[2:]) == 0


def test_a_real_host_allocation_failure_in_a_step_is_told_the_same_way(
    run_main, monkeypatch: pytest.MonkeyPatch
) -> None:
    fail_forward(monkeypatch, training=True, fail=host_oom)
    code, line = run_main("--max_train_steps", "4", "--gradient_accumulation_steps", "2")
    assert code == 7
    assert line.startswith(
        "qa_train: error: rank 0: out of memory at training step 1 (a 9313.23 GiB allocation in "
        "host memory; a micro-batch of 8 windows x "
    ), line


def test_evaluation_out_of_memory_names_the_eval_batch(
    run_main, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The final evaluation came before the export: its failure lost the trained weights, and said nothing of them
    (issue 38, case 6). They are exported first now, and the line says where."""
    fail_forward(monkeypatch, training=False, fail=cuda_oom)
    code, line = run_main("--max_train_steps", "2", "--per_device_eval_batch_size", "48")
    assert code == 7
    final = tmp_path / "out" / "final"
    assert re.fullmatch(
        r"qa_train: error: rank 0: out of memory in inference \(a 2\.25 GiB allocation on a 79\.11 GiB "
        rf"GPU; a batch of 48 windows x \d+ tokens\): lower --per_device_eval_batch_size; the trained model is "
        rf"exported to {re.escape(str(final))}",
        line,
    ), line
    assert not (tmp_path / "out" / "metrics.json").exists()
    assert (final / "model.safetensors").is_file() and (final / "config.json").is_file()


def test_building_the_model_out_of_memory_points_at_sharding(run_main, monkeypatch: pytest.MonkeyPatch) -> None:
    def load_model(*args, **kwargs):
        raise torch.OutOfMemoryError(CUDA_OOM)

    monkeypatch.setattr("qa_train.trainer.load_model", load_model)
    code, line = run_main("--max_train_steps", "2")
    assert code == 7
    assert re.fullmatch(
        r"qa_train: error: rank 0: out of memory \(in qa_train/trainer\.py:\d+, _build_model\): a "
        r"2\.25 GiB allocation on a 79\.11 GiB GPU failed; shard the model states with a zero2, zero3 "
        r"or fsdp config .*",
        line,
    ), line


@pytest.mark.parametrize("where", ["checkpoint", "export"])
def test_out_of_memory_while_saving_is_out_of_memory_not_a_disk_failure(
    where: str, run_main, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A save or export that ran out of memory (ZeRO-3 and FSDP gather the weights to save them) was reported as a
    checkpoint that could not be saved (5, "free space") or a failed export (4)."""
    import accelerate

    from qa_train.strategy import saving

    if where == "checkpoint":
        monkeypatch.setattr(accelerate.Accelerator, "save_state", lambda *args, **kwargs: cuda_oom())
        extra = ("--checkpointing_steps", "1")
    else:
        monkeypatch.setattr(saving, "_write_export", lambda *args, **kwargs: cuda_oom())
        extra = ("--no_eval",)
    code, line = run_main("--max_train_steps", "2", *extra)
    assert code == 7
    assert line.startswith("qa_train: error: rank 0: out of memory (in qa_train/strategy/saving.py:"), line
    assert "a 2.25 GiB allocation on a 79.11 GiB GPU failed; shard the model states" in line
    assert not (tmp_path / "out" / "checkpoints" / ".tmp-step_00000001").exists()
