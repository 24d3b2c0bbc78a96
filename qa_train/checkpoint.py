"""Resumable checkpoints and the final export, both atomic under every strategy.

A checkpoint is written under a temporary name by all ranks (DeepSpeed and FSDP write shards); the
main process then writes trainer_state.json, then manifest.json (every file and its size), and
renames the folder once every rank has finished. A checkpoint is complete only with its manifest,
and usable only when every file still has the size the manifest records (`verify`). A save that fails on any
rank (a full disk) fails on every rank as CheckpointSaveError, and its temporary folder is removed.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

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
    """A checkpoint that cannot be resumed from, said in one line that names it."""


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
        raise CheckpointError(f"{path / STATE_FILE}: unreadable or invalid ({_one_line(err)})") from None


def _one_line(err: BaseException, limit: int = 300) -> str:
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


def _write_manifest(folder: Path) -> None:
    # Sizes, not hashes: hashing GBs of optimizer state would add seconds to every save, and the failure
    # that happens is truncation (a full disk, a kill or a lost node mid-write), which sizes catch.
    files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    (folder / MANIFEST).write_text(json.dumps({"format": 1, "files": files}, indent=1))


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
        return f"{MANIFEST}: unreadable or invalid ({_one_line(err)})"
    problems = [p for name, size in files.items() if (p := _size_problem(path / name, name, size))]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return problems[0] + more
    try:
        state_from_json((path / STATE_FILE).read_text())
    except (OSError, ValueError) as err:
        return f"{STATE_FILE}: unreadable or invalid ({_one_line(err)})"
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
        return _latest_usable(checkpoint_root(output_dir), warn)
    path = Path(spec)
    problem = verify(path)
    if problem is None:
        return path
    good = _good_siblings(path)
    instead = (f"the newest good checkpoint there is {good[0]}" if good
               else f"there is no good checkpoint in {path.parent}")
    raise CheckpointError(f"--resume_from_checkpoint {path}: {problem}; {instead}")


def _latest_usable(root: Path, warn: bool) -> Path | None:
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
            moved.append(_move_aside(later, "abandoned"))
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
    try:
        accelerator.load_state(str(path))
    except Exception as err:  # corrupt content surfaces as SafetensorError, RuntimeError, pickle errors, ...
        if isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError":
            raise  # not the checkpoint's fault
        raise CheckpointError(_load_failure(path, err)) from err
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


def _load_failure(path: Path, err: Exception) -> str:
    step = _step_of(path)
    earlier = [p for p in _good_siblings(path) if step is None or (_step_of(p) or 0) < step]
    hint = (f"if it is damaged, resume from the previous complete checkpoint: --resume_from_checkpoint {earlier[0]}"
            if earlier else f"there is no earlier complete checkpoint in {path.parent}")
    return f"checkpoint {path} could not be loaded: {_one_line(err)}; {hint}"


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
        return f"unreadable ({_one_line(err)})"
    needed = ["random_state", "numpy_random_seed", "torch_manual_seed"]
    needed += ["torch_cuda_manual_seed"] if torch.cuda.is_available() else []
    missing = [key for key in needed if not isinstance(states, dict) or key not in states]
    return f"lacks {', '.join(missing)}" if missing else None


# --- save --------------------------------------------------------------------------------------


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (a full disk above all). Raised on every rank alike, so none waits at a
    barrier for a rank that stopped; the partial folder is removed and earlier checkpoints are untouched.

    Only the rank that failed knows why, so the lowest failing rank says it (`reporter`), with its rank in
    the line: carrying the text to rank 0 would need a gather of strings for nothing but one print.
    """

    def __init__(self, message: str, reporter: int) -> None:
        super().__init__(message)
        self.reporter = reporter


# A full disk or quota: the user's to fix by freeing space (__main__ also maps them anywhere else in a run).
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)


def save_checkpoint(accelerator, output_dir: str | Path, state: TrainerState, keep: int | None) -> Path:
    """Write step_N as the module docstring says; CheckpointSaveError on every rank when any rank's part fails."""
    root = checkpoint_root(output_dir)
    final = root / f"step_{state.completed_steps:08d}"
    tmp = root / f".tmp-step_{state.completed_steps:08d}"
    main = accelerator.is_main_process
    # Each phase ends with every rank learning which ranks failed: that exchange is also the phase's barrier.
    _phase(accelerator, final, tmp, (lambda: _fresh(tmp)) if main else None)
    _phase(accelerator, final, tmp, lambda: accelerator.save_state(str(tmp)))
    _phase(accelerator, final, tmp, (lambda: _complete(tmp, final, state, output_dir, keep)) if main else None)
    return final


def _fresh(tmp: Path) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)


def _complete(tmp: Path, final: Path, state: TrainerState, output_dir: str | Path, keep: int | None) -> None:
    (tmp / STATE_FILE).write_text(json.dumps(asdict(state)))
    _write_manifest(tmp)  # last: only now is the folder complete
    _replace(tmp, final, state.run_id)
    _rotate(output_dir, keep, state.run_id, final)
    log.info("checkpoint saved: %s", final)


def _phase(accelerator, final: Path, tmp: Path, work: Callable[[], object] | None) -> None:
    """This rank's part of a save (None: nothing to do here), then agreement: if any rank failed, the main
    process removes `tmp` (the space it holds is what a full disk needs back) and every rank raises."""
    error = None
    if work is not None:
        try:
            work()
        except Exception as err:  # a full disk: OSError, or torch's RuntimeError, or safetensors' own error
            error = err
    reason = _failure_reason(error, tmp.parent) if error is not None else None  # before the removal frees space
    failed = _failed_ranks(accelerator, error is not None)
    if not failed:
        return
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    rank = accelerator.process_index
    message = (_save_failure(final, reason, error, rank, failed, accelerator.num_processes) if rank == failed[0]
               else f"checkpoint {final} could not be saved: rank {failed[0]} failed")
    raise CheckpointSaveError(message, reporter=failed[0]) from error


def _failed_ranks(accelerator, failed: bool) -> list[int]:
    """The ranks whose part failed, the same list on every rank: one sum over a flag per rank."""
    import torch

    flags = torch.zeros(accelerator.num_processes, device=accelerator.device)
    flags[accelerator.process_index] = float(failed)
    total = accelerator.reduce(flags, reduction="sum")
    return [rank for rank, flag in enumerate(total.tolist()) if flag > 0]


def _failure_reason(err: Exception, root: Path) -> str:
    if isinstance(err, OSError):
        return _one_line(err)  # names errno's text and, for most calls, the file
    # torch's zip writer says only "unexpected pos ..." on a full disk: the free space tells.
    try:
        free = f" ({shutil.disk_usage(root).free / 2**30:.2f} GiB free in {root})"
    except OSError:
        free = ""
    return _one_line(err) + free


def _save_failure(final: Path, reason: str, err: Exception, rank: int, failed: list[int], world: int) -> str:
    others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    who = f"rank {rank}{others}: " if world > 1 else ""
    kept = _latest_usable(final.parent, warn=False)
    intact = f"the newest complete checkpoint, {kept}, is intact" if kept else "no earlier complete checkpoint exists"
    return (f"checkpoint {final} could not be saved: {who}{reason}; its partial folder is removed and {intact}; "
            f"{_fix(err)}, then rerun with --resume_from_checkpoint latest")


def _fix(err: Exception) -> str:
    if not isinstance(err, OSError):
        return "free space (if that is the cause)"  # torch and safetensors hide the errno
    return "free space" if err.errno in OUT_OF_SPACE else "fix that"


def _run_id_of(path: Path) -> str | None:
    try:
        return json.loads((path / STATE_FILE).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def _replace(tmp: Path, final: Path, run_id: str) -> None:
    """Rename tmp to final. The same step saved twice by this run (e.g. preemption right after a periodic
    save) replaces the old folder; another run's folder at that name is moved aside, never deleted."""
    if final.exists():
        other = _run_id_of(final)
        if other == run_id:
            _delete(final)
        else:
            aside = _move_aside(final, f"run-{(other or 'unknown')[:8]}")
            log.warning("%s belonged to another run (%s): moved to %s, not deleted", final, other or "unknown", aside)
    tmp.rename(final)


def _move_aside(path: Path, suffix: str) -> Path:
    """Rename step_N to step_N.<suffix> (no longer a step folder: neither `latest` nor rotation sees it),
    replacing an earlier one of that name."""
    aside = path.with_name(f"{path.name}.{suffix}")
    _delete(aside)
    path.rename(aside)
    return aside


def _delete(path: Path) -> None:
    # Renamed first, so a kill mid-delete leaves a trash folder, never a half-deleted step_N.
    trash = path.with_name(f".deleting-{path.name}")
    shutil.rmtree(trash, ignore_errors=True)
    if path.exists():
        path.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)


def _rotate(output_dir: str | Path, keep: int | None, run_id: str, just_written: Path | None = None) -> None:
    """Keep this run's newest `keep` whole checkpoints (always including `just_written`); delete its older ones.

    Another run's checkpoints, older formats without a run_id, and damaged ones are never deleted, and
    damaged ones do not count towards `keep`.
    """
    if keep is None:
        return
    ours = [p for p in complete_checkpoints(output_dir)
            if p != just_written and _run_id_of(p) == run_id and verify(p) is None]
    room = keep - 1 if just_written is not None else keep
    for old in ours[:max(len(ours) - room, 0)]:
        _delete(old)


# --- export ------------------------------------------------------------------------------------


def export_final(accelerator, model, tokenizer, final: Path) -> Path:
    """Full consolidated weights + tokenizer in `final` (output_dir/final or /best), loadable by from_pretrained.

    get_state_dict gathers ZeRO-3 partitions (16-bit, rank 0 only) and FSDP shards; saving the
    unwrapped model without it would write placeholders under ZeRO-3.
    """
    tmp = final.with_name(f".tmp-{final.name}")
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        _clear(tmp)
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        # save_pretrained only logs (and writes nothing) when its target is not a folder.
        if not any(tmp.glob("*.safetensors")):
            raise OSError(f"{tmp}: no weights were written")
        _share_like_umask(tmp)
        _clear(final)
        tmp.rename(final)
        log.info("model exported: %s", final)
    accelerator.wait_for_everyone()
    return final


def _clear(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _share_like_umask(folder: Path) -> None:
    """Files as the umask allows (usually group- and world-readable): some writers create them 0600,
    and an exported model is meant to be read by others on a shared file system."""
    umask = os.umask(0)
    os.umask(umask)
    for f in folder.rglob("*"):
        if f.is_file():
            f.chmod(0o666 & ~umask)
