"""Will it fit? Memory per GPU and communication per step of every strategy, before the cluster is yours.

    qa-train plan --model_name_or_path bert-large-uncased --num_gpus 8 --gpu_memory_gib 40 \\
        --per_device_train_batch_size 32 --max_seq_length 384
    qa-train plan --config_name path/to/config_dir [...]
    qa-train plan --check runs/bench        # the estimate beside what finished runs measured

Per config (DDP, FSDP, ZeRO-1/2/3, ZeRO-2/3 with CPU offload): model-state bytes per GPU (DeepSpeed's own
estimator formulas where it has them), activations for QA training at batch x sequence from the model's
shape, the total against the GPU, host memory per node where DeepSpeed estimates it, and the bytes each
GPU sends per step. It recommends the first config that fits in a fixed speed order (`SPEED_ORDER`). It
never downloads: bert-base/-large (cased and uncased) are built in; other models need a local config
(--config_name DIR, or a name already in the Hugging Face cache).
"""

from __future__ import annotations

from qa_train.config.settings import ConfigError, ModelArgs
from qa_train.core.errors import one_line
from qa_train.model.modeling import check_checkpointing, qa_model_class, resolve_attention
from qa_train.studies.memory_model import (
    CONFIGS,
    GIB,
    SPEED_ORDER,
    Estimate,
    ModelShape,
    Setup,
    calibration,
    estimate,
    unplanned,
)

# Shapes of the public BERT checkpoints (their config.json), so the planner answers without the hub.
_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}
BUILTIN = {
    "bert-base-uncased": {**_BASE, "vocab_size": 30522},
    "bert-base-cased": {**_BASE, "vocab_size": 28996},
    "bert-large-uncased": {**_LARGE, "vocab_size": 30522},
    "bert-large-cased": {**_LARGE, "vocab_size": 28996},
}
# What is left free of a device's memory: on a GPU for the CUDA context, NCCL's buffers and the caching allocator's
# fragmentation. CPU processes have none of these; the same share is kept there as a margin.
HEADROOM = 0.10


class PlanError(ValueError):
    """Input the planner cannot work with; the message names the flag."""


# --- the model -----------------------------------------------------------------------------------


def load_shape_config(model_name_or_path: str | None, config_name: str | None):
    """The config the planner reads a model's shape from (sizes, not weights): a built-in BERT shape, a local
    folder or the local cache; never the network. Training's own, checked for a QA head, is
    modeling.load_model_config."""
    from transformers import AutoConfig, BertConfig

    name, flag = (config_name, "--config_name") if config_name else (model_name_or_path, "--model_name_or_path")
    if name in BUILTIN:
        return BertConfig(**BUILTIN[name])
    try:
        return AutoConfig.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as err:
        raise PlanError(
            f"{flag} {name}: no config for it on this machine, and the planner never downloads; pass a "
            f"folder with config.json, or one of {', '.join(BUILTIN)} ({one_line(err, limit=200)})"
        ) from None


def model_shape(config) -> ModelShape:
    """Sizes from the config; parameter counts from the QA model itself, built on the meta device (no memory),
    counted as DeepSpeed's model_to_params counts them (shared tensors once; the largest module's own)."""
    import torch
    from transformers import AutoModelForQuestionAnswering

    try:
        qa_model_class(config)
    except ConfigError as err:  # transformers' own ValueError would be a traceback listing 80 config classes
        raise PlanError(str(err)) from None
    with torch.device("meta"):
        model = AutoModelForQuestionAnswering.from_config(config)
    total = sum({id(p): p.numel() for p in model.parameters()}.values())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    hidden = config.hidden_size
    return ModelShape(
        layers=config.num_hidden_layers,
        hidden=hidden,
        heads=config.num_attention_heads,
        intermediate=getattr(config, "intermediate_size", None) or getattr(config, "hidden_dim", 4 * hidden),
        num_parameters=total,
        largest_layer_params=largest,
        matmul_params=matmul,
        hidden_dropout=float(getattr(config, "hidden_dropout_prob", getattr(config, "dropout", 0.0)) or 0.0),
        attention_dropout=float(
            getattr(config, "attention_probs_dropout_prob", getattr(config, "attention_dropout", 0.0)) or 0.0
        ),
    )


def check_recompute(config, enabled: bool) -> None:
    """--gradient_checkpointing for a model training would refuse it for (ALBERT, MPNet, ...)."""
    try:
        check_checkpointing(config, enabled)
    except ConfigError as err:
        raise PlanError(str(err)) from None


def attention_of(config, requested: str | None) -> str:
    """The attention kernel training uses for --attn_implementation `requested` (auto, training's default: SDPA
    where the model supports it, else eager; DeBERTa's eager attention keeps its s x s probabilities)."""
    try:
        return resolve_attention(ModelArgs(attn_implementation=requested or "auto"), config)
    except ConfigError as err:
        raise PlanError(str(err)) from None


# --- the plan ------------------------------------------------------------------------------------


def plan(shape: ModelShape, setup: Setup, gpu_memory_gib: float) -> tuple[list[Estimate], Estimate | None]:
    """Every config's estimate, and the first in SPEED_ORDER whose total fits (None if none does)."""
    # On one device only offload saves anything: partitioning over one rank keeps everything.
    configs = ["single", "zero2_offload", "zero3_offload"] if setup.num_gpus == 1 else list(CONFIGS)
    estimates = [estimate(c, shape, setup) for c in configs if not unplanned(c, setup)]
    usable = gpu_memory_gib * (1 - HEADROOM) * GIB
    fitting = [e for e in estimates if e.total <= usable]
    order = ["single", *SPEED_ORDER]
    return estimates, min(fitting, key=lambda e: order.index(e.config)) if fitting else None


def _gib(value: float | None) -> str:
    return "—" if value is None else f"{value / GIB:,.2f}"


def render(estimates: list[Estimate], best: Estimate | None, setup: Setup, gpu_memory_gib: float) -> str:
    usable = gpu_memory_gib * (1 - HEADROOM)
    lines = [
        "| config | model states GiB | formula | activations GiB | total GiB | fits | host GiB/node | "
        "sent per step GB | communication |",
        "|" + "---|" * 9,
    ]
    for e in estimates:
        fits = "yes" if e.total <= usable * GIB else "no"
        lines.append(
            f"| {e.config} | {_gib(e.model_states)} | {e.model_states_formula} | {_gib(e.activations)} | "
            f"{_gib(e.total)} | {fits} | {_gib(e.host_per_node)} | {e.comm_bytes / 1e9:,.2f} | "
            f"{e.comm_formula} |"
        )
    order = " > ".join(e.config for e in estimates)
    kept = "for the CUDA context, NCCL and fragmentation" if setup.device == "cuda" else "free as a margin"
    verdict = (
        f"recommended: {best.config} (the first that fits in {usable:g} of {gpu_memory_gib:g} GiB, "
        f"{HEADROOM:.0%} kept {kept}, in the order {order})"
        if best
        else f"nothing fits in {usable:g} GiB per device: lower the batch, or add devices"
    )
    return "\n".join(lines) + "\n\n" + verdict


def describe(name: str, shape: ModelShape, setup: Setup) -> str:
    cal = calibration(setup)
    precision = {"no": "fp32"}.get(setup.mixed_precision, setup.mixed_precision)
    recompute = (
        ", gradient checkpointing (layer inputs kept, one layer recomputed)" if setup.gradient_checkpointing else ""
    )
    return (
        f"{name}: {shape.num_parameters / 1e6:,.1f}M parameters (P), largest layer {shape.largest_layer_params / 1e6:,.1f}M "
        f"(L); {setup.num_gpus} {'GPU(s)' if setup.device == 'cuda' else 'CPU process(es)'} on {setup.num_nodes} "
        f"node(s), batch {setup.batch} x {setup.seq} tokens per device, {precision}, {setup.attention} attention"
        f"{recompute}.\n"
        f"Activations: tensors autograd keeps x {cal.activation_scale:g} + {cal.overhead_bytes / GIB:.3f} GiB "
        f"({cal.source}). Communication: bytes each device sends per step, ring collectives, N = {setup.num_gpus}."
    )
