"""A split of a dataset on the hub, or in a local folder the hub's way (a download of the repo, a parquet folder,
`save_to_disk`'s output), with every failure of `datasets` or the hub as one DataError line naming the flag.

datasets reports an offline hub as a 34-line traceback ending in ConnectionError, a mistyped folder as
FileNotFoundError and a wrong config or split as ValueError; the model's flags already fail in one line with
exit 2, and so do these, before any model work.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qa_train.core.errors import one_line
from qa_train.data.records import DataError

# The flag that gives each split from a local file instead.
SPLIT_FLAGS = {"train": "--train_file", "validation": "--validation_file"}
RECIPE = "docs/training.md, 'SQuAD on a machine without the hub'"


@dataclass(frozen=True)
class HubDataset:
    """Where a hub split comes from: --dataset_name (a hub id or a local folder), --dataset_config_name, and the
    hub flags it shares with the model (--cache_dir, --token)."""

    name: str
    config_name: str | None = None
    cache_dir: str | None = None
    token: str | None = None


def looks_local(name: str) -> bool:
    """A folder rather than a hub id ("name" or "org/name"): one that exists, one written as a path, or org/name whose
    org is a folder here (a mistyped `data/squad` would otherwise be asked of the hub)."""
    path = Path(name).expanduser()
    written_as_path = name.startswith(("/", "./", "../", "~")) or name.count("/") > 1
    return path.exists() or written_as_path or (path.parent != Path(".") and path.parent.is_dir())


def folder_fingerprint(source: HubDataset, split: str) -> str | None:
    """A local folder's split by its files' bytes, or None for a hub id or save_to_disk's output (whose own
    fingerprint travels with it). datasets fingerprints a folder by its files' paths and times, so a copy (a job
    staging its data on node-local disk) read as other data and a mid-epoch resume from it was refused."""
    folder = Path(source.name).expanduser()
    if not looks_local(source.name) or not folder.is_dir() or (folder / "dataset_dict.json").is_file():
        return None
    digest = hashlib.sha256(f"{source.config_name}\0{split}".encode())
    # Hidden paths are a download tool's metadata (huggingface-cli's .cache/ holds times), not the data.
    files = (
        f for f in folder.rglob("*") if f.is_file() and not any(p.startswith(".") for p in f.relative_to(folder).parts)
    )
    for path in sorted(files):
        digest.update(f"\0{path.relative_to(folder).as_posix()}\0".encode())
        with path.open("rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def open_split(source: HubDataset, split: str) -> Any:
    """The split as a `datasets.Dataset`; DataError, in one line, for anything that keeps it from loading."""
    name = source.name
    if looks_local(name):
        folder = Path(name).expanduser()
        if not folder.is_dir():
            what = "is a file, not a dataset folder" if folder.exists() else "no such folder"
            raise DataError(f"--dataset_name {name}: {what} (a hub dataset is named name or org/name)")
        if (folder / "dataset_dict.json").is_file():  # datasets' save_to_disk output
            return _saved_split(source, folder, split)
    import datasets

    # datasets warns about the cache it falls back on before failing: the refusal is the one line a user gets.
    level = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity_error()
    try:
        if looks_local(name):
            # datasets' cache serves a folder's old records after its files change (huggingface/datasets#2956): a
            # local folder is built afresh, in memory, which costs less than reading its records does.
            with tempfile.TemporaryDirectory(prefix="qa_train-datasets-") as build:
                return datasets.load_dataset(
                    name, source.config_name, split=split, cache_dir=build, keep_in_memory=True
                )
        return datasets.load_dataset(
            name, source.config_name, split=split, cache_dir=source.cache_dir, token=source.token
        )
    except Exception as err:  # noqa: BLE001 - every library failure becomes the flag's one line
        raise DataError(refusal(err, source, split)) from None
    finally:
        datasets.logging.set_verbosity(level)


def _saved_split(source: HubDataset, folder: Path, split: str) -> Any:
    import datasets

    if source.config_name is not None:
        raise DataError(
            f"--dataset_config_name {source.config_name}: {folder} is save_to_disk's output, which has no configs "
            "(the config was chosen when it was saved): drop the flag"
        )
    try:
        splits = datasets.load_from_disk(str(folder))
    except Exception as err:  # noqa: BLE001 - a damaged or foreign folder
        raise DataError(
            f"--dataset_name {source.name}: cannot be read by datasets.load_from_disk ({one_line(err)})"
        ) from None
    if split not in splits:
        raise DataError(_missing_split(source, split, list(splits)))
    return splits[split]


def _missing_split(source: HubDataset, split: str, present: list[str]) -> str:
    instead = SPLIT_FLAGS.get(split, "a local file")
    return (
        f"--dataset_name {source.name}: has no {split!r} split (it has {', '.join(present) or 'none'}); "
        f"give that split as {instead}"
    )


def offline() -> bool:
    flags = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in flags)


def refusal(err: BaseException, source: HubDataset, split: str) -> str:
    """datasets' and the hub's failures, by type and text (the library has no finer types for most), as the
    one line a user acts on."""
    from datasets.exceptions import DatasetNotFoundError

    name, text = source.name, str(err)
    if isinstance(err, ConnectionError) or "OfflineModeIsEnabled" in text:
        if offline() or "OfflineModeIsEnabled" in text:
            return (
                f"--dataset_name {name}: cannot be loaded with the hub off (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE); "
                f"prepare it where the hub is reachable and pass its folder ({RECIPE}), or pass --train_file and "
                "--validation_file"
            )
        return f"--dataset_name {name}: the hub cannot be reached ({one_line(err)}); see {RECIPE}"
    if isinstance(err, DatasetNotFoundError):
        if "gated" in text:
            return (
                f"--dataset_name {name}: a gated dataset; accept its terms at huggingface.co/datasets/{name} and "
                "pass --token (or set HF_TOKEN)"
            )
        return f"--dataset_name {name}: not on the hub, or private (then pass --token): {one_line(err)}"
    if isinstance(err, ValueError) and text.startswith("Couldn't find cache for"):  # offline, config not cached
        return (
            f"--dataset_config_name {source.config_name}: {name} is cached without that config and the hub is off; "
            f"drop the flag, or prepare it where the hub is reachable ({RECIPE})"
        )
    if isinstance(err, ValueError) and text.startswith("BuilderConfig"):
        return f"--dataset_config_name {source.config_name}: {name} has no such config ({one_line(err)})"
    if isinstance(err, ValueError) and "Config name is missing" in text:
        return f"--dataset_config_name: {name} has several configs; name one ({one_line(err)})"
    if isinstance(err, ValueError) and text.startswith("Unknown split"):
        present = text.split("Should be one of", 1)[-1].strip(" .[]").replace("'", "")
        return _missing_split(source, split, [s.strip() for s in present.split(",") if s.strip()])
    if isinstance(err, FileNotFoundError):
        return f"--dataset_name {name}: no dataset files found there ({one_line(err)})"
    return f"--dataset_name {name}: cannot be loaded ({one_line(err)})"
