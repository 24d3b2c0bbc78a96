"""Run under torchrun by test_portable_deepspeed_runs: a small module trained two steps under DeepSpeed ZeRO-<stage>
(optionally offloaded) on CPU processes, its checkpoint saved under the tag accelerate gives it."""

from __future__ import annotations

import gc
import sys

import deepspeed
import torch

from qa_train.core import teardown


class Probe(torch.nn.Module):
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


def main(stage: int, offload: bool, folder: str) -> None:
    deepspeed.init_distributed(dist_backend="gloo")
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
    model = Probe()
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
    engine.save_checkpoint(folder, tag="pytorch_model")
    torch.distributed.barrier()
    del engine, model
    gc.collect()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    # The engine's hooks keep the gloo group alive past destroy_process_group: the probe ends as a qa_train rank
    # does, without the teardown where a gloo thread can abort it (qa_train/core/teardown.py).
    teardown.arm()
    main(int(sys.argv[1]), sys.argv[2] == "offload", sys.argv[3])
    sys.exit(teardown.leave(0))
