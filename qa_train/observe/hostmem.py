"""Host memory of this process: the RSS peak, and glibc's heap handed back to the OS where it pays."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import resource
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

GIB = 1024**3
# glibc keeps freed heap pages mapped, and batches of changing shapes fragment the heap, so RSS creeps up with
# nothing live in it; malloc_trim gives the pages back, but a trim too often faults the next step's pages back in.
# So the allowance is learnt: the first LEARN_STEPS batches of a phase are never trimmed and the allowance grows to
# cover their rise (a quarter to spare), and what the next batch takes back after a trim counts as working set
# too; only creep beyond it is trimmed (docs/benchmarks/2026-11-22-cpu-data-and-host-memory.md).
MIN_SLACK_BYTES = 256 * 2**20
LEARN_STEPS = 8
SPARE = 1.25
# Sampling RSS once per step misses a step's own peak: tensors above glibc's mmap threshold (32 MiB at
# most: BERT-base's activations at batch 16) are unmapped as soon as they are freed, before the sample.
# The kernel keeps the true high-water mark (VmHWM); writing 5 to clear_refs restarts it (Linux >= 4.0),
# and with it getrusage's ru_maxrss, so the lifetime peak before a restart is kept here.
STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")
_peak_before_restarts = 0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc (macOS, musl): nothing to do


def kernel_peak_bytes() -> int | None:
    """VmHWM: the kernel's record of this process's highest RSS since start or the last restart."""
    try:
        line = next(x for x in STATUS.read_text().splitlines() if x.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024


def restart_kernel_peak() -> bool:
    """Restart VmHWM from the current RSS; False where the kernel does not allow it (then sampling alone counts)."""
    global _peak_before_restarts
    before = kernel_peak_bytes()
    if before is None:
        return False
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    _peak_before_restarts = max(_peak_before_restarts, before)
    return True


def lifetime_peak_bytes() -> int:
    """The process's highest RSS over its whole life, restarts of the kernel's counter included."""
    return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, _peak_before_restarts)  # Linux: KiB


def _own_rss() -> Callable[[], int]:
    process = psutil.Process()
    return lambda: process.memory_info().rss


class HostMemory:
    """`step()` once per batch reads RSS once: it feeds the peak and the trim rule.

    `reset()` right before the first training step makes `peak` the training phase's alone (for this process, the
    kernel's high-water mark since then where it can be restarted: it sees a step's transient peak too);
    `trim()` hands the free heap back at the end of a phase (featurisation, evaluation).
    """

    def __init__(self, trim: bool, min_slack: int = MIN_SLACK_BYTES, read_rss: Callable[[], int] | None = None) -> None:
        self._trim = _malloc_trim() if trim else None
        self._rss = read_rss or _own_rss()
        self._kernel = read_rss is None  # the kernel's peak is this process's, not a scripted one's
        self._kernel_restarted = False
        self.slack = min_slack  # how far RSS may rise above the floor before a trim
        self.floor = self.last = self._rss()  # RSS right after the last trim (or reset)
        self.peak = self.interval_peak = self.floor
        self.trims = 0
        self._learning = LEARN_STEPS  # batches left whose rise only teaches the allowance
        self.baseline = float("nan")

    def mark_baseline(self) -> None:
        """Record RSS as the idle baseline that training memory is measured above: called once the libraries,
        the model's code, the data and the process group are in memory but before any parameter exists, so
        that the training peak minus this is what model states and activations took (qa_train.studies.planner's estimate)."""
        self.baseline = float(self._rss())

    def reset(self) -> None:
        self.floor = self.peak = self.interval_peak = self.last = self._rss()
        self._learning = LEARN_STEPS
        self._kernel_restarted = self._kernel and restart_kernel_peak()

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

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        """Work inside (evaluation during training) leaves the training peaks as they were before it."""
        if self._kernel_restarted:  # the kernel's mark so far is training's: keep it before restarting it
            self.peak = max(self.peak, kernel_peak_bytes() or 0)
        saved = self.peak, self.interval_peak
        try:
            yield
        finally:
            self.peak, self.interval_peak = saved
            if self._kernel_restarted:
                restart_kernel_peak()

    @property
    def peak_gib(self) -> float:
        kernel = kernel_peak_bytes() if self._kernel_restarted else None
        return max(self.peak, kernel or 0) / GIB

    @property
    def baseline_gib(self) -> float:
        return self.baseline / GIB
