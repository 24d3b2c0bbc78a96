"""--logging_steps and --eval_steps below 1 are shares of the run's steps, and an epoch's last accumulation window
is as long as the micro-batches left, as in transformers' Trainer."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import tiny_flags


def test_shares_of_the_run_set_when_to_log_and_evaluate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from qa_train.config.flags import parse_args
    from qa_train.run import run

    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    run(
        parse_args(
            tiny_flags(
                out,
                "--max_train_steps",
                "8",
                "--logging_steps",
                "0.25",
                "--eval_strategy",
                "steps",
                "--eval_steps",
                "0.5",
                "--max_eval_samples",
                "16",
                "--max_train_samples",
                "200",
                "--disable_tqdm",
                "--save_final_model",
                "false",
            )
        )
    )
    entries = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in entries if "train/loss" in e] == [2, 4, 6, 8]
    # Every half of the run; the last step's evaluation is the final one, made once.
    evals = [e for e in entries if "eval/f1" in e]
    assert [e["step"] for e in evals] == [4, 8]
    # The log says each evaluation during training too, with the scores the trackers got (200 windows in
    # batches of 8: step 4 is 4 of an epoch's 25 micro-batches).
    line = (
        f"evaluation at step 4 (epoch 0.16): exact_match {evals[0]['eval/exact_match']:.2f}, "
        f"f1 {evals[0]['eval/f1']:.2f}"
    )
    assert capfd.readouterr().err.count(line) == 1


def test_an_epochs_short_last_window_updates_with_its_mean_gradient(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """36 windows in batches of 4 are 9 micro-batches an epoch: with accumulation 8 the second update has 1. Its
    gradient used to be that micro-batch's divided by 8 (logged norm and clipping included). With a learning rate
    too small to move the weights, it must be the gradient accumulation 1 sees for the same micro-batch."""
    from qa_train.config.flags import parse_args
    from qa_train.run import run

    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))

    def grad_norms(name: str, accumulation: int, steps: int) -> list[float]:
        out = tmp_path / name
        run(
            parse_args(
                tiny_flags(
                    out,
                    "--max_train_samples",
                    "36",
                    "--per_device_train_batch_size",
                    "4",
                    "--gradient_accumulation_steps",
                    str(accumulation),
                    "--max_train_steps",
                    str(steps),
                    "--learning_rate",
                    "1e-12",
                    "--max_grad_norm",
                    "1e9",
                    "--logging_steps",
                    "1",
                    "--no_eval",
                    "--disable_tqdm",
                    "--save_final_model",
                    "false",
                )
            )
        )
        assert json.loads((out / "metrics.json").read_text())["num_train_features"] == 36
        entries = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
        return [e["train/grad_norm"] for e in entries if "train/grad_norm" in e]

    one_by_one = grad_norms("one", 1, 9)
    windowed = grad_norms("eight", 8, 2)
    assert windowed[1] == pytest.approx(one_by_one[8], rel=1e-4)


def test_checkpoint_saves_are_left_out_of_throughput_and_reported_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save's time is the disk's, not the step's: with a checkpoint every step, each made to take over 0.4 s,
    the timed steps used to take in every save. Both the run's figures and every logged interval leave the saves
    out (timed steps + saves fit in the loop's wall time; before, they overran it by the saves); metrics.json has
    their time apart. Bounds from the run's own wall clock, not absolute step times: a loaded machine slows
    steps, not the sum."""
    from qa_train.config.flags import parse_args
    from qa_train.run import run
    from qa_train.strategy import saving

    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    real_save = saving.save_checkpoint

    def slow_save(*args, **kwargs):
        time.sleep(0.4)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(saving, "save_checkpoint", slow_save)
    out = tmp_path / "run"
    run(
        parse_args(
            tiny_flags(
                out,
                "--max_train_steps",
                "4",
                "--checkpointing_steps",
                "1",
                "--logging_steps",
                "1",
                "--throughput_warmup_steps",
                "0",
                "--max_train_samples",
                "64",
                "--no_eval",
                "--disable_tqdm",
                "--save_final_model",
                "false",
            )
        )
    )
    m = json.loads((out / "metrics.json").read_text())
    assert m["timed_steps"] == 4 and m["checkpoint_runtime_s"] >= 4 * 0.4
    slack = 0.05
    steps_s = m["train_step_time_s_mean"] * 4
    assert steps_s + m["checkpoint_runtime_s"] <= m["train_runtime_s"] + slack
    rates = [json.loads(line)["throughput/samples_per_second"] for line in (out / "train_log.jsonl").open()]
    assert len(rates) == 4
    assert sum(8 / r for r in rates) + m["checkpoint_runtime_s"] <= m["train_runtime_s"] + slack  # 8 windows a step
