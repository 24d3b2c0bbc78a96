"""Stop requests by file: a PREEMPT file counts only if written since the run's process started."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest

from qa_train.core.preemption import PREEMPT_FILE, RUN_STARTED_ENV, STOP_SIGNALS, StopRequest


@pytest.fixture
def stop(tmp_path: Path):
    """A StopRequest on tmp_path, the test process's own signal handlers put back after."""
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield StopRequest(tmp_path)
    for sig, handler in before.items():
        signal.signal(sig, handler)


def test_a_stale_preempt_file_is_ignored_with_its_age(
    stop: StopRequest, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A PREEMPT file left by an earlier run stopped a brand-new run at step 1 (issue 38, case 12)."""
    file = tmp_path / PREEMPT_FILE
    file.touch()
    old = stop.started - 3 * 3600 - 120
    os.utime(file, (old, old))
    with caplog.at_level(logging.WARNING, logger="qa_train"):
        assert not stop.requested() and not stop.requested()
    assert [r.getMessage() for r in caplog.records] == [
        f"{file} was written 3 h 2 min before this run started: a stop request to an earlier run, ignored "
        "(remove it; touch it again to stop this run)"
    ], "said once, not at every step"
    assert file.exists(), "the user's file is left for them"


def test_a_preempt_file_written_during_the_run_or_its_start_up_stops_it(stop: StopRequest, tmp_path: Path) -> None:
    assert not stop.requested()
    (tmp_path / PREEMPT_FILE).touch()
    assert stop.requested()
    # Touched again after a stale one was ignored: a request to this run.
    old = stop.started - 600
    os.utime(tmp_path / PREEMPT_FILE, (old, old))
    assert not stop.requested()
    os.utime(tmp_path / PREEMPT_FILE, (time.time(), time.time()))
    assert stop.requested()


def test_a_request_written_while_the_launch_started_its_ranks_is_theirs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slurm/train.sbatch writes PREEMPT for a warning that came before the launch, seconds before the ranks exist:
    the launch's start (which it and qa-train launch give the ranks) is the run's."""
    file = tmp_path / PREEMPT_FILE
    file.touch()
    before_launch = time.time() - 3600
    os.utime(file, (before_launch + 60, before_launch + 60))
    monkeypatch.setenv(RUN_STARTED_ENV, str(before_launch))
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        assert StopRequest(tmp_path).requested()
        monkeypatch.setenv(RUN_STARTED_ENV, str(before_launch + 3600))
        assert not StopRequest(tmp_path).requested()
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_preempt_folder_stops_the_run_and_is_cleared_without_a_traceback(
    stop: StopRequest, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`mkdir PREEMPT` stopped the run, and the IsADirectoryError of clearing it then, after the checkpoint was
    written, ended the run in a traceback (exit 1) instead of 75."""
    (tmp_path / PREEMPT_FILE).mkdir()
    assert stop.requested()
    stop.clear(is_main=True)
    assert not (tmp_path / PREEMPT_FILE).exists()
    (tmp_path / PREEMPT_FILE).mkdir()
    (tmp_path / PREEMPT_FILE / "note").touch()  # not ours to delete: said, and left
    with caplog.at_level(logging.WARNING, logger="qa_train"):
        stop.clear(is_main=True)
    assert (tmp_path / PREEMPT_FILE / "note").exists()
    assert "the stop request could not be removed" in caplog.text
