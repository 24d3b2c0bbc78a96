"""The one place that knows about strategies: the accelerator, launch sanity, what is running,
DeepSpeed's JSON, its optimizer placeholders, and what a strategy does to parameters.

The train loop never branches on the strategy; what the libraries force is handled here.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from qa_train.config import ConfigError, TrainArgs
from qa_train.oom import is_out_of_memory

if TYPE_CHECKING:
    import torch

log = logging.getLogger("qa_train")


class LaunchError(RuntimeError):
    """The processes that started do not form the world the launcher meant."""


def resolve_mixed_precision(flag: str, env: dict[str, str], on_cuda: bool, bf16_capable: bool) -> str:
    """auto: the accelerate config's choice (ACCELERATE_MIXED_PRECISION) if it set one, else bf16 where capable.
    fp16 without CUDA is refused: accelerate (1.15) then applies neither autocast nor a loss scaler, so a single
    or DDP run trains in fp32 under the fp16 label, FSDP2 computes in fp16 unscaled, and DeepSpeed fails."""
    chosen = flag if flag != "auto" else env.get("ACCELERATE_MIXED_PRECISION", "no")
    if chosen == "fp16" and not on_cuda:
        said = "--mixed_precision fp16" if flag == "fp16" else "the accelerate config's mixed_precision: fp16"
        raise ConfigError(f"{said}: fp16 needs a CUDA GPU (on CPU accelerate applies neither autocast nor a "
                          "loss scaler); use --mixed_precision bf16 or no")
    if chosen in ("fp16", "bf16") or flag != "auto":
        return chosen
    return "bf16" if bf16_capable else "no"


def launch_precision(flag: str) -> str:
    """--mixed_precision as this launch resolves it (alike on every rank), before any data is read."""
    import torch

    on_cuda = torch.cuda.is_available()
    return resolve_mixed_precision(flag, dict(os.environ), on_cuda, on_cuda and torch.cuda.is_bf16_supported())


def make_accelerator(args: TrainArgs, log_with: list[Any], mixed_precision: str) -> Any:
    """The Accelerator for this launch (with its unstarted trackers), in `launch_precision`'s mixed precision."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    on_cuda = torch.cuda.is_available()
    # Without gloo named, DeepSpeed on CPU initialises its own group while accelerate sees a world of 1.
    backend = None if on_cuda or int(os.environ.get("WORLD_SIZE", "1")) == 1 else "gloo"
    handlers = [process_group_kwargs(backend, args.system.ddp_timeout)]
    accelerator = Accelerator(
        gradient_accumulation_steps=args.optim.gradient_accumulation_steps,
        mixed_precision=mixed_precision,
        kwargs_handlers=handlers,
        log_with=log_with or None,
        # Seeded per-epoch shuffling: a resumed run sees the batches the interrupted one would have.
        # non_blocking: accelerate's default copy of each (pinned) batch waits for the GPU to finish the queued
        # step, so the host could not prepare the next one meanwhile.
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, non_blocking=on_cuda),
    )
    _shard_on_cpu(accelerator, mixed_precision)
    if accelerator.device.type == "cpu":
        # accelerate's unwrap_model imports DeepSpeed in every run where it is installed, and DeepSpeed's own
        # device detection then warns on CPU that it "was unable to detect" a GPU: told, it says nothing. (A
        # DeepSpeed strategy imports it inside Accelerator(), too early for this: qa_train.launch --cpu sets it.)
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return accelerator


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

    if (os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true"
            or accelerator.distributed_type != DistributedType.MULTI_CPU):
        return
    plugin = FullyShardedDataParallelPlugin()  # from the launcher's FSDP_* variables, as Accelerator reads them
    if plugin.fsdp_version != 2 or fsdp_offloads(plugin):
        raise LaunchError("FSDP on CPU processes runs FSDP2 without parameter offload: set fsdp_version: 2 and "
                          "fsdp_offload_params: false in the accelerate config")
    if mixed_precision != "no":
        plugin.set_mixed_precision(mixed_precision)
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin
    # Every later AcceleratorState() copies PartialState's type over its own, as accelerate's GPU path expects.
    PartialState().distributed_type = DistributedType.FSDP


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
            "ACCELERATE_USE_CPU=true for DDP, gloo for DeepSpeed and FSDP)."
        )


def check_recompute(accelerator, gradient_checkpointing: bool) -> None:
    """FSDP's own activation checkpointing (an accelerate config's `fsdp_activation_checkpointing: true`) with
    --gradient_checkpointing would wrap every layer twice and recompute it twice; Trainer refuses the pair too."""
    plugin = getattr(accelerator.state, "fsdp_plugin", None)  # unset outside FSDP
    if gradient_checkpointing and getattr(plugin, "activation_checkpointing", False):
        raise LaunchError("--gradient_checkpointing: the accelerate config already sets fsdp_activation_checkpointing: "
                          "true, which recomputes the layers itself; keep one of the two")


@dataclass
class Strategy:
    name: str          # single, ddp, fsdp, zero1, zero2, zero3
    zero_stage: int | None
    offload: str       # none, optimizer, optimizer+params, params
    distributed_type: str

    def as_dict(self) -> dict[str, object]:
        """Under metrics.json's names for these fields (the tracker's run config)."""
        return {"strategy": self.name, "zero_stage": self.zero_stage, "offload": self.offload,
                "distributed_type": self.distributed_type}


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
    return bool(section) and str(section.get("device", "none")).lower() not in ("none", "")


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
        offload = {(False, False): "none", (True, False): "optimizer", (True, True): "optimizer+params",
                   (False, True): "params"}[(opt, par)]
        return Strategy(f"zero{stage}" if stage else "deepspeed", stage, offload, dtype.value)
    if dtype == DistributedType.FSDP:
        offload = "optimizer+params" if fsdp_offloads(accelerator.state.fsdp_plugin) else "none"
        return Strategy("fsdp", None, offload, dtype.value)
    if dtype in (DistributedType.MULTI_GPU, DistributedType.MULTI_CPU, DistributedType.MULTI_XPU):
        return Strategy("ddp", None, "none", dtype.value)
    return Strategy("single", None, "none", dtype.value)


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
            raise ConfigError(f"{source}: '{key}' is {current} but --{flag} is {value}; "
                              f'set "{key}": "auto" in the JSON so the flag decides')
    if "train_batch_size" in cfg and not _is_auto(cfg["train_batch_size"]):
        expected = micro * optim.gradient_accumulation_steps * world_size
        if int(cfg["train_batch_size"]) != expected:
            raise ConfigError(f"{source}: 'train_batch_size' is {cfg['train_batch_size']} but the flags give "
                              f"{expected}; use \"auto\"")
    for dtype in ("fp16", "bf16"):
        enabled = cfg.get(dtype, {}).get("enabled", "auto")
        if not _is_auto(enabled) and str(enabled).lower() == "true" and mixed_precision != dtype:
            raise ConfigError(f"{source}: {dtype} is enabled but --mixed_precision resolved to {mixed_precision}; "
                              f'set "{dtype}": {{"enabled": "auto"}} so the flag decides')
    _fill_optimizer(cfg, args)


def _fill_optimizer(cfg: dict, args: TrainArgs) -> None:
    """DeepSpeed's own optimizer (CPUAdam under offload) takes its hyper-parameters from the flags."""
    params = cfg.get("optimizer", {}).get("params")
    if params is None:
        return
    o = args.optim
    values = {"lr": o.learning_rate, "betas": [o.adam_beta1, o.adam_beta2], "eps": o.adam_epsilon,
              "weight_decay": o.weight_decay}
    for key, value in values.items():
        if _is_auto(params.get(key, "auto")):
            params[key] = value


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


def optimizer_and_scheduler(accelerator, groups: list[dict], args: TrainArgs,
                            torch_optimizer: Callable[[list[dict]], Any],
                            schedule: Callable[[Any], Any]) -> tuple[Any, Any]:
    """Placeholders when the DeepSpeed JSON brings its own optimizer (DeepSpeed builds it), else torch's."""
    if uses_deepspeed_optimizer(accelerator):
        from accelerate.utils import DummyOptim, DummyScheduler

        optimizer = DummyOptim(groups, lr=args.optim.learning_rate, weight_decay=args.optim.weight_decay)
        return optimizer, DummyScheduler(optimizer, lr_scheduler_callable=schedule)
    optimizer = torch_optimizer(groups)
    return optimizer, schedule(optimizer)


def fsdp_layer_classes(model) -> list[str]:
    """The module classes FSDP shards one by one: the model's `_no_split_modules` that occur in it (what
    accelerate takes when the config names none), else the class of the repeated blocks in its longest
    ModuleList, for families that declare none (DistilBERT, ELECTRA, DeBERTa-v2 in transformers 5)."""
    import torch

    # accelerate's FSDP2 preparation shards the input embedding module itself after the auto-wrap; a declared
    # class that holds it (BertEmbeddings in transformers 5.17) would shard it twice, which fully_shard rejects.
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    holds_embeddings = {type(m).__name__ for m in model.modules() if embeddings is not None
                        and any(c is embeddings for c in m.modules()) and m is not model}
    present = {type(m).__name__ for m in model.modules()}
    declared = [name for name in (getattr(model, "_no_split_modules", None) or [])
                if name in present and name not in holds_embeddings]
    if declared:
        return sorted(declared)
    stacks = [m for m in model.modules()
              if isinstance(m, torch.nn.ModuleList) and len(m) and len({type(c) for c in m}) == 1]
    return [type(max(stacks, key=len)[0]).__name__] if stacks else []


def fit_fsdp_wrap(accelerator, model) -> None:
    """Under FSDP's TRANSFORMER_BASED_WRAP with no fsdp_transformer_layer_cls_to_wrap in the config, wrap
    `fsdp_layer_classes(model)`: a class named in the YAML (BertLayer) fails on every other family with
    accelerate's "Could not find the transformer layer class", and `_no_split_modules` alone is empty for
    some families, which would leave the whole model one FSDP unit. A class list in the YAML still wins."""
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    plugin = getattr(accelerator.state, "fsdp_plugin", None)  # unset outside FSDP
    if plugin is None or plugin.transformer_cls_names_to_wrap is not None:
        return
    if getattr(plugin.auto_wrap_policy, "func", plugin.auto_wrap_policy) is not transformer_auto_wrap_policy:
        return
    plugin.transformer_cls_names_to_wrap = fsdp_layer_classes(model)
    log.info("FSDP wraps %s (set fsdp_transformer_layer_cls_to_wrap in the accelerate config to choose)",
             ", ".join(plugin.transformer_cls_names_to_wrap) or "the whole model only")


@contextlib.contextmanager
def built_whole(accelerator) -> Iterator[None]:
    """Models built inside are whole on this rank. Under ZeRO-3 accelerate (1.15) registers its config with
    transformers whatever zero3_init_flag says, and transformers then builds every model partitioned
    (deepspeed.zero.Init) for an engine: a model that never gets one would run on empty weights."""
    from transformers.integrations import set_hf_deepspeed_config, unset_hf_deepspeed_config

    registered = getattr(accelerator.state.deepspeed_plugin, "dschf", None)
    if registered is None or not registered.is_zero3():
        yield
        return
    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        set_hf_deepspeed_config(registered)


def nonfinite_tensors(params: Iterable[torch.Tensor], device: torch.device) -> torch.Tensor:
    """How many of the tensors this rank holds have a NaN or Inf, as a tensor on `device` (no host sync)."""
    import torch

    bad = torch.zeros((), device=device)
    with torch.no_grad():
        for p in params:
            local = p.to_local() if hasattr(p, "to_local") else p  # FSDP2: this rank's shard of a DTensor
            if local.numel():  # ZeRO-3 leaves empty placeholders outside its gather
                bad += (~torch.isfinite(local)).any().to(bad.dtype)
    return bad


def export_state_dict(accelerator, model) -> dict[str, Any] | None:
    """The weights to export, whole on the main process (a collective; other ranks may get None or {}).
    accelerate's get_state_dict gathers FSDP shards and ZeRO-3 partitions, but under DeepSpeed with bf16/fp16 it
    returns the engine's 16-bit copy (under ZeRO-3 gathered whole for nothing), while DDP and FSDP export their fp32
    weights: there the fp32 master weights DeepSpeed's optimizer holds are gathered instead, as zero_to_fp32 would,
    so every strategy exports what it trained."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type != DistributedType.DEEPSPEED or accelerator.mixed_precision == "no":
        return accelerator.get_state_dict(model)
    import torch

    main = accelerator.is_main_process
    state: dict[str, Any] = {}
    copies: dict[int, torch.Tensor | None] = {}  # main's CPU copy per parameter: a tied one is gathered once
    # keep_vars: parameters stay Parameters (ZeRO-3's are empty placeholders), buffers are whole on every rank.
    for name, tensor in model.module.state_dict(keep_vars=True).items():
        if isinstance(tensor, torch.nn.Parameter):
            if id(tensor) not in copies:
                copies[id(tensor)] = _full_fp32_on_main(tensor, main)
            value = copies[id(tensor)]
        elif main:  # the engine cast floating buffers to 16 bits with the module: exported as fp32 like the rest
            value = tensor.detach().to("cpu", copy=True)
            value = value.float() if value.is_floating_point() else value
        else:
            value = None
        if value is not None:
            state[name] = value
    return state if main else {}


def _full_fp32_on_main(param, main: bool):
    """One parameter whole in fp32, as a CPU copy on the main process (None elsewhere): a collective. The full
    tensor each rank gets is dropped at once, so no rank ever holds more than one parameter whole."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    full = safe_get_full_fp32_param(param)  # ZeRO-3 all-gathers it, ZeRO-1/2 all-reduce
    if full is not None:
        return full.detach().to("cpu", copy=True) if main else None
    # No master copy: a frozen parameter (requires_grad is alike on every rank, so all come here together). Its
    # 16-bit value is what it holds; GatheredParameters makes a ZeRO-3 partition whole and is a no-op otherwise.
    with deepspeed.zero.GatheredParameters([param]):
        return param.detach().to("cpu", copy=True).float() if main else None


def num_parameters(model) -> int:
    """Parameters of an unwrapped model; ZeRO-3 leaves empty placeholders whose ds_numel is the real size."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())


def global_grad_norm(accelerator, model, clip_result: Any) -> Any:
    """This update's gradient norm before clipping. DeepSpeed clips inside its own step (accelerate's
    clip_grad_norm_ returns None there) and keeps the norm it computed on the engine."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        norm = model.get_global_grad_norm()
        return None if norm is None or (isinstance(norm, float) and norm < 0) else norm
    if hasattr(clip_result, "full_tensor"):  # FSDP2: a DTensor of per-shard partial norms; every rank calls this
        return clip_result.full_tensor()
    return clip_result


def resolved_config(accelerator) -> dict[str, Any]:
    """The strategy's live settings for the run's tracker config: DeepSpeed's config with every "auto"
    resolved, or the FSDP plugin's settings."""
    if accelerator.state.deepspeed_plugin is not None:
        return {"deepspeed_config": accelerator.state.deepspeed_plugin.deepspeed_config}
    fsdp = getattr(accelerator.state, "fsdp_plugin", None)
    if fsdp is not None:
        return {"fsdp_config": {k: str(v) for k, v in vars(fsdp).items() if not k.startswith("_")}}
    return {}


def failed_ranks(accelerator, failed: bool) -> list[int]:
    """The ranks for which `failed` is true, the same list on every rank (a collective): one sum over a flag per
    rank."""
    import torch

    flags = torch.zeros(accelerator.num_processes, device=accelerator.device)
    flags[accelerator.process_index] = float(failed)
    total = accelerator.reduce(flags, reduction="sum")
    return [rank for rank, flag in enumerate(total.tolist()) if flag > 0]


# torch raises a plain RuntimeError when a gloo collective fails (NCCL's watchdog aborts the process instead, after
# its own message): only the text tells a rank that stopped answering from one that went away.
_TIMED_OUT = ("Timed out waiting", "Application timeout caused pair closure",
              "Watchdog caught collective operation timeout")
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "communicator was aborted")


def collective_fault(err: BaseException) -> str | None:
    """"timeout" for a collective that waited past --ddp_timeout, "peer" for one whose peer went away (that rank's
    own lines say why), None for any other error."""
    text = str(err)
    if any(mark in text for mark in _TIMED_OUT):
        return "timeout"
    if any(mark in text for mark in _PEER_GONE):
        return "peer"
    return None


def run_fault(err: BaseException) -> bool:
    """Out of memory or a failed collective: the run's, not the fault of the file a save, load or export was at
    when it surfaced; __main__ tells it (exit 7 or 6) wherever it came from."""
    return is_out_of_memory(err) or collective_fault(err) is not None


def cpu_threads(processes_per_node: int) -> int:
    """Threads for each of a node's CPU ranks: the cores this process may use, split evenly."""
    return max(1, len(os.sched_getaffinity(0)) // processes_per_node)


def cpu_thread_warning(device_type: str, threads: int, local_processes: int) -> str | None:
    """One line when a CPU rank runs on 1 thread where its share of the cores (what qa_train.launch would give it)
    is more: accelerate launch sets OMP_NUM_THREADS=1 on a machine without a GPU unless given --cpu or
    --num_cpu_threads_per_process."""
    share = cpu_threads(local_processes)
    if device_type != "cpu" or threads != 1 or share < 2:
        return None
    return (f"training on CPU with 1 thread per process where the cores allow {share} (OMP_NUM_THREADS=1, which "
            "accelerate launch sets unless given --cpu or --num_cpu_threads_per_process); "
            f"python -m qa_train.launch --cpu sets it from the cores, or set OMP_NUM_THREADS={share}")
