"""What continuing a checkpoint under another strategy or world size costs, against a plain resume, on CPU.

A BERT-base-shaped model (qa_train/assets/bert-base-shape, 109M parameters) with AdamW after one step is written in
three libraries' layouts: accelerate's single/DDP files, torch.distributed.checkpoint's (FSDP's sharded state dict)
and DeepSpeed ZeRO-2's (one process). Each measurement then runs in a fresh process, so its peak host memory is its
own: the seconds and the peak RSS above that process's baseline (after imports and, where it loads into one, the
model and optimizer built) of

  plain     the library loading its own files into a model and optimizer (what a resume does today)
  convert   qa_train.strategy.portable.convert: the checkpoint to the portable layout (the main process, once)
  load      the portable layout into a model and optimizer (every rank)

    python tools/bench_reshard.py --work /tmp/reshard [--repeats 2]

The budget: one full fp32 copy of the model and its Adam state, 12 bytes a parameter.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's qa_train, also in the measuring subprocesses
CONFIG = ROOT / "qa_train" / "assets" / "bert-base-shape"
LAYOUTS = ("accelerate", "dcp", "deepspeed")


def rss_gib() -> float:
    """This process's resident memory now (statm), GiB."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**30


def reset_peak() -> None:
    """Linux's peak-RSS counter (VmHWM) restarts from the current RSS: building the model does not count."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_gib() -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 2**20  # kB


def build(seed: int = 0):
    import torch
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    from qa_train.model.optimization import param_groups

    torch.manual_seed(seed)
    model = AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(CONFIG))
    return model, torch.optim.AdamW(param_groups(model, 0.01), lr=1e-4)


def one_step(model, optimizer) -> None:
    import torch

    ids = torch.randint(1, 1000, (1, 16))
    labels = torch.zeros(1, dtype=torch.long)
    model(input_ids=ids, start_positions=labels, end_positions=labels).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def deepspeed_engine(model, optimizer):
    """ZeRO-2 on one CPU process (gloo), as accelerate's DeepSpeed launch builds it."""
    os.environ.update(
        {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "DS_ACCELERATOR": "cpu"}
    )
    os.environ.setdefault("MASTER_PORT", "29591")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2},
        "steps_per_print": 10**9,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def write(work: Path) -> None:
    """The three checkpoints, after one step of the same model."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    model, optimizer = build()
    one_step(model, optimizer)
    folder = work / "accelerate"
    folder.mkdir(parents=True, exist_ok=True)
    save_file(model.state_dict(), folder / "model.safetensors")
    torch.save(optimizer.state_dict(), folder / "optimizer.bin")
    names = {id(p): name for name, p in model.named_parameters()}
    state = {f"optimizer.state.{names[id(p)]}.{k}": v for p, entry in optimizer.state.items() for k, v in entry.items()}
    dcp.save(
        {f"model.{k}": v for k, v in model.state_dict().items()},
        checkpoint_id=work / "dcp" / "pytorch_model_fsdp_0",
        no_dist=True,
    )
    dcp.save(state, checkpoint_id=work / "dcp" / "optimizer_0", no_dist=True)
    model, optimizer = build()
    engine = deepspeed_engine(model, optimizer)
    ids = torch.randint(1, 1000, (1, 16))
    labels = torch.zeros(1, dtype=torch.long)
    engine.backward(engine(input_ids=ids, start_positions=labels, end_positions=labels).loss)
    engine.step()
    engine.save_checkpoint(str(work / "deepspeed"), tag="pytorch_model")


def measure(stage: str, layout: str, work: Path) -> dict:
    """One measurement in this (fresh) process."""
    import torch

    from qa_train.model.optimization import optimizer_order
    from qa_train.strategy import portable

    result: dict = {"stage": stage, "layout": layout}
    if stage == "convert":
        with torch.device("meta"):  # the shapes alone: conversion needs no model
            shapes = optimizer_order(build()[0])
        base = rss_gib()
        reset_peak()
        t0 = time.perf_counter()
        portable.convert(work / layout, shapes, work / f"portable-{layout}")
    elif stage == "load" and layout == "deepspeed":
        return _load_portable_deepspeed(result, work / f"portable-{layout}")
    else:
        model, optimizer = build(seed=1)
        engine = deepspeed_engine(model, optimizer) if layout == "deepspeed" else None
        base = rss_gib()
        reset_peak()
        t0 = time.perf_counter()
        if stage == "load":
            _load_portable(model, optimizer, work / f"portable-{layout}")
        else:
            _load_plain(layout, work, model, optimizer, engine)
    result["seconds"] = round(time.perf_counter() - t0, 2)
    result["baseline_gib"] = round(base, 2)
    result["peak_above_baseline_gib"] = round(peak_gib() - base, 2)
    return result


def _load_plain(layout: str, work: Path, model, optimizer, engine) -> None:
    import torch

    if layout == "accelerate":
        from safetensors.torch import load_file

        model.load_state_dict(load_file(work / layout / "model.safetensors"))
        optimizer.load_state_dict(torch.load(work / layout / "optimizer.bin", weights_only=True))
    elif layout == "dcp":
        import torch.distributed.checkpoint as dcp

        one_step(model, optimizer)  # DCP loads into an optimizer state of the right shapes
        names = {id(p): name for name, p in model.named_parameters()}
        state = {
            f"optimizer.state.{names[id(p)]}.{k}": v for p, entry in optimizer.state.items() for k, v in entry.items()
        }
        weights = {f"model.{k}": v for k, v in model.state_dict().items()}
        dcp.load(weights, checkpoint_id=work / layout / "pytorch_model_fsdp_0", no_dist=True)
        dcp.load(state, checkpoint_id=work / layout / "optimizer_0", no_dist=True)
    else:
        engine.load_checkpoint(str(work / layout), tag="pytorch_model")


def _load_portable(model, optimizer, folder: Path) -> None:
    import types

    from accelerate.utils import DistributedType

    from qa_train.strategy import portable

    portable.load_weights(model, folder)
    fake = types.SimpleNamespace(distributed_type=DistributedType.NO, unwrap_model=lambda m: m)
    portable.load_optimizer(fake, model, types.SimpleNamespace(optimizer=optimizer), folder)


def _load_portable_deepspeed(result: dict, folder: Path) -> dict:
    """As a run does it: the weights into the model before DeepSpeed's engine is built, the moments after; the
    engine's construction in between is not counted."""
    import types

    from accelerate.utils import DistributedType

    from qa_train.strategy import portable

    model, optimizer = build(seed=1)
    base = rss_gib()
    reset_peak()
    t0 = time.perf_counter()
    portable.load_weights(model, folder)
    seconds, above = time.perf_counter() - t0, peak_gib() - base
    engine = deepspeed_engine(model, optimizer)
    base2 = rss_gib()
    reset_peak()
    t0 = time.perf_counter()
    fake = types.SimpleNamespace(distributed_type=DistributedType.DEEPSPEED, unwrap_model=lambda m: m)
    portable.load_optimizer(fake, engine, None, folder)
    result["seconds"] = round(seconds + time.perf_counter() - t0, 2)
    result["baseline_gib"] = round(base2, 2)
    result["peak_above_baseline_gib"] = round(max(above, peak_gib() - base2), 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="a folder for the checkpoints (about 5 GB)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--measure", nargs=2, metavar=("STAGE", "LAYOUT"), help=argparse.SUPPRESS)
    parser.add_argument("--write", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.write:
        write(a.work)
        return
    if a.measure:
        print(json.dumps(measure(*a.measure, a.work)))
        return
    if not (a.work / "deepspeed" / "latest").is_file():
        subprocess.run([sys.executable, __file__, "--work", str(a.work), "--write"], check=True, cwd=ROOT)
    rows = []
    for _ in range(a.repeats):
        for layout in LAYOUTS:
            for stage in ("plain", "convert", "load"):
                out = subprocess.run(
                    [sys.executable, __file__, "--work", str(a.work), "--measure", stage, layout],
                    check=True,
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                )
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(rows[-1], flush=True)
    print("| layout | stage | seconds | peak RSS above baseline GiB | baseline GiB |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['layout']} | {r['stage']} | {r['seconds']} | {r['peak_above_baseline_gib']} | {r['baseline_gib']} |"
        )


if __name__ == "__main__":
    main()
