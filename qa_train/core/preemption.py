"""Stop requests: SLURM's warning signal, or a PREEMPT file, asks every rank for a checkpoint and exit."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

PREEMPT_FILE = "PREEMPT"
# A PREEMPT file older than the process by more than this is a request to an earlier run; the margin covers the
# process start time's tick and a shared file system's clock.
STALE_MARGIN_S = 2.0
# When the launch began (seconds since the epoch), set by qa-train launch and slurm/train.sbatch for their ranks: a
# stop request written while they were starting (SLURM's warning before the launch) is this run's.
RUN_STARTED_ENV = "QA_TRAIN_RUN_STARTED"
log = logging.getLogger("qa_train")
# Test hook: with QA_TRAIN_TEST_HOLD_AT_STEP=N every rank writes OUTPUT_DIR/HOLDING-rank<r> after
# optimizer step N and waits there until a stop is requested or the process is killed, so tests stop
# a run at a chosen step instead of slowing every step. Never set in real runs. A rank nobody stops
# goes on after HOLD_LIMIT_S, so a failed test cannot leave processes waiting forever. With
# QA_TRAIN_TEST_HOLD_RANKS=1,3 only those ranks hold: a hung rank, as the others see it.
HOLD_ENV = "QA_TRAIN_TEST_HOLD_AT_STEP"
HOLD_RANKS_ENV = "QA_TRAIN_TEST_HOLD_RANKS"
HOLD_LIMIT_S = 300.0
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
_early_request = False  # a stop signal that came before the run's StopRequest existed


def _early_stop(signum, frame) -> None:  # noqa: ARG001
    global _early_request
    _early_request = True
    if signum == signal.SIGINT:
        _ctrl_c()


def _ctrl_c() -> None:
    """The first Ctrl-C is a stop request; the next one ends the process at once, as Ctrl-C does by default (130)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if os.environ.get("RANK", "0") == "0":  # os.write: a handler may run while the logging module holds its lock
        os.write(2, b"qa_train: Ctrl-C: stopping with a checkpoint at the next logged step; Ctrl-C again stops now\n")


def catch_early_stop_signals() -> None:
    """From a rank's first line: a stop signal during start-up (imports, data, model; minutes on SQuAD) is kept
    for StopRequest, which acts on it at the first step. Left at their default, SIGUSR1 and SIGTERM would
    kill the rank there without a word (exit 138 or 143, where a stop request promises a checkpoint and 75),
    and Ctrl-C would end it in a KeyboardInterrupt traceback."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _early_stop)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where it is ignored (nohup, `&`)
        signal.signal(signal.SIGINT, _early_stop)


class StopRequest:
    """SIGUSR1/SIGTERM (SLURM's warning signal) or a PREEMPT file in output_dir asks for a checkpoint and exit."""

    def __init__(self, output_dir: Path) -> None:
        self.flag = False
        self.output_dir = output_dir
        self.file = output_dir / PREEMPT_FILE
        self.started = _process_start()
        self.told_stale = False
        self.told_unreadable = False
        self.hold_at = int(os.environ.get(HOLD_ENV, "0"))
        ranks = os.environ.get(HOLD_RANKS_ENV)
        self.hold_ranks = None if ranks is None else {int(r) for r in ranks.split(",")}
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        if signal.getsignal(signal.SIGINT) is _early_stop:  # a run of its own; run() called by a program keeps its own
            signal.signal(signal.SIGINT, self._handle)
        if _early_request:  # after the handlers: a signal in between lands in one of the two
            self.flag = True

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        self.flag = True
        if signum == signal.SIGINT:
            _ctrl_c()

    def requested(self) -> bool:
        return self.flag or self._file_request()

    def _file_request(self) -> bool:
        """A PREEMPT file written since this process started (during start-up counts); an older one was left by an
        earlier run (killed before it answered, a requeued job) and would stop this one at its first step."""
        try:
            written = self.file.stat().st_mtime
        except FileNotFoundError:
            return False
        except OSError as err:  # a shared file system's passing fault (a stale NFS handle) must not end the run
            if not self.told_unreadable:
                self.told_unreadable = True
                log.warning("%s cannot be checked (%s): stop requests by file go unseen while it fails", self.file, err)
            return False
        if written >= self.started - STALE_MARGIN_S:
            return True
        if not self.told_stale:
            self.told_stale = True
            log.warning(
                "%s was written %s before this run started: a stop request to an earlier run, ignored "
                "(remove it; touch it again to stop this run)",
                self.file,
                _age(self.started - written),
            )
        return False

    def clear(self, is_main: bool) -> None:
        """The request is spent once its checkpoint exists; a resumed run must not stop at once. One that cannot be
        removed is said, not raised: the checkpoint is written, and a resumed run takes it for an earlier run's."""
        if not is_main:
            return
        try:
            if self.file.is_dir() and not self.file.is_symlink():  # `mkdir PREEMPT` asks as `touch` does
                self.file.rmdir()
            else:
                self.file.unlink(missing_ok=True)
        except OSError as err:
            log.warning("%s: the stop request could not be removed (%s); remove it before resuming", self.file, err)

    def hold_if_asked(self, step: int, rank: int) -> None:
        if step != self.hold_at or not self.hold_at or (self.hold_ranks is not None and rank not in self.hold_ranks):
            return
        (self.output_dir / f"HOLDING-rank{rank}").touch()
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not self.requested() and time.monotonic() < deadline:
            time.sleep(0.05)


def _process_start() -> float:
    """When this run began: the launch's time where a launcher gave it, else this process's start."""
    stamped = launch_stamp()
    started = process_start()
    return started if stamped is None else min(started, stamped)


def launch_stamp() -> float | None:
    """The launch's start that qa-train launch or slurm/train.sbatch gave this process (RUN_STARTED_ENV); None
    without one."""
    try:
        return float(os.environ[RUN_STARTED_ENV])
    except (KeyError, ValueError):
        return None


def process_start() -> float:
    """time.time() when this process began. psutil's create_time adds the boot time that /proc/stat gives in whole
    seconds, up to a second off for a start-up part that may take less; the process's age (its start in clock ticks
    since boot, against CLOCK_BOOTTIME) is not."""
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces
        began_after_boot = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - began_after_boot)
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        import psutil

        return psutil.Process().create_time()


def _age(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 1:
        return f"{seconds:.0f} s"
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def shield_loader_worker(worker_id: int) -> None:  # noqa: ARG001
    """A DataLoader worker's `worker_init_fn`: a stop signal sent to every process of the job (SLURM's
    preemption, scancel, `kill -- -pgid`) must reach only the main process, which checkpoints and then shuts
    its workers down itself. Torch's own SIGTERM handler kills a worker on any SIGTERM not from its parent,
    and the main process then dies on "DataLoader worker killed" before it can checkpoint. A dead parent is
    still noticed by torch's worker watchdog."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C reaches the whole group: torch's worker exits
    if not hasattr(signal, "sigwaitinfo"):  # macOS
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return
    # Not ignored where it can be helped: the parent's terminate() of a worker stuck at shutdown must still end
    # it (multiprocessing's exit joins daemonic workers without a timeout). Blocked here and so in every thread
    # started later, SIGTERM waits for a thread that can see who sent it.
    parent = os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=_exit_on_parents_sigterm, args=(parent,), name="qa_train-sigterm", daemon=True).start()


def _exit_on_parents_sigterm(parent: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(0)  # as torch's handler does for its parent's SIGTERM
