"""Compare finished runs: a markdown table, a throughput plot and a memory plot.

    python -m qa_train.report RUN_DIR... [--output DIR] [--baseline RUN_NAME] [--wandb]

Each RUN_DIR holds a metrics.json; a parent directory stands for every */metrics.json under it.
Writes DIR/report.md, DIR/report.json, DIR/throughput.png and DIR/memory.png (default DIR: ./report).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from qa_train.schema import MetricsFileError, RunMetrics

DASH = "—"
GPU_SERIES = "GPU peak allocated"
HOST_SERIES = "host RSS during training"
MEMORY_SOURCES = {"cuda_max_allocated": "GPU allocated", "host_rss_during_training": "host RSS"}
COLUMNS = ("run", "strategy", "processes", "global batch", "samples/s", "tokens/s", "MFU",
           "peak memory/rank max / mean", "host RSS lifetime max", "EM / F1", "speed-up")


class ReportError(ValueError):
    """A run directory that cannot be reported; the message names it."""


@dataclass
class Row:
    """One run as the report shows it; raw numbers, formatted only when written out."""

    run: str
    run_dir: str
    strategy: str
    processes: int
    global_batch: int | None
    samples_per_s: float | None
    tokens_per_s: float | None
    mfu: float | None
    memory_source: str | None
    memory_max_gb: float | None
    memory_mean_gb: float | None
    gpu_allocated_max_gb: float | None
    host_rss_train_max_gb: float | None
    host_rss_lifetime_max_gb: float | None
    exact_match: float | None
    f1: float | None
    speedup: float | None = None


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
    return Row(
        run=m.args.get("run_name") or run_dir.name, run_dir=str(run_dir), strategy=str(strategy),
        processes=int(m.world_size or 0), global_batch=m.global_batch_size,
        samples_per_s=m.train_samples_per_second, tokens_per_s=m.train_tokens_per_second,
        mfu=m.mfu, memory_source=m.peak_memory_source,
        memory_max_gb=m.peak_memory_gb.max, memory_mean_gb=m.peak_memory_gb.mean,
        gpu_allocated_max_gb=m.peak_memory_gb.max if on_gpu else None,
        host_rss_train_max_gb=m.train_host_rss_gb.max, host_rss_lifetime_max_gb=m.peak_host_rss_gb.max,
        exact_match=m.exact_match, f1=m.f1,
    )


def add_speedups(rows: list[Row], baseline: str | None = None) -> Row | None:
    """Samples/s relative to the baseline: the run named `baseline`, else the first one-process run."""
    if baseline is not None:
        base = next((r for r in rows if r.run == baseline), None)
        if base is None:
            raise ReportError(f"--baseline {baseline}: no run of that name among {', '.join(r.run for r in rows)}")
    else:
        base = next((r for r in rows if r.processes == 1), None)
    for row in rows:
        ok = base is not None and base.samples_per_s and row.samples_per_s is not None
        row.speedup = round(row.samples_per_s / base.samples_per_s, 3) if ok else None
    return base


def build_rows(run_dirs: list[Path], baseline: str | None = None) -> tuple[list[Row], Row | None]:
    rows = [make_row(d, load_metrics(d)) for d in run_dirs]
    return rows, add_speedups(rows, baseline)


# --- the table -------------------------------------------------------------------------------

def _num(value: float | None, fmt: str = ",.1f", unit: str = "") -> str:
    return DASH if value is None else f"{value:{fmt}}{unit}"


def cells(row: Row) -> list[str]:
    source = MEMORY_SOURCES.get(row.memory_source or "", row.memory_source or "?")
    memory = (f"{_num(row.memory_max_gb, '.2f')} / {_num(row.memory_mean_gb, '.2f')} GiB ({source})"
              if row.memory_max_gb is not None else DASH)
    scores = f"{row.exact_match:.1f} / {row.f1:.1f}" if row.exact_match is not None and row.f1 is not None else DASH
    return [row.run, row.strategy, str(row.processes), _num(row.global_batch, "d"), _num(row.samples_per_s),
            _num(row.tokens_per_s, ",.0f"), _num(None if row.mfu is None else 100 * row.mfu, ".1f", "%"), memory,
            _num(row.host_rss_lifetime_max_gb, ".2f", " GiB"), scores, _num(row.speedup, ".2f", "x")]


def markdown_table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def markdown_report(rows: list[Row], base: Row | None) -> str:
    note = (f"Speed-up: samples/s relative to `{base.run}` ({base.processes} process)." if base is not None
            else "Speed-up: no single-process run among these, so none is computed.")
    return "\n\n".join([
        "# qa-train strategy comparison", markdown_table(rows), note,
        "Peak memory per rank is CUDA's max allocated on GPUs and the host RSS sampled during training on CPU; "
        "lifetime host RSS includes loading and evaluation. MFU needs a GPU with a known bf16/fp16 peak.",
        "![throughput](throughput.png)\n\n![memory](memory.png)",
    ]) + "\n"


# --- the plots -------------------------------------------------------------------------------

def bar_labels(rows: list[Row]) -> list[str]:
    """Strategy names, or run names where two runs share a strategy (an ablation)."""
    strategies = [r.strategy.replace("+offload", "\n+offload") for r in rows]
    if len(set(strategies)) == len(strategies):
        return strategies
    return [f"{r.run}\n({s})" for r, s in zip(rows, strategies)]


def _new_figure(n_runs: int) -> Figure:
    fig = Figure(figsize=(max(5.0, 1.4 * n_runs + 2), 4.2), layout="constrained")
    FigureCanvasAgg(fig)  # Agg explicitly, without touching pyplot's global backend
    return fig


def throughput_figure(rows: list[Row]) -> Figure:
    fig = _new_figure(len(rows))
    ax = fig.add_subplot()
    bars = ax.bar(bar_labels(rows), [r.samples_per_s or 0.0 for r in rows], label="samples/s", color="tab:blue")
    ax.bar_label(bars, fmt="%.1f")
    ax.margins(y=0.1)
    ax.set_ylabel("training samples / s (all ranks)")
    ax.set_title("Throughput by strategy")
    return fig


def memory_figure(rows: list[Row]) -> Figure:
    fig = _new_figure(len(rows))
    ax = fig.add_subplot()
    x, width = list(range(len(rows))), 0.38
    gpu = [r.gpu_allocated_max_gb or 0.0 for r in rows]
    any_gpu = any(r.gpu_allocated_max_gb is not None for r in rows)
    gpu_label = GPU_SERIES + ("" if any_gpu else " (none: CPU runs)")
    ax.bar([i - width / 2 for i in x], gpu, width, label=gpu_label, color="tab:green")
    host = [r.host_rss_train_max_gb or 0.0 for r in rows]
    bars = ax.bar([i + width / 2 for i in x], host, width, label=HOST_SERIES, color="tab:orange")
    ax.bar_label(bars, fmt="%.2f")
    ax.set_xticks(x, bar_labels(rows))
    ax.margins(y=0.3)  # headroom for the legend and the value labels
    ax.set_ylabel("GiB, max over ranks")
    ax.set_title("Peak memory per rank during training")
    ax.legend()
    return fig


def bar_heights(fig: Figure) -> dict[str, list[float]]:
    """The plotted series as {legend label: bar heights}; what the tests check."""
    ax = fig.axes[0]
    return {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}


def save_figure(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path


# --- writing and logging ---------------------------------------------------------------------

def write_report(rows: list[Row], base: Row | None, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out_dir / "report.md", "json": out_dir / "report.json",
             "throughput": save_figure(throughput_figure(rows), out_dir / "throughput.png"),
             "memory": save_figure(memory_figure(rows), out_dir / "memory.png")}
    paths["markdown"].write_text(markdown_report(rows, base))
    payload = {"baseline": base.run if base else None, "columns": list(COLUMNS),
               "rows": [asdict(r) for r in rows], "table": [cells(r) for r in rows]}
    paths["json"].write_text(json.dumps(payload, indent=2) + "\n")
    return paths


def log_to_wandb(rows: list[Row], paths: dict[str, Path], project: str) -> None:
    """Table and plots to W&B; offline without credentials, and a failure only warns."""
    from qa_train.trackers import has_wandb_credentials

    mode = os.environ.get("WANDB_MODE") or ("online" if has_wandb_credentials() else "offline")
    try:
        import wandb

        run = wandb.init(project=project, name="strategy-report", job_type="report", mode=mode,
                         dir=str(paths["markdown"].parent))
        table = wandb.Table(columns=list(COLUMNS), data=[cells(r) for r in rows])
        run.log({"report/table": table, "report/throughput": wandb.Image(str(paths["throughput"])),
                 "report/memory": wandb.Image(str(paths["memory"]))})
        run.finish()
    except Exception as err:  # noqa: BLE001 - the report files are written; W&B is a bonus
        warnings.warn(f"W&B logging of the report failed: {err}", stacklevel=2)


def build_report(run_dirs: list[str | Path], out_dir: str | Path = "report", baseline: str | None = None,
                 wandb_project: str | None = None) -> tuple[list[Row], dict[str, Path]]:
    rows, base = build_rows(find_runs(run_dirs), baseline)
    paths = write_report(rows, base, Path(out_dir))
    if wandb_project:
        log_to_wandb(rows, paths, wandb_project)
    return rows, paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m qa_train.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", nargs="+", help="Run directories (with metrics.json) or their parent.")
    p.add_argument("--output", default="report", help="Where report.md, report.json and the plots go.")
    p.add_argument("--baseline", default=None, help="Run name for speed-up (default: first 1-process run).")
    p.add_argument("--wandb", action="store_true", help="Also log the table and plots to W&B.")
    p.add_argument("--wandb_project", default="qa-train")
    opts = p.parse_args(argv)
    try:
        rows, paths = build_report(opts.run_dirs, opts.output, opts.baseline,
                                   opts.wandb_project if opts.wandb else None)
    except ReportError as err:
        print(f"qa_train.report: error: {err}", file=sys.stderr)
        return 2
    print(markdown_table(rows))
    print(f"\nwrote {', '.join(str(p) for p in paths.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
