"""What a resumed run takes from its checkpoint and what from its own flags: the checkpoint brings moments,
counters, the best evaluation so far and an evaluation it still owes; the flags bring the learning rate.

The runs are real (tiny model, in this process); the F1 each evaluation reports is scripted, so which one is
best is known in advance. A PREEMPT file made during an evaluation stops the run at its next logging step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_flags

from qa_train.config.flags import parse_args
from qa_train.run import Preempted, run
from qa_train.strategy.checkpoint import read_state
from qa_train.trainer import Trainer


def scripted_f1(monkeypatch: pytest.MonkeyPatch, f1s: list[float], preempt_at: int | None = None) -> list[int]:
    """Each evaluation reports the next F1 of `f1s`; returns the steps evaluated, in order. The evaluation at step
    `preempt_at` also asks for a stop (a PREEMPT file), as SLURM's warning would in the middle of a run."""
    real_evaluate = Trainer.evaluate
    steps: list[int] = []
    script = iter(f1s)

    def evaluate(self: Trainer, predictions_path: Path | None = None):
        result = real_evaluate(self, predictions_path)
        steps.append(self.state.completed_steps)
        result.f1 = next(script)
        if self.state.completed_steps == preempt_at:
            (self.output_dir / "PREEMPT").touch()
        return result

    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    return steps


def _no_nan(constant: str) -> None:
    raise AssertionError(f"metrics.json holds {constant}, which is not JSON")


def test_a_resumed_run_takes_its_learning_rate_from_the_flags_and_owes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    flags = tiny_flags(
        out,
        "--max_train_steps",
        "12",
        "--logging_steps",
        "4",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "2",
        "--checkpointing_steps",
        "4",
        "--max_eval_samples",
        "16",
    )
    steps = scripted_f1(monkeypatch, [50.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0], preempt_at=2)
    with pytest.raises(Preempted):
        run(parse_args(flags))
    assert steps == [2], "the stop came at step 4, before the evaluation step 4 was due"
    state = read_state(out / "checkpoints" / "step_00000004")
    assert state.eval_owed and state.best_eval is not None and state.best_eval["step"] == 2

    metrics = run(parse_args([*flags, "--resume_from_checkpoint", "latest", "--learning_rate", "5e-4"]))
    assert steps == [2, 4, 6, 8, 10, 12], "step 4's evaluation comes first, then the loop's, then the final one"
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    lrs = {line["step"]: line["train/lr"] for line in log if "train/lr" in line}
    assert lrs[8] == pytest.approx(5e-4 * (12 - 8) / 12), "the linear schedule of this run's --learning_rate"
    assert (metrics.best_eval_step, metrics.best_f1) == (2, 50.0), "the evaluation before the resume still counts"

    again = run(parse_args([*flags, "--resume_from_checkpoint", "latest", "--learning_rate", "5e-4"]))
    assert again.train_steps == 12 and again.timed_steps == 0
    assert again.train_samples_per_second is None and again.train_loss is None, "no step: no figure, not a zero"
    json.loads((out / "metrics.json").read_text(), parse_constant=_no_nan)
