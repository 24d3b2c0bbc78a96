"""Put on PYTHONPATH by tests/conftest.py's exit_probe_env: at exit, each process that imported FSDP writes how many
FSDP2 modules are still alive (collected or not) to QA_TRAIN_TEST_EXIT_PROBE/<pid>.json."""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys


def _report() -> None:
    folder = os.environ.get("QA_TRAIN_TEST_EXIT_PROBE")
    if not folder or "torch.distributed.fsdp" not in sys.modules:
        return
    from torch.distributed.fsdp import FSDPModule

    gc.unfreeze()  # qa_train freezes the collector before exit: frozen objects are not listed otherwise
    alive = sum(isinstance(o, FSDPModule) for o in gc.get_objects())
    record = {"rank": os.environ.get("RANK"), "fsdp_modules_alive": alive}
    with open(os.path.join(folder, f"{os.getpid()}.json"), "w") as f:
        json.dump(record, f)


atexit.register(_report)  # registered first, so it runs after qa_train's own exit handlers
