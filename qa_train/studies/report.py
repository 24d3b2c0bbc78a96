"""Compare finished runs: a markdown table, a throughput plot, a memory plot and, for sweeps, a speed-up plot.

    qa-train report RUN_DIR... [--output_dir DIR] [--baseline NAME] [--wandb]

Each RUN_DIR holds a metrics.json; a parent directory stands for every */metrics.json under it (a
`qa_train.studies.bench` sweep, local or SLURM). Runs of one sweep point (config x processes x nodes) are its
repeats: the table gives their median and, where they differ, the min-max; a sweep's run that left no
readable metrics.json counts as failed in its point. Writes DIR/report.md,
DIR/report.json, DIR/throughput.png, DIR/memory.png and, when a config ran at several scales,
DIR/speedup.png (default DIR: ./report).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from dataclasses import asdict
from pathlib import Path

from qa_train.config.parser import OneLineParser
from qa_train.core.errors import refusal_text
from qa_train.observe.recorder import atomic_write_text
from qa_train.studies.report_data import (
    Group,
    ReportError,
    Row,
    Stat,
    build_groups,
    comparison_warnings,
    find_runs,
    scaling_kind,
)
from qa_train.studies.report_plots import memory_figure, save_figure, speedup_figure, throughput_figure

DASH = "—"
MEMORY_SOURCES = {"cuda_max_allocated": "GPU allocated", "host_rss_during_training": "host RSS"}
COLUMNS = (
    "run",
    "strategy",
    "nodes",
    "processes",
    "runs",
    "global batch",
    "train time s",
    "start-up s",
    "samples/s",
    "tokens/s",
    "MFU",
    "peak memory/rank max / mean",
    "host RSS lifetime max",
    "EM / F1",
    "vs baseline",
    "speed-up",
    "efficiency",
)


# --- the table -------------------------------------------------------------------------------


def _num(value: float | None, fmt: str = ",.1f", unit: str = "") -> str:
    return DASH if value is None else f"{value:{fmt}}{unit}"


def _stat(stat: Stat | None, fmt: str = ",.1f", unit: str = "", scale: float = 1.0) -> str:
    """The median, and the min-max where the runs differ: `85.8 (84.0-86.1)`, `1.90x (1.67-2.00x)`."""
    if stat is None:
        return DASH
    median, lo, hi = (f"{v * scale:{fmt}}" for v in (stat.median, stat.lo, stat.hi))
    return f"{median}{unit}" if lo == hi else f"{median}{unit} ({lo}-{hi}{unit})"


def cells(group: Group) -> list[str]:
    f = group.figures
    source = MEMORY_SOURCES.get(group.memory_source or "", group.memory_source or "?")
    memory = (
        f"{_stat(f.memory_max_gb, '.2f')} / {_stat(f.memory_mean_gb, '.2f')} GiB ({source})"
        if f.memory_max_gb is not None
        else DASH
    )
    scores = f"{_stat(f.exact_match)} / {_stat(f.f1)}" if f.exact_match is not None and f.f1 is not None else DASH
    runs = str(len(group.runs)) + (f" + {len(group.failed)} failed" if group.failed else "")
    # A compiled run's training time holds its compile, which its samples/s leave out with the warm-up steps.
    compiling = f" ({_stat(f.compile_time_s, '.1f')} compiling)" if f.compile_time_s is not None else ""
    return [
        group.label,
        group.strategy,
        str(group.nodes),
        str(group.processes),
        runs,
        _num(group.global_batch, "d"),
        _stat(f.train_time_s, ".2f") + compiling,
        _stat(f.startup_s, ".1f"),
        _stat(f.samples_per_s),
        _stat(f.tokens_per_s, ",.0f"),
        _stat(f.mfu, ".1f", "%", 100),
        memory,
        _stat(f.host_rss_lifetime_max_gb, ".2f", " GiB"),
        scores,
        _num(group.vs_baseline, ".2f", "x"),
        _stat(group.speedup, ".2f", "x"),
        _stat(group.efficiency, ".0f", "%", 100),
    ]


def _escape(cell: str) -> str:
    # A | or a line break in a run name or folder (`lr=1e-3|bs=16`) would split its row out of the table.
    return cell.replace("|", "\\|").replace("\n", " ")


def markdown_table(groups: list[Group]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    lines += ["| " + " | ".join(map(_escape, cells(g))) + " |" for g in groups]
    return "\n".join(lines)


def _labels_by(groups: list[Group], attr: str) -> dict[str, list[str]]:
    """The labels of the groups with figures, by the value of one attribute (device and precision, eval set)."""
    out: dict[str, list[str]] = {}
    for g in groups:
        value = getattr(g, attr)
        if g.runs and value and g.label not in out.get(value, []):
            out.setdefault(value, []).append(g.label)
    return out


def _listing(labels: dict[str, list[str]]) -> str:
    return "; ".join(f"{value}: {', '.join(f'`{k}`' for k in keys)}" for value, keys in labels.items())


def notes(groups: list[Group], base: Group | None) -> list[str]:
    """What the columns mean for these runs."""
    repeats = sorted({len(g.runs) for g in groups if g.runs}) or [0]
    out = [
        f"Each row is one point (config x processes x nodes) over its {'/'.join(map(str, repeats))} run(s): "
        "figures are the median, with the min-max in brackets where the runs differ."
    ]
    if base is None:
        out.append("vs baseline: no one-process run with a throughput among these, so none is computed.")
    elif base.figures.samples_per_s is None:
        out.append(f"vs baseline: `{base.key}` has no throughput, so none is computed.")
    else:
        out.append(f"vs baseline: median samples/s relative to `{base.key}`.")
    out.append(
        "Speed-up: median samples/s relative to the same config's smallest point with a throughput (fewest "
        "processes, then nodes); its range divides each run's samples/s by that median. Efficiency: speed-up / "
        "(processes / that point's processes)."
    )
    bases = dict.fromkeys(g.scale_base for g in groups if g.scale_base)
    if bases:
        out.append("Speed-up bases: " + ", ".join(f"`{b}`" for b in bases) + ".")
    kinds = scaling_kind(groups)
    if kinds:
        out.append("Scaling: " + "; ".join(f"{label} {kind}" for label, kind in kinds.items()) + ".")
    if len({g.workload for g in groups if g.runs}) > 1:
        out.append(
            "These runs are of more than one model or sequence length: the labels say which, and speed-up, "
            "efficiency and vs baseline compare only runs of the same one."
        )
    setups = _labels_by(groups, "setup")
    if len(setups) > 1:  # samples/s of another device or precision: vs baseline measures that too
        out.append(
            f"These runs ran on more than one device or precision ({_listing(setups)}): vs baseline "
            "compares across them; repeats and speed-up only within one, the labels say which where a "
            "config has several."
        )
    evals = _labels_by(groups, "eval_set")
    if len(evals) > 1:  # side by side in one column, scores of other questions read as better or worse training
        out.append(
            f"EM / F1 are over more than one evaluation set ({_listing(evals)}): they compare only "
            "within one; SQuAD v2.0's count the no-answer questions (HasAns / NoAns: squad_v2 in "
            "metrics.json)."
        )
    failed = [f for g in groups for f in g.failed]
    if failed:
        out.append(
            "Failed or unfinished runs (no figures; `+ N failed` in the runs column): " + "; ".join(failed) + "."
        )
    out.append(
        "samples/s counts training windows and tokens/s their non-padding tokens, all ranks together. "
        "Peak memory per rank is CUDA's max allocated on GPUs and the host RSS peak during training on CPU; "
        "lifetime host RSS includes loading and evaluation. MFU needs a GPU with a known bf16/fp16 peak."
    )
    return out


def markdown_report(groups: list[Group], base: Group | None, plots: list[str]) -> str:
    images = "\n\n".join(f"![{name}]({name}.png)" for name in plots)
    warnings_ = "\n".join(f"- {line}" for line in comparison_warnings(groups, base))
    parts = ["# qa-train strategy comparison", markdown_table(groups), warnings_, *notes(groups, base), images]
    return "\n\n".join(p for p in parts if p) + "\n"


# --- writing and logging ---------------------------------------------------------------------


# The files a report writes, and what its report.json holds (earlier versions' too): a folder whose report.json has
# these keys is a report's own, to rewrite.
REPORT_FILES = ("report.md", "report.json", "throughput.png", "memory.png", "speedup.png")
REPORT_KEYS = frozenset({"columns", "groups", "rows", "table"})


def check_output_dir(out_dir: Path) -> None:
    """A report rewrites the files of an earlier report, never a file it did not write: a folder that holds one of
    its file names without a report's report.json is refused before any run is read."""
    taken = [name for name in REPORT_FILES if (out_dir / name).exists()]
    if taken and not _written_by_a_report(out_dir / "report.json"):
        raise ReportError(
            f"--output_dir {out_dir}: holds {', '.join(taken)}, which no qa-train report wrote; name a new folder, "
            "or one that an earlier report wrote"
        )


def _written_by_a_report(path: Path) -> bool:
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(payload, dict) and REPORT_KEYS <= payload.keys()


def write_report(rows: list[Row], groups: list[Group], base: Group | None, out_dir: Path) -> dict[str, Path]:
    """Each file replaced whole (written beside, then renamed over), so that a failure leaves no half of one."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figures = {
        "throughput": throughput_figure(groups),
        "memory": memory_figure(groups),
        "speedup": speedup_figure(groups),
    }
    (out_dir / "speedup.png").unlink(missing_ok=True)  # a stale plot from an earlier sweep must not linger
    paths = {"markdown": out_dir / "report.md", "json": out_dir / "report.json"}
    paths.update({name: save_figure(fig, out_dir / f"{name}.png") for name, fig in figures.items() if fig is not None})
    drawn = [name for name, fig in figures.items() if fig is not None]
    atomic_write_text(paths["markdown"], markdown_report(groups, base, drawn))
    payload = {
        "baseline": base.key if base else None,
        "columns": list(COLUMNS),
        "groups": [asdict(g) for g in groups],
        "rows": [asdict(r) for r in rows],
        "table": [cells(g) for g in groups],
        "warnings": comparison_warnings(groups, base),
    }
    atomic_write_text(paths["json"], json.dumps(payload, indent=2) + "\n")
    return paths


def wandb_group(run_dirs: list[str | Path]) -> str:
    """The W&B group of a bench's runs and of their report: named after the folder that holds the runs
    (WANDB_RUN_GROUP wins)."""
    folders = [Path(d).resolve() for d in run_dirs]
    common = Path(os.path.commonpath(folders)) if len(folders) > 1 else folders[0]
    if (common / "metrics.json").is_file():  # a single run directory: its parent holds the bench
        common = common.parent
    return os.environ.get("WANDB_RUN_GROUP") or f"bench-{common.name}"


def log_to_wandb(groups: list[Group], paths: dict[str, Path], project: str, group: str) -> None:
    """Table and plots to W&B, in the bench's group beside its runs, started as training runs start theirs
    (offline without credentials or an answering server); a failure only warns."""
    from qa_train.observe.trackers import start_wandb_run

    out = paths["markdown"].parent
    try:
        import wandb

        run = start_wandb_run(
            out, project=project, name="strategy-report", job_type="report", group=group, dir=str(out)
        )
        table = wandb.Table(columns=list(COLUMNS), data=[cells(g) for g in groups])
        images = {
            f"report/{name}": wandb.Image(str(paths[name]))
            for name in ("throughput", "memory", "speedup")
            if name in paths
        }
        run.log({"report/table": table, **images})
        run.finish()
    except Exception as err:  # noqa: BLE001 - the report files are written; W&B is a bonus
        warnings.warn(f"W&B logging of the report failed: {err}", stacklevel=2)


def build_report(
    run_dirs: list[str | Path],
    out_dir: str | Path = "report",
    baseline: str | None = None,
    wandb_project: str | None = None,
) -> tuple[list[Group], dict[str, Path]]:
    """The report's files (and its W&B run); the groups, with `warnings` naming the comparisons to doubt."""
    check_output_dir(Path(out_dir))
    rows, groups, base = build_groups(find_runs(run_dirs), baseline)
    try:
        paths = write_report(rows, groups, base, Path(out_dir))
    except OSError as err:  # a typo'd or unwritable --output_dir is the user's to fix, not a traceback
        raise ReportError(
            f"--output_dir {out_dir}: cannot write the report there ({err.strerror or err}: {err.filename})"
        ) from None
    if wandb_project:
        log_to_wandb(groups, paths, wandb_project, wandb_group(run_dirs))
    return groups, paths


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="qa-train report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", nargs="+", help="Run directories (with metrics.json) or their parent.")
    # --output_dir as bench, predict and consolidate name a folder they write; --output, the earlier name, still works.
    p.add_argument(
        "--output_dir",
        "--output",
        dest="output",
        default="report",
        help="Where report.md, report.json and the plots go (default: ./report).",
    )
    p.add_argument(
        "--baseline",
        default=None,
        help="Config or run name for the vs-baseline column (default: the first 1-process point).",
    )
    p.add_argument("--wandb", action="store_true", help="Also log the table and plots to W&B.")
    p.add_argument("--wandb_project", default=None, help="The W&B project of --wandb (default: qa-train).")
    opts = p.parse_args(argv)
    problem = check_options(opts)
    if problem:
        p.error(problem)
    try:
        groups, paths = build_report(
            opts.run_dirs, opts.output, opts.baseline, (opts.wandb_project or "qa-train") if opts.wandb else None
        )
    except (ReportError, OSError) as err:
        print(f"qa-train report: error: {refusal_text(err)}", file=sys.stderr)
        return 2
    print(markdown_table(groups))
    print_warnings(paths)
    print(f"\nwrote {', '.join(str(p) for p in paths.values())}")
    return 0


def check_options(opts: argparse.Namespace) -> str | None:
    """The first flag that cannot work, as one line, or None."""
    # What an unset shell variable gives: Path("") is the working directory, which the report would fill.
    if not opts.output.strip():
        return "--output_dir: is empty (an unset shell variable?); name the report's folder, e.g. --output_dir report"
    if opts.wandb_project is not None and not opts.wandb:
        return "--wandb_project: names the W&B project of --wandb, which is not given: add --wandb, or drop it"
    return None


def print_warnings(paths: dict[str, Path]) -> None:
    """The comparisons to doubt, one line each, right under the table (from report.json, as written)."""
    for line in json.loads(paths["json"].read_text())["warnings"]:
        print(line)
