"""The form of a run's log lines, `HH:MM:SS LEVEL qa_train: message`, from the process's first line on.

The trainer sets the levels once the accelerator knows which process is the main one (trainer.setup_logging); what
a rank logs before that (the output dir's lock taken over or left behind, a data check) used to reach Python's
last-resort handler, which prints the bare message.
"""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%H:%M:%S"


def from_the_start() -> None:
    """The run's form for the lines logged before the trainer's set-up: warnings and errors, as before, but with
    their time and level. Cheap (no library is imported), and a no-op where the root logger already has handlers (a
    program that set up its own logging)."""
    logging.basicConfig(format=FORMAT, datefmt=DATE_FORMAT)
