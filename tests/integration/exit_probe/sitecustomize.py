"""Put on PYTHONPATH by tests/conftest.py's exit_probe_env: at exit, each rank (a process a launcher started) writes
to QA_TRAIN_TEST_EXIT_PROBE/<pid>.json how many FSDP2 modules are still alive (collected or not; None without FSDP),
how many of gloo's threads are, and the code it passed to os._exit. A qa_train rank ends in os._exit from its own
exit handler (qa_train/core/teardown.py), before the one registered here: it reports there."""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys
from pathlib import Path
from typing import NoReturn


def _report(exit_code: int | None = None) -> None:
    """`exit_code`: what the process passed to os._exit, None for one that tore down as usual."""
    global _reported
    folder = os.environ.get("QA_TRAIN_TEST_EXIT_PROBE")
    if _reported or not folder or "LOCAL_RANK" not in os.environ:
        return
    _reported = True
    alive = None
    if "torch.distributed.fsdp" in sys.modules:
        from torch.distributed.fsdp import FSDPModule

        gc.unfreeze()  # what a rank froze after its build is not listed otherwise
        alive = sum(isinstance(o, FSDPModule) for o in gc.get_objects())
    threads = [Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in os.listdir("/proc/self/task")]
    gloo = sum(name.startswith(("gloo", "pt_gloo")) for name in threads)
    record = {"rank": os.environ.get("RANK"), "fsdp_modules_alive": alive, "gloo_threads": gloo, "os_exit": exit_code}
    with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
        json.dump(record, f)


def _report_and_exit(code: int) -> NoReturn:
    _report(code)
    _exit(code)


_reported = False
_exit = os._exit
os._exit = _report_and_exit
atexit.register(_report)  # a process that tears down as usual
