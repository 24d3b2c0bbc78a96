"""Throughput, MFU and device memory: what the train loop counted (monitor.TrainingMetrics), turned into figures.

Nothing here changes training state. `Trainer.fit` hands over what each rank trained as a `TrainSummary`; each
rank's `RankFigures` are gathered (named fields, one row per rank) before any figure is reported.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from qa_train.observe.hostmem import lifetime_peak_bytes
from qa_train.observe.machine import MachineLoad, others_on_busiest_node
from qa_train.observe.schema import PerRank, TrainFigures
from qa_train.observe.startup import Startup

GIB = 1024**3  # the *_gb keys of metrics.json are GiB, as nvidia-smi and torch report memory

# Dense bf16/fp16 tensor-core peak per device, from vendor data sheets (TFLOP/s).
PEAK_TFLOPS_16BIT = {
    "H200": 989.0,
    "H100 SXM": 989.0,
    "H100 NVL": 835.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10G": 125.0,
    "A10": 125.0,
    "V100": 125.0,
    "T4": 65.0,
}


def peak_tflops(device_name: str, mixed_precision: str) -> float | None:
    """Peak for MFU; None on CPU, unknown GPUs, or fp32 (its peak depends on TF32 settings)."""
    if mixed_precision not in ("bf16", "fp16"):
        return None
    return next((value for key, value in PEAK_TFLOPS_16BIT.items() if key in device_name), None)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


@dataclass(frozen=True)
class BatchCount:
    """One micro-batch's work, or the sum of several."""

    samples: int
    tokens: int
    padded_tokens: int
    flops: float
    """Training FLOPs at the batch's padded width (ModelCost.batch_flops)."""

    def __add__(self, other: BatchCount) -> BatchCount:
        return BatchCount(
            self.samples + other.samples,
            self.tokens + other.tokens,
            self.padded_tokens + other.padded_tokens,
            self.flops + other.flops,
        )

    def __sub__(self, other: BatchCount) -> BatchCount:
        return BatchCount(
            self.samples - other.samples,
            self.tokens - other.tokens,
            self.padded_tokens - other.padded_tokens,
            self.flops - other.flops,
        )


NOTHING_COUNTED = BatchCount(0, 0, 0, 0.0)


@dataclass(frozen=True)
class Throughput:
    """One rank's timed steps (those after --throughput_warmup_steps, or every step of a run no longer than its
    warm-up): what they counted and how long they took on the training clock (evaluation and checkpoints left
    out)."""

    counted: BatchCount
    elapsed_s: float
    timed_steps: int


@dataclass(frozen=True)
class TrainMemory:
    """One rank's memory over the training phase, GiB."""

    cuda_allocated_gib: float
    """CUDA's max allocated; NaN on CPU."""
    cuda_reserved_gib: float
    """CUDA's max reserved by the caching allocator; NaN on CPU."""
    host_rss_gib: float
    """The host RSS peak of training (evaluation left out)."""
    host_baseline_gib: float
    """Host RSS right before the model's parameters existed (HostMemory.mark_baseline)."""


@dataclass(frozen=True)
class TrainSummary:
    """What `Trainer.fit` trained, as this rank measured it."""

    finished: bool
    """False when a stop request ended training early (its checkpoint is written)."""
    steps: int
    """Optimizer steps completed, a resumed run's earlier ones included."""
    runtime_s: float
    """Wall seconds of the training loop, first step to last, evaluations and checkpoints in it included."""
    checkpoint_s: float
    """Wall seconds of the checkpoint saves in the loop."""
    last_loss: float
    """Loss over all ranks in the last logging interval; NaN when no step was logged."""
    throughput: Throughput
    memory: TrainMemory
    compile_s: float
    """Seconds torch.compile spent compiling in the loop; NaN without --torch_compile."""
    compiled_graphs: float
    """Graphs compiled in the loop; NaN without --torch_compile."""
    compile_cache_hits: float = math.nan
    """Inductor graphs the loop loaded from inductor's cache; NaN without --torch_compile."""
    compile_cache_misses: float = math.nan
    """Inductor graphs the loop built anew; NaN without --torch_compile."""
    machine: MachineLoad | None = None
    """The machine's load over the training loop, as this rank saw it."""


class DeviceMemory:
    """CUDA allocator peaks: per logging interval, and over the whole phase since `reset()`. NaN on CPU, where
    host RSS is the memory figure. torch keeps one peak counter; it is folded into both and reset."""

    def __init__(self, device: torch.device) -> None:
        self.on_cuda = device.type == "cuda"
        self.device = device
        self.interval = self.overall = (0.0, 0.0)

    def reset(self) -> None:
        self.interval = self.overall = (0.0, 0.0)
        self.reset_current()

    def reset_current(self) -> None:
        """Forget the peak since the last fold (work that must not count, such as evaluation)."""
        if self.on_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def fold(self) -> None:
        if not self.on_cuda:
            return
        now = (torch.cuda.max_memory_allocated(self.device) / GIB, torch.cuda.max_memory_reserved(self.device) / GIB)
        self.interval = (max(self.interval[0], now[0]), max(self.interval[1], now[1]))
        self.overall = (max(self.overall[0], now[0]), max(self.overall[1], now[1]))
        self.reset_current()

    def take_interval_peaks(self) -> tuple[float, float]:
        """(max allocated, max reserved) in GiB since the last call; the next interval starts from zero."""
        self.fold()
        peaks, self.interval = self.interval, (0.0, 0.0)
        return peaks if self.on_cuda else (float("nan"), float("nan"))

    def peaks_gib(self) -> tuple[float, float]:
        """(max allocated, max reserved) in GiB since `reset()`."""
        self.fold()
        return self.overall if self.on_cuda else (float("nan"), float("nan"))


def lifetime_rss_gib() -> float:
    return lifetime_peak_bytes() / GIB


@dataclass
class RankFigures:
    """What one rank measured over training. Gathered as one float row per rank, in field order."""

    samples: float
    tokens: float
    padded_tokens: float
    flops: float
    elapsed_s: float
    timed_steps: float
    cuda_allocated_gib: float
    cuda_reserved_gib: float
    train_rss_gib: float
    baseline_rss_gib: float  # host RSS before the model existed (HostMemory.mark_baseline)
    lifetime_rss_gib: float
    last_loss: float
    compile_s: float  # NaN without --torch_compile
    compiled_graphs: float
    compile_cache_hits: float = math.nan
    compile_cache_misses: float = math.nan
    # The machine during training (observe.machine.MachineLoad); NaN where it was not measured.
    own_cpu_cores: float = math.nan
    node_busy_cores: float = math.nan
    load_average_1m: float = math.nan
    cpu_count: float = math.nan
    # The rank's start-up (observe.startup.Startup); NaN where a part is unknown.
    startup_launch_s: float = math.nan
    startup_process_s: float = math.nan
    startup_build_s: float = math.nan

    @classmethod
    def measured(cls, trained: TrainSummary, startup: Startup) -> RankFigures:
        """This rank's figures from what it trained, with its lifetime host peak as of now (call it after the final
        evaluation, whose memory that peak includes)."""
        counted, memory = trained.throughput.counted, trained.memory
        return cls(
            samples=counted.samples,
            tokens=counted.tokens,
            padded_tokens=counted.padded_tokens,
            flops=counted.flops,
            elapsed_s=trained.throughput.elapsed_s,
            timed_steps=trained.throughput.timed_steps,
            cuda_allocated_gib=memory.cuda_allocated_gib,
            cuda_reserved_gib=memory.cuda_reserved_gib,
            train_rss_gib=memory.host_rss_gib,
            baseline_rss_gib=memory.host_baseline_gib,
            lifetime_rss_gib=lifetime_rss_gib(),
            last_loss=trained.last_loss,
            compile_s=trained.compile_s,
            compiled_graphs=trained.compiled_graphs,
            compile_cache_hits=trained.compile_cache_hits,
            compile_cache_misses=trained.compile_cache_misses,
            **(asdict(trained.machine) if trained.machine is not None else {}),
            **_startup_fields(startup),
        )

    @classmethod
    def untrained(cls, startup: Startup) -> RankFigures:
        """An evaluation-only run's rank (--do_train false): its lifetime host peak and start-up, and nothing trained
        (NaN)."""
        figures = dict.fromkeys((f.name for f in dataclasses.fields(cls)), math.nan)
        return cls(**{**figures, "lifetime_rss_gib": lifetime_rss_gib(), **_startup_fields(startup)})

    @property
    def startup(self) -> Startup:
        return Startup(self.startup_launch_s, self.startup_process_s, self.startup_build_s)

    def as_row(self) -> list[float]:
        return [float(getattr(self, f.name)) for f in dataclasses.fields(self)]

    @classmethod
    def from_row(cls, row: list[float]) -> RankFigures:
        return cls(*row)


def _startup_fields(startup: Startup) -> dict[str, float]:
    return {
        "startup_launch_s": startup.launch_s,
        "startup_process_s": startup.process_s,
        "startup_build_s": startup.build_s,
    }


def _count(value: float) -> int | None:
    return int(value) if math.isfinite(value) else None


def slowest_startup(ranks: list[RankFigures]) -> Startup:
    """The start-up of the rank that took longest to start: the others waited for it at the first collective."""
    return max((r.startup for r in ranks), key=lambda s: s.total_s)


def gather_figures(accelerator, mine: RankFigures) -> list[RankFigures]:
    """Every rank's figures on every rank (a collective: all ranks must call it)."""
    row = torch.tensor([mine.as_row()], dtype=torch.float64, device=accelerator.device)
    return [RankFigures.from_row(r) for r in accelerator.gather(row).cpu().tolist()]


def achieved(flops_per_second_per_device: float, peak: float | None) -> tuple[float, float | None]:
    """(TFLOP/s per device, MFU or None): the training FLOPs of the padded batches per second, against the
    device's dense 16-bit peak. The one definition the run summary and the interval log share."""
    tflops = flops_per_second_per_device / 1e12
    return tflops, (round(tflops / peak, 4) if peak else None)


def summarize(ranks: list[RankFigures], peak: float | None, on_cuda: bool, ranks_per_node: int = 1) -> TrainFigures:
    """Combine the ranks' figures: throughput summed over ranks, timed by the slowest; memory per rank; the machine's
    load on its busiest node (`ranks_per_node`: the launch's LOCAL_WORLD_SIZE)."""
    elapsed = max(r.elapsed_s for r in ranks)
    steps = max(r.timed_steps for r in ranks)

    def per_second(total: float, digits: int) -> float | None:
        # A resumed run with no step left to train has no throughput, not a zero one.
        return round(total / elapsed, digits) if steps else None

    padded = sum(r.padded_tokens for r in ranks)
    tflops, mfu = achieved(sum(r.flops for r in ranks) / elapsed / len(ranks), peak)
    train_memory = [r.cuda_allocated_gib if on_cuda else r.train_rss_gib for r in ranks]
    compiled = all(math.isfinite(r.compile_s) for r in ranks)
    slowest_compile = max(ranks, key=lambda r: r.compile_s)
    return TrainFigures(
        train_samples_per_second=per_second(sum(r.samples for r in ranks), 3),
        train_tokens_per_second=per_second(sum(r.tokens for r in ranks), 1),
        train_padded_tokens_per_second=per_second(padded, 1),
        train_step_time_s_mean=round(elapsed / steps, 5) if steps else None,
        timed_steps=int(steps),
        tflops_per_device=round(tflops, 3) if steps else None,
        mfu=mfu if steps else None,
        peak_memory_source="cuda_max_allocated" if on_cuda else "host_rss_during_training",
        peak_memory_gb=PerRank.of(train_memory),
        peak_memory_reserved_gb=PerRank.of([r.cuda_reserved_gib for r in ranks]),
        train_host_rss_gb=PerRank.of([r.train_rss_gib for r in ranks]),
        host_rss_baseline_gb=PerRank.of([r.baseline_rss_gib for r in ranks]),
        peak_host_rss_gb=PerRank.of([r.lifetime_rss_gib for r in ranks]),
        # Ranks compile side by side; the slowest holds the others at the first collective.
        compile_time_s=round(max(r.compile_s for r in ranks), 2) if compiled else None,
        compiled_graphs=int(max(r.compiled_graphs for r in ranks)) if compiled else None,
        # The slowest rank's, whose compile is compile_time_s: did it build its kernels or load them?
        compile_cache_hits=_count(slowest_compile.compile_cache_hits) if compiled else None,
        compile_cache_misses=_count(slowest_compile.compile_cache_misses) if compiled else None,
        **machine_figures(ranks, ranks_per_node),
    )


def machine_figures(ranks: list[RankFigures], ranks_per_node: int) -> dict[str, Any]:
    """metrics.json's load_average_1m, other_processes_cpu_cores and cpu_count (None where unmeasured)."""
    if any(math.isnan(r.own_cpu_cores) or math.isnan(r.node_busy_cores) for r in ranks):
        return {}
    others = others_on_busiest_node(
        [r.own_cpu_cores for r in ranks], [r.node_busy_cores for r in ranks], ranks_per_node
    )
    return {
        "load_average_1m": round(max(r.load_average_1m for r in ranks), 2),
        "other_processes_cpu_cores": round(others, 2),
        "cpu_count": int(ranks[0].cpu_count),
    }
