"""setup -> data -> model -> accelerator -> fit -> evaluate -> export -> report.

The loop never knows which strategy it runs under: that is the accelerate config's business.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

from qa_train import checkpoint, distributed, metrics
from qa_train.batching import Collator, LengthGroupedSampler, WindowDataset
from qa_train.config import TrainArgs
from qa_train.data import Examples, load_split
from qa_train.features import Features, load_or_featurize
from qa_train.hostmem import HeapTrimmer
from qa_train.tracking import Tracker

log = logging.getLogger("qa_train")
PREEMPT_FILE = "PREEMPT"
# Test hook: slows each step so a test can kill or signal a run part-way; never set in real runs.
STEP_DELAY_S = float(os.environ.get("QA_TRAIN_TEST_STEP_DELAY_S", "0"))


def resolve_mixed_precision(flag: str) -> str:
    if flag != "auto":
        return flag
    chosen = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if chosen in ("fp16", "bf16"):
        return chosen
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "no"


def make_accelerator(args: TrainArgs):
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, InitProcessGroupKwargs

    handlers = []
    if not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Without this DeepSpeed on CPU initialises its own group while accelerate sees a world of 1.
        handlers.append(InitProcessGroupKwargs(backend="gloo"))
    mixed_precision = resolve_mixed_precision(args.mixed_precision)
    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision=mixed_precision,
        kwargs_handlers=handlers,
        # Seeded per-epoch shuffling: a resumed run sees the batches the interrupted one would have.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    return accelerator, mixed_precision


def setup_logging(is_main: bool) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if is_main else logging.WARNING, force=True)
    for noisy in ("transformers", "datasets", "accelerate", "DeepSpeed", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.WARNING if is_main else logging.ERROR)


@dataclass
class Data:
    """Training keeps only its windows (the question and context text is not needed once they are cut,
    and is ~120 MB for SQuAD); evaluation keeps its examples for post-processing and scoring."""

    num_train_examples: int
    train_features: Features
    eval_examples: Examples | None
    eval_features: Features | None
    cache_hits: list[bool] = field(default_factory=list)


def load_data(accelerator, args: TrainArgs, tokenizer) -> Data:
    """The first process on each node tokenises and caches; the others then read its cache."""
    with accelerator.local_main_process_first():
        train_examples = load_split(args.train_file, args.dataset_name, args.dataset_config_name, "train",
                                    args.max_train_samples)
        train_features, hit = load_or_featurize(train_examples, tokenizer, args.max_seq_length,
                                                args.doc_stride, args.overwrite_cache)
        data = Data(len(train_examples), train_features, None, None, [hit])
        del train_examples
        if args.do_eval or args.eval_before_training:
            data.eval_examples = load_split(args.validation_file, args.dataset_name, args.dataset_config_name,
                                            "validation", args.max_eval_samples)
            data.eval_features, hit = load_or_featurize(data.eval_examples, tokenizer, args.max_seq_length,
                                                        args.doc_stride, args.overwrite_cache)
            data.cache_hits.append(hit)
    return data


def make_loaders(args: TrainArgs, data: Data, tokenizer, on_cuda: bool) -> tuple[DataLoader, DataLoader | None]:
    collate = Collator(tokenizer.pad_token_id, args.max_seq_length, args.pad_to_max_length)
    workers = args.dataloader_num_workers if args.dataloader_num_workers is not None else (2 if on_cuda else 0)
    common: dict[str, Any] = {"collate_fn": collate, "num_workers": workers,
                              "pin_memory": on_cuda, "persistent_workers": workers > 0}
    train_set = WindowDataset(data.train_features, with_labels=True)
    sampler = (LengthGroupedSampler(data.train_features.lengths, args.per_device_train_batch_size, args.seed)
               if args.group_by_length else RandomSampler(train_set))
    # An own generator: otherwise every new iterator draws a seed from the global RNG, and a resumed
    # run (which makes one more iterator after restoring RNG state) would see different dropout.
    train = DataLoader(train_set, batch_size=args.per_device_train_batch_size, sampler=sampler,
                       generator=torch.Generator().manual_seed(args.seed), **common)
    evaluation = None
    if data.eval_features is not None:
        eval_set = WindowDataset(data.eval_features, with_labels=False)
        evaluation = DataLoader(eval_set, batch_size=args.per_device_eval_batch_size,
                                sampler=SequentialSampler(eval_set), **common)
    return train, evaluation


def make_optimizer(accelerator, args: TrainArgs, model, total_steps: int, warmup_steps: int):
    """AdamW without decay on biases and LayerNorm weights, and the warm-up schedule."""
    from accelerate.utils import DummyOptim, DummyScheduler
    from transformers import get_scheduler

    decay = [p for n, p in model.named_parameters() if not _no_decay(n)]
    no_decay = [p for n, p in model.named_parameters() if _no_decay(n)]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    factor = distributed.scheduler_steps_per_update(accelerator)

    def schedule(optimizer):
        return get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=warmup_steps * factor,
                             num_training_steps=total_steps * factor)

    if distributed.uses_deepspeed_optimizer(accelerator):
        optimizer = DummyOptim(groups, lr=args.learning_rate, weight_decay=args.weight_decay)
        return optimizer, DummyScheduler(optimizer, lr_scheduler_callable=schedule)
    optimizer = torch.optim.AdamW(groups, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                                  eps=args.adam_epsilon,
                                  fused=args.optim == "adamw_torch_fused" and torch.cuda.is_available())
    return optimizer, schedule(optimizer)


def _no_decay(name: str) -> bool:
    return name.endswith(".bias") or "LayerNorm" in name or "layer_norm" in name


@dataclass
class Plan:
    updates_per_epoch: int
    total_steps: int
    num_epochs: int
    warmup_steps: int


def plan_steps(args: TrainArgs, batches_per_epoch: int) -> Plan:
    per_epoch = max(1, math.ceil(batches_per_epoch / args.gradient_accumulation_steps))
    total = args.max_train_steps if args.max_train_steps is not None else math.ceil(args.num_train_epochs * per_epoch)
    warmup = args.num_warmup_steps or math.ceil(args.warmup_ratio * total)
    return Plan(per_epoch, total, math.ceil(total / per_epoch) if total else 0, warmup)


class StopRequest:
    """SIGUSR1/SIGTERM (SLURM's warning signal) or a PREEMPT file in output_dir asks for a checkpoint and exit."""

    def __init__(self, output_dir: Path) -> None:
        self.flag = False
        self.file = output_dir / PREEMPT_FILE
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:  # noqa: ARG002
        self.flag = True

    def requested(self) -> bool:
        return self.flag or self.file.exists()

    def clear(self, is_main: bool) -> None:
        """The request is spent once its checkpoint exists; a resumed run must not stop at once."""
        if is_main:
            self.file.unlink(missing_ok=True)


@dataclass
class Fit:
    """What the loop hands to reporting."""

    state: checkpoint.TrainerState
    meter: metrics.ThroughputMeter
    monitor: metrics.MemoryMonitor
    last_loss: float = float("nan")
    preempted: bool = False
    train_runtime_s: float = 0.0


def fit(accelerator, args: TrainArgs, model, optimizer, scheduler, train_dl, plan: Plan,
        state: checkpoint.TrainerState, tracker: Tracker, stop: StopRequest, monitor,
        trimmer: HeapTrimmer) -> Fit:
    meter = metrics.ThroughputMeter(warmup_steps=args.throughput_warmup_steps)
    result = Fit(state, meter, monitor)
    sync = torch.cuda.synchronize if accelerator.device.type == "cuda" else (lambda: None)
    every = args.checkpoint_every
    running = torch.zeros((), device=accelerator.device)
    micro = 0
    profiler = start_profiler(args, accelerator) if args.profile else None
    t0 = time.perf_counter()
    model.train()
    while state.completed_steps < plan.total_steps:
        loader = accelerator.skip_first_batches(train_dl, state.batches_in_epoch) if state.batches_in_epoch else train_dl
        loader.set_epoch(state.epoch)  # the shuffle of epoch e is a function of (seed, e) alone
        for batch in loader:
            real, padded = batch.pop("num_tokens")
            batch.pop("feature_index")
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                if accelerator.sync_gradients and args.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            state.batches_in_epoch += 1
            running += loss.detach()
            micro += 1
            meter.micro_batch(len(batch["input_ids"]), int(real), int(padded))
            monitor.sample()
            trimmer.tick()
            if not accelerator.sync_gradients:
                continue
            state.completed_steps += 1
            meter.optimizer_step(sync)
            if STEP_DELAY_S:
                time.sleep(STEP_DELAY_S)
            if profiler is not None:
                profiler.step()
            if state.completed_steps % args.logging_steps == 0 or state.completed_steps == plan.total_steps:
                loss_mean, stop_now = _reduce_log(accelerator, running, micro, stop.requested())
                result.last_loss = loss_mean
                running.zero_()
                micro = 0
                tracker.log_step(state.completed_steps, {"train/loss": loss_mean,
                                                          "train/lr": scheduler.get_last_lr()[0],
                                                          "train/epoch": state.epoch})
                if stop_now:
                    checkpoint.save_checkpoint(accelerator, args.output_dir, state, args.save_total_limit)
                    stop.clear(accelerator.is_main_process)
                    result.preempted = True
                    break
            if isinstance(every, int) and state.completed_steps % every == 0:
                checkpoint.save_checkpoint(accelerator, args.output_dir, state, args.save_total_limit)
            if state.completed_steps >= plan.total_steps:
                break
        if result.preempted:
            break
        if state.completed_steps < plan.total_steps or state.batches_in_epoch >= len(train_dl):
            state.epoch += 1
            state.batches_in_epoch = 0
            if every == "epoch":
                checkpoint.save_checkpoint(accelerator, args.output_dir, state, args.save_total_limit)
    meter.finish(sync)
    if profiler is not None:
        profiler.stop()
    result.train_runtime_s = time.perf_counter() - t0
    return result


def start_profiler(args: TrainArgs, accelerator):
    """Trace 3 optimizer steps after warm-up; the trace opens in TensorBoard or Perfetto."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    on_cuda = accelerator.device.type == "cuda"
    if on_cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    write = torch.profiler.tensorboard_trace_handler(str(Path(args.output_dir) / "profile"),
                                                     f"rank{accelerator.process_index}")

    def ready(prof) -> None:
        write(prof)
        if accelerator.is_main_process:
            sort = "self_cuda_time_total" if on_cuda else "self_cpu_time_total"
            print(prof.key_averages().table(sort_by=sort, row_limit=15), flush=True)
            log.info("profiler trace written to %s", Path(args.output_dir) / "profile")

    profiler = torch.profiler.profile(
        activities=activities, on_trace_ready=ready, record_shapes=True,
        schedule=torch.profiler.schedule(wait=max(args.throughput_warmup_steps, 1), warmup=1, active=3, repeat=1),
    )
    profiler.start()
    return profiler


def _reduce_log(accelerator, running: torch.Tensor, micro: int, stop: bool) -> tuple[float, bool]:
    """The only host sync of the loop: mean loss over all ranks, and whether any rank must stop."""
    stats = torch.stack([running.float(), torch.tensor(float(micro), device=running.device),
                         torch.tensor(float(stop), device=running.device)])
    total = accelerator.reduce(stats, reduction="sum").tolist()
    return total[0] / max(total[1], 1.0), total[2] > 0
