"""Launch sanity before any work: one process per device, a recompute that the strategy can run, CPU threads per rank."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from qa_train.config.settings import ConfigError


class LaunchError(RuntimeError):
    """The processes that started do not form the world the launcher meant."""


LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def check_launch_env(env: Mapping[str, str]) -> None:
    """The launcher's variables, as torchrun, accelerate launch and qa-train launch set them all, checked before
    anything else reads them: left set in a shell or a job script without a launcher, WORLD_SIZE > 1 failed inside
    Accelerator() with torch's traceback, a RANK other than 0 kept every refusal unsaid (only rank 0 speaks), and a
    value that is not a number failed with a ValueError."""
    for name in LAUNCH_VARIABLES:
        if name in env and re.fullmatch("[0-9]+", env[name]) is None:
            raise ConfigError(f"{name}={env[name]!r}: not a number 0 or more, as a launcher sets it; unset it")
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        if env.get(name, "1").lstrip("0") == "":
            raise ConfigError(f"{name}={env[name]}: a world has 1 process or more; unset it")
    world, rank = int(env.get("WORLD_SIZE", "1")), int(env.get("RANK", "0"))
    alone = "unset it to train in one process, or start the run with qa-train launch"
    if rank >= world:
        size = f"WORLD_SIZE={world}" if "WORLD_SIZE" in env else "WORLD_SIZE unset"
        raise ConfigError(f"RANK={rank}: a world of {world} ({size}) has ranks 0 to {world - 1}; {alone}")
    if env.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and "LOCAL_RANK" not in env:
        # accelerate starts DeepSpeed only in a launched process; otherwise Accelerator() failed with torch's traceback.
        raise ConfigError(
            "ACCELERATE_USE_DEEPSPEED=true without a launcher (LOCAL_RANK unset): unset it to train in one process, "
            "or start the run with qa-train launch --config_file accelerate_configs/zero2.yaml (or another DeepSpeed one)"
        )
    # accelerate joins a process group wherever LOCAL_RANK is set, and torch's env:// rendezvous needs MASTER_ADDR.
    group = f"WORLD_SIZE={world}" if world > 1 else f"LOCAL_RANK={env['LOCAL_RANK']}" if "LOCAL_RANK" in env else None
    if group and not env.get("MASTER_ADDR"):
        raise ConfigError(
            f"{group} without MASTER_ADDR: no launcher started this process (torchrun, accelerate launch and "
            f"qa-train launch set both), and it cannot join a process group; {alone}"
        )


def check_inductor_cache(env: Mapping[str, str]) -> None:
    """TORCHINDUCTOR_CACHE_DIR is created when torch._dynamo is imported, which every run does (compiled or not):
    a folder that cannot be made there failed with an OSError traceback once the data was read."""
    folder = env.get("TORCHINDUCTOR_CACHE_DIR")
    if not folder:
        return
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise ConfigError(
            f"TORCHINDUCTOR_CACHE_DIR={folder}: cannot be created ({err.strerror}); torch makes it at start-up, "
            "compiled or not: point it at a folder you can write, or unset it"
        ) from None


def check_world(accelerator) -> None:
    """Refuse a launch whose processes do not form one data-parallel world.

    `accelerate launch --multi_gpu` on a machine without CUDA starts N processes that each believe
    they are alone (num_processes == 1), or, once a gloo group exists, that see N processes but
    run without any distributed wrapper (distributed_type NO): either way N separate models.
    """
    from accelerate.utils import DistributedType

    launcher = int(os.environ.get("WORLD_SIZE", "1"))
    seen = accelerator.num_processes
    if launcher != seen:
        what = f"this one sees a world of {seen}"
    elif launcher > 1 and accelerator.distributed_type == DistributedType.NO:
        what = f"they run without a data-parallel strategy (accelerate's distributed type {DistributedType.NO.value})"
    else:
        return
    raise LaunchError(
        f"the launcher started WORLD_SIZE={launcher} processes but {what}: they would train separate models. "
        "On a CPU-only machine use `qa-train launch --cpu --config_file ...` (torchrun with "
        "ACCELERATE_USE_CPU=true for DDP, gloo for DeepSpeed and FSDP)."
    )


def check_recompute(accelerator, gradient_checkpointing: bool) -> None:
    """FSDP's own activation checkpointing (an accelerate config's `fsdp_activation_checkpointing: true`) with
    --gradient_checkpointing would wrap every layer twice and recompute it twice; Trainer refuses the pair too."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)  # unset outside FSDP
    if gradient_checkpointing and getattr(plugin, "activation_checkpointing", False):
        raise LaunchError(
            "--gradient_checkpointing: the accelerate config already sets fsdp_activation_checkpointing: "
            "true, which recomputes the layers itself; keep one of the two"
        )


def cpu_threads(processes_per_node: int) -> int:
    """Threads for each of a node's CPU ranks: the cores this process may use, split evenly."""
    return max(1, len(os.sched_getaffinity(0)) // processes_per_node)


def cpu_thread_warning(device_type: str, threads: int, local_processes: int) -> str | None:
    """One line when a CPU rank runs on 1 thread where its share of the cores (what qa_train.strategy.launch would give it)
    is more: accelerate launch sets OMP_NUM_THREADS=1 on a machine without a GPU unless given --cpu or
    --num_cpu_threads_per_process."""
    share = cpu_threads(local_processes)
    if device_type != "cpu" or threads != 1 or share < 2:
        return None
    return (
        f"training on CPU with 1 thread per process where the cores allow {share} (OMP_NUM_THREADS=1, which "
        "accelerate launch sets unless given --cpu or --num_cpu_threads_per_process); "
        f"qa-train launch --cpu sets it from the cores, or set OMP_NUM_THREADS={share}"
    )


def check_optimizer(accelerator, optim: str) -> None:
    """--optim choices this launch cannot honour, refused before any window is cut: one the DeepSpeed JSON would
    replace with its own, transformers' Adafactor under FSDP2 (its update mixes plain tensors into the sharded
    DTensor parameters and fails at the first step), and bitsandbytes' 8-bit AdamW away from CUDA."""
    from accelerate.utils import DistributedType

    from qa_train.strategy.deepspeed_json import uses_deepspeed_optimizer

    if optim not in ("adamw_torch_fused", "adamw_torch") and uses_deepspeed_optimizer(accelerator):
        raise ConfigError(
            f"--optim {optim}: the DeepSpeed JSON brings its own optimizer (its 'optimizer' section), which would "
            "replace it; use a config without one, or drop the flag"
        )
    if optim == "adafactor" and accelerator.distributed_type == DistributedType.FSDP:
        raise ConfigError(
            "--optim adafactor: transformers' Adafactor cannot step FSDP2's sharded (DTensor) parameters; "
            "use it under DDP or ZeRO, or adamw_torch under FSDP"
        )
    if optim == "adamw_bnb_8bit" and accelerator.device.type != "cuda":
        raise ConfigError(
            f"--optim adamw_bnb_8bit: bitsandbytes' 8-bit AdamW runs on CUDA GPUs, and this run is on "
            f"{accelerator.device.type}; use adamw_torch or adafactor"
        )
