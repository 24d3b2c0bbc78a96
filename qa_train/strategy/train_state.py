"""What a checkpoint records besides accelerate's state (trainer_state.json), and which changes a resumed run
may make to it: the resume contract."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field, fields
from typing import Any

CONTRACT = (
    "world_size",
    "global_batch_size",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "total_steps",
)
COUNTERS = ("completed_steps", "epoch", "batches_in_epoch")
# What decides the order of the training windows: a mid-epoch resume replays the epoch's order and skips what
# was consumed, so all of these must be as they were (at an epoch boundary a change only starts a new order).
DATA_ORDER = {  # name: (what it is, how to resume as before)
    "seed": ("--seed", "--seed {was}"),
    "group_by_length": ("--group_by_length", "--group_by_length {was}"),
    "num_train_windows": (
        "the number of training windows",
        "the checkpoint's training data and windowing "
        "(--train_file, --max_train_samples, --max_seq_length, --doc_stride, the tokenizer)",
    ),
}


@dataclass
class TrainerState:
    """Counters that accelerate's save_state does not keep, and what the checkpoint was sized for."""

    completed_steps: int = 0
    epoch: int = 0
    batches_in_epoch: int = 0  # micro-batches of `epoch` already consumed
    # Whose checkpoints rotation may delete: new for a fresh run, inherited on resume. Every rank draws
    # its own, but only the main process's is written.
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # The resume contract (see resume_conflicts); None: written by a qa_train that did not record it.
    world_size: int | None = None
    global_batch_size: int | None = None
    per_device_train_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    total_steps: int | None = None
    seed: int | None = None  # DATA_ORDER: refused mid-epoch when it changes
    group_by_length: bool | None = None
    num_train_windows: int | None = None
    # What the strategy's save_state wrote (distributed.checkpoint_layout): another strategy cannot load it.
    checkpoint_layout: str | None = None
    # The best evaluation so far ({"step", "exact_match", "f1"}), so a resumed run's best_* still counts the
    # evaluations before the checkpoint (with --save_best, output_dir/best/best.json says the same).
    best_eval: dict[str, Any] | None = None
    # A stop request ended the run at a step that owed an in-loop evaluation: the resumed run does it first.
    eval_owed: bool = False

    def contract(self) -> dict[str, Any]:
        """The contract's fields by name (ints, a bool and a str: Any, so that dataclasses.replace takes them)."""
        return {name: getattr(self, name) for name in (*CONTRACT, *DATA_ORDER, "checkpoint_layout")}


def state_from_json(text: str) -> TrainerState:
    """Parse trainer_state.json, old formats included; ValueError says what is wrong with it."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    unknown = sorted(set(data) - {f.name for f in fields(TrainerState)})
    if unknown:
        raise ValueError(f"unknown keys {', '.join(unknown)} (written by a newer qa_train?)")
    for name in COUNTERS:
        if not is_int(data.get(name)) or data[name] < 0:
            raise ValueError(f"{name} is {data.get(name)!r}, not a count")
    for name in CONTRACT:
        if data.get(name) is not None and not (is_int(data[name]) and data[name] > 0):
            raise ValueError(f"{name} is {data[name]!r}, not a positive integer")
    if "run_id" in data and not (isinstance(data["run_id"], str) and data["run_id"]):
        raise ValueError(f"run_id is {data['run_id']!r}, not a string")
    for name in DATA_ORDER:
        value = data.get(name)
        if value is not None and not (isinstance(value, bool) if name == "group_by_length" else is_int(value)):
            raise ValueError(f"{name} is {value!r}")
    if not isinstance(data.get("checkpoint_layout") or "", str):
        raise ValueError(f"checkpoint_layout is {data['checkpoint_layout']!r}, not a string")
    if not isinstance(data.get("eval_owed", False), bool):
        raise ValueError(f"eval_owed is {data['eval_owed']!r}, not true or false")
    best = data.get("best_eval")
    if best is not None and not (isinstance(best, dict) and set(best) == {"step", "exact_match", "f1"}):
        raise ValueError(f"best_eval is {best!r}, not a step with its exact_match and f1")
    return TrainerState(**data)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def resume_conflicts(saved: TrainerState, now: TrainerState) -> tuple[list[str], list[str]]:
    """Why this run cannot continue `saved` (refusals), and what changes although it can (notes).

    Each is one phrase naming the checkpoint's value and this run's. None on either side is unknown
    (an older checkpoint, or a caller that did not say) and skipped.
    """

    def changed(name: str) -> bool:
        was, now_is = getattr(saved, name), getattr(now, name)
        return was is not None and now_is is not None and was != now_is

    refusals: list[str] = []
    notes: list[str] = []
    if changed("checkpoint_layout"):  # before the library's loader fails on files it does not know, or hangs
        refusals.append(
            f"it was saved as {saved.checkpoint_layout}, this run loads {now.checkpoint_layout}: each strategy writes "
            "its own files; resume under the accelerate config that wrote it, or start a new run with "
            "--overwrite_output_dir"
        )
    if changed("world_size"):
        refusals.append(
            f"it was written by {saved.world_size} processes, this run has {now.world_size}: its optimizer, RNG and "
            f"data-position state and its LR schedule are sized for {saved.world_size}; resume with "
            f"{saved.world_size} processes, or start a new run with --overwrite_output_dir"
        )
    if changed("global_batch_size"):
        refusals.append(
            f"its global batch is {saved.global_batch_size}, this run's is {now.global_batch_size}: the steps done "
            f"and the LR schedule count batches of {saved.global_batch_size}; resume with per-device batch x "
            f"accumulation x processes = {saved.global_batch_size}, or start a new run with --overwrite_output_dir"
        )
    elif not refusals and (changed("per_device_train_batch_size") or changed("gradient_accumulation_steps")):
        split = _split_change(saved, now)
        (refusals if saved.batches_in_epoch else notes).append(split)
    for name in DATA_ORDER:
        if changed(name):
            (refusals if saved.batches_in_epoch else notes).append(_order_change(saved, now, name))
    if changed("total_steps") and now.total_steps is not None:
        note = (
            f"total steps {saved.total_steps} -> {now.total_steps}: the LR schedule is recomputed for "
            f"{now.total_steps} steps, so the learning rate jumps at step {saved.completed_steps}"
        )
        if saved.completed_steps >= now.total_steps:
            note += f"; the checkpoint is already at step {saved.completed_steps}, so no training step runs"
        notes.append(note)
    return refusals, notes


def _order_change(saved: TrainerState, now: TrainerState, name: str) -> str:
    what, fix = DATA_ORDER[name]
    was, now_is = getattr(saved, name), getattr(now, name)
    if saved.batches_in_epoch:
        return (
            f"{what} {was} -> {now_is}, and it stopped {saved.batches_in_epoch} micro-batches into epoch "
            f"{saved.epoch}: the epoch's order would change under the skipped batches, so some windows would "
            f"be trained twice and others never; resume with {fix.format(was=was)}"
        )
    return f"{what} {was} -> {now_is} at an epoch boundary: later epochs follow the new order"


def _split_change(saved: TrainerState, now: TrainerState) -> str:
    """Same global batch, another per-device x accumulation split: safe only at an epoch boundary.

    Resuming skips `batches_in_epoch` micro-batches of this run's per-device size on each rank
    (skip_first_batches on the sharded loader), and the length-grouped sampler's order depends on that
    size too; so mid-epoch, another split would see some examples twice and others never.
    """
    was = f"{saved.per_device_train_batch_size} per device x {saved.gradient_accumulation_steps} accumulation"
    now_is = f"{now.per_device_train_batch_size} x {now.gradient_accumulation_steps}"
    if saved.batches_in_epoch:
        return (
            f"its batches were {was}, this run's are {now_is}: it stopped {saved.batches_in_epoch} micro-batches "
            f"into epoch {saved.epoch}, and skipping that many of another size would see examples twice or "
            f"never; resume with --per_device_train_batch_size {saved.per_device_train_batch_size} "
            f"--gradient_accumulation_steps {saved.gradient_accumulation_steps}"
        )
    return (
        f"batches {was} -> {now_is} with the same global batch {now.global_batch_size}: the checkpoint is at an "
        "epoch boundary, so no example is skipped or repeated; updates match in expectation, not bit for bit"
    )
