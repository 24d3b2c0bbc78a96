"""--logging_steps and --eval_steps below 1 are shares of the run's steps, and an epoch's last accumulation window
is as long as the micro-batches left, as in transformers' Trainer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import tiny_flags


def test_shares_of_the_run_set_when_to_log_and_evaluate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qa_train.flags import parse_args
    from qa_train.run import run

    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    run(parse_args(tiny_flags(out, "--max_train_steps", "8", "--logging_steps", "0.25", "--eval_strategy", "steps",
                              "--eval_steps", "0.5", "--max_eval_samples", "16", "--max_train_samples", "200",
                              "--disable_tqdm", "--save_final_model", "false")))
    entries = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in entries if "train/loss" in e] == [2, 4, 6, 8]
    # Every half of the run; the last step's evaluation is the final one, made once.
    assert [e["step"] for e in entries if "eval/f1" in e] == [4, 8]


def test_an_epochs_short_last_window_updates_with_its_mean_gradient(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """36 windows in batches of 4 are 9 micro-batches an epoch: with accumulation 8 the second update has 1. Its
    gradient used to be that micro-batch's divided by 8 (logged norm and clipping included). With a learning rate
    too small to move the weights, it must be the gradient accumulation 1 sees for the same micro-batch."""
    from qa_train.flags import parse_args
    from qa_train.run import run

    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))

    def grad_norms(name: str, accumulation: int, steps: int) -> list[float]:
        out = tmp_path / name
        run(parse_args(tiny_flags(out, "--max_train_samples", "36", "--per_device_train_batch_size", "4",
                                  "--gradient_accumulation_steps", str(accumulation), "--max_train_steps", str(steps),
                                  "--learning_rate", "1e-12", "--max_grad_norm", "1e9", "--logging_steps", "1",
                                  "--no_eval", "--disable_tqdm", "--save_final_model", "false")))
        assert json.loads((out / "metrics.json").read_text())["num_train_features"] == 36
        entries = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
        return [e["train/grad_norm"] for e in entries if "train/grad_norm" in e]

    one_by_one = grad_norms("one", 1, 9)
    windowed = grad_norms("eight", 8, 2)
    assert windowed[1] == pytest.approx(one_by_one[8], rel=1e-4)
