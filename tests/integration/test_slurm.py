"""slurm/train.sbatch on a fake 2-node cluster: real launch, real ranks, on loopback.

tests/fake_slurm puts `sbatch`, `srun` and `scontrol` first on PATH; each "node" is a process
with the variables a real cluster sets (SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST, ...).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import PY, ROOT, base_env, port, read_metrics, run_cmd, run_ok, tiny_flags

pytestmark = pytest.mark.distributed
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


@pytest.mark.parametrize(("config", "strategy", "base_port"), [("ddp", "ddp", 29721), ("zero2", "zero2", 29722)])
def test_two_nodes_form_one_world(config: str, strategy: str, base_port: int, tmp_path: Path) -> None:
    env = cluster_env(tmp_path, f"71{base_port % 100}", config, base_port)
    proc = run_ok(["sbatch", "--nodes", "2", "slurm/train.sbatch", *train_flags(6)], env)
    assert "2 nodes x 1 = 2 processes" in proc.stdout
    # Compiled graphs are cached in the submit directory, which a requeued job on other nodes still sees.
    assert f"compile cache {ROOT / '.cache' / 'torchinductor'}" in proc.stdout
    m = read_metrics(tmp_path / "out")
    assert (m["world_size"], m["strategy"], m["train_steps"]) == (2, strategy, 6)
    assert m["train_loss_per_rank"][0] == m["train_loss_per_rank"][1]
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert logs == ["node0.log", "node1.log"]
    # Each node launched with its own rank: a rank read once on the submit host would give two rank-0s.
    node1 = (tmp_path / "logs" / "node1.log").read_text()
    assert "--machine_rank 1" in node1 or "--node_rank 1" in node1


def test_warning_signal_checkpoints_requeues_and_resumes(tmp_path: Path) -> None:
    env = cluster_env(tmp_path, "7301", "ddp", 29731)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")  # the user's own cache wins over the default
    # The ranks hold after step 10 until asked to stop; the scheduler's warning signal comes once they hold.
    env.update({"QA_TRAIN_TEST_HOLD_AT_STEP": "10", "FAKE_SLURM_SIGNAL_WHEN": str(tmp_path / "out" / "HOLDING-rank0")})
    proc = run_ok(["sbatch", "--nodes", "2", "slurm/train.sbatch", *train_flags(40)], env, timeout=900)
    assert "warning signal" in proc.stdout and "job requeued" in proc.stdout
    assert "start 1" in proc.stdout  # the fake scheduler ran the requeued job
    assert proc.stdout.count(f"compile cache {tmp_path / 'inductor'}") == 2, "both starts keep the user's cache"
    node0 = (tmp_path / "logs" / "node0.log").read_text()
    assert "stop requested: checkpoint saved at step" in node0
    stopped_at = int(node0.split("stop requested: checkpoint saved at step ")[1].split(";")[0])
    assert stopped_at == 10
    assert f"resumed from {tmp_path / 'out'}/checkpoints/step_{stopped_at:08d}" in node0
    m = read_metrics(tmp_path / "out")
    assert (m["world_size"], m["train_steps"]) == (2, 40)
    steps = {json.loads(x)["step"] for x in (tmp_path / "out" / "train_log.jsonl").read_text().splitlines()}
    assert steps == set(range(1, 41))
    assert not (tmp_path / "out" / "PREEMPT").exists()


def test_a_job_requeued_on_fewer_nodes_continues_with_the_same_global_batch(tmp_path: Path) -> None:
    """Preempted on 2 nodes, the job comes back on 1 (`scontrol update JobId=... NumNodes=1` while it waits) with
    its command unchanged: the run refits its accumulation to keep the global batch and continues its checkpoint."""
    env = cluster_env(tmp_path, "7321", "ddp", 29761)
    env.update(
        {
            "QA_TRAIN_TEST_HOLD_AT_STEP": "6",
            "FAKE_SLURM_SIGNAL_WHEN": str(tmp_path / "out" / "HOLDING-rank0"),
            "FAKE_SLURM_REQUEUE_NODES": "1",
        }
    )
    proc = run_ok(["sbatch", "--nodes", "2", "slurm/train.sbatch", *train_flags(10)], env, timeout=900)
    assert "2 nodes x 1 = 2 processes" in proc.stdout and "1 nodes x 1 = 1 processes" in proc.stdout
    node0 = (tmp_path / "logs" / "node0.log").read_text()
    assert "stop requested: checkpoint saved at step 6" in node0
    checkpoint = tmp_path / "out" / "checkpoints" / "step_00000006"
    assert (
        f"resuming {checkpoint}, written by 2 processes, on 1: --gradient_accumulation_steps 1 -> 2 keeps its "
        "global batch of 16" in node0
    )
    assert f"resumed from {checkpoint} at step 6 (epoch 0, batch 12)" in node0, "6 steps of 16 windows, 8 a batch"
    m = read_metrics(tmp_path / "out")
    assert (m["world_size"], m["train_steps"], m["global_batch_size"]) == (1, 10, 16)
    steps = [json.loads(x)["step"] for x in (tmp_path / "out" / "train_log.jsonl").read_text().splitlines()]
    assert sorted(set(steps)) == list(range(1, 11))


def test_a_warning_signal_after_the_training_loop_does_not_requeue_the_finished_run(tmp_path: Path) -> None:
    """The warning comes once the run is past its loop (metrics.json is written before the export): the run
    finishes without seeing the stop request, and a requeue would train again from the last checkpoint and
    export over the finished run. The same job checks that a --checkpointing_steps flag given to it wins over
    the script's CHECKPOINTING_STEPS default (4 here), which used to drop it."""
    env = cluster_env(tmp_path, "7311", "ddp", 29751)
    env["FAKE_SLURM_SIGNAL_WHEN"] = str(tmp_path / "out" / "metrics.json")
    proc = run_ok(["sbatch", "--nodes", "1", "slurm/train.sbatch", *train_flags(6), "--checkpointing_steps", "2"], env)
    assert "warning signal" in proc.stdout and "not requeued" in proc.stdout, proc.stdout
    assert "start 1" not in proc.stdout and "job requeued" not in proc.stdout
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
    proc = run_ok(["sbatch", "--nodes", "2", "--gpus-per-node", "a100:3", "slurm/train.sbatch", "--seed", "7"], env)
    assert "2 nodes x 3 = 6 processes" in proc.stdout
    for node in (0, 1):
        line = (tmp_path / "logs" / f"node{node}.log").read_text()
        assert f"--num_machines 2 --num_processes 6 --machine_rank {node}" in line and "-m qa_train" in line
        assert "--seed 7" in line


def test_a_gpu_job_ends_with_its_ranks_code(tmp_path: Path) -> None:
    """`accelerate launch` said 1 whatever its ranks said: a diverged (3) or refused (2) run looked like a crash,
    and the preemption trap, which must not requeue those, could not tell them apart. The agent passes the
    ranks' code on."""
    env = {**gpu_node_env(tmp_path, "7336"), "FAKE_RANKS_CODE": "3"}
    proc = run_cmd(["sbatch", "--nodes", "1", "--gpus-per-node", "2", "slurm/train.sbatch"], env)
    assert proc.returncode == 3, proc.stdout + proc.stderr


def test_a_gpu_job_without_gpus_is_refused_in_one_line_before_launching(tmp_path: Path) -> None:
    """Before: no GPU asked for gave `--num_processes 0` to accelerate, and its error named no cause."""
    env = gpu_node_env(tmp_path, "7341")
    proc = run_cmd(["sbatch", "--nodes", "1", "slurm/train.sbatch"], env)
    assert proc.returncode == 2
    assert "slurm/train.sbatch: error: the job has no GPU: submit with --gpus-per-node N" in proc.stderr
    assert not (tmp_path / "logs").exists()  # srun never ran
    env["GPUS_PER_NODE"] = "four"
    proc = run_cmd(["sbatch", "--nodes", "1", "slurm/train.sbatch"], env)
    assert proc.returncode == 2 and "GPUS_PER_NODE=four is not a positive count" in proc.stderr


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
    log = (out / "ddp-n2-r1" / "sbatch.log").read_text()
    assert "sbatch --nodes 2 --gpus-per-node 4 " in log and "2 nodes x 4 = 8 processes" in log


def test_node_sweep_submits_one_job_per_point_and_reports_speedup_against_one_node(tmp_path: Path) -> None:
    """`qa_train.studies.bench --slurm --nodes 1 2` on the fake cluster: one sbatch per point, each into its own run dir
    through the real slurm/train.sbatch; then qa_train.studies.report over the sweep's directory gives the same table."""
    env = base_env(tmp_path)
    env.update(
        {
            "PATH": f"{FAKE}:{Path(PY).parent}:{env['PATH']}",
            "FAKE_SLURM_DIR": str(tmp_path / "slurm-state"),
            "FAKE_SLURM_PYTHON": PY,
            "MAIN_PORT": str(port(29741)),
            "OMP_NUM_THREADS": "1",
        }
    )
    out = tmp_path / "sweep"
    proc = run_ok(
        [
            PY,
            "-m",
            "qa_train.cli",
            "bench",
            "--slurm",
            "--cpu",
            "--nodes",
            "1",
            "2",
            "--procs_per_node",
            "1",
            "--configs",
            "ddp",
            "--max_train_steps",
            "4",
            "--output_dir",
            str(out),
            "--",
            "--no_eval",
            "--logging_steps",
            "2",
            "--max_train_samples",
            "300",
        ],
        env,
    )
    assert "submitted 2 of 2 jobs" in proc.stdout
    for nodes in (1, 2):
        run = out / f"ddp-n{nodes}-r1"
        m = read_metrics(run)
        assert (m["world_size"], m["train_steps"], m["output_dir"]) == (nodes, 4, str(run))
        assert f"{nodes} nodes x 1 = {nodes} processes" in (run / "sbatch.log").read_text()
        assert sorted(p.name for p in (run / "logs").iterdir()) == [f"node{i}.log" for i in range(nodes)]
        assert json.loads((run / "sweep_point.json").read_text())["nodes"] == nodes
    saved = json.loads((out / "report" / "report.json").read_text())
    one, two = saved["groups"]
    assert (one["nodes"], one["processes"], two["nodes"], two["processes"]) == (1, 1, 2, 2)
    rate = [read_metrics(out / f"ddp-n{n}-r1")["train_samples_per_second"] for n in (1, 2)]
    assert two["speedup"]["median"] == pytest.approx(rate[1] / rate[0]) and one["speedup"]["median"] == 1.0
    again = run_ok([PY, "-m", "qa_train.cli", "report", str(out), "--output", str(tmp_path / "report")], env)
    assert json.loads((tmp_path / "report" / "report.json").read_text())["table"] == saved["table"]
    assert "| ddp | ddp | 2 | 2 | 1 |" in again.stdout


def test_a_bench_rerun_clears_the_old_run_and_its_stale_stop_request(tmp_path: Path) -> None:
    """A PREEMPT left by a killed run would stop the rerun at its first logging step."""
    from qa_train.studies.slurm_sweep import clear_run_dir

    for name in ("metrics.json", "PREEMPT", "notes.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "logs").mkdir()
    clear_run_dir(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
