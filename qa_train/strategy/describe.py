"""`qa-train describe CHECKPOINT`: what a checkpoint holds and what can continue it, from its metadata alone.

    qa-train describe runs/bert-base                      (its latest usable checkpoint)
    qa-train describe runs/bert-base/checkpoints/step_00000800 --json

It reads trainer_state.json, the manifest and each library's own index of its files (safetensors' header,
torch.distributed.checkpoint's .metadata, DeepSpeed's model-states file, memory-mapped), never the weights; the
manifest's CRC32 check streams every file once. What can continue it follows the resume rules
(qa_train.strategy.train_state, docs/faults.md#resuming): any of the eight configs at any world size that keeps the
global batch, by the library itself or through the portable conversion.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from qa_train.config.outputdir import STEP_FOLDER
from qa_train.config.parser import OneLineParser
from qa_train.core.errors import refusal_text
from qa_train.strategy import checkpoint, portable
from qa_train.strategy.train_state import TrainerState, kept_accumulation, processes

ACCELERATE_LAYOUT = "model.safetensors and optimizer.bin"
# The eight accelerate configs and what their save_state writes (build.checkpoint_layout's words).
CONFIG_LAYOUTS = {
    "single": ACCELERATE_LAYOUT,
    "ddp": ACCELERATE_LAYOUT,
    "fsdp": "FSDP sharded_state_dict files",
    "zero1": "DeepSpeed ZeRO-1 files",
    "zero2": "DeepSpeed ZeRO-2 files",
    "zero2_offload": "DeepSpeed ZeRO-2 files",
    "zero3": "DeepSpeed ZeRO-3 files",
    "zero3_offload": "DeepSpeed ZeRO-3 files",
}


class DescribeError(ValueError):
    """A path that is not a usable checkpoint, in one line naming it."""


@dataclass
class Weights:
    """The model's tensors as the library's index lists them: no tensor is read."""

    tensors: int
    parameters: int
    dtype: str
    config: str | None = None  # the accelerate config that wrote them, where the files say (DeepSpeed's offload)


@dataclass
class SameBatch:
    """The world sizes that keep the checkpoint's global batch."""

    global_batch: int
    per_device: int
    accumulation_by_world_size: dict[int, int]  # with its per-device batch: processes -> accumulation
    world_sizes_any_split: list[int] | None  # with another split; None where that is refused (mid-epoch, grouped)


@dataclass
class Continuation:
    """One config's way to continue the checkpoint."""

    config: str
    world_sizes: str  # "any" or "1"
    as_saved_at: int | None  # the world size at which the library loads it as saved (bit-exact, RNG included)
    how: str


@dataclass
class Description:
    path: str
    manifest: str
    state: dict
    strategy: str
    weights: Weights
    same_batch: SameBatch | None = None
    continuations: list[Continuation] = field(default_factory=list)
    refused_changes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def locate(arg: Path) -> tuple[Path, list[str]]:
    """The checkpoint `arg` names, its contents verified: a step folder, or an output dir (its newest usable
    checkpoint, as --resume_from_checkpoint latest picks it); and the newer ones skipped, with why."""
    if (arg / checkpoint.STATE_FILE).exists() or STEP_FOLDER.match(arg.name):
        problem = checkpoint.verify(arg, contents=True)
        if problem:
            raise DescribeError(f"{arg}: {problem}")
        return arg, []
    chosen, passed_over = checkpoint.newest_usable(checkpoint.checkpoint_root(arg), contents=True)
    skipped = [f"{path.name}: {problem}" for path, problem in passed_over]
    if chosen is not None:
        return chosen, skipped
    what = "no usable checkpoint" if skipped else "neither a checkpoint (no trainer_state.json) nor a run with one"
    raise DescribeError(f"{arg}: {what}" + (f" ({'; '.join(skipped)})" if skipped else ""))


def weights_of(path: Path) -> Weights:
    """Tensor count, parameter count and dtype from the library's index of its files."""
    if (path / portable.ACCELERATE_WEIGHTS[0]).is_file():
        from safetensors import safe_open

        with safe_open(path / portable.ACCELERATE_WEIGHTS[0], "pt") as f:
            shapes = {k: (f.get_slice(k).get_shape(), f.get_slice(k).get_dtype()) for k in f.keys()}  # noqa: SIM118
        return _counted({k: s for k, (s, _) in shapes.items()}, _safetensors_dtype({d for _, d in shapes.values()}))
    if (path / portable.ACCELERATE_WEIGHTS[1]).is_file():
        saved = _torch_file(path / portable.ACCELERATE_WEIGHTS[1])
        return _counted({k: t.shape for k, t in saved.items()}, _dtypes({t.dtype for t in saved.values()}))
    if (path / portable.DCP_WEIGHTS).is_dir():
        return _dcp_weights(path / portable.DCP_WEIGHTS)
    if (path / "latest").is_file():
        return _deepspeed_weights(path)
    raise DescribeError(f"{path}: neither accelerate's, FSDP's nor DeepSpeed's checkpoint files")


def _torch_file(file: Path) -> dict:
    """A pickled state dict, memory-mapped; a file whose pickle would build anything but tensors and plain
    containers is refused in one line."""
    from qa_train.strategy import zero_files

    try:
        return zero_files.load(file, "a checkpoint's tensors", deepspeed=False)
    except zero_files.ZeroFilesError as err:
        raise DescribeError(str(err)) from err


def _counted(shapes: Mapping[str, Sequence[int]], dtype: str, config: str | None = None) -> Weights:
    return Weights(len(shapes), sum(math.prod(s) for s in shapes.values()), dtype, config)


def _dtypes(found: set) -> str:
    return ", ".join(sorted(str(d).removeprefix("torch.") for d in found))


def _safetensors_dtype(found: set[str]) -> str:
    names = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}
    return ", ".join(sorted(names.get(d, d) for d in found))


def _dcp_weights(folder: Path) -> Weights:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    stored = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    tensors = {k: m for k, m in stored.items() if k.startswith("model.") and isinstance(m, TensorStorageMetadata)}
    return _counted({k: m.size for k, m in tensors.items()}, _dtypes({m.properties.dtype for m in tensors.values()}))


def _deepspeed_weights(path: Path) -> Weights:
    """DeepSpeed's model-states file lists every parameter's full shape and the engine's config (its precision and
    offload); memory-mapped, so its 16-bit module copy (ZeRO-1/2) is not read."""
    from qa_train.strategy import zero_files

    tag = (path / "latest").read_text().strip()
    files = sorted((path / tag).glob("*model_states.pt"))
    if not files:
        raise DescribeError(f"{path / tag}: no DeepSpeed model-states file")
    try:
        states = zero_files.load(files[0])  # the DeepSpeed classes its pickle may hold, and nothing else
    except zero_files.ZeroFilesError as err:
        raise DescribeError(str(err)) from err
    shapes = {name: shape for group in states["param_shapes"] for name, shape in group.items()}
    ds = states.get("ds_config", {})
    zero = ds.get("zero_optimization", {})
    half = next((kind for kind in ("bf16", "fp16") if ds.get(kind, {}).get("enabled")), None)
    dtype = f"float32 master weights, {half} compute" if half else "float32"
    return _counted(shapes, dtype, _deepspeed_config(zero))


def _deepspeed_config(zero: dict) -> str:
    stage = int(zero.get("stage", 0))
    offloaded = any(
        str((zero.get(k) or {}).get("device", "none")) != "none" for k in ("offload_optimizer", "offload_param")
    )
    return f"zero{stage}_offload" if offloaded else f"zero{stage}"


def strategy_of(state: TrainerState, weights: Weights) -> str:
    """The config that wrote the checkpoint, as far as its files say (DDP and single share their files)."""
    if weights.config is not None:
        return weights.config
    layout = state.checkpoint_layout or ""
    if layout.startswith("FSDP"):
        return "fsdp"
    return "single" if state.world_size == 1 else "ddp"


# --- what can continue it ----------------------------------------------------------------------


def same_batch(state: TrainerState) -> SameBatch | None:
    """The world sizes that keep the checkpoint's global batch (resume.refit_accumulation's rule): with its
    per-device batch, those whose accumulation is whole; with another split, every divisor of the global batch."""
    batch, per_device = state.global_batch_size, state.per_device_train_batch_size
    if batch is None or per_device is None:
        return None
    kept = {n: a for n in range(1, batch + 1) if (a := kept_accumulation(state, per_device, n)) is not None}
    divisors = [n for n in range(1, batch + 1) if batch % n == 0]
    # Mid-epoch, the length-grouped order is made of runs of per-device batches: another size is refused.
    split_free = not (state.batches_in_epoch and state.group_by_length)
    return SameBatch(batch, per_device, kept, divisors if split_free else None)


def continuations(state: TrainerState) -> list[Continuation]:
    """Each config's way to continue it (checkpoint.conversion_reason decides, as on resume): at its own world size
    and at another, since DeepSpeed's partitions are converted there."""
    saved_at = state.world_size or 1
    rows = []
    for config, layout in CONFIG_LAYOUTS.items():
        here = checkpoint.conversion_reason(state, TrainerState(world_size=saved_at, checkpoint_layout=layout))
        elsewhere = checkpoint.conversion_reason(state, TrainerState(world_size=saved_at + 1, checkpoint_layout=layout))
        if here is not None:
            how = "converted (portable layout)"
        elif elsewhere is not None and config != "single":
            how = f"loads as saved at {processes(saved_at)}, converted at others (DeepSpeed's partitions)"
        else:
            how = "loads as saved (resharded by torch)" if config == "fsdp" else "loads as saved"
        single = config == "single"
        same_world = here is None and (saved_at == 1 or not single)
        rows.append(Continuation(config, "1" if single else "any", saved_at if same_world else None, how))
    return rows


def refused_changes(state: TrainerState) -> list[str]:
    """What a continuation must keep (train_state.resume_conflicts refuses the rest)."""
    kept = [f"the model shape ({state.model_shape})" if state.model_shape else "the model shape"]
    if state.batches_in_epoch:
        kept.append(
            f"mid-epoch ({state.batches_in_epoch} micro-batches into epoch {state.epoch}): --seed {state.seed}, "
            f"--group_by_length {str(state.group_by_length).lower()} and the training windows "
            f"({state.num_train_windows}, fingerprint {state.train_data})"
        )
    kept.append(
        f"the global batch {state.global_batch_size}, unless --allow_global_batch_change (the steps done and the LR "
        "schedule are then recounted from the windows trained)"
    )
    return kept


def describe(arg: Path) -> Description:
    path, skipped = locate(arg)
    state = checkpoint.read_state(path)
    weights = weights_of(path)
    files = len(json.loads((path / checkpoint.MANIFEST).read_text())["files"])
    return Description(
        path=str(path),
        manifest=f"verified: {files} files, sizes and CRC32s as written",
        state=asdict(state),
        strategy=strategy_of(state, weights),
        weights=weights,
        same_batch=same_batch(state),
        continuations=continuations(state),
        refused_changes=refused_changes(state),
        skipped=skipped,
    )


# --- for people ------------------------------------------------------------------------------------


def render(d: Description) -> str:
    s = TrainerState(**d.state)
    w = d.weights
    lines = [
        f"checkpoint   {d.path}",
        *(f"  skipped    {skip}" for skip in d.skipped),
        f"manifest     {d.manifest}",
        f"written by   qa-train {s.qa_train_version or '(version not recorded)'}, checkpoint format "
        f"{s.checkpoint_format or 1}, run {s.run_id[:8]}",
        f"position     step {s.completed_steps}"
        + (f" of {s.total_steps}" if s.total_steps else "")
        + f", epoch {s.epoch}"
        + (f", {s.windows_into_epoch} training windows into it" if s.windows_into_epoch is not None else "")
        + (f" (of {s.num_train_windows})" if s.num_train_windows else ""),
        f"layout       {s.checkpoint_layout or '(not recorded)'}: {d.strategy} on "
        + (processes(s.world_size) if s.world_size else "a number of processes not recorded"),
        f"batch        global {s.global_batch_size} = per-device {s.per_device_train_batch_size} x accumulation "
        f"{s.gradient_accumulation_steps} x {processes(s.world_size)}"
        if s.global_batch_size
        else "batch        not recorded (a checkpoint of format 1)",
        f"model        {s.model_shape or '(shape not recorded)'}",
        f"weights      {w.parameters:,} parameters in {w.tensors} tensors, {w.dtype}",
        "data         " + (", ".join(_data_order(s)) or "(not recorded)"),
    ]
    if s.best_eval:
        lines.append(
            f"best eval    step {s.best_eval['step']}: EM {s.best_eval['exact_match']:.2f}, F1 {s.best_eval['f1']:.2f}"
        )
    return "\n".join([*lines, "", *_continuation_lines(d)])


def _data_order(s: TrainerState) -> list[str]:
    recorded = {
        "fingerprint": s.train_data,
        "training windows": s.num_train_windows,
        "--seed": s.seed,
        "--group_by_length": None if s.group_by_length is None else str(s.group_by_length).lower(),
    }
    return [f"{name} {value}" for name, value in recorded.items() if value is not None]


def _continuation_lines(d: Description) -> list[str]:
    lines = ["continues exactly (losses to fp32 rounding) with the same global batch:"]
    batch = d.same_batch
    if batch:
        kept = ", ".join(f"{processes(n)} x accumulation {a}" for n, a in batch.accumulation_by_world_size.items())
        lines.append(f"  per-device {batch.per_device}: {kept}")
        anywhere = batch.world_sizes_any_split
        lines.append(
            f"  another split: {', '.join(map(str, anywhere))} processes, per-device x accumulation = "
            f"{batch.global_batch} / processes"
            if anywhere
            else "  another per-device batch: refused mid-epoch under --group_by_length"
        )
    width = max(len(c.config) for c in d.continuations)
    lines.append("  under any of the eight configs:")
    for c in d.continuations:
        where = "1 process" if c.world_sizes == "1" else "any world size"
        exact = f"; RNG state carried too at {processes(c.as_saved_at)}" if c.as_saved_at else ""
        lines.append(f"    {c.config:<{width}}  {where}: {c.how}{exact}")
    lines.append("must keep:")
    lines += [f"  {kept}" for kept in d.refused_changes]
    return lines


def quiet_libraries() -> None:
    """For a command on one CPU process: DeepSpeed's checkpoint code needs no accelerator (told, it does not warn
    it found none)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(
        prog="qa-train describe", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("checkpoint", type=Path, help="a checkpoint (OUTPUT_DIR/checkpoints/step_N) or an output dir")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    args = p.parse_args(argv)
    quiet_libraries()
    try:
        described = describe(args.checkpoint)
    except (checkpoint.CheckpointError, DescribeError, OSError) as err:
        print(f"qa-train describe: error: {refusal_text(err)}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(described), indent=1) if args.json else render(described))
    return 0
