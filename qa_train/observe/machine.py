"""How busy the machine was while a run trained: the load average, and the CPU that processes outside the run took.

A speed measured beside other work is the machine's as much as the strategy's; the report warns beside any
comparison that rests on such a run. Each rank measures its own CPU time (its threads and loader workers) and the
node's busy time over the training phase; metrics.summarize sets them side by side per node.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil


def _busy_s() -> float:
    """Seconds every CPU of this node has spent busy since boot (idle and I/O wait left out)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _own_s() -> float:
    """CPU seconds of this process and its children (loader workers, live or finished)."""
    me = psutil.Process()
    t = me.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in me.children(recursive=True):
        try:
            c = child.cpu_times()
        except psutil.Error:  # it ended meanwhile; its time is in children_* once it was waited for
            continue
        total += c.user + c.system
    return total


@dataclass(frozen=True)
class MachineLoad:
    """One rank's view of the training phase, in CPU cores kept busy on average."""

    own_cpu_cores: float
    """This process and its loader workers."""
    node_busy_cores: float
    """Every process of this node, this run's ranks included."""
    load_average_1m: float
    """The node's 1-minute load average at the end of training: runnable processes, this run's included."""
    cpu_count: int


class LoadMeter:
    """Started at the first step, read at the last."""

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        self.t0, self.own0, self.busy0 = time.monotonic(), _own_s(), _busy_s()

    def read(self) -> MachineLoad:
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        return MachineLoad(
            own_cpu_cores=(_own_s() - self.own0) / elapsed,
            node_busy_cores=(_busy_s() - self.busy0) / elapsed,
            load_average_1m=os.getloadavg()[0],
            cpu_count=psutil.cpu_count() or 1,
        )


def others_on_busiest_node(own: list[float], busy: list[float], ranks_per_node: int) -> float:
    """Cores that processes outside the run kept busy, on the node where they kept the most: a node's busy cores
    (each of its ranks measured them; the largest reading) less its ranks' own. Ranks fill nodes in order, as
    torchrun numbers them."""
    per_node = max(1, ranks_per_node)
    others = [max(busy[i : i + per_node]) - sum(own[i : i + per_node]) for i in range(0, len(own), per_node) if own[i:]]
    return max(0.0, max(others, default=0.0))
