"""Per-interval training figures, as torchtitan's metrics processor makes them: the loop only counts; every
`--logging_steps` one gather turns each rank's counts into the interval's namespaced figures.

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

import torch

from qa_train.observe.hostmem import HostMemory
from qa_train.observe.metrics import GIB, BatchCount, DeviceMemory, achieved

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


class IntervalMonitor:
    """Counts one rank's work between logs on the device (no host sync per step); `collect()` is the sync."""

    def __init__(self, accelerator, device_memory: DeviceMemory, host_memory: HostMemory, cost: ModelCost) -> None:
        self.accelerator = accelerator
        self.device_memory, self.host_memory, self.cost = device_memory, host_memory, cost
        device = accelerator.device
        self.loss_sum = torch.zeros((), device=device)
        self.grad_norm_sum = torch.zeros((), device=device)
        self.bad_grad_norms = torch.zeros((), device=device)
        self._restart()

    def start(self) -> None:
        """Training begins: the first interval is timed from here, not from when the monitor was built (an
        evaluation before training, --eval_on_start, would otherwise count in the first interval's time)."""
        self.loss_sum.zero_()
        self.grad_norm_sum.zero_()
        self.bad_grad_norms.zero_()
        self._restart()

    def _restart(self) -> None:
        self.micro_batches = self.norms = self.samples = self.tokens = 0
        self.flops = 0.0
        self.excluded_s = 0.0
        self.t0 = time.perf_counter()

    def micro_batch(self, loss: torch.Tensor, count: BatchCount) -> None:
        self.loss_sum += loss.detach().float()
        self.micro_batches += 1
        self.samples += count.samples
        self.tokens += count.tokens
        self.flops += count.flops

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

    @contextlib.contextmanager
    def excluded(self, memory: bool = True) -> Iterator[None]:
        """Work inside (evaluation, checkpoint saves) does not count in the interval's time; with `memory`, not in
        its peaks either."""
        if memory:
            self.device_memory.fold()
        t0 = time.perf_counter()
        try:
            with self.host_memory.excluded() if memory else contextlib.nullcontext():
                yield
        finally:
            self.excluded_s += time.perf_counter() - t0
            if memory:
                self.device_memory.reset_current()

    def collect(self, stop_requested: bool) -> IntervalFigures:
        """Gather every rank's counts (a collective: all ranks call it at the same step) and start the next interval."""
        allocated, reserved = self.device_memory.take_interval_peaks()
        elapsed = max(time.perf_counter() - self.t0 - self.excluded_s, 1e-9)
        counted = torch.stack([self.loss_sum, self.bad_grad_norms, self.grad_norm_sum]).double()
        # The host's figures cross to the device as one tensor: each scalar copy would be a stream sync of its own.
        host = torch.tensor(
            [
                self.micro_batches,
                float(stop_requested),
                self.norms,
                self.samples,
                self.tokens,
                self.flops,
                elapsed,
                allocated,
                reserved,
                self.host_memory.take_interval_peak() / GIB,
            ],
            dtype=torch.float64,
        ).to(counted.device)
        mine = torch.cat([counted[:1], host[:2], counted[1:], host[2:]]).unsqueeze(0)  # in COLUMNS' order
        ranks = self.accelerator.gather(mine).cpu().tolist()
        self.start()
        return reduce_ranks([dict(zip(COLUMNS, r)) for r in ranks])


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
