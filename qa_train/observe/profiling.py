"""`--profile`: a PyTorch profiler trace of a few optimizer steps after warm-up, per rank."""

from __future__ import annotations

import logging
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

    def ready(prof) -> None:
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
