"""What the report shows, as numbers: each run's figures, grouped into sweep points with median and min-max.

A point is one config (or ablation label) at one process and node count; its runs are the repeats.
Speed-up is samples/s against the same config's smallest run (fewest processes, then nodes), and
efficiency is that speed-up over the growth in processes; `vs baseline` compares every point with
one baseline point across configs (the first one-process point, or --baseline).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, fields
from pathlib import Path

from qa_train.schema import MetricsFileError, RunMetrics
from qa_train.sweep import read_point


class ReportError(ValueError):
    """A run directory that cannot be reported; the message names it."""


@dataclass
class Row:
    """One run as the report reads it; raw numbers, formatted only when written out."""

    run: str
    run_dir: str
    label: str          # the sweep point's config or ablation name; the run's name outside a sweep
    repeat: int
    nodes: int
    strategy: str
    processes: int
    global_batch: int | None
    per_device_batch: int | None
    samples_per_s: float | None
    tokens_per_s: float | None
    train_time_s: float | None
    mfu: float | None
    memory_source: str | None
    memory_max_gb: float | None
    memory_mean_gb: float | None
    gpu_allocated_max_gb: float | None
    host_rss_train_max_gb: float | None
    host_rss_lifetime_max_gb: float | None
    exact_match: float | None
    f1: float | None


@dataclass
class Stat:
    """A figure over a point's runs: the median and the range."""

    median: float
    lo: float
    hi: float

    @classmethod
    def of(cls, values: list[float | None]) -> Stat | None:
        clean = [v for v in values if v is not None]
        return cls(statistics.median(clean), min(clean), max(clean)) if clean else None

    def over(self, base: float) -> Stat:
        """Each end divided by one number (a baseline's median)."""
        return Stat(self.median / base, self.lo / base, self.hi / base)


@dataclass
class Figures:
    """Every per-run figure a point aggregates; each name is also a Row field."""

    samples_per_s: Stat | None = None
    tokens_per_s: Stat | None = None
    train_time_s: Stat | None = None
    mfu: Stat | None = None
    memory_max_gb: Stat | None = None
    memory_mean_gb: Stat | None = None
    gpu_allocated_max_gb: Stat | None = None
    host_rss_train_max_gb: Stat | None = None
    host_rss_lifetime_max_gb: Stat | None = None
    exact_match: Stat | None = None
    f1: Stat | None = None

    @classmethod
    def of(cls, rows: list[Row]) -> Figures:
        return cls(**{f.name: Stat.of([getattr(r, f.name) for r in rows]) for f in fields(cls)})


@dataclass
class Group:
    """One sweep point over its repeats: a row of the report."""

    label: str
    strategy: str
    nodes: int
    processes: int
    global_batch: int | None
    per_device_batch: int | None
    memory_source: str | None
    runs: list[str]
    figures: Figures
    speedup: Stat | None = None      # samples/s against the same label's smallest point
    efficiency: Stat | None = None   # speedup / (processes / the smallest point's processes)
    scale_base: str | None = None    # that smallest point, e.g. "ddp x1"
    vs_baseline: float | None = None  # median samples/s against the baseline point's

    @property
    def key(self) -> str:
        return f"{self.label} x{self.processes}" + (f" on {self.nodes} nodes" if self.nodes > 1 else "")


# --- reading runs ----------------------------------------------------------------------------

def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories in the order given; a parent directory expands to its runs, sorted."""
    runs: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            raise ReportError(f"{path}: no such run directory")
        if (path / "metrics.json").is_file():
            runs.append(path)
            continue
        children = sorted(p.parent for p in path.glob("*/metrics.json"))
        if not children:
            raise ReportError(f"{path}: no metrics.json (not a finished run, nor a parent of finished runs)")
        runs.extend(children)
    return runs


def load_metrics(run_dir: Path) -> RunMetrics:
    try:
        return RunMetrics.read(run_dir)
    except MetricsFileError as err:
        raise ReportError(str(err)) from None


def make_row(run_dir: Path, m: RunMetrics) -> Row:
    offload = m.offload or "none"
    strategy = m.strategy if offload == "none" else f"{m.strategy}+offload({offload})"
    on_gpu = m.peak_memory_source == "cuda_max_allocated"
    name = m.args.get("run_name") or run_dir.name
    point = read_point(run_dir)
    return Row(
        run=name, run_dir=str(run_dir), label=point.label if point else name, repeat=point.repeat if point else 1,
        nodes=point.nodes if point else 1, strategy=str(strategy), processes=int(m.world_size or 0),
        global_batch=m.global_batch_size, per_device_batch=m.per_device_train_batch_size,
        samples_per_s=m.train_samples_per_second, tokens_per_s=m.train_tokens_per_second,
        train_time_s=m.train_runtime_s, mfu=m.mfu, memory_source=m.peak_memory_source,
        memory_max_gb=m.peak_memory_gb.max, memory_mean_gb=m.peak_memory_gb.mean,
        gpu_allocated_max_gb=m.peak_memory_gb.max if on_gpu else None,
        host_rss_train_max_gb=m.train_host_rss_gb.max, host_rss_lifetime_max_gb=m.peak_host_rss_gb.max,
        exact_match=m.exact_match, f1=m.f1,
    )


def read_rows(run_dirs: list[Path]) -> list[Row]:
    return [make_row(d, load_metrics(d)) for d in run_dirs]


# --- grouping --------------------------------------------------------------------------------

def group_rows(rows: list[Row]) -> list[Group]:
    """Runs of the same label, processes and nodes become one point; points in the order their labels first
    appear, then by scale."""
    buckets: dict[tuple[str, int, int], list[Row]] = {}
    for row in rows:
        buckets.setdefault((row.label, row.processes, row.nodes), []).append(row)
    order = list(dict.fromkeys(r.label for r in rows))
    groups = []
    for (label, processes, nodes), members in sorted(buckets.items(), key=lambda kv: (order.index(kv[0][0]),
                                                                                       kv[0][1], kv[0][2])):
        first = members[0]
        groups.append(Group(label, first.strategy, nodes, processes, first.global_batch, first.per_device_batch,
                            first.memory_source, [r.run for r in sorted(members, key=lambda r: r.repeat)],
                            Figures.of(members)))
    return groups


def add_scaling(groups: list[Group]) -> None:
    """Speed-up and efficiency of each point against the same label's smallest point (itself: 1.00x); none for
    a label run at one scale only (`vs_baseline` compares those)."""
    for label in dict.fromkeys(g.label for g in groups):
        mine = [g for g in groups if g.label == label]
        base = min(mine, key=lambda g: (g.processes, g.nodes))
        base_rate = base.figures.samples_per_s
        if len(mine) < 2:
            continue
        for g in mine:
            rate = g.figures.samples_per_s
            if rate is None or base_rate is None or not base_rate.median or not base.processes:
                continue
            g.speedup = rate.over(base_rate.median)
            g.efficiency = g.speedup.over(g.processes / base.processes)
            g.scale_base = base.key


def add_baseline(groups: list[Group], baseline: str | None = None) -> Group | None:
    """Median samples/s of every point against the point labelled `baseline`, else the first one-process point."""
    if baseline is not None:
        base = next((g for g in groups if baseline in (g.label, *g.runs)), None)
        if base is None:
            raise ReportError(f"--baseline {baseline}: no run or config of that name among "
                              f"{', '.join(dict.fromkeys(g.label for g in groups))}")
    else:
        base = next((g for g in groups if g.processes == 1), None)
    base_rate = base.figures.samples_per_s if base is not None else None
    for g in groups:
        rate = g.figures.samples_per_s
        ok = base_rate is not None and base_rate.median and rate is not None
        g.vs_baseline = round(rate.median / base_rate.median, 3) if ok else None
    return base


def scaling_kind(groups: list[Group]) -> dict[str, str]:
    """Per label swept over process counts: strong (one global batch), weak (one per-device batch) or mixed."""
    kinds = {}
    for label in dict.fromkeys(g.label for g in groups):
        mine = [g for g in groups if g.label == label]
        if len({g.processes for g in mine}) < 2:
            continue
        if len({g.global_batch for g in mine}) == 1:
            kinds[label] = f"strong (global batch {mine[0].global_batch})"
        elif len({g.per_device_batch for g in mine}) == 1:
            kinds[label] = f"weak (per-device batch {mine[0].per_device_batch})"
        else:
            kinds[label] = "mixed (neither the global nor the per-device batch is the same at every scale)"
    return kinds


def build_groups(run_dirs: list[Path], baseline: str | None = None) -> tuple[list[Row], list[Group], Group | None]:
    """The runs, their points with scaling figures, and the baseline point."""
    rows = read_rows(run_dirs)
    groups = group_rows(rows)
    add_scaling(groups)
    return rows, groups, add_baseline(groups, baseline)
