"""The output-dir contract, checked before any data or model work: never write over a run by accident.

As in transformers: a directory that holds a run is refused unless `--overwrite_output_dir` (which
removes that run's files, once the new run's flags, data, model and the checkpoint it resumes have passed their
checks) or `--resume_from_checkpoint` (which continues it).
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from qa_train.config.dirlock import DirLock, hold
from qa_train.config.ownership import Owned, owned
from qa_train.config.settings import TRACKERS, ConfigError, OutputArgs
from qa_train.core.preemption import PREEMPT_FILE

# What a qa_train run leaves in its output_dir; anything else there (a user's notes, logs/) is left alone.
# evaluation.write_answers names the answers files, and each tracker writes to output_dir/<its name>.
RUN_FILES = (
    "metrics.json",
    "final",
    "best",
    "checkpoints",
    "train_log.jsonl",
    "eval_predictions.json",
    "eval_null_odds.json",
    "predict_predictions.json",
    "predict_nbest_predictions.json",
    "predict_null_odds.json",
    "profile",
    *TRACKERS,
)
# Never a run by themselves, but a stale one would act on the next run: a stop request nobody answered (the new run
# would stop at its first logging step), the test hook's hold marks, and what an interrupted atomic write or export
# left (recorder.atomic_write_text, saving.export_final). Cleared with the run they belong to.
LEFTOVERS = (PREEMPT_FILE, "HOLDING-rank*", ".*.json.tmp", ".*.jsonl.tmp", ".tmp-final", ".tmp-best")
# A checkpoint's folder, step_N (strategy.checkpoint reads N from it): here, as the output dir is checked before
# torch is imported.
STEP_FOLDER = re.compile(r"^step_(\d+)$")
# Folders the export replaces whole (saving.export_final, best.promote): a file of the user's there would go with them.
REPLACED = ("final", "best")


@dataclass
class Cleared:
    """What --overwrite_output_dir did: the old run's entries it removed (or emptied of qa_train's files), and
    the paths it kept there because they are not provably qa_train's (relative to output_dir)."""

    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def run_files(output_dir: Path) -> list[str]:
    return [name for name in RUN_FILES if (output_dir / name).exists()]


def leftovers(output_dir: Path) -> list[str]:
    return sorted({p.name for pattern in LEFTOVERS for p in output_dir.glob(pattern)})


def check_writable(output_dir: Path) -> None:
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--output_dir {output_dir}: not writable ({err.strerror or err})") from None
    if (why := unwritable(output_dir)) is not None:
        raise ConfigError(f"--output_dir {output_dir}: not writable ({why})")


def unwritable(folder: Path) -> str | None:
    """Why no file can be made in `folder`, or None. A file really made there, not os.access: that says yes to root
    where nothing can be made (/sys, /proc)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".qa_train-probe-"):
            pass
    except OSError as err:
        return err.strerror or str(err)
    return None


def check_output_folder(output_dir: str | Path, flag: str = "--output_dir") -> None:
    """A folder a command makes (if need be) and writes: refused in one line before any work when it is a file,
    lies under one, or cannot be written."""
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {output_dir}: is a file, not a directory")
    _check_nearest_folder(path, flag, output_dir)


def check_output_file(output: str | Path, flag: str) -> None:
    """A file a command writes (its missing folders made): refused as check_output_folder refuses a folder, and when
    it is a folder itself."""
    path = Path(output)
    if path.is_dir():
        raise ConfigError(f"{flag} {output}: is a directory, not a file")
    _check_nearest_folder(path.parent, flag, output)


def _check_nearest_folder(path: Path, flag: str, given: str | Path) -> None:
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"{flag} {given}: {existing} is a file, not a directory")
    if (why := unwritable(existing)) is not None:
        raise ConfigError(f"{flag} {given}: {existing} is not writable ({why})")


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def claim(output: OutputArgs, lock: bool = False, sources: Mapping[str, str] | None = None) -> DirLock | None:
    """Refuse an occupied or unwritable output_dir, or with `lock` (the run's first process) one that another run
    holds; returns the held lock. Nothing is removed here: --overwrite_output_dir's clearing waits for
    `clear_previous_run`, after the data is read, the model loaded and the resume checked, so a refused record or
    checkpoint cannot cost the old run. `sources` ({flag: path or name}, TrainArgs.sources) must not lie inside
    what that clearing removes."""
    out = Path(output.output_dir)
    check_writable(out)
    held = hold(out) if lock else None  # before the contents are read: a live run may be writing them
    try:
        found = run_files(out)
        _check_occupied(output, found)
        _check_sources(output, found, sources or {})
    except ConfigError:
        if held is not None:
            held.release()
        raise
    return held


def _check_occupied(output: OutputArgs, found: list[str]) -> None:
    out = Path(output.output_dir)
    for name in REPLACED:
        foreign = owned(out / name).keep if name in found else []
        if foreign == [out / name] and foreign[0].is_dir():  # not an export at all: what is in it
            foreign = sorted(foreign[0].iterdir())
        if foreign:
            raise ConfigError(
                f"--output_dir {out}: {name}/ holds what qa_train did not write ({_listed(out, foreign)}), and a "
                f"run replaces that folder whole; move it, or choose another --output_dir"
            )
    if "metrics.json" in found and owned(out / "metrics.json").keep:  # a name many tools write
        raise ConfigError(
            f"--output_dir {out}: metrics.json is not qa_train's (it names no qa_train_version), and a run writes "
            "its own there; move it, or choose another --output_dir"
        )
    resume = output.resume_from_checkpoint
    # With --overwrite_output_dir, a run the resume would not continue goes (`replaces`) once all is checked.
    if found and not output.overwrite_output_dir and not continues(output, found):
        if resume is None:
            raise ConfigError(
                f"--output_dir {out}: holds a run ({', '.join(found)}); pass --overwrite_output_dir "
                "to replace it, or --resume_from_checkpoint latest to continue it"
            )
        if resume == "latest":
            raise ConfigError(
                f"--output_dir {out}: holds a run without checkpoints ({', '.join(found)}), so "
                "--resume_from_checkpoint latest would start over on top of it; pass "
                "--overwrite_output_dir"
            )
        raise ConfigError(
            f"--output_dir {out}: holds another run ({', '.join(found)}) than the one in "
            f"--resume_from_checkpoint {resume}; choose an empty --output_dir or --overwrite_output_dir"
        )


def _check_sources(output: OutputArgs, found: list[str], sources: Mapping[str, str]) -> None:
    """The old run goes before the new one trains: a model (its final/ or best/), tokenizer or data file read from
    inside it would be lost with it if the new run then failed (diverged, ran out of memory, was preempted)."""
    out = Path(output.output_dir)
    if not replaces(output, found):
        return
    for flag, value in sources.items():
        path = Path(value)
        if not path.exists():  # a hub name
            continue
        for name in found:
            if _inside(path, out / name):
                raise ConfigError(
                    f"{flag} {value}: is inside the run in --output_dir {out} ({name}), which "
                    "--overwrite_output_dir removes before this run trains; copy it elsewhere first, or choose "
                    "another --output_dir"
                )


def continues(output: OutputArgs, found: list[str]) -> bool:
    """Whether --resume_from_checkpoint continues the run in output_dir (`found`: its run files): `latest` with
    checkpoints there, or a checkpoint inside it."""
    resume = output.resume_from_checkpoint
    if resume is None:
        return False
    if resume == "latest":
        return "checkpoints" in found and _holds_checkpoints(Path(output.output_dir) / "checkpoints")
    return _inside(Path(resume), Path(output.output_dir))


def _holds_checkpoints(root: Path) -> bool:
    """Whether checkpoints/ holds a step_N folder (a damaged one too: `latest` warns about it and keeps it). A save
    that failed before any succeeded leaves the folder empty: nothing there to continue."""
    try:
        return any(STEP_FOLDER.match(p.name) and p.is_dir() for p in root.iterdir())
    except OSError:
        return False


def replaces(output: OutputArgs, found: list[str]) -> bool:
    """--overwrite_output_dir replaces the run in output_dir unless the resume continues it. A requeued job that
    passes both flags thus resumes, and the overwrite is not silently dropped where there is nothing of this
    folder to resume."""
    return output.overwrite_output_dir and not continues(output, found)


def clear_previous_run(output: OutputArgs, is_main: bool) -> Cleared:
    """--overwrite_output_dir: the main process removes the old run's files, those provably qa_train's own
    (config/ownership.py); anything else stays, and is named in what this returns on every rank."""
    out = Path(output.output_dir)
    if not replaces(output, run_files(out)):
        return Cleared()
    plan, cleared = Owned(), Cleared()
    for name in [*run_files(out), *leftovers(out)]:
        found = owned(out / name)
        plan.add(found)
        if found.remove:
            cleared.removed.append(name)
    if is_main:
        for path in plan.remove:
            remove_entry(path)
            _prune_emptied(path.parent, out)
    cleared.kept = [p.relative_to(out).as_posix() for p in plan.keep]
    return cleared


def _prune_emptied(folder: Path, top: Path) -> None:
    """Remove `folder` and its parents below `top` while removing files left them empty."""
    while folder != top and top in folder.parents:
        try:
            folder.rmdir()
        except OSError:  # not empty: something that stays is in it
            return
        folder = folder.parent


def _listed(top: Path, paths: list[Path], shown: int = 3) -> str:
    names = [p.relative_to(top).as_posix() for p in paths]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def remove(folder: Path, names: list[str]) -> None:
    """Delete these entries of `folder`."""
    for name in names:
        remove_entry(folder / name)


def remove_entry(target: Path) -> None:
    """Delete a file or a folder with its contents; a link, not what it points to; nothing if it is absent."""
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
