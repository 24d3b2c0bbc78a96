"""One run end to end: the order of this function is the data flow of the project."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from qa_train import __version__, checkpoint, distributed, metrics
from qa_train.config import TrainArgs
from qa_train.evaluation import evaluate
from qa_train.features import window_offsets
from qa_train.hostmem import HeapTrimmer
from qa_train.modeling import flops_per_token, load_model, load_tokenizer
from qa_train.tracking import Tracker, summary_table
from qa_train.train import (
    StopRequest,
    fit,
    load_data,
    make_accelerator,
    make_loaders,
    make_optimizer,
    plan_steps,
    setup_logging,
)

log = logging.getLogger("qa_train")


def run(args: TrainArgs) -> dict[str, Any] | None:
    """Train, evaluate, export and report. Returns metrics on the main process (None elsewhere or when preempted)."""
    t_start = time.perf_counter()
    accelerator, mixed_precision = make_accelerator(args)
    setup_logging(accelerator.is_main_process)
    distributed.check_world(accelerator)
    strategy = distributed.detect_strategy(accelerator)
    log.info("qa_train %s: %s on %d process(es), device %s, mixed precision %s", __version__, strategy.name,
             accelerator.num_processes, accelerator.device, mixed_precision)
    output_dir = Path(args.output_dir)
    stop = StopRequest(output_dir)
    from accelerate.utils import set_seed

    set_seed(args.seed)
    tokenizer = load_tokenizer(args)
    data = load_data(accelerator, args, tokenizer)
    train_dl, eval_dl = make_loaders(args, data, tokenizer, accelerator.device.type == "cuda")
    log.info("train: %d questions -> %d windows; eval: %s questions -> %s windows (cache hits %s)",
             data.num_train_examples, len(data.train_features),
             len(data.eval_examples) if data.eval_examples else 0,
             len(data.eval_features) if data.eval_features else 0, data.cache_hits)
    trimmer = HeapTrimmer(enabled=accelerator.device.type == "cpu")
    trimmer.now()  # featurisation's transient Python objects
    model = load_model(args, tokenizer)
    if args.torch_compile:
        model = torch.compile(model, dynamic=not args.pad_to_max_length)
    plan = plan_steps(args, _batches_per_rank(len(train_dl), accelerator.num_processes))
    optimizer, scheduler = make_optimizer(accelerator, args, model, plan.total_steps, plan.warmup_steps)
    distributed.reconcile_deepspeed(accelerator, args, mixed_precision)
    prepared = accelerator.prepare(model, optimizer, train_dl, scheduler, *([eval_dl] if eval_dl else []))
    model, optimizer, train_dl, scheduler = prepared[:4]
    eval_dl = prepared[4] if eval_dl else None
    monitor = metrics.MemoryMonitor(accelerator.device)
    monitor.reset()  # memory "during training" excludes model construction and loading

    resume_from = checkpoint.resolve_resume(args.resume_from_checkpoint, output_dir)
    state = checkpoint.TrainerState()
    if resume_from is not None:
        state = checkpoint.load_checkpoint(accelerator, resume_from)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", resume_from, state.completed_steps,
                 state.epoch, state.batches_in_epoch)
    elif args.resume_from_checkpoint == "latest":
        log.info("no checkpoint in %s yet: starting from scratch", checkpoint.checkpoint_root(output_dir))
    tracker = Tracker(accelerator.is_main_process, output_dir, args.report_to == "wandb")
    tracker.start(args.wandb_project, args.run_name,
                  {**args.to_dict(), **strategy.as_dict(), "world_size": accelerator.num_processes},
                  resuming=resume_from is not None)

    # Character offsets of the eval windows, built once for every evaluation of this run (main process only).
    eval_offsets = None
    if eval_dl is not None and accelerator.is_main_process:
        eval_offsets = window_offsets(data.eval_features, data.eval_examples, tokenizer, args.max_seq_length)
    initial: dict[str, float] = {}
    if args.eval_before_training and eval_dl is not None:
        initial = evaluate(accelerator, model, eval_dl, data.eval_examples, data.eval_features, eval_offsets, args,
                           None, trimmer)
        log.info("before training: %s", initial)
    log.info("training %d steps (%d epochs of %d updates), global batch %d", plan.total_steps, plan.num_epochs,
             plan.updates_per_epoch, _global_batch(args, accelerator))
    result = fit(accelerator, args, model, optimizer, scheduler, train_dl, plan, state, tracker, stop, monitor,
                 trimmer)
    if result.preempted:
        log.warning("stop requested: checkpoint saved at step %d; rerun with --resume_from_checkpoint latest",
                    state.completed_steps)
        tracker.close()
        return None

    scores: dict[str, float] = {}
    if args.do_eval and eval_dl is not None:
        t_eval = time.perf_counter()
        scores = evaluate(accelerator, model, eval_dl, data.eval_examples, data.eval_features, eval_offsets, args,
                          output_dir / "eval_predictions.json", trimmer)
        scores["eval_runtime_s"] = round(time.perf_counter() - t_eval, 3)
    if args.save_final_model:
        checkpoint.export_final(accelerator, model, tokenizer, output_dir)

    report = _report(accelerator, args, model, result, strategy, mixed_precision, data, plan, scores, initial)
    if accelerator.is_main_process:
        report["total_runtime_s"] = round(time.perf_counter() - t_start, 3)
        tracker.finish(report)
        print(summary_table(report), flush=True)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return report if accelerator.is_main_process else None


def _batches_per_rank(batches: int, num_processes: int) -> int:
    """Batches each rank will see once accelerate shards the unprepared loader."""
    return max(1, -(-batches // num_processes))


def _global_batch(args: TrainArgs, accelerator) -> int:
    return args.per_device_train_batch_size * args.gradient_accumulation_steps * accelerator.num_processes


def _report(accelerator, args: TrainArgs, model, result, strategy, mixed_precision: str, data, plan,
            scores: dict[str, float], initial: dict[str, float]) -> dict[str, Any]:
    """Gather per-rank figures to every rank, then build metrics.json's content."""
    rows = torch.tensor([result.meter.local() + result.monitor.local() + [result.last_loss]],
                        dtype=torch.float64, device=accelerator.device)
    gathered = accelerator.gather(rows).cpu().tolist()
    config = accelerator.unwrap_model(model).config
    on_cuda = accelerator.device.type == "cuda"
    figures = metrics.summarize([r[:5] for r in gathered], [r[5:9] for r in gathered],
                                flops_per_token(config, args.max_seq_length),
                                metrics.device_peak_tflops(accelerator.device, mixed_precision), on_cuda)
    return {
        "exact_match": scores.get("exact_match"), "f1": scores.get("f1"),
        "initial_exact_match": initial.get("exact_match"), "initial_f1": initial.get("f1"),
        **figures,
        "train_runtime_s": round(result.train_runtime_s, 3),
        "eval_runtime_s": scores.get("eval_runtime_s"),
        "train_steps": result.state.completed_steps,
        "train_loss": result.last_loss,
        "train_loss_per_rank": [r[9] for r in gathered],
        "world_size": accelerator.num_processes,
        **strategy.as_dict(),
        "mixed_precision": mixed_precision,
        "device": torch.cuda.get_device_name(accelerator.device) if on_cuda else "cpu",
        "num_train_examples": data.num_train_examples, "num_train_features": len(data.train_features),
        "num_eval_examples": len(data.eval_examples) if data.eval_examples else 0,
        "num_eval_features": len(data.eval_features) if data.eval_features else 0,
        "global_batch_size": _global_batch(args, accelerator),
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "max_seq_length": args.max_seq_length,
        # ZeRO-3 leaves empty placeholders in the module; ds_numel is the real size.
        "num_parameters": sum(getattr(p, "ds_numel", p.numel()) for p in accelerator.unwrap_model(model).parameters()),
        "output_dir": str(args.output_dir),
        "qa_train_version": __version__,
        "args": args.to_dict(),
    }
