"""How often a rank aborts at exit when gloo's worker threads outlive the process group, with and without
qa_train's exit (qa_train/core/teardown.py).

    python tools/gloo_exit_abort.py [--launches 8] [--core 1] [--collectives 50]

Each launch is `torchrun --nproc_per_node 2` of this file as its rank script, both ranks pinned to one core (a
loaded machine, as CI's two cores under two pytest workers: a gloo worker finishes freeing a collective's work
after the main thread has gone on). A rank runs asynchronous all-gathers of tensors made in Python, then keeps the
group alive past destroy_process_group, as DeepSpeed's engine and DDP's reducer do in a qa_train rank. With
`teardown` the interpreter then finalizes; with `qa_train-exit` the rank arms and leaves as `python -m qa_train`
does. Printed: per mode, the launches in which a rank aborted ("terminate called without an active exception").
"""

from __future__ import annotations

import argparse
import ctypes
import os
import random
import subprocess
import sys

MODES = ("teardown", "qa_train-exit")


def rank(mode: str, collectives: int) -> int:
    if mode == "qa_train-exit":
        from qa_train.core import teardown

        teardown.arm()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    for _ in range(collectives):
        piece = torch.randn(1000)
        gathered = torch.empty(1000 * dist.get_world_size())
        dist.all_gather_into_tensor(gathered, piece, async_op=True).wait()
        del piece, gathered
    # A reference nobody drops: the group and its worker threads live on after destroy_process_group.
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(dist.group.WORLD))
    dist.destroy_process_group()
    if mode == "qa_train-exit":
        return teardown.leave(0)
    return 0


def launch(mode: str, core: int, collectives: int) -> bool:
    """Whether a rank of one launch aborted."""
    cmd = ["taskset", "-c", str(core), sys.executable, "-W", "ignore", "-m", "torch.distributed.run"]
    cmd += ["--nproc_per_node", "2", "--master_port", str(random.randrange(40000, 60000)), __file__]
    cmd += ["--rank", mode, "--collectives", str(collectives)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return "terminate called without an active exception" in done.stdout + done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=8)
    parser.add_argument("--core", type=int, default=1)
    parser.add_argument("--collectives", type=int, default=50)
    parser.add_argument("--rank", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        return rank(args.rank, args.collectives)
    aborted = dict.fromkeys(MODES, 0)
    for i in range(args.launches):
        for mode in MODES:  # alternated, so that the machine's load falls on both alike
            aborted[mode] += launch(mode, args.core, args.collectives)
        print(f"launch {i + 1}/{args.launches}: " + ", ".join(f"{m} {n}" for m, n in aborted.items()), flush=True)
    print(f"launches with a rank aborted at exit, of {args.launches} each (both ranks on core {args.core}):")
    for mode, n in aborted.items():
        print(f"  {mode:14} {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
