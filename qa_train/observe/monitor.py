"""The training loop's metrics, as torchtitan's metrics processor makes them: the loop only counts (each micro-batch
once, in `TrainingMetrics`); every `--logging_steps` one gather turns each rank's counts into the interval's
namespaced figures, and at the end of training the same counts give the run's throughput.

Reductions across ranks: loss is the mean over every micro-batch of every rank; throughput is global
(all ranks' samples over the slowest rank's interval); memory is the largest rank's peak. Peaks are
reset at each interval, so a spike shows at the step it happened.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch

from qa_train.observe.hostmem import HostMemory
from qa_train.observe.machine import LoadMeter
from qa_train.observe.metrics import (
    GIB,
    NOTHING_COUNTED,
    BatchCount,
    DeviceMemory,
    Throughput,
    TrainMemory,
    achieved,
)

# One float row per rank: the order of Interval.gather's columns.
COLUMNS = (
    "loss_sum",
    "micro_batches",
    "stop",
    "bad_grad_norms",
    "grad_norm_sum",
    "norms",
    "samples",
    "tokens",
    "flops",
    "elapsed_s",
    "cuda_allocated_gib",
    "cuda_reserved_gib",
    "host_rss_gib",
)


@dataclass
class IntervalFigures:
    """One logging interval, reduced over ranks (the same on every rank)."""

    loss: float
    grad_norm: float
    """Mean of the interval's finite global gradient norms (before clipping); NaN if none was finite."""
    bad_grad_norms: int
    """Non-finite gradient norms in the interval."""
    stop_requested: bool
    samples_per_second: float
    tokens_per_second: float
    flops_per_second_per_device: float
    peak_allocated_gib: float
    peak_reserved_gib: float
    host_rss_gib: float


@dataclass
class ModelCost:
    """What MFU needs: training FLOPs per token (modeling.flop_coefficients) and the device's peak (None: no MFU,
    as on CPU or in fp32)."""

    matmul_flops_per_token: float
    attention_flops_per_token_and_position: float
    peak_tflops: float | None

    def batch_flops(self, padded_tokens: int, width: int) -> float:
        """A batch padded to `width`: attention's share follows the width, not --max_seq_length (with dynamic
        padding, counting every batch at full length overstated MFU by attention's share of the difference)."""
        return padded_tokens * (self.matmul_flops_per_token + self.attention_flops_per_token_and_position * width)


class TrainingMetrics:
    """One rank's training, counted once: each micro-batch and each update, on one clock that stops for work in
    the loop that is not training (evaluation, checkpoint saves). Counts stay on the host, the loss and gradient
    norms on the device: no host sync per step; `collect()`, once per logging interval, is the sync.

    Two readings of the same counts: per interval (`collect`, the trackers' figures) and over the run (`finish`,
    metrics.json's throughput, from the first step after --throughput_warmup_steps)."""

    def __init__(
        self, accelerator, device_memory: DeviceMemory, host_memory: HostMemory, cost: ModelCost, warmup_steps: int
    ) -> None:
        self.accelerator = accelerator
        self.device_memory, self.host_memory, self.cost = device_memory, host_memory, cost
        self.warmup_steps = warmup_steps
        self.on_cuda = accelerator.device.type == "cuda"
        device = accelerator.device
        self.loss_sum = torch.zeros((), device=device)
        self.grad_norm_sum = torch.zeros((), device=device)
        self.bad_grad_norms = torch.zeros((), device=device)
        self.last_loss = math.nan
        self.load = LoadMeter()
        self._begin()

    def start(self) -> None:
        """Training begins: counts, the clock and the memory peaks are the training phase's from here (an evaluation
        before training, --eval_on_start's or one a resumed run owed, is in none of them)."""
        self.host_memory.reset()
        self.device_memory.reset()
        self.load.start()
        self._begin()

    def _begin(self) -> None:
        self.t_first = time.perf_counter()
        self.excluded_s = 0.0  # the clock's pauses so far: training time is wall time less these
        self.checkpoint_s = 0.0
        self.counted, self.micro_batches = NOTHING_COUNTED, 0
        self.steps = self.timed_steps = 0
        # Where the run's throughput is timed from (training time) and what was counted by then; without a warm-up
        # from the first step, so that evaluations are left out of it too.
        self.clock_start: float | None = 0.0 if self.warmup_steps == 0 else None
        self.before_clock = NOTHING_COUNTED
        self._next_interval()

    def _next_interval(self) -> None:
        self.loss_sum.zero_()
        self.grad_norm_sum.zero_()
        self.bad_grad_norms.zero_()
        self.norms = 0
        self.interval_start = self.training_time()
        self.interval_counted, self.interval_micro_batches = self.counted, self.micro_batches

    def training_time(self) -> float:
        """Seconds since `start()` on the training clock: wall time less the work `excluded` left out."""
        return time.perf_counter() - self.t_first - self.excluded_s

    def _sync(self) -> None:
        if self.on_cuda:
            torch.cuda.synchronize()

    def micro_batch(self, loss: torch.Tensor, count: BatchCount) -> None:
        self.loss_sum += loss.detach().float()
        self.micro_batches += 1
        self.counted = self.counted + count
        self.host_memory.step()

    def update(self, grad_norm: torch.Tensor | float | None) -> None:
        """One optimizer step's global gradient norm (None where the strategy does not say): a non-finite norm
        is counted, and left out of the interval's mean."""
        if grad_norm is None:
            return
        norm = torch.as_tensor(grad_norm, device=self.loss_sum.device).float()
        finite = torch.isfinite(norm)
        self.norms += 1
        self.bad_grad_norms += (~finite).float()
        self.grad_norm_sum += torch.where(finite, norm, torch.zeros_like(norm))

    def optimizer_step(self) -> None:
        """An update is done: the run's clock starts after the warm-up, and counts the steps after it."""
        self.steps += 1
        if self.steps == self.warmup_steps:
            self._sync()  # the clock starts once queued warm-up work has finished
            self.clock_start, self.before_clock = self.training_time(), self.counted
        elif self.steps > self.warmup_steps:
            self.timed_steps += 1

    @contextlib.contextmanager
    def excluded(self, work: Literal["evaluation", "checkpoint"]) -> Iterator[None]:
        """Work inside the loop that is not a step stops the training clock (the interval's and the run's). An
        evaluation's memory is left out of the training peaks too; a save's stays in them (a save that runs out of
        memory ends the run as a step would), and its seconds are summed apart (`checkpoint_s`)."""
        self._sync()  # the last step's queued kernels are the step's time, not this work's
        memory = work == "evaluation"
        t0 = time.perf_counter()
        if memory:
            self.device_memory.fold()
        try:
            with self.host_memory.excluded() if memory else contextlib.nullcontext():
                yield
        finally:
            seconds = time.perf_counter() - t0
            self.excluded_s += seconds
            if work == "checkpoint":
                self.checkpoint_s += seconds
            if memory:
                self.device_memory.reset_current()

    def collect(self, stop_requested: bool) -> IntervalFigures:
        """Gather every rank's counts (a collective: all ranks call it at the same step) and start the next interval."""
        allocated, reserved = self.device_memory.take_interval_peaks()
        elapsed = max(self.training_time() - self.interval_start, 1e-9)
        interval = self.counted - self.interval_counted
        counted = torch.stack([self.loss_sum, self.bad_grad_norms, self.grad_norm_sum]).double()
        # The host's figures cross to the device as one tensor: each scalar copy would be a stream sync of its own.
        host = torch.tensor(
            [
                self.micro_batches - self.interval_micro_batches,
                float(stop_requested),
                self.norms,
                interval.samples,
                interval.tokens,
                interval.flops,
                elapsed,
                allocated,
                reserved,
                self.host_memory.take_interval_peak() / GIB,
            ],
            dtype=torch.float64,
        ).to(counted.device)
        mine = torch.cat([counted[:1], host[:2], counted[1:], host[2:]]).unsqueeze(0)  # in COLUMNS' order
        ranks = self.accelerator.gather(mine).cpu().tolist()
        self._next_interval()  # after the gather, whose wait for the ranks is no interval's
        figures = reduce_ranks([dict(zip(COLUMNS, r)) for r in ranks])
        self.last_loss = figures.loss
        return figures

    def finish(self) -> Throughput:
        """Training ended: the run's timed steps, what they counted and their time on the training clock."""
        self._sync()
        end = self.training_time()
        if self.clock_start is None or self.timed_steps == 0:  # no more steps than warm-up: time all, not nothing
            self.clock_start, self.timed_steps, self.before_clock = 0.0, self.steps, NOTHING_COUNTED
        return Throughput(self.counted - self.before_clock, max(end - self.clock_start, 1e-9), self.timed_steps)

    def memory(self) -> TrainMemory:
        """The training phase's memory peaks since `start()`."""
        allocated, reserved = self.device_memory.peaks_gib()
        return TrainMemory(allocated, reserved, self.host_memory.peak_gib, self.host_memory.baseline_gib)


def _max(values: list[float]) -> float:
    clean = [v for v in values if not math.isnan(v)]
    return max(clean) if clean else math.nan


def reduce_ranks(ranks: list[dict[str, float]]) -> IntervalFigures:
    """Combine one interval's per-rank counts."""
    total = {k: sum(r[k] for r in ranks) for k in COLUMNS}
    elapsed = max(r["elapsed_s"] for r in ranks)
    finite_norms = ranks[0]["norms"] - ranks[0]["bad_grad_norms"]  # the global norm: the same on every rank
    return IntervalFigures(
        loss=total["loss_sum"] / max(total["micro_batches"], 1.0),
        grad_norm=ranks[0]["grad_norm_sum"] / finite_norms if finite_norms > 0 else math.nan,
        bad_grad_norms=int(ranks[0]["bad_grad_norms"]),
        stop_requested=total["stop"] > 0,
        samples_per_second=total["samples"] / elapsed,
        tokens_per_second=total["tokens"] / elapsed,
        flops_per_second_per_device=total["flops"] / elapsed / len(ranks),
        peak_allocated_gib=_max([r["cuda_allocated_gib"] for r in ranks]),
        peak_reserved_gib=_max([r["cuda_reserved_gib"] for r in ranks]),
        host_rss_gib=_max([r["host_rss_gib"] for r in ranks]),
    )


def interval_log(figures: IntervalFigures, cost: ModelCost, lr: float, epoch: float) -> dict[str, float]:
    """The namespaced keys every tracker gets at a logging step. CUDA memory and MFU only where they exist."""
    values = {"train/loss": figures.loss, "train/lr": lr, "train/epoch": round(epoch, 4)}
    if not math.isnan(figures.grad_norm):
        values["train/grad_norm"] = figures.grad_norm
    values["throughput/samples_per_second"] = round(figures.samples_per_second, 3)
    values["throughput/tokens_per_second"] = round(figures.tokens_per_second, 1)
    _, mfu = achieved(figures.flops_per_second_per_device, cost.peak_tflops)
    if mfu is not None:
        values["throughput/mfu"] = mfu
    if not math.isnan(figures.peak_allocated_gib):
        values["memory/peak_allocated_gib"] = round(figures.peak_allocated_gib, 4)
        values["memory/peak_reserved_gib"] = round(figures.peak_reserved_gib, 4)
    values["memory/host_rss_gib"] = round(figures.host_rss_gib, 4)
    return values
