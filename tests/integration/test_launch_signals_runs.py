"""qa_train.strategy.launch and stop signals: every rank is asked to checkpoint and stop, and nothing outlives the launcher.

The fast tests run the real launcher code over a fake torchrun and fake ranks (a stand-in `qa_train` package on
the children's PYTHONPATH, so the launcher recognises them as ranks by their `-m qa_train`); the slower ones
stop a real two-process DDP run held at a known step."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

import psutil
import pytest
from conftest import PY, ROOT, base_env, cpu_launch, high_padding_model, port, tiny_flags

from qa_train.strategy import supervise

# A torchrun stand-in: starts the ranks in sessions of their own and, like torchrun, passes SIGTERM/SIGINT on to
# each rank's group. Its SIGUSR1 is left at the default (death), as torchrun's is.
FAKE_TORCHRUN = """
import os, signal, subprocess, sys, time
n, mode = int(sys.argv[1]), sys.argv[2]
ranks = [subprocess.Popen([sys.executable, "-u", "-m", "qa_train"], env={**os.environ, "RANK": str(r)},
                          start_new_session=True) for r in range(n)]

def forward(signum, frame):
    open(os.path.join(os.environ["FAKE_OUT"], "torchrun-" + signal.Signals(signum).name), "w").close()
    for p in ranks:
        try:
            os.killpg(p.pid, signum)
        except ProcessLookupError:
            pass

signal.signal(signal.SIGTERM, forward)
signal.signal(signal.SIGINT, forward)
if mode == "crash":
    while not all(os.path.exists(os.path.join(os.environ["FAKE_OUT"], f"READY-rank{r}")) for r in range(n)):
        time.sleep(0.02)
    sys.exit(3)  # dies under its ranks
codes = [p.wait() for p in ranks]
sys.exit(1 if any(codes) else 0)  # torchrun reports any failed rank as 1
"""


# A rank stand-in: records each stop signal; in "stop" mode it then exits as a preempted qa_train does (rank 0
# reporting its code through the launcher's status file), in "ignore" mode it carries on.
FAKE_RANK = """
import os, signal, sys, time
out, rank, mode = os.environ["FAKE_OUT"], os.environ["RANK"], os.environ["FAKE_MODE"]

def handle(signum, frame):
    open(os.path.join(out, f"rank{rank}-" + signal.Signals(signum).name), "w").close()
    if mode == "stop":
        if rank == "0":
            with open(os.environ["QA_TRAIN_STATUS_FILE"], "w") as f:
                f.write("75\\n")
        sys.exit(75)

signal.signal(signal.SIGTERM, handle)
signal.signal(signal.SIGUSR1, handle)
open(os.path.join(out, f"READY-rank{rank}"), "w").close()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    time.sleep(0.02)
"""


# The launcher as users run it (its own process), over the fake command; the fake tree gets its own PYTHONPATH.
LAUNCHER = """
import os, sys
from qa_train.strategy import supervise
supervise.LEFTOVER_WAIT_S = 1.0
env = {**os.environ, "PYTHONPATH": sys.argv[1]}
sys.exit(supervise.run_launch(sys.argv[3:], env, float(sys.argv[2])))
"""


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def _wait_for(paths: list[Path], proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert proc.poll() is None, f"the launch ended early ({proc.returncode})"
        assert time.monotonic() < deadline, f"not written in {timeout} s: {[str(p) for p in paths]}"
        time.sleep(0.05)


class FakeLaunch:
    """The launcher over a fake torchrun with `n` fake ranks; `out` collects what each process saw."""

    def __init__(
        self,
        tmp_path: Path,
        temp: Path,
        rank_mode: str = "stop",
        torchrun_mode: str = "wait",
        grace_s: float = 30.0,
    ) -> None:
        self.out = tmp_path / "seen"
        self.out.mkdir()
        fake = tmp_path / "fake"
        (fake / "qa_train").mkdir(parents=True)
        (fake / "qa_train" / "__main__.py").write_text(FAKE_RANK)
        (fake / "torchrun.py").write_text(FAKE_TORCHRUN)
        temp.mkdir(exist_ok=True)  # the launcher's temp folder (its status file), the test's own
        env = {**os.environ, "PYTHONPATH": str(ROOT), "FAKE_OUT": str(self.out), "FAKE_MODE": rank_mode}
        env["TMPDIR"] = str(temp)
        env.pop("QA_TRAIN_STATUS_FILE", None)
        self.log = tmp_path / "launcher.err"
        self.tree: list[psutil.Process] = []
        # cwd outside both packages: `python -m` looks in the current directory first.
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(
                [PY, "-c", LAUNCHER, str(fake), str(grace_s), PY, str(fake / "torchrun.py"), "2", torchrun_mode],
                cwd=tmp_path,
                env=env,
                stderr=err,
                start_new_session=True,
            )

    def ready(self) -> FakeLaunch:
        _wait_for([self.out / "READY-rank0", self.out / "READY-rank1"], self.proc, 30)
        self.tree = psutil.Process(self.proc.pid).children(recursive=True)
        return self

    def saw(self) -> set[str]:
        return {p.name for p in self.out.iterdir() if not p.name.startswith("READY")}

    def finish(self, timeout: float = 20) -> int:
        code = self.proc.wait(timeout=timeout)
        psutil.wait_procs(self.tree, timeout=2)
        left = [p for p in self.tree if _alive(p)]
        assert not left, f"left behind: {[(p.pid, p.cmdline()) for p in left]}"
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.tree += psutil.Process(self.proc.pid).children(recursive=True)
            self.proc.kill()
            self.proc.wait()
        _kill(self.tree)


@pytest.fixture
def fake_launch(tmp_path: Path):
    made: list[FakeLaunch] = []

    def start(**kw: object) -> FakeLaunch:
        folder = tmp_path / f"launch-{len(made)}" if made else tmp_path  # a test's later launches: their own
        folder.mkdir(exist_ok=True)
        made.append(FakeLaunch(folder, tmp_path / "tmp", **kw))  # type: ignore[arg-type]
        return made[-1].ready()

    yield start
    for f in made:  # a failed assertion must not leave the fake tree running
        f.kill()


# `qa-train launch` up to the supervision of its launch (faked: the command is printed), then what it imported.
LAUNCHER_IMPORTS = """
import sys
from qa_train.strategy import launch
launch.run_launch = lambda cmd, env, grace_s: print(" ".join(cmd)) or 0
code = launch.main(sys.argv[1:])
print(sorted(m for m in ("accelerate", "torch", "transformers") if m in sys.modules))
sys.exit(code)
"""


@pytest.mark.parametrize("config", ["ddp", "zero2", "fsdp"])
def test_the_launcher_leaves_torch_to_the_agent(config: str) -> None:
    """The launcher only supervises, for the whole run: accelerate's checks of the config, and the imports of
    accelerate and torch that they need (seconds before the agent even starts), are the agent's, which imports both."""
    argv = ["--cpu", "--config_file", f"accelerate_configs/{config}.yaml", "--num_processes", "2", "--", "--x"]
    proc = subprocess.run([PY, "-c", LAUNCHER_IMPORTS, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    command, imported = proc.stdout.splitlines()
    assert command.startswith(f"{PY} -m qa_train.strategy.agent ") and command.endswith(" -m qa_train --x")
    assert imported == "[]"


def test_the_tree_is_launcher_torchrun_and_two_ranks(fake_launch) -> None:
    run = fake_launch()
    ranks = [p for p in run.tree if supervise.runs_module(p, "qa_train")]
    assert len(run.tree) == 3 and len(ranks) == 2
    # The launch runs in a session of its own: the launcher's group reaches only the launcher.
    assert all(os.getsid(p.pid) != os.getsid(run.proc.pid) for p in run.tree)
    run.kill()


def test_sigterm_to_the_group_reaches_every_rank_and_the_main_code_is_returned(fake_launch) -> None:
    run = fake_launch()
    os.killpg(run.proc.pid, signal.SIGTERM)
    assert run.finish() == 75  # rank 0's own code, where torchrun says only 1
    assert run.saw() == {"rank0-SIGTERM", "rank1-SIGTERM"}  # torchrun itself was left to see its ranks exit
    assert "SIGTERM: asked 2 rank(s) to checkpoint and stop (killed after 30 s" in run.log.read_text()


def test_sigusr1_reaches_the_ranks_and_does_not_kill_torchrun(fake_launch) -> None:
    run = fake_launch()
    os.killpg(run.proc.pid, signal.SIGUSR1)
    assert run.finish() == 75
    assert run.saw() == {"rank0-SIGUSR1", "rank1-SIGUSR1"}


def test_ctrl_c_asks_the_ranks_for_a_checkpoint(fake_launch) -> None:
    run = fake_launch()
    os.killpg(run.proc.pid, signal.SIGINT)
    assert run.finish() == 75
    # SIGTERM, qa_train's stop request: SIGINT would be a KeyboardInterrupt there, without a checkpoint.
    assert run.saw() == {"rank0-SIGTERM", "rank1-SIGTERM"}
    assert "Ctrl-C: asked 2 rank(s) to checkpoint and stop" in run.log.read_text()


def test_ranks_that_do_not_stop_are_killed_after_the_grace_period(fake_launch) -> None:
    run = fake_launch(rank_mode="ignore", grace_s=1.0)
    t0 = time.monotonic()
    os.killpg(run.proc.pid, signal.SIGTERM)
    assert run.finish() == 128 + signal.SIGKILL  # the launch was killed
    assert time.monotonic() - t0 < 10
    assert {"rank0-SIGTERM", "rank1-SIGTERM"} <= run.saw()
    assert "did not stop within 1 s (--stop_grace_s): killing them" in run.log.read_text()


def test_a_second_ctrl_c_kills_at_once(fake_launch) -> None:
    run = fake_launch(rank_mode="ignore", grace_s=60.0)
    os.killpg(run.proc.pid, signal.SIGINT)
    _wait_for([run.out / "rank0-SIGTERM", run.out / "rank1-SIGTERM"], run.proc, 10)
    t0 = time.monotonic()
    os.killpg(run.proc.pid, signal.SIGINT)
    assert run.finish() == 128 + signal.SIGKILL
    assert time.monotonic() - t0 < 10
    assert "Ctrl-C again: killing the ranks now" in run.log.read_text()


def test_ranks_orphaned_by_a_dying_torchrun_are_adopted_and_killed(fake_launch) -> None:
    run = fake_launch(rank_mode="ignore", torchrun_mode="crash")
    assert run.finish() == 3  # torchrun's own code
    assert "killing 2 process(es) the launch left behind" in run.log.read_text()


def test_a_killed_launcher_takes_its_launch_with_it(fake_launch, tmp_path: Path) -> None:
    """SIGKILL leaves the launcher no say: its child's parent-death signal (SIGTERM) makes torchrun stop the ranks.
    Nor can it remove its status file, where rank 0 still writes its code: the next launch removes it."""
    run = fake_launch()
    os.kill(run.proc.pid, signal.SIGKILL)
    run.proc.wait(timeout=10)
    gone, alive = psutil.wait_procs(run.tree, timeout=20)
    assert not [p for p in alive if _alive(p)]
    assert run.saw() == {"torchrun-SIGTERM", "rank0-SIGTERM", "rank1-SIGTERM"}
    [left] = (tmp_path / "tmp").iterdir()
    assert left.name.startswith(f"{supervise.STATUS_PREFIX}{run.proc.pid}-") and left.read_text() == "75\n"
    after = fake_launch()
    assert left.name not in [p.name for p in (tmp_path / "tmp").iterdir()]
    os.killpg(after.proc.pid, signal.SIGTERM)
    assert after.finish() == 75
    assert not list((tmp_path / "tmp").iterdir())  # its own, removed as it ended


RANK_SCRIPT = """
import os, signal, sys
rank = int(os.environ.get("RANK", "0"))
print(f"rank {rank} says why", file=sys.stderr)
if os.environ["HOW"] == "kill" and rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(os.environ["HOW"]) if rank == 1 or os.environ.get("WORLD_SIZE", "1") == "1" else 0)
"""


def without_log_dir(env: dict[str, str]) -> dict[str, str]:
    """`env` without the suite's PET_LOG_DIR, so that a launch's log folder is the agent's choice."""
    return {name: value for name, value in env.items() if name != "PET_LOG_DIR"}


@pytest.mark.parametrize(
    ("how", "code", "said"),
    [
        ("75", 75, "rank 1 exited with 75 (its own lines above say why)"),
        # A SIGKILLed rank says nothing: the line says where SIGKILL comes from instead.
        (
            "kill",
            137,
            "rank 1 was killed by SIGKILL (it could say nothing: the kernel's out-of-memory killer sends "
            "SIGKILL when host memory runs out (dmesg says so), as do kill -9 and a scheduler's hard limits)",
        ),
    ],
)
def test_the_agent_exits_with_the_failed_ranks_code_in_one_line(tmp_path: Path, how: str, code: int, said: str) -> None:
    """torchrun's ChildFailedError was a 35-line traceback and exit 1: on a machine without rank 0 (which the
    launcher's status file cannot speak for) a preempted rank's 75 became 1, and SLURM saw a failure. No log folder
    is left in the temp folder (torchrun's default made one per launch), and the failed rank is named without one."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.run(
        [
            PY,
            "-m",
            "qa_train.strategy.agent",
            "torchrun",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(port(29781 if how == "75" else 29782)),
            str(script),
        ],
        cwd=ROOT,
        env={**without_log_dir(base_env(tmp_path)), "HOW": how, "TMPDIR": str(temp)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == code, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "rank 1 says why" in proc.stderr
    assert f"qa-train launch: {said}\n" in proc.stderr
    assert "failed (exitcode" not in proc.stderr, proc.stderr[-3000:]  # torch's own line of it: ours says it once
    assert list(temp.iterdir()) == []


def test_an_agent_told_to_stop_says_so_in_one_line(tmp_path: Path) -> None:
    """SIGTERM to torchrun itself (the launcher's stop before any rank exists, or its parent-death signal) raised
    torch's SignalException out of the agent: a traceback and exit 1."""
    script = tmp_path / "rank.py"
    script.write_text("import pathlib, sys, time\npathlib.Path(sys.argv[1]).touch()\ntime.sleep(60)\n")
    started = tmp_path / "started"
    proc = subprocess.Popen(
        [
            PY,
            "-m",
            "qa_train.strategy.agent",
            "torchrun",
            "--nproc_per_node",
            "1",
            "--master_port",
            str(port(29783)),
            str(script),
            str(started),
        ],
        cwd=ROOT,
        env=base_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for([started], proc, 60)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr and stderr.endswith("qa-train launch: the launch was stopped by SIGTERM\n")


def test_accelerates_single_process_launch_fails_in_one_line_with_the_runs_code(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    proc = subprocess.run(
        [
            PY,
            "-m",
            "qa_train.strategy.agent",
            "accelerate",
            "--cpu",
            "--num_processes",
            "1",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            str(script),
        ],
        cwd=ROOT,
        env={**base_env(tmp_path), "HOW": "3"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "rank 0 says why" in proc.stderr
    assert proc.stderr.endswith("qa-train launch: the run exited with 3 (its own lines above say why)\n")


# --- the real launch ----------------------------------------------------------------------------


class Signalled(NamedTuple):
    code: int
    tree: list[psutil.Process]  # the run's processes when it was signalled
    running_qa_train: int  # how many of them ran `-m qa_train` then (ranks, and the loader workers they forked)
    left: list[psutil.Process]  # those still alive after it ended
    elapsed: float  # seconds from the signal to the end of every process
    log: str


def _ctrl_c_as_in_a_terminal() -> None:
    """A suite started in the background by a shell (`make test &`) ignores SIGINT, and so would the run, as qa_train
    leaves an ignored Ctrl-C ignored (nohup): the run is started as from a terminal, where Ctrl-C is at its default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signal_held_run(cmd: list[str], out: Path, ranks: int, sig: signal.Signals, tmp_path: Path) -> Signalled:
    """Run `cmd` in a session of its own, held after step 3 by the test hook; once every rank holds, send `sig`
    to its whole group (as `kill -<sig> -<pgid>`, SLURM and Ctrl-C do) and wait for every process to end."""
    env = {**base_env(tmp_path), "QA_TRAIN_TEST_HOLD_AT_STEP": "3", "OMP_NUM_THREADS": "1"}
    log = tmp_path / "run.log"
    with log.open("w") as f:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_ctrl_c_as_in_a_terminal,
        )
    tree: list[psutil.Process] = []
    try:
        _wait_for([out / f"HOLDING-rank{r}" for r in range(ranks)], proc, 90)
        tree = psutil.Process(proc.pid).children(recursive=True)
        running = sum(supervise.runs_module(p, "qa_train") for p in tree)
        t0 = time.monotonic()
        os.killpg(proc.pid, sig)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not end within 60 s of {sig.name}\n{_why_stuck(proc, log)}")
        _, alive = psutil.wait_procs(tree, timeout=max(1.0, 60 - (time.monotonic() - t0)))
        left = [p for p in alive if _alive(p)]
        return Signalled(code, tree, running, left, time.monotonic() - t0, log.read_text())
    finally:  # a failed assertion must not leave the run going
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _kill(tree)


def _why_stuck(proc: subprocess.Popen, log: Path) -> str:
    """What a run that ignored its stop signal was doing: each thread's signal masks (an ignored or blocked SIGINT
    inherited from the test process would hold it until the test hook gives up) and, through faulthandler's SIGABRT
    (PYTHONFAULTHANDLER, base_env), every thread's Python stack at the end of its log."""
    masks = []
    for task in sorted(Path(f"/proc/{proc.pid}/task").glob("*")):
        try:
            lines = (task / "status").read_text().splitlines()
        except OSError:
            continue
        masks.append(f"thread {task.name}: " + " ".join(x for x in lines if x.startswith(("Name", "Sig", "ShdPnd"))))
    proc.send_signal(signal.SIGABRT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    return "\n".join([*masks, log.read_text()[-6000:]])


@pytest.mark.parametrize(
    ("sig", "base_port"),
    [(signal.SIGTERM, 29771), (signal.SIGINT, 29772), (signal.SIGKILL, 29774)],
    ids=["SIGTERM", "SIGINT", "SIGKILL"],
)
def test_a_signal_to_the_launchers_group_checkpoints_every_rank_and_leaves_no_process(
    sig: signal.Signals, base_port: int, tmp_path: Path
) -> None:
    """`kill -<sig> -<pgid>` of a 2-process DDP launch held after step 3 (SIGINT: Ctrl-C in a terminal): every
    rank checkpoints and exits, and no process of the launch outlives it. SIGKILL leaves the launcher no say:
    its child's parent-death signal stops the ranks instead. (SIGUSR1 reaches real ranks from SLURM's own warning
    in test_slurm_cluster.py.) Found by a rank-discipline hunt: the "stop requested" warning came once per rank, and
    so did transformers' "Loading weights" bar (every rank loads the model): both are the main process's alone."""
    out = tmp_path / "run"
    cmd = [
        *cpu_launch("ddp", port(base_port)),
        *tiny_flags(
            out, "--max_train_steps", "8", "--logging_steps", "1", "--no_eval", "--dataloader_num_workers", "1"
        ),
        "--model_name_or_path",
        str(high_padding_model(tmp_path / "model")),
    ]
    run = _signal_held_run(cmd, out, 2, sig, tmp_path)
    assert run.running_qa_train == 4  # two ranks, each with its loader worker
    assert not run.left, f"outlived the launcher: {[(p.pid, p.cmdline()) for p in run.left]}\n{run.log[-3000:]}"
    assert run.elapsed < 60
    assert (out / "checkpoints" / "step_00000003" / "trainer_state.json").is_file(), run.log[-3000:]
    assert not (out / "metrics.json").exists()
    assert run.log.count("Loading weights: 100%") == 1, run.log[-3000:]
    if sig != signal.SIGKILL:
        from qa_train.core.errors import PREEMPTED

        assert run.code == PREEMPTED, run.log[-3000:]  # rank 0's own "preempted", where torchrun says only 1
        assert "asked 2 rank(s) to checkpoint and stop" in run.log, run.log[-3000:]
        assert run.log.count("stop requested: checkpoint saved at step 3") == 1, run.log[-3000:]


# --- one process with dataloader workers ------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_to_the_group_of_a_run_with_loader_workers_checkpoints(
    sig: signal.Signals, tmp_path: Path
) -> None:
    """SLURM's preemption and scancel signal every process of the job, the dataloader workers too, as Ctrl-C in a
    terminal does: a worker must not die of it (torch's own handler kills it, and the main process then fails on
    "DataLoader worker killed") but leave the main process to checkpoint, exit 75 and shut its workers down.
    Ctrl-C was a KeyboardInterrupt traceback in the main process, without a checkpoint."""
    from qa_train.core.errors import PREEMPTED
    from qa_train.strategy.checkpoint import complete_checkpoints, verify

    out = tmp_path / "run"
    cmd = [
        PY,
        "-m",
        "qa_train",
        *tiny_flags(
            out,
            "--max_train_steps",
            "8",
            "--logging_steps",
            "1",
            "--no_eval",
            "--disable_tqdm",
            "--dataloader_num_workers",
            "2",
        ),
    ]
    run = _signal_held_run(cmd, out, 1, sig, tmp_path)
    assert len(run.tree) >= 2, [p.cmdline() for p in run.tree]  # the workers were there to be signalled
    assert run.code == PREEMPTED, run.log[-3000:]
    assert [p.name for p in complete_checkpoints(out)] == ["step_00000003"], run.log[-3000:]
    assert verify(out / "checkpoints" / "step_00000003") is None
    assert not run.left, "a dataloader worker outlived its run"


def test_a_stop_signal_during_start_up_stops_the_run_at_its_first_step(tmp_path: Path) -> None:
    """SIGTERM comes once the output dir is claimed, while the rank still imports and loads (seconds here, minutes
    on SQuAD) before the trainer's own handler exists: it must not kill the rank by the default action (exit 143,
    which torchrun reports as a crash) but stop it with a checkpoint, as at any other moment, and at the first
    step, not --logging_steps later (a scheduler's grace period may not last that long). SIGUSR1 takes the same
    handler (catch_early_stop_signals; SLURM's warning test sends it to ranks that may still be starting)."""
    from qa_train.core.errors import PREEMPTED
    from qa_train.strategy.checkpoint import complete_checkpoints

    out = tmp_path / "run"
    env = {**base_env(tmp_path), "OMP_NUM_THREADS": "1"}
    cmd = [
        PY,
        "-m",
        "qa_train",
        *tiny_flags(out, "--max_train_steps", "8", "--logging_steps", "5", "--no_eval", "--disable_tqdm"),
    ]
    log = tmp_path / "run.log"
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not out.is_dir():  # claimed: the flags are parsed, torch and the data are still to come
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == PREEMPTED, log.read_text()[-3000:]
    assert [p.name for p in complete_checkpoints(out)] == ["step_00000001"]
