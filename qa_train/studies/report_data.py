"""What the report shows, as numbers: each run's figures, grouped into sweep points with median and min-max.

A point is one config (or ablation label) at one process and node count; its runs are the repeats.
Speed-up is samples/s against the same config's smallest point with a throughput (fewest processes, then
nodes), and efficiency is that speed-up over the growth in processes; `vs baseline` compares every point
with one baseline point across configs (the first one-process point with a throughput, or --baseline).
Only runs of one workload (model and sequence length) are compared: labels carry the workload where the
runs span several, the device and precision where one config's runs span several, and the folder where two
sweeps hold the same point. A sweep's run without a readable
metrics.json (failed, killed, still running) stays in its point as a failed run, with the reason.
"""

from __future__ import annotations

import math
import os
import statistics
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from qa_train.core.errors import ERROR_PREFIX
from qa_train.observe.schema import MetricsFileError, PerRank, RunMetrics
from qa_train.studies.sweep import POINT_FILE, Point, read_point

LAUNCH_LOG = "launch.log"  # qa_train.studies.bench's log of each run, in its run dir


class ReportError(ValueError):
    """A run directory that cannot be reported; the message names it."""


@dataclass
class Row:
    """One run as the report reads it; raw numbers, formatted only when written out."""

    run: str
    run_dir: str
    label: str  # the sweep point's config or ablation name; the run's name outside a sweep
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
    model: str | None = None  # --config_name, else --model_name_or_path
    max_seq_length: int | None = None
    error: str | None = None  # why a sweep's run has no figures (no or unreadable metrics.json)
    device: str | None = None  # GPU name, or cpu
    mixed_precision: str | None = None
    eval_set: str | None = None  # what EM / F1 were measured on (eval_set())
    compile_time_s: float | None = None  # --torch_compile's share of train_time_s
    startup_s: float | None = None  # until the run was built, launch included (metrics.json's startup_s)
    other_cpu_cores: float | None = None  # cores that other processes kept busy while it trained
    load_average_1m: float | None = None
    cpu_count: int | None = None

    @property
    def setup(self) -> str:
        """What the run ran on: samples/s of one workload still differ by device and precision."""
        precision = "fp32" if self.mixed_precision == "no" else self.mixed_precision or "precision ?"
        return f"{self.device or 'device ?'}, {precision}"

    @property
    def workload(self) -> tuple[str | None, int | None]:
        """What must be equal for samples/s to compare: the model and the window length."""
        return self.model, self.max_seq_length


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
    compile_time_s: Stat | None = None
    startup_s: Stat | None = None
    mfu: Stat | None = None
    memory_max_gb: Stat | None = None
    memory_mean_gb: Stat | None = None
    gpu_allocated_max_gb: Stat | None = None
    host_rss_train_max_gb: Stat | None = None
    host_rss_lifetime_max_gb: Stat | None = None
    exact_match: Stat | None = None
    f1: Stat | None = None
    other_cpu_cores: Stat | None = None
    load_average_1m: Stat | None = None

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
    runs: list[str]  # the finished runs the figures are over
    figures: Figures
    failed: list[str] = field(default_factory=list)  # runs without figures, "name: why"
    workload: tuple[str | None, int | None] = (None, None)
    setup: str | None = None  # device and precision (Row.setup)
    eval_set: str | None = None  # what its EM / F1 are over (Row.eval_set)
    speedup: Stat | None = None  # samples/s against the same label's smallest point with a throughput
    efficiency: Stat | None = None  # speedup / (processes / that point's processes)
    scale_base: str | None = None  # that point, e.g. "ddp x1"
    base_processes: int | None = None
    vs_baseline: float | None = None  # median samples/s against the baseline point's
    cpu_count: int | None = None  # the machine's CPUs (Row.cpu_count)

    @property
    def key(self) -> str:
        return f"{self.label} x{self.processes}" + (f" on {self.nodes} nodes" if self.nodes > 1 else "")


# --- reading runs ----------------------------------------------------------------------------


def is_run(path: Path) -> bool:
    """A finished run, or a sweep's run (finished or not: its sweep_point.json is written before it starts)."""
    return (path / "metrics.json").is_file() or (path / POINT_FILE).is_file()


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories in the order given, each once; a parent directory expands to its runs, sorted."""
    runs: dict[Path, Path] = {}
    for raw in paths:
        path = Path(raw)
        if path.is_file():  # most often the run's metrics.json itself
            raise ReportError(f"{path}: a file, not a run directory (give the folder that holds metrics.json)")
        if not path.is_dir():
            raise ReportError(f"{path}: no such run directory")
        children = [path] if is_run(path) else sorted(p for p in path.iterdir() if p.is_dir() and is_run(p))
        if not children:
            raise ReportError(f"{path}: no metrics.json (not a finished run, nor a parent of finished runs)")
        for run in children:
            runs.setdefault(run.resolve(), run)  # the same run named twice (a parent and a child) is one run
    return list(runs.values())


# The figures the report reads, each a finite number or null: a string ("37.7") or NaN from a hand-edited or
# foreign file would otherwise end in a traceback or print `nan` and `nanx` as if measured.
NUMBERS = (
    "train_samples_per_second",
    "train_tokens_per_second",
    "train_runtime_s",
    "startup_s",
    "timed_steps",
    "mfu",
    "exact_match",
    "f1",
    "world_size",
    "global_batch_size",
    "per_device_train_batch_size",
    "max_seq_length",
    "other_processes_cpu_cores",
    "load_average_1m",
)
PER_RANK_NUMBERS = ("peak_memory_gb", "train_host_rss_gb", "peak_host_rss_gb")


def _not_a_number(value: object) -> bool:
    if value is None:
        return False
    return isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)


def load_metrics(run_dir: Path) -> RunMetrics:
    try:
        m = RunMetrics.read(run_dir)
    except MetricsFileError as err:
        raise ReportError(str(err)) from None
    except (TypeError, AttributeError) as err:  # valid JSON, but not the object of keys the schema reads
        raise ReportError(f"{run_dir}: metrics.json is not in the layout this qa_train reads ({err})") from None
    odd = [f.name for f in fields(m) if f.type == "PerRank" and not isinstance(getattr(m, f.name), PerRank)]
    if odd:
        raise ReportError(f"{run_dir}: metrics.json: {', '.join(odd)} not per-rank figures (a file of another layout)")
    bad = [f"{name}={getattr(m, name)!r}" for name in NUMBERS if _not_a_number(getattr(m, name))]
    bad += [
        f"{name}.{end}={getattr(getattr(m, name), end)!r}"
        for name in PER_RANK_NUMBERS
        for end in ("max", "mean")
        if _not_a_number(getattr(getattr(m, name), end))
    ]
    if bad:
        raise ReportError(f"{run_dir}: metrics.json: {', '.join(bad)} not a finite number or null")
    if not isinstance(m.args, dict):
        raise ReportError(f"{run_dir}: metrics.json: args is not the object of the run's flags")
    return m


def eval_set(m: RunMetrics) -> str | None:
    """The evaluation data of a run's EM / F1, None without them: scores of two sets (SQuAD v1.1's against v2.0's,
    whose EM counts the no-answer questions) do not compare."""
    if m.exact_match is None:
        return None
    a = m.args
    data = a.get("dataset_name") or Path(a.get("validation_file") or "?").name
    data += f"/{a['dataset_config_name']}" if a.get("dataset_config_name") else ""
    data += " v2.0" if a.get("version_2_with_negative") or m.squad_v2 else " v1.1"
    return data + (f", first {a['max_eval_samples']}" if a.get("max_eval_samples") else "")


def make_row(run_dir: Path, m: RunMetrics) -> Row:
    offload = m.offload or "none"
    strategy = m.strategy if offload == "none" else f"{m.strategy}+offload({offload})"
    on_gpu = m.peak_memory_source == "cuda_max_allocated"
    name = m.args.get("run_name") or run_dir.name
    # A run that timed no step has no throughput; files from before that was None wrote 0 for it.
    untimed = m.timed_steps == 0
    point = read_point(run_dir)
    return Row(
        run=name,
        run_dir=str(run_dir),
        label=point.label if point else name,
        repeat=point.repeat if point else 1,
        nodes=point.nodes if point else 1,
        strategy=str(strategy),
        processes=int(m.world_size or 0),
        global_batch=m.global_batch_size,
        per_device_batch=m.per_device_train_batch_size,
        samples_per_s=None if untimed else m.train_samples_per_second,
        tokens_per_s=None if untimed else m.train_tokens_per_second,
        train_time_s=m.train_runtime_s,
        mfu=None if untimed else m.mfu,
        memory_source=m.peak_memory_source,
        memory_max_gb=m.peak_memory_gb.max,
        memory_mean_gb=m.peak_memory_gb.mean,
        gpu_allocated_max_gb=m.peak_memory_gb.max if on_gpu else None,
        host_rss_train_max_gb=m.train_host_rss_gb.max,
        host_rss_lifetime_max_gb=m.peak_host_rss_gb.max,
        exact_match=m.exact_match,
        f1=m.f1,
        model=m.args.get("config_name") or m.args.get("model_name_or_path"),
        max_seq_length=m.max_seq_length,
        device=m.device,
        mixed_precision=m.mixed_precision,
        eval_set=eval_set(m),
        compile_time_s=m.compile_time_s,
        startup_s=m.startup_s,
        other_cpu_cores=m.other_processes_cpu_cores,
        load_average_1m=m.load_average_1m,
        cpu_count=m.cpu_count,
    )


def failed_row(run_dir: Path, point: Point, why: str) -> Row:
    """A sweep's run without figures: its point, and why."""
    nothing: dict[str, Any] = {f.name: None for f in fields(Row)}
    return Row(
        **{
            **nothing,
            "run": point.name,
            "run_dir": str(run_dir),
            "label": point.label,
            "repeat": point.repeat,
            "nodes": point.nodes,
            "strategy": point.config,
            "processes": point.processes,
            "error": why,
        }
    )


def read_row(run_dir: Path) -> Row:
    """The run's figures; a sweep's run that has none is a failed row, any other run dir without them is refused."""
    try:
        return make_row(run_dir, load_metrics(run_dir))
    except ReportError as err:
        point = read_point(run_dir)
        if point is None:
            raise
        return failed_row(run_dir, point, run_error(run_dir) or str(err).removeprefix(f"{run_dir}: "))


def run_error(run_dir: Path) -> str | None:
    """The first error line the run said in the bench's launch.log ("rank 0: out of memory at training step 1
    ..."): why a config has no figures is itself a result of a strategy comparison."""
    try:
        text = (run_dir / LAUNCH_LOG).read_text(errors="replace")
    except OSError:
        return None
    return next((line.removeprefix(ERROR_PREFIX) for line in text.splitlines() if line.startswith(ERROR_PREFIX)), None)


def read_rows(run_dirs: list[Path]) -> list[Row]:
    rows = [read_row(d) for d in run_dirs]
    set_apart(rows)
    return rows


# --- what must not be merged or compared --------------------------------------------------------


def _short(model: str | None) -> str:
    return Path(model).name if model else "model ?"


def set_apart(rows: list[Row]) -> None:
    """Relabel rows that the labels alone would wrongly merge or compare: runs of several workloads get theirs
    in the label (a sweep dir rerun with another --max_seq_length keeps the old points); runs of one label on
    several devices or precisions get theirs (a sweep dir rerun on a GPU keeps the CPU points: as repeats or
    a speed-up base they would measure the hardware, not the strategy); the same point from two folders (two
    sweeps side by side) gets its folder; runs still alike (one --run_name in two run dirs) get their own path."""
    done = [r for r in rows if r.error is None]
    workloads = {r.workload for r in done}
    models, seqs = {w[0] for w in workloads}, {w[1] for w in workloads}
    setups: dict[tuple[str, tuple[str | None, int | None]], set[str]] = {}
    for r in done:
        setups.setdefault((r.label, r.workload), set()).add(r.setup)
    for r in done:
        parts = ([_short(r.model)] if len(models) > 1 else []) + ([f"seq {r.max_seq_length}"] if len(seqs) > 1 else [])
        # Across labels another device or precision can be the point (the fp32 ablation); within one it is not.
        parts += [r.setup] if len(setups[r.label, r.workload]) > 1 else []
        if parts:
            r.label = f"{r.label} ({', '.join(parts)})"
    if not _clashes(rows):
        return
    dirs = [Path(r.run_dir).resolve() for r in rows]
    root = Path(os.path.commonpath([d.parent for d in dirs]))
    for r, d in zip(rows, dirs):
        folder = d.parent.relative_to(root).as_posix()
        r.label = r.label if folder == "." else f"{folder}/{r.label}"
    clashing = _clashes(rows)
    for r, d in zip(rows, dirs):
        if _key(r) in clashing:
            r.label = d.relative_to(root).as_posix()


def _key(r: Row) -> tuple[str, int, int, int]:
    return r.label, r.processes, r.nodes, r.repeat


def _clashes(rows: list[Row]) -> set[tuple[str, int, int, int]]:
    return {key for key, n in Counter(_key(r) for r in rows).items() if n > 1}


# --- grouping --------------------------------------------------------------------------------


def group_rows(rows: list[Row]) -> list[Group]:
    """Runs of the same label, processes and nodes become one point; points in the order their labels first
    appear, then by scale. A failed run joins its point (a SLURM point's process count, unknown before the job
    ran, is the finished repeats')."""
    known = {(r.label, r.nodes): r.processes for r in rows if r.error is None}
    buckets: dict[tuple[str, int, int], list[Row]] = {}
    for row in rows:
        processes = row.processes or known.get((row.label, row.nodes), 0)
        buckets.setdefault((row.label, processes, row.nodes), []).append(row)
    order = list(dict.fromkeys(r.label for r in rows))
    groups = []
    for (label, processes, nodes), members in sorted(
        buckets.items(), key=lambda kv: (order.index(kv[0][0]), kv[0][1], kv[0][2])
    ):
        members.sort(key=lambda r: r.repeat)
        done = [r for r in members if r.error is None]
        first = (done or members)[0]
        groups.append(
            Group(
                label,
                first.strategy,
                nodes,
                processes,
                first.global_batch,
                first.per_device_batch,
                first.memory_source,
                [r.run for r in done],
                Figures.of(done),
                [f"{r.run}: {r.error}" for r in members if r.error is not None],
                first.workload,
                first.setup if done else None,
                next((r.eval_set for r in done if r.eval_set), None),
                cpu_count=first.cpu_count,
            )
        )
    return groups


def _rate(g: Group) -> float | None:
    return g.figures.samples_per_s.median if g.figures.samples_per_s else None


def add_scaling(groups: list[Group]) -> None:
    """Speed-up and efficiency of each point against the same label's smallest point with a throughput (itself:
    1.00x); none for a label with a throughput at one scale only (`vs_baseline` compares those). A smaller point
    that failed, or timed no step, is skipped: the base is named (`scale_base`)."""
    for label in dict.fromkeys(g.label for g in groups):
        timed = [g for g in groups if g.label == label and _rate(g) and g.processes]
        if len(timed) < 2:
            continue
        base = min(timed, key=lambda g: (g.processes, g.nodes))
        base_rate = base.figures.samples_per_s
        for g in timed:
            rate = g.figures.samples_per_s
            assert rate is not None and base_rate is not None  # every timed point has a throughput
            g.speedup = rate.over(base_rate.median)
            g.efficiency = g.speedup.over(g.processes / base.processes)
            g.scale_base, g.base_processes = base.key, base.processes


def add_baseline(groups: list[Group], baseline: str | None = None) -> Group | None:
    """Median samples/s of every point of the baseline's workload against the point labelled `baseline`, else
    the first one-process point with a throughput."""
    if baseline is not None:
        base = next((g for g in groups if baseline in (g.label, *g.runs)), None)
        if base is None:
            raise ReportError(
                f"--baseline {baseline}: no run or config of that name among "
                f"{', '.join(dict.fromkeys(g.label for g in groups))}"
            )
    else:
        base = next((g for g in groups if g.processes == 1 and _rate(g)), None)
    base_rate = _rate(base) if base is not None else None
    for g in groups:
        rate = _rate(g)
        same = base is not None and g.workload == base.workload
        g.vs_baseline = round(rate / base_rate, 3) if base_rate and rate is not None and same else None
    return base


def scaling_kind(groups: list[Group]) -> dict[str, str]:
    """Per label swept over process counts: strong (one global batch), weak (one per-device batch) or mixed."""
    kinds = {}
    for label in dict.fromkeys(g.label for g in groups):
        mine = [g for g in groups if g.label == label and g.runs]
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


# --- how far a comparison can be trusted -----------------------------------------------------------

# Cores other processes kept busy, on average, above which a run counts as one measured under load.
BUSY_CORES = 0.5


def _under_load(g: Group) -> str | None:
    busy = g.figures.other_cpu_cores
    if busy is None or busy.hi < BUSY_CORES:
        return None
    load, cores = g.figures.load_average_1m, f" of {g.cpu_count}" if g.cpu_count else ""
    return (
        f"{g.key} ran under load (other processes kept {busy.hi:.1f}{cores} cores busy"
        + (f", load average {load.hi:.1f}" if load else "")
        + ")"
    )


def _doubts(pair: list[Group]) -> list[str]:
    single = [g.key for g in pair if len(g.runs) == 1]
    out = [f"one run of {' and of '.join(single)}"] if single else []
    return out + [why for g in pair if (why := _under_load(g))]


def comparison_warnings(groups: list[Group], base: Group | None) -> list[str]:
    """One line for each comparison (a speed-up, a vs-baseline ratio) that rests on a single repeat or on a run
    measured while other processes took CPU: a 9.45x from one run on a loaded machine is noise until repeated."""
    by_key = {g.key: g for g in groups}
    lines = []
    for g in groups:
        scale_base = by_key.get(g.scale_base or "")
        if g.speedup is not None and scale_base is not None and scale_base is not g:
            doubts = _doubts([g, scale_base])
            if doubts:
                lines.append(
                    f"warning: {g.key} speed-up {g.speedup.median:.2f}x over {scale_base.key} rests on "
                    + "; ".join(doubts)
                )
        if g.vs_baseline is not None and base is not None and g is not base and base is not scale_base:
            doubts = _doubts([g, base])
            if doubts:
                lines.append(
                    f"warning: {g.key} {g.vs_baseline:.2f}x vs baseline {base.key} rests on " + "; ".join(doubts)
                )
    return lines
