"""A full disk while a checkpoint is saved, without training: the agreement between ranks (every rank stops, the
failing one says why), no partial folder, and the exit codes (5 for a full disk, a traceback for other errors)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from conftest import tiny_flags

from qa_train.strategy import checkpoint, saving
from qa_train.strategy.train_state import TrainerState


class Rank:
    """One rank of a two-process run, as save_checkpoint sees it; the other rank's save_state fails or not."""

    num_processes = 2
    device = "cpu"

    def __init__(self, index: int, fails: bool, other_fails: bool) -> None:
        self.process_index, self.is_main_process = index, index == 0
        self.fails, self.other_fails = fails, other_fails
        self.saving = False

    def save_state(self, output_dir: str) -> None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)  # as accelerate does: rank 0 may not have made it yet
        (Path(output_dir) / f"shard_{self.process_index}.bin").write_text("half written")
        self.saving = True
        if self.fails:
            raise OSError(errno.ENOSPC, "No space left on device", output_dir)

    def reduce(self, flags: torch.Tensor, reduction: str) -> torch.Tensor:
        total = flags.clone()
        total[1 - self.process_index] += float(self.saving and self.other_fails)  # what the other rank sends
        return total


def save(rank: Rank, out: Path, step: int = 2) -> None:
    saving.save_checkpoint(rank, out, TrainerState(completed_steps=step), keep=None)


def test_a_rank_whose_save_succeeded_stops_too_and_leaves_the_saying_to_the_failing_one(tmp_path: Path) -> None:
    save(Rank(0, fails=False, other_fails=False), tmp_path, step=1)
    with pytest.raises(saving.CheckpointSaveError) as err:
        save(Rank(0, fails=False, other_fails=True), tmp_path)
    assert err.value.reporter == 1
    assert [p.name for p in checkpoint.checkpoint_root(tmp_path).iterdir()] == ["step_00000001"]

    with pytest.raises(saving.CheckpointSaveError) as err:
        save(Rank(1, fails=True, other_fails=False), tmp_path)
    assert err.value.reporter == 1
    step_1 = checkpoint.checkpoint_root(tmp_path) / "step_00000001"
    assert "rank 1: OSError: [Errno 28] No space left on device" in str(err.value)
    assert f"{step_1}, is intact; free space, then rerun with --resume_from_checkpoint latest" in str(err.value)


def test_a_full_disk_while_writing_the_manifest_removes_the_partial_folder(tmp_path: Path, monkeypatch) -> None:
    def full(folder: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(saving, "_write_manifest", full)
    with pytest.raises(saving.CheckpointSaveError, match="no earlier complete checkpoint exists") as err:
        save(Rank(0, fails=False, other_fails=False), tmp_path)
    assert str(err.value).startswith(f"checkpoint {checkpoint.checkpoint_root(tmp_path) / 'step_00000002'} could")
    assert str(err.value).endswith("free space, then rerun with --overwrite_output_dir (no checkpoint was saved)")
    assert list(checkpoint.checkpoint_root(tmp_path).iterdir()) == []


def main_raising(monkeypatch, tmp_path: Path, error: Exception, rank: int = 0) -> int:
    """`python -m qa_train`'s main with run() replaced by one that raises `error`."""
    from qa_train import __main__ as entry
    from qa_train import run as run_module

    def fail(args, splits=None) -> None:
        raise error

    monkeypatch.setattr(run_module, "run", fail)
    for name, value in {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():  # as launched
        monkeypatch.setenv(name, value)
    return entry.main(tiny_flags(tmp_path / "out", "--no_eval"))


@pytest.mark.parametrize(("rank", "says"), [(0, False), (1, True)])
def test_a_failed_save_exits_5_and_only_the_reporting_rank_prints(
    rank: int, says: bool, tmp_path: Path, monkeypatch, capsys
) -> None:
    error = saving.CheckpointSaveError("checkpoint x could not be saved: rank 1: why", reporter=1)
    assert main_raising(monkeypatch, tmp_path, error, rank) == 5
    expected = ["qa_train: error: checkpoint x could not be saved: rank 1: why"] if says else []
    assert capsys.readouterr().err.splitlines() == expected


def test_a_full_disk_anywhere_else_is_one_line_and_exit_5(tmp_path: Path, monkeypatch, capsys) -> None:
    target = tmp_path / "out" / "metrics.json"
    error = OSError(errno.ENOSPC, "No space left on device", str(target))
    assert main_raising(monkeypatch, tmp_path, error) == 5
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        f"qa_train: error: No space left on device writing {target}; free space, then rerun with "
        "--overwrite_output_dir (no checkpoint was saved)"
    )


def test_other_os_errors_still_crash_with_their_traceback(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(PermissionError):
        main_raising(monkeypatch, tmp_path, PermissionError(errno.EACCES, "Permission denied"))
