"""A fake SLURM for what the real one on this machine (tests/slurm_cluster.py) cannot do: GPU nodes, and a
warning signal at a chosen moment. sbatch, srun and scontrol run a batch script as N "nodes" here.

Each node is a process on loopback with the variables a real cluster sets. sbatch waits for the job, as
`sbatch --wait` does, and honours `--signal=B:SIG@T` by sending SIG to the batch shell once the file
FAKE_SLURM_SIGNAL_WHEN exists (standing in for "T seconds before the time limit": a test makes the run
create it at a chosen step) and re-runs the script when it requeued itself. Where both exist it behaves as
SLURM 22.05 does: the batch output goes to --output (default slurm-%j.out in the submit directory), and
neither sbatch nor srun creates a missing output folder.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

STATE = Path(os.environ.get("FAKE_SLURM_DIR", "/tmp/fake_slurm"))


def expand_nodelist(spec: str) -> list[str]:
    hosts: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", spec):
        m = re.fullmatch(r"(.*)\[(\d+)-(\d+)\]", part)
        if m:
            width = len(m.group(2))
            hosts += [f"{m.group(1)}{i:0{width}d}" for i in range(int(m.group(2)), int(m.group(3)) + 1)]
        else:
            hosts.append(part)
    return hosts


def scontrol(argv: list[str]) -> int:
    if argv[:2] == ["show", "hostnames"]:
        try:
            print("\n".join(expand_nodelist(argv[2] if len(argv) > 2 else os.environ["SLURM_JOB_NODELIST"])))
        except BrokenPipeError:  # `| head -n 1` closed the pipe early, as it may with the real scontrol
            pass
        return 0
    if argv[:1] == ["requeue"]:
        STATE.mkdir(parents=True, exist_ok=True)
        (STATE / f"requeue-{argv[1]}").touch()
        return 0
    print(f"fake scontrol: unsupported {argv}", file=sys.stderr)
    return 1


def _script_options(script: Path) -> dict[str, str]:
    opts: dict[str, str] = {}
    for line in script.read_text().splitlines():
        m = re.match(r"#SBATCH\s+--([\w-]+)(?:[=\s]+(\S+))?", line)
        if m:
            opts[m.group(1)] = m.group(2) or ""
    return opts


def _signal_when(marker: Path, shell: subprocess.Popen, sig: int) -> None:
    while shell.poll() is None:
        if marker.exists():
            shell.send_signal(sig)
            return
        time.sleep(0.05)


# sbatch and srun options that take no value.
FLAGS = {"wait", "parsable", "requeue", "no-requeue", "exclusive", "kill-on-bad-exit"}


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Leading long options (`--key value`, `--key=value`, valueless FLAGS) and what follows them."""
    opts: dict[str, str] = {}
    rest = list(argv)
    while rest and rest[0].startswith("--"):
        key, eq, value = rest.pop(0)[2:].partition("=")
        opts[key] = value if eq else "1" if key in FLAGS else rest.pop(0)
    return opts, rest


def _open_output(pattern: str, fields: dict[str, str], mode: str):
    """The output file as SLURM names it (%x job name, %j job id, %n node, %%), or None when its folder is missing."""
    path = Path(re.sub(r"%([xjn%])", lambda m: fields.get(m.group(1), "%"), pattern))
    return path.open(mode) if path.parent.is_dir() else None


def sbatch(argv: list[str]) -> int:
    opts, rest = _options(argv)
    script, script_args = Path(rest[0]), rest[1:]
    opts = {**_script_options(script), **opts}
    nodes = int(opts.get("nodes", "1"))
    job_id = os.environ.get("FAKE_SLURM_JOB_ID", str(4000 + os.getpid() % 1000))
    hosts = os.environ.get("FAKE_SLURM_NODELIST", ",".join(f"127.0.0.{i + 1}" for i in range(nodes)))
    env = {
        **os.environ,
        "SLURM_JOB_ID": job_id,
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_JOB_NODELIST": hosts,
        "SLURM_SUBMIT_DIR": os.getcwd(),
        "SLURM_JOB_NAME": opts.get("job-name", "job"),
    }
    if "gpus-per-node" in opts:  # as SLURM does for a job that asks for GPUs per node
        env["SLURM_GPUS_PER_NODE"] = opts["gpus-per-node"]
    print(job_id if "parsable" in opts else f"Submitted batch job {job_id}", flush=True)
    fields = {"x": env["SLURM_JOB_NAME"], "j": job_id}
    out = _open_output(opts.get("output", "slurm-%j.out"), fields, "a" if opts.get("open-mode") == "append" else "w")
    if out is None:  # SLURM: JobState=FAILED Reason=JobLaunchFailure, said only in slurmd's log
        return 1
    restarts = 0
    with out:
        while True:
            env["SLURM_RESTART_COUNT"] = str(restarts)
            (STATE / f"requeue-{job_id}").unlink(missing_ok=True)
            print(f"fake sbatch: job {job_id} start {restarts}", file=out, flush=True)
            shell = subprocess.Popen(["bash", str(script), *script_args], env=env, stdout=out, stderr=out)
            when = os.environ.get("FAKE_SLURM_SIGNAL_WHEN")
            if when and restarts == 0 and "signal" in opts:
                sig = getattr(signal, "SIG" + opts["signal"].split(":")[-1].split("@")[0])
                # Bound now: after a requeue `shell` names the next attempt, which must not get this warning.
                threading.Thread(target=_signal_when, args=(Path(when), shell, sig), daemon=True).start()
            rc = shell.wait()
            if not (STATE / f"requeue-{job_id}").exists():
                return rc
            restarts += 1


def srun(argv: list[str]) -> int:
    opts, rest = _options(argv)
    nodes = int(os.environ["SLURM_NNODES"])
    hosts = expand_nodelist(os.environ["SLURM_JOB_NODELIST"])
    procs = []
    for node in range(nodes):
        env = {
            **os.environ,
            "SLURM_NODEID": str(node),
            "SLURM_PROCID": str(node),
            "SLURM_LOCALID": "0",
            "SLURM_NTASKS": str(nodes),
            "SLURMD_NODENAME": hosts[node],
            "SLURM_STEP_ID": "0",
        }
        out = None
        if "output" in opts:
            out = _open_output(opts["output"], {"n": str(node), "j": os.environ["SLURM_JOB_ID"]}, "a")
            if out is None:  # SLURM 22.05's srun says so, starts nothing there, and still exits 0
                print(f"srun: error: task {node} launch failed: Slurmd could not connect IO", file=sys.stderr)
                continue
        procs.append(
            subprocess.Popen(
                rest, env=env, stdout=out, stderr=subprocess.STDOUT if out else None, start_new_session=True
            )
        )
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, lambda s, f: [p.send_signal(s) for p in procs if p.poll() is None])
    codes: list[int | None] = [None] * len(procs)
    while None in codes:
        for i, p in enumerate(procs):
            if codes[i] is None and p.poll() is not None:
                codes[i] = p.returncode
                if p.returncode and opts.get("kill-on-bad-exit", "0") != "0":
                    for q in procs:
                        if q.poll() is None:
                            os.killpg(q.pid, signal.SIGKILL)
        time.sleep(0.1)
    return max((abs(c or 0) for c in codes), default=0)


if __name__ == "__main__":
    tool = Path(sys.argv[1]).name
    sys.exit({"sbatch": sbatch, "srun": srun, "scontrol": scontrol}[tool](sys.argv[2:]))
