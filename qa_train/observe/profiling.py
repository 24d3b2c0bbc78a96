"""`--profile`: a PyTorch profiler trace of a few optimizer steps after warm-up, per rank."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from pathlib import Path

import torch

log = logging.getLogger("qa_train")


def start_profiler(
    output_dir: Path, warmup_steps: int, rank: int, is_main: bool, on_cuda: bool
) -> torch.profiler.profile:
    """Trace 3 optimizer steps after warm-up; the trace opens in TensorBoard or Perfetto.
    The caller steps it once per optimizer step and stops it at the end."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if on_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    where = output_dir / "profile"
    write = torch.profiler.tensorboard_trace_handler(str(where), f"rank{rank}")

    stop_marking = mark_collections()

    def ready(prof) -> None:
        stop_marking()
        write(prof)
        if is_main:
            sort = "self_cuda_time_total" if on_cuda else "self_cpu_time_total"
            table = prof.key_averages()
            print(table.table(sort_by=sort, row_limit=15), flush=True)
            if on_cuda:  # the host's side too: a step whose launches outlast its kernels is host-bound
                print(table.table(sort_by="self_cpu_time_total", row_limit=12), flush=True)
            log.info("profiler trace written to %s", where)

    profiler = torch.profiler.profile(
        activities=activities,
        on_trace_ready=ready,
        record_shapes=True,
        schedule=torch.profiler.schedule(wait=max(warmup_steps, 1), warmup=1, active=3, repeat=1),
    )
    profiler.start()
    return profiler


def mark_collections() -> Callable[[], None]:
    """Python's garbage collections as ranges of the trace while the profiler records: a full one stalls the host
    for a tenth of a second or more (docs/benchmarks/2026-11-27-gpu-h100.md), which no operator would show.
    Returns what unregisters it."""
    from torch.autograd import profiler as autograd_profiler

    open_ranges: list[autograd_profiler.record_function] = []

    def callback(phase: str, info: dict) -> None:
        if phase == "start" and autograd_profiler._is_profiler_enabled:  # read now: it changes as the profiler steps
            marker = autograd_profiler.record_function(f"python gc, generation {info['generation']}")
            marker.__enter__()
            open_ranges.append(marker)
        elif phase == "stop" and open_ranges:
            open_ranges.pop().__exit__(None, None, None)

    gc.callbacks.append(callback)

    def stop() -> None:
        if callback in gc.callbacks:
            gc.callbacks.remove(callback)

    return stop
