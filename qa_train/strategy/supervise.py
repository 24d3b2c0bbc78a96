"""Supervising a launch: its own session, stop signals forwarded, no rank outliving the launcher."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil


def _say(message: str) -> None:
    print(f"qa-train launch: {message}", file=sys.stderr, flush=True)


DEFAULT_GRACE_S = 120.0


RANK_MODULE = "qa_train"  # a process running `python [-u] -m qa_train` is a rank


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


POLL_S = 0.2


LEFTOVER_WAIT_S = 10.0


def agent_command(cmd: list[str], config_file: str | None = None, echo: bool = False) -> list[str]:
    """The same launch through qa_train.strategy.agent, which refuses the accelerate config `config_file` (or the
    one accelerate launch is given) as accelerate would, says a failed rank in one line and exits with its code;
    with `echo`, it prints `+ CMD` once the config passed."""
    said = ["--echo", " ".join(cmd)] if echo else []
    agent = [sys.executable, "-m", "qa_train.strategy.agent"]
    if cmd[0] == "accelerate":
        return [*agent, "accelerate", *said, *cmd[2:]]
    if cmd[1:3] == ["-m", "accelerate.commands.launch"]:
        return [*agent, "accelerate", *said, *cmd[3:]]
    if cmd[1:3] == ["-m", "torch.distributed.run"]:
        checked = ["--accelerate_config", config_file] if config_file else []
        return [*agent, "torchrun", *checked, *said, *cmd[3:]]
    return cmd  # one process, no agent


def run_launch(cmd: list[str], env: dict[str, str], grace_s: float = DEFAULT_GRACE_S) -> int:
    """Run the launch command to its end; its exit code, or the main process's own where torchrun says only 1."""
    from qa_train.core.errors import STATUS_FILE_ENV

    own_file = STATUS_FILE_ENV not in env
    if own_file:
        remove_orphaned_status_files()
        fd, name = tempfile.mkstemp(prefix=f"{STATUS_PREFIX}{os.getpid()}-")
        os.close(fd)
        env = {**env, STATUS_FILE_ENV: name}
    status = Path(env[STATUS_FILE_ENV])
    try:
        code = Supervisor(cmd, env, grace_s).wait()
        return _main_process_code(code, status)
    finally:
        if own_file:
            status.unlink(missing_ok=True)


STATUS_PREFIX = "qa_train-status-"


def remove_orphaned_status_files(folder: Path | None = None) -> list[Path]:
    """The status files of launchers that are gone: one killed by SIGKILL (or a node's hard stop) could not remove
    its own, and each such launch would leave one more in the temp folder. A file carries its launcher's pid; one
    whose pid runs is left (a live launch, or a reused pid: a few bytes kept), as is one this user cannot remove."""
    removed = []
    for path in (folder or Path(tempfile.gettempdir())).glob(f"{STATUS_PREFIX}*-*"):
        pid = path.name.removeprefix(STATUS_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or psutil.pid_exists(int(pid)):
            continue
        try:
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def _main_process_code(code: int, status: Path) -> int:
    try:
        main_code = int(status.read_text().strip())
    except (OSError, ValueError):
        return code
    # torchrun turns any failed rank into 1: rank 0's own code (preempted, diverged, refused) says more.
    return main_code if code != 0 and main_code != 0 else code


class Supervisor:
    """The launch in a session of its own, so stop signals reach the ranks only through here.

    Left in the launcher's process group, torchrun (and accelerate, which runs torchrun) would get the
    group's signals itself: SIGUSR1 kills it and orphans the ranks, which torchrun starts in sessions
    of their own; Ctrl-C becomes SIGINT in the ranks, which dies without a checkpoint.
    """

    def __init__(self, cmd: list[str], env: dict[str, str], grace_s: float) -> None:
        self.grace_s = grace_s
        self.pending: list[int] = []
        self.deadline: float | None = None
        self.me = psutil.Process()
        self.others = {p.pid for p in self.me.children()}  # not ours to stop (a test runner's other children)
        # As subreaper the launcher adopts ranks whose torchrun died, so it can still stop them.
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        # Handlers before the child exists: a signal in between is queued, not the launcher's death.
        self.previous = {sig: signal.signal(sig, self._queue) for sig in STOP_SIGNALS}
        try:
            self.proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_die_with_parent())
        except BaseException:
            self._restore()
            raise

    def _queue(self, signum: int, frame) -> None:  # noqa: ARG002
        self.pending.append(signum)  # acted on in wait(), outside the handler

    def wait(self) -> int:
        try:
            while True:
                try:
                    code = self.proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    self._act()
        finally:
            self._end_leftovers()
            self._restore()
        return code if code >= 0 else 128 - code  # killed by signal N: the shell's 128 + N

    def _restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        _prctl(PR_SET_CHILD_SUBREAPER, 0)

    def _act(self) -> None:
        while self.pending:
            self._on_signal(signal.Signals(self.pending.pop(0)))
        if self.deadline is not None and time.monotonic() >= self.deadline:
            _say(f"the ranks did not stop within {self.grace_s:g} s (--stop_grace_s): killing them")
            self.deadline = None
            kill_all(self._tree())

    def _on_signal(self, sig: signal.Signals) -> None:
        name = "Ctrl-C" if sig == signal.SIGINT else sig.name
        if self.deadline is not None and sig != signal.SIGUSR1:
            _say(f"{name} again: killing the ranks now")
            self.deadline = None
            kill_all(self._tree())
            return
        ranks = outermost([p for p in self._tree() if runs_module(p, RANK_MODULE)])
        # qa_train checkpoints and stops on SIGTERM and SIGUSR1; SIGINT would only raise KeyboardInterrupt there.
        # Before any rank exists, torchrun's own SIGTERM handling stops the launch (SIGUSR1 would kill it).
        if not ranks:
            _say(f"{name}: no rank has started yet: stopping the launch")
            _send([psutil.Process(self.proc.pid)], signal.SIGTERM)
        else:
            _send(ranks, signal.SIGUSR1 if sig == signal.SIGUSR1 else signal.SIGTERM)
            then = "" if sig == signal.SIGUSR1 else f" (killed after {self.grace_s:g} s, or at a second {name})"
            _say(f"{name}: asked {len(ranks)} rank(s) to checkpoint and stop{then}")
        if sig != signal.SIGUSR1 or not ranks:
            self.deadline = time.monotonic() + self.grace_s

    def _tree(self) -> list[psutil.Process]:
        """The child, everything under it, and any orphan of it the launcher adopted."""
        tree: list[psutil.Process] = []
        for top in self.me.children():
            if top.pid not in self.others:
                tree.append(top)
                tree.extend(descendants(top))
        return tree

    def _end_leftovers(self) -> None:
        """Whatever of the tree outlives the child (ranks of a torchrun that died) gets a moment, then SIGKILL."""
        left = self._tree()
        if not left:
            return
        _, alive = psutil.wait_procs(left, timeout=LEFTOVER_WAIT_S)
        if alive:
            _say(f"killing {len(alive)} process(es) the launch left behind: {' '.join(str(p.pid) for p in alive)}")
            kill_all(alive)
            psutil.wait_procs(alive, timeout=5)  # adopted ones are the launcher's to reap


def descendants(p: psutil.Process) -> list[psutil.Process]:
    """Everything under p (none if it is gone)."""
    try:
        return p.children(recursive=True)
    except psutil.Error:
        return []


def runs_module(p: psutil.Process, module: str) -> bool:
    """Whether p is `python [options] -m module ...`: with "qa_train", whether p is a rank. torchrun's and
    accelerate's own command lines name qa_train too, but not as the module they run."""
    try:
        args = iter(p.cmdline()[1:])
    except psutil.Error:
        return False
    for arg in args:
        if arg == "-m":
            return next(args, None) == module
        if arg in ("-X", "-W"):  # interpreter options that take a value
            next(args, None)
        elif not arg.startswith("-"):
            return False  # a script
    return False


def outermost(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of `procs` whose parent is not among them: the ranks, without their forked DataLoader workers (which
    carry the rank's command line, and whose stop is their rank's to make)."""
    pids = {p.pid for p in procs}
    outer = []
    for p in procs:
        try:
            if p.ppid() not in pids:
                outer.append(p)
        except psutil.Error:
            pass  # already gone
    return outer


def _send(procs: list[psutil.Process], sig: signal.Signals) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass  # already gone


def kill_all(procs: list[psutil.Process]) -> None:
    # No wait here: psutil would reap the child under Popen, which then reads its exit code as 0.
    _send(procs, signal.SIGKILL)


def _prctl(option: int, value: int) -> None:
    """Linux's prctl(2); elsewhere the launcher relies on forwarding alone."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _die_with_parent() -> Callable[[], object] | None:
    """A preexec_fn: the child gets SIGTERM (torchrun then stops its ranks) if the launcher dies, even by SIGKILL."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child
    return lambda: prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
