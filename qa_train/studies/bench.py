"""Benchmark strategies: the same flags and step count under each accelerate config, then one report.

    qa-train bench [--configs single ddp zero2 ...] [--num_processes 1 2 4] [--repeats 3]
                             [--scaling weak|strong [--global_batch_size G]] [--cpu]
                             [--output_dir runs/bench] [--max_train_steps 30] [-- qa_train flags]
    qa-train bench --slurm --nodes 1 2 [--procs_per_node P] [...]   # one SLURM job per point
    qa-train bench --ablation [...]     # each speed feature flipped alone, one process

Every config runs at every process count (`single` at one), `--repeats` times, all points once before
any repeats (so a slow spell of a shared machine spreads over every config). Weak scaling (the
default) keeps the per-device batch; strong scaling keeps the global batch and divides the per-device
batch by the process count. Runs go one at a time through `qa-train launch` (so every rank
has the machine to itself), each into OUTPUT_DIR/<config>-p<N>-r<k> with its log in launch.log there.
A failed run is reported and the others still run; the exit status is 1 if any failed. Ctrl-C stops
the run in progress and reports the ones before it (exit 130). Without model/data flags after `--`, the
bundled tiny BERT and demo data are used; `--max_train_steps`, `--output_dir`, `--run_name` and
`--overwrite_output_dir` after `--` are refused, as the bench sets them for every run. The report
(OUTPUT_DIR/report) covers this command's runs (a failed one as its point's `+ N failed`) and gives each point's median and min-max over its repeats, and
speed-up and efficiency against the same config's smallest point with a throughput; under the table, one
warning line for each comparison that rests on a single repeat or on a run that other processes slowed (each
run's metrics.json records the machine's load). Every run logs to W&B (offline without credentials) in one
group, its config as job type, unless `-- --report_to none`. A rerun into the same OUTPUT_DIR replaces the
folders of the points it runs and leaves the others.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

from qa_train.config.outputdir import check_output_folder
from qa_train.config.parser import OneLineParser
from qa_train.config.settings import DEMO_MODEL_DIR, DEMO_TRAIN_FILE, DEMO_VALIDATION_FILE, ConfigError
from qa_train.core.errors import refusal_text
from qa_train.strategy import launch, supervise
from qa_train.strategy.checks import cpu_threads
from qa_train.studies import report, report_data, slurm_sweep
from qa_train.studies.sweep import SCALINGS, Point, SweepError, flag_value, strong_scaling, with_repeats

CONFIG_DIR = Path(__file__).resolve().parents[2] / "accelerate_configs"
NO_EVALUATION = "--no_eval without --eval_on_start"
# (flags that replace it, default flags): a default model or dataset is dropped as a whole as soon
# as the user names any model or dataset flag, so `-- --model_name_or_path bert-base-uncased` is enough.
DEFAULT_GROUPS: list[tuple[set[str], list[str]]] = [
    (
        {"model_name_or_path", "config_name", "tokenizer_name"},
        ["--config_name", str(DEMO_MODEL_DIR), "--tokenizer_name", str(DEMO_MODEL_DIR)],
    ),
    ({"dataset_name", "dataset_config_name", "train_file", "validation_file"}, ["--train_file", str(DEMO_TRAIN_FILE)]),
    # Evaluation's own, dropped too where the runs evaluate nothing (training refuses flags nothing reads).
    (
        {"dataset_name", "dataset_config_name", "train_file", "validation_file", NO_EVALUATION},
        ["--validation_file", str(DEMO_VALIDATION_FILE)],
    ),
    ({"per_device_eval_batch_size", NO_EVALUATION}, ["--per_device_eval_batch_size", "32"]),
]
# Sized like tests/conftest.py's tiny_flags; later flags win, so anything after `--` overrides these.
DEFAULT_FLAGS = [
    "--max_seq_length",
    "192",
    "--doc_stride",
    "64",
    "--per_device_train_batch_size",
    "8",
    "--learning_rate",
    "1e-3",
    "--save_final_model",
    "false",
    "--logging_steps",
    "10",
]
LOG_TAIL_LINES = 25


@dataclass
class Outcome:
    point: Point
    run_dir: Path
    log: Path
    returncode: int

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and (self.run_dir / "metrics.json").is_file()


def available_configs() -> list[str]:
    """Every accelerate config, the single-process baseline first."""
    names = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    return sorted(names, key=lambda n: n != "single")


def model_and_data_defaults(user_flags: list[str]) -> list[str]:
    given = {f[2:].split("=")[0] for f in user_flags if f.startswith("--")}
    if "no_eval" in given and "eval_on_start" not in given:
        given.add(NO_EVALUATION)
    return [flag for names, defaults in DEFAULT_GROUPS if not given & names for flag in defaults]


def strategy_plans(configs: list[str], process_counts: list[int], on_cpu: bool) -> list[Point]:
    """Each config at each process count; `single` runs one process whatever the counts."""
    plans = []
    for name in dict.fromkeys(configs):  # a config named twice would run twice into one folder
        if not (CONFIG_DIR / f"{name}.yaml").is_file():  # refused input: exit 2, as everywhere else
            raise SweepError(f"--configs {name}: no {CONFIG_DIR / name}.yaml (have: {', '.join(available_configs())})")
        try:
            cfg = launch.read_config(str(CONFIG_DIR / f"{name}.yaml"), launch_dir=CONFIG_DIR.parent)
        except launch.LaunchConfigError as err:
            raise SweepError(str(err)) from None
        refusal = launch.cpu_refusal(cfg)
        if on_cpu and refusal:  # runs that need devices this machine lacks are skipped, with the reason
            print(f"skipping {name} on CPU: {refusal}", flush=True)
            continue
        single = str(cfg.get("distributed_type", "NO")) == "NO"
        plans += [Point(name, name, n) for n in ([1] if single else process_counts)]
    return plans


def ablation_plans(on_cpu: bool, train_flags: list[str] | None = None) -> list[Point]:
    """One process: the defaults, then each speed feature flipped alone (off if on by default, else on). With
    `train_flags`, --gradient_checkpointing is left out (with the reason) for a model whose family lacks it."""
    flips = [
        ("pad-to-max", ["--pad_to_max_length", "true"]),  # dynamic padding off
        ("eager-attention", ["--attn_implementation", "eager"]),  # SDPA off
        ("sync-every-step", ["--logging_steps", "1"]),  # loss read back every step
        ("group-by-length", ["--group_by_length", "true"]),
        ("torch-compile", ["--torch_compile", "true"]),
    ]
    if on_cpu:
        flips.append(("workers-2", ["--dataloader_num_workers", "2"]))
    else:  # features that only exist on CUDA, first: a run cut short by a time limit still measured them
        flips = [
            ("fp32", ["--mixed_precision", "no"]),
            ("unfused-adamw", ["--optim", "adamw_torch"]),
            ("no-workers", ["--dataloader_num_workers", "0"]),
            *flips,
        ]
    # Not a speed feature: what its memory saving costs in speed. Last, so a run cut short keeps the others.
    why_not = recompute_refusal(train_flags) if train_flags is not None else None
    if why_not:  # training would refuse it at its start, after every other run: a failed ablation, exit 1
        print(f"skipping gradient-checkpointing: {why_not}", flush=True)
    else:
        flips.append(("gradient-checkpointing", ["--gradient_checkpointing", "true"]))
    return [Point("default", "single", 1)] + [Point(name, "single", 1, extra=flags) for name, flags in flips]


def recompute_refusal(train_flags: list[str]) -> str | None:
    """Why the model `train_flags` name cannot take --gradient_checkpointing, or None; None too where its config is
    not on this machine or has no QA class (the runs themselves then say so)."""
    from qa_train.model.modeling import checkpointing_unsupported
    from qa_train.studies.planner import PlanError, load_shape_config

    model, config_name = flag_value(train_flags, "model_name_or_path"), flag_value(train_flags, "config_name")
    if not (model or config_name):
        return None
    try:
        return checkpointing_unsupported(load_shape_config(model, config_name))
    except (PlanError, ConfigError):
        return None


def run_one(point: Point, opts: argparse.Namespace, train_flags: list[str], port: int) -> Outcome:
    run_dir = (Path(opts.output_dir) / point.name).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.json").unlink(missing_ok=True)  # a stale file must not pass for this run's result
    point.write(run_dir)
    cmd = [
        sys.executable,
        "-m",
        "qa_train.cli",
        "launch",
        *(["--cpu"] if opts.cpu else []),
        "--config_file",
        str(CONFIG_DIR / f"{point.config}.yaml"),
        "--num_processes",
        str(point.processes),
        "--main_process_port",
        str(port),
        "--",
        *train_flags,
        *point.extra,
        "--max_train_steps",
        str(opts.max_train_steps),
        "--output_dir",
        str(run_dir),
        "--run_name",
        point.name,
        "--overwrite_output_dir",
    ]  # the bench owns its run folders: a rerun replaces them
    log, env = run_dir / report_data.LAUNCH_LOG, run_env(point, opts)
    threads = f", {env['OMP_NUM_THREADS']} thread(s) each" if opts.cpu else ""
    print(f"[bench] {point.name}: {point.config} x {point.processes} process(es){threads}, log {log}", flush=True)
    with log.open("w") as f:
        f.write("+ " + " ".join(cmd) + "\n")
        f.flush()
        code = _run_logged(cmd, env, f, opts.timeout_s)
    return Outcome(point, run_dir, log, code)


def run_env(point: Point, opts: argparse.Namespace) -> dict[str, str]:
    """The run's environment: its CPU threads, and its W&B group (the bench's, shared with the report's run)
    and job type (its config), so the W&B dashboard compares the configs side by side."""
    env = thread_env(point.processes, opts.cpu)
    env["WANDB_RUN_GROUP"] = env.get("WANDB_RUN_GROUP") or report.wandb_group([opts.output_dir])
    env["WANDB_JOB_TYPE"] = point.config
    return env


def thread_env(processes: int, on_cpu: bool) -> dict[str, str]:
    """On CPU, split the cores evenly between ranks for every config. torchrun would give each DDP
    rank 1 thread while a lone process takes every core; unequal splits skew the comparison, and an
    OMP_NUM_THREADS the user set is kept as is."""
    env = dict(os.environ)
    if on_cpu and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(cpu_threads(processes))
    return env


def _run_logged(cmd: list[str], env: dict[str, str], log: IO[str], timeout_s: float) -> int:
    # From the repo root: the configs name their DeepSpeed JSON relative to it. Own session, so Ctrl-C in the
    # terminal reaches only the bench, which then ends the run itself.
    proc = subprocess.Popen(
        cmd, cwd=CONFIG_DIR.parent, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        proc.wait()
        log.write(f"\n[bench] killed after {timeout_s} s\n")
        return 124
    except BaseException:  # Ctrl-C: the ranks are in their own session and would not see it
        _kill_tree(proc.pid)
        raise


def _kill_tree(pid: int) -> None:
    """SIGKILL the launcher and every process under it. Its launch runs in a session of its own (and torchrun
    starts each rank in another), so killing the launcher's group would reach the launcher alone: its ranks would
    get only the parent-death SIGTERM, a stop request, and train on unsupervised to their next logged step (or
    forever, if they hung) beside the bench's next run."""
    try:
        top = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    supervise.kill_all([top, *supervise.descendants(top)])  # listed before any dies and its children move to init


def describe_failure(outcome: Outcome) -> str:
    lines = outcome.log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
    why = f"exit {outcome.returncode}" if outcome.returncode else "exit 0 but no metrics.json"
    tail = "\n".join(f"    {line}" for line in lines)
    return f"[bench] FAILED {outcome.point.name} ({why}); log {outcome.log}, last lines:\n{tail}"


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    cut = argv.index("--") if "--" in argv else len(argv)
    p = OneLineParser(prog="qa-train bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--configs",
        nargs="+",
        default=None,
        help="Config names from accelerate_configs/ (default: all that can run here).",
    )
    p.add_argument(
        "--num_processes",
        type=int,
        nargs="+",
        default=None,
        help="Process counts for multi-process configs, each a point of the sweep "
        "(default: 2 on CPU, every visible GPU).",
    )
    p.add_argument("--repeats", type=int, default=1, help="Runs per point; the report gives median and min-max.")
    p.add_argument(
        "--scaling",
        choices=SCALINGS,
        default="weak",
        help="weak: every process keeps the per-device batch (the global batch grows); strong: the "
        "global batch stays fixed and the per-device batch is divided by the process count.",
    )
    p.add_argument(
        "--global_batch_size",
        type=int,
        default=None,
        help="Strong scaling's fixed global batch (default: the per-device batch x accumulation at "
        "the smallest process count).",
    )
    p.add_argument("--cpu", action="store_true", help="Run on CPU processes (default when no GPU is visible).")
    p.add_argument("--output_dir", default="runs/bench", help="One sub-directory per run, plus report/.")
    p.add_argument("--max_train_steps", type=int, default=30, help="Optimizer steps per run.")
    p.add_argument(
        "--ablation",
        action="store_true",
        help="Instead of strategies: one process with the defaults, then each speed feature flipped alone.",
    )
    p.add_argument("--timeout_s", type=float, default=3600, help="Per-run wall-clock limit.")
    p.add_argument("--wandb", action="store_true", help="Also log the report to W&B.")
    slurm_sweep.add_arguments(p)
    opts = p.parse_args(slurm_sweep.attach_sbatch_args(argv[:cut]))
    train_flags = argv[cut + 1 :]
    problem = check_options(opts) or owned_flag(train_flags)
    if problem:
        p.error(problem)
    return opts, train_flags


# The training flags each run gets from the bench, after the user's (so a user's would be silently overridden):
# the bench flag that sets each, or why it is the bench's.
OWNED_FLAGS = {
    "max_train_steps": "use qa-train bench --max_train_steps (before --)",
    "output_dir": "each run writes to a folder of qa-train bench --output_dir (before --)",
    "run_name": "the bench names each run after its config and process count",
    "overwrite_output_dir": "the bench always replaces its own run folders",
}


def owned_flag(train_flags: list[str]) -> str | None:
    """A flag after `--` that the bench sets for every run itself, as one line, or None."""
    for token in train_flags:
        name = token[2:].split("=", 1)[0].replace("-", "_") if token.startswith("--") else ""
        if name in OWNED_FLAGS:
            return f"--{name} after --: the bench sets it for every run; {OWNED_FLAGS[name]}"
    return None


def check_options(opts: argparse.Namespace) -> str | None:
    """The first flag combination that cannot work, as one line, or None."""
    if opts.ablation and opts.configs:
        return "--ablation runs the single config only; drop --configs"
    if opts.ablation and (opts.slurm or opts.scaling == "strong" or opts.num_processes):
        return "--ablation runs one local process per feature; drop --slurm, --scaling strong and --num_processes"
    if opts.max_train_steps <= 0:
        return f"--max_train_steps must be positive, got {opts.max_train_steps}"
    if opts.repeats < 1:
        return f"--repeats must be at least 1, got {opts.repeats}"
    if not (math.isfinite(opts.timeout_s) and opts.timeout_s > 0):  # nan passes `<= 0`, and inf never fires
        return f"--timeout_s must be a positive finite number of seconds, got {opts.timeout_s:g}"
    if not opts.output_dir.strip():  # Path("") is the working directory, where every run folder would land
        return (
            "--output_dir: is empty (an unset shell variable?); name the bench's folder, e.g. --output_dir runs/bench"
        )
    if any(n < 1 for n in opts.num_processes or []):
        return f"--num_processes: every count must be at least 1, got {opts.num_processes}"
    if opts.global_batch_size is not None and (opts.scaling != "strong" or opts.global_batch_size < 1):
        return f"--global_batch_size {opts.global_batch_size}: only with --scaling strong, and at least 1"
    return slurm_sweep.check_options(opts)


def resolve_device(opts: argparse.Namespace) -> None:
    import torch

    if not opts.cpu and not torch.cuda.is_available():
        print("[bench] no GPU visible: running on CPU processes", flush=True)
        opts.cpu = True
    if opts.num_processes is None:
        opts.num_processes = [2 if opts.cpu else torch.cuda.device_count()]


def sweep_plans(opts: argparse.Namespace, train_flags: list[str]) -> list[Point]:
    """Every run of the sweep in the order they run: points (scaled as asked) x repeats."""
    if opts.ablation:
        points = ablation_plans(opts.cpu, train_flags)
    elif opts.slurm:
        configs = opts.configs or [c for c in available_configs() if c != "single"]
        points = slurm_sweep.node_points(strategy_plans(configs, [1], opts.cpu), opts.nodes or [1], opts.procs_per_node)
    else:
        points = strategy_plans(opts.configs or available_configs(), sorted(set(opts.num_processes)), opts.cpu)
    if not points:  # every config skipped: a sweep of nothing is a refusal, not a failed run
        raise SweepError(f"--configs {' '.join(opts.configs or [])}: nothing to run on CPU (each is skipped above)")
    if opts.scaling == "strong":
        points, total = strong_scaling(points, train_flags, opts.global_batch_size)
        print(f"[bench] strong scaling: global batch {total} at every process count", flush=True)
    return with_repeats(points, opts.repeats)


def finish(outcomes: list[Outcome], opts: argparse.Namespace) -> int:
    """Name the failures, report every run (a failed one as a row that says so), and the exit status."""
    failed = [o for o in outcomes if not o.ok]
    for outcome in failed:
        print(describe_failure(outcome), file=sys.stderr, flush=True)
    if outcomes:
        out = Path(opts.output_dir) / "report"
        try:
            groups, paths = report.build_report(
                [o.run_dir for o in outcomes], out, wandb_project="qa-train" if opts.wandb else None
            )
            print(report.markdown_table(groups))
            report.print_warnings(paths)
            print(f"\n[bench] report: {out / 'report.md'}")
        except report.ReportError as err:
            print(f"[bench] no report: {err}", file=sys.stderr, flush=True)
    print(
        f"[bench] {len(outcomes) - len(failed)} of {len(outcomes)} runs finished"
        + (f"; failed: {', '.join(o.point.name for o in failed)}" if failed else ""),
        flush=True,
    )
    return 1 if failed or not outcomes else 0


def check_output(output_dir: str) -> None:
    """The runs' folder and its report/, refused before any run rather than at the first run or after the last."""
    check_output_folder(output_dir)
    report.check_output_dir(Path(output_dir) / "report")


def main(argv: list[str] | None = None) -> int:
    opts, user_flags = parse(sys.argv[1:] if argv is None else argv)
    train_flags = [*model_and_data_defaults(user_flags), *DEFAULT_FLAGS, *user_flags]
    try:
        check_output(opts.output_dir)
        if opts.slurm:  # the compute nodes' devices count, not this login node's
            return slurm_sweep.submit_all(sweep_plans(opts, train_flags), opts, train_flags, CONFIG_DIR)
        resolve_device(opts)
        plans = sweep_plans(opts, train_flags)
    except (SweepError, ConfigError, report.ReportError, OSError) as err:
        print(f"qa-train bench: error: {refusal_text(err)}", file=sys.stderr)
        return 2
    ports: set[int] = set()
    outcomes: list[Outcome] = []
    try:
        for point in plans:
            port = launch.free_port(ports)  # each run its own
            ports.add(port)
            outcomes.append(run_one(point, opts, train_flags, port))
    except KeyboardInterrupt:  # the run in progress is killed (_run_logged); the finished ones are still reported
        print(
            f"\n[bench] interrupted during run {len(outcomes) + 1} of {len(plans)}; reporting the runs before it",
            file=sys.stderr,
            flush=True,
        )
        finish(outcomes, opts)
        return 130
    return finish(outcomes, opts)
