"""AdamW with decay only where it belongs, the warm-up schedule, and how many steps a run takes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from qa_train import distributed
from qa_train.config import OptimArgs, TrainArgs


@dataclass
class Plan:
    updates_per_epoch: int
    total_steps: int
    num_epochs: int
    warmup_steps: int


def batches_per_rank(batches: int, num_processes: int) -> int:
    """Batches each rank will see once accelerate shards the unprepared loader."""
    return max(1, -(-batches // num_processes))


def plan_steps(optim: OptimArgs, batches_per_epoch: int) -> Plan:
    per_epoch = max(1, math.ceil(batches_per_epoch / optim.gradient_accumulation_steps))
    total = (optim.max_train_steps if optim.max_train_steps is not None
             else math.ceil(optim.num_train_epochs * per_epoch))
    warmup = optim.num_warmup_steps or math.ceil(optim.warmup_ratio * total)
    return Plan(per_epoch, total, math.ceil(total / per_epoch) if total else 0, warmup)


# torch's normalisation layers by type; RMSNorm (absent before torch 2.4) and the families' own norms
# (T5LayerNorm, LlamaRMSNorm, ...) by their class name ending in "Norm".
NORM_TYPES = (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.LocalResponseNorm,
              torch.nn.modules.batchnorm._NormBase)


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
    return [{"params": [p for n, p in named if n not in skip], "weight_decay": weight_decay},
            {"params": [p for n, p in named if n in skip], "weight_decay": 0.0}]


def build_optimizer(accelerator, model, args: TrainArgs, plan: Plan):
    """The optimizer and LR schedule for this strategy, sized so every strategy follows the same LR curve."""
    from transformers import get_scheduler

    o = args.optim
    factor = distributed.scheduler_steps_per_update(accelerator)

    def schedule(optimizer):
        return get_scheduler(o.lr_scheduler_type, optimizer, num_warmup_steps=plan.warmup_steps * factor,
                             num_training_steps=plan.total_steps * factor)

    def adamw(groups: list[dict]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(groups, lr=o.learning_rate, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_epsilon,
                                 fused=o.optim == "adamw_torch_fused" and torch.cuda.is_available())

    groups = param_groups(model, o.weight_decay)
    return distributed.optimizer_and_scheduler(accelerator, groups, args, adamw, schedule)
