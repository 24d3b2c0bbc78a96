"""Host memory of this process: the RSS peak, and glibc's heap handed back to the OS where it pays."""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

import psutil

GIB = 1024**3
# glibc keeps freed heap pages mapped. Batches of changing shapes (dynamic padding) fragment the
# heap, so RSS creeps up by hundreds of MB with nothing live in it, by a different amount each run
# (measured: 1.05-1.87 GiB peak for the same tiny-model run on SQuAD-sized data). malloc_trim gives
# the free pages back, but pages a later step reuses are then faulted in again: trimming after every
# batch cost ~30% throughput on the tiny model, and at BERT-base size, where RSS swings by GBs within
# each step, a fixed 256 MiB allowance trimmed on every step (4x the page faults of transformers'
# example). So the allowance is the larger of MIN_SLACK_BYTES and the first training step's own RSS
# growth (its activations, gradients and optimizer state): what a step legitimately reuses is never
# trimmed, and only creep beyond it is.
MIN_SLACK_BYTES = 256 * 2**20


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc (macOS, musl): nothing to do


class HostMemory:
    """`step()` once per batch reads RSS once: it feeds the peak and the trim rule.

    `reset()` right before the first training step makes `peak` the training phase's alone;
    `trim()` hands the free heap back at the end of a phase (featurisation, evaluation).
    """

    def __init__(self, trim: bool, min_slack: int = MIN_SLACK_BYTES, read_rss: Callable[[], int] | None = None) -> None:
        self._trim = _malloc_trim() if trim else None
        self._rss = read_rss or (lambda process=psutil.Process(): process.memory_info().rss)
        self.min_slack = min_slack
        self.step_growth = 0  # RSS growth over the first step after reset(): the step's working set
        self.floor = self._rss()  # RSS right after the last trim (or reset)
        self.peak = self.floor
        self.steps = 0
        self.trims = 0

    @property
    def slack(self) -> int:
        return max(self.min_slack, self.step_growth)

    def reset(self) -> None:
        self.floor = self.peak = self._rss()
        self.steps = 0
        self.step_growth = 0

    def step(self) -> None:
        rss = self._rss()
        self.peak = max(self.peak, rss)
        self.steps += 1
        if self.steps == 1:
            self.step_growth = max(0, rss - self.floor)
        elif self._trim is not None and rss > self.floor + self.slack:
            self.trim()

    def trim(self) -> None:
        if self._trim is not None:
            self._trim(0)
            self.trims += 1
            self.floor = self._rss()

    @property
    def peak_gib(self) -> float:
        return self.peak / GIB
