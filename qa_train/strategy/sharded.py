"""Operations on parameters that a strategy may shard: FSDP wrapping, full fp32 weights for the export, norms and counts."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

log = logging.getLogger("qa_train")


def fsdp_layer_classes(model) -> list[str]:
    """The module classes FSDP shards one by one: the model's `_no_split_modules` that occur in it (what
    accelerate takes when the config names none), else the class of the repeated blocks in its longest
    ModuleList, for families that declare none (DistilBERT, ELECTRA, DeBERTa-v2 in transformers 5)."""
    import torch

    # accelerate's FSDP2 preparation shards the input embedding module itself after the auto-wrap; a declared
    # class that holds it (BertEmbeddings in transformers 5.17) would shard it twice, which fully_shard rejects.
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    holds_embeddings = {
        type(m).__name__
        for m in model.modules()
        if embeddings is not None and any(c is embeddings for c in m.modules()) and m is not model
    }
    present = {type(m).__name__ for m in model.modules()}
    declared = [
        name
        for name in (getattr(model, "_no_split_modules", None) or [])
        if name in present and name not in holds_embeddings
    ]
    if declared:
        return sorted(declared)
    stacks = [
        m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and len(m) and len({type(c) for c in m}) == 1
    ]
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
    log.info(
        "FSDP wraps %s (set fsdp_transformer_layer_cls_to_wrap in the accelerate config to choose)",
        ", ".join(plugin.transformer_cls_names_to_wrap) or "the whole model only",
    )


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


def held_part(tensor: torch.Tensor) -> torch.Tensor:
    """The part of a parameter this rank holds: FSDP2's local shard of a DTensor, ZeRO-3's partition (the
    parameter itself is an empty placeholder outside a gather), or the whole tensor."""
    if hasattr(tensor, "to_local"):
        return tensor.to_local()
    partition = getattr(tensor, "ds_tensor", None)
    return tensor if partition is None else partition


def nonfinite_tensors(params: Iterable[torch.Tensor], device: torch.device) -> torch.Tensor:
    """How many of the tensors this rank holds have a NaN or Inf, as a tensor on `device` (no host sync)."""
    import torch

    bad = torch.zeros((), device=device)
    with torch.no_grad():
        for p in params:
            local = held_part(p)
            if local.numel():
                bad += (~torch.isfinite(local)).any().to(bad.dtype)
    return bad


def first_nonfinite(model) -> str | None:
    """The name of the first weight holding nan or inf, the same on every rank: one all-gather where the model is
    partitioned (ZeRO-3 builds it so at load, every rank together), none elsewhere."""
    import torch

    tensors = [*model.named_parameters(), *model.named_buffers()]
    found = next(
        (name for name, t in tensors if t.is_floating_point() and not bool(torch.isfinite(held_part(t)).all())),
        None,
    )
    partitioned = any(hasattr(t, "ds_tensor") for _, t in tensors)
    if not partitioned or not torch.distributed.is_initialized():
        return found
    names: list[str | None] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(names, found)
    order = {name: i for i, (name, _) in enumerate(tensors)}
    return min((name for name in names if name is not None), key=order.__getitem__, default=None)


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


def full_shapes(model) -> dict[str, tuple[int, ...]]:
    """Every parameter's whole shape, by name in the model's order: ZeRO-3 (which transformers builds partitioned
    before `prepare`) leaves empty placeholders whose ds_shape is the real one."""
    return {name: tuple(getattr(p, "ds_shape", p.shape)) for name, p in model.named_parameters()}


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
