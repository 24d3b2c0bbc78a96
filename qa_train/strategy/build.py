"""The accelerator for the config in use, its mixed precision, and which strategy is running.

The train loop never branches on the strategy; what the libraries force is handled in this package.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from qa_train.config.settings import ConfigError, TrainArgs
from qa_train.strategy.checks import LaunchError

if TYPE_CHECKING:
    from collections.abc import Iterator

log = logging.getLogger("qa_train")


def resolve_mixed_precision(flag: str, env: dict[str, str], on_cuda: bool, bf16_capable: bool) -> str:
    """auto: the accelerate config's choice (ACCELERATE_MIXED_PRECISION) if it set one, else bf16 where capable.
    fp16 without CUDA is refused: accelerate (1.15) then applies neither autocast nor a loss scaler, so a single
    or DDP run trains in fp32 under the fp16 label, FSDP2 computes in fp16 unscaled, and DeepSpeed fails."""
    chosen = flag if flag != "auto" else env.get("ACCELERATE_MIXED_PRECISION", "no").lower()
    if chosen not in ("no", "fp16", "bf16"):  # fp8 or a typo: it went to bf16 or fp32 without a word
        raise ConfigError(
            f"the accelerate config's mixed_precision: {chosen} (ACCELERATE_MIXED_PRECISION): qa_train trains in "
            "no, fp16 or bf16; set one of them, or pass --mixed_precision"
        )
    if chosen == "fp16" and not on_cuda:
        said = "--mixed_precision fp16" if flag == "fp16" else "the accelerate config's mixed_precision: fp16"
        raise ConfigError(
            f"{said}: fp16 needs a CUDA GPU (on CPU accelerate applies neither autocast nor a "
            "loss scaler); use --mixed_precision bf16 or no"
        )
    if chosen in ("fp16", "bf16") or flag != "auto":
        return chosen
    return "bf16" if bf16_capable else "no"


def enable_tf32() -> None:
    """--tf32, as Trainer sets it (transformers' enable_tf32); refused where there is no TF32 to enable, before any
    data is read."""
    from transformers.utils.import_utils import enable_tf32 as set_tf32
    from transformers.utils.import_utils import is_torch_tf32_available

    on_cpu = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    if on_cpu or not is_torch_tf32_available():
        raise ConfigError(
            "--tf32: TF32 is an Ampere-or-newer NVIDIA GPU's (compute capability 8.0+) and this run has none; "
            "drop the flag"
        )
    set_tf32(True)


# What accelerate launch makes of a config's (or its own flag's) accumulation and clipping, which Accelerator()
# reads over the values qa_train passes it: the accumulation on every strategy, the clipping under DeepSpeed.
LAUNCHER_OVERRIDES = {
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": ("gradient_accumulation_steps", "gradient_accumulation_steps"),
    "ACCELERATE_GRADIENT_CLIPPING": ("gradient_clipping", "max_grad_norm"),
}


def check_launcher_overrides(args: TrainArgs) -> None:
    """A launcher value that differs from the flag would win inside Accelerator() without a word: the run planned
    and reported one accumulation (its steps, global batch and schedule) and trained with another."""
    flags = {
        "gradient_accumulation_steps": float(args.optim.gradient_accumulation_steps),
        "max_grad_norm": float(args.optim.max_grad_norm),
    }
    for variable, (key, flag) in LAUNCHER_OVERRIDES.items():
        value = os.environ.get(variable)
        if value is None or value == "auto" or _number(value) == flags[flag]:
            continue
        raise ConfigError(
            f"{variable}={value} (accelerate launch sets it from a config's {key}) but --{flag} is "
            f"{flags[flag]:g}: accelerate would use it instead of the flag; drop it from the config and pass "
            f"--{flag} {value}"
        )


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None


def launch_precision(flag: str) -> str:
    """--mixed_precision as this launch resolves it (alike on every rank), before any data is read."""
    import torch

    on_cuda = torch.cuda.is_available()
    return resolve_mixed_precision(flag, dict(os.environ), on_cuda, on_cuda and torch.cuda.is_bf16_supported())


def fsdp_config_error(err: Exception) -> ConfigError | None:
    """What Accelerator() raised while building its FSDP plugin from the FSDP_* variables that accelerate launch
    makes of the config's fsdp_config, as one line naming the config's key: a value it cannot read
    (`fsdp_state_dict_type: SHARDED`, `fsdp_offload_params: nope`) is a KeyError or ValueError on every rank,
    before any window is cut. None for any other error."""
    import traceback

    from qa_train.core.errors import one_line

    frames = traceback.extract_tb(err.__traceback__)
    if not any("FullyShardedDataParallelPlugin(" in (f.line or "") for f in frames):
        return None
    said = str(err.args[0]) if err.args else ""
    # accelerate's messages name the value, not the variable it came from.
    found = [
        f"{k.lower()}: {v}"
        for k, v in os.environ.items()
        if k.startswith("FSDP_") and v and re.search(rf"(^|\W){re.escape(v)}(\W|$)", said)
    ]
    key = found[0] if len(found) == 1 else "fsdp_config"
    return ConfigError(f"the accelerate config's {key}: accelerate cannot read it ({one_line(err)})")


def make_accelerator(args: TrainArgs, log_with: list[Any], mixed_precision: str) -> Any:
    """The Accelerator for this launch (with its unstarted trackers), in `launch_precision`'s mixed precision."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    on_cuda = torch.cuda.is_available()
    # Without gloo named, DeepSpeed on CPU initialises its own group while accelerate sees a world of 1.
    backend = None if on_cuda or int(os.environ.get("WORLD_SIZE", "1")) == 1 else "gloo"
    handlers = [process_group_kwargs(backend, args.system.ddp_timeout)]
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        # DeepSpeed builds or loads its ops inside Accelerator(): a lock left by a killed build would hang it.
        from . import op_builds

        op_builds.prepare()
    try:
        with main_process_prints():
            accelerator = Accelerator(
                gradient_accumulation_steps=args.optim.gradient_accumulation_steps,
                mixed_precision=mixed_precision,
                kwargs_handlers=handlers,
                log_with=log_with or None,
                # Seeded per-epoch shuffling: a resumed run sees the batches the interrupted one would have.
                # non_blocking: accelerate's default copy of each (pinned) batch waits for the GPU to finish the
                # queued step, so the host could not prepare the next one meanwhile.
                dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, non_blocking=on_cuda),
            )
    except (KeyError, ValueError) as err:
        refused = fsdp_config_error(err)
        if refused is None:
            raise
        raise refused from None
    _shard_on_cpu(accelerator, mixed_precision)
    if accelerator.device.type == "cpu":
        # accelerate's unwrap_model imports DeepSpeed in every run where it is installed, and DeepSpeed's own
        # device detection then warns on CPU that it "was unable to detect" a GPU: told, it says nothing. (A
        # DeepSpeed strategy imports it inside Accelerator(), too early for this: qa_train.strategy.launch --cpu sets it.)
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return accelerator


@contextlib.contextmanager
def main_process_prints() -> Iterator[None]:
    """What libraries print to stdout here, from the main process alone: DeepSpeed on CPU prints its op load from
    every rank inside Accelerator(), where no logger can be told. Another rank's output is kept and shown if the
    block fails, so nothing that explains a failure is lost."""
    if os.environ.get("RANK", "0") == "0":
        yield
        return
    kept = io.StringIO()
    try:
        with contextlib.redirect_stdout(kept):
            yield
    except BaseException:
        sys.stdout.write(kept.getvalue())
        raise


def process_group_kwargs(backend: str | None, timeout_s: float) -> Any:
    """The process group's backend (None: accelerate's choice) and --ddp_timeout, for every strategy."""
    from accelerate.utils import InitProcessGroupKwargs

    kwargs = {"timeout": timedelta(seconds=timeout_s), **({"backend": backend} if backend else {})}
    handler = InitProcessGroupKwargs(**kwargs)
    # accelerate passes on only the fields that differ from its NCCL defaults (600 s): a gloo group asked for
    # exactly 600 s would get torch's 1800.
    handler.to_kwargs = lambda: kwargs
    return handler


def _shard_on_cpu(accelerator, mixed_precision: str) -> None:
    """FSDP2 on CPU processes (gloo). accelerate 1.15 keeps an FSDP launch on CPU as plain MULTI_CPU data
    parallelism (its state applies the FSDP plugin only to accelerator device types), although torch's
    fully_shard runs there; nothing in Accelerator's own set-up depends on the type, so it is set after."""
    from accelerate import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    if (
        os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true"
        or accelerator.distributed_type != DistributedType.MULTI_CPU
    ):
        return
    plugin = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* variables, as Accelerator reads them
    if plugin.fsdp_version != 2 or fsdp_offloads(plugin):
        raise LaunchError(
            "FSDP on CPU processes runs FSDP2 without parameter offload: set fsdp_version: 2 and "
            "fsdp_offload_params: false in the accelerate config"
        )
    if mixed_precision != "no":
        plugin.set_mixed_precision(mixed_precision)
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
    # Every later AcceleratorState() copies PartialState's type over its own, as accelerate's GPU path expects.
    PartialState().distributed_type = DistributedType.FSDP


@dataclass
class Strategy:
    name: str  # single, ddp, fsdp, zero1, zero2, zero3
    zero_stage: int | None
    offload: str  # none, optimizer, optimizer+params, params
    distributed_type: str

    @property
    def shards_weights(self) -> bool:
        """Whether a rank holds only its shard of the weights (ZeRO-3, FSDP): hooks on a parameter see the shard."""
        return self.name in ("zero3", "fsdp")

    def as_dict(self) -> dict[str, object]:
        """Under metrics.json's names for these fields (the tracker's run config)."""
        return {
            "strategy": self.name,
            "zero_stage": self.zero_stage,
            "offload": self.offload,
            "distributed_type": self.distributed_type,
        }


def checkpoint_layout(strategy: Strategy, accelerator) -> str:
    """What save_state writes under this strategy, in words: DeepSpeed's files per ZeRO stage, FSDP's per state-dict
    type (sharded DCP files, or one full file), else accelerate's model.safetensors and optimizer.bin."""
    if strategy.zero_stage is not None:
        return f"DeepSpeed ZeRO-{strategy.zero_stage} files"
    if strategy.name == "fsdp":
        kind = accelerator.state.fsdp_plugin.state_dict_type
        return f"FSDP {str(getattr(kind, 'name', kind)).lower()} files"
    return "model.safetensors and optimizer.bin"


def _offload_device(section: dict | None) -> bool:
    if not section:
        return False
    return str(section.get("device", "none")).lower() not in ("none", "")


def fsdp_offloads(plugin) -> bool:
    """Whether an FSDP plugin offloads parameters to the host: FSDP2's policy is a CPUOffloadPolicy (no offload is
    its base class OffloadPolicy, an object that is always true), FSDP1's a CPUOffload(offload_params=...)."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    cpu = getattr(plugin, "cpu_offload", None)
    return isinstance(cpu, CPUOffloadPolicy) or bool(getattr(cpu, "offload_params", False))


def detect_strategy(accelerator) -> Strategy:
    """Read the strategy from the live accelerator state, never from a file name."""
    from accelerate.utils import DistributedType

    dtype = accelerator.distributed_type
    if dtype == DistributedType.DEEPSPEED:
        zero = accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {})
        stage = int(zero.get("stage", 0))
        opt, par = _offload_device(zero.get("offload_optimizer")), _offload_device(zero.get("offload_param"))
        offload = {
            (False, False): "none",
            (True, False): "optimizer",
            (True, True): "optimizer+params",
            (False, True): "params",
        }[(opt, par)]
        return Strategy(f"zero{stage}" if stage else "deepspeed", stage, offload, dtype.value)
    if dtype == DistributedType.FSDP:
        offload = "optimizer+params" if fsdp_offloads(accelerator.state.fsdp_plugin) else "none"
        return Strategy("fsdp", None, offload, dtype.value)
    if dtype in (DistributedType.MULTI_GPU, DistributedType.MULTI_CPU, DistributedType.MULTI_XPU):
        return Strategy("ddp", None, "none", dtype.value)
    return Strategy("single", None, "none", dtype.value)


def resolved_config(accelerator) -> dict[str, Any]:
    """The strategy's live settings for the run's tracker config: DeepSpeed's config with every "auto"
    resolved, or the FSDP plugin's settings."""
    if accelerator.state.deepspeed_plugin is not None:
        return {"deepspeed_config": accelerator.state.deepspeed_plugin.deepspeed_config}
    fsdp = getattr(accelerator.state, "fsdp_plugin", None)
    if fsdp is not None:
        return {"fsdp_config": {k: str(v) for k, v in vars(fsdp).items() if not k.startswith("_")}}
    return {}


def prepare_for_evaluation(accelerator, model, loader) -> tuple[Any, Any]:
    """The model (and its loader, if any) prepared for evaluation alone (--do_train false). Under DeepSpeed the
    JSON's optimizer and scheduler sections are dropped first, as Trainer does for inference: the engine would
    otherwise build an optimizer (CPUAdam under offload) that nothing steps. ZeRO-1 and -2 shard only optimizer
    state and gradients, which evaluation has none of, and DeepSpeed refuses them without an optimizer (Trainer
    refuses evaluation-only runs under them): their engine runs at stage 0, on the same whole weights."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is not None:
        config = plugin.deepspeed_config
        for section in ("optimizer", "scheduler"):
            config.pop(section, None)
        zero = config.setdefault("zero_optimization", {})
        if int(zero.get("stage", 0)) < 3:
            zero["stage"] = 0
            zero.pop("offload_optimizer", None)
    if plugin is not None and int(config["zero_optimization"].get("stage", 0)) == 0:
        log.info("evaluation only: DeepSpeed's engine runs at stage 0 (ZeRO-1/2 shard only optimizer state)")
    objects = [model] if loader is None else [model, loader]
    if getattr(accelerator, "is_fsdp2", False):
        # accelerate's FSDP2 prepare takes a model only beside an optimizer; plain SGD holds no state, and nothing
        # steps it.
        import torch

        objects.append(torch.optim.SGD(model.parameters(), lr=0.0))
    prepared = accelerator.prepare(*objects)
    # One object comes back bare; several as a tuple, or a list under FSDP2.
    prepared = tuple(prepared) if isinstance(prepared, tuple | list) else (prepared,)
    return prepared[0], (prepared[1] if loader is not None else None)
