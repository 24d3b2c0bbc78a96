"""DeepSpeed's JIT-built ops (CPUAdam, the CPU shared-memory collectives): building them ahead, in a folder of the
Python environment's own, and clearing the build locks that a killed build leaves behind.

torch builds each op under a `lock` file it creates and removes itself; a process killed while holding it (SIGKILL,
an OOM kill, a job's time limit) leaves the file, and every later DeepSpeed run on that machine then waits on it
forever, without a word. torch's FileBaton has no owner and no timeout, so the check is ours: a lock that no process
on this host holds open and that is older than any build is stale. A young lock with no local holder may be a build
on another node sharing the home folder, so it is waited for until it is released or becomes stale.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger("qa_train")

# Longer than a build takes on a loaded 2-core machine (both ops together take about two minutes there).
STALE_AFTER_S = 600.0
PREBUILT = ("CPUAdamBuilder", "ShareMemCommBuilder")


def build_root() -> Path:
    """torch's folder of JIT-built extensions (what torch.utils.cpp_extension uses without a build_directory)."""
    from torch.utils.cpp_extension import get_default_build_root

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())


def environment_build_root() -> Path:
    """A build folder of this Python environment's own, under torch's default one. torch keys its folder by Python
    and CUDA version alone, and an op's build command names the environment's paths, so two environments (two
    checkouts' venvs) rebuild each other's ops at every switch: DeepSpeed's two CPU ops take 30-80 s on 2 cores."""
    from torch.utils.cpp_extension import get_default_build_root

    environment = hashlib.sha256(os.path.realpath(sys.prefix).encode()).hexdigest()[:12]
    return Path(get_default_build_root()) / f"env-{environment}"


def use_environment_builds() -> None:
    """Build into this environment's folder, unless TORCH_EXTENSIONS_DIR names one, with its own ninja where it has
    one: torch runs the `ninja` first on PATH, and two ninja versions (pip's in the environment, the system's, as an
    activated and a plain `.venv/bin/python` find them) each read the other's build log as stale and rebuild."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(environment_build_root()))
    tools = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if (Path(tools) / "ninja").is_file() and path.split(os.pathsep)[0] != tools:
        os.environ["PATH"] = tools + os.pathsep + path


def build_locks(root: Path) -> list[Path]:
    """Every extension's build lock under `root` (one folder per Python/CUDA flavour, one per op)."""
    return sorted(root.glob("*/*/lock")) + sorted(root.glob("*/lock"))


def held_here(lock: Path) -> bool:
    """Whether a process on this host has `lock` open (torch keeps the lock's descriptor open while it builds)."""
    target = os.path.realpath(lock)
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            links = [os.readlink(fd) for fd in fd_dir.iterdir()]
        except OSError:  # the process ended, or is another user's
            continue
        if target in links:
            return True
    return False


def clear_stale_locks(
    root: Path | None = None,
    stale_after_s: float = STALE_AFTER_S,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Path]:
    """Remove the build locks nobody holds that are older than `stale_after_s`, waiting for younger unheld ones to
    be released or to become stale; return the locks removed."""
    removed: list[Path] = []
    for lock in build_locks(root or build_root()):
        said = False
        while True:
            try:
                age = clock() - lock.stat().st_mtime
            except FileNotFoundError:
                break  # released
            if held_here(lock):
                break  # a live build on this host: torch waits for it
            if age >= stale_after_s:
                lock.unlink(missing_ok=True)
                removed.append(lock)
                logger.warning(f"qa_train: removed {lock}, a build lock left by a killed build (no process holds it)")
                break
            if not said:
                logger.warning(
                    f"qa_train: waiting for the build lock {lock} (no process on this host holds it; "
                    f"it is removed as stale when {stale_after_s:.0f} s old)"
                )
                said = True
            sleep(min(5.0, stale_after_s - age))
    return removed


def ask_cpu_once() -> None:
    """DeepSpeed's CPU op builders ask py-cpuinfo for the architecture and SIMD width each time an op is loaded
    (three times in a ZeRO-offload rank), and py-cpuinfo answers each time from a new subprocess (~1.3 s of CPU):
    one answer per process is enough, since the CPU does not change under it."""
    try:
        import cpuinfo
    except ImportError:
        return  # DeepSpeed asks lscpu instead
    if not hasattr(cpuinfo.get_cpu_info, "cache_info"):
        cpuinfo.get_cpu_info = functools.cache(cpuinfo.get_cpu_info)


def prepare() -> None:
    """Before DeepSpeed loads its ops (inside Accelerator()): this environment's build folder, no stale lock to hang
    on, one CPU probe per process."""
    use_environment_builds()
    clear_stale_locks()
    ask_cpu_once()


def prebuild() -> None:
    """Build (or load) the ops DeepSpeed builds at first use, so that stall stays out of the first run."""
    prepare()
    from deepspeed.accelerator import get_accelerator

    for name in PREBUILT:
        builder = get_accelerator().create_op_builder(name)
        if builder is not None and builder.is_compatible():
            builder.load(verbose=False)


if __name__ == "__main__":
    logging.basicConfig(stream=sys.stderr, format="%(message)s")
    prebuild()
