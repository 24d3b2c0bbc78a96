"""DeepSpeed's JSON reconciled with the flags (its "auto" values filled), and the optimizer and schedule it builds."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from qa_train.config.settings import ConfigError, TrainArgs


def _is_auto(value: object) -> bool:
    return isinstance(value, str) and value == "auto"


def reconcile_deepspeed(cfg: dict, args: TrainArgs, world_size: int, mixed_precision: str, source: str) -> None:
    """Fill the DeepSpeed JSON's "auto" values (in place) from our flags; refuse one that says otherwise.

    accelerate would fill gradient_clipping "auto" with 1.0 whatever --max_grad_norm says, and would
    silently prefer the JSON's accumulation steps over the flag; a value set in two places that
    disagree is an error here instead. `source` names the JSON in messages.
    """
    optim, micro = args.optim, args.data.per_device_train_batch_size
    wanted = {
        "train_micro_batch_size_per_gpu": (micro, "per_device_train_batch_size"),
        "gradient_accumulation_steps": (optim.gradient_accumulation_steps, "gradient_accumulation_steps"),
        "gradient_clipping": (float(optim.max_grad_norm), "max_grad_norm"),
    }
    for key, (value, flag) in wanted.items():
        current = cfg.get(key, "auto")
        if _is_auto(current):
            cfg[key] = value
        elif float(current) != float(value):
            raise ConfigError(
                f"{source}: '{key}' is {current} but --{flag} is {value}; "
                f'set "{key}": "auto" in the JSON so the flag decides'
            )
    if "train_batch_size" in cfg and not _is_auto(cfg["train_batch_size"]):
        expected = micro * optim.gradient_accumulation_steps * world_size
        if int(cfg["train_batch_size"]) != expected:
            raise ConfigError(
                f"{source}: 'train_batch_size' is {cfg['train_batch_size']} but the flags give {expected}; use \"auto\""
            )
    for dtype in ("fp16", "bf16"):
        enabled = cfg.get(dtype, {}).get("enabled", "auto")
        if not _is_auto(enabled) and str(enabled).lower() == "true" and mixed_precision != dtype:
            raise ConfigError(
                f"{source}: {dtype} is enabled but --mixed_precision resolved to {mixed_precision}; "
                f'set "{dtype}": {{"enabled": "auto"}} so the flag decides'
            )
    _fill_optimizer(cfg, args, source)


def _fill_optimizer(cfg: dict, args: TrainArgs, source: str) -> None:
    """DeepSpeed's own optimizer (CPUAdam under offload) takes its hyper-parameters from the flags: a value the
    JSON sets otherwise would train with it while metrics.json records the flag's, so it is refused."""
    params = cfg.get("optimizer", {}).get("params")
    if params is None:
        return
    o = args.optim
    values: dict[str, tuple[Any, str]] = {
        "lr": (o.learning_rate, "--learning_rate"),
        "betas": ([o.adam_beta1, o.adam_beta2], "--adam_beta1/--adam_beta2"),
        "eps": (o.adam_epsilon, "--adam_epsilon"),
        "weight_decay": (o.weight_decay, "--weight_decay"),
    }
    for key, (value, flag) in values.items():
        current = params.get(key, "auto")
        if _is_auto(current):
            params[key] = value
        elif _floats(current) != _floats(value):
            raise ConfigError(
                f"{source}: optimizer '{key}' is {current} but {flag} is {value}; "
                f'set "{key}": "auto" in the JSON so the flag decides'
            )


def _floats(value: object) -> list[float]:
    return [float(v) for v in value] if isinstance(value, list | tuple) else [float(value)]  # type: ignore[arg-type]


def reconcile_with_flags(accelerator, args: TrainArgs, mixed_precision: str) -> None:
    """reconcile_deepspeed on the live plugin's config; nothing to do outside DeepSpeed."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    source = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE") or "the DeepSpeed config"
    reconcile_deepspeed(plugin.deepspeed_config, args, accelerator.num_processes, mixed_precision, source)


def uses_deepspeed_optimizer(accelerator) -> bool:
    plugin = accelerator.state.deepspeed_plugin
    return plugin is not None and "optimizer" in plugin.deepspeed_config


def scheduler_steps_per_update(accelerator) -> int:
    """How far one optimizer update advances a prepared LR scheduler.

    accelerate wraps a torch scheduler in AcceleratedScheduler, which steps it once per process per
    update (under DeepSpeed too), while a DummyScheduler handed to DeepSpeed's own optimizer is
    stepped by the engine exactly once. Sizing the schedule by this factor gives the same LR curve
    under every strategy.
    """
    return 1 if uses_deepspeed_optimizer(accelerator) else accelerator.num_processes


def optimizer_and_scheduler(
    accelerator,
    groups: list[dict],
    args: TrainArgs,
    torch_optimizer: Callable[[list[dict]], Any],
    schedule: Callable[[Any], Any],
) -> tuple[Any, Any]:
    """Placeholders when the DeepSpeed JSON brings its own optimizer (DeepSpeed builds it), else torch's."""
    if uses_deepspeed_optimizer(accelerator):
        from accelerate.utils import DummyOptim, DummyScheduler

        optimizer = DummyOptim(groups, lr=args.optim.learning_rate, weight_decay=args.optim.weight_decay)
        return optimizer, DummyScheduler(optimizer, lr_scheduler_callable=schedule)
    optimizer = torch_optimizer(groups)
    return optimizer, schedule(optimizer)
