"""Two real runs into one output dir: the second is refused at once while the first lives, and a run killed with
SIGKILL leaves no lock behind (issue 38, case 1)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

from conftest import PY, ROOT, error_lines, run_cmd, run_ok, tiny_flags


def _steps_in(out: Path) -> list[int]:
    lines = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return [line["step"] for line in lines if "train/loss" in line]


def test_a_second_start_is_refused_and_a_killed_run_leaves_the_folder_free(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "out"
    flags = tiny_flags(out, "--max_train_steps", "3", "--checkpointing_steps", "1", "--logging_steps", "1", "--no_eval")
    first = subprocess.Popen(
        [PY, "-m", "qa_train", *flags],
        cwd=ROOT,
        env={**env, "QA_TRAIN_TEST_HOLD_AT_STEP": "2"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while not (out / "HOLDING-rank0").exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first run never reached step 2"
            time.sleep(0.05)
        started = time.monotonic()
        second = run_cmd([PY, "-m", "qa_train", *flags, "--seed", "7", "--overwrite_output_dir"], env)
        assert second.returncode == 2 and time.monotonic() - started < 20
        (line,) = error_lines(second.stderr)
        assert line.startswith(f"qa_train: error: --output_dir {out}: in use by another qa_train run (pid {first.pid} ")
        assert (out / "checkpoints" / "step_00000001").is_dir(), "the refused run removed nothing"
        first.send_signal(signal.SIGKILL)  # no chance to release anything: the kernel drops the lock
        first.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
    run_ok([PY, "-m", "qa_train", *flags, "--resume_from_checkpoint", "latest"], env)
    assert _steps_in(out) == [1, 2, 3]
