"""A fake SLURM for tests: sbatch, srun and scontrol that run a batch script as N "nodes" on this machine.

Each node is a process on loopback with the variables a real cluster sets. sbatch honours
`--signal=B:SIG@T` by sending SIG to the batch shell once the file FAKE_SLURM_SIGNAL_WHEN exists
(standing in for "T seconds before the time limit": a test makes the run create it at a chosen
step) and re-runs the script when it requeued itself, on FAKE_SLURM_REQUEUE_NODES nodes if set (what
`scontrol update JobId=<id> NumNodes=N` does to the pending requeued job on a real cluster).
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


def sbatch(argv: list[str]) -> int:
    opts: dict[str, str] = {}
    rest = list(argv)
    while rest and rest[0].startswith("--"):
        key, _, value = rest.pop(0)[2:].partition("=")
        opts[key] = value if value else rest.pop(0)
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
    restarts, rc = 0, 0
    while True:
        if restarts and os.environ.get("FAKE_SLURM_REQUEUE_NODES"):
            nodes = int(os.environ["FAKE_SLURM_REQUEUE_NODES"])
            hosts = ",".join(f"127.0.0.{i + 1}" for i in range(nodes))
            env.update(SLURM_NNODES=str(nodes), SLURM_JOB_NUM_NODES=str(nodes), SLURM_JOB_NODELIST=hosts)
        env["SLURM_RESTART_COUNT"] = str(restarts)
        (STATE / f"requeue-{job_id}").unlink(missing_ok=True)
        print(f"fake sbatch: job {job_id} start {restarts}", flush=True)
        shell = subprocess.Popen(["bash", str(script), *script_args], env=env)
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
    opts: dict[str, str] = {}
    rest = list(argv)
    while rest and rest[0].startswith("--"):
        key, _, value = rest.pop(0)[2:].partition("=")
        if key in ("kill-on-bad-exit",) and not value:
            opts[key] = "1"
            continue
        opts[key] = value if value else rest.pop(0)
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
            path = Path(
                opts["output"]
                .replace("%n", str(node))
                .replace("%t", str(node))
                .replace("%j", os.environ["SLURM_JOB_ID"])
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            out = path.open("a")
        procs.append(
            subprocess.Popen(
                rest, env=env, stdout=out, stderr=subprocess.STDOUT if out else None, start_new_session=True
            )
        )
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, lambda s, f: [p.send_signal(s) for p in procs if p.poll() is None])
    codes: list[int | None] = [None] * nodes
    while None in codes:
        for i, p in enumerate(procs):
            if codes[i] is None and p.poll() is not None:
                codes[i] = p.returncode
                if p.returncode and opts.get("kill-on-bad-exit"):
                    for q in procs:
                        if q.poll() is None:
                            os.killpg(q.pid, signal.SIGKILL)
        time.sleep(0.1)
    return max(abs(c or 0) for c in codes)


if __name__ == "__main__":
    tool = Path(sys.argv[1]).name
    sys.exit({"sbatch": sbatch, "srun": srun, "scontrol": scontrol}[tool](sys.argv[2:]))
