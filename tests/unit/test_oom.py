"""Out of memory: one line that says where (a training step, an evaluation batch, building the model), the
allocation that failed, and what to change; exit 7, no traceback, nothing recorded as finished.

The runs are main() in this process with the model's forward replaced: the first raises CUDA's own error type with
the text torch gives it, the second makes a real allocation the CPU allocator refuses."""

from __future__ import annotations

import logging
import re
import shlex
from pathlib import Path

import psutil
import pytest
import torch
from conftest import TINY, error_lines, tiny_flags
from transformers.models.bert.modeling_bert import BertForQuestionAnswering

from qa_train import __main__ as entry
from qa_train.strategy.oom import is_out_of_memory, what_failed

# torch 2.13's CUDA caching allocator, word for word (an H100 asked for a 2.25 GiB block)
CUDA_OOM = (
    "CUDA out of memory. Tried to allocate 2.25 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.06 GiB "
    "is free. Including non-PyTorch memory, this process has 78.04 GiB memory in use. Of the allocated memory "
    "76.50 GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but unallocated. If reserved but "
    "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
TRAINING_ADVICE = (
    "lower --per_device_train_batch_size and raise --gradient_accumulation_steps (2 now) to keep the "
    "global batch, add --gradient_checkpointing, or shard the model states with a zero2, zero3 or fsdp "
    "config (zero2_offload and zero3_offload move them to host memory); `qa-train plan "
    "--config_name {tiny} --num_gpus 1 --gpu_memory_gib {gib} --device cpu --per_device_train_batch_size "
    "8 --max_seq_length 192` estimates each config's peak for this run"
)


@pytest.fixture(autouse=True)
def own_logging():
    """main() points the root logger at this test's captured stderr, closed once the test ends: later tests must not
    log there."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def run_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """main() here, as rank 0 with its own feature cache: (exit code, its one error line)."""
    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RANK", raising=False)

    def run(*extra: str) -> tuple[int, str]:
        capsys.readouterr()
        code = entry.main(tiny_flags(tmp_path / "out", "--disable_tqdm", *extra))
        [line] = error_lines(capsys.readouterr().err)
        return code, line

    return run


def fail_forward(monkeypatch: pytest.MonkeyPatch, training: bool, fail) -> None:
    real = BertForQuestionAnswering.forward

    def forward(self, *args, **kwargs):
        if self.training == training:
            fail()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(BertForQuestionAnswering, "forward", forward)


def cuda_oom() -> None:
    raise torch.OutOfMemoryError(CUDA_OOM)


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
    fail_forward(monkeypatch, training=False, fail=cuda_oom)
    code, line = run_main("--max_train_steps", "2", "--per_device_eval_batch_size", "48")
    assert code == 7
    assert re.fullmatch(
        r"qa_train: error: rank 0: out of memory in inference \(a 2\.25 GiB allocation on a 79\.11 GiB "
        r"GPU; a batch of 48 windows x \d+ tokens\): lower --per_device_eval_batch_size",
        line,
    ), line
    assert not (tmp_path / "out" / "metrics.json").exists()


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


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        (torch.OutOfMemoryError(CUDA_OOM), True),
        (MemoryError(), True),
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                "tried to allocate 10000000000000 bytes. Error code 12 (Cannot allocate memory)"
            ),
            True,
        ),
        (RuntimeError("shape '[8, 192]' is invalid for input of size 100"), False),
        (ValueError("out of memory"), False),
    ],
)
def test_out_of_memory_is_told_from_other_errors(err: BaseException, expected: bool) -> None:
    assert is_out_of_memory(err) is expected


def test_the_failed_allocation_is_read_from_the_allocators_message() -> None:
    assert what_failed(torch.OutOfMemoryError(CUDA_OOM)) == "a 2.25 GiB allocation on a 79.11 GiB GPU"
    assert what_failed(MemoryError()) == "an allocation"


def test_qa_train_predict_out_of_memory_is_one_line_and_exit_7(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from conftest import DEMO_DEV, high_padding_model

    from qa_train import predict

    model = high_padding_model(tmp_path / "model")
    fail_forward(monkeypatch, training=False, fail=cuda_oom)
    code = predict.main(
        [
            str(model),
            "--test_file",
            str(DEMO_DEV),
            "--max_predict_samples",
            "5",
            "--per_device_eval_batch_size",
            "4",
            "--device",
            "cpu",
        ]
    )
    err = capsys.readouterr().err
    assert code == 7 and "Traceback" not in err
    [line] = [x for x in err.splitlines() if x.startswith("qa-train predict: error:")]
    assert re.fullmatch(
        r"qa-train predict: error: out of memory in inference \(a 2\.25 GiB allocation on a 79\.11 "
        r"GiB GPU; a batch of 4 windows x \d+ tokens\): lower --per_device_eval_batch_size",
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
