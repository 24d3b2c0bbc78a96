"""Continuing a checkpoint under any strategy and number of processes, in two phases around `prepare`.

Before it, the checkpoint is found, checked against this run (qa_train.strategy.train_state's contract) and,
where the library cannot load it under this run's strategy and world size (qa_train.strategy.checkpoint's
conversion_reason), converted to the portable layout, whose weights go into the still unprepared model. After it,
the optimizer state is restored (by the library, or from the portable moments) and the position is recounted in
this run's batches. A run on other processes than the checkpoint's (a requeued job on other nodes) keeps the
global batch: the accumulation is refitted before anything is built (`refit_accumulation`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from qa_train.strategy import checkpoint, portable
from qa_train.strategy.train_state import TrainerState, continue_at, kept_accumulation, processes

log = logging.getLogger("qa_train")


@dataclass
class Request:
    """What the flags ask: --resume_from_checkpoint (None: a fresh start), the output dir, and whether another global
    batch may continue the checkpoint (--allow_global_batch_change)."""

    spec: str | None
    output_dir: Path
    allow_global_batch_change: bool = False


@dataclass
class Resume:
    """A checkpoint this run continues, checked."""

    path: Path
    saved: TrainerState
    now: TrainerState
    portable: Path | None = None  # its converted folder; None: the library loads the checkpoint itself
    reason: str | None = None  # why it must be converted; None: the library loads it as it is


@dataclass
class Refit:
    """The accumulation that keeps a checkpoint's global batch on this run's processes, and the line that says so."""

    accumulation: int
    message: str


def refit_accumulation(request: Request, per_device: int, accumulation: int, world_size: int) -> Refit | None:
    """For a checkpoint written by another number of processes (none of the sharding, all of the batch), the
    accumulation that keeps its global batch, when this run's would change it and a whole one keeps it; None
    otherwise (the contract check then refuses another global batch, naming --allow_global_batch_change).

    Read on every rank from the checkpoint's trainer_state.json alone, before any process group exists, so no
    line is said here; the checkpoint is checked in full later (`before_prepare`).
    """
    found = None if request.allow_global_batch_change else checkpoint.peek(request.spec, request.output_dir)
    if found is None:
        return None
    path, saved = found
    batch = per_device * accumulation * world_size
    if saved.world_size in (None, world_size) or saved.global_batch_size in (None, batch):
        return None
    kept = kept_accumulation(saved, per_device, world_size)
    if kept is None:
        return None
    return Refit(
        kept,
        f"resuming {path}, written by {processes(saved.world_size)}, on {world_size}: --gradient_accumulation_steps "
        f"{accumulation} -> {kept} keeps its global batch of {saved.global_batch_size} "
        f"(--allow_global_batch_change keeps {accumulation} and recounts the steps instead)",
    )


def checked(accelerator, request: Request, now: TrainerState) -> Resume | None:
    """The checkpoint to continue, its contents and its contract checked against this run, nothing loaded: what
    may refuse a resume does so here, before --overwrite_output_dir clears anything."""
    path = checkpoint.agreed_resume(accelerator, request.spec, request.output_dir)
    if path is None:
        root = checkpoint.checkpoint_root(request.output_dir)
        if request.spec == "latest" and not checkpoint.step_folders(root):  # damaged ones were named, "from scratch"
            log.info("no checkpoint in %s yet: starting from scratch", root)
        return None
    saved = checkpoint.read_state(path)
    checkpoint.check_contract(accelerator, path, saved, now, request.allow_global_batch_change)
    return Resume(path, saved, now, reason=checkpoint.conversion_reason(saved, now))


def before_prepare(
    accelerator, request: Request, found: Resume | None, model, shapes: dict[str, tuple[int, ...]]
) -> Resume | None:
    """The `checked` checkpoint converted (and its weights loaded into the unprepared `model`) where the library
    cannot load it itself. `shapes`: the parameters' whole shapes, in the optimizer's order."""
    if found is None or found.reason is None:
        return found
    folder = checkpoint.convert(accelerator, found.path, shapes, request.output_dir)
    with _discarded_on_refusal(accelerator, folder):
        checkpoint.agreed(accelerator, found.path, lambda: portable.load_weights(model, folder), doing="converted")
    return replace(found, portable=folder)


@contextmanager
def _discarded_on_refusal(accelerator, folder: Path) -> Iterator[None]:
    """The portable folder goes with a refused load too: `agreed` refuses on every rank at once, so all meet here."""
    try:
        yield
    except checkpoint.CheckpointError:
        checkpoint.discard(accelerator, folder)
        raise


def after_prepare(accelerator, resume: Resume, model, optimizer, updates_per_epoch: int) -> TrainerState:
    """Restore the optimizer and counters; the position in this run's batches."""
    if resume.portable is None:
        state = checkpoint.load_checkpoint(accelerator, resume.path, resume.now, checked=True)
    else:
        folder = resume.portable
        load = lambda: portable.load_optimizer(accelerator, model, optimizer, folder)  # noqa: E731
        with _discarded_on_refusal(accelerator, folder):
            checkpoint.agreed(accelerator, resume.path, load, doing="converted")
        checkpoint.discard(accelerator, folder)
        state = replace(resume.saved, **resume.now.contract())
        if accelerator.is_main_process:
            log.warning(
                "resuming from %s: %s, so its weights, Adam moments and step were converted by parameter name; "
                "per-rank RNG (dropout masks) is not carried",
                resume.path,
                resume.reason,
            )
    # accelerate restores its micro-batch count with the checkpoint, counted in the checkpoint's accumulation;
    # `accumulate` updates when it is a multiple of this run's, and a resume begins at an update.
    accelerator.step = 0
    position = continue_at(resume.saved, resume.now, updates_per_epoch)
    if position.note and accelerator.is_main_process:
        log.warning("resuming from %s: %s", resume.path, position.note)
    return replace(state, completed_steps=position.completed_steps, batches_in_epoch=position.batches_in_epoch)
