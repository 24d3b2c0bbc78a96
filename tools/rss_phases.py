"""Host RSS of a training step phase by phase (forward, backward, optimizer step, zero_grad) on CPU.

    python tools/rss_phases.py --config qa_train/assets/bert-base-shape --batch 4 --seq 384 --gradient_checkpointing
    MALLOC_MMAP_THRESHOLD_=131072 python tools/rss_phases.py ...   # glibc returns every large buffer
    torchrun --nproc_per_node 2 tools/rss_phases.py --shard fsdp ...  # FSDP2 (or ddp) over gloo; rank 0 prints

RSS and the kernel's high-water mark (VmHWM, restarted before each phase) above the RSS before the model was
built, in GiB. Nothing of qa_train is involved: this separates what the tensors need from what the allocator
keeps (docs/benchmarks/2026-11-23-cpu-gradient-checkpointing.md).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForQuestionAnswering

GIB = 2**30
STATUS, CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


def rss_and_peak() -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in STATUS.read_text().splitlines())
    return tuple(int(fields[key].split()[0]) * 1024 / GIB for key in ("VmRSS", "VmHWM"))  # type: ignore[return-value]


def shard(model: torch.nn.Module, how: str) -> torch.nn.Module:
    if how == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    if how == "fsdp":
        from torch.distributed.fsdp import fully_shard

        stacks = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
        for layer in max(stacks, key=len):
            fully_shard(layer)
        fully_shard(model.get_input_embeddings())
        fully_shard(model)
    return model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="A model config folder (randomly initialised).")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=384)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--gradient_checkpointing", action="store_true")
    p.add_argument(
        "--shard",
        choices=["none", "ddp", "fsdp"],
        default="none",
        help="Under torchrun: DDP, or FSDP2 with one unit per encoder layer, the input embeddings and "
        "the rest (the units accelerate makes), over gloo.",
    )
    opts = p.parse_args()
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(opts.config)
    if opts.shard != "none":  # before the baseline, as qa_train's own baseline holds the process group
        torch.distributed.init_process_group("gloo")
    show = int(os.environ.get("RANK", "0")) == 0
    base = rss_and_peak()[0]
    model = AutoModelForQuestionAnswering.from_config(config)
    if opts.gradient_checkpointing:  # before the wrapping, as qa_train does
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    model = shard(model, opts.shard)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    params = sum(t.numel() for t in model.parameters())
    if show:
        print(
            f"{params / 1e6:.1f}M parameters (16 B each: {16 * params / GIB:.3f} GiB); "
            f"model built: {rss_and_peak()[0] - base:.3f} GiB"
        )
    labels = torch.zeros(opts.batch, dtype=torch.long)

    def phase(step: int, name: str) -> None:
        rss, peak = rss_and_peak()
        if show:
            print(f"step {step} {name:<9} rss {rss - base:.3f}  high-water {peak - base:.3f}")
        CLEAR_REFS.write_text("5")

    for step in range(opts.steps):
        ids = torch.randint(0, config.vocab_size, (opts.batch, opts.seq))
        CLEAR_REFS.write_text("5")
        loss = model(
            input_ids=ids, attention_mask=torch.ones_like(ids), start_positions=labels, end_positions=labels
        ).loss
        phase(step, "forward")
        loss.backward()
        phase(step, "backward")
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        phase(step, "optimizer")
        optimizer.zero_grad(set_to_none=True)
        phase(step, "zero_grad")


if __name__ == "__main__":
    main()
