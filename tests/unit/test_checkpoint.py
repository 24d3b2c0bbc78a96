"""qa_train.strategy.checkpoint without training: which folders count, rotation, resume, atomic save and load."""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import re
import shutil
import stat
import zlib
from dataclasses import asdict
from pathlib import Path

import pytest
from test_train_state import contract

from qa_train.strategy import checkpoint as ckpt  # names added with manifests: fail one by one on an older module
from qa_train.strategy.checkpoint import (
    STATE_FILE,
    checkpoint_root,
    complete_checkpoints,
    load_checkpoint,
    resolve_resume,
)
from qa_train.strategy.saving import CheckpointSaveError, _rotate, save_checkpoint
from qa_train.strategy.train_state import (
    CHECKPOINT_FORMAT,
    CONTRACT,
    DATA_ORDER,
    WRITER,
    TrainerState,
    state_from_json,
)

MANIFEST = "manifest.json"
RUN = "0123456789abcdef0123456789abcdef"  # the run_id of the folders `make` writes


class FakeAccelerator:
    """The members save_checkpoint/load_checkpoint use, on a single main process."""

    is_main_process = True
    process_index = 0
    num_processes = 1
    device = "cpu"

    def __init__(self, fail_save: bool = False, fail_load: Exception | None = None) -> None:
        self.fail_save = fail_save
        self.fail_load = fail_load
        self.saved: list[tuple[str, list[str]]] = []  # (dir, files already in it) per save_state
        self.loaded: list[str] = []
        self.barriers = 0

    def wait_for_everyone(self) -> None:
        self.barriers += 1

    def reduce(self, tensor, reduction: str):  # save_checkpoint's agreement on failures, a barrier too
        self.barriers += 1
        return tensor

    def save_state(self, output_dir: str) -> None:
        self.saved.append((output_dir, sorted(p.name for p in Path(output_dir).iterdir())))
        (Path(output_dir) / "model.safetensors").write_text(f"weights {len(self.saved)}")
        if self.fail_save:
            raise RuntimeError("disk full")

    def load_state(self, input_dir: str) -> None:
        self.loaded.append(input_dir)
        if self.fail_load is not None:
            raise self.fail_load


def make(output_dir: Path, name: str, complete: bool = True, run_id: str = RUN) -> Path:
    """A checkpoint folder as save_checkpoint leaves it (complete) or as a crash might (no state, no manifest)."""
    d = checkpoint_root(output_dir) / name
    d.mkdir(parents=True)
    (d / "model.safetensors").write_text(name)
    if complete:
        (d / STATE_FILE).write_text(json.dumps({**asdict(TrainerState()), "run_id": run_id}))
        write_manifest(d)
    return d


def make_old_format(output_dir: Path, name: str) -> Path:
    """What qa_train wrote before manifests: no manifest.json, and only the three counters in its state."""
    d = checkpoint_root(output_dir) / name
    d.mkdir(parents=True)
    (d / "model.safetensors").write_text(name)
    (d / STATE_FILE).write_text(json.dumps({"completed_steps": 3, "epoch": 1, "batches_in_epoch": 2}))
    return d


def write_manifest(d: Path) -> None:
    """The documented format, written here by hand so these tests pin it down."""
    files = {p.relative_to(d).as_posix(): p.stat().st_size for p in d.rglob("*") if p.is_file() and p.name != MANIFEST}
    (d / MANIFEST).write_text(json.dumps({"format": 1, "files": files}))


def truncate(path: Path, size: int = 3) -> None:
    path.write_bytes(path.read_bytes()[:size])


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
    assert names(complete_checkpoints(tmp_path)) == ["step_00000001", "step_00000009", "step_00000010", "step_00000100"]


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
    _rotate(tmp_path, keep=2, run_id=RUN)
    assert names(complete_checkpoints(tmp_path)) == ["step_00000003", "step_00000010"]
    assert not (checkpoint_root(tmp_path) / "step_00000001").exists()
    assert tmp.is_dir() and incomplete.is_dir()


def test_rotate_with_fewer_than_keep_removes_nothing(tmp_path: Path) -> None:
    for step in (1, 2):
        make(tmp_path, f"step_{step:08d}")
    _rotate(tmp_path, keep=3, run_id=RUN)
    assert names(complete_checkpoints(tmp_path)) == ["step_00000001", "step_00000002"]


def test_rotate_none_keeps_all(tmp_path: Path) -> None:
    for step in range(1, 6):
        make(tmp_path, f"step_{step:08d}")
    _rotate(tmp_path, keep=None, run_id=RUN)
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


def test_a_checkpoint_others_could_have_written_is_refused_before_it_is_unpickled(tmp_path: Path) -> None:
    """A crafted mp_rank_00_model_states.pt ran code on resume: the loaders unpickle it (issue 38, Also). A file
    writable by others, or a checkpoint of another user, is refused by name, 'latest' and explicit alike."""
    folder = make(tmp_path, "step_00000003")
    states = folder / "pytorch_model" / "mp_rank_00_model_states.pt"
    states.parent.mkdir()
    states.write_bytes(b"pickle")
    write_manifest(folder)
    assert resolve_resume("latest", tmp_path) == folder
    states.chmod(0o666)
    for spec in ("latest", str(folder)):
        with pytest.raises(ckpt.CheckpointError) as err:
            resolve_resume(spec, tmp_path)
        assert str(err.value) == (
            f"--resume_from_checkpoint {folder}: {states} is writable by others (mode 0666); loading a checkpoint "
            "runs the code it may hold (pickle): resume only from your own, or copy one you trust"
        )
    states.chmod(0o644)
    if os.geteuid() == 0:  # only root can give a file away
        os.chown(states, 4321, -1)
        with pytest.raises(
            ckpt.CheckpointError, match=rf"{re.escape(str(states))} is owned by uid 4321, not you \(uid 0\)"
        ):
            resolve_resume(str(folder), tmp_path)


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
    assert sorted(p.name for p in final.iterdir() if p.name != MANIFEST) == ["model.safetensors", STATE_FILE]
    saved = json.loads((final / STATE_FILE).read_text())
    counters = {k: saved[k] for k in ("completed_steps", "epoch", "batches_in_epoch")}
    assert counters == {"completed_steps": 7, "epoch": 1, "batches_in_epoch": 3}
    assert acc.barriers >= 2  # ranks meet before and after writing their shards


def test_a_save_that_crashes_never_becomes_latest(tmp_path: Path) -> None:
    previous = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=4), keep=None)
    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(FakeAccelerator(fail_save=True), tmp_path, TrainerState(completed_steps=8), keep=None)
    assert not (checkpoint_root(tmp_path) / ".tmp-step_00000008").exists()  # removed: a full disk needs it back
    assert resolve_resume("latest", tmp_path) == previous
    # the next attempt at the same step starts from an empty temp folder, even after a kill left one
    make(tmp_path, ".tmp-step_00000008", complete=False)
    acc = FakeAccelerator()
    final = save_checkpoint(acc, tmp_path, TrainerState(completed_steps=8), keep=None)
    assert acc.saved[0][1] == []
    assert resolve_resume("latest", tmp_path) == final
    assert not (checkpoint_root(tmp_path) / ".tmp-step_00000008").exists()


def test_a_save_removes_what_a_killed_save_of_another_step_left(tmp_path: Path) -> None:
    """A second Ctrl-C or a SIGKILL mid-save leaves .tmp-step_N with up to a checkpoint's worth of shards; only a
    later save of that same step used to remove it, so a resumed run that checkpoints at other steps kept it."""
    left = make(tmp_path, ".tmp-step_00000006", complete=False)
    (left / "pytorch_model.bin").write_bytes(b"x" * 1024)
    final = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=4), keep=None)
    assert sorted(p.name for p in checkpoint_root(tmp_path).iterdir()) == [final.name]


def test_saving_the_same_step_again_overwrites(tmp_path: Path) -> None:
    first = save_checkpoint(
        FakeAccelerator(), tmp_path, TrainerState(completed_steps=5, batches_in_epoch=1, run_id=RUN), keep=None
    )
    (first / "stale.bin").write_text("from the first save")
    second = save_checkpoint(
        FakeAccelerator(), tmp_path, TrainerState(completed_steps=5, batches_in_epoch=2, run_id=RUN), keep=None
    )
    assert second == first
    assert not (second / "stale.bin").exists()
    assert json.loads((second / STATE_FILE).read_text())["batches_in_epoch"] == 2
    assert names(complete_checkpoints(tmp_path)) == ["step_00000005"]


def test_save_applies_the_keep_limit(tmp_path: Path) -> None:
    stray = make(tmp_path, "step_00000099-by-hand")  # a folder of the user's: not ours to delete
    for step in (1, 2, 3, 4):
        save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=step, run_id=RUN), keep=2)
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


# --- manifest and verify -----------------------------------------------------------------------


class ShardingAccelerator(FakeAccelerator):
    """Writes a DeepSpeed-like subfolder of shards, as ZeRO does."""

    def save_state(self, output_dir: str) -> None:
        super().save_state(output_dir)
        shards = Path(output_dir) / "pytorch_model"
        shards.mkdir()
        (shards / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"\0" * 1000)


def test_save_writes_a_manifest_of_every_file_and_its_size(tmp_path: Path) -> None:
    final = save_checkpoint(ShardingAccelerator(), tmp_path, TrainerState(completed_steps=3), keep=None)
    manifest = json.loads((final / MANIFEST).read_text())
    sizes = {p.relative_to(final).as_posix(): p.stat().st_size for p in final.rglob("*") if p.is_file()}
    del sizes[MANIFEST]
    assert manifest["files"] == sizes
    assert manifest["files"]["pytorch_model/zero_pp_rank_0_mp_rank_00_optim_states.pt"] == 1000
    assert STATE_FILE in manifest["files"]  # written after the trainer state
    assert ckpt.verify(final) is None


def test_save_records_each_files_crc32(tmp_path: Path) -> None:
    final = save_checkpoint(ShardingAccelerator(), tmp_path, TrainerState(completed_steps=3), keep=None)
    manifest = json.loads((final / MANIFEST).read_text())
    assert manifest["format"] == 2 and set(manifest["crc32"]) == set(manifest["files"])
    for name, crc in manifest["crc32"].items():
        assert crc == zlib.crc32((final / name).read_bytes()), name


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_verify_with_contents_names_a_file_damaged_at_its_own_size(tmp_path: Path) -> None:
    final = save_checkpoint(ShardingAccelerator(), tmp_path, TrainerState(completed_steps=3), keep=None)
    flip_a_byte(final / "pytorch_model" / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    assert ckpt.verify(final) is None  # sizes alone: what rotation and listings check, reading no file
    assert ckpt.verify(final, contents=True) == (
        "pytorch_model/zero_pp_rank_0_mp_rank_00_optim_states.pt: its "
        "contents differ from the manifest's CRC32 (damaged after it was "
        "written)"
    )
    flip_a_byte(final / "model.safetensors")
    assert ckpt.verify(final, contents=True) == (
        "model.safetensors: its contents differ from the manifest's CRC32 (damaged after it was written) (and 1 more)"
    )


def test_a_manifest_without_checksums_still_verifies_with_contents(tmp_path: Path) -> None:
    d = make(tmp_path, "step_00000001")  # format 1: sizes only, as written before the checksums
    assert ckpt.verify(d, contents=True) is None
    manifest = json.loads((d / MANIFEST).read_text())
    (d / MANIFEST).write_text(json.dumps({**manifest, "crc32": {"model.safetensors": "abc"}}))
    assert ckpt.verify(d).startswith("manifest.json: unreadable or invalid (ValueError: its 'crc32' is not")


def test_latest_with_contents_skips_a_damaged_checkpoint(tmp_path: Path, caplog) -> None:
    good = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=2), keep=None)
    bad = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=4), keep=None)
    flip_a_byte(bad / "model.safetensors")
    assert resolve_resume("latest", tmp_path) == bad
    with caplog.at_level(logging.WARNING, logger="qa_train"):
        assert resolve_resume("latest", tmp_path, contents=True) == good
    assert f"checkpoint {bad} skipped: model.safetensors: its contents differ" in caplog.text
    with pytest.raises(ckpt.CheckpointError, match=f"the newest good checkpoint there is {good}"):
        resolve_resume(str(bad), tmp_path, contents=True)


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda m: m["files"].update({"/etc/hostname": 5}), "'/etc/hostname' is not a file inside the checkpoint"),
        (lambda m: m["files"].update({"../step_00000002/model.safetensors": 5}), "is not a file inside the checkpoint"),
        (lambda m: m["crc32"].pop("model.safetensors"), "its 'crc32' does not cover exactly the files it lists"),
        (lambda m: m["crc32"].update({"extra.bin": 1}), "its 'crc32' does not cover exactly the files it lists"),
        (lambda m: m.update(format="2"), "'format' is '2', not a number"),
    ],
    ids=["absolute", "dotdot", "crc-missing", "crc-extra", "format"],
)
def test_a_manifest_naming_files_outside_the_checkpoint_or_missing_checksums_is_invalid(
    tmp_path: Path, edit, problem: str
) -> None:
    """Found in review: any name in 'crc32' was read (`/dev/zero` would never end, on the main process while every
    rank waited), and a format-2 manifest whose 'crc32' left files out checked none of them."""
    final = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=3), keep=None)
    manifest = json.loads((final / MANIFEST).read_text())
    edit(manifest)
    (final / MANIFEST).write_text(json.dumps(manifest))
    assert problem in ckpt.verify(final, contents=True)


def test_a_refusal_names_no_sibling_that_would_be_refused_in_turn(tmp_path: Path) -> None:
    older = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=2), keep=None)
    damaged = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=4), keep=None)
    refused = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=6), keep=None)
    flip_a_byte(damaged / "model.safetensors")
    truncate(refused / "model.safetensors")
    with pytest.raises(ckpt.CheckpointError, match=f"the newest good checkpoint there is {older}$"):
        resolve_resume(str(refused), tmp_path, contents=True)


class ResumingRank(FakeAccelerator):
    """One of two ranks deciding where to resume: rank 0's answer is what broadcast_object_list delivers."""

    def __init__(self, index: int, sent: list | None = None) -> None:
        super().__init__()
        self.process_index, self.is_main_process, self.num_processes, self.sent = index, index == 0, 2, sent


def test_the_main_process_alone_checks_contents_and_every_rank_gets_its_answer(tmp_path: Path, monkeypatch) -> None:
    import accelerate.utils

    good = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=2), keep=None)
    bad = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=4), keep=None)
    flip_a_byte(bad / "model.safetensors")
    read: list[Path] = []
    monkeypatch.setattr(ckpt, "_crc32", lambda path, chunk=0: read.append(path) or zlib.crc32(path.read_bytes()))
    sent: list = []
    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", lambda answer: sent.extend(answer) or answer)
    assert ckpt.agreed_resume(ResumingRank(0), "latest", tmp_path) == good
    assert read and sent == [("path", str(good))]

    read.clear()
    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", lambda answer: answer.__setitem__(0, sent[0]))
    assert ckpt.agreed_resume(ResumingRank(1), "latest", tmp_path) == good
    assert read == []  # no rank but the main process reads the checkpoint's bytes

    monkeypatch.setattr(
        accelerate.utils,
        "broadcast_object_list",
        lambda answer: answer.__setitem__(0, ("refused", "--resume_from_checkpoint x: damaged")),
    )
    with pytest.raises(ckpt.CheckpointError, match="^--resume_from_checkpoint x: damaged$"):
        ckpt.agreed_resume(ResumingRank(1), str(bad), tmp_path)


@pytest.mark.parametrize(
    "error", [PermissionError(13, "Permission denied", "manifest.json"), KeyError("a bug")], ids=["unreadable", "bug"]
)
def test_a_check_that_fails_on_the_main_process_leaves_no_rank_waiting(
    tmp_path: Path, monkeypatch, error: Exception
) -> None:
    """Found in review: only CheckpointError was caught, so any other error on the main process skipped the
    broadcast the other ranks wait in (until the process group's timeout). They now get a refusal; an unreadable
    checkpoint is one for the main process too, a bug keeps its traceback there."""
    import accelerate.utils

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(ckpt, "resolve_resume", fail)
    sent: list = []
    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", lambda answer: sent.extend(answer) or answer)
    with pytest.raises(type(error) if isinstance(error, KeyError) else ckpt.CheckpointError) as raised:
        ckpt.agreed_resume(ResumingRank(0), "latest", tmp_path)
    [(kind, message)] = sent
    assert kind == "refused"
    if isinstance(error, OSError):
        assert (
            str(raised.value)
            == message
            == (
                "--resume_from_checkpoint latest: could not be checked "
                "(PermissionError: [Errno 13] Permission denied: 'manifest.json')"
            )
        )
    else:
        assert message == "the main process failed while checking the checkpoint"


def test_verify_names_a_truncated_file_and_both_sizes(tmp_path: Path) -> None:
    final = save_checkpoint(ShardingAccelerator(), tmp_path, TrainerState(completed_steps=3), keep=None)
    truncate(final / "pytorch_model" / "zero_pp_rank_0_mp_rank_00_optim_states.pt", 10)
    assert ckpt.verify(final) == "pytorch_model/zero_pp_rank_0_mp_rank_00_optim_states.pt: 10 bytes, manifest says 1000"


def test_verify_names_a_missing_file_and_counts_the_rest(tmp_path: Path) -> None:
    d = make(tmp_path, "step_00000001")
    (d / "model.safetensors").unlink()
    assert ckpt.verify(d) == "model.safetensors: missing"
    truncate(d / STATE_FILE)
    assert ckpt.verify(d) == "model.safetensors: missing (and 1 more)"


def test_verify_without_manifest_says_incomplete(tmp_path: Path) -> None:
    d = make(tmp_path, "step_00000001")
    (d / MANIFEST).unlink()
    assert ckpt.verify(d) == (
        "no manifest.json: incomplete (written by a run that was killed mid-save, or by an older qa_train?)"
    )
    assert complete_checkpoints(tmp_path) == []


def test_resuming_a_transformers_trainer_checkpoint_says_what_it_is(tmp_path: Path) -> None:
    """transformers' Trainer writes checkpoint-N/ with a trainer_state.json of its own beside config.json: it was
    refused as a qa_train checkpoint "killed mid-save, or by an older qa_train"."""
    d = tmp_path / "hf-run" / "checkpoint-500"
    d.mkdir(parents=True)
    for name, text in (("trainer_state.json", '{"global_step": 500}'), ("config.json", "{}")):
        (d / name).write_text(text)
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.resolve_resume(str(d), tmp_path / "out")
    assert str(err.value).startswith(
        f"--resume_from_checkpoint {d}: a transformers Trainer checkpoint (config.json beside trainer_state.json, "
        "no manifest.json): qa_train resumes only its own; to start from its weights, pass it as "
        "--model_name_or_path; "
    )


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "trainer_state.json: unreadable or invalid (JSONDecodeError: "),
        (
            '{"completed_steps": -1, "epoch": 0, "batches_in_epoch": 0}',
            "trainer_state.json: unreadable or invalid (ValueError: completed_steps is -1, not a count)",
        ),
        (
            '{"completed_steps": 1, "epoch": 0, "batches_in_epoch": 0, "lr": 3}',
            "trainer_state.json: unreadable or invalid (ValueError: unknown keys lr (written by a newer qa_train?))",
        ),
        (
            '{"completed_steps": 1, "epoch": 0, "batches_in_epoch": 0, "world_size": "2"}',
            "trainer_state.json: unreadable or invalid (ValueError: world_size is '2', not a positive integer)",
        ),
    ],
)
def test_verify_rejects_an_invalid_trainer_state(tmp_path: Path, content: str, problem: str) -> None:
    d = make(tmp_path, "step_00000001")
    (d / STATE_FILE).write_text(content)
    write_manifest(d)  # sizes agree: only the content is wrong
    assert ckpt.verify(d).startswith(problem)


def test_verify_rejects_an_invalid_manifest(tmp_path: Path) -> None:
    d = make(tmp_path, "step_00000001")
    (d / MANIFEST).write_text("[1, 2]")
    # The reason is the manifest's, not Python's ('list' object has no attribute 'get').
    assert ckpt.verify(d) == "manifest.json: unreadable or invalid (ValueError: a JSON list, not an object)"


# --- latest falls back, an explicit path refuses ------------------------------------------------


def test_latest_skips_a_truncated_checkpoint_with_a_warning(tmp_path: Path, caplog) -> None:
    good = make(tmp_path, "step_00000002")
    bad = make(tmp_path, "step_00000004")
    truncate(bad / "model.safetensors")
    with caplog.at_level("WARNING", logger="qa_train"):
        assert resolve_resume("latest", tmp_path) == good
    assert [r.getMessage() for r in caplog.records] == [
        f"checkpoint {bad} skipped: model.safetensors: 3 bytes, manifest says 13; resuming from {good} instead"
    ]


def test_latest_with_nothing_usable_starts_fresh_with_a_warning(tmp_path: Path, caplog) -> None:
    bad = make(tmp_path, "step_00000004")
    (bad / MANIFEST).unlink()
    with caplog.at_level("WARNING", logger="qa_train"):
        assert resolve_resume("latest", tmp_path) is None
    message = caplog.records[-1].getMessage()
    assert message.startswith(f"checkpoint {bad} skipped: no manifest.json: incomplete")
    assert message.endswith("no usable checkpoint left: starting from scratch (the damaged ones are kept)")


def test_latest_warns_only_where_asked(tmp_path: Path, caplog) -> None:
    truncate(make(tmp_path, "step_00000004") / "model.safetensors")
    with caplog.at_level("WARNING", logger="qa_train"):
        assert ckpt.latest_usable(checkpoint_root(tmp_path), warn=False) is None
    assert caplog.records == []


def test_an_explicit_damaged_checkpoint_is_refused_naming_the_newest_good(tmp_path: Path) -> None:
    make(tmp_path, "step_00000001")
    good = make(tmp_path, "step_00000002")
    bad = make(tmp_path, "step_00000003")
    truncate(bad / STATE_FILE)
    with pytest.raises(ckpt.CheckpointError) as err:
        resolve_resume(str(bad), tmp_path)
    size = len(json.dumps(asdict(TrainerState(run_id=RUN))))
    assert str(err.value) == (
        f"--resume_from_checkpoint {bad}: {STATE_FILE}: 3 bytes, manifest says {size}; "
        f"the newest good checkpoint there is {good}"
    )


def test_an_explicit_checkpoint_without_manifest_is_refused(tmp_path: Path) -> None:
    old = make_old_format(tmp_path, "step_00000003")
    with pytest.raises(ValueError) as err:
        resolve_resume(str(old), tmp_path)
    assert str(err.value) == (
        f"--resume_from_checkpoint {old}: no manifest.json: incomplete (written by a run that "
        f"was killed mid-save, or by an older qa_train?); there is no good checkpoint in "
        f"{old.parent}"
    )


# --- load errors name the checkpoint ------------------------------------------------------------


class SafetensorError(Exception):
    """Stands in for safetensors' error type (a plain Exception subclass)."""


@pytest.mark.parametrize(
    "error",
    [
        SafetensorError("Error while deserializing header: incomplete metadata, file not fully covered"),
        RuntimeError("PytorchStreamReader failed reading zip archive: failed finding central directory\nmore detail"),
        EOFError("Ran out of input"),
    ],
)
def test_a_load_failure_names_the_checkpoint_the_error_and_the_previous_one(tmp_path: Path, error) -> None:
    previous = make(tmp_path, "step_00000002")
    path = make(tmp_path, "step_00000004")
    make(tmp_path, "step_00000006")  # newer: not a previous one to go back to
    with pytest.raises(ckpt.CheckpointError) as err:
        load_checkpoint(FakeAccelerator(fail_load=error), path)
    first_line = str(error).splitlines()[0]
    assert str(err.value) == (
        f"checkpoint {path} could not be loaded: {type(error).__name__}: {first_line}; if it is "
        f"damaged, resume from the previous complete checkpoint: --resume_from_checkpoint "
        f"{previous}"
    )
    assert err.value.__cause__ is error


def dcp_failure(error: Exception) -> BaseException:
    """What torch.distributed.checkpoint (FSDP's sharded state) raises: a BaseException wrapping each rank's error."""
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException("CheckpointException ranks:dict_keys([0, 1])", {1: (error, None), 0: (error, None)})


def test_a_sharded_checkpoint_that_fails_to_load_is_refused_in_one_line(tmp_path: Path) -> None:
    """FSDP's loader raised CheckpointException, which is not an Exception: it escaped the refusal as exit 1 with
    every rank's traceback. Refused as any other load failure, naming the error behind it."""
    previous = make(tmp_path, "step_00000002")
    path = make(tmp_path, "step_00000004")
    inner = ValueError("Invalid magic number; corrupt file?")
    with pytest.raises(ckpt.CheckpointError) as err:
        load_checkpoint(FakeAccelerator(fail_load=dcp_failure(inner)), path)
    assert str(err.value) == (
        f"checkpoint {path} could not be loaded: ValueError: Invalid magic number; corrupt "
        f"file?; if it is damaged, resume from the previous complete checkpoint: "
        f"--resume_from_checkpoint {previous}"
    )


def test_a_sharded_save_that_fails_is_a_save_failure_and_leaves_no_partial_folder(tmp_path: Path) -> None:
    """FSDP's saver raised CheckpointException past the save agreement: exit 1, and the partial folder (on a
    full disk, the space needed back) stayed."""

    class ShardedSave(FakeAccelerator):
        def save_state(self, output_dir: str) -> None:
            (Path(output_dir) / "__0_0.distcp").write_text("half written")
            raise dcp_failure(OSError(errno.ENOSPC, "No space left on device", output_dir))

    with pytest.raises(CheckpointSaveError, match=r"could not be saved: OSError: \[Errno 28\] No space left"):
        save_checkpoint(ShardedSave(), tmp_path, TrainerState(completed_steps=4), keep=None)
    assert list(checkpoint_root(tmp_path).iterdir()) == []


def test_a_load_failure_without_an_earlier_checkpoint_says_so(tmp_path: Path) -> None:
    path = make(tmp_path, "step_00000004")
    with pytest.raises(ckpt.CheckpointError, match=f"there is no earlier complete checkpoint in {path.parent}$"):
        load_checkpoint(FakeAccelerator(fail_load=RuntimeError("invalid load key, '\\x00'.")), path)


def test_running_out_of_memory_while_loading_is_not_blamed_on_the_checkpoint(tmp_path: Path) -> None:
    class OutOfMemoryError(RuntimeError):
        pass

    path = make(tmp_path, "step_00000004")
    with pytest.raises(OutOfMemoryError):
        load_checkpoint(FakeAccelerator(fail_load=OutOfMemoryError("CUDA out of memory")), path)


def write_rng_file(path: Path) -> None:
    """The dict accelerate's save_accelerator_state writes for one rank."""
    import random

    import numpy as np
    import torch

    states = {
        "step": 0,
        "random_state": random.getstate(),
        "numpy_random_seed": np.random.get_state(),
        "torch_manual_seed": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["torch_cuda_manual_seed"] = torch.cuda.get_rng_state_all()
    torch.save(states, path)


def test_an_unreadable_rng_file_is_a_warning_naming_it(tmp_path: Path, caplog) -> None:
    pytest.importorskip("torch")
    path = make(tmp_path, "step_00000004")
    rng = path / "random_states_0.pkl"
    write_rng_file(rng)
    with caplog.at_level("WARNING", logger="qa_train"):
        load_checkpoint(FakeAccelerator(), path)
    assert caplog.records == []  # a good file is quiet
    truncate(rng, 100)
    with caplog.at_level("WARNING", logger="qa_train"):
        load_checkpoint(FakeAccelerator(), path)
    message = caplog.records[-1].getMessage()
    assert message.startswith(f"{rng}: unreadable (")
    assert message.endswith(
        "this rank goes on with the RNG seeded at start-up, so dropout differs from an "
        "uninterrupted run (the resume is not bit-exact)"
    )


def test_a_missing_rng_file_is_a_warning_naming_it(tmp_path: Path, caplog) -> None:
    path = make(tmp_path, "step_00000004")
    with caplog.at_level("WARNING", logger="qa_train"):
        load_checkpoint(FakeAccelerator(), path)
    assert caplog.records[-1].getMessage().startswith(f"{path / 'random_states_0.pkl'}: missing; ")


class RunsOnLoad:
    """Unpickled, it makes a folder: what any code a checkpoint file carries could do instead."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return os.mkdir, (str(self.path),)


def test_deepspeeds_loader_runs_what_a_checkpoint_file_holds_so_checkpoints_must_be_trusted(tmp_path: Path) -> None:
    """load_checkpoint's docstring says checkpoints must be trusted: DeepSpeed's engine reads its optimizer shards
    with torch.load(weights_only=False), which runs what the file holds. If this stops failing open, the warning
    (and this test) can go; accelerate's own RNG files are read with weights_only and refuse it."""
    import torch
    from accelerate.utils import load
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    shard = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"optimizer_state_dict": RunsOnLoad(tmp_path / "ran")}, shard)
    with pytest.raises(pickle.UnpicklingError):
        load(shard)
    assert not (tmp_path / "ran").exists()
    TorchCheckpointEngine().load(str(shard))
    assert (tmp_path / "ran").is_dir()


# --- run_id, the resume contract fields, older formats (the contract itself: test_train_state.py) -----


def test_an_older_trainer_state_loads(tmp_path: Path) -> None:
    old = make_old_format(tmp_path, "step_00000003")
    state = load_checkpoint(FakeAccelerator(), old)
    assert (state.completed_steps, state.epoch, state.batches_in_epoch) == (3, 1, 2)
    unknown = [*CONTRACT, *DATA_ORDER, "checkpoint_layout", "model_shape", *WRITER, "answering", "eval_data"]
    assert state.contract() == dict.fromkeys(unknown)  # all unknown
    assert len(state.run_id) == 32


def test_save_records_the_run_id_and_contract(tmp_path: Path) -> None:
    state = TrainerState(
        completed_steps=2,
        world_size=2,
        global_batch_size=64,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=4,
        total_steps=100,
    )
    path = save_checkpoint(FakeAccelerator(), tmp_path, state, keep=None)
    assert ckpt.read_state(path) == state
    assert json.loads((path / STATE_FILE).read_text())["run_id"] == state.run_id


def test_a_resumed_run_records_its_own_answering_settings(tmp_path: Path) -> None:
    """The next checkpoints are the resumed run's: consolidated, they answer with its windows, not the checkpoint's."""
    before = {"max_seq_length": 96, "doc_stride": 64, "n_best_size": 20, "max_answer_length": 30}
    now = {**before, "max_seq_length": 128, "n_best_size": 5}
    path = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=2, answering=before), keep=None)
    assert ckpt.read_state(path).answering == before
    resumed = load_checkpoint(FakeAccelerator(), path, TrainerState(answering=now))
    assert resumed.answering == now and resumed.completed_steps == 2


# --- rotation only touches this run's checkpoints ------------------------------------------------


def test_rotation_leaves_other_runs_and_older_formats_alone(tmp_path: Path) -> None:
    foreign = [make(tmp_path, f"step_{s:08d}", run_id="f" * 32) for s in (1, 2)]
    old = make_old_format(tmp_path, "step_00000003")
    for step in (4, 5, 6):
        save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=step, run_id=RUN), keep=1)
    assert names(complete_checkpoints(tmp_path)) == ["step_00000001", "step_00000002", "step_00000006"]
    assert all(p.is_dir() for p in [*foreign, old])


def test_rotation_never_deletes_the_checkpoint_just_written(tmp_path: Path) -> None:
    later = make(tmp_path, "step_00000009")  # this run's abandoned future: resumed from an earlier one
    make(tmp_path, "step_00000003")
    save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=5, run_id=RUN), keep=2)
    assert names(complete_checkpoints(tmp_path)) == ["step_00000005", "step_00000009"]
    assert later.is_dir()


def test_a_rotation_that_fails_leaves_the_new_checkpoint_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Removing an old checkpoint can fail (a permission, a busy file system) after the new one is complete:
    that is a warning, not a failed save."""
    save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=1, run_id=RUN), keep=1)

    def refuse(path: Path) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr("qa_train.strategy.saving.delete_folder", refuse)
    final = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=2, run_id=RUN), keep=1)
    assert ckpt.verify(final) is None
    assert names(complete_checkpoints(tmp_path)) == ["step_00000001", "step_00000002"]
    assert "older checkpoints could not all be removed" in caplog.text


def test_rotation_keeps_damaged_checkpoints_and_does_not_count_them(tmp_path: Path) -> None:
    damaged = make(tmp_path, "step_00000002")
    truncate(damaged / "model.safetensors")
    make(tmp_path, "step_00000001")
    save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=3, run_id=RUN), keep=2)
    assert names(complete_checkpoints(tmp_path)) == ["step_00000001", "step_00000002", "step_00000003"]


def test_saving_over_another_runs_step_moves_it_aside(tmp_path: Path, caplog) -> None:
    foreign = make(tmp_path, "step_00000005", run_id="f" * 32)
    with caplog.at_level("WARNING", logger="qa_train"):
        final = save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=5, run_id=RUN), keep=1)
    aside = foreign.with_name("step_00000005.run-ffffffff")
    assert (aside / "model.safetensors").read_text() == "step_00000005"
    assert ckpt.read_state(final).run_id == RUN
    assert caplog.records[-1].getMessage() == (
        f"{final} belonged to another run ({'f' * 32}): moved to {aside}, not deleted"
    )


def test_a_delete_leaves_no_half_deleted_step_folder(tmp_path: Path, monkeypatch) -> None:
    make(tmp_path, "step_00000001")
    seen: list[list[str]] = []
    monkeypatch.setattr(
        shutil,
        "rmtree",
        lambda p, ignore_errors=False: seen.append(sorted(p.name for p in checkpoint_root(tmp_path).glob("step_*"))),
    )
    save_checkpoint(FakeAccelerator(), tmp_path, TrainerState(completed_steps=2, run_id=RUN), keep=1)
    assert seen[-1] == ["step_00000002"]  # step_1 was renamed away before its files went: a kill leaves no half


def test_a_checkpoint_carries_the_best_evaluation_and_the_owed_one(tmp_path: Path) -> None:
    state = contract(best_eval={"step": 25, "exact_match": 4.0, "f1": 7.21}, eval_owed=True)
    path = save_checkpoint(FakeAccelerator(), tmp_path, state, keep=None)
    assert ckpt.read_state(path) == state
    with pytest.raises(ValueError, match="best_eval is 3"):
        state_from_json(json.dumps({**json.loads((path / STATE_FILE).read_text()), "best_eval": 3}))


def test_resuming_an_earlier_checkpoint_sets_the_later_ones_aside(tmp_path: Path) -> None:
    """Left in place, step 30 of the abandoned continuation would be `latest` after the resumed run's step 15."""
    paths = [
        save_checkpoint(FakeAccelerator(), tmp_path, contract(completed_steps=s, run_id=RUN), keep=None)
        for s in (10, 20, 30)
    ]
    moved = ckpt.set_aside_later(paths[0], tmp_path)
    assert [m.name for m in moved] == ["step_00000020.abandoned", "step_00000030.abandoned"]
    assert all(ckpt.verify(m) is None for m in moved), "set aside whole, not deleted"
    save_checkpoint(FakeAccelerator(), tmp_path, contract(completed_steps=15, run_id=RUN), keep=2)
    assert names(complete_checkpoints(tmp_path)) == ["step_00000010", "step_00000015"]
    assert resolve_resume("latest", tmp_path).name == "step_00000015"
    assert ckpt.set_aside_later(tmp_path / "elsewhere" / "step_00000001", tmp_path) == []


def test_resuming_sets_a_damaged_later_checkpoint_aside_too(tmp_path: Path) -> None:
    """A later checkpoint that no longer verifies is still the abandoned continuation's, of this run: left as
    step_N, the resumed run's own save of step N replaced it (found by resuming a real run past a truncated one)."""
    paths = [
        save_checkpoint(FakeAccelerator(), tmp_path, contract(completed_steps=s, run_id=RUN), keep=None)
        for s in (2, 4, 6)
    ]
    truncate(paths[2] / "model.safetensors")
    moved = ckpt.set_aside_later(paths[0], tmp_path)
    assert [m.name for m in moved] == ["step_00000004.abandoned", "step_00000006.abandoned"]
    save_checkpoint(FakeAccelerator(), tmp_path, contract(completed_steps=6, run_id=RUN), keep=None)
    assert (tmp_path / "checkpoints" / "step_00000006.abandoned" / "model.safetensors").stat().st_size == 3


def test_setting_aside_again_never_replaces_what_was_set_aside(tmp_path: Path) -> None:
    """A second resume from the same step abandons a second continuation: the first, set aside as
    step_N.abandoned with whatever was put in it, was deleted to make room for it."""
    paths = [
        save_checkpoint(FakeAccelerator(), tmp_path, contract(completed_steps=s, run_id=RUN), keep=None) for s in (2, 4)
    ]
    [first] = ckpt.set_aside_later(paths[0], tmp_path)
    (first / "MARK").write_text("a user's note")
    save_checkpoint(FakeAccelerator(), tmp_path, contract(completed_steps=4, run_id=RUN), keep=None)
    [second] = ckpt.set_aside_later(paths[0], tmp_path)
    assert (first.name, second.name) == ("step_00000004.abandoned", "step_00000004.abandoned-2")
    assert (first / "MARK").read_text() == "a user's note" and ckpt.verify(second) is None


def test_a_checkpoint_is_never_writable_by_others_whatever_the_umask(tmp_path: Path) -> None:
    """Under umask 000 a run wrote its checkpoints world-writable, and its own resume then refused them as
    possibly planted (they are unpickled)."""
    old = os.umask(0)
    try:
        path = save_checkpoint(FakeAccelerator(), tmp_path, contract(run_id=RUN), keep=None)
    finally:
        os.umask(old)
    modes = {p.relative_to(path).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in (path, *path.rglob("*"))}
    assert modes == {".": 0o775, "model.safetensors": 0o664, "manifest.json": 0o664, STATE_FILE: 0o664}
    assert ckpt.untrusted(path) is None and resolve_resume("latest", tmp_path) == path


def test_load_refuses_a_broken_contract_before_loading_anything(tmp_path: Path) -> None:
    path = save_checkpoint(FakeAccelerator(), tmp_path, contract(), keep=None)
    acc = FakeAccelerator()
    with pytest.raises(ckpt.CheckpointError) as err:
        load_checkpoint(acc, path, contract(world_size=4, global_batch_size=128, run_id="new"))
    assert str(err.value).startswith(
        f"--resume_from_checkpoint {path}: cannot continue it: its global batch is 64, this run's is 128: "
    )
    assert "--allow_global_batch_change" in str(err.value)
    assert acc.loaded == []


def test_load_adopts_this_runs_contract_and_keeps_the_run_id(tmp_path: Path, caplog) -> None:
    saved = contract()
    path = save_checkpoint(FakeAccelerator(), tmp_path, saved, keep=None)
    now = contract(completed_steps=0, epoch=0, total_steps=150)
    with caplog.at_level("WARNING", logger="qa_train"):
        state = load_checkpoint(FakeAccelerator(), path, now)
    assert (state.completed_steps, state.epoch, state.run_id, state.total_steps) == (40, 1, saved.run_id, 150)
    assert f"resuming from {path}: total steps 100 -> 150: " in caplog.text


class LoadingRank(FakeAccelerator):
    """One rank of a two-process resume; the other rank's load_state (its own ZeRO optimizer shard) fails or not."""

    num_processes = 2

    def __init__(self, index: int, fail_load: Exception | None = None, other_fails: bool = False) -> None:
        super().__init__(fail_load=fail_load)
        self.process_index, self.is_main_process, self.other_fails = index, index == 0, other_fails

    def reduce(self, tensor, reduction: str):
        total = tensor.clone()
        total[1 - self.process_index] += float(self.other_fails)  # what the other rank sends
        return total


@pytest.mark.parametrize("rank", [0, 1])
def test_a_load_failure_on_one_rank_stops_every_rank_and_that_rank_says_why(
    tmp_path: Path, rank: int, monkeypatch, capsys
) -> None:
    """Found by a rank-discipline hunt: a ZeRO-2 resume whose rank-1 optimizer shard was damaged (same size, so the
    manifest passed) failed on rank 1 alone; rank 0 trained on into the next collective and died on "connection
    closed by peer", and the reason was never said (only rank 0 speaks). Now every rank refuses the checkpoint and
    the failing one says why."""
    from conftest import tiny_flags

    from qa_train import __main__ as entry
    from qa_train import run as run_module

    path = make(tmp_path, "step_00000004")
    with pytest.raises(ckpt.CheckpointError) as err:
        load_checkpoint(LoadingRank(0, other_fails=True), path)
    assert err.value.reporter == 1 and str(err.value) == f"checkpoint {path} could not be loaded: rank 1 failed"
    with pytest.raises(ckpt.CheckpointError) as own:
        load_checkpoint(LoadingRank(1, fail_load=RuntimeError("invalid load key, '\\x00'.")), path)
    assert own.value.reporter == 1
    assert str(own.value).startswith(f"checkpoint {path} could not be loaded: rank 1: RuntimeError: invalid load key")

    def fail(args, splits=None) -> None:
        raise own.value if rank == 1 else err.value

    monkeypatch.setattr(run_module, "run", fail)
    for name, value in {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}.items():  # as launched
        monkeypatch.setenv(name, value)
    assert entry.main(tiny_flags(tmp_path / "out", "--no_eval")) == 2
    said = capsys.readouterr().err.splitlines()
    assert said == ([f"qa_train: error: {own.value}"] if rank == 1 else [])


# --- checkpoints of a newer qa_train, and which ones must be converted ----------------------------------------


def test_a_newer_qa_trains_checkpoint_is_refused_by_name_not_skipped(tmp_path: Path) -> None:
    """Its unknown keys used to read as damage: `latest` skipped it for an older checkpoint of the run, whose
    continuation would then overwrite the newer run's progress."""
    make(tmp_path, "step_00000002")
    newer = make(tmp_path, "step_00000004")
    higher = CHECKPOINT_FORMAT + 1
    state = {**json.loads((newer / STATE_FILE).read_text()), "checkpoint_format": higher, "qa_train_version": "9.0"}
    (newer / STATE_FILE).write_text(json.dumps({**state, "shard_plan": "x"}))
    write_manifest(newer)
    said = (
        f"written by a newer qa_train (9.0, checkpoint format {higher}; this one reads format {CHECKPOINT_FORMAT} and "
        "older): upgrade qa_train"
    )
    assert ckpt.verify(newer) == f"{STATE_FILE}: {said} to resume it"
    with pytest.raises(ckpt.CheckpointError) as err:
        resolve_resume("latest", tmp_path)
    assert str(err.value) == f"--resume_from_checkpoint latest: {newer / STATE_FILE}: {said} to resume it"
    with pytest.raises(ckpt.CheckpointError) as explicit:
        resolve_resume(str(newer), tmp_path)
    assert said in str(explicit.value)


@pytest.mark.parametrize(
    ("saved", "now", "reason"),
    [
        (
            "model.safetensors and optimizer.bin",
            "DeepSpeed ZeRO-3 files",
            "saved as model.safetensors and optimizer.bin",
        ),
        ("FSDP sharded_state_dict files", "model.safetensors and optimizer.bin", "saved as FSDP sharded_state_dict"),
        (
            "DeepSpeed ZeRO-2 files",
            "DeepSpeed ZeRO-2 files",
            "DeepSpeed partitions its optimizer state per process, 2 -> 1",
        ),
        ("model.safetensors and optimizer.bin", "model.safetensors and optimizer.bin", None),  # whole tensors
        ("FSDP sharded_state_dict files", "FSDP sharded_state_dict files", None),  # DCP reshards itself
        (None, "DeepSpeed ZeRO-2 files", None),  # before the field: left to the library, as before
    ],
)
def test_a_checkpoint_is_converted_only_where_its_library_cannot_load_it(saved, now, reason) -> None:
    was = contract(checkpoint_layout=saved)
    reason_now = ckpt.conversion_reason(
        was, contract(world_size=1, gradient_accumulation_steps=8, checkpoint_layout=now)
    )
    assert (reason_now is None) if reason is None else reason_now.startswith(reason)
    assert ckpt.conversion_reason(was, contract(checkpoint_layout=saved)) is None, "the same layout and world"


def test_peek_reads_the_likely_checkpoint_without_a_word(tmp_path: Path, caplog) -> None:
    """Before any process group: what a requeued job's accumulation is refitted from."""
    good = make(tmp_path, "step_00000002")
    truncate(make(tmp_path, "step_00000004") / "model.safetensors")
    with caplog.at_level("WARNING", logger="qa_train"):
        assert ckpt.peek("latest", tmp_path)[0] == good
        assert ckpt.peek(str(tmp_path / "checkpoints" / "step_00000004"), tmp_path) is None
        assert ckpt.peek(None, tmp_path) is None and ckpt.peek("latest", tmp_path / "none") is None
    assert caplog.text == ""
