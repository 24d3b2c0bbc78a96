"""qa_train.checkpoint without training: which folders count, rotation, resume, atomic save and load."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from qa_train.checkpoint import (STATE_FILE, TrainerState, _rotate, checkpoint_root, complete_checkpoints,
                                 load_checkpoint, resolve_resume, save_checkpoint)


class FakeAccelerator:
    """The four members save_checkpoint/load_checkpoint use, on a single main process."""

    is_main_process = True

    def __init__(self, fail_save: bool = False) -> None:
        self.fail_save = fail_save
        self.saved: list[tuple[str, list[str]]] = []  # (dir, files already in it) per save_state
        self.loaded: list[str] = []
        self.barriers = 0

    def wait_for_everyone(self) -> None:
        self.barriers += 1

    def save_state(self, output_dir: str) -> None:
        self.saved.append((output_dir, sorted(p.name for p in Path(output_dir).iterdir())))
        (Path(output_dir) / "model.safetensors").write_text(f"weights {len(self.saved)}")
        if self.fail_save:
            raise RuntimeError("disk full")

    def load_state(self, input_dir: str) -> None:
        self.loaded.append(input_dir)


def make(output_dir: Path, name: str, complete: bool = True) -> Path:
    d = checkpoint_root(output_dir) / name
    d.mkdir(parents=True)
    (d / "model.safetensors").write_text(name)
    if complete:
        (d / STATE_FILE).write_text(json.dumps(asdict(TrainerState())))
    return d


def names(paths: list[Path]) -> list[str]:
    return [p.name for p in paths]


# --- complete_checkpoints ----------------------------------------------------------------------


def test_no_checkpoint_folder_means_none(tmp_path: Path) -> None:
    assert complete_checkpoints(tmp_path / "missing") == []
    assert complete_checkpoints(tmp_path) == []


def test_only_complete_step_folders_count(tmp_path: Path) -> None:
    make(tmp_path, "step_00000002")
    make(tmp_path, ".tmp-step_00000003")  # even with a state file: a temp name is never finished
    make(tmp_path, "step_00000004", complete=False)
    make(tmp_path, "step_00000005.old")
    make(tmp_path, "final")
    (checkpoint_root(tmp_path) / "step_00000006").write_text("a file, not a folder")
    assert names(complete_checkpoints(tmp_path)) == ["step_00000002"]


def test_sorted_by_step_number(tmp_path: Path) -> None:
    for step in (10, 9, 100, 1):
        make(tmp_path, f"step_{step:08d}")
    assert names(complete_checkpoints(tmp_path)) == ["step_00000001", "step_00000009", "step_00000010",
                                                     "step_00000100"]


def test_unpadded_names_sort_numerically(tmp_path: Path) -> None:
    for name in ("step_10", "step_9", "step_00000011", "step_2"):
        make(tmp_path, name)
    assert names(complete_checkpoints(tmp_path)) == ["step_2", "step_9", "step_10", "step_00000011"]


# --- rotation ----------------------------------------------------------------------------------


def test_rotate_keeps_the_newest_complete_ones(tmp_path: Path) -> None:
    for step in (1, 2, 10, 3):
        make(tmp_path, f"step_{step:08d}")
    tmp = make(tmp_path, ".tmp-step_00000011")
    incomplete = make(tmp_path, "step_00000012", complete=False)
    _rotate(tmp_path, keep=2)
    assert names(complete_checkpoints(tmp_path)) == ["step_00000003", "step_00000010"]
    assert not (checkpoint_root(tmp_path) / "step_00000001").exists()
    assert tmp.is_dir() and incomplete.is_dir()


def test_rotate_with_fewer_than_keep_removes_nothing(tmp_path: Path) -> None:
    for step in (1, 2):
        make(tmp_path, f"step_{step:08d}")
    _rotate(tmp_path, keep=3)
    assert names(complete_checkpoints(tmp_path)) == ["step_00000001", "step_00000002"]


def test_rotate_none_keeps_all(tmp_path: Path) -> None:
    for step in range(1, 6):
        make(tmp_path, f"step_{step:08d}")
    _rotate(tmp_path, keep=None)
    assert len(complete_checkpoints(tmp_path)) == 5


# --- resolve_resume ----------------------------------------------------------------------------


def test_resume_none_is_a_fresh_start(tmp_path: Path) -> None:
    make(tmp_path, "step_00000001")
    assert resolve_resume(None, tmp_path) is None


def test_resume_latest_without_checkpoints_is_a_fresh_start(tmp_path: Path) -> None:
    make(tmp_path, ".tmp-step_00000005")
    make(tmp_path, "step_00000004", complete=False)
    assert resolve_resume("latest", tmp_path) is None
    assert resolve_resume("latest", tmp_path / "never-created") is None


def test_resume_latest_is_the_newest_complete(tmp_path: Path) -> None:
    make(tmp_path, "step_00000009")
    newest = make(tmp_path, "step_00000010")
    make(tmp_path, "step_00000011", complete=False)
    make(tmp_path, ".tmp-step_00000012")
    assert resolve_resume("latest", tmp_path) == newest


def test_resume_from_an_explicit_checkpoint(tmp_path: Path) -> None:
    ckpt = make(tmp_path, "step_00000003")
    make(tmp_path, "step_00000007")
    assert resolve_resume(str(ckpt), tmp_path) == ckpt


@pytest.mark.parametrize("kind", ["incomplete", "missing"])
def test_resume_from_a_folder_without_state_names_it(tmp_path: Path, kind: str) -> None:
    path = make(tmp_path, "step_00000003", complete=False) if kind == "incomplete" else tmp_path / "nowhere"
    with pytest.raises(ValueError) as err:
        resolve_resume(str(path), tmp_path)
    assert str(err.value).startswith(f"--resume_from_checkpoint {path}: no {STATE_FILE}")


# --- save_checkpoint / load_checkpoint ---------------------------------------------------------


def test_save_writes_a_temp_folder_then_renames_it(tmp_path: Path) -> None:
    acc = FakeAccelerator()
    state = TrainerState(completed_steps=7, epoch=1, batches_in_epoch=3)
    final = save_checkpoint(acc, tmp_path, state, keep=None)
    root = checkpoint_root(tmp_path)
    assert final == root / "step_00000007"
    # accelerate wrote into an empty temporary folder, not into the final name
    assert acc.saved == [(str(root / ".tmp-step_00000007"), [])]
    assert sorted(p.name for p in root.iterdir()) == ["step_00000007"]
    assert sorted(p.name for p in final.iterdir()) == ["model.safetensors", STATE_FILE]
    assert json.loads((final / STATE_FILE).read_text()) == {"completed_steps": 7, "epoch": 1,
                                                             "batches_in_epoch": 3}
    assert acc.barriers >= 2  # ranks meet before and after writing their shards


def test_a_save_that_crashes_never_becomes_latest(tmp_path: Path) -> None:
    previous = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=4), keep=None)
    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(FakeAccelerator(fail_save=True), tmp_path, TrainerState(completed_steps=8), keep=None)
    assert (checkpoint_root(tmp_path) / ".tmp-step_00000008").is_dir()
    assert resolve_resume("latest", tmp_path) == previous
    # the next attempt at the same step starts from an empty temp folder
    acc = FakeAccelerator()
    final = save_checkpoint(acc, tmp_path, TrainerState(completed_steps=8), keep=None)
    assert acc.saved[0][1] == []
    assert resolve_resume("latest", tmp_path) == final
    assert not (checkpoint_root(tmp_path) / ".tmp-step_00000008").exists()


def test_saving_the_same_step_again_overwrites(tmp_path: Path) -> None:
    first = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=5, batches_in_epoch=1),
                            keep=None)
    (first / "stale.bin").write_text("from the first save")
    second = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=5, batches_in_epoch=2),
                             keep=None)
    assert second == first
    assert not (second / "stale.bin").exists()
    assert json.loads((second / STATE_FILE).read_text())["batches_in_epoch"] == 2
    assert names(complete_checkpoints(tmp_path)) == ["step_00000005"]


def test_save_applies_the_keep_limit(tmp_path: Path) -> None:
    stray = make(tmp_path, ".tmp-step_00000099")  # someone else's unfinished save: not ours to delete
    for step in (1, 2, 3, 4):
        save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=step), keep=2)
    assert names(complete_checkpoints(tmp_path)) == ["step_00000003", "step_00000004"]
    assert stray.is_dir()


def test_save_without_limit_keeps_all(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=step), keep=None)
    assert len(complete_checkpoints(tmp_path)) == 3


def test_load_restores_the_trainer_state(tmp_path: Path) -> None:
    state = TrainerState(completed_steps=12, epoch=2, batches_in_epoch=5)
    path = save_checkpoint(FakeAccelerator(), tmp_path, state, keep=None)
    acc = FakeAccelerator()
    restored = load_checkpoint(acc, resolve_resume("latest", tmp_path))
    assert restored == state
    assert acc.loaded == [str(path)]
