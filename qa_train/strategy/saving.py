"""Writing checkpoints and the final export, both atomic under every strategy.

A checkpoint is written under a temporary name by all ranks (DeepSpeed and FSDP write shards); the
main process then writes trainer_state.json, then manifest.json (every file's size and CRC32), and
renames the folder once every rank has finished. A save that fails on any rank (a full disk) fails on
every rank as CheckpointSaveError, and its temporary folder is removed.
"""

from __future__ import annotations

import copy
import errno
import json
import logging
import os
import shutil
import stat
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path

from qa_train.config.outputdir import remove_entry
from qa_train.config.settings import ANSWERING_KEY
from qa_train.core.errors import one_line
from qa_train.strategy.checkpoint import (
    MANIFEST,
    STATE_FILE,
    checkpoint_root,
    complete_checkpoints,
    delete_folder,
    file_crcs,
    latest_usable,
    library_errors,
    move_aside,
    own_error,
    run_id_of,
    verify,
)
from qa_train.strategy.faults import failed_ranks, run_fault
from qa_train.strategy.sharded import export_state_dict
from qa_train.strategy.train_state import TrainerState

log = logging.getLogger("qa_train")


# --- checkpoints --------------------------------------------------------------------------------------


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
    """An empty `tmp`, after removing every partial save here: the output dir's lock (config.dirlock) keeps other runs
    out, so a .tmp-step_N is what a killed save left (SIGKILL at a time limit, a second Ctrl-C), a checkpoint's worth
    of disk that no later save of another step would free."""
    for partial in sorted(tmp.parent.glob(".tmp-step_*")):
        if partial != tmp:
            log.info("removing %s, a save that a killed process left unfinished", partial)
        shutil.rmtree(partial, ignore_errors=True)
    tmp.mkdir(parents=True)


def _complete(tmp: Path, final: Path, state: TrainerState, output_dir: str | Path, keep: int | None) -> None:
    (tmp / STATE_FILE).write_text(json.dumps(asdict(state)))
    _write_manifest(tmp)  # last of the files: only now is the folder complete
    _share_like_umask(tmp)  # safetensors writes the model 0600, where the rest follows the umask
    _replace(tmp, final, state.run_id)
    log.info("checkpoint saved: %s", final)
    try:
        _rotate(output_dir, keep, state.run_id, final)
    except OSError as err:  # the new checkpoint is complete: an old one left behind costs space, not the run
        log.warning("--save_total_limit: older checkpoints could not all be removed (%s)", one_line(err))


def _phase(accelerator, final: Path, tmp: Path, work: Callable[[], object] | None) -> None:
    """This rank's part of a save (None: nothing to do here), then agreement: if any rank failed, the main
    process removes `tmp` (the space it holds is what a full disk needs back) and every rank raises."""
    error = None
    if work is not None:
        try:
            work()
        except library_errors() as err:  # a full disk: OSError, torch's RuntimeError, safetensors' own error, DCP's
            error = own_error(err)
            if run_fault(error):
                # Not the disk's: exit 7 or 6 as anywhere else; the other ranks then find this one gone (a hung peer
                # would also make the agreement below wait a second --ddp_timeout).
                if accelerator.is_main_process:
                    shutil.rmtree(tmp, ignore_errors=True)
                raise error from err
    reason = _failure_reason(error, tmp.parent) if error is not None else None  # before the removal frees space
    failed = failed_ranks(accelerator, error is not None)
    if not failed:
        return
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
    rank = accelerator.process_index
    message = (
        _save_failure(final, reason, error, rank, failed, accelerator.num_processes)
        if rank == failed[0] and error is not None and reason is not None  # this rank failed: both are set
        else f"checkpoint {final} could not be saved: rank {failed[0]} failed"
    )
    raise CheckpointSaveError(message, reporter=failed[0]) from error


def _failure_reason(err: BaseException, root: Path) -> str:
    if isinstance(err, OSError):
        return one_line(err)  # names errno's text and, for most calls, the file
    # torch's zip writer says only "unexpected pos ..." on a full disk: the free space tells.
    try:
        free = f" ({shutil.disk_usage(root).free / 2**30:.2f} GiB free in {root})"
    except OSError:
        free = ""
    return one_line(err) + free


def _save_failure(final: Path, reason: str, err: BaseException, rank: int, failed: list[int], world: int) -> str:
    others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    who = f"rank {rank}{others}: " if world > 1 else ""
    kept = latest_usable(final.parent, warn=False)
    intact = f"the newest complete checkpoint, {kept}, is intact" if kept else "no earlier complete checkpoint exists"
    # As __main__'s line for a full disk elsewhere: with nothing saved there is nothing to resume.
    rerun = "--resume_from_checkpoint latest" if kept else "--overwrite_output_dir (no checkpoint was saved)"
    return (
        f"checkpoint {final} could not be saved: {who}{reason}; its partial folder is removed and {intact}; "
        f"{_fix(err)}, then rerun with {rerun}"
    )


def _fix(err: BaseException) -> str:
    if not isinstance(err, OSError):
        return "free space (if that is the cause)"  # torch and safetensors hide the errno
    return "free space" if err.errno in OUT_OF_SPACE else "fix that"


def _replace(tmp: Path, final: Path, run_id: str) -> None:
    """Rename tmp to final. The same step saved twice by this run (e.g. preemption right after a periodic
    save) replaces the old folder; another run's folder at that name is moved aside, never deleted."""
    if final.exists():
        other = run_id_of(final)
        if other == run_id:
            delete_folder(final)
        else:
            aside = move_aside(final, f"run-{(other or 'unknown')[:8]}")
            log.warning("%s belonged to another run (%s): moved to %s, not deleted", final, other or "unknown", aside)
    tmp.rename(final)


def _write_manifest(folder: Path) -> None:
    # Sizes catch truncation (a full disk, a kill or a lost node mid-write); CRC32s catch damage at the same size.
    # zlib's CRC32 of files just written (still in the page cache) is cheap beside writing them
    # (docs/benchmarks/2026-11-25-cpu-checkpoint-checksums.md).
    files = {p.relative_to(folder).as_posix(): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    manifest = {"format": 2, "files": files, "crc32": file_crcs(folder, list(files))}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _rotate(output_dir: str | Path, keep: int | None, run_id: str, just_written: Path | None = None) -> None:
    """Keep this run's newest `keep` whole checkpoints (always including `just_written`); delete its older ones.

    Another run's checkpoints, older formats without a run_id, and damaged ones are never deleted, and
    damaged ones do not count towards `keep`.
    """
    if keep is None:
        return
    ours = [
        p
        for p in complete_checkpoints(output_dir)
        if p != just_written and run_id_of(p) == run_id and verify(p) is None
    ]
    room = keep - 1 if just_written is not None else keep
    for old in ours[: max(len(ours) - room, 0)]:
        delete_folder(old)


# --- export ------------------------------------------------------------------------------------


def export_final(accelerator, model, tokenizer, final: Path, answering: Mapping[str, object] | None = None) -> Path:
    """Full consolidated weights + tokenizer in `final` (output_dir/final or /best), loadable by from_pretrained;
    `answering`: the run's windows and span rules, recorded in its config.json (`write_config`).

    export_state_dict gathers ZeRO-3 partitions and FSDP shards (fp32 under every strategy); saving the
    unwrapped model without it would write placeholders under ZeRO-3.
    """
    tmp = final.with_name(f".tmp-{final.name}")
    state_dict = export_state_dict(accelerator, model)
    error: Exception | None = None
    if accelerator.is_main_process:
        assert state_dict is not None  # whole on the main process
        remove_entry(tmp)
        try:
            _write_export(accelerator.unwrap_model(model), state_dict, tokenizer, tmp, answering)
            remove_entry(final)
            tmp.rename(final)
        except Exception as err:
            error = err
        finally:
            remove_entry(tmp)  # on a full disk, the space it holds is what the user needs back
    # Every rank learns whether the main process wrote it (also the barrier after the write): after a failed export
    # the run still evaluates and records, collectively, so no rank may go on alone.
    if failed_ranks(accelerator, error is not None):
        raise error if error is not None else RuntimeError(f"export to {final}: the main process failed")
    if accelerator.is_main_process:
        log.info("model exported: %s", final)
    return final


def _write_export(unwrapped, state_dict: dict, tokenizer, tmp: Path, answering: Mapping[str, object] | None) -> None:
    # save_pretrained records the live model's dtype (DeepSpeed's 16-bit engine copy), not that of the weights
    # it writes (and empties state_dict as it does).
    written = next(str(t.dtype).removeprefix("torch.") for t in state_dict.values() if t.is_floating_point())
    unwrapped.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
    write_config(unwrapped.config, tmp, written, answering)
    tokenizer.save_pretrained(tmp)
    # save_pretrained only logs (and writes nothing) when its target is not a folder.
    if not any(tmp.glob("*.safetensors")):
        raise OSError(f"{tmp}: no weights were written")
    _share_like_umask(tmp)


def write_config(config, folder: Path, dtype: str, answering: Mapping[str, object] | None) -> None:
    """An exported model's config.json in `folder` (the export's and `qa-train consolidate`'s): `config` with the
    dtype of the weights written, which transformers 5 loads a model in, and the run's windows and span rules
    (TrainArgs.answering()) under ANSWERING_KEY, which `qa-train predict` answers with. With none, the folder records
    none: one the config came with (a qa_train export's) would be another run's."""
    config = copy.deepcopy(config)
    config.dtype = dtype
    if answering is not None:
        setattr(config, ANSWERING_KEY, dict(answering))
    elif hasattr(config, ANSWERING_KEY):
        delattr(config, ANSWERING_KEY)
    config.save_pretrained(folder)


def _share_like_umask(folder: Path) -> None:
    """Files and folders as the umask allows (usually group- and world-readable): some writers create files 0600,
    and an exported model is meant to be read by others on a shared file system. Never writable by others, even
    under umask 000: a checkpoint is unpickled on resume, and one that others could write is refused then
    (checkpoint.untrusted)."""
    umask = os.umask(0)
    os.umask(umask)
    mask = umask | stat.S_IWOTH
    for f in (folder, *folder.rglob("*")):
        if f.is_symlink():
            continue
        try:
            f.chmod((0o777 if f.is_dir() else 0o666) & ~mask)
        except OSError:  # a file system that keeps its own modes (some network mounts): nothing lost
            pass
