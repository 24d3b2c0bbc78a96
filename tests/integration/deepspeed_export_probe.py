"""Run under torchrun by test_strategies: export_state_dict of a small module under DeepSpeed ZeRO-<stage> in bf16
on CPU processes, with what BERT encoders do not have but other models may: a tied weight, a frozen parameter (no
fp32 master copy), a persistent and a non-persistent buffer. The main process saves what it exported."""

from __future__ import annotations

import sys

import torch
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

from qa_train.core import teardown
from qa_train.strategy.sharded import export_state_dict


class Probe(torch.nn.Module):
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


def main(stage: int, saved: str) -> None:
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": stage},
    }
    accelerator = Accelerator(
        mixed_precision="bf16",
        deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config),
        kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")],
    )
    torch.manual_seed(0)
    model = Probe()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(2):
        accelerator.backward(model(torch.randint(0, 16, (2, 4))))
        optimizer.step()
        optimizer.zero_grad()
    state = export_state_dict(accelerator, model)
    if accelerator.is_main_process:
        torch.save(state, saved)
    del model, optimizer
    accelerator.free_memory()
    accelerator.end_training()


if __name__ == "__main__":
    # The engine's hooks keep the gloo group alive past end_training: the probe ends as a qa_train rank does,
    # without the teardown where a gloo thread can abort it (qa_train/core/teardown.py).
    teardown.arm()
    main(int(sys.argv[1]), sys.argv[2])
    sys.exit(teardown.leave(0))
