"""--logging_steps and --eval_steps below 1 are shares of the run's steps, as in transformers' Trainer."""

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
