"""The planner beside finished runs: its estimate of training memory per rank against what each run measured.

    python -m qa_train.plan --check runs/bench

On CPU the measured figure is host RSS during training above the idle baseline (`train_host_rss_gb` minus
`host_rss_baseline_gb`, rank by rank, the largest); on GPUs it is CUDA's max allocated (`peak_memory_gb`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qa_train.memplan import GIB, Setup, estimate
from qa_train.plan import PlanError, load_config, model_shape
from qa_train.report_data import ReportError, find_runs, load_metrics
from qa_train.schema import RunMetrics
from qa_train.sweep import read_point

# metrics.json's (strategy, offload) -> the planner's config name.
OFFLOADED = {("zero2", "optimizer"): "zero2_offload", ("zero3", "optimizer+params"): "zero3_offload"}


@dataclass
class Check:
    run: str
    config: str
    processes: int
    estimate_gib: float
    measured_gib: float | None
    padded: bool  # every batch padded to max_seq_length; else the estimate (at that length) is an upper bound

    @property
    def ratio(self) -> float | None:
        return self.estimate_gib / self.measured_gib if self.measured_gib else None


def planner_config(m: RunMetrics) -> str:
    strategy, offload = m.strategy or "single", m.offload or "none"
    if offload != "none":
        return OFFLOADED.get((strategy, offload), f"{strategy}+{offload}")
    return strategy


def measured_gib(m: RunMetrics) -> float | None:
    """What the run's training took per rank: CUDA's peak, or host RSS above the idle baseline (largest rank)."""
    if m.peak_memory_source == "cuda_max_allocated":
        return m.peak_memory_gb.max
    peaks, bases = m.train_host_rss_gb.per_rank, m.host_rss_baseline_gb.per_rank
    if not peaks or not bases:
        return None  # a run from before the baseline was recorded
    return max(p - b for p, b in zip(peaks, bases))


def check_run(run_dir: Path) -> Check:
    m = load_metrics(run_dir)
    args, config = m.args, planner_config(m)
    try:
        shape = model_shape(load_config(args.get("model_name_or_path"), args.get("config_name")))
    except PlanError as err:
        raise ReportError(f"{run_dir}: {err}") from None
    point = read_point(run_dir)
    world = int(m.world_size or 1)
    setup = Setup(world, point.nodes if point else 1, int(m.per_device_train_batch_size or 1),
                  int(m.max_seq_length or 384), m.mixed_precision or "no", args.get("attn_implementation", "sdpa"),
                  "cpu" if m.device == "cpu" else "cuda")
    planned = estimate(config, shape, setup)
    return Check(args.get("run_name") or run_dir.name, config, world, planned.total / GIB, measured_gib(m),
                 bool(args.get("pad_to_max_length")))


def check_runs(paths: list[str | Path]) -> str:
    checks = [check_run(d) for d in find_runs(paths)]
    lines = ["| run | config | processes | estimate GiB | measured GiB | estimate / measured |", "|" + "---|" * 6]
    for c in checks:
        measured = "—" if c.measured_gib is None else f"{c.measured_gib:.3f}"
        ratio = "—" if c.ratio is None else f"{c.ratio:.2f}" + ("" if c.padded else " (upper bound: dynamic padding)")
        lines.append(f"| {c.run} | {c.config} | {c.processes} | {c.estimate_gib:.3f} | {measured} | {ratio} |")
    return "\n".join(lines)
