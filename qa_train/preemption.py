"""Stop requests: SLURM's warning signal, or a PREEMPT file, asks every rank for a checkpoint and exit."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

PREEMPT_FILE = "PREEMPT"
# Test hook: with QA_TRAIN_TEST_HOLD_AT_STEP=N every rank writes OUTPUT_DIR/HOLDING-rank<r> after
# optimizer step N and waits there until a stop is requested or the process is killed, so tests stop
# a run at a chosen step instead of slowing every step. Never set in real runs. A rank nobody stops
# goes on after HOLD_LIMIT_S, so a failed test cannot leave processes waiting forever.
HOLD_ENV = "QA_TRAIN_TEST_HOLD_AT_STEP"
HOLD_LIMIT_S = 300.0


class StopRequest:
    """SIGUSR1/SIGTERM (SLURM's warning signal) or a PREEMPT file in output_dir asks for a checkpoint and exit."""

    def __init__(self, output_dir: Path) -> None:
        self.flag = False
        self.output_dir = output_dir
        self.file = output_dir / PREEMPT_FILE
        self.hold_at = int(os.environ.get(HOLD_ENV, "0"))
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        self.flag = True

    def requested(self) -> bool:
        return self.flag or self.file.exists()

    def clear(self, is_main: bool) -> None:
        """The request is spent once its checkpoint exists; a resumed run must not stop at once."""
        if is_main:
            self.file.unlink(missing_ok=True)

    def hold_if_asked(self, step: int, rank: int) -> None:
        if step != self.hold_at or not self.hold_at:
            return
        (self.output_dir / f"HOLDING-rank{rank}").touch()
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not self.requested() and time.monotonic() < deadline:
            time.sleep(0.05)
