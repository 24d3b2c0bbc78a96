"""One run's history on one page, from its step log (train_log.jsonl: what every tracker was sent):

    qa-train dashboard RUN_DIR [--output RUN_DIR/history.png]

Loss, evaluation F1 / exact match and training samples/s against the optimizer step. The same history
is in the run's W&B and TensorBoard records; this needs neither.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from qa_train.config.outputdir import check_output_file
from qa_train.config.parser import OneLineParser
from qa_train.config.settings import ConfigError
from qa_train.core.errors import refusal_text
from qa_train.observe.recorder import read_step_log

PANELS = (("train/loss", "training loss"), ("eval/f1", "evaluation"), ("throughput/samples_per_second", "samples/s"))


def read_history(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{key: [(step, value), ...]} in logged order. The run may still be writing (or was killed mid-write), so a
    torn last line is skipped with a warning, as a resume drops it. ValueError: one line naming what is wrong."""
    log = step_log(run_dir)
    series: dict[str, list[tuple[int, float]]] = {}
    for number, row in enumerate(read_step_log(log), 1):
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueError(f"{log}: record {number} has no integer step: {str(row)[:80]}")
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)):
                series.setdefault(key, []).append((step, float(value)))
    return series


def step_log(run_dir: Path) -> Path:
    """RUN_DIR's train_log.jsonl, or ValueError naming RUN_DIR, as `qa-train report` names a run dir it cannot use."""
    log = run_dir / "train_log.jsonl"
    if not run_dir.exists():
        raise ValueError(f"{run_dir}: no such run directory")
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir}: a file, not a run directory (give the folder that holds train_log.jsonl)")
    if log.is_dir():
        raise ValueError(f"{log}: is a directory, not a file")
    if not log.exists():
        raise ValueError(f"{run_dir}: holds no train_log.jsonl (not a qa_train run's output dir)")
    return log


def history_figure(series: dict[str, list[tuple[int, float]]], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(13, 3.6))
    for ax, (key, label) in zip(axes, PANELS):
        keys = [key, "eval/exact_match"] if key == "eval/f1" else [key]
        for k in keys:
            points = series.get(k, [])
            if points:
                ax.plot(
                    *zip(*points), marker="o" if k.startswith("eval/") else None, markersize=3, label=k.split("/")[-1]
                )
        ax.set_xlabel("step")
        ax.set_title(label)
        ax.grid(alpha=0.3)
        if len(keys) > 1 and ax.get_lines():  # a run before its first evaluation has nothing to label
            ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def check_output(out: Path) -> None:
    """--output as a file matplotlib can write: it adds .png to a name without a suffix, and refuses other types
    only once the figure is drawn."""
    from matplotlib.backend_bases import FigureCanvasBase

    check_output_file(out, "--output")
    if out.suffix[1:].lower() not in FigureCanvasBase.get_supported_filetypes():
        raise ConfigError(f"--output {out}: not the name of an image type matplotlib writes (.png, .svg, .pdf, ...)")


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(
        prog="qa-train dashboard", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("run_dir", type=Path)
    p.add_argument("--output", type=Path, default=None, help="PNG to write (default: RUN_DIR/history.png).")
    opts = p.parse_args(argv)
    out = opts.output or opts.run_dir / "history.png"
    try:
        series = read_history(opts.run_dir)
        check_output(out)  # the default too: RUN_DIR may be another user's, or on a read-only share
    except (OSError, ValueError) as err:
        print(f"qa-train dashboard: error: {refusal_text(err)}", file=sys.stderr)
        return 2
    if "train/loss" not in series:
        print(
            f"qa-train dashboard: error: {opts.run_dir / 'train_log.jsonl'}: no training steps logged", file=sys.stderr
        )
        return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    history_figure(series, opts.run_dir.name).savefig(out, dpi=100)
    print(f"wrote {out}")
    return 0
