"""Dataloader workers (the GPU default) and --group_by_length change when and how batches are built, never which
windows a step trains on: the per-step losses are a function of the seed alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY, tiny_flags
from test_strategies import step_log


def _losses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, *extra: str) -> list[float]:
    from qa_train.config.flags import parse_args
    from qa_train.run import run

    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / name
    run(
        parse_args(
            tiny_flags(
                out,
                "--max_train_steps",
                "6",
                "--logging_steps",
                "1",
                # No final evaluation, but for a run evaluating during training (--no_eval contradicts that).
                *(() if "--eval_strategy" in extra else ("--no_eval",)),
                "--disable_tqdm",
                "--save_final_model",
                "false",
                "--max_train_samples",
                "200",
                *extra,
            )
        )
    )
    log = step_log(out)
    assert sorted(log) == list(range(1, 7))
    return [log[s]["train/loss"] for s in range(1, 7)]


def test_workers_and_length_grouping_keep_each_steps_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _losses(tmp_path, monkeypatch, "plain", "--dataloader_num_workers", "0")
    assert _losses(tmp_path, monkeypatch, "workers", "--dataloader_num_workers", "2") == plain
    grouped = _losses(tmp_path, monkeypatch, "grouped", "--group_by_length", "--dataloader_num_workers", "0")
    assert grouped != plain, "--group_by_length left the batches as they were"
    assert (
        _losses(tmp_path, monkeypatch, "grouped-workers", "--group_by_length", "--dataloader_num_workers", "2")
        == grouped
    )


def test_evaluations_during_training_leave_dropout_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An evaluation used to draw its loader's seed from the global RNG: every later step saw other dropout masks,
    and a resumed run's --eval_on_start took it off the uninterrupted run's path. The bundled model has no
    dropout, so this one adds some."""
    config = json.loads((TINY / "config.json").read_text())
    config.update(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    dropout = tmp_path / "tiny-dropout"
    dropout.mkdir()
    (dropout / "config.json").write_text(json.dumps(config))
    model = ("--config_name", str(dropout))
    plain = _losses(tmp_path, monkeypatch, "plain", *model)
    evaluated = _losses(
        tmp_path,
        monkeypatch,
        "evaluated",
        *model,
        "--eval_on_start",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "2",
        "--max_eval_samples",
        "8",
    )
    assert evaluated == plain
