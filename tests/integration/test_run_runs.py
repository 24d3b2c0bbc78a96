"""A run's phases after training, in real runs: the weights are exported before the work that can fail (a full
disk at metrics.json), and a resume with nothing left to train keeps the figures of the run that trained."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest
from conftest import error_lines, read_metrics, tiny_flags

from qa_train import __main__ as entry

pytestmark = pytest.mark.usefixtures("own_logging")


@pytest.fixture
def here(tmp_path: Path, in_process: None) -> Path:
    return tmp_path / "out"


def test_a_full_disk_at_metrics_json_names_it_and_keeps_the_weights(
    here: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """It said "No space left on device" without a path, left .metrics.json.tmp, and never exported the model
    (issue 38, case 4)."""
    real_write = Path.write_text

    def full_at_metrics(self: Path, text: str, *args, **kwargs) -> int:
        if self.name == ".metrics.json.tmp":
            real_write(self, text[:10], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")  # as write() reports it: no file name
        return real_write(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_at_metrics)
    assert entry.main(tiny_flags(here, "--max_train_steps", "2", "--disable_tqdm")) == 5
    [line] = error_lines(capsys.readouterr().err)
    assert line == (
        f"qa_train: error: No space left on device writing {here / 'metrics.json'}; free space, then rerun with "
        f"--overwrite_output_dir (no checkpoint was saved); the trained model is exported to {here / 'final'}"
    )
    assert (here / "final" / "model.safetensors").is_file()
    assert not (here / ".metrics.json.tmp").exists() and not (here / "metrics.json").exists()


def test_resuming_at_the_last_step_keeps_the_trained_runs_figures(here: Path, capsys: pytest.CaptureFixture) -> None:
    """A requeued finished job (or a rerun after a failed export) rewrote metrics.json with train_loss and the
    throughput null and train_runtime_s 0 (issue 38, case 5)."""
    flags = tiny_flags(here, "--max_train_steps", "2", "--checkpointing_steps", "2", "--no_eval", "--disable_tqdm")
    assert entry.main(flags) == 0
    trained = (here / "metrics.json").read_text()
    assert read_metrics(here)["train_loss"] is not None
    shutil.rmtree(here / "final")  # as after a failed export
    capsys.readouterr()
    assert entry.main([*flags, "--resume_from_checkpoint", "latest"]) == 0
    assert (here / "metrics.json").read_text() == trained
    assert (here / "final" / "model.safetensors").is_file(), "the export is made again"
    said = capsys.readouterr().err
    assert f"resumed at step 2, the last: no step was trained, so {here / 'metrics.json'} keeps the figures" in said


def test_a_divergence_at_the_last_step_names_the_steps_learning_rate_and_only_useful_remedies(
    here: Path, capsys: pytest.CaptureFixture
) -> None:
    """It said "learning rate 0" at the last step (the scheduler's next value), and advised --max_grad_norm 1.0
    (the default) and bf16 instead of fp16 on an fp32 CPU run (issue 38, case 16). Step 1 at lr 1e30 makes the
    weights huge; step 2's loss is NaN, at the linear schedule's 1e30 x 1/2."""
    flags = tiny_flags(here, "--max_train_steps", "2", "--learning_rate", "1e30", "--logging_steps", "1", "--no_eval")
    assert entry.main([*flags, "--disable_tqdm"]) == 3
    [line] = error_lines(capsys.readouterr().err)
    assert line == (
        "qa_train: error: training diverged at step 2: loss is nan (learning rate 5e+29); nothing was exported and "
        "no checkpoint was saved. Try a lower --learning_rate or more warm-up (--warmup_ratio 0.1)"
    )


def test_resuming_when_every_checkpoint_is_damaged_says_so_once_not_no_checkpoint_yet(
    here: Path, capsys: pytest.CaptureFixture
) -> None:
    """After warning that every checkpoint is damaged ("starting from scratch"), it went on "no checkpoint in ...
    yet" (issue 38, case 16): the line is for a run with no checkpoint at all."""
    flags = tiny_flags(here, "--max_train_steps", "1", "--no_eval", "--disable_tqdm", "--resume_from_checkpoint")
    assert entry.main([*flags, "latest", "--checkpointing_steps", "1"]) == 0
    said = capsys.readouterr().err
    assert f"no checkpoint in {here / 'checkpoints'} yet: starting from scratch" in said
    (here / "checkpoints" / "step_00000001" / "manifest.json").write_text("{bad")
    assert entry.main([*flags, "latest", "--overwrite_output_dir"]) == 0
    said = capsys.readouterr().err
    skipped = f"checkpoint {here / 'checkpoints' / 'step_00000001'} skipped: manifest.json: unreadable or invalid"
    assert said.count(skipped) == 1 and "no usable checkpoint left: starting from scratch" in said
    assert "yet: starting from scratch" not in said
