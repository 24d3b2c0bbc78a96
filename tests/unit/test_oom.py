"""Out of memory told from other errors, the failed allocation read from the allocator's message, and
`qa-train predict` out of memory: one line, exit 7."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from oom_faults import CUDA_OOM, cuda_oom, fail_forward

from qa_train.strategy.oom import is_out_of_memory, what_failed


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
