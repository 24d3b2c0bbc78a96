"""The optimizer (--optim) with decay only where it belongs, the warm-up schedule, and how many steps a run takes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from qa_train.config.settings import ConfigError, OptimArgs, TrainArgs
from qa_train.strategy import deepspeed_json, sharded


@dataclass
class StepPlan:
    """How many optimizer steps the run takes, per epoch and in all, and how many of them warm up."""

    updates_per_epoch: int
    total_steps: int
    num_epochs: int
    warmup_steps: int


def batches_per_rank(batches: int, num_processes: int) -> int:
    """Batches each rank will see once accelerate shards the unprepared loader."""
    return max(1, -(-batches // num_processes))


def step_plan(optim: OptimArgs, batches_per_epoch: int) -> StepPlan:
    per_epoch = max(1, math.ceil(batches_per_epoch / optim.gradient_accumulation_steps))
    total = (
        optim.max_train_steps if optim.max_train_steps is not None else math.ceil(optim.num_train_epochs * per_epoch)
    )
    # The total is known only once the data is featurised: a warm-up longer than the run never reaches the peak
    # learning rate, and the schedule would decay from a peak it never had.
    if optim.num_warmup_steps > total:
        raise ConfigError(
            f"--num_warmup_steps: {optim.num_warmup_steps} is more than the run's {total} optimizer steps: lower it, "
            "or give --warmup_ratio (a share of all steps) instead"
        )
    warmup = optim.num_warmup_steps or math.ceil(optim.warmup_ratio * total)
    return StepPlan(per_epoch, total, math.ceil(total / per_epoch) if total else 0, warmup)


def global_batch_waste(optim: OptimArgs, windows: int, per_device: int, processes: int) -> str | None:
    """A warning when the global batch is beyond the epoch's windows: each step is then the whole epoch, filled up to
    the global batch with pad windows (weight 0) that cost a forward and backward pass each and train nothing (10
    windows at 64 x 4 computed 256 a step). Said, not refused: a smoke test on a few questions
    (`--max_train_samples 8` under the default batch of 12) trains correctly, only slower."""
    global_batch = per_device * optim.gradient_accumulation_steps * processes
    if global_batch <= windows or optim.max_train_steps == 0:  # --max_train_steps 0 takes no step to pad
        return None
    return (
        f"--per_device_train_batch_size: a global batch of {global_batch} windows ({per_device} per device x "
        f"{optim.gradient_accumulation_steps} accumulation x {processes} process(es)) is more than the {windows} "
        f"training windows: every step pads them with {global_batch - windows} windows that train nothing (lower "
        f"it or --gradient_accumulation_steps to {windows} windows in all at most to spare their compute)"
    )


# torch's normalisation layers by type; RMSNorm (absent before torch 2.4) and the families' own norms
# (T5LayerNorm, LlamaRMSNorm, ...) by their class name ending in "Norm".
NORM_TYPES = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.LocalResponseNorm, torch.nn.modules.batchnorm._NormBase)


def is_norm(module: torch.nn.Module) -> bool:
    return isinstance(module, NORM_TYPES) or type(module).__name__.endswith("Norm")


def no_decay_names(model: torch.nn.Module) -> set[str]:
    """Every parameter of a normalisation layer and every bias, found by module type rather than by
    parameter name: ModernBERT's norms are `...attn_norm.weight`, DistilBERT's `...sa_layer_norm.weight`."""
    names: set[str] = set()
    for prefix, module in model.named_modules():
        for name, _ in module.named_parameters(prefix=prefix, recurse=False):
            if is_norm(module) or name.rsplit(".", 1)[-1] == "bias":
                names.add(name)
    return names


def param_groups(model, weight_decay: float) -> list[dict]:
    """Weight decay on weights; none on biases and normalisation layers (BERT's recipe)."""
    named = list(model.named_parameters())
    skip = no_decay_names(model)
    return [
        {"params": [p for n, p in named if n not in skip], "weight_decay": weight_decay},
        {"params": [p for n, p in named if n in skip], "weight_decay": 0.0},
    ]


def optimizer_order(model) -> dict[str, tuple[int, ...]]:
    """The parameters' whole shapes by name, in the order param_groups hands them to the optimizer (how its state
    dict numbers them)."""
    names = {id(p): name for name, p in model.named_parameters()}
    shapes = sharded.full_shapes(model)
    return {names[id(p)]: shapes[names[id(p)]] for group in param_groups(model, 0.0) for p in group["params"]}


def build_optimizer(accelerator, model, args: TrainArgs, steps: StepPlan):
    """The optimizer and LR schedule for this strategy, sized so every strategy follows the same LR curve."""
    from transformers import get_scheduler

    o = args.optim
    factor = deepspeed_json.scheduler_steps_per_update(accelerator)

    def schedule(optimizer):
        return get_scheduler(
            o.lr_scheduler_type,
            optimizer,
            num_warmup_steps=steps.warmup_steps * factor,
            num_training_steps=steps.total_steps * factor,
        )

    groups = param_groups(model, o.weight_decay)
    return deepspeed_json.optimizer_and_scheduler(accelerator, groups, args, lambda g: torch_optimizer(g, o), schedule)


def torch_optimizer(groups: list[dict], o: OptimArgs) -> torch.optim.Optimizer:
    """--optim's optimizer, with Trainer's settings for each name (transformers' Trainer.get_optimizer_cls_and_kwargs)."""
    if o.optim == "adafactor":
        from transformers.optimization import Adafactor

        # At --learning_rate under the schedule, as Trainer's: not Adafactor's own relative step size.
        return Adafactor(groups, lr=o.learning_rate, scale_parameter=False, relative_step=False)
    betas = (o.adam_beta1, o.adam_beta2)
    if o.optim == "adamw_bnb_8bit":
        from bitsandbytes.optim import AdamW

        return AdamW(groups, lr=o.learning_rate, betas=betas, eps=o.adam_epsilon, optim_bits=8, is_paged=False)
    fused = o.optim == "adamw_torch_fused" and torch.cuda.is_available()
    return torch.optim.AdamW(groups, lr=o.learning_rate, betas=betas, eps=o.adam_epsilon, fused=fused)


# What the flags set per parameter group; accelerate's load_state restores the checkpoint's values over them.
GROUP_SETTINGS = ("weight_decay", "betas", "eps")


@dataclass
class Hyperparameters:
    """This run's optimizer settings, taken before a resume: the checkpoint brings moments and the step count,
    the flags bring the learning rate and the rest (as a user who lowers --learning_rate after a divergence
    expects; accelerate alone would keep the checkpoint's)."""

    base_lrs: list[float]
    groups: list[dict]


def _lambda_scheduler(scheduler):
    inner = getattr(scheduler, "scheduler", scheduler)  # accelerate wraps it
    return inner if hasattr(inner, "lr_lambdas") and hasattr(inner, "base_lrs") else None


def hyperparameters(scheduler) -> Hyperparameters | None:
    sched = _lambda_scheduler(scheduler)
    if sched is None:
        return None
    return Hyperparameters(
        list(sched.base_lrs), [{k: g[k] for k in GROUP_SETTINGS if k in g} for g in sched.optimizer.param_groups]
    )


def reapply(scheduler, fresh: Hyperparameters | None, position: int | None = None) -> list[str]:
    """Put this run's settings back over a loaded checkpoint's, the schedule continuing at the checkpoint's
    step (at `position` scheduler steps where given: a schedule stepped once per process per update, saved by
    another number of processes or not saved at all, is placed by the steps done); returns what differed, one
    phrase each."""
    sched = _lambda_scheduler(scheduler)
    if sched is None or fresh is None or len(sched.optimizer.param_groups) != len(fresh.groups):
        return []
    if position is not None:
        sched.last_epoch, sched._step_count = position, position + 1
    changes = []
    if list(sched.base_lrs) != fresh.base_lrs:
        changes.append(f"learning rate {sched.base_lrs[0]:.3g} -> {fresh.base_lrs[0]:.3g}")
    for group, settings in zip(sched.optimizer.param_groups, fresh.groups):
        changes += [f"{k} {group[k]} -> {v}" for k, v in settings.items() if group.get(k) != v]
        group.update(settings)
    sched.base_lrs = list(fresh.base_lrs)
    for group, base, lam in zip(sched.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
        group["initial_lr"] = base
        group["lr"] = base * lam(sched.last_epoch)
    sched._last_lr = [group["lr"] for group in sched.optimizer.param_groups]
    return list(dict.fromkeys(changes))
