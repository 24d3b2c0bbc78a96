"""Run under torchrun, once for the whole suite (conftest's `deepspeed_probes`): small modules under DeepSpeed on
two CPU processes, one case after another in the same two processes (each launch costs ~15 s of the suite's CPU
time in imports alone). The cases, as `kind:stage[:offload]` arguments:

- `checkpoint` (test_portable_deepspeed_runs.py): CheckpointProbe trained two steps under ZeRO-<stage>, optionally
  offloaded, its checkpoint saved under the tag accelerate gives it.
- `export` (test_strategies.py): export_state_dict of ExportProbe under ZeRO-<stage> in bf16 through accelerate,
  with what BERT encoders do not have but other models may: a tied weight, a frozen parameter (no fp32 master
  copy), a persistent and a non-persistent buffer. The main process saves what it exported.

Each case writes into OUT/<kind>-<stage>[-offload]."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import deepspeed
import torch

from qa_train.core import teardown


class CheckpointProbe(torch.nn.Module):
    """Sizes that are not multiples of two processes (the bias, `odd`, the norm) and a flat group that ZeRO-1/2 pads
    and splits mid-parameter between ranks."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(11, 6)
        self.lin = torch.nn.Linear(6, 5)
        self.odd = torch.nn.Parameter(torch.randn(7))
        self.norm = torch.nn.LayerNorm(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.lin(self.emb(x)))
        return (h.pow(2).mean() + self.odd.sum() * h.mean()).float()


class ExportProbe(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.out = torch.nn.Linear(8, 16, bias=False)
        self.out.weight = self.emb.weight
        self.frozen = torch.nn.Linear(8, 8)
        self.frozen.weight.requires_grad_(False)
        self.register_buffer("scale", torch.full((8,), 1.5))
        self.register_buffer("scratch", torch.ones(3), persistent=False)
        self.register_buffer("steps", torch.arange(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.emb.weight.dtype
        h = self.emb(x) * self.scale.to(dtype)
        return self.out(h + self.frozen(h)).float().pow(2).mean()


def checkpoint(stage: int, offload: bool, folder: Path) -> None:
    zero: dict = {"stage": stage}
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    if stage == 3 and offload:
        # Several flat sub-groups per rank (a parameter is never split between two). Without offload, two CPU
        # processes hung in the first step with sub-groups this small (DeepSpeed 0.19.8): not this probe's subject.
        zero["sub_group_size"] = 20
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "steps_per_print": 10**9,
    }
    torch.manual_seed(0)
    model = CheckpointProbe()
    decay = [p for n, p in model.named_parameters() if n in ("emb.weight", "lin.weight")]
    rest = [p for n, p in model.named_parameters() if n not in ("emb.weight", "lin.weight")]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}]
    if offload:  # DeepSpeed's CPU Adam, as the offload configs use (its op is built by `make install`)
        config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}
        engine, *_ = deepspeed.initialize(model=model, model_parameters=groups, config=config)
    else:  # torch's AdamW, as qa_train hands it over; DeepSpeed's own would JIT-build its FusedAdam op (minutes)
        optimizer = torch.optim.AdamW(groups, lr=1e-2)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    generator = torch.Generator().manual_seed(1 + torch.distributed.get_rank())
    for _ in range(2):
        engine.backward(engine(torch.randint(0, 11, (2, 4), generator=generator)))
        engine.step()
    engine.save_checkpoint(str(folder), tag="pytorch_model")
    torch.distributed.barrier()
    del engine, model
    gc.collect()


def export(stage: int, folder: Path) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

    from qa_train.strategy.sharded import export_state_dict

    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
    }
    AcceleratorState._reset_state()  # an earlier case's plugin; the process group stays
    accelerator = Accelerator(
        mixed_precision="bf16",
        deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config),
        kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")],
    )
    torch.manual_seed(0)
    model = ExportProbe()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(2):
        accelerator.backward(model(torch.randint(0, 16, (2, 4))))
        optimizer.step()
        optimizer.zero_grad()
    state = export_state_dict(accelerator, model)
    if accelerator.is_main_process:
        folder.mkdir(parents=True)
        torch.save(state, folder / "export.pt")
    del model, optimizer
    accelerator.free_memory()
    torch.distributed.barrier()


def main(out: Path, cases: list[str]) -> None:
    deepspeed.init_distributed(dist_backend="gloo")
    for case in cases:
        kind, stage, *offload = case.split(":")
        folder = out / "-".join([kind, stage, *offload])
        if kind == "checkpoint":
            checkpoint(int(stage), offload == ["offload"], folder)
        else:
            export(int(stage), folder)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    # The engines' hooks keep the gloo group alive past destroy_process_group: the probe ends as a qa_train rank
    # does, without the teardown where a gloo thread can abort it (qa_train/core/teardown.py).
    teardown.arm()
    main(Path(sys.argv[1]), sys.argv[2:])
    sys.exit(teardown.leave(0))
