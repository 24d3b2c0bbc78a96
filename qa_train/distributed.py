"""The one place that knows about strategies: launch sanity, what is running, DeepSpeed's JSON.

The train loop never branches on the strategy; what the libraries force (DeepSpeed's config
"auto" values and optimizer placeholders) is handled here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from qa_train.config import ConfigError, TrainArgs


class LaunchError(RuntimeError):
    """The processes that started do not form the world the launcher meant."""


def check_world(accelerator) -> None:
    """Refuse a launch whose processes do not form one data-parallel world.

    `accelerate launch --multi_gpu` on a machine without CUDA starts N processes that each believe
    they are alone (num_processes == 1), or, once a gloo group exists, that see N processes but
    run without any distributed wrapper (distributed_type NO): either way N separate models.
    """
    from accelerate.utils import DistributedType

    launcher = int(os.environ.get("WORLD_SIZE", "1"))
    seen = accelerator.num_processes
    if launcher != seen or (launcher > 1 and accelerator.distributed_type == DistributedType.NO):
        raise LaunchError(
            f"the launcher started WORLD_SIZE={launcher} processes but this one sees a world of {seen} "
            f"(distributed type {accelerator.distributed_type.value}): they would train separate models. "
            "On a CPU-only machine use `python -m qa_train.launch --cpu --config_file ...` (torchrun with "
            "ACCELERATE_USE_CPU=true for DDP, gloo for DeepSpeed)."
        )


@dataclass
class Strategy:
    name: str          # single, ddp, fsdp, zero1, zero2, zero3
    zero_stage: int | None
    offload: str       # none, optimizer, optimizer+params, params
    distributed_type: str

    def as_dict(self) -> dict[str, object]:
        return {"strategy": self.name, "zero_stage": self.zero_stage, "offload": self.offload,
                "distributed_type": self.distributed_type}


def _offload_device(section: dict | None) -> bool:
    return bool(section) and str(section.get("device", "none")).lower() not in ("none", "")


def detect_strategy(accelerator) -> Strategy:
    """Read the strategy from the live accelerator state, never from a file name."""
    from accelerate.utils import DistributedType

    dtype = accelerator.distributed_type
    if dtype == DistributedType.DEEPSPEED:
        zero = accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {})
        stage = int(zero.get("stage", 0))
        opt, par = _offload_device(zero.get("offload_optimizer")), _offload_device(zero.get("offload_param"))
        offload = {(False, False): "none", (True, False): "optimizer", (True, True): "optimizer+params",
                   (False, True): "params"}[(opt, par)]
        return Strategy(f"zero{stage}" if stage else "deepspeed", stage, offload, dtype.value)
    if dtype == DistributedType.FSDP:
        plugin = accelerator.state.fsdp_plugin
        cpu = getattr(plugin, "cpu_offload", None)
        offload = "optimizer+params" if getattr(cpu, "offload_params", False) else "none"
        return Strategy("fsdp", None, offload, dtype.value)
    if dtype in (DistributedType.MULTI_GPU, DistributedType.MULTI_CPU, DistributedType.MULTI_XPU):
        return Strategy("ddp", None, "none", dtype.value)
    return Strategy("single", None, "none", dtype.value)


def _is_auto(value: object) -> bool:
    return isinstance(value, str) and value == "auto"


def reconcile_deepspeed(accelerator, args: TrainArgs, mixed_precision: str) -> None:
    """Fill the JSON's "auto" values from our flags and refuse a JSON that says otherwise.

    accelerate would fill gradient_clipping "auto" with 1.0 whatever --max_grad_norm says, and would
    silently prefer the JSON's accumulation steps over the flag; a value set in two places that
    disagree is an error here instead.
    """
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    cfg = plugin.deepspeed_config
    where = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE") or "the DeepSpeed config"
    wanted = {
        "train_micro_batch_size_per_gpu": (args.per_device_train_batch_size, "per_device_train_batch_size"),
        "gradient_accumulation_steps": (args.gradient_accumulation_steps, "gradient_accumulation_steps"),
        "gradient_clipping": (float(args.max_grad_norm), "max_grad_norm"),
    }
    for key, (value, flag) in wanted.items():
        current = cfg.get(key, "auto")
        if _is_auto(current):
            cfg[key] = value
        elif float(current) != float(value):
            raise ConfigError(f"{where}: '{key}' is {current} but --{flag} is {value}; "
                              f'set "{key}": "auto" in the JSON so the flag decides')
    if "train_batch_size" in cfg and not _is_auto(cfg["train_batch_size"]):
        expected = args.per_device_train_batch_size * args.gradient_accumulation_steps * accelerator.num_processes
        if int(cfg["train_batch_size"]) != expected:
            raise ConfigError(f"{where}: 'train_batch_size' is {cfg['train_batch_size']} but the flags give "
                              f"{expected}; use \"auto\"")
    for dtype in ("fp16", "bf16"):
        enabled = cfg.get(dtype, {}).get("enabled", "auto")
        if not _is_auto(enabled) and str(enabled).lower() == "true" and mixed_precision != dtype:
            raise ConfigError(f"{where}: {dtype} is enabled but --mixed_precision resolved to {mixed_precision}; "
                              f'set "{dtype}": {{"enabled": "auto"}} so the flag decides')
    _fill_optimizer(cfg, args)


def _fill_optimizer(cfg: dict, args: TrainArgs) -> None:
    """DeepSpeed's own optimizer (CPUAdam under offload) takes its hyper-parameters from the flags."""
    params = cfg.get("optimizer", {}).get("params")
    if params is None:
        return
    values = {"lr": args.learning_rate, "betas": [args.adam_beta1, args.adam_beta2], "eps": args.adam_epsilon,
              "weight_decay": args.weight_decay}
    for key, value in values.items():
        if _is_auto(params.get(key, "auto")):
            params[key] = value


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
