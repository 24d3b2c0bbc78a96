"""qa_train's portable checkpoint layout, made on demand where the libraries cannot reshard a checkpoint themselves:
another strategy family (DeepSpeed <-> FSDP <-> DDP), or DeepSpeed on another number of processes.

A portable folder holds the full fp32 weights and Adam's two moments keyed by parameter name (three safetensors
files, written one at a time so the conversion holds at most one of them whole), and the optimizer's step
(portable.json, written last). The main process converts the checkpoint (`convert`); then every rank loads the
weights into its model before `prepare` (so each strategy shards them as it does a fresh model's) and the moments
into the prepared optimizer after it. The LR schedule, counters and data position come from trainer_state.json.
"""

from __future__ import annotations

import json
import shutil
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from qa_train.strategy.zero_files import KINDS, DeepSpeedFiles, first_step

META = "portable.json"
FORMAT = 1
ACCELERATE_WEIGHTS = ("model.safetensors", "pytorch_model_fsdp.bin")  # single/DDP, FSDP's full state dict
DCP_WEIGHTS, DCP_OPTIMIZER = "pytorch_model_fsdp_0", "optimizer_0"  # FSDP's sharded state dict


class PortableError(ValueError):
    """A checkpoint that cannot be converted, said in one line naming the file."""


def convert(path: Path, shapes: dict[str, tuple[int, ...]], out: Path) -> float:
    """Write `path`'s weights, moments and step to the portable folder `out` (main process); returns the seconds it
    took. `shapes`: the model's parameters and their shapes, in the optimizer's order (how accelerate's
    optimizer.bin numbers them)."""
    t0 = time.perf_counter()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    try:
        _write(path, shapes, out)
    except BaseException:  # no model-sized half of a conversion left behind
        shutil.rmtree(out, ignore_errors=True)
        raise
    return time.perf_counter() - t0


def _write(path: Path, shapes: dict[str, tuple[int, ...]], out: Path) -> None:
    names = list(shapes)
    reader = _reader(path, names)
    step = reader.step()
    from safetensors.torch import save_file

    for kind in KINDS:
        tensors = {name: _shaped(t, shapes.get(name)).contiguous() for name, t in reader.read(kind).items()}
        if kind != "weights":
            missing = sorted(set(names) - set(tensors))
            if missing:
                raise PortableError(f"{path}: no {kind} for {missing[0]} (and {len(missing) - 1} more parameters)")
        save_file(tensors, out / f"{kind}.safetensors")
        del tensors
    (out / META).write_text(json.dumps({"format": FORMAT, "step": step, "source": str(path)}))


def _shaped(tensor: torch.Tensor, shape: tuple[int, ...] | None) -> torch.Tensor:
    return tensor.reshape(shape) if shape is not None and tensor.shape != shape else tensor


def load_weights(model, folder: Path) -> None:
    """The portable weights into an unprepared model (every rank, before `prepare`). Under ZeRO-3 transformers has
    built the model partitioned already: its parameters are gathered whole for the load, as transformers loads
    pretrained weights there, and the main process's values are partitioned again on the way out."""
    params = list(model.parameters())
    if not any(hasattr(p, "ds_id") for p in params):
        _load_whole(model, _read_all(folder / "weights.safetensors"), folder)
        return
    import deepspeed
    import torch.distributed as dist

    with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
        if dist.get_rank() == 0:
            _load_whole(model, _read_all(folder / "weights.safetensors"), folder)


def _load_whole(model, weights: dict[str, torch.Tensor], folder: Path) -> None:
    missing, unexpected = model.load_state_dict(weights, strict=False)
    params = {name for name, _ in model.named_parameters()}
    lacking = [name for name in missing if name in params]  # buffers the library does not keep are rebuilt
    if lacking or unexpected:
        what = f"lacks {lacking[0]}" if lacking else f"has {unexpected[0]}, which this model does not"
        raise PortableError(f"{folder}: the converted checkpoint {what}")


def load_optimizer(accelerator, model, optimizer, folder: Path) -> None:
    """Adam's moments and step into the prepared optimizer (every rank, after `prepare`)."""
    from accelerate.utils import DistributedType

    step = json.loads((folder / META).read_text())["step"]
    moment = lambda kind, name: _read(folder / f"{kind}.safetensors", name)  # noqa: E731
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        _into_deepspeed(model, step, moment)
    else:
        _into_torch(accelerator.unwrap_model(model), optimizer.optimizer, step, moment)


def _read(file: Path, name: str) -> torch.Tensor:
    """One tensor of a safetensors file, through a mapping of its own: an open mapping keeps every page read
    through it resident, a whole file by the end of a load (above the budget under DeepSpeed, whose Adam state
    is made whole first); closed after each tensor, a rank holds one tensor's pages at a time."""
    from safetensors import safe_open

    with safe_open(file, "pt") as opened:
        return opened.get_tensor(name)


def _read_all(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    with safe_open(file, "pt") as opened:
        names = list(opened.keys())
    return {name: _read(file, name) for name in names}


def _into_torch(module, optimizer, step: int, moment: Callable[[str, str], torch.Tensor]) -> None:
    """A torch optimizer (single, DDP, FSDP2): its state dict rebuilt by parameter name. FSDP2's parameters are
    DTensors: each rank cuts its own shard from the full moment (no collective)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    def placed(full: torch.Tensor, param) -> torch.Tensor:
        if isinstance(param, DTensor):
            return distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        return full.to(param.device)

    names = {id(p): name for name, p in module.named_parameters()}
    order = [p for group in optimizer.param_groups for p in group["params"]]
    state = {
        i: {"step": torch.tensor(float(step))} | {kind: placed(moment(kind, names[id(p)]), p) for kind in KINDS[1:]}
        for i, p in enumerate(order)
    }
    # This run's param groups: its learning rate and settings (reapplied after a resume in any case).
    optimizer.load_state_dict({**optimizer.state_dict(), "state": state})


def _into_deepspeed(engine, step: int, moment: Callable[[str, str], torch.Tensor]) -> None:
    """DeepSpeed's tensor-fragment API (safe_set_full_optimizer_state) writes each full moment into this rank's
    partition under every ZeRO stage and offload, once the state it writes into exists (`_seed_deepspeed`)."""
    from deepspeed.utils import safe_set_full_optimizer_state

    _seed_deepspeed(engine.optimizer, step)
    for name, param in engine.module.named_parameters():
        if param.requires_grad:
            for kind in KINDS[1:]:
                safe_set_full_optimizer_state(param, moment(kind, name), kind)


def _seed_deepspeed(zero, step: int) -> None:
    """ZeRO's base optimizer makes its Adam state at its first step (DeepSpeed links each parameter's fragment of it
    only then), and the fragment API has nothing to write into before: the state of each flat fp32 partition is made
    here as the optimizer would (zero moments, which the API then fills, and the step), then linked as DeepSpeed
    links it after a step. DeepSpeed's own universal loader builds the same state from its per-parameter files."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    base = zero.optimizer
    # ZeRO-1/2's partitions are its optimizer's parameters; ZeRO-3 hands each to it only for its step.
    flats = getattr(zero, "single_partition_of_fp32_groups", None) or zero.fp32_partitioned_groups_flat
    on_device = base.defaults.get("fused") or base.defaults.get("capturable")  # torch keeps `step` with them
    for flat in flats:
        if not base.state.get(flat):
            counter = step if isinstance(base, DeepSpeedCPUAdam) else torch.tensor(float(step))
            base.state[flat] = {
                "step": counter.to(flat.device) if torch.is_tensor(counter) and on_device else counter,
                "exp_avg": torch.zeros_like(flat),
                "exp_avg_sq": torch.zeros_like(flat),
            }
    link = getattr(zero, "_lazy_init_hp_params_optimizer_state", None)  # ZeRO-1/2: what its first step does
    if link is not None:
        link()


# --- readers: one per library layout --------------------------------------------------------------------------


def read_weights(path: Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """A checkpoint's full weights by parameter name, from any layout, on this process alone (`qa-train
    consolidate`); `shapes` as `convert` takes them."""
    weights = _reader(path, list(shapes)).read("weights")
    return {name: _shaped(t, shapes.get(name)) for name, t in weights.items()}


def _reader(path: Path, names: list[str]):
    if any((path / name).is_file() for name in ACCELERATE_WEIGHTS):
        return TorchFiles(path, names)
    if (path / DCP_WEIGHTS).is_dir():
        return DistributedCheckpoint(path)
    if (path / "latest").is_file():
        return DeepSpeedFiles(path)
    raise PortableError(f"{path}: neither accelerate's, FSDP's nor DeepSpeed's checkpoint files")


class TorchFiles:
    """accelerate's files for single and DDP (model.safetensors, optimizer.bin keyed by index) or FSDP's full state
    dict (pytorch_model_fsdp.bin, optimizer.bin keyed by name)."""

    def __init__(self, path: Path, names: list[str]) -> None:
        self.path, self.names = path, names
        # mmap: the moments are paged in one tensor at a time as they are written out.
        self.optimizer = torch.load(path / "optimizer.bin", map_location="cpu", mmap=True, weights_only=True)
        keys = list(self.optimizer["state"])
        if keys and isinstance(keys[0], int) and len(keys) != len(names):
            raise PortableError(
                f"{path / 'optimizer.bin'}: state for {len(keys)} parameters, this model has {len(names)}"
            )

    def read(self, kind: str) -> dict[str, torch.Tensor]:
        if kind == "weights":
            if (self.path / "model.safetensors").is_file():
                from safetensors.torch import load_file

                return load_file(self.path / "model.safetensors")
            return torch.load(self.path / "pytorch_model_fsdp.bin", map_location="cpu", mmap=True, weights_only=True)
        state = self.optimizer["state"]
        # A parameter without this moment is left out, and named by `convert` (it was a KeyError).
        return {self.names[k] if isinstance(k, int) else k: entry[kind] for k, entry in state.items() if kind in entry}

    def step(self) -> int:
        return first_step(entry.get("step") for entry in self.optimizer["state"].values())


class DistributedCheckpoint:
    """FSDP's sharded state dict (torch.distributed.checkpoint), read whole on this process alone: the same
    resharding torch does between world sizes, to one full tensor per name."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _load(self, folder: str, keys: dict[str, str]) -> dict[str, torch.Tensor]:
        """{our name: checkpoint key} -> {our name: full tensor}."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        reader = dcp.FileSystemReader(str(self.path / folder))
        stored = reader.read_metadata().state_dict_metadata
        wanted = {}
        for key in keys.values():
            meta = stored[key]
            if not isinstance(meta, TensorStorageMetadata):  # optimizer.state holds tensors only; bytes are not ours
                raise PortableError(f"{self.path / folder}: {key} is not a tensor")
            wanted[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
        with warnings.catch_warnings():
            # One process reading every shard is the intent (no_dist): torch's warning that it assumed so is noise.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(wanted, storage_reader=reader, no_dist=True)
        return {name: wanted[key] for name, key in keys.items()}

    def _keys(self, folder: str, prefix: str, suffix: str = "") -> dict[str, str]:
        import torch.distributed.checkpoint as dcp

        stored = dcp.FileSystemReader(str(self.path / folder)).read_metadata().state_dict_metadata
        return {
            key[len(prefix) : len(key) - len(suffix)]: key
            for key in stored
            if key.startswith(prefix) and key.endswith(suffix)
        }

    def read(self, kind: str) -> dict[str, torch.Tensor]:
        if kind == "weights":
            return self._load(DCP_WEIGHTS, self._keys(DCP_WEIGHTS, "model."))
        return self._load(DCP_OPTIMIZER, self._keys(DCP_OPTIMIZER, "optimizer.state.", f".{kind}"))

    def step(self) -> int:
        first = dict(list(self._keys(DCP_OPTIMIZER, "optimizer.state.", ".step").items())[:1])
        return first_step(self._load(DCP_OPTIMIZER, first).values())
