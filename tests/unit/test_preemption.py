"""Stop requests by file: a PREEMPT file counts only if written since the run's process started."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import pytest

from qa_train.core import preemption
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


def test_a_preempt_file_that_cannot_be_checked_is_said_once_not_raised(
    stop: StopRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Only FileNotFoundError was caught: a stale NFS handle while polling at a logging step ended the run in a
    traceback."""
    import errno

    real_stat = Path.stat

    def stale(path: Path, *args, **kwargs):
        if path.name == PREEMPT_FILE:
            raise OSError(errno.ESTALE, "Stale file handle", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(Path, "stat", stale)
    with caplog.at_level(logging.WARNING, logger="qa_train"):
        assert not stop.requested() and not stop.requested()
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / PREEMPT_FILE} cannot be checked ([Errno {errno.ESTALE}] Stale file handle: "
        f"'{tmp_path / PREEMPT_FILE}'): stop requests by file go unseen while it fails"
    ]


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


@pytest.fixture
def handlers(monkeypatch: pytest.MonkeyPatch):
    """The test process's handlers of every stop signal and Ctrl-C, put back after; no early request left over."""
    monkeypatch.setattr(preemption, "_early_request", False)
    before = {sig: signal.getsignal(sig) for sig in (*STOP_SIGNALS, signal.SIGINT)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


def test_ctrl_c_is_a_stop_request_and_a_second_one_ends_the_run_at_once(
    handlers: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C in `python -m qa_train` raised KeyboardInterrupt wherever the run was: a traceback, no checkpoint,
    exit 130. Now it asks for the checkpoint, as SIGTERM does, during start-up as in training; the second one
    is Ctrl-C's default again, for one who will not wait."""
    preemption.catch_early_stop_signals()
    assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler, "Ctrl-C would raise KeyboardInterrupt"
    os.kill(os.getpid(), signal.SIGINT)
    assert preemption._early_request
    assert signal.getsignal(signal.SIGINT) is signal.SIG_DFL
    assert "qa_train: Ctrl-C: stopping with a checkpoint at the next logged step" in capfd.readouterr().err
    preemption._early_request = False  # a new process, Ctrl-C pressed once the training has begun
    signal.signal(signal.SIGINT, signal.default_int_handler)
    preemption.catch_early_stop_signals()
    stop = StopRequest(tmp_path)
    assert not stop.requested() and signal.getsignal(signal.SIGINT) == stop._handle
    os.kill(os.getpid(), signal.SIGINT)
    assert stop.requested() and signal.getsignal(signal.SIGINT) is signal.SIG_DFL


def test_ctrl_c_is_left_alone_where_ignored_or_run_is_called_by_a_program(handlers: None, tmp_path: Path) -> None:
    """A run started in the background by a shell ignores SIGINT (nohup, `&`) and must go on doing so; a program
    that calls run() itself (tests, a notebook) keeps its KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preemption.catch_early_stop_signals()
    StopRequest(tmp_path)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    signal.signal(signal.SIGINT, signal.default_int_handler)
    StopRequest(tmp_path)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
