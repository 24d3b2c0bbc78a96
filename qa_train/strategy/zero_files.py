"""DeepSpeed's ZeRO-1/2/3 checkpoint files (any number of ranks, optimizer offload too), read by parameter name one
kind at a time: the fp32 master weights, then exp_avg, then exp_avg_sq.

Each rank's optimizer file holds its flat fp32 partitions and their Adam moments. ZeRO-1/2 concatenate each param
group's parameters, pad the group and cut it into equal partitions, and the file names each parameter's fragment
in its partition (param_slice_mappings); ZeRO-3 cuts each parameter into equal padded pieces, one per rank, laid
end to end in sub-groups whose parameters the model-states file lists (param_shapes). See DeepSpeed's
utils/zero_to_fp32.py and checkpoint/ds_to_universal.py, which read the same files.

We read them ourselves because DeepSpeed's universal conversion (ds_to_universal) loads a rank's whole optimizer
file and its model states at once (above one fp32 copy of the model and its Adam state on one rank) and merges
through a temporary file per parameter fragment (slow). Here every file is memory-mapped and released after each
rank, so a kind's full tensors and one rank's pages of that kind are all that is resident.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch

from qa_train.core.errors import one_line

KINDS = ("weights", "exp_avg", "exp_avg_sq")
OPTIM_FILE = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")


class ZeroFilesError(ValueError):
    """A ZeRO checkpoint this reader cannot make whole, said in one line naming the file."""


def load(file: Path, what: str = "DeepSpeed's checkpoint file", deepspeed: bool = True) -> dict:
    """A pickled checkpoint file memory-mapped, tensors paged in only when read. weights_only: its pickle may build
    nothing but tensors, plain containers and, with `deepspeed`, the few DeepSpeed value classes its files hold (no
    code runs); anything else is one line naming the file as not readable as `what`."""
    allowed: list = []
    if deepspeed:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        allowed = [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(file, map_location="cpu", mmap=True, weights_only=True)
    except Exception as err:  # pickle.UnpicklingError names the global it refused; RuntimeError a damaged zip
        raise ZeroFilesError(f"{file}: not readable as {what} ({why_unreadable(err)})") from err


def why_unreadable(err: BaseException) -> str:
    """torch.load's refusal in a few words: the class a weights_only load would not build (its message's first
    lines are general advice), else the error's first line."""
    refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
    if refused:
        return f"its pickle would build {refused.group(1)}, which no checkpoint holds; nothing was unpickled"
    return one_line(err)


def _rank_files(folder: Path) -> list[Path]:
    """The optimizer files in data-parallel rank order; tensor or pipeline parallel ones are not ours to merge."""
    found: dict[int, Path] = {}
    for file in folder.glob("*_optim_states.pt"):
        match = OPTIM_FILE.search(file.name)
        if match is None or match.group(2) != "00":
            raise ZeroFilesError(f"{file}: a tensor- or pipeline-parallel ZeRO file, which cannot be converted")
        found[int(match.group(1))] = file
    if not found:
        raise ZeroFilesError(f"{folder}: no ZeRO optimizer files (*_optim_states.pt)")
    if sorted(found) != list(range(len(found))):
        raise ZeroFilesError(f"{folder}: optimizer files of ranks {sorted(found)}, not 0 to {len(found) - 1}")
    return [found[rank] for rank in range(len(found))]


class DeepSpeedFiles:
    """One ZeRO checkpoint (`path`, with DeepSpeed's `latest` naming its tag folder) read as full tensors by name."""

    def __init__(self, path: Path) -> None:
        self.folder = path / (path / "latest").read_text().strip()
        self.files = _rank_files(self.folder)
        optim = load(self.files[0])["optimizer_state_dict"]
        self.stage = int(optim.get("zero_stage", 1))
        counts = optim.get("partition_count", len(self.files))
        if any(count != len(self.files) for count in (counts if isinstance(counts, list) else [counts])):
            raise ZeroFilesError(
                f"{self.files[0]}: partitioned over {counts} ranks, {len(self.files)} optimizer files (expert "
                "parallelism, or files missing)"
            )
        if optim.get("ds_zero_partition_groups") is not None:
            raise ZeroFilesError(f"{self.files[0]}: expert-parallel ZeRO-3 partitions cannot be converted")
        self._step = first_step(entry.get("step") for entry in _groups(_moment_state(optim, self.stage)))
        del optim
        self.models = self._model_files()
        model = load(self.models[0])
        self.shapes: list[dict[str, Any]] = model["param_shapes"]
        self.shared: dict[str, str] = dict(model.get("shared_params") or {})

    def _model_files(self) -> list[Path]:
        if self.stage <= 2:
            names = ["mp_rank_00_model_states.pt"]
        else:
            names = [f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt" for rank in range(len(self.files))]
        for name in names:
            if not (self.folder / name).is_file():
                raise ZeroFilesError(f"{self.folder / name}: missing (ZeRO-{self.stage}'s model states)")
        return [self.folder / name for name in names]

    def step(self) -> int:
        return self._step

    def read(self, kind: str) -> dict[str, torch.Tensor]:
        """Every optimized parameter's full `kind`, flat-filled rank by rank; for "weights" also the frozen
        parameters and the buffers, which the model states hold."""
        full = {name: torch.empty(math.prod(shape)) for group in self.shapes for name, shape in group.items()}
        filled = dict.fromkeys(full, 0)
        for rank, file in enumerate(self.files):
            optim = load(file)["optimizer_state_dict"]
            flats = self._flats(optim, kind, file)
            if len(flats) != len(self.shapes):
                raise ZeroFilesError(f"{file}: {len(flats)} flat groups, the model states list {len(self.shapes)}")
            if self.stage <= 2:
                _fill_zero12(full, filled, flats, optim["param_slice_mappings"])
            else:
                self._fill_zero3(full, filled, flats, rank, file)
            del optim, flats  # unmapped: this rank's pages leave memory before the next rank's are read
        short = [name for name, n in filled.items() if n != full[name].numel()]
        if short:
            raise ZeroFilesError(f"{self.folder}: {kind} of {short[0]} covers {filled[short[0]]} of its elements")
        whole = {name: full[name].view(shape) for group in self.shapes for name, shape in group.items()}
        if kind == "weights":
            whole |= self._unoptimized()
        for alias, name in self.shared.items():  # a tied weight under its second name, as zero_to_fp32 adds it
            if name in whole:
                whole[alias] = whole[name]
        return whole

    def _flats(self, optim: dict, kind: str, file: Path) -> list[torch.Tensor]:
        if kind == "weights":
            key = "single_partition_of_fp32_groups" if self.stage <= 2 else "fp32_flat_groups"
            return list(optim[key])
        entries = _groups(_moment_state(optim, self.stage))
        if not entries or any(kind not in entry for entry in entries):
            raise ZeroFilesError(f"{file}: no {kind} in its optimizer state (saved before the first step?)")
        return [entry[kind] for entry in entries]

    def _fill_zero3(self, full, filled, flats: list[torch.Tensor], rank: int, file: Path) -> None:
        """ZeRO-3: each parameter takes ceil(numel / ranks) elements of every rank's sub-group, the last rank's
        piece padded."""
        ranks = len(self.files)
        for flat, shapes in zip(flats, self.shapes, strict=True):
            offset = 0
            for name, shape in shapes.items():
                numel = math.prod(shape)
                piece = math.ceil(numel / ranks)
                start = rank * piece
                count = max(0, min(piece, numel - start))
                full[name][start : start + count].copy_(flat.narrow(0, offset, count))
                filled[name] += count
                offset += piece
            if offset != flat.numel():
                raise ZeroFilesError(
                    f"{file}: a flat sub-group of {flat.numel()} elements, its parameters take {offset}"
                )

    def _unoptimized(self) -> dict[str, torch.Tensor]:
        """Frozen parameters (no fp32 master copy: the model states keep them) and buffers, in fp32 where float."""
        models = [load(file) for file in self.models]
        first = models[0]
        kept: dict[str, torch.Tensor] = {}
        for name, shape in (first.get("frozen_param_shapes") or {}).items():
            pieces = [model["frozen_param_fragments"][name] for model in models]
            kept[name] = torch.cat(pieces).narrow(0, 0, math.prod(shape)).view(shape) if self.stage == 3 else pieces[0]
        module = first.get("module") or {}
        kept |= {name: module[name] for name in first.get("buffer_names") or [] if name in module}
        return {name: t.float().clone() if t.is_floating_point() else t.clone() for name, t in kept.items()}


def _fill_zero12(full, filled, flats: list[torch.Tensor], mappings: list[dict]) -> None:
    """ZeRO-1/2: this rank's fragment of each parameter (where it starts in the rank's partition, how long), which
    continues the fragment the previous rank held."""
    for flat, fragments in zip(flats, mappings, strict=True):
        for name, where in fragments.items():
            at = filled[name]
            full[name][at : at + where.numel].copy_(flat.narrow(0, where.start, where.numel))
            filled[name] = at + where.numel


def _moment_state(optim: dict, stage: int) -> Any:
    return optim["base_optimizer_state"] if stage <= 2 else optim["optimizer_state_dict"]


def _groups(state: Any) -> list[dict]:
    """The base optimizer's state per flat group: a torch state dict keyed by group, or (ZeRO-1/2's elastic
    checkpoints) a list of them."""
    if isinstance(state, list):
        return state
    entries = state["state"]
    return [entries[group] for group in sorted(entries)]


def first_step(steps: Any) -> int:
    """The optimizer's step: the first parameter's that has one (every parameter's is the same), 0 before any."""
    for step in steps:
        if step is not None:
            return int(step.item() if torch.is_tensor(step) else step)
    return 0
