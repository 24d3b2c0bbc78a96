"""The planner beside finished runs: its estimate of training memory per rank against what each run measured.

    qa-train plan --check runs/bench

On CPU the measured figure is host RSS during training above the idle baseline (`train_host_rss_gb` minus
`host_rss_baseline_gb`, rank by rank, the largest); on GPUs it is CUDA's max allocated (`peak_memory_gb`).
A run that cannot be set beside an estimate (a failed sweep run, a model not on this machine, a strategy
the planner has no formula for, a file from before the baseline was recorded) is a row that says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qa_train.config.settings import DEFAULT_MODEL
from qa_train.observe.schema import RunMetrics
from qa_train.studies.memory_model import CONFIGS, GIB, Setup, estimate, unplanned
from qa_train.studies.planner import PlanError, attention_of, load_shape_config, model_shape
from qa_train.studies.report_data import ReportError, find_runs, load_metrics
from qa_train.studies.sweep import read_point

# metrics.json's (strategy, offload) -> the planner's config name.
OFFLOADED = {("zero2", "optimizer"): "zero2_offload", ("zero3", "optimizer+params"): "zero3_offload"}
DASH = "—"


@dataclass
class Check:
    run: str
    config: str
    processes: int | None
    estimate_gib: float | None
    measured_gib: float | None
    padded: bool  # every batch padded to max_seq_length; else the run's batches were shorter than the plan's
    why: str | None = None  # why the estimate or the measurement is missing

    @property
    def ratio(self) -> float | None:
        estimate, measured = self.estimate_gib, self.measured_gib
        return estimate / measured if estimate and measured is not None and measured > 0 else None


def planner_config(m: RunMetrics) -> str:
    strategy, offload = m.strategy or "single", m.offload or "none"
    if offload != "none":
        return OFFLOADED.get((strategy, offload), f"{strategy}+offload({offload})")
    return strategy


def measured_gib(m: RunMetrics) -> tuple[float | None, str | None]:
    """What the run's training took per rank, or None and why: CUDA's peak, or host RSS above the idle baseline
    (largest rank)."""
    if m.peak_memory_source == "cuda_max_allocated":
        peak = m.peak_memory_gb.max
        return peak, None if peak is not None else "metrics.json has no CUDA peak"
    peaks, bases = m.train_host_rss_gb.per_rank, m.host_rss_baseline_gb.per_rank
    if not peaks or not bases:
        return None, "no idle host-RSS baseline in metrics.json (a run from before it was recorded)"
    return max(p - b for p, b in zip(peaks, bases)), None


def grow_vocabulary(model_config, tokenizer_name: str) -> None:
    """A model trained from scratch has at least its tokenizer's vocabulary (training grows vocab_size to it, as
    load_model does), so its embeddings may outgrow the config's. A tokenizer not on this machine leaves the
    config's size: the count of the built-in names' own tokenizers."""
    from transformers import AutoTokenizer

    try:
        tokens = len(AutoTokenizer.from_pretrained(tokenizer_name, local_files_only=True))
    except (OSError, ValueError):
        return
    model_config.vocab_size = max(model_config.vocab_size, tokens)


def check_run(run_dir: Path) -> Check:
    try:
        m = load_metrics(run_dir)
    except ReportError as err:  # a sweep's failed run, among the finished ones of its parent
        return Check(run_dir.name, DASH, None, None, None, False, str(err).removeprefix(f"{run_dir}: "))
    args, config = m.args, planner_config(m)
    name, world = args.get("run_name") or run_dir.name, int(m.world_size or 1)
    if args.get("do_train") is False or m.train_steps == 0:  # an evaluation-only run, or no step left to train
        what = "an evaluation-only run (--do_train false)" if m.train_steps is None else "0 training steps"
        return Check(name, config, world, None, None, False, f"skipped: {what} measured no training memory")
    measured, why = measured_gib(m)
    padded = bool(args.get("pad_to_max_length"))
    if config not in ("single", *CONFIGS):
        return Check(name, config, world, None, measured, padded, f"the planner has no formula for {config}")
    try:
        model_config = load_shape_config(args.get("model_name_or_path"), args.get("config_name"))
        if not args.get("model_name_or_path"):
            grow_vocabulary(model_config, args.get("tokenizer_name") or DEFAULT_MODEL)
        # the kernel the run used: its flag is "auto" by default, eager for models without SDPA (DeBERTa)
        shape, attention = model_shape(model_config), attention_of(model_config, args.get("attn_implementation"))
    except PlanError as err:
        return Check(name, config, world, None, measured, padded, str(err))
    point = read_point(run_dir)
    setup = Setup(
        world,
        point.nodes if point else 1,
        int(m.per_device_train_batch_size or 1),
        int(m.max_seq_length or 384),
        m.mixed_precision or "no",
        attention,
        "cpu" if m.device == "cpu" else "cuda",
        bool(args.get("gradient_checkpointing")),
    )  # absent from runs before the flag: it was off
    why_not = unplanned(config, setup)
    if why_not:
        return Check(name, config, world, None, measured, padded, f"the planner has no formula for {why_not}")
    planned = estimate(config, shape, setup)
    return Check(name, config, world, planned.total / GIB, measured, padded, why)


def check_runs(paths: list[str | Path]) -> str:
    checks = [check_run(d) for d in find_runs(paths)]
    lines = [
        "| run | config | processes | estimate GiB | measured GiB | estimate / measured | note |",
        "|" + "---|" * 7,
    ]
    for c in checks:
        cells = [DASH if v is None else f"{v:.3f}" for v in (c.estimate_gib, c.measured_gib)]
        ratio = DASH if c.ratio is None else f"{c.ratio:.2f}"
        note = c.why or (
            "" if c.ratio is None or c.padded else "planned at full length; dynamic padding ran shorter batches"
        )
        lines.append(
            f"| {c.run} | {c.config} | {DASH if c.processes is None else c.processes} | {cells[0]} | "
            f"{cells[1]} | {ratio} | {note} |"
        )
    return "\n".join(lines)
