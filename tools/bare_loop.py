"""The training step with nothing of qa_train around it: forward, backward, clip, AdamW, schedule, zero_grad.

    python tools/bare_loop.py --model qa_train/assets/tiny-bert --batch 1 --length 48 --steps 600

Beside a qa_train run of the same model, batch and fixed length (`--pad_to_max_length`), it says how much
host time per step is the harness's (data loading, monitoring, logging) and how much is the model and
framework's own: on a GPU, where small models are bound by the host's kernel launches, that decides what
there is to gain in qa_train itself. Random tokens; on CUDA, bf16 autocast and fused AdamW as qa_train uses.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoConfig, AutoModelForQuestionAnswering, get_linear_schedule_with_warmup


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a model dir (weights used if present) or a config dir")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--length", type=int, default=384)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    opts = p.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(opts.model)
    model = AutoModelForQuestionAnswering.from_config(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, fused=cuda)
    schedule = get_linear_schedule_with_warmup(optimizer, 0, opts.steps + opts.warmup)
    shape = (opts.batch, opts.length)
    batches = [
        {
            "input_ids": torch.randint(5, config.vocab_size, shape),
            "attention_mask": torch.ones(shape, dtype=torch.long),
            "token_type_ids": torch.zeros(shape, dtype=torch.long),
            "start_positions": torch.randint(0, opts.length, shape[:1]),
            "end_positions": torch.randint(0, opts.length, shape[:1]),
        }
        for _ in range(16)
    ]
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
    t0 = 0.0
    for i in range(opts.warmup + opts.steps):
        if i == opts.warmup:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            loss = model(**batches[i % len(batches)]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(
        f"bare loop on {device.type}: {opts.steps / dt:.1f} steps/s, {1000 * dt / opts.steps:.2f} ms/step, "
        f"{opts.batch * opts.steps / dt:.1f} samples/s"
    )


if __name__ == "__main__":
    main()
