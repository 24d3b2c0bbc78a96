"""How long a run took to start, in three parts, so that a slow start says where it went: the launch (the launcher
and agent processes before this rank's process began), the process (Python, imports, flags, reading the data
files) and the build (accelerator, windows, model, optimizer, prepare, resume).

Each part is known only where its start is: the launch where `qa-train launch` or slurm/train.sbatch stamped it in
the environment (core.preemption.launch_stamp), the process where it was started for the run (`python -m
qa_train`, `qa-train train`: `entered()`), the build always. An unknown part is NaN here and null in metrics.json.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from qa_train.core import preemption

_entered = False


def entered() -> None:
    """This process was started for the run: its start is the run's too (not so for main() called in-process)."""
    global _entered
    _entered = True


@dataclass(frozen=True)
class Startup:
    """One rank's start-up, seconds of wall time."""

    launch_s: float
    process_s: float
    build_s: float

    @property
    def total_s(self) -> float:
        """From the earliest start known to the built run."""
        return math.fsum(s for s in (self.launch_s, self.process_s, self.build_s) if not math.isnan(s))


def measure(run_began: float, built: float) -> Startup:
    """`run_began` and `built`: time.time() when run.run began and when its trainer was built."""
    process_start = preemption.process_start() if _entered else math.nan
    launch = math.nan
    if not math.isnan(process_start):
        stamped = preemption.launch_stamp()
        # A stamp after the process began is not this launch's (a clock step, or a stamp inherited from elsewhere).
        if stamped is not None and stamped <= process_start:
            launch = process_start - stamped
    process = max(run_began - process_start, 0.0) if not math.isnan(process_start) else math.nan
    return Startup(launch_s=launch, process_s=process, build_s=max(built - run_began, 0.0))


def now() -> float:
    """The clock the parts are read on: wall time, as the launcher's stamp and the process's start are."""
    return time.time()
