"""slurm/train.sbatch on a real SLURM: slurmctld and two slurmd on this machine (tests/slurm_cluster.py).

Every job is submitted from a copy of the repository as a fresh clone has it, so a folder or file that only a
developer's checkout has shows up as a failed job. The assertions are on what SLURM itself guarantees (the job's
state, exit code and restart count) and what the run wrote, never on log lines that a requeue may cut off.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import slurm_cluster
from conftest import PY, ROOT, base_env, port, read_metrics, tiny_flags

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
JOB_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files a fresh clone has: those git tracks, and new ones it does not ignore (an uncommitted change's)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    out = tmp_path_factory.mktemp("clone")
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():  # not a tracked file deleted in the working tree
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, out / name)
    return out


def job_env(tmp_path: Path, slurm, **settings: str) -> dict[str, str]:
    """What a user's shell would hold: the cluster's config, a CPU partition's settings, then the test's own."""
    env = {**base_env(tmp_path), **slurm.env(), "QA_TRAIN_CPU": "1", "PROCS_PER_NODE": "1"}
    env["OMP_NUM_THREADS"] = "1"  # two "nodes" share two cores
    return {**env, **settings}


def train_flags(steps: int) -> list[str]:
    """The tiny run, its files named relative to the submit directory (the clone); the script sets --output_dir."""
    flags = tiny_flags(Path("unused"), "--max_train_steps", str(steps), "--logging_steps", "1", "--no_eval")
    i = flags.index("--output_dir")
    return [str(Path(f).relative_to(ROOT)) if f.startswith(str(ROOT)) else f for f in flags[:i] + flags[i + 2 :]]


def sbatch(clone: Path, env: dict[str, str], *args: str) -> int:
    proc = subprocess.run(["sbatch", "--parsable", *args], cwd=clone, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return int(proc.stdout.strip().split(";")[0])


def scontrol(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(["scontrol", *args], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"scontrol {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def job(env: dict[str, str], job_id: int) -> dict[str, str]:
    """SLURM's record of the job: JobState, Restarts, ExitCode ('75:0' is exit 75, no signal), NodeList, ... An
    ended job leaves the controller after MinJobAge (4 s here); then its entries in the completion log say the
    same, a requeue being an entry of its own."""
    cmd = ["scontrol", "show", "job", "-o", str(job_id)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    if proc.returncode == 0:
        return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))
    log = Path(env["SLURM_CONF"]).with_name(slurm_cluster.JOBCOMP).read_text()
    entries = [dict(re.findall(r"(\w+)=(\S*)", x)) for x in log.splitlines() if x.startswith(f"JobId={job_id} ")]
    assert entries, f"{' '.join(cmd)}: {proc.stderr}"
    return {**entries[-1], "Restarts": str(sum(e["JobState"] == "PENDING" for e in entries))}


def wait_until(what: str, ready: Callable[[], object], timeout: float = JOB_TIMEOUT_S) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        time.sleep(0.5)  # each look is a process (scontrol) on the cores the jobs train on
    raise AssertionError(f"no {what} within {timeout:g} s")


def ended(env: dict[str, str], job_id: int, *logs: Path) -> dict[str, str]:
    """The job's record once it has ended; its logs are printed, so that a failing assertion comes with them."""
    info = wait_until(f"end of job {job_id}", lambda: (j := job(env, job_id))["JobState"] in ENDED and j)
    for log in logs:
        print(f"--- {log}\n{log.read_text(errors='replace')[-4000:] if log.exists() else '(missing)'}")
    return info


def on_restarts(bin_dir: Path, command: str) -> Path:
    """A `python` for the jobs that runs the shell `command` first in a requeued job's restarts
    (SLURM_RESTART_COUNT > 0): `unset VAR`, `export VAR=value`."""
    bin_dir.mkdir()
    wrapper = bin_dir / "python"
    wrapper.write_text(f'#!/bin/sh\n[ "${{SLURM_RESTART_COUNT:-0}}" = 0 ] || {command}\nexec {PY} "$@"\n')
    wrapper.chmod(0o755)
    return bin_dir


def holding(out: Path, ranks: int) -> Callable[[], bool]:
    return lambda: all((out / f"HOLDING-rank{r}").exists() for r in range(ranks))


def logged_steps(out: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (out / "train_log.jsonl").read_text().splitlines()]


def stopped_at(node_log: str) -> int:
    found = re.search(r"stop requested: checkpoint saved at step (\d+)", node_log)
    assert found, node_log[-3000:]
    return int(found.group(1))


def test_a_fresh_clone_trains_on_two_nodes_with_the_scripts_defaults(clone: Path, slurm, tmp_path: Path) -> None:
    """`sbatch --nodes 2 slurm/train.sbatch` as typed in a fresh clone: the batch log in logs/, the run in
    runs/slurm-<job id>, the rendezvous at the first node's name on a port from the job id. Before, logs/ was not in
    the repository, SLURM does not create it, and the job failed at launch without a word."""
    job_id = sbatch(clone, job_env(tmp_path, slurm), "--nodes", "2", "slurm/train.sbatch", *train_flags(6))
    batch, node_logs = clone / "logs" / f"qa-train-{job_id}.out", clone / "logs" / str(job_id)
    info = ended(job_env(tmp_path, slurm), job_id, batch, node_logs / "node0.log")
    assert (info["JobState"], info["ExitCode"], info["NodeList"]) == ("COMPLETED", "0:0", "qa-n[1-2]"), info["Reason"]
    text = batch.read_text()
    assert f"2 nodes x 1 = 2 processes, config accelerate_configs/ddp.yaml, main qa-n1:{29500 + job_id % 1000}" in text
    # Compiled graphs are cached in the submit directory, which a requeued job on other nodes still sees.
    assert f"compile cache {clone / '.cache' / 'torchinductor'}" in text
    m = read_metrics(clone / "runs" / f"slurm-{job_id}")
    assert (m["world_size"], m["strategy"], m["train_steps"]) == (2, "ddp", 6)
    assert m["train_loss_per_rank"][0] == m["train_loss_per_rank"][1]
    assert sorted(p.name for p in node_logs.iterdir()) == ["node0.log", "node1.log"]
    # Each node launched with its own rank: a rank read once on the submit host would give two rank-0s.
    assert "--node_rank 1" in (node_logs / "node1.log").read_text()


def test_the_schedulers_warning_signal_checkpoints_requeues_and_the_restart_resumes_on_fewer_nodes(
    clone: Path, slurm, tmp_path: Path
) -> None:
    """SLURM's own `--signal=B:USR1@85` on a 2-minute job: its controller checks time limits every 30 s and sends
    the warning at the first check past (limit - 85 s - 30 s), here 5 to 35 s after the start (after the batch shell
    is up), while the ranks start or hold at step 4. The trap asks them to checkpoint and requeues the job; while
    it waits, `scontrol update NumNodes=1` (a smaller allocation is what frees up first) and the restart on one
    node refits its accumulation to the global batch of 16 and resumes there, with the command unchanged."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    settings = {"OUTPUT_DIR": str(out), "LOG_DIR": str(logs), "MAIN_PORT": str(port(29761))}
    # The user's own compile cache wins over the script's default; the first start's ranks hold after step 4 until
    # stopped (a restart that resumed before step 4 would hold there again, with no signal to come).
    settings |= {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "QA_TRAIN_TEST_HOLD_AT_STEP": "4"}
    env = job_env(tmp_path, slurm, **settings)
    env["PATH"] = f"{on_restarts(tmp_path / 'bin', 'unset QA_TRAIN_TEST_HOLD_AT_STEP')}:{env['PATH']}"
    batch = tmp_path / "batch.out"
    limits = ["--time", "2", "--signal", "B:USR1@85", "--output", str(batch)]
    job_id = sbatch(clone, env, "--nodes", "2", *limits, "slurm/train.sbatch", *train_flags(12))
    # While it waits for its begin time (cred_expire, 5 s): the restart would be warned in its turn under the old
    # limit, and would start on the old allocation.
    wait_until("requeue", lambda: (j := job(env, job_id))["JobState"] == "PENDING" and int(j["Restarts"]) >= 1)
    # NumNodes alone is accepted and changes nothing: the job keeps its two tasks, one per node (docs/slurm.md).
    scontrol(env, "update", f"JobId={job_id}", "NumNodes=1")
    assert [job(env, job_id)[k] for k in ("NumNodes", "NumTasks", "NumCPUs")] == ["2", "2", "64"]
    scontrol(env, "update", f"JobId={job_id}", "TimeLimit=10", "NumNodes=1", "NumTasks=1", "NumCPUs=32")
    info = ended(env, job_id, batch, logs / "node0.log")
    assert (info["JobState"], info["ExitCode"], info["Restarts"], info["NodeList"]) == (
        "COMPLETED",
        "0:0",
        "1",
        "qa-n1",
    )
    node0 = (logs / "node0.log").read_text()
    step = stopped_at(node0)
    assert 1 <= step <= 4
    checkpoint = out / "checkpoints" / f"step_{step:08d}"
    assert f"resuming {checkpoint}, written by 2 processes, on 1: --gradient_accumulation_steps 1 -> 2" in node0
    assert f"resumed from {checkpoint}" in node0
    m = read_metrics(out)
    assert (m["world_size"], m["train_steps"], m["global_batch_size"]) == (1, 12, 16)
    assert sorted(set(logged_steps(out))) == list(range(1, 13))
    assert not (out / "PREEMPT").exists()
    text = batch.read_text()
    # Printed before the requeue (the lines after it die with the batch shell), and by both starts.
    assert "warning signal: asking ranks to checkpoint and stop" in text
    assert text.count(f"compile cache {tmp_path / 'inductor'}") == 2 and f"job {job_id} (restart 1): 1 nodes" in text


def test_a_requeue_from_outside_restarts_from_a_checkpoint_and_scancel_ends_the_job_there(
    clone: Path, slurm, tmp_path: Path
) -> None:
    """`scontrol requeue` of a running 2-node job (an operator, or preemption with PreemptMode=REQUEUE): SLURM sends
    SIGTERM to every process of the job on both nodes, each rank checkpoints at the step it holds at, and the job
    starts again from there. The restart then gets `scancel --signal=TERM`, which reaches every process too: each
    rank checkpoints and stops (exit 75), and the job ends there (only the warning signal requeues by itself). A
    new submission of the same command continues it, on fewer nodes too: the warning signal's restart above."""
    out, logs = tmp_path / "out", tmp_path / "logs"
    settings = {"OUTPUT_DIR": str(out), "LOG_DIR": str(logs), "MAIN_PORT": str(port(29762))}
    env = job_env(tmp_path, slurm, **settings, QA_TRAIN_TEST_HOLD_AT_STEP="3")
    env["PATH"] = f"{on_restarts(tmp_path / 'bin', 'export QA_TRAIN_TEST_HOLD_AT_STEP=6')}:{env['PATH']}"
    batch = tmp_path / "batch.out"
    job_id = sbatch(clone, env, "--nodes", "2", "--output", str(batch), "slurm/train.sbatch", *train_flags(8))
    wait_until("ranks holding at step 3", holding(out, 2))
    scontrol(env, "requeue", str(job_id))
    # The restart waits for its begin time (seconds) and imports for longer: it cannot hold yet.
    wait_until("requeue", lambda: int(job(env, job_id)["Restarts"]) >= 1)
    for held in out.glob("HOLDING-rank*"):
        held.unlink()
    wait_until("the restart's ranks holding at step 6", holding(out, 2))
    subprocess.run(["scancel", "--signal=TERM", str(job_id)], env=env, check=True)
    info = ended(env, job_id, batch, logs / "node0.log")
    assert (info["JobState"], info["Restarts"], info["NodeList"]) == ("FAILED", "1", "qa-n[1-2]"), info
    # srun reports its tasks' highest code: 75, or 143 where it ended the other node's task (after that rank had
    # saved its share) once the first one exited 75.
    assert info["ExitCode"] in ("75:0", "143:0"), info
    node0 = (logs / "node0.log").read_text()
    assert stopped_at(node0) == 3 and f"resumed from {out}/checkpoints/step_00000003" in node0
    assert "stop requested: checkpoint saved at step 6" in node0
    assert not (out / "metrics.json").exists()
    assert json.loads((out / "checkpoints" / "step_00000006" / "trainer_state.json").read_text())["world_size"] == 2
    assert sorted(set(logged_steps(out))) == list(range(1, 7))


def test_a_node_count_sweep_runs_one_job_per_point_and_reports_speedup(clone: Path, slurm, tmp_path: Path) -> None:
    """`qa-train bench --slurm --nodes 1 2` from the clone: one sbatch per point through slurm/train.sbatch, each into
    its own run dir; `--sbatch_args --wait` (the value after a space, which argparse used to refuse) makes each
    sbatch wait for its job, so the report over the sweep is written at once. ZeRO-2: on CPU it is launched by
    `accelerate launch` across the nodes, where DDP goes through torchrun (the other tests)."""
    env = {**base_env(tmp_path), **slurm.env(), "MAIN_PORT": str(port(29764)), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "sweep"
    cmd = [PY, "-m", "qa_train.cli", "bench", "--slurm", "--cpu", "--nodes", "1", "2", "--procs_per_node", "1"]
    cmd += ["--configs", "zero2", "--max_train_steps", "4", "--sbatch_args", "--wait", "--output_dir", str(out)]
    cmd += ["--", "--no_eval", "--logging_steps", "2", "--max_train_samples", "300"]
    proc = subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    found = re.search(r"submitted 2 of 2 jobs \((\d+), (\d+)\)", proc.stdout)
    assert found, proc.stdout
    for nodes, job_id in zip((1, 2), map(int, found.groups())):
        run = out / f"zero2-n{nodes}-r1"
        assert job(env, job_id)["JobState"] == "COMPLETED"
        m = read_metrics(run)
        assert (m["world_size"], m["strategy"], m["train_steps"], m["output_dir"]) == (nodes, "zero2", 4, str(run))
        assert len(set(m["train_loss_per_rank"])) == 1
        assert f"{nodes} nodes x 1 = {nodes} processes" in (run / f"slurm-{job_id}.out").read_text()
        assert sorted(p.name for p in (run / "logs").iterdir()) == [f"node{i}.log" for i in range(nodes)]
        assert json.loads((run / "sweep_point.json").read_text())["nodes"] == nodes
    saved = json.loads((out / "report" / "report.json").read_text())
    one, two = saved["groups"]
    assert (one["nodes"], one["processes"], two["nodes"], two["processes"]) == (1, 1, 2, 2)
    rate = [read_metrics(out / f"zero2-n{n}-r1")["train_samples_per_second"] for n in (1, 2)]
    assert two["speedup"]["median"] == pytest.approx(rate[1] / rate[0]) and one["speedup"]["median"] == 1.0
    again = subprocess.run(
        [PY, "-m", "qa_train.cli", "report", str(out), "--output_dir", str(tmp_path / "report")],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads((tmp_path / "report" / "report.json").read_text())["table"] == saved["table"]
    assert "| zero2 | zero2 | 2 | 2 | 1 |" in again.stdout
