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
# the free pages back, but pages the next step uses again are then faulted back in: trimming after
# every batch cost ~30% throughput on the tiny model, and at BERT-base size, where a step's
# activations come and go by GBs, a fixed 256 MiB allowance trimmed on every step (1.6x the page
# faults of transformers' example, 0.89x its speed). So the allowance is learnt: the first
# LEARN_STEPS batches of a phase are never trimmed and the allowance grows to cover their rise
# (with a quarter to spare), and whatever the very next batch takes back after a trim counts as
# working set too. Only creep beyond the working set is trimmed.
MIN_SLACK_BYTES = 256 * 2**20
LEARN_STEPS = 8
SPARE = 1.25


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc (macOS, musl): nothing to do


def _own_rss() -> Callable[[], int]:
    process = psutil.Process()
    return lambda: process.memory_info().rss


class HostMemory:
    """`step()` once per batch reads RSS once: it feeds the peak and the trim rule.

    `reset()` right before the first training step makes `peak` the training phase's alone;
    `trim()` hands the free heap back at the end of a phase (featurisation, evaluation).
    """

    def __init__(self, trim: bool, min_slack: int = MIN_SLACK_BYTES, read_rss: Callable[[], int] | None = None) -> None:
        self._trim = _malloc_trim() if trim else None
        self._rss = read_rss or _own_rss()
        self.slack = min_slack  # how far RSS may rise above the floor before a trim
        self.floor = self.last = self._rss()  # RSS right after the last trim (or reset)
        self.peak = self.interval_peak = self.floor
        self.trims = 0
        self._learning = LEARN_STEPS  # batches left whose rise only teaches the allowance

    def reset(self) -> None:
        self.floor = self.peak = self.interval_peak = self.last = self._rss()
        self._learning = LEARN_STEPS

    def take_interval_peak(self) -> int:
        """The RSS peak (bytes) since the last call; the next interval starts from the last reading."""
        peak, self.interval_peak = self.interval_peak, self.last
        return peak

    def step(self) -> None:
        rss = self.last = self._rss()
        self.peak = max(self.peak, rss)
        self.interval_peak = max(self.interval_peak, rss)
        if self._learning:
            self._learning -= 1
            self.slack = max(self.slack, int(SPARE * (rss - self.floor)))
        elif self._trim is not None and rss > self.floor + self.slack:
            self.trim()

    def trim(self) -> None:
        if self._trim is not None:
            self._trim(0)
            self.trims += 1
            self.floor = self._rss()
            self._learning = 1

    @property
    def peak_gib(self) -> float:
        return self.peak / GIB
