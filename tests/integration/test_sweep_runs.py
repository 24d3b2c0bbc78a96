"""A bench run past its timeout is killed with every rank, in their sessions of their own."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from qa_train.studies import bench

# The launcher stand-in: like qa_train.strategy.launch, it starts its launch in a session of its own, and that launch (a
# rank here) runs on when asked to stop, as a rank does until its next logged step.
LAUNCHER_WITH_A_RANK = """
import subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                         "time.sleep(120)"], start_new_session=True)
open(sys.argv[1], "w").write(str(rank.pid))
time.sleep(120)
"""


def test_a_run_past_its_timeout_is_killed_with_every_rank(tmp_path: Path) -> None:
    """The ranks run in sessions of their own: killing the launcher's group alone left them training on after
    the bench had moved to its next run."""
    import psutil

    pid_file = tmp_path / "rank.pid"
    with (tmp_path / "launch.log").open("w") as log:
        code = bench._run_logged(
            [sys.executable, "-c", LAUNCHER_WITH_A_RANK, str(pid_file)], dict(os.environ), log, timeout_s=3
        )
    assert code == 124
    rank = psutil.Process(int(pid_file.read_text()))
    try:
        rank.wait(timeout=10)
    except psutil.TimeoutExpired:
        rank.kill()
        pytest.fail("the run's rank outlived the bench's timeout")
