"""A full disk while a checkpoint is saved: one line, exit 5, no partial folder, every earlier checkpoint intact.

The end-to-end runs inject the failure with a sitecustomize.py on PYTHONPATH, which Python imports in every
process it starts (the launched ranks too): the chosen rank's N-th `Accelerator.save_state` writes its files,
then raises ENOSPC, as a disk that fills mid-save does. One run uses a real write failure instead (a file-size
limit), which torch and safetensors report in their own error types, not as OSError.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import PY, ROOT, error_lines, port, run_cmd, run_ok, tiny_flags

from qa_train.strategy import checkpoint, saving
from qa_train.strategy.train_state import TrainerState

FULL_DISK_ENV = "QA_TRAIN_TEST_FULL_DISK"  # "RANK:N": that rank's N-th save_state fails
INJECT = f'''
import errno, os
_spec = os.environ.get("{FULL_DISK_ENV}")
if _spec and os.environ.get("RANK", "0") == _spec.split(":")[0]:
    import accelerate
    _real, _calls = accelerate.Accelerator.save_state, []
    def _save_state(self, output_dir=None, **kwargs):
        _calls.append(output_dir)
        result = _real(self, output_dir, **kwargs)  # a disk fills mid-save: the files so far are written
        if len(_calls) == int(_spec.split(":")[1]):
            raise OSError(errno.ENOSPC, "No space left on device", output_dir)
        return result
    accelerate.Accelerator.save_state = _save_state
'''


def with_full_disk(env: dict[str, str], tmp_path: Path, rank: int, nth: int) -> dict[str, str]:
    inject = tmp_path / "inject"
    inject.mkdir(exist_ok=True)
    (inject / "sitecustomize.py").write_text(INJECT)
    path = os.pathsep.join(p for p in (str(inject), env.get("PYTHONPATH")) if p)
    return {**env, "PYTHONPATH": path, FULL_DISK_ENV: f"{rank}:{nth}"}


def qa_train(out: Path, *extra: str) -> list[str]:
    return [PY, "-m", "qa_train", *tiny_flags(out, "--no_eval", "--logging_steps", "1", *extra)]


def steps_in(out: Path) -> list[int]:
    lines = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return [line["step"] for line in lines if "train/loss" in line]


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir() if not checkpoint.STEP_DIR.match(p.name))


@pytest.mark.distributed  # real runs of the entry point
def test_a_full_disk_at_the_second_checkpoint_exits_5_and_the_first_resumes(
    tmp_path: Path, env: dict[str, str]
) -> None:
    out = tmp_path / "out"
    cmd = qa_train(out, "--max_train_steps", "3", "--checkpointing_steps", "1")
    proc = run_cmd(cmd, with_full_disk(env, tmp_path, rank=0, nth=2))
    assert proc.returncode == 5, proc.stderr[-3000:]
    [line] = error_lines(proc.stderr)
    first, second = out / "checkpoints" / "step_00000001", out / "checkpoints" / "step_00000002"
    assert f"checkpoint {second} could not be saved" in line and "No space left on device" in line
    assert f"{first}, is intact" in line and "--resume_from_checkpoint latest" in line
    assert checkpoint.verify(first) is None and not second.exists()
    assert leftovers(out) == []  # the partial .tmp-step_00000002 is gone, and its space with it
    assert steps_in(out) == [1, 2]

    run_ok([*cmd, "--resume_from_checkpoint", "latest"], env)
    assert steps_in(out) == [1, 2, 3]
    assert checkpoint.verify(out / "checkpoints" / "step_00000003") is None and (out / "final").is_dir()


@pytest.mark.distributed
def test_a_real_write_failure_in_the_first_checkpoint_is_one_line_too(tmp_path: Path, env: dict[str, str]) -> None:
    """A file-size limit stands in for a full disk (Python ignores SIGXFSZ): the feature cache fits, the tiny
    model's 3.7 MB of weights do not, and safetensors reports EFBIG as its own SafetensorError."""
    out = tmp_path / "out"
    limit = 2_000_000
    proc = subprocess.run(
        qa_train(out, "--max_train_steps", "2", "--checkpointing_steps", "1"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )
    assert proc.returncode == 5, proc.stderr[-3000:]
    [line] = error_lines(proc.stderr)
    assert f"checkpoint {out / 'checkpoints' / 'step_00000001'} could not be saved" in line
    assert "File too large" in line and "no earlier complete checkpoint exists" in line
    assert leftovers(out) == [] and checkpoint.complete_checkpoints(out) == []


@pytest.mark.distributed
def test_when_only_rank_1_cannot_save_both_ranks_stop_and_rank_1_says_why(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    cmd = [
        PY,
        "-m",
        "qa_train.cli",
        "launch",
        "--cpu",
        "--config_file",
        "accelerate_configs/ddp.yaml",
        "--num_processes",
        "2",
        "--main_process_port",
        str(port(29710)),
        "--",
        *tiny_flags(out, "--no_eval", "--max_train_steps", "2", "--checkpointing_steps", "1"),
    ]
    proc = run_cmd(cmd, with_full_disk(env, tmp_path, rank=1, nth=2), timeout=300)  # a hang fails here
    assert proc.returncode == 5, proc.stderr[-3000:]
    [line] = [x for x in proc.stderr.splitlines() if "qa_train: error:" in x]  # the launcher prefixes rank output
    assert "rank 1: OSError: [Errno 28] No space left on device" in line
    assert f"{out / 'checkpoints' / 'step_00000001'}, is intact" in line
    assert leftovers(out) == [] and checkpoint.verify(out / "checkpoints" / "step_00000001") is None


# --- without training: the agreement between ranks, and the exit codes -------------------------------


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
    assert list(checkpoint.checkpoint_root(tmp_path).iterdir()) == []


def main_raising(monkeypatch, tmp_path: Path, error: Exception, rank: int = 0) -> int:
    """`python -m qa_train`'s main with run() replaced by one that raises `error`."""
    from qa_train import __main__ as entry
    from qa_train import run as run_module

    def fail(args) -> None:
        raise error

    monkeypatch.setattr(run_module, "run", fail)
    monkeypatch.setenv("RANK", str(rank))
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
