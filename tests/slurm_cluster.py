"""A real two-node SLURM on this machine for the tests: munged, slurmctld and two slurmd on 127.0.0.1.

    python3 tests/slurm_cluster.py install          # as root on Debian/Ubuntu: apt-get the daemons (~15 s)
    python3 tests/slurm_cluster.py start [DIR]      # prints the SLURM_CONF to export; ~0.2 s
    python3 tests/slurm_cluster.py stop [DIR]       # cancels the jobs, stops every daemon by its PID file

Everything lives in DIR (default /tmp/qa-train-slurm): the munge key and socket, slurm.conf, the daemons' state,
PID files and logs, so the cluster leaves /etc/slurm and the system's munged alone and several can run side by
side. The two nodes are `slurmd -N qa-n1` and `slurmd -N qa-n2` on their own ports; the node names must resolve
(slurm/train.sbatch's rendezvous host is the first node's name), so `start` adds them to /etc/hosts where it
may. Standard library only: `.ci/run` calls it before the project's virtual environment exists.
"""

from __future__ import annotations

import argparse
import getpass
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

NODES = ("qa-n1", "qa-n2")
# slurm/train.sbatch asks for --cpus-per-task=32; config_overrides lets each node declare that many on 2 cores.
NODE_CPUS = 32
PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo")
JOBCOMP = "jobcomp.log"  # a line per job that ended or was requeued (JobState=PENDING), kept for good
DEFAULT_DIR = Path(os.environ.get("QA_TRAIN_SLURM_DIR", "/tmp/qa-train-slurm"))

CONF = """\
ClusterName=qatrain
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again only once its launch credential has expired: 120 s by default, 5 at least.
AuthInfo=socket={dir}/munge.socket,cred_expire=5
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
JobCompType=jobcomp/filetxt
JobCompLoc={dir}/{jobcomp}
# No cgroups here (containers, CI): processes are tracked by their parents, tasks are not bound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# Jobs start at the next scheduling pass: every second here, where a requeued job whose begin time has come would
# wait up to 60 s, and a new one 3 s (batch_sched_delay).
SchedulerParameters=sched_interval=1,batch_sched_delay=0
# `sbatch --wait` polls every 2 s where finished jobs stay this long (by default it backs off to 32 s); they stay
# in JobCompLoc for good.
MinJobAge=4
# slurm/train.sbatch's default port is 29500 + job id mod 1000: ids from {first_job_id} keep it above the tests'
# own launch ports (29500-30299).
FirstJobId={first_job_id}
{nodes}
PartitionName=debug Nodes={node_list} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass(frozen=True)
class Cluster:
    """A started cluster: its folder and the config every SLURM command (and job) must read."""

    dir: Path
    nodes: tuple[str, ...] = NODES

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}


def _which(name: str) -> str | None:
    """A program on PATH or in sbin, where slurmctld, slurmd and munged live (not on a user's PATH on Debian)."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def missing() -> list[str]:
    """The SLURM and munge programs not installed."""
    return [b for b in BINARIES if _which(b) is None]


def install() -> None:
    """apt-get the daemons and clients, non-interactively; refreshes the package lists only when needed."""
    if not missing():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(
            f"SLURM is missing ({', '.join(missing())}); install as root: apt-get install {' '.join(PACKAGES)}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, stdout=subprocess.DEVNULL, check=True)
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _resolve_nodes(nodes: tuple[str, ...]) -> None:
    """Every node name must be 127.0.0.1: jobs rendezvous at the first node's name."""
    unresolved = []
    for name in nodes:
        try:
            if socket.gethostbyname(name) != "127.0.0.1":
                raise RuntimeError(f"/etc/hosts: {name} resolves to {socket.gethostbyname(name)}, not 127.0.0.1")
        except socket.gaierror:
            unresolved.append(name)
    if not unresolved:
        return
    line = f"127.0.0.1 {' '.join(unresolved)}\n"
    if not os.access("/etc/hosts", os.W_OK):
        raise RuntimeError(f"the node names {unresolved} do not resolve: add `{line.strip()}` to /etc/hosts")
    with open("/etc/hosts", "a") as f:
        f.write(line)


def write_conf(cluster: Cluster) -> None:
    ctld_port, *node_ports = _free_ports(1 + len(cluster.nodes))
    nodes = "\n".join(
        f"NodeName={name} NodeAddr=127.0.0.1 Port={p} CPUs={NODE_CPUS} State=UNKNOWN"
        for name, p in zip(cluster.nodes, node_ports, strict=True)
    )
    text = CONF.format(
        host=socket.gethostname().split(".")[0],
        ctld_port=ctld_port,
        user=getpass.getuser(),
        dir=cluster.dir,
        jobcomp=JOBCOMP,
        # Random per cluster: two sessions on one machine rarely run the same job id (and so port) at once.
        first_job_id=1800 + random.randrange(150),
        nodes=nodes,
        node_list=",".join(cluster.nodes),
    )
    cluster.conf.write_text(text)


def _daemon(cmd: list[str], log: Path) -> None:
    """Run a daemon that forks itself; its start-up errors name their log."""
    proc = subprocess.run([_which(cmd[0]) or cmd[0], *cmd[1:]], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-3:] if log.exists() else []
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()} {' | '.join(tail)}")


def start(directory: Path = DEFAULT_DIR, nodes: tuple[str, ...] = NODES, timeout_s: float = 30.0) -> Cluster:
    """Start munged, slurmctld and one slurmd per node in `directory` (emptied first); wait until the nodes are idle."""
    if missing():
        raise RuntimeError(f"SLURM is not installed (missing {', '.join(missing())}): python3 {__file__} install")
    _resolve_nodes(nodes)
    cluster = Cluster(directory.resolve(), nodes)
    stop(cluster.dir)
    shutil.rmtree(cluster.dir, ignore_errors=True)
    (cluster.dir / "state").mkdir(parents=True)
    cluster.dir.chmod(0o755)  # munged refuses a socket in a folder others cannot traverse
    key = cluster.dir / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    d = cluster.dir
    munged = ["munged", f"--socket={d}/munge.socket", f"--key-file={key}", f"--pid-file={d}/munged.pid"]
    _daemon([*munged, f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"], d / "munged.log")
    write_conf(cluster)
    _daemon(["slurmctld", "-f", str(cluster.conf)], d / "slurmctld.log")
    for name in nodes:
        _daemon(["slurmd", "-f", str(cluster.conf), "-N", name], d / f"slurmd-{name}.log")
    _wait_idle(cluster, timeout_s)
    return cluster


def _wait_idle(cluster: Cluster, timeout_s: float) -> None:
    env = {**os.environ, **cluster.env()}
    deadline = time.monotonic() + timeout_s
    states = ""
    while time.monotonic() < deadline:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True, text=True)
        states = proc.stdout.strip()
        if proc.returncode == 0 and sorted(states.splitlines()) == sorted(f"{n} idle" for n in cluster.nodes):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{cluster.dir}: the nodes are not idle after {timeout_s:g} s: {states!r}; see slurm*.log there")


def _pid(path: Path) -> int | None:
    try:
        pid = int(path.read_text().split()[0])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError, IndexError):
        return None


def _cancel_jobs(cluster: Cluster, timeout_s: float) -> None:
    """Cancel every job and wait for them to end: a slurmd stopped under a running job would leave its processes."""
    env = {**os.environ, **cluster.env()}
    subprocess.run(["scancel", "--full", "--user", getpass.getuser()], env=env, capture_output=True, timeout=30)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proc = subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0 or not proc.stdout.strip():
            return
        time.sleep(0.2)


def stop(directory: Path = DEFAULT_DIR, timeout_s: float = 10.0) -> None:
    """Cancel the jobs, then stop each daemon by its PID file (SIGTERM, SIGKILL after timeout_s)."""
    cluster = Cluster(directory.resolve())
    if _pid(cluster.dir / "slurmctld.pid") is not None:
        _cancel_jobs(cluster, timeout_s=40.0)
    pid_files = [*sorted(cluster.dir.glob("slurmd-*.pid")), cluster.dir / "slurmctld.pid", cluster.dir / "munged.pid"]
    for pid_file in pid_files:
        pid = _pid(pid_file)
        if pid is None:
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _pid(pid_file) == pid and time.monotonic() < deadline:
            time.sleep(0.05)
        if _pid(pid_file) == pid:
            os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=["install", "start", "stop"])
    p.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR, help=f"the cluster's folder ({DEFAULT_DIR})")
    opts = p.parse_args(argv)
    try:
        if opts.action == "install":
            install()
        elif opts.action == "start":
            cluster = start(opts.dir)
            print(f"export SLURM_CONF={cluster.conf}")
        else:
            stop(opts.dir)
    except RuntimeError as e:
        print(f"slurm_cluster: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
