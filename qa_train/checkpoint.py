"""Resumable checkpoints: what one holds, which are complete and usable, and resuming from one.

A checkpoint (written by qa_train.saving) is complete only with its manifest, and usable only when every
file still has the size the manifest records (`verify`).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import uuid
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from qa_train.distributed import failed_ranks

log = logging.getLogger("qa_train")
STEP_DIR = re.compile(r"^step_(\d+)$")
STATE_FILE = "trainer_state.json"
MANIFEST = "manifest.json"
RNG_FILE = "random_states_{}.pkl"  # accelerate's name for one rank's RNG state
CONTRACT = ("world_size", "global_batch_size", "per_device_train_batch_size", "gradient_accumulation_steps",
            "total_steps")
COUNTERS = ("completed_steps", "epoch", "batches_in_epoch")
# What decides the order of the training windows: a mid-epoch resume replays the epoch's order and skips what
# was consumed, so all of these must be as they were (at an epoch boundary a change only starts a new order).
DATA_ORDER = {  # name: (what it is, how to resume as before)
    "seed": ("--seed", "--seed {was}"), "group_by_length": ("--group_by_length", "--group_by_length {was}"),
    "num_train_windows": ("the number of training windows", "the checkpoint's training data and windowing "
                          "(--train_file, --max_train_samples, --max_seq_length, --doc_stride, the tokenizer)")}


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from, said in one line that names it, by rank `reporter` (the one
    that knows why, where only some ranks failed)."""

    def __init__(self, message: str, reporter: int = 0) -> None:
        super().__init__(message)
        self.reporter = reporter


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
    # The best evaluation so far ({"step", "exact_match", "f1"}), so a resumed run's best_* still counts the
    # evaluations before the checkpoint (with --save_best, output_dir/best/best.json says the same).
    best_eval: dict[str, float] | None = None
    # A stop request ended the run at a step that owed an in-loop evaluation: the resumed run does it first.
    eval_owed: bool = False

    def contract(self) -> dict[str, int | bool | None]:
        return {name: getattr(self, name) for name in (*CONTRACT, *DATA_ORDER)}


def state_from_json(text: str) -> TrainerState:
    """Parse trainer_state.json, old formats included; ValueError says what is wrong with it."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    unknown = sorted(set(data) - {f.name for f in fields(TrainerState)})
    if unknown:
        raise ValueError(f"unknown keys {', '.join(unknown)} (written by a newer qa_train?)")
    for name in COUNTERS:
        if not _is_int(data.get(name)) or data[name] < 0:
            raise ValueError(f"{name} is {data.get(name)!r}, not a count")
    for name in CONTRACT:
        if data.get(name) is not None and not (_is_int(data[name]) and data[name] > 0):
            raise ValueError(f"{name} is {data[name]!r}, not a positive integer")
    if "run_id" in data and not (isinstance(data["run_id"], str) and data["run_id"]):
        raise ValueError(f"run_id is {data['run_id']!r}, not a string")
    for name in DATA_ORDER:
        value = data.get(name)
        if value is not None and not (isinstance(value, bool) if name == "group_by_length" else _is_int(value)):
            raise ValueError(f"{name} is {value!r}")
    if not isinstance(data.get("eval_owed", False), bool):
        raise ValueError(f"eval_owed is {data['eval_owed']!r}, not true or false")
    best = data.get("best_eval")
    if best is not None and not (isinstance(best, dict) and set(best) == {"step", "exact_match", "f1"}):
        raise ValueError(f"best_eval is {best!r}, not a step with its exact_match and f1")
    return TrainerState(**data)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_state(path: Path) -> TrainerState:
    try:
        return state_from_json((path / STATE_FILE).read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path / STATE_FILE}: unreadable or invalid ({one_line(err)})") from None


def one_line(err: BaseException, limit: int = 300) -> str:
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
    return text if len(text) <= limit else text[:limit] + "..."


# --- finding and checking checkpoints ----------------------------------------------------------


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def _step_folders(root: Path) -> list[Path]:
    """step_N folders, oldest first (temporary and trash folders never match STEP_DIR)."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _step_of(p) is not None and p.is_dir()]
    return sorted(found, key=_step_of)


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Finished checkpoints (trainer state and manifest present), oldest first; `verify` says if they are whole."""
    return [p for p in _step_folders(checkpoint_root(output_dir))
            if (p / STATE_FILE).is_file() and (p / MANIFEST).is_file()]


def _read_manifest(path: Path) -> dict[str, int]:
    """The manifest's files and sizes; ValueError (or OSError) when it is not a manifest."""
    files = json.loads((path / MANIFEST).read_text()).get("files")
    if not isinstance(files, dict) or not all(_is_int(size) for size in files.values()):
        raise ValueError("no 'files' mapping of sizes")
    return files


def _size_problem(path: Path, name: str, expected: int) -> str | None:
    if not path.is_file():
        return f"{name}: missing"
    size = path.stat().st_size
    return None if size == expected else f"{name}: {size} bytes, manifest says {expected}"


def verify(path: str | Path) -> str | None:
    """What makes `path` unusable as a checkpoint, in one line, or None when it is complete and whole."""
    path = Path(path)
    if not path.is_dir():
        return f"no {STATE_FILE}: the folder does not exist"
    if not (path / STATE_FILE).is_file():
        return f"no {STATE_FILE}: not a complete qa_train checkpoint"
    if not (path / MANIFEST).is_file():
        return f"no {MANIFEST}: incomplete (written by a run that was killed mid-save, or by an older qa_train?)"
    try:
        files = _read_manifest(path)
    except (OSError, ValueError, AttributeError) as err:
        return f"{MANIFEST}: unreadable or invalid ({one_line(err)})"
    problems = [p for name, size in files.items() if (p := _size_problem(path / name, name, size))]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return problems[0] + more
    try:
        state_from_json((path / STATE_FILE).read_text())
    except (OSError, ValueError) as err:
        return f"{STATE_FILE}: unreadable or invalid ({one_line(err)})"
    return None


def _good_siblings(path: Path) -> list[Path]:
    """The usable step folders next to `path`, newest first."""
    return [p for p in reversed(_step_folders(path.parent)) if p != path and verify(p) is None]


def _step_of(path: Path) -> int | None:
    match = STEP_DIR.match(path.name)
    return int(match.group(1)) if match else None


# --- resume ------------------------------------------------------------------------------------


def resolve_resume(spec: str | None, output_dir: str | Path, warn: bool = True) -> Path | None:
    """The checkpoint to resume from, or None for a fresh start.

    'latest' is the newest usable checkpoint in output_dir: damaged ones are skipped with a warning
    (pass warn=False on all but the main process). An explicit path must be usable: CheckpointError.
    """
    if spec is None:
        return None
    if spec == "latest":
        return latest_usable(checkpoint_root(output_dir), warn)
    path = Path(spec)
    problem = verify(path)
    if problem is None:
        return path
    good = _good_siblings(path)
    instead = (f"the newest good checkpoint there is {good[0]}" if good
               else f"there is no good checkpoint in {path.parent}")
    raise CheckpointError(f"--resume_from_checkpoint {path}: {problem}; {instead}")


def latest_usable(root: Path, warn: bool) -> Path | None:
    skipped: list[tuple[Path, str]] = []
    chosen = None
    for path in reversed(_step_folders(root)):
        problem = verify(path)
        if problem is None:
            chosen = path
            break
        skipped.append((path, problem))
    if warn:
        instead = (f"resuming from {chosen} instead" if chosen
                   else "no usable checkpoint left: starting from scratch (the damaged ones are kept)")
        for path, problem in skipped:
            log.warning("checkpoint %s skipped: %s; %s", path, problem, instead)
    return chosen


def set_aside_later(path: Path, output_dir: str | Path) -> list[Path]:
    """Resuming from `path` abandons the usable checkpoints after it in output_dir: left as step_N, `latest`
    and rotation would prefer them to the resumed run's own. Renamed (main process), never deleted."""
    step = _step_of(path)
    if step is None or path.parent.resolve() != checkpoint_root(output_dir).resolve():
        return []
    moved = []
    for later in _step_folders(path.parent):
        if (_step_of(later) or 0) > step and verify(later) is None:
            moved.append(move_aside(later, "abandoned"))
    if moved:
        log.warning("resuming from %s: the later checkpoints belong to the continuation it abandons; moved "
                    "aside, not deleted: %s", path, ", ".join(str(m) for m in moved))
    return moved


def resume_conflicts(saved: TrainerState, now: TrainerState) -> tuple[list[str], list[str]]:
    """Why this run cannot continue `saved` (refusals), and what changes although it can (notes).

    Each is one phrase naming the checkpoint's value and this run's. None on either side is unknown
    (an older checkpoint, or a caller that did not say) and skipped.
    """
    def changed(name: str) -> bool:
        was, now_is = getattr(saved, name), getattr(now, name)
        return was is not None and now_is is not None and was != now_is

    refusals, notes = [], []
    if changed("world_size"):
        refusals.append(
            f"it was written by {saved.world_size} processes, this run has {now.world_size}: its optimizer, RNG and "
            f"data-position state and its LR schedule are sized for {saved.world_size}; resume with "
            f"{saved.world_size} processes, or start a new run with --overwrite_output_dir")
    if changed("global_batch_size"):
        refusals.append(
            f"its global batch is {saved.global_batch_size}, this run's is {now.global_batch_size}: the steps done "
            f"and the LR schedule count batches of {saved.global_batch_size}; resume with per-device batch x "
            f"accumulation x processes = {saved.global_batch_size}, or start a new run with --overwrite_output_dir")
    elif not refusals and (changed("per_device_train_batch_size") or changed("gradient_accumulation_steps")):
        split = _split_change(saved, now)
        (refusals if saved.batches_in_epoch else notes).append(split)
    for name in DATA_ORDER:
        if changed(name):
            (refusals if saved.batches_in_epoch else notes).append(_order_change(saved, now, name))
    if changed("total_steps"):
        note = (f"total steps {saved.total_steps} -> {now.total_steps}: the LR schedule is recomputed for "
                f"{now.total_steps} steps, so the learning rate jumps at step {saved.completed_steps}")
        if saved.completed_steps >= now.total_steps:
            note += f"; the checkpoint is already at step {saved.completed_steps}, so no training step runs"
        notes.append(note)
    return refusals, notes


def _order_change(saved: TrainerState, now: TrainerState, name: str) -> str:
    what, fix = DATA_ORDER[name]
    was, now_is = getattr(saved, name), getattr(now, name)
    if saved.batches_in_epoch:
        return (f"{what} {was} -> {now_is}, and it stopped {saved.batches_in_epoch} micro-batches into epoch "
                f"{saved.epoch}: the epoch's order would change under the skipped batches, so some windows would "
                f"be trained twice and others never; resume with {fix.format(was=was)}")
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
        return (f"its batches were {was}, this run's are {now_is}: it stopped {saved.batches_in_epoch} micro-batches "
                f"into epoch {saved.epoch}, and skipping that many of another size would see examples twice or "
                f"never; resume with --per_device_train_batch_size {saved.per_device_train_batch_size} "
                f"--gradient_accumulation_steps {saved.gradient_accumulation_steps}")
    return (f"batches {was} -> {now_is} with the same global batch {now.global_batch_size}: the checkpoint is at an "
            "epoch boundary, so no example is skipped or repeated; updates match in expectation, not bit for bit")


def load_checkpoint(accelerator, path: Path, now: TrainerState | None = None) -> TrainerState:
    """Restore everything save_checkpoint wrote; with `now`, refuse a checkpoint this run cannot continue first.

    Checkpoints must be trusted: DeepSpeed's loader unpickles them (torch.load with weights_only=False).
    """
    saved = read_state(path)
    if now is not None:
        _check_contract(accelerator, path, saved, now)
    error = None
    try:
        accelerator.load_state(str(path))
    except Exception as err:  # corrupt content surfaces as SafetensorError, RuntimeError, pickle errors, ...
        if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
            raise  # not the checkpoint's fault
        error = err
    # A rank's own files (its ZeRO optimizer shard) can fail where the others load: every rank learns which failed
    # and all refuse the checkpoint together. Alone, the failed rank left the others to meet it at the next
    # collective (a "connection closed by peer" traceback, or a hang), and its reason was never said (only rank
    # 0 speaks).
    failed = failed_ranks(accelerator, error is not None)
    if failed:
        rank = accelerator.process_index
        message = (_load_failure(path, error, rank if accelerator.num_processes > 1 else None)
                   if rank == failed[0] else f"checkpoint {path} could not be loaded: rank {failed[0]} failed")
        raise CheckpointError(message, reporter=failed[0]) from error
    _warn_on_rng(path, accelerator.process_index)
    return saved if now is None else replace(saved, **now.contract())


def _check_contract(accelerator, path: Path, saved: TrainerState, now: TrainerState) -> None:
    # Before load_state: a different world size would otherwise fail deep inside DeepSpeed, misleadingly.
    refusals, notes = resume_conflicts(saved, now)
    if refusals:
        raise CheckpointError(f"--resume_from_checkpoint {path}: cannot continue it: {'; '.join(refusals)}")
    if accelerator.is_main_process:
        for note in notes:
            log.warning("resuming from %s: %s", path, note)


def _load_failure(path: Path, err: Exception, rank: int | None = None) -> str:
    step = _step_of(path)
    earlier = [p for p in _good_siblings(path) if step is None or (_step_of(p) or 0) < step]
    hint = (f"if it is damaged, resume from the previous complete checkpoint: --resume_from_checkpoint {earlier[0]}"
            if earlier else f"there is no earlier complete checkpoint in {path.parent}")
    who = f"rank {rank}: " if rank is not None else ""
    return f"checkpoint {path} could not be loaded: {who}{one_line(err)}; {hint}"



def _warn_on_rng(path: Path, process_index: int) -> None:
    """accelerate loads a rank's RNG file inside `except Exception: logger.info(...)` and goes on: say so."""
    rng = path / RNG_FILE.format(process_index)
    problem = _rng_problem(rng)
    if problem:
        log.warning("%s: %s; this rank goes on with the RNG seeded at start-up, so dropout differs from an "
                    "uninterrupted run (the resume is not bit-exact)", rng, problem)


def _rng_problem(rng: Path) -> str | None:
    """Read the file as accelerate does and check the keys it restores (CUDA's only on a CUDA machine)."""
    if not rng.is_file():
        return "missing"
    import torch
    from accelerate.utils import load

    try:
        states = load(rng)
    except Exception as err:  # torch.load's failures on a damaged file have no common type
        return f"unreadable ({one_line(err)})"
    needed = ["random_state", "numpy_random_seed", "torch_manual_seed"]
    needed += ["torch_cuda_manual_seed"] if torch.cuda.is_available() else []
    missing = [key for key in needed if not isinstance(states, dict) or key not in states]
    return f"lacks {', '.join(missing)}" if missing else None


# --- moving folders ----------------------------------------------------------------------------


def run_id_of(path: Path) -> str | None:
    try:
        return json.loads((path / STATE_FILE).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def move_aside(path: Path, suffix: str) -> Path:
    """Rename step_N to step_N.<suffix> (no longer a step folder: neither `latest` nor rotation sees it),
    replacing an earlier one of that name."""
    aside = path.with_name(f"{path.name}.{suffix}")
    delete_folder(aside)
    path.rename(aside)
    return aside


def delete_folder(path: Path) -> None:
    # Renamed first, so a kill mid-delete leaves a trash folder, never a half-deleted step_N.
    trash = path.with_name(f".deleting-{path.name}")
    shutil.rmtree(trash, ignore_errors=True)
    if path.exists():
        path.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
