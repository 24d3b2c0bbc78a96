"""qa_train.observe.monitor under FSDP2, in a one-rank gloo process group of its own: DTensors reach the interval
log and the weight check."""

from __future__ import annotations

FSDP2_NORM = r"""
import sys, types
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor
from accelerate.utils import DistributedType
from qa_train.strategy.sharded import global_grad_norm, nonfinite_tensors
from qa_train.observe.hostmem import HostMemory
from qa_train.observe.metrics import BatchCount, DeviceMemory
from qa_train.observe.monitor import ModelCost, TrainingMetrics

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
try:
    mesh = init_device_mesh("cpu", (1,))
    # What clip_grad_norm_ returns under FSDP2: the norm as a DTensor of per-shard partial results.
    norm = DTensor.from_local(torch.tensor(5.0), mesh, [Partial("sum")])
    accelerator = types.SimpleNamespace(distributed_type=DistributedType.FSDP, device=torch.device("cpu"),
                                        gather=lambda t: t)
    monitor = TrainingMetrics(accelerator, DeviceMemory(torch.device("cpu")), HostMemory(trim=False), ModelCost(1.0, 0.0, None), 0)
    monitor.micro_batch(torch.tensor(1.0), BatchCount(4, 10, 12, 12.0))
    monitor.update(global_grad_norm(accelerator, None, norm))
    print("grad_norm", monitor.collect(stop_requested=False).grad_norm)
    # The export's weight check on FSDP2's DTensor parameters: each rank counts its own shard.
    weights = [distribute_tensor(torch.tensor([1.0, float("nan")]), mesh, [Shard(0)]),
               distribute_tensor(torch.ones(3), mesh, [Shard(0)])]
    print("nonfinite", int(nonfinite_tensors(weights, torch.device("cpu"))))
finally:
    dist.destroy_process_group()
"""


def test_fsdp2_dtensors_reach_the_interval_log_and_the_weight_check(tmp_path) -> None:
    """Under FSDP2 the clipping norm is a DTensor; mixing it into the monitor's plain tensors failed on an H100
    (DTensor dispatch assertion at the first step). It is made whole first: one all-reduce, every rank. The
    weight check before a checkpoint or export mixed DTensor parameters the same way; it reads local shards."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", FSDP2_NORM, str(tmp_path / "store")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "grad_norm 5.0" in proc.stdout and "nonfinite 1" in proc.stdout
