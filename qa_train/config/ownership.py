"""What in an output dir is provably qa_train's own, for --overwrite_output_dir to remove; anything else stays.

A folder with a run's names (`final/`, `checkpoints/`, `wandb/`) may hold a user's files: `--output_dir .` in a
thesis folder, or a shared folder someone trains into. Each entry of a run is checked for the marks qa_train
leaves, and only what carries them goes: a checkpoint with its manifest and trainer state (the files the
manifest lists), an export's files beside its config and weights, the profiler's traces, W&B and TensorBoard runs
whose logged config is qa_train's. Everything else is kept, and named.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

# strategy/checkpoint.py's names (this floor may not import it; a test keeps them equal).
MANIFEST, STATE_FILE = "manifest.json", "trainer_state.json"
# Its transient folders: one being written (saving.save_checkpoint), deleted (checkpoint.delete_folder) or
# converted for another strategy (checkpoint.convert).
TRANSIENT_CHECKPOINT = re.compile(r"^\.(tmp|deleting|portable)-step_\d+$")
# What an export writes (strategy/saving.py: save_pretrained's config and weights, the tokenizer's files) and
# --save_best's best.json.
EXPORT_FILES = re.compile(
    r"^(config\.json|generation_config\.json|model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json"
    r"|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|added_tokens\.json|vocab\.(txt|json)"
    r"|merges\.txt|spiece\.model|sentencepiece\.bpe\.model|tokenizer\.model|chat_template\.jinja|best\.json)$"
)
PROFILER_TRACE = re.compile(r"^rank\d+\..*\.pt\.trace\.json(\.gz)?$")  # torch's tensorboard_trace_handler
# Every tracker's run config holds this key (Trainer._run_config): the mark of a qa_train run in their logs.
RUN_MARK = "qa_train_version"


@dataclass
class Owned:
    """Paths under an output dir: what is qa_train's (`remove`) and what is not (`keep`)."""

    remove: list[Path] = field(default_factory=list)
    keep: list[Path] = field(default_factory=list)

    def add(self, other: Owned) -> None:
        self.remove += other.remove
        self.keep += other.keep


def owned(entry: Path) -> Owned:
    """The qa_train files of one entry of an output dir (a RUN_FILES name or a leftover)."""
    folder = entry.is_dir() and not entry.is_symlink()  # a link is never followed
    rule = FOLDER_RULES.get(entry.name)
    if rule is not None:
        return rule(entry) if folder else Owned(keep=[entry])
    return Owned(keep=[entry]) if folder or entry.is_dir() else _own_file(entry)


def _own_file(path: Path) -> Owned:
    if path.name == "metrics.json" and not _mentions(path, RUN_MARK):  # a name many tools write
        return Owned(keep=[path])
    return Owned(remove=[path])


def _mentions(path: Path, text: str) -> bool:
    try:
        return text in path.read_text(errors="replace")
    except OSError:
        return False


def _export(folder: Path) -> Owned:
    """An export: config.json and safetensors weights; its own files go, anything else stays."""
    names = {p.name for p in folder.iterdir()}
    if not names:
        return Owned(remove=[folder])
    if "config.json" not in names or not any(n.endswith(".safetensors") for n in names):
        return Owned(keep=[folder])
    files = sorted(folder.iterdir())
    return Owned(
        remove=[p for p in files if p.is_file() and not p.is_symlink() and EXPORT_FILES.match(p.name)],
        keep=[p for p in files if not (p.is_file() and not p.is_symlink() and EXPORT_FILES.match(p.name))],
    )


def _checkpoints(folder: Path) -> Owned:
    found = Owned()
    for entry in sorted(folder.iterdir()):
        if entry.is_dir() and not entry.is_symlink() and TRANSIENT_CHECKPOINT.match(entry.name):
            found.remove.append(entry)
        elif entry.is_dir() and not entry.is_symlink():
            found.add(_checkpoint(entry))
        else:
            found.keep.append(entry)
    return found


def _checkpoint(folder: Path) -> Owned:
    """A checkpoint (step_N, or one set aside as step_N.abandoned): the files its manifest lists, and the manifest."""
    try:
        listed = json.loads((folder / MANIFEST).read_text())["files"]
        names = {str(name) for name in listed} | {MANIFEST}
    except (OSError, ValueError, KeyError, TypeError):
        return Owned(keep=[folder])
    if STATE_FILE not in names:
        return Owned(keep=[folder])
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() or p.is_symlink()]
    mine = [p for p in files if p.relative_to(folder).as_posix() in names and not p.is_symlink()]
    return Owned(remove=mine, keep=[p for p in files if p not in mine])


def _profile(folder: Path) -> Owned:
    files = sorted(folder.iterdir())
    ours = [p for p in files if p.is_file() and PROFILER_TRACE.match(p.name)]
    return Owned(remove=ours, keep=[p for p in files if p not in ours])


def _wandb(folder: Path) -> Owned:
    """W&B's runs (`run-*`, `offline-run-*`) whose debug log holds qa_train's config, and W&B's links into them."""
    found = Owned()
    entries = sorted(folder.iterdir())
    runs = [p for p in entries if p.is_dir() and not p.is_symlink() and re.match(r"^(offline-)?run-", p.name)]
    ours = [p for p in runs if _mentions(p / "logs" / "debug.log", RUN_MARK)]
    for entry in entries:
        if entry in ours:
            found.remove.append(entry)
        elif entry.is_symlink() and any(_points_into(entry, run) for run in ours):
            found.remove.append(entry)  # latest-run, debug.log, debug-internal.log
        else:
            found.keep.append(entry)
    return found


def _points_into(link: Path, folder: Path) -> bool:
    target = link.parent / link.readlink()
    return target == folder or folder in target.parents


def _tensorboard(folder: Path) -> Owned:
    """The TensorBoard tracker's event files, each holding qa_train's config as hyper-parameters
    (observe/trackers.py), or beside an hparams.yml that does (accelerate's own tracker wrote them there, still
    recognised); another experiment's event files in the same folder stay."""
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() or p.is_symlink()]
    marked = {p for p in files if not p.is_symlink() and p.name == "hparams.yml" and _mentions(p, RUN_MARK)}
    ours = [
        p
        for p in files
        if p in marked
        or (
            not p.is_symlink()
            and p.name.startswith("events.out.tfevents.")
            and (p.parent / "hparams.yml" in marked or _mentions(p, RUN_MARK))
        )
    ]
    if not ours:
        return Owned(keep=[folder])
    return Owned(remove=ours, keep=[p for p in files if p not in ours])


FOLDER_RULES = {
    "final": _export,
    "best": _export,
    ".tmp-final": lambda folder: Owned(remove=[folder]),  # an export's transient folder (saving.export_final)
    ".tmp-best": lambda folder: Owned(remove=[folder]),
    "checkpoints": _checkpoints,
    "profile": _profile,
    "wandb": _wandb,
    "tensorboard": _tensorboard,
}
