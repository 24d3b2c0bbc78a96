"""One run per output dir: an advisory lock that the run's first process holds for its whole life.

Two runs started into one folder wrote a checkpoint mixing both runs' files and interleaved their step logs. The
lock is flock(2) on output_dir/.qa_train.lock: the kernel (or, on NFS, the lock server) releases it on any exit,
SIGKILL included. The file also names its holder (host, pid, SLURM job), so that a second start is refused in one
line saying who holds the folder, and so that a lock left held by a process that no longer runs the job is seen
as stale: a forked child that outlived its run on this host, or the last incarnation of a SLURM job requeued on
another node, whose lock the NFS server keeps until the dead node's lease expires.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from qa_train.config.settings import ConfigError

LOCK_FILE = ".qa_train.lock"
log = logging.getLogger("qa_train")


@dataclass
class Holder:
    """Who holds an output dir, as its lock file says."""

    host: str
    pid: int
    since: float  # time.time() when it took the lock
    started: int | None = None  # the process's start time in clock ticks after boot: a reused pid has another
    job: str | None = None  # SLURM_JOB_ID
    restart: int = 0  # SLURM_RESTART_COUNT: a requeued job's next incarnation has a higher one
    command: str = ""

    @classmethod
    def this_process(cls) -> Holder:
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            since=time.time(),
            started=_start_ticks(os.getpid()),
            job=os.environ.get("SLURM_JOB_ID"),
            restart=int(os.environ.get("SLURM_RESTART_COUNT") or 0),
            command=" ".join([Path(sys.executable).name, *sys.argv])[:160],
        )

    def describe(self) -> str:
        job = f", SLURM job {self.job}" if self.job else ""
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        command = f": {self.command}" if self.command else ""
        return f"pid {self.pid} on {self.host}{job}, since {since}{command}"

    def gone(self, me: Holder) -> str | None:
        """Why this holder no longer runs although its lock is held (a stale lock), or None if it may still run."""
        if self.host == me.host and (not _alive(self.pid) or _start_ticks(self.pid) != self.started):
            return f"pid {self.pid} no longer runs on {self.host}"
        if self.job is not None and self.job == me.job and self.restart < me.restart:
            return f"SLURM job {self.job} was requeued (restart {self.restart} -> {me.restart})"
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat; None where there is no /proc (macOS) or no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # the command name may hold spaces and parentheses


def _read_holder(fd: int) -> Holder | None:
    try:
        text = os.pread(fd, 65536, 0).decode()
        return Holder(**json.loads(text)) if text.strip() else None
    except (OSError, ValueError, TypeError):
        return None


def _write_holder(fd: int, holder: Holder) -> None:
    data = json.dumps(asdict(holder)).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


class DirLock:
    """The held lock of one output dir; released (the holder record cleared) by `release` or by any exit."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            # Gone with a clean end: a later run that finds a record knows its run did not end cleanly. One that
            # opened this file meanwhile finds it unlinked once it has the flock, and opens the path again.
            if _same_file(self.fd, self.path):
                self.path.unlink()
        except OSError:
            pass
        os.close(self.fd)  # closing the only descriptor of the open file releases the flock
        self.fd = -1

    def __enter__(self) -> DirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def hold(output_dir: str | Path) -> DirLock:
    """Lock `output_dir` (created if missing) for this process, or refuse in one line naming the holder."""
    path = Path(output_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    me = Holder.this_process()
    for _ in range(5):  # the file may be replaced (a stale lock taken over) between open and flock: try again
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        if _flock(fd):
            _note_unclean_end(_read_holder(fd), me)
        else:
            holder = _read_holder(fd)
            os.close(fd)
            fd = _take_over(path, holder, me, output_dir)
        if not _same_file(fd, path):
            os.close(fd)
            continue
        _write_holder(fd, me)
        return DirLock(fd, path)
    raise ConfigError(f"--output_dir {output_dir}: its lock file {path} keeps being replaced by another process")


def _take_over(path: Path, holder: Holder | None, me: Holder, output_dir: str | Path) -> int:
    """A held lock whose holder is gone: a fresh lock file, locked, renamed over the old one (its flock stays
    with the old file, now unlinked). A live holder: ConfigError naming it."""
    why = holder.gone(me) if holder is not None else None
    if holder is None or why is None:
        who = holder.describe() if holder is not None else "a process that has not written its name yet"
        raise ConfigError(
            f"--output_dir {output_dir}: in use by another qa_train run ({who}); wait for it to end, "
            "or choose another --output_dir"
        )
    fresh = path.with_name(f"{LOCK_FILE}.{me.pid}")
    fd = os.open(fresh, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    _flock(fd)  # a new file nobody else has opened
    os.replace(fresh, path)
    log.warning("--output_dir %s: taking over the lock of %s: %s", output_dir, holder.describe(), why)
    return fd


def _note_unclean_end(previous: Holder | None, me: Holder) -> None:
    """A record left in a lock nobody holds: its run was killed (or its node lost). On another host, where flock
    may not reach (a file system mounted with local locks), say whose it was."""
    if previous is None or previous.host == me.host or previous.gone(me) is not None:
        return
    log.warning(
        "%s: the run that held it (%s) ended without releasing it; if it still runs on %s, stop one of the two",
        LOCK_FILE,
        previous.describe(),
        previous.host,
    )
