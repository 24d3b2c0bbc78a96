"""A full disk while a checkpoint is saved, in real runs: one line, exit 5, no partial folder, every earlier
checkpoint intact, and the run resumes from it.

The runs inject the failure with a sitecustomize.py on PYTHONPATH, which Python imports in every
process it starts (the launched ranks too): the chosen rank's N-th `Accelerator.save_state` writes its files,
then raises ENOSPC, as a disk that fills mid-save does. One run uses a real write failure instead (a file-size
limit), which torch and safetensors report in their own error types, not as OSError."""

from __future__ import annotations

import json
import os
import resource
import subprocess
from pathlib import Path

from conftest import PY, ROOT, cpu_launch, error_lines, port, run_cmd, run_ok, tiny_flags

from qa_train.config.outputdir import STEP_FOLDER
from qa_train.strategy import checkpoint

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
    return sorted(p.name for p in (out / "checkpoints").iterdir() if not STEP_FOLDER.match(p.name))


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
    assert line.endswith("then rerun with --overwrite_output_dir (no checkpoint was saved)")
    assert leftovers(out) == [] and checkpoint.complete_checkpoints(out) == []


def test_when_only_rank_1_cannot_save_both_ranks_stop_and_rank_1_says_why(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    cmd = [
        *cpu_launch("ddp", port(29710)),
        *tiny_flags(out, "--no_eval", "--max_train_steps", "2", "--checkpointing_steps", "1"),
    ]
    proc = run_cmd(cmd, with_full_disk(env, tmp_path, rank=1, nth=2), timeout=300)  # a hang fails here
    assert proc.returncode == 5, proc.stderr[-3000:]
    [line] = [x for x in proc.stderr.splitlines() if "qa_train: error:" in x]  # the launcher prefixes rank output
    assert "rank 1: OSError: [Errno 28] No space left on device" in line
    assert f"{out / 'checkpoints' / 'step_00000001'}, is intact" in line
    assert leftovers(out) == [] and checkpoint.verify(out / "checkpoints" / "step_00000001") is None
