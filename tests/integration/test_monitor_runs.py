"""Sharded parameters in a one-rank gloo process group of its own: FSDP2's DTensors reach the interval log and the
weight check; ZeRO-3's partitions reach the weight checks at load and before a save."""

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


ZERO3_WEIGHTS = r"""
import sys, torch, deepspeed
from transformers import AutoConfig, AutoModelForQuestionAnswering
from transformers.integrations import HfDeepSpeedConfig
from qa_train.config.settings import ConfigError
from qa_train.model.modeling import _check_finite
from qa_train.strategy.sharded import nonfinite_tensors

store, folder, tiny = sys.argv[1:]
deepspeed.init_distributed("gloo", auto_mpi_discovery=False, init_method="file://" + store, rank=0, world_size=1)
model = AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(tiny))
with torch.no_grad():
    model.bert.encoder.layer[1].output.dense.weight[0, 0] = float("inf")
model.save_pretrained(folder)
config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
registered = HfDeepSpeedConfig(config)  # from_pretrained builds under deepspeed.zero.Init while it lives
model = AutoModelForQuestionAnswering.from_pretrained(folder)
print("placeholders", all(p.numel() == 0 for p in model.parameters()))
try:
    _check_finite(model, folder)
except ConfigError as err:
    print("refused", err)
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
print("nonfinite", int(nonfinite_tensors(engine.module.parameters(), torch.device("cpu"))))
"""


def test_zero3_partitions_reach_the_weight_checks(tmp_path) -> None:
    """Under ZeRO-3 a parameter is an empty placeholder outside a gather, and its values live in the rank's
    partition: the load's nan/inf check and the check before a checkpoint or export read placeholders and passed
    a model holding inf."""
    import subprocess
    import sys

    from conftest import ROOT, base_env

    # base_env: DeepSpeed's CPU communication op loads from where `make install` built it, not built anew in
    # torch's default folder (a fresh clone's CI would compile it).
    env = {**base_env(tmp_path), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}  # what a launcher gives zero.Init
    args = [str(tmp_path / "store"), str(tmp_path / "model"), str(ROOT / "qa_train" / "assets" / "tiny-bert")]
    proc = subprocess.run(
        [sys.executable, "-c", ZERO3_WEIGHTS, *args], env=env, capture_output=True, text=True, timeout=200
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "placeholders True" in proc.stdout, proc.stdout
    assert (
        f"refused {tmp_path / 'model'}: its weights hold nan or inf (first in "
        "bert.encoder.layer.1.output.dense.weight)" in proc.stdout
    ), proc.stdout
    assert "nonfinite 1" in proc.stdout, proc.stdout
