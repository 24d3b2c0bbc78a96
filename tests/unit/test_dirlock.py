"""One run per output dir: the lock a run's first process holds, refused in one line naming the holder, released on
exit, and taken over where its holder is provably gone (a dead pid here, an earlier incarnation of a SLURM job)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, base_env, tiny_flags

from qa_train.__main__ import main
from qa_train.config.dirlock import LOCK_FILE, hold
from qa_train.config.settings import ConfigError


def test_a_second_hold_is_refused_naming_the_holder_and_released_after(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = hold(out)
    with pytest.raises(ConfigError) as refused:
        hold(out)
    line = str(refused.value)
    assert line.startswith(f"--output_dir {out}: in use by another qa_train run (pid {os.getpid()} on ")
    assert socket.gethostname() in line and line.endswith("wait for it to end, or choose another --output_dir")
    first.release()
    assert not (out / LOCK_FILE).exists(), "a clean end leaves no record"
    hold(out).release()


def test_a_second_run_into_a_held_folder_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Two runs into one folder wrote a checkpoint mixing both runs' files and interleaved their step logs."""
    out = tmp_path / "out"
    with hold(out):
        started = time.perf_counter()
        assert main(tiny_flags(out, "--max_train_steps", "1")) == 2
        assert time.perf_counter() - started < 5  # before any data, model or library import
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"qa_train: error: --output_dir {out}: in use by another qa_train run")
    assert f"pid {os.getpid()} " in err[0]
    assert not list(out.iterdir()), "the refused run wrote nothing, and the released lock is gone"


def _held_by(out: Path, **record: object) -> int:
    """A lock held (by a descriptor of this process, as one a forked child inherited) under someone's record."""
    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.time() - 60, **record}
    os.write(fd, json.dumps(holder).encode())
    return fd


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_a_lock_whose_holder_died_here_is_taken_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    dead = _dead_pid()
    stale = _held_by(out, pid=dead)
    with caplog.at_level(logging.WARNING, logger="qa_train"):
        taken = hold(out)
    assert f"taking over the lock of pid {dead} on {socket.gethostname()}" in caplog.text
    assert f"pid {dead} no longer runs" in caplog.text
    assert json.loads((out / LOCK_FILE).read_text())["pid"] == os.getpid()
    with pytest.raises(ConfigError, match=f"in use by another qa_train run \\(pid {os.getpid()} "):
        hold(out)  # the new lock is held: the stale one no longer counts
    taken.release()
    os.close(stale)


def test_a_requeued_slurm_job_takes_over_its_earlier_incarnations_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node that ran restart 0 is gone, and NFS keeps its lock until the lease expires."""
    out = tmp_path / "out"
    other = {"host": "node-that-died", "pid": 4242, "job": "777", "restart": 0}
    stale = _held_by(out, **other)
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    hold(out).release()
    monkeypatch.setenv("SLURM_JOB_ID", "778")  # another job: the holder may well still run there
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    stale_again = _held_by(out, **other)
    with pytest.raises(
        ConfigError, match=r"in use by another qa_train run \(pid 4242 on node-that-died, SLURM job 777"
    ):
        hold(out)
    os.close(stale)
    os.close(stale_again)


def test_a_record_left_by_a_killed_run_on_another_host_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No lock held, but a record: its run ended without releasing (killed, or its node lost), or the file system
    keeps locks per host; either way the run takes the folder and says whose record it found."""
    out = tmp_path / "out"
    os.close(_held_by(out, host="elsewhere", pid=99))  # closing the descriptor releases the flock, not the record
    with caplog.at_level(logging.WARNING, logger="qa_train"):
        hold(out).release()
    assert "the run that held it (pid 99 on elsewhere" in caplog.text


@pytest.mark.parametrize("case", ["taken_over", "left_behind"])
def test_the_lock_s_warnings_are_lines_of_the_run_s_log(case: str, tmp_path: Path) -> None:
    """They printed bare (`--output_dir ...: taking over the lock of ...`) where every other line of a run reads
    `HH:MM:SS LEVEL qa_train: ...`: the lock is taken before the trainer sets up logging. A real `python -m qa_train`,
    refused on its data right after the lock, before torch is imported."""
    out = tmp_path / "out"
    if case == "taken_over":
        stale = _held_by(out, pid=_dead_pid())
        said = f"--output_dir {out}: taking over the lock of pid "
    else:
        stale = None
        os.close(_held_by(out, host="elsewhere", pid=99))
        said = f"{LOCK_FILE}: the run that held it (pid 99 on elsewhere, "
    bad = tmp_path / "train.json"
    bad.write_text("not JSON")
    flags = tiny_flags(out, "--no_eval")
    flags[flags.index("--train_file") + 1] = str(bad)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "qa_train", *flags],
            cwd=ROOT,
            env=base_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        if stale is not None:
            os.close(stale)
    assert proc.returncode == 2, proc.stderr
    warning, refusal = proc.stderr.splitlines()
    assert re.fullmatch(rf"\d\d:\d\d:\d\d WARNING qa_train: {re.escape(said)}.+", warning), warning
    assert refusal.startswith(f"qa_train: error: {bad}"), refusal
