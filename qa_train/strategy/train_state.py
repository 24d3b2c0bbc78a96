"""What a checkpoint records besides accelerate's state (trainer_state.json), and which changes a resumed run
may make to it: the resume contract, and where a run on another number of processes or global batch continues."""

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
# Trainer state format: 2 records what wrote it (WRITER), 3 how the run answers (`answering`), 4 which questions
# it evaluates (`eval_data`); a checkpoint of a higher format is refused (an older qa_train would read its new key
# as damage and skip it for an older checkpoint).
CHECKPOINT_FORMAT = 4
WRITER = ("checkpoint_format", "qa_train_version")
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
    # Articles reordered or a question edited keep the count: the windows' fingerprint (their feature cache's key:
    # the file's bytes, the tokenizer, the windowing) does not.
    "train_data": (
        "the training windows' fingerprint",
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
    train_data: str | None = None
    # The model's architecture and weight sizes (modeling.model_shape): another shape's weights cannot be loaded.
    model_shape: str | None = None
    # What the strategy's save_state wrote (distributed.checkpoint_layout): another strategy cannot load it.
    checkpoint_layout: str | None = None
    # The best evaluation so far ({"step", "exact_match", "f1"}), so a resumed run's best_* still counts the
    # evaluations before the checkpoint (with --save_best, output_dir/best/best.json says the same).
    best_eval: dict[str, Any] | None = None
    # The fingerprint of the evaluation questions (their file's bytes, --max_eval_samples) best_eval scored: another
    # run's F1 on other questions is no measure against it. None: no evaluation, or format 3 and older.
    eval_data: str | None = None
    # A stop request ended the run at a step that owed an in-loop evaluation: the resumed run does it first.
    eval_owed: bool = False
    # WRITER: None in checkpoints of format 1 (before 2026-11-26), which recorded neither.
    checkpoint_format: int | None = None
    qa_train_version: str | None = None
    # The windows and span rules the run answers with (TrainArgs.answering()), which `qa-train consolidate` records
    # in its folder's config.json as the export does; None in checkpoints of format 2 and older.
    answering: dict[str, Any] | None = None

    def contract(self) -> dict[str, Any]:
        """The contract's fields by name, with what the run records of itself (WRITER, `answering`): a resumed run's
        state takes all of these from the run, not the checkpoint (Any, so that dataclasses.replace takes them)."""
        return {
            name: getattr(self, name)
            for name in (*CONTRACT, *DATA_ORDER, "checkpoint_layout", "model_shape", *WRITER, "answering", "eval_data")
        }

    @property
    def windows_into_epoch(self) -> int | None:
        """Training windows of `epoch` consumed (over every rank), or None where the checkpoint does not say."""
        if self.world_size is None or self.per_device_train_batch_size is None:
            return None
        return self.batches_in_epoch * self.per_device_train_batch_size * self.world_size


class NewerCheckpoint(ValueError):
    """A trainer_state.json of a format this qa_train does not know: written by a newer one."""


def state_from_json(text: str) -> TrainerState:
    """Parse trainer_state.json, old formats included; ValueError says what is wrong with it."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    written = data.get("checkpoint_format")
    if written is not None and not is_int(written):
        raise ValueError(f"checkpoint_format is {written!r}, not a number")
    if written is not None and written > CHECKPOINT_FORMAT:  # before its unknown keys: they are why
        raise NewerCheckpoint(
            f"written by a newer qa_train ({data.get('qa_train_version') or 'version unknown'}, checkpoint format "
            f"{written}; this one reads format {CHECKPOINT_FORMAT} and older): upgrade qa_train to resume it"
        )
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
    kinds = {"group_by_length": lambda v: isinstance(v, bool), "train_data": lambda v: isinstance(v, str)}
    for name in DATA_ORDER:
        value = data.get(name)
        if value is not None and not kinds.get(name, is_int)(value):
            raise ValueError(f"{name} is {value!r}")
    for name in ("checkpoint_layout", "model_shape", "qa_train_version", "eval_data"):
        if not isinstance(data.get(name) or "", str):
            raise ValueError(f"{name} is {data[name]!r}, not a string")
    if not isinstance(data.get("eval_owed", False), bool):
        raise ValueError(f"eval_owed is {data['eval_owed']!r}, not true or false")
    answering = data.get("answering")
    if answering is not None and not isinstance(answering, dict):
        raise ValueError(f"answering is {answering!r}, not an object")
    best = data.get("best_eval")
    if best is not None and not (isinstance(best, dict) and set(best) == {"step", "exact_match", "f1"}):
        raise ValueError(f"best_eval is {best!r}, not a step with its exact_match and f1")
    return TrainerState(**data)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def resume_conflicts(
    saved: TrainerState, now: TrainerState, allow_global_batch_change: bool = False
) -> tuple[list[str], list[str]]:
    """Why this run cannot continue `saved` (refusals), and what changes although it can (notes).

    Each is one phrase naming the checkpoint's value and this run's. None on either side is unknown
    (an older checkpoint, or a caller that did not say) and skipped. Another strategy or number of processes is
    no refusal: the checkpoint is resharded or converted (qa_train.strategy.checkpoint says how).
    """

    def changed(name: str) -> bool:
        was, now_is = getattr(saved, name), getattr(now, name)
        return was is not None and now_is is not None and was != now_is

    refusals: list[str] = []
    notes: list[str] = []
    if changed("model_shape"):  # before the library's loader fails with "size mismatch" (or "damaged")
        refusals.append(
            f"it is a checkpoint of another model shape ({saved.model_shape}; this run builds {now.model_shape}): "
            "resume with the --config_name or --model_name_or_path that wrote it, or start a new run with "
            "--overwrite_output_dir"
        )
    if changed("global_batch_size"):
        if not allow_global_batch_change:
            refusals.append(
                f"its global batch is {saved.global_batch_size}, this run's is {now.global_batch_size}: the steps "
                f"done and the LR schedule count batches of {saved.global_batch_size}; resume with per-device batch x "
                f"accumulation x processes = {saved.global_batch_size}, add --allow_global_batch_change to continue "
                f"with {now.global_batch_size} (the steps and the schedule recomputed from the windows trained), or "
                "start a new run with --overwrite_output_dir"
            )
    elif changed("world_size"):
        notes.append(
            f"it was written by {processes(saved.world_size)}, this run has {now.world_size}, with the same global "
            f"batch of {now.global_batch_size}: every step trains the windows it would have; per-rank RNG (dropout "
            "masks) is not carried"
        )
    regrouped = bool(saved.batches_in_epoch and now.group_by_length and changed("per_device_train_batch_size"))
    if regrouped or not (changed("global_batch_size") or changed("world_size")):  # else the world's note says it
        if changed("per_device_train_batch_size") or changed("gradient_accumulation_steps"):
            (refusals if regrouped else notes).append(_split_change(saved, now))
    for name in DATA_ORDER:
        if changed(name) and not (name == "train_data" and changed("num_train_windows")):  # one cause, said once
            (refusals if saved.batches_in_epoch else notes).append(_order_change(saved, now, name))
    if other_questions(saved, now) and saved.best_eval is not None:
        notes.append(
            f"the evaluation questions changed (fingerprint {saved.eval_data} -> {now.eval_data}): the best "
            f"evaluation so far (step {saved.best_eval['step']}, F1 {saved.best_eval['f1']:.2f}) scored the others, "
            "so metrics.json's best_* and --save_best count only this run's evaluations"
        )
    if changed("total_steps") and now.total_steps is not None:
        note = (
            f"total steps {saved.total_steps} -> {now.total_steps}: the LR schedule is recomputed for "
            f"{now.total_steps} steps, so the learning rate jumps at step {saved.completed_steps}"
        )
        if saved.completed_steps >= now.total_steps:
            note += f"; the checkpoint is already at step {saved.completed_steps}, so no training step runs"
        notes.append(note)
    return refusals, notes


def other_questions(saved: TrainerState, now: TrainerState) -> bool:
    """Whether this run evaluates other questions than those the checkpoint's best evaluation scored."""
    return saved.eval_data is not None and now.eval_data is not None and saved.eval_data != now.eval_data


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
    """Same global batch, another per-device x accumulation split: the resume skips the windows consumed, counted
    in windows, so every step trains the same windows. The length-grouped order sorts runs of per-device-batch
    windows, though: there another split mid-epoch would reorder the windows under those skipped."""
    was = f"{saved.per_device_train_batch_size} per device x {saved.gradient_accumulation_steps} accumulation"
    now_is = f"{now.per_device_train_batch_size} x {now.gradient_accumulation_steps}"
    if (
        saved.batches_in_epoch
        and now.group_by_length
        and saved.per_device_train_batch_size != now.per_device_train_batch_size
    ):
        return (
            f"its batches were {was}, this run's are {now_is}: it stopped {saved.batches_in_epoch} micro-batches "
            f"into epoch {saved.epoch}, and --group_by_length orders the windows by runs of per-device batches, "
            f"so another size would see windows twice or never; resume with --per_device_train_batch_size "
            f"{saved.per_device_train_batch_size} --gradient_accumulation_steps {saved.gradient_accumulation_steps}"
        )
    return (
        f"batches {was} -> {now_is} with the same global batch {now.global_batch_size}: every step trains the "
        "windows it would have (its update agrees to rounding)"
    )


def processes(n: int | None) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def kept_accumulation(saved: TrainerState, per_device: int, world_size: int) -> int | None:
    """The gradient accumulation that keeps the checkpoint's global batch with `per_device` windows on each of
    `world_size` processes, or None when the checkpoint does not say its global batch or no whole number keeps it."""
    if saved.global_batch_size is None:
        return None
    accumulation, rest = divmod(saved.global_batch_size, per_device * world_size)
    return accumulation if accumulation and not rest else None


@dataclass
class Position:
    """Where a resumed run continues: its optimizer steps done and this rank's micro-batches of the epoch to skip."""

    completed_steps: int
    batches_in_epoch: int
    note: str | None = None


def continue_at(saved: TrainerState, now: TrainerState, updates_per_epoch: int) -> Position:
    """The checkpoint's position in this run's units. The windows consumed are counted over every rank, so another
    number of processes or per-device batch skips exactly them; another global batch (allowed by
    --allow_global_batch_change) recounts the steps from the windows trained, in whole steps of the new size."""
    windows = saved.windows_into_epoch
    micro = (now.per_device_train_batch_size or 0) * (now.world_size or 0)
    if windows is None or not micro:  # a checkpoint of format 1, or a caller that did not say: as saved
        return Position(saved.completed_steps, saved.batches_in_epoch)
    if saved.global_batch_size in (None, now.global_batch_size) or now.global_batch_size is None:
        return Position(saved.completed_steps, windows // micro)
    batch = now.global_batch_size
    steps_in_epoch, again = divmod(windows, batch)
    completed = saved.epoch * updates_per_epoch + steps_in_epoch
    note = (
        f"global batch {saved.global_batch_size} -> {batch} (--allow_global_batch_change): step "
        f"{saved.completed_steps} of {saved.global_batch_size} windows continues as step {completed} of {batch}, "
        f"{windows} windows into epoch {saved.epoch}"
        + (f" (its last {again} are trained again)" if again else "")
        + f"; the LR schedule is recomputed for {now.total_steps} steps of {batch}"
    )
    return Position(completed, steps_in_epoch * (now.gradient_accumulation_steps or 1), note)
