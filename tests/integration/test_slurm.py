"""slurm/train.sbatch on the fake cluster of tests/integration/fake_slurm, for what the real one of
test_slurm_cluster.py cannot do on this machine: GPU nodes, and a warning signal at a chosen moment.

tests/integration/fake_slurm puts `sbatch`, `srun` and `scontrol` first on PATH; each "node" is a process
with the variables a real cluster sets (SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST, ...).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import PY, base_env, port, read_metrics, run_cmd, run_ok, tiny_flags

FAKE = Path(__file__).resolve().parent / "fake_slurm"


def cluster_env(tmp_path: Path, job_id: str, config: str, base_port: int) -> dict[str, str]:
    env = base_env(tmp_path)
    env.update(
        {
            "PATH": f"{FAKE}:{Path(PY).parent}:{env['PATH']}",
            "FAKE_SLURM_DIR": str(tmp_path / "slurm-state"),
            "FAKE_SLURM_JOB_ID": job_id,
            "FAKE_SLURM_PYTHON": PY,
            "QA_TRAIN_CPU": "1",
            "PROCS_PER_NODE": "1",
            "CONFIG": f"accelerate_configs/{config}.yaml",
            "OUTPUT_DIR": str(tmp_path / "out"),
            "LOG_DIR": str(tmp_path / "logs"),
            "MAIN_PORT": str(port(base_port)),
            "CHECKPOINTING_STEPS": "4",
            "OMP_NUM_THREADS": "1",  # two "nodes" share two cores
        }
    )
    return env


def train_flags(steps: int) -> list[str]:
    flags = tiny_flags(Path("unused"), "--max_train_steps", str(steps), "--logging_steps", "1", "--no_eval")
    i = flags.index("--output_dir")
    return flags[:i] + flags[i + 2 :]  # the batch script sets --output_dir from OUTPUT_DIR


def sbatch(env: dict[str, str], batch_log: Path, *args: str) -> tuple[int, str]:
    """The fake sbatch (it waits for the job, as `sbatch --wait` does): its exit status and the batch log, which goes
    where --output says, as on a real cluster."""
    proc = run_cmd(["sbatch", "--output", str(batch_log), *args], env)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, batch_log.read_text() if batch_log.exists() else ""


@pytest.mark.parametrize("cluster", ["fake", "real"])
def test_no_sbatch_or_srun_creates_a_missing_output_folder(
    cluster: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """What hid slurm/train.sbatch's missing logs/: the fake created output folders, which SLURM never does. The fake
    and the real cluster now agree: a batch log in a missing folder fails the job before its script runs (only
    slurmd's log says why; `sbatch --wait` exits 1), and an srun log there fails that task's launch while srun
    itself exits 0 (SLURM 22.05)."""
    if cluster == "real":
        env = {**base_env(tmp_path), **request.getfixturevalue("slurm").env()}
    else:
        env = {**cluster_env(tmp_path, "7361", "ddp", 29761)}
    script = tmp_path / "job.sh"
    script.write_text('#!/bin/bash\nsrun --output nodir2/node%n.log true\necho "srun exit $?"\n')
    proc = subprocess.run(["sbatch", "--wait", "--output", "nodir/%j.out", str(script)], cwd=tmp_path, env=env)
    assert proc.returncode == 1 and not (tmp_path / "nodir").exists()
    proc = subprocess.run(["sbatch", "--wait", "--output", "batch.out", str(script)], cwd=tmp_path, env=env)
    log = (tmp_path / "batch.out").read_text()
    assert proc.returncode == 0 and "srun: error: task 0 launch failed" in log and "srun exit 0" in log, log
    assert not (tmp_path / "nodir2").exists()


def test_a_warning_signal_after_the_training_loop_does_not_requeue_the_finished_run(tmp_path: Path) -> None:
    """The warning comes once the run is past its loop (metrics.json is written before the export): the run
    finishes without seeing the stop request, and a requeue would train again from the last checkpoint and
    export over the finished run. The same job checks that a --checkpointing_steps flag given to it wins over
    the script's CHECKPOINTING_STEPS default (4 here), which used to drop it."""
    env = cluster_env(tmp_path, "7311", "ddp", 29751)
    env["FAKE_SLURM_SIGNAL_WHEN"] = str(tmp_path / "out" / "metrics.json")
    args = ["--nodes", "1", "slurm/train.sbatch", *train_flags(6), "--checkpointing_steps", "2"]
    code, log = sbatch(env, tmp_path / "batch.out", *args)
    assert code == 0 and "warning signal" in log and "not requeued" in log, log
    assert "start 1" not in log and "job requeued" not in log
    node0 = (tmp_path / "logs" / "node0.log").read_text()
    assert node0.count("model exported") == 1 and "resumed from" not in node0
    assert read_metrics(tmp_path / "out")["train_steps"] == 6
    assert not (tmp_path / "out" / "PREEMPT").exists()
    assert sorted(p.name for p in (tmp_path / "out" / "checkpoints").iterdir()) == [
        "step_00000002",
        "step_00000004",
        "step_00000006",
    ]


def gpu_node_env(tmp_path: Path, job_id: str) -> dict[str, str]:
    """The fake cluster as a GPU partition seen from a CPU machine: `nvidia-smi -L` lists no GPU, and the
    accelerate launch (through qa_train.strategy.agent) records its command line in the node's log instead of starting
    processes; any other `python` is the real one."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    agent = (
        '[ "$1 $2 $3" = "-m qa_train.strategy.agent accelerate" ] && shift 3 && echo "accelerate launch $*" && '
        'exit "${FAKE_RANKS_CODE:-0}"\n'
        f'exec {PY} "$@"'
    )
    for name, body in (("nvidia-smi", "exit 0"), ("python", agent)):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = cluster_env(tmp_path, job_id, "ddp", 29743)
    for name in ("QA_TRAIN_CPU", "PROCS_PER_NODE", "GPUS_PER_NODE", "SLURM_GPUS_PER_NODE"):
        env.pop(name, None)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    return env


def test_a_gpu_job_runs_as_many_processes_per_node_as_it_asked_for_gpus(tmp_path: Path) -> None:
    """The script hard-codes no GPU count: the job's own --gpus-per-node (typed, as some sites write it) sets
    the processes per node, each node launching with its own rank."""
    env = gpu_node_env(tmp_path, "7331")
    code, log = sbatch(
        env, tmp_path / "batch.out", "--nodes", "2", "--gpus-per-node", "a100:3", "slurm/train.sbatch", "--seed", "7"
    )
    assert code == 0 and "2 nodes x 3 = 6 processes" in log, log
    for node in (0, 1):
        line = (tmp_path / "logs" / f"node{node}.log").read_text()
        assert f"--num_machines 2 --num_processes 6 --machine_rank {node}" in line and "-m qa_train" in line
        assert "--seed 7" in line


def test_a_gpu_job_ends_with_its_ranks_code(tmp_path: Path) -> None:
    """`accelerate launch` said 1 whatever its ranks said: a diverged (3) or refused (2) run looked like a crash,
    and the preemption trap, which must not requeue those, could not tell them apart. The agent passes the
    ranks' code on."""
    env = {**gpu_node_env(tmp_path, "7336"), "FAKE_RANKS_CODE": "3"}
    code, log = sbatch(env, tmp_path / "batch.out", "--nodes", "1", "--gpus-per-node", "2", "slurm/train.sbatch")
    assert code == 3, log


def test_a_gpu_job_without_gpus_is_refused_in_one_line_before_launching(tmp_path: Path) -> None:
    """Before: no GPU asked for gave `--num_processes 0` to accelerate, and its error named no cause."""
    env = gpu_node_env(tmp_path, "7341")
    code, log = sbatch(env, tmp_path / "batch.out", "--nodes", "1", "slurm/train.sbatch")
    assert code == 2
    assert "slurm/train.sbatch: error: the job has no GPU: submit with --gpus-per-node N" in log
    assert not (tmp_path / "logs").exists()  # srun never ran
    env["GPUS_PER_NODE"] = "four"
    code, log = sbatch(env, tmp_path / "batch2.out", "--nodes", "1", "slurm/train.sbatch")
    assert code == 2 and "GPUS_PER_NODE=four is not a positive count" in log


def test_a_stop_request_folder_left_in_the_output_dir_does_not_fail_the_job(tmp_path: Path) -> None:
    """`mkdir PREEMPT` asks for a stop as `touch PREEMPT` does, but the script's `rm -f` of a spent request failed on
    a folder, and `set -e` ended the job before its launch. An empty one is spent; one holding a file is kept."""
    env = gpu_node_env(tmp_path, "7381")
    request = tmp_path / "out" / "PREEMPT"
    request.mkdir(parents=True)
    code, log = sbatch(env, tmp_path / "batch.out", "--nodes", "1", "--gpus-per-node", "1", "slurm/train.sbatch")
    assert code == 0 and "accelerate launch" in (tmp_path / "logs" / "node0.log").read_text(), log
    assert not request.exists()
    request.mkdir()
    (request / "why.txt").write_text("the user's")
    code, log = sbatch(env, tmp_path / "batch2.out", "--nodes", "1", "--gpus-per-node", "1", "slurm/train.sbatch")
    assert code == 0 and f"warning: {request} is a folder with files in it: kept" in log, log
    assert (request / "why.txt").read_text() == "the user's"


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("MAIN_PORT", "abc", "MAIN_PORT=abc is not a port (1-65535)"),
        ("MAIN_PORT", "99999", "MAIN_PORT=99999 is not a port (1-65535)"),
        ("CONFIG", "accelerate_configs/zero9.yaml", "CONFIG=accelerate_configs/zero9.yaml: no such file in"),
        ("QA_TRAIN_CPU", "yes", "QA_TRAIN_CPU=yes: give 1 for a CPU partition, or 0"),
        ("CHECKPOINTING_STEPS", "-3", "CHECKPOINTING_STEPS=-3 is neither a positive number of steps nor 'epoch'"),
    ],
)
def test_a_bad_variable_is_refused_in_one_line_before_srun(
    variable: str, value: str, said: str, tmp_path: Path
) -> None:
    """Before: each went to every node's launch, where it failed in a traceback per node (a port accelerate cannot
    parse or bind, a config it cannot open), or silently ran on GPUs (QA_TRAIN_CPU=yes)."""
    env = {**cluster_env(tmp_path, "7371", "ddp", 29771), variable: value}
    code, log = sbatch(env, tmp_path / "batch.out", "--nodes", "1", "slurm/train.sbatch")
    assert code == 2 and f"slurm/train.sbatch: error: {said}" in log, log
    assert "Traceback" not in log and not (tmp_path / "logs").exists()  # srun never ran


def test_the_script_run_outside_slurm_says_how_to_submit_it(tmp_path: Path) -> None:
    """Before: `bash slurm/train.sbatch` said only "line 35: SLURM_JOB_ID: unbound variable"."""
    proc = run_cmd(["bash", "slurm/train.sbatch"], {"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("slurm/train.sbatch: error: not in a SLURM job (no SLURM_JOB_ID): submit it with")
    assert len(proc.stderr.splitlines()) == 1 and not proc.stdout


def test_a_gpu_node_sweep_asks_each_job_for_its_gpus(tmp_path: Path) -> None:
    env = gpu_node_env(tmp_path, "7351")
    out = tmp_path / "sweep"
    run_ok(
        [
            PY,
            "-m",
            "qa_train.cli",
            "bench",
            "--slurm",
            "--nodes",
            "2",
            "--procs_per_node",
            "4",
            "--configs",
            "ddp",
            "--max_train_steps",
            "4",
            "--output_dir",
            str(out),
        ],
        env,
    )
    assert "sbatch --nodes 2 --gpus-per-node 4 " in (out / "ddp-n2-r1" / "sbatch.log").read_text()
    assert "2 nodes x 4 = 8 processes" in (out / "ddp-n2-r1" / "slurm-7351.out").read_text()


def test_a_bench_rerun_clears_the_old_run_and_its_stale_stop_request(tmp_path: Path) -> None:
    """A PREEMPT left by a killed run would stop the rerun at its first logging step."""
    from qa_train.studies.slurm_sweep import clear_run_dir

    for name in ("metrics.json", "PREEMPT", "notes.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "logs").mkdir()
    clear_run_dir(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
