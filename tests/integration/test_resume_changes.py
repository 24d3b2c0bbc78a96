"""What a resumed run takes from its checkpoint and what from its own flags: the checkpoint brings moments,
counters, the best evaluation so far and an evaluation it still owes; the flags bring the learning rate.

The runs are real (tiny model, in this process); the F1 each evaluation reports is scripted, so which one is
best is known in advance. A PREEMPT file made during an evaluation stops the run at its next logging step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DEMO_TRAIN, error_lines, tiny_flags, write_config

from qa_train import __main__ as entry
from qa_train.config.flags import parse_args
from qa_train.run import Preempted, run
from qa_train.strategy.checkpoint import read_state
from qa_train.trainer import Trainer

# The runs log through the root logger's handler on this test's captured stderr, closed after it: later tests in
# this worker would log into a closed stream ("--- Logging error ---" in their output).
pytestmark = pytest.mark.usefixtures("own_logging")


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


@pytest.fixture
def refused_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """A real run that checkpoints one step in (mid-epoch), then main() resuming it with other flags: (exit code,
    its one error line)."""
    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RANK", raising=False)
    flags = tiny_flags(tmp_path / "run", "--max_train_steps", "1", "--checkpointing_steps", "1", "--no_eval")
    run(parse_args(flags))

    def resume(*changed: str) -> tuple[int, str]:
        capsys.readouterr()
        code = entry.main([*flags, "--max_train_steps", "2", "--resume_from_checkpoint", "latest", *changed])
        [line] = error_lines(capsys.readouterr().err)
        return code, line

    return resume


def test_resuming_under_another_model_shape_says_so(refused_resume, tmp_path: Path) -> None:
    """It said "could not be loaded ... if it is damaged, resume from the previous checkpoint" (issue 38, case 7)."""
    code, line = refused_resume("--config_name", str(write_config(tmp_path / "wider", intermediate_size=256)))
    assert code == 2
    assert (
        "cannot continue it: it is a checkpoint of another model shape (bert, hidden_size 128, num_hidden_layers 2, "
        in line
    )
    assert "intermediate_size 512, vocab_size 3707" in line and "this run builds bert, hidden_size 128" in line
    assert "intermediate_size 256" in line and "damaged" not in line


def test_a_mid_epoch_resume_on_reordered_training_data_is_refused(refused_resume, tmp_path: Path) -> None:
    """The same number of windows from other data (articles reordered, a question edited) was accepted without a
    word, although the epoch's order then changes under the batches already trained (issue 38, case 8)."""
    data = json.loads(DEMO_TRAIN.read_text())
    data["data"].reverse()
    reordered = tmp_path / "reordered.json"
    reordered.write_text(json.dumps(data))
    code, line = refused_resume("--train_file", str(reordered))
    assert code == 2
    assert "cannot continue it: the training windows' fingerprint " in line
    assert "and it stopped 1 micro-batches into epoch 0" in line
    assert line.endswith(
        "resume with the checkpoint's training data and windowing (--train_file, --max_train_samples, "
        "--max_seq_length, --doc_stride, the tokenizer)"
    )


def test_overwrite_keeps_the_old_run_when_the_resume_is_refused(refused_resume, tmp_path: Path) -> None:
    """--overwrite_output_dir cleared the old run before the checkpoint was checked, and the refusal then left an
    empty folder: the old run is now cleared only once the resume is known to go ahead."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "metrics.json").write_text(json.dumps({"qa_train_version": "0.1.0", "f1": 88.0}))
    (old / "train_log.jsonl").write_text('{"step": 1}\n')
    checkpoint = tmp_path / "run" / "checkpoints" / "step_00000001"
    code, line = refused_resume(
        "--output_dir", str(old), "--overwrite_output_dir", "--resume_from_checkpoint", str(checkpoint),
        "--per_device_train_batch_size", "4",
    )  # fmt: skip
    assert code == 2 and "its global batch is 8, this run's is 4" in line
    assert json.loads((old / "metrics.json").read_text())["f1"] == 88.0 and (old / "train_log.jsonl").exists()


def test_a_resume_under_another_split_of_the_batch_updates_at_whole_batches(tmp_path: Path) -> None:
    """A checkpoint at step 1 of 8 x 1 continued as 4 x 2: accelerate restored its micro-batch count (1) with the
    checkpoint, so the first update came after one micro-batch of 4 and every later one was off by one."""
    out = tmp_path / "run"
    run(parse_args(tiny_flags(out, "--max_train_steps", "1", "--checkpointing_steps", "1", "--no_eval")))
    flags = tiny_flags(out, "--max_train_steps", "3", "--checkpointing_steps", "1", "--no_eval")
    flags += ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2"]
    run(parse_args([*flags, "--resume_from_checkpoint", "latest"]))
    positions = [read_state(out / "checkpoints" / f"step_{s:08d}").batches_in_epoch for s in (2, 3)]
    assert positions == [4, 6]  # 8 windows a step, in micro-batches of 4
