"""Resumable checkpoints: which are complete and usable, and resuming from one (what one records besides
accelerate's state, and which changes a resume may make, is qa_train.strategy.train_state).

A checkpoint (written by qa_train.strategy.saving) is complete only with its manifest, and usable only when every
file still has the size and, checked before a resume, the CRC32 the manifest records (`verify`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from qa_train.config.outputdir import STEP_FOLDER
from qa_train.core.errors import one_line
from qa_train.strategy.faults import failed_ranks, run_fault
from qa_train.strategy.train_state import (
    NewerCheckpoint,
    TrainerState,
    is_int,
    resume_conflicts,
    state_from_json,
)

log = logging.getLogger("qa_train")
STATE_FILE = "trainer_state.json"
MANIFEST = "manifest.json"
RNG_FILE = "random_states_{}.pkl"  # accelerate's name for one rank's RNG state


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from, said in one line that names it, by rank `reporter` (the one
    that knows why, where only some ranks failed)."""

    def __init__(self, message: str, reporter: int = 0) -> None:
        super().__init__(message)
        self.reporter = reporter


def read_state(path: Path) -> TrainerState:
    try:
        return state_from_json((path / STATE_FILE).read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path / STATE_FILE}: unreadable or invalid ({one_line(err)})") from None


def library_errors() -> tuple[type[BaseException], ...]:
    """What a checkpoint save or load can raise besides Exception: torch.distributed.checkpoint (FSDP's sharded
    state) wraps each rank's own error in CheckpointException, a BaseException."""
    from torch.distributed.checkpoint.api import CheckpointException

    return Exception, CheckpointException


def own_error(err: BaseException) -> BaseException:
    """The error behind a CheckpointException (its lowest failing rank's), else `err` itself."""
    failures = getattr(err, "failures", None)
    return failures[min(failures)][0] if isinstance(failures, dict) and failures else err


# --- finding and checking checkpoints ----------------------------------------------------------


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def step_folders(root: Path) -> list[Path]:
    """step_N folders, oldest first (temporary and trash folders never match STEP_FOLDER)."""
    if not root.is_dir():
        return []
    steps = {p: step for p in root.iterdir() if (step := _step_of(p)) is not None and p.is_dir()}
    return sorted(steps, key=steps.__getitem__)


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Finished checkpoints (trainer state and manifest present), oldest first; `verify` says if they are whole."""
    return [
        p for p in step_folders(checkpoint_root(output_dir)) if (p / STATE_FILE).is_file() and (p / MANIFEST).is_file()
    ]


def _read_manifest(path: Path) -> tuple[dict[str, int], dict[str, int]]:
    """The manifest's files with their sizes, and with their CRC32s (none in a format-1 manifest, written before
    2026-11-25); ValueError (or OSError) when it is not a manifest."""
    manifest = json.loads((path / MANIFEST).read_text())
    if not isinstance(manifest, dict):
        raise ValueError(f"a JSON {type(manifest).__name__}, not an object")
    files, crcs = manifest.get("files"), manifest.get("crc32", {})
    if not isinstance(files, dict) or not all(is_int(size) for size in files.values()):
        raise ValueError("no 'files' mapping of sizes")
    if not isinstance(crcs, dict) or not all(is_int(crc) for crc in crcs.values()):
        raise ValueError("its 'crc32' is not a mapping of checksums")
    outside = next((name for name in files if not _inside(name)), None)
    if outside is not None:  # the manifest names files of the checkpoint: reading /dev/zero would never end
        raise ValueError(f"{outside!r} is not a file inside the checkpoint")
    version = manifest.get("format", 1)
    if not is_int(version):
        raise ValueError(f"'format' is {version!r}, not a number")
    covered = set(crcs) == set(files) if version >= 2 else set(crcs) <= set(files)  # format 1: sizes only
    if not covered:
        raise ValueError("its 'crc32' does not cover exactly the files it lists")
    return files, crcs


def _inside(name: str) -> bool:
    return bool(name) and "\0" not in name and not name.startswith("/") and ".." not in name.split("/")


def file_crcs(folder: Path, names: list[str]) -> dict[str, int]:
    """CRC32 of each named file under `folder`, several files at a time: zlib and file reads release the GIL."""
    with ThreadPoolExecutor(max_workers=min(8, len(names) or 1)) as pool:
        return dict(zip(names, pool.map(lambda name: _crc32(folder / name), names)))


def _crc32(path: Path, chunk: int = 1 << 24) -> int:
    crc = 0
    with path.open("rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc


def _size_problem(path: Path, name: str, expected: int) -> str | None:
    if not path.is_file():
        return f"{name}: missing"
    size = path.stat().st_size
    return None if size == expected else f"{name}: {size} bytes, manifest says {expected}"


def verify(path: str | Path, contents: bool = False) -> str | None:
    """What makes `path` unusable as a checkpoint, in one line, or None when it is complete and whole. Sizes are
    checked always; with `contents`, the CRC32s too (reading every byte: for the checkpoint a resume loads)."""
    path = Path(path)
    if not path.is_dir():
        return f"no {STATE_FILE}: the folder does not exist"
    if not (path / STATE_FILE).is_file():
        return f"no {STATE_FILE}: not a complete qa_train checkpoint"
    if not (path / MANIFEST).is_file() and (path / "config.json").is_file():  # qa_train's hold no config.json
        return (
            f"a transformers Trainer checkpoint (config.json beside {STATE_FILE}, no {MANIFEST}): qa_train resumes "
            "only its own; to start from its weights, pass it as --model_name_or_path"
        )
    if not (path / MANIFEST).is_file():
        return f"no {MANIFEST}: incomplete (written by a run that was killed mid-save, or by an older qa_train?)"
    try:
        files, crcs = _read_manifest(path)
    except (OSError, ValueError) as err:
        return f"{MANIFEST}: unreadable or invalid ({one_line(err)})"
    problems = [p for name, size in files.items() if (p := _size_problem(path / name, name, size))]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return problems[0] + more
    try:
        state_from_json((path / STATE_FILE).read_text())
    except NewerCheckpoint as err:
        return f"{STATE_FILE}: {err}"
    except (OSError, ValueError) as err:
        return f"{STATE_FILE}: unreadable or invalid ({one_line(err)})"
    return _content_problem(path, crcs) if contents else None


def newer_format(path: Path) -> str | None:
    """Why a newer qa_train's checkpoint cannot be resumed here, or None: `latest` refuses it rather than skip back
    to an older checkpoint of the run, whose continuation would overwrite the newer one's."""
    try:
        state_from_json((path / STATE_FILE).read_text())
    except NewerCheckpoint as err:
        return f"{path / STATE_FILE}: {err}"
    except (OSError, ValueError):
        return None
    return None


def _content_problem(path: Path, crcs: dict[str, int]) -> str | None:
    # Damage at the same size (a bad disk, a faulty copy) reaches the library's loader otherwise: it loads
    # altered weights without a word, or fails on one rank inside a collective the others wait in until the
    # process group's timeout (FSDP's FULL_STATE_DICT broadcast).
    try:
        found = file_crcs(path, sorted(crcs))
    except OSError as err:
        return f"unreadable ({one_line(err)})"
    damaged = [name for name in sorted(crcs) if found[name] != crcs[name]]
    if not damaged:
        return None
    more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
    return f"{damaged[0]}: its contents differ from the manifest's CRC32 (damaged after it was written){more}"


def _newest_good_sibling(path: Path, before: int | None = None) -> Path | None:
    """The newest step folder next to `path` (older than step `before`, if given) that a resume would accept, its
    contents checked: one a refusal names must not be refused in turn."""
    for p in reversed(step_folders(path.parent)):
        if p != path and (before is None or (_step_of(p) or 0) < before) and verify(p, contents=True) is None:
            return p
    return None


def _step_of(path: Path) -> int | None:
    match = STEP_FOLDER.match(path.name)
    return int(match.group(1)) if match else None


# --- resume ------------------------------------------------------------------------------------


def agreed_resume(accelerator, spec: str | None, output_dir: str | Path) -> Path | None:
    """resolve_resume, contents checked, on the main process alone (every byte read once, not once per rank), its
    answer or its refusal sent to every rank."""
    if spec is None:  # every rank knows: no collective
        return None
    answer: list[tuple[str, str | None]] = [("path", None)]
    crash: Exception | None = None
    if accelerator.is_main_process:
        try:
            path = resolve_resume(spec, output_dir, contents=True)
            answer = [("path", None if path is None else str(path))]
        except CheckpointError as err:
            answer = [("refused", str(err))]
        except OSError as err:  # unreadable (permissions, a vanished file system): the user's to fix
            answer = [("refused", f"--resume_from_checkpoint {spec}: could not be checked ({one_line(err)})")]
        except Exception as err:  # a bug: its traceback on the main process, but no rank left waiting below
            crash, answer = err, [("refused", "the main process failed while checking the checkpoint")]
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(answer)
    if crash is not None:
        raise crash
    kind, value = answer[0]
    if kind == "refused":
        raise CheckpointError(str(value))
    return None if value is None else Path(value)


def resolve_resume(spec: str | None, output_dir: str | Path, contents: bool = False) -> Path | None:
    """The checkpoint to resume from, or None for a fresh start (on the main process: see agreed_resume).

    'latest' is the newest usable checkpoint in output_dir: damaged ones are skipped with a warning. An explicit
    path must be usable: CheckpointError. `contents`: see verify.
    """
    if spec is None:
        return None
    if spec == "latest":
        newer = next(filter(None, map(newer_format, step_folders(checkpoint_root(output_dir)))), None)
        if newer:
            raise CheckpointError(f"--resume_from_checkpoint latest: {newer}")
        latest = latest_usable(checkpoint_root(output_dir), warn=True, contents=contents)
        if latest is not None:
            _check_trusted(latest)
        return latest
    path = Path(spec)
    problem = verify(path, contents)
    if problem is None:
        _check_trusted(path)
        return path
    good = _newest_good_sibling(path)
    instead = f"the newest good checkpoint there is {good}" if good else f"there is no good checkpoint in {path.parent}"
    raise CheckpointError(f"--resume_from_checkpoint {path}: {problem}; {instead}")


def peek(spec: str | None, output_dir: str | Path) -> tuple[Path, TrainerState] | None:
    """The checkpoint resolve_resume would likely pick and its trainer state, by sizes alone and without a word:
    None where there is none or it would be refused (said later, on the main process, with its contents checked)."""
    try:
        if spec == "latest":
            path = latest_usable(checkpoint_root(output_dir), warn=False)
        else:
            path = Path(spec) if spec is not None and verify(Path(spec)) is None else None
        return None if path is None else (path, read_state(path))
    except (OSError, CheckpointError):
        return None


def _check_trusted(path: Path) -> None:
    """The loaders unpickle a checkpoint (DeepSpeed's model states, accelerate's optimizer and RNG files), which runs
    any code planted in it: it must be this user's, and writable by no one else, folder and every file. Neither
    library checks; a pickle cannot be made safe to load, so who could have written it is what can be checked."""
    problem = untrusted(path)
    if problem:
        raise CheckpointError(
            f"--resume_from_checkpoint {path}: {problem}; loading a checkpoint runs the code it may hold (pickle): "
            "resume only from your own, or copy one you trust"
        )


def untrusted(path: Path) -> str | None:
    """Why `path` may hold code planted by someone else (_check_trusted), or None."""
    me = os.geteuid()
    for entry in (path, *sorted(path.rglob("*"))):
        st = entry.lstat()
        if st.st_uid != me:
            return f"{entry} is owned by uid {st.st_uid}, not you (uid {me})"
        if st.st_mode & stat.S_IWOTH and not stat.S_ISLNK(st.st_mode):
            return f"{entry} is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def newest_usable(root: Path, contents: bool = False) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint under `root` that verifies, or None; and the newer ones skipped, with why."""
    skipped: list[tuple[Path, str]] = []
    for path in reversed(step_folders(root)):
        problem = verify(path, contents)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


def latest_usable(root: Path, warn: bool, contents: bool = False) -> Path | None:
    chosen, skipped = newest_usable(root, contents)
    if warn:
        instead = (
            f"resuming from {chosen} instead"
            if chosen
            else "no usable checkpoint left: starting from scratch (the damaged ones are kept)"
        )
        for path, problem in skipped:
            log.warning("checkpoint %s skipped: %s; %s", path, problem, instead)
    return chosen


def set_aside_later(path: Path, output_dir: str | Path) -> list[Path]:
    """Resuming from `path` abandons the checkpoints after it in output_dir: left as step_N, `latest` and
    rotation would prefer them to the resumed run's own, and the resumed run's save of the same step would replace
    them (a damaged one too: it is this run's). Renamed (main process), never deleted."""
    step = _step_of(path)
    if step is None or path.parent.resolve() != checkpoint_root(output_dir).resolve():
        return []
    moved = []
    for later in step_folders(path.parent):
        if (_step_of(later) or 0) > step:
            moved.append(move_aside(later, "abandoned"))
    if moved:
        log.warning(
            "resuming from %s: the later checkpoints belong to the continuation it abandons; moved "
            "aside, not deleted: %s",
            path,
            ", ".join(str(m) for m in moved),
        )
    return moved


def load_checkpoint(accelerator, path: Path, now: TrainerState | None = None, checked: bool = False) -> TrainerState:
    """Restore everything save_checkpoint wrote; with `now`, refuse a checkpoint this run cannot continue first
    (unless `checked`: check_contract has passed it already).

    Checkpoints must be trusted: DeepSpeed's loader unpickles them (torch.load with weights_only=False).
    """
    saved = read_state(path)
    if now is not None and not checked:
        check_contract(accelerator, path, saved, now)
    agreed(accelerator, path, lambda: accelerator.load_state(str(path)))
    if saved.world_size in (None, accelerator.num_processes):  # another world size has other ranks' RNG: not carried
        _warn_on_rng(path, accelerator.process_index)
    return saved if now is None else replace(saved, **now.contract())


def agreed(accelerator, path: Path, work: Callable[[], object] | None, doing: str = "loaded") -> None:
    """This rank's part of loading `path` (None: nothing to do here), then agreement: a rank's own files (its ZeRO
    optimizer shard) can fail where the others load, so every rank learns which failed and all refuse the
    checkpoint together. Alone, the failed rank left the others to meet it at the next collective (a "connection
    closed by peer" traceback, or a hang), and its reason was never said (only rank 0 speaks)."""
    error = None
    if work is not None:
        try:
            work()
        except library_errors() as err:  # corrupt content: SafetensorError, RuntimeError, pickle errors, DCP's ...
            error = own_error(err)
            if run_fault(error):
                raise error from err  # not the checkpoint's fault: exit 7 or 6, as anywhere else in the run
    failed = failed_ranks(accelerator, error is not None)
    if failed:
        rank = accelerator.process_index
        message = (
            _load_failure(path, error, rank if accelerator.num_processes > 1 else None, doing)
            if rank == failed[0] and error is not None  # failed[0] is this rank only when its own load failed
            else f"checkpoint {path} could not be {doing}: rank {failed[0]} failed"
        )
        raise CheckpointError(message, reporter=failed[0]) from error


def check_contract(
    accelerator, path: Path, saved: TrainerState, now: TrainerState, allow_global_batch_change: bool = False
) -> None:
    """Refuse, before anything is loaded, what this run cannot continue (another model shape, tokenizer or global
    batch, ...): a library's loader would otherwise fail deep inside, misleadingly. The main process says the rest."""
    refusals, notes = resume_conflicts(saved, now, allow_global_batch_change)
    if refusals:
        raise CheckpointError(f"--resume_from_checkpoint {path}: cannot continue it: {'; '.join(refusals)}")
    if accelerator.is_main_process:
        for note in notes:
            log.warning("resuming from %s: %s", path, note)


def conversion_reason(saved: TrainerState, now: TrainerState) -> str | None:
    """Why the library cannot load `saved` under this run's strategy itself, or None (it can: load_checkpoint).
    accelerate's single/DDP files hold whole tensors and FSDP's are resharded by torch.distributed.checkpoint, at
    any world size; DeepSpeed's partitions are made whole by qa_train (strategy.zero_files). Unknown layouts
    (checkpoints before the field) are left to the library, as before."""
    was, now_is = saved.checkpoint_layout, now.checkpoint_layout
    if was is None or now_is is None:
        return None
    if was != now_is:
        return f"saved as {was}, loaded as {now_is}"
    if saved.world_size not in (None, now.world_size) and was.startswith("DeepSpeed"):
        return f"DeepSpeed partitions its optimizer state per process, {saved.world_size} -> {now.world_size}"
    return None


def convert(accelerator, path: Path, shapes: dict[str, tuple[int, ...]], output_dir: str | Path) -> Path:
    """`path` in qa_train's portable layout (qa_train.strategy.portable), written by the main process into this
    run's checkpoints folder (a hidden name that neither `latest` nor rotation sees); every rank gets the folder
    once it is complete, or a CheckpointError."""
    from qa_train.strategy import portable

    out = checkpoint_root(output_dir) / f".portable-{path.name}"
    took: list[float] = []
    work = (lambda: took.append(portable.convert(path, shapes, out))) if accelerator.is_main_process else None
    agreed(accelerator, path, work, doing="converted")
    if took:
        log.info("converted %s to the portable layout in %s (%.1f s)", path, out, took[0])
    return out


def discard(accelerator, folder: Path) -> None:
    """The portable folder once every rank has loaded it."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.rmtree(folder, ignore_errors=True)


def _load_failure(path: Path, err: BaseException, rank: int | None = None, doing: str = "loaded") -> str:
    step = _step_of(path)
    earlier = _newest_good_sibling(path, before=step)
    hint = (
        f"if it is damaged, resume from the previous complete checkpoint: --resume_from_checkpoint {earlier}"
        if earlier
        else f"there is no earlier complete checkpoint in {path.parent}"
    )
    who = f"rank {rank}: " if rank is not None else ""
    if "size mismatch" in str(err):  # torch's load_state_dict, for a checkpoint older than its model_shape record
        hint = (
            "its tensors have other shapes than this run's model: it is a checkpoint of another model; resume with "
            "the --config_name or --model_name_or_path that wrote it"
        )
    return f"checkpoint {path} could not be {doing}: {who}{one_line(err)}; {hint}"


def _warn_on_rng(path: Path, process_index: int) -> None:
    """accelerate loads a rank's RNG file inside `except Exception: logger.info(...)` and goes on: say so."""
    rng = path / RNG_FILE.format(process_index)
    problem = _rng_problem(rng)
    if problem:
        log.warning(
            "%s: %s; this rank goes on with the RNG seeded at start-up, so dropout differs from an "
            "uninterrupted run (the resume is not bit-exact)",
            rng,
            problem,
        )


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
    """Rename step_N to step_N.<suffix> (no longer a step folder: neither `latest` nor rotation sees it), or
    step_N.<suffix>-2, -3, ... beside an earlier one of that name, which is set aside too, never replaced."""
    aside = path.with_name(f"{path.name}.{suffix}")
    n = 1
    while aside.exists() or aside.is_symlink():
        n += 1
        aside = path.with_name(f"{path.name}.{suffix}-{n}")
    path.rename(aside)
    return aside


def delete_folder(path: Path) -> None:
    # Renamed first, so a kill mid-delete leaves a trash folder, never a half-deleted step_N.
    trash = path.with_name(f".deleting-{path.name}")
    shutil.rmtree(trash, ignore_errors=True)
    if path.exists():
        path.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
