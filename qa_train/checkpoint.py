"""Resumable checkpoints and the final export, both atomic under every strategy.

A checkpoint is written under a temporary name by all ranks (DeepSpeed and FSDP write shards)
and renamed by the main process once every rank has finished, so a crash mid-write never
becomes `latest`.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("qa_train")
STEP_DIR = re.compile(r"^step_(\d+)$")
STATE_FILE = "trainer_state.json"


@dataclass
class TrainerState:
    """Counters that accelerate's save_state does not keep."""

    completed_steps: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches of `epoch` already consumed


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Finished checkpoints, oldest first (temporary folders never match STEP_DIR)."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def resolve_resume(spec: str | None, output_dir: str | Path) -> Path | None:
    """'latest' means the newest complete checkpoint in output_dir, or a fresh start if there is none."""
    if spec is None:
        return None
    if spec == "latest":
        found = complete_checkpoints(output_dir)
        return found[-1] if found else None
    path = Path(spec)
    if not (path / STATE_FILE).is_file():
        raise ValueError(f"--resume_from_checkpoint {spec}: no {STATE_FILE}; not a complete qa_train checkpoint")
    return path


def save_checkpoint(accelerator, output_dir: str | Path, state: TrainerState, keep: int | None) -> Path:
    root = checkpoint_root(output_dir)
    final = root / f"step_{state.completed_steps:08d}"
    tmp = root / f".tmp-step_{state.completed_steps:08d}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps(asdict(state)))
        if final.exists():  # the same step saved twice (e.g. preemption right after a periodic save)
            shutil.rmtree(final)
        tmp.rename(final)
        _rotate(output_dir, keep)
        log.info("checkpoint saved: %s", final)
    accelerator.wait_for_everyone()
    return final


def _rotate(output_dir: str | Path, keep: int | None) -> None:
    if keep is None:
        return
    for old in complete_checkpoints(output_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(accelerator, path: Path) -> TrainerState:
    accelerator.load_state(str(path))
    return TrainerState(**json.loads((path / STATE_FILE).read_text()))


def export_final(accelerator, model, tokenizer, output_dir: str | Path) -> Path:
    """Full consolidated weights + tokenizer in output_dir/final, loadable by from_pretrained.

    get_state_dict gathers ZeRO-3 partitions (16-bit, rank 0 only) and FSDP shards; saving the
    unwrapped model without it would write placeholders under ZeRO-3.
    """
    final = Path(output_dir) / "final"
    tmp = Path(output_dir) / ".tmp-final"
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        log.info("model exported: %s", final)
    accelerator.wait_for_everyone()
    return final
