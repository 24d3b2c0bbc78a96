"""`qa-train plan`: the planner's command line (`--check` holds finished runs against its estimates)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict

from qa_train.config.parser import OneLineParser
from qa_train.core.errors import refusal_text
from qa_train.model.modeling import position_limit
from qa_train.studies.memory_model import Setup
from qa_train.studies.planner import (
    BUILTIN,
    PlanError,
    attention_of,
    check_recompute,
    describe,
    load_shape_config,
    model_shape,
    plan,
    render,
)
from qa_train.studies.report_data import ReportError


def parse(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog="qa-train plan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model_name_or_path", default=None, help=f"A local model folder, a cached name, or {', '.join(BUILTIN)}."
    )
    p.add_argument("--config_name", default=None, help="A folder with config.json (or a built-in name).")
    p.add_argument("--num_gpus", type=int, default=None, help="Devices in total, all nodes.")
    p.add_argument("--num_nodes", type=int, default=1, help="Nodes they are spread over (default 1).")
    p.add_argument("--gpu_memory_gib", type=float, default=None, help="Memory of one device, GiB (80 for an H100).")
    p.add_argument("--per_device_train_batch_size", type=int, default=None, help="Micro-batch per device.")
    p.add_argument("--max_seq_length", type=int, default=384, help="Tokens per window (default 384).")
    p.add_argument(
        "--mixed_precision",
        choices=("bf16", "fp16", "no"),
        default=None,
        help="bf16 on GPUs by default; CPU training is fp32.",
    )
    p.add_argument(
        "--attn_implementation",
        choices=("auto", "sdpa", "eager"),
        default="auto",
        help="As training's flag: auto (default) is SDPA where the model supports it, else eager.",
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: plan CPU processes (fp32; memory is host RSS above the idle baseline).",
    )
    p.add_argument(
        "--gradient_checkpointing",
        action="store_true",
        help="As training's flag: keep only each layer's input, recompute one layer at a time.",
    )
    p.add_argument("--json", action="store_true", help="Print the estimates as JSON.")
    p.add_argument(
        "--check",
        nargs="+",
        default=None,
        metavar="RUN_DIR",
        help="Instead: the estimate beside the memory finished runs measured (or a parent of runs).",
    )
    opts = p.parse_args(argv)
    problem = None if opts.check else check_flags(opts)
    if problem:
        p.error(problem)
    return opts


def check_flags(opts: argparse.Namespace) -> str | None:
    """The first flag that cannot work, as one line, before anything is imported or built."""
    if bool(opts.model_name_or_path) == bool(opts.config_name):
        return "give exactly one of --model_name_or_path and --config_name"
    for flag in ("num_gpus", "gpu_memory_gib", "per_device_train_batch_size"):
        if getattr(opts, flag) is None:
            return f"--{flag} is required"
    for flag in ("num_gpus", "num_nodes", "gpu_memory_gib", "per_device_train_batch_size", "max_seq_length"):
        # not (x > 0) also refuses nan, which compares false both ways
        if not getattr(opts, flag) > 0:
            return f"--{flag} must be positive, got {getattr(opts, flag)}"
    if not math.isfinite(opts.gpu_memory_gib):  # inf would make every config "fit"
        return f"--gpu_memory_gib must be a finite number of GiB, got {opts.gpu_memory_gib}"
    if opts.num_gpus % opts.num_nodes:
        return f"--num_gpus {opts.num_gpus} does not split evenly over --num_nodes {opts.num_nodes}"
    if opts.device == "cpu" and opts.mixed_precision not in (None, "no"):
        return f"--mixed_precision {opts.mixed_precision}: CPU training here is fp32; drop it with --device cpu"
    return None


def setup_of(opts: argparse.Namespace, attention: str) -> Setup:
    precision = opts.mixed_precision or ("bf16" if opts.device == "cuda" else "no")
    return Setup(
        opts.num_gpus,
        opts.num_nodes,
        opts.per_device_train_batch_size,
        opts.max_seq_length,
        precision,
        attention,
        opts.device,
        opts.gradient_checkpointing,
    )


def main(argv: list[str] | None = None) -> int:
    opts = parse(sys.argv[1:] if argv is None else argv)
    try:
        if opts.check:
            from qa_train.studies.planner_check import check_runs

            print(check_runs(opts.check))
            return 0
        config = load_shape_config(opts.model_name_or_path, opts.config_name)
        limit = position_limit(config)
        if limit and opts.max_seq_length > limit:
            raise PlanError(f"--max_seq_length {opts.max_seq_length}: the model has {limit} position embeddings")
        check_recompute(config, opts.gradient_checkpointing)
        shape, setup = model_shape(config), setup_of(opts, attention_of(config, opts.attn_implementation))
    except (PlanError, ReportError, OSError) as err:
        print(f"qa-train plan: error: {refusal_text(err)}", file=sys.stderr)
        return 2
    estimates, best = plan(shape, setup, opts.gpu_memory_gib)
    if opts.json:
        print(
            json.dumps(
                {
                    "shape": asdict(shape),
                    "setup": asdict(setup),
                    "estimates": [asdict(e) for e in estimates],
                    "recommended": best.config if best else None,
                },
                indent=2,
            )
        )
    else:
        print(describe(opts.model_name_or_path or opts.config_name, shape, setup) + "\n")
        print(render(estimates, best, setup, opts.gpu_memory_gib))
    return 0
