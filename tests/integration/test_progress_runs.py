"""Progress in real runs: plain lines when stderr is a file, tqdm bars redrawn in place on a pseudo-terminal."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import PY, ROOT, tiny_flags


def test_a_run_logged_to_a_file_shows_train_and_eval_progress(tmp_path: Path, env: dict[str, str]) -> None:
    proc = subprocess.run(
        [
            PY,
            "-m",
            "qa_train",
            *tiny_flags(
                tmp_path / "out", "--max_train_steps", "6", "--logging_steps", "3", "--progress_interval_s", "0"
            ),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    train = re.findall(r"train (\d)/6 steps \(\d+%\), [\d.]+ samples/s(.*?), elapsed", proc.stderr)
    assert [int(step) for step, _ in train] == [1, 2, 3, 4, 5, 6]
    assert ", loss" in train[3][1] and ", lr" in train[3][1]  # known from the first logged step on
    assert re.search(r"eval (\d+)/\1 batches \(100%\)", proc.stderr)
    assert "\r" not in proc.stderr


@pytest.mark.parametrize("columns", [160, 0])
def test_a_run_on_a_terminal_draws_train_and_eval_bars(tmp_path: Path, env: dict[str, str], columns: int) -> None:
    """stderr a real pseudo-terminal, as in `make demo`: tqdm bars redrawn in place, no log lines; also on a
    terminal that reports no width (tqdm alone drew empty bars there)."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(
        [PY, "-m", "qa_train", *tiny_flags(tmp_path / "out", "--max_train_steps", "6", "--logging_steps", "3")],
        cwd=ROOT,
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    screen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closes when the process exits
            break
        if not chunk:
            break
        screen += chunk
    os.close(leader)
    assert proc.wait(timeout=600) == 0, screen.decode(errors="replace")[-3000:]
    text = screen.decode(errors="replace")
    assert "\r" in text  # redrawn in place
    bar = re.findall(r"train: +100%\|[^|]*\| 6/6 \[[^\]]*samples/s=[\d.]+, loss=[\d.]+, lr=[\d.e-]+\]", text)
    assert bar, text[-3000:]
    assert re.search(r"eval: +100%\|[^|]*\| (\d+)/\1 \[", text)
    assert not re.search(r"train \d/6 steps \(", text)  # the plain log lines are for pipes only
