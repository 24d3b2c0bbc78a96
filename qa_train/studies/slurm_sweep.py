"""Node-count sweeps on SLURM: one job per (config, nodes, repeat) through slurm/train.sbatch.

    qa-train bench --slurm --nodes 1 2 4 --configs ddp zero2 [--procs_per_node 8] [--repeats 3] \
        [--sbatch_args "--partition gpu --time 01:00:00"] [-- qa_train flags]

Each job trains into OUTPUT_DIR/<config>-n<nodes>-r<k> (a shared file system) beside its sweep_point.json;
per-node logs go to logs/ there. Jobs are submitted one after another and queue as the cluster
decides; once they have finished, `qa-train report OUTPUT_DIR --output_dir OUTPUT_DIR/report`
gives the table and plots (speed-up against each config's 1-node run). Where sbatch itself waits for
the job (`--sbatch_args --wait`, or a test's fake cluster) the report is written straight away.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from qa_train.config.outputdir import leftovers, remove, run_files
from qa_train.studies import report
from qa_train.studies.sweep import POINT_FILE, Point

SCRIPT = Path(__file__).resolve().parents[2] / "slurm" / "train.sbatch"
JOB_ID = re.compile(r"Submitted batch job (\d+)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("SLURM sweeps")
    g.add_argument(
        "--slurm",
        action="store_true",
        help="Submit one job per point through slurm/train.sbatch instead of running locally.",
    )
    g.add_argument("--nodes", type=int, nargs="+", default=None, help="Node counts of a --slurm sweep (default 1).")
    g.add_argument(
        "--procs_per_node",
        type=int,
        default=None,
        help="Processes per node; on GPUs also the --gpus-per-node each job asks for (default: none "
        "asked for, so --sbatch_args or the partition must give GPUs; 1 with --cpu).",
    )
    g.add_argument("--sbatch_args", default="", help="Extra sbatch options, one string (partition, account, time).")


def attach_sbatch_args(argv: list[str]) -> list[str]:
    """`--sbatch_args --wait` as `--sbatch_args=--wait`: argparse reads a value that starts with a dash and has no
    space as a flag of its own, and refuses the option (`--sbatch_args "--partition gpu"` it already took)."""
    out: list[str] = []
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        out.append(f"{arg}={rest.pop(0)}" if arg == "--sbatch_args" and rest else arg)
    return out


def check_options(opts: argparse.Namespace) -> str | None:
    """The first SLURM flag combination that cannot work, as one line, or None."""
    if not opts.slurm:
        if opts.nodes or opts.procs_per_node or opts.sbatch_args:
            return "--nodes, --procs_per_node and --sbatch_args are for --slurm sweeps; add --slurm"
        return None
    if opts.num_processes:
        return "--slurm: a job's processes are nodes x --procs_per_node; give --nodes and drop --num_processes"
    if any(n < 1 for n in opts.nodes or []):
        return f"--nodes: every count must be at least 1, got {opts.nodes}"
    if opts.procs_per_node is not None and opts.procs_per_node < 1:
        return f"--procs_per_node must be at least 1, got {opts.procs_per_node}"
    if shutil.which("sbatch") is None:
        return "--slurm: no sbatch on PATH (run this on a SLURM login node)"
    return None


def node_points(configs: list[Point], nodes: list[int], procs_per_node: int | None) -> list[Point]:
    """Each config at each node count; processes are known only when the processes per node are."""
    points = []
    for base in configs:
        if base.config == "single":  # one process by definition: nothing to spread over nodes
            print("skipping single on SLURM: it runs one process; run it locally", flush=True)
            continue
        points += [replace(base, processes=n * (procs_per_node or 0), nodes=n, slurm=True) for n in sorted(set(nodes))]
    return points


def job_env(point: Point, run_dir: Path, opts: argparse.Namespace, config_dir: Path) -> dict[str, str]:
    """What slurm/train.sbatch reads: the config, this point's run dir and logs, CPU partitions' settings."""
    env = {
        **os.environ,
        "CONFIG": str(config_dir / f"{point.config}.yaml"),
        "OUTPUT_DIR": str(run_dir),
        "LOG_DIR": str(run_dir / "logs"),
    }
    if opts.cpu:
        env["QA_TRAIN_CPU"] = "1"
    if opts.procs_per_node:
        env["PROCS_PER_NODE" if opts.cpu else "GPUS_PER_NODE"] = str(opts.procs_per_node)
    return env


def clear_run_dir(run_dir: Path) -> None:
    """The bench owns its run folders: a rerun replaces the old run (the batch script resumes from `latest`,
    which would otherwise continue a finished run instead of timing a new one)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    remove(run_dir, [*run_files(run_dir), *leftovers(run_dir), "logs", POINT_FILE])


def submit(point: Point, opts: argparse.Namespace, train_flags: list[str], config_dir: Path) -> tuple[Path, int, str]:
    """sbatch one point; (its run dir, sbatch's exit status, the job id or '')."""
    run_dir = (Path(opts.output_dir) / point.name).resolve()
    clear_run_dir(run_dir)
    point.write(run_dir)
    gpus = ["--gpus-per-node", str(opts.procs_per_node)] if opts.procs_per_node and not opts.cpu else []
    cmd = [
        "sbatch",
        "--nodes",
        str(point.nodes),
        *gpus,
        "--job-name",
        f"qa-{point.name}",
        "--output",
        str(run_dir / "slurm-%j.out"),
        *shlex.split(opts.sbatch_args),
        str(SCRIPT),
        *train_flags,
        *point.extra,
        "--max_train_steps",
        str(opts.max_train_steps),
        "--run_name",
        point.name,
    ]
    log = run_dir / "sbatch.log"
    print(f"[bench] {point.name}: sbatch {point.config} on {point.nodes} node(s), log {log}", flush=True)
    with log.open("w") as f:
        f.write("+ " + shlex.join(cmd) + "\n")
        f.flush()
        try:
            code = subprocess.run(
                cmd,
                cwd=SCRIPT.parents[1],
                env=job_env(point, run_dir, opts, config_dir),
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=opts.timeout_s,
            ).returncode
        except subprocess.TimeoutExpired:  # a waiting sbatch (--wait) past --timeout_s; the next points still go
            f.write(f"\n[bench] sbatch did not return within {opts.timeout_s:g} s (--timeout_s)\n")
            code = 124
    found = JOB_ID.search(log.read_text(errors="replace"))
    return run_dir, code, found.group(1) if found else ""


def submit_all(points: list[Point], opts: argparse.Namespace, train_flags: list[str], config_dir: Path) -> int:
    """Submit every point; report at once if the jobs have already finished (a waiting sbatch), else say how."""
    results = [submit(p, opts, train_flags, config_dir) for p in points]
    refused = [str(d) for d, code, _ in results if code != 0]
    for run_dir in refused:
        print(f"[bench] sbatch FAILED for {run_dir}; see {Path(run_dir) / 'sbatch.log'}", file=sys.stderr, flush=True)
    jobs = [job for _, code, job in results if code == 0 and job]
    print(
        f"[bench] submitted {len(points) - len(refused)} of {len(points)} jobs"
        + (f" ({', '.join(jobs)})" if jobs else ""),
        flush=True,
    )
    finished = [d for d, code, _ in results if code == 0 and (d / "metrics.json").is_file()]
    out = Path(opts.output_dir) / "report"
    if finished and len(finished) == len(results) - len(refused):  # every accepted job is done: sbatch waited
        groups, _ = report.build_report([d for d, _, _ in results], out)  # the refused ones as failed runs
        print(report.markdown_table(groups))
        print(f"\n[bench] report: {out / 'report.md'}")
    else:
        print(f"[bench] when the jobs have finished: qa-train report {opts.output_dir} --output_dir {out}", flush=True)
    return 1 if refused or not points else 0
