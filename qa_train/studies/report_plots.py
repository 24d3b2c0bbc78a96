"""The report's plots: throughput and memory per point with min-max error bars, speed-up against processes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.figure import Figure
from numpy.typing import ArrayLike

from qa_train.observe.recorder import atomic_write
from qa_train.studies.report_data import Group, Stat

GPU_SERIES = "GPU peak allocated"
HOST_SERIES = "host RSS during training"
IDEAL = "ideal (speed-up = process ratio)"
NO_DATA = "no data"


def bar_labels(groups: list[Group]) -> list[str]:
    """Strategy names, or labels where two points share a strategy (an ablation, a sweep); the scale where a
    label appears at more than one."""
    strategies = [g.strategy.replace("+offload", "\n+offload") for g in groups]
    swept = {g.label for g in groups if sum(h.label == g.label for h in groups) > 1}
    if len(set(strategies)) == len(strategies) and not swept:
        return strategies
    labels = []
    for g, strategy in zip(groups, strategies):
        text = g.label if g.label == g.strategy else f"{g.label}\n({strategy})"
        if g.label in swept:
            mine = [h for h in groups if h.label == g.label]
            nodes = len({h.nodes for h in mine}) > 1
            # Processes too where they vary at one node count (a local and a SLURM sweep of one config).
            procs = not nodes or len({(h.nodes, h.processes) for h in mine}) > len({h.nodes for h in mine})
            text += (f"\n{g.nodes} nodes" if nodes else "") + (f"\n{g.processes} proc" if procs else "")
        labels.append(text)
    return labels


def _new_figure(n_bars: int) -> Figure:
    fig = Figure(figsize=(max(5.0, 1.2 * n_bars + 2), 4.4), layout="constrained")
    FigureCanvasAgg(fig)  # Agg explicitly, without touching pyplot's global backend
    return fig


def _heights_and_errors(stats: list[Stat | None]) -> tuple[list[float], list[list[float]]]:
    """Bar heights (medians) and matplotlib's asymmetric yerr (distance down to min, up to max)."""
    heights = [s.median if s else 0.0 for s in stats]
    errors = [[s.median - s.lo if s else 0.0 for s in stats], [s.hi - s.median if s else 0.0 for s in stats]]
    return heights, errors


def _value_labels(ax, bars: BarContainer, stats: list[Stat | None], fmt: str, color: str) -> None:
    """Each bar's median in it; a point without the figure (failed, or no timed step) says so instead of 0."""
    ax.bar_label(
        bars, labels=["" if s is None else f"{s.median:{fmt}}" for s in stats], label_type="center", color=color
    )
    for bar, stat in zip(bars.patches, stats):
        if stat is None:
            ax.annotate(
                NO_DATA,
                (bar.get_x() + bar.get_width() / 2, 0),
                xytext=(0, 6),
                textcoords="offset points",
                ha="center",
                va="bottom",
                rotation=90,
                color="grey",
                fontsize="small",
            )


def throughput_figure(groups: list[Group]) -> Figure:
    fig = _new_figure(len(groups))
    ax = fig.add_subplot()
    stats = [g.figures.samples_per_s for g in groups]
    heights, errors = _heights_and_errors(stats)
    # Positions, not the tick texts: two points with the same text would share one bar.
    bars = ax.bar(range(len(groups)), heights, yerr=errors, capsize=4, label="samples/s", color="tab:blue")
    ax.set_xticks(range(len(groups)), bar_labels(groups))
    _value_labels(ax, bars, stats, ".1f", "white")
    ax.margins(y=0.1)
    ax.set_ylabel("training samples / s (all ranks)")
    repeats = max(len(g.runs) for g in groups)
    ax.set_title("Throughput by strategy" + (f" (median of up to {repeats} runs, bars min-max)" if repeats > 1 else ""))
    return fig


def memory_figure(groups: list[Group]) -> Figure:
    fig = _new_figure(len(groups))
    ax = fig.add_subplot()
    x, width = list(range(len(groups))), 0.38
    any_gpu = any(g.figures.gpu_allocated_max_gb is not None for g in groups)
    gpu, gpu_err = _heights_and_errors([g.figures.gpu_allocated_max_gb for g in groups])
    gpu_label = GPU_SERIES + ("" if any_gpu else " (none: CPU runs)")
    ax.bar([i - width / 2 for i in x], gpu, width, yerr=gpu_err, capsize=3, label=gpu_label, color="tab:green")
    host_stats = [g.figures.host_rss_train_max_gb for g in groups]
    host, host_err = _heights_and_errors(host_stats)
    bars = ax.bar(
        [i + width / 2 for i in x], host, width, yerr=host_err, capsize=3, label=HOST_SERIES, color="tab:orange"
    )
    _value_labels(ax, bars, host_stats, ".2f", "black")
    ax.set_xticks(x, bar_labels(groups))
    ax.margins(y=0.3)  # headroom for the legend and the value labels
    ax.set_ylabel("GiB, max over ranks")
    ax.set_title("Peak memory per rank during training")
    ax.legend()
    return fig


def speedup_figure(groups: list[Group]) -> Figure | None:
    """Speed-up against processes per swept config, with min-max bars and the ideal line; None without a sweep."""
    swept = [
        label
        for label in dict.fromkeys(g.label for g in groups)
        if sum(1 for g in groups if g.label == label and g.speedup is not None) > 1
    ]
    if not swept:
        return None
    fig = _new_figure(4)
    ax = fig.add_subplot()
    counts: dict[int, set[int]] = {}  # the processes of each speed-up base -> the process counts measured against it
    for label in swept:
        mine = [g for g in groups if g.label == label and g.speedup is not None]
        xs = [g.processes for g in mine]
        heights, errors = _heights_and_errors([g.speedup for g in mine])
        ax.errorbar(xs, heights, yerr=errors, marker="o", capsize=4, label=label)
        counts.setdefault(mine[0].base_processes or min(xs), set()).update(xs)
    # Ideal speed-up is the process ratio to each config's own base: one line per base where those differ.
    for base, measured in sorted(counts.items()):
        ticks = sorted(measured)
        ax.plot(
            ticks,
            [n / base for n in ticks],
            linestyle="--",
            color="grey",
            label=IDEAL if len(counts) == 1 else f"{IDEAL}, from {base}",
        )
    ax.set_xticks(sorted(set().union(*counts.values())))
    ax.set_xlabel("processes")
    ax.set_ylabel("speed-up (samples/s vs smallest point)")
    ax.set_title("Scaling")
    ax.legend()
    return fig


def bar_heights(fig: Figure) -> dict[str | None, list[float]]:
    """The plotted bar series as {legend label: bar heights}; what the tests check."""
    ax = fig.axes[0]
    return {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers if isinstance(c, BarContainer)}


def line_data(fig: Figure) -> dict[str | None, tuple[list[float], list[float]]]:
    """The plotted lines as {legend label: (x, y)} (an error-bar series by its data line); what the tests check."""
    ax = fig.axes[0]
    lines = {c.get_label(): c.lines[0] for c in ax.containers if isinstance(c, ErrorbarContainer)}
    # Artist.get_label is typed `object`: set_label stores str(label), or None (no legend entry either way).
    lines.update(
        {
            label: line
            for line in ax.get_lines()
            if isinstance(label := line.get_label(), str) and not label.startswith("_")
        }
    )
    return {label: (_floats(line.get_xdata()), _floats(line.get_ydata())) for label, line in lines.items()}


def _floats(values: ArrayLike) -> list[float]:
    return [float(v) for v in np.asarray(values, dtype=float)]


def save_figure(fig: Figure, path: Path) -> Path:
    """Written beside `path`, then renamed over it: an earlier plot is replaced whole or kept."""
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    return path
