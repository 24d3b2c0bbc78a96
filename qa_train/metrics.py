"""Throughput, MFU and peak memory: counted by the train loop, turned into figures here.

Callbacks observe only: nothing here changes training state.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field

import psutil
import torch

GB = 1024**3  # the *_gb keys of metrics.json are GiB, as nvidia-smi and torch report memory

# Dense bf16/fp16 tensor-core peak per device, from vendor data sheets (TFLOP/s).
PEAK_TFLOPS_16BIT = {
    "H200": 989.0, "H100 SXM": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.0,
    "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 125.0, "A10": 125.0, "V100": 125.0, "T4": 65.0,
}


def device_peak_tflops(device: torch.device, mixed_precision: str) -> float | None:
    """Peak for MFU; None on CPU, unknown GPUs, or fp32 (its peak depends on TF32 settings)."""
    if device.type != "cuda" or mixed_precision not in ("bf16", "fp16"):
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_TFLOPS_16BIT.items():
        if key in name:
            return value
    return None


@dataclass
class ThroughputMeter:
    """Counts samples and tokens per optimizer step; the first `warmup_steps` steps are not timed."""

    warmup_steps: int
    steps: int = 0
    timed_steps: int = 0
    samples: int = 0
    tokens: int = 0
    padded_tokens: int = 0
    t_start: float | None = None
    t_end: float | None = None
    t_first: float = field(default_factory=time.perf_counter)

    def micro_batch(self, samples: int, tokens: int, padded_tokens: int) -> None:
        if self.steps >= self.warmup_steps:
            self.samples += samples
            self.tokens += tokens
            self.padded_tokens += padded_tokens

    def optimizer_step(self, sync) -> None:
        self.steps += 1
        if self.steps == self.warmup_steps:
            sync()  # the clock starts once queued warm-up work has finished
            self.t_start = time.perf_counter()
        elif self.steps > self.warmup_steps:
            self.timed_steps += 1

    def finish(self, sync) -> None:
        sync()
        self.t_end = time.perf_counter()
        if self.t_start is None:  # fewer steps than warm-up: time everything rather than nothing
            self.t_start = self.t_first

    @property
    def elapsed(self) -> float:
        return max((self.t_end or time.perf_counter()) - (self.t_start or self.t_first), 1e-9)

    def local(self) -> list[float]:
        return [self.samples, self.tokens, self.padded_tokens, self.elapsed, self.timed_steps]


@dataclass
class MemoryMonitor:
    """Peak memory during training: CUDA allocator peaks (reset after prepare) and sampled host RSS."""

    device: torch.device
    rss_peak: int = 0
    process: psutil.Process = field(default_factory=psutil.Process)

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.rss_peak = self.process.memory_info().rss

    def sample(self) -> None:
        self.rss_peak = max(self.rss_peak, self.process.memory_info().rss)

    def local(self) -> list[float]:
        """[cuda max allocated, cuda max reserved, training RSS peak, lifetime RSS peak] in GiB."""
        if self.device.type == "cuda":
            alloc = torch.cuda.max_memory_allocated(self.device) / GB
            reserved = torch.cuda.max_memory_reserved(self.device) / GB
        else:
            alloc = reserved = float("nan")
        lifetime = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB  # Linux reports KiB
        return [alloc, reserved, self.rss_peak / GB, lifetime]


def per_rank_summary(values: list[float]) -> dict[str, object]:
    clean = [v for v in values if v == v]  # drop NaN (no CUDA)
    if not clean:
        return {"per_rank": None, "max": None, "mean": None}
    return {"per_rank": [round(v, 4) for v in values], "max": round(max(clean), 4),
            "mean": round(sum(clean) / len(clean), 4)}


def summarize(throughput_rows: list[list[float]], memory_rows: list[list[float]], flops_per_token_padded: float,
              peak_tflops: float | None, on_cuda: bool) -> dict[str, object]:
    """Combine per-rank rows (gathered from all ranks) into the reported figures."""
    world = len(throughput_rows)
    samples = sum(r[0] for r in throughput_rows)
    tokens = sum(r[1] for r in throughput_rows)
    padded = sum(r[2] for r in throughput_rows)
    elapsed = max(r[3] for r in throughput_rows)  # the slowest rank sets the pace
    steps = max(r[4] for r in throughput_rows)
    padded_per_s = padded / elapsed
    achieved_tflops_per_device = padded_per_s * flops_per_token_padded / world / 1e12
    columns = list(zip(*memory_rows))
    out: dict[str, object] = {
        "train_samples_per_second": round(samples / elapsed, 3),
        "train_tokens_per_second": round(tokens / elapsed, 1),
        "train_padded_tokens_per_second": round(padded_per_s, 1),
        "train_step_time_s_mean": round(elapsed / steps, 5) if steps else None,
        "timed_steps": int(steps),
        "tflops_per_device": round(achieved_tflops_per_device, 3),
        "mfu": round(achieved_tflops_per_device / peak_tflops, 4) if peak_tflops else None,
        "peak_memory_source": "cuda_max_allocated" if on_cuda else "host_rss_during_training",
        "peak_memory_gb": per_rank_summary(list(columns[0] if on_cuda else columns[2])),
        "peak_memory_reserved_gb": per_rank_summary(list(columns[1])),
        "train_host_rss_gb": per_rank_summary(list(columns[2])),
        "peak_host_rss_gb": per_rank_summary(list(columns[3])),
    }
    return out
