"""Exit codes of a training run, and the one-line form every refusal and failure takes.

Exit codes: 0 finished; 1 crashed (a traceback says where); 2 refused input (flags, data, output dir,
checkpoint, a torch.compile backend that cannot compile), before any training; 3 diverged (non-finite loss,
gradients or weights; nothing exported); 4 the export failed (metrics.json is written); 5 a checkpoint could
not be saved (its partial folder removed, earlier ones intact), or a write found the disk or quota full
(ENOSPC, EDQUOT): free space, then resume with --resume_from_checkpoint latest; 6 a collective waited past
--ddp_timeout for a rank that stopped answering (resume with --resume_from_checkpoint latest); 7 out of device
or host memory (the line says where and what to change); 75 preempted (checkpoint saved, resume with
--resume_from_checkpoint latest).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

# A launcher that cannot see its workers' exit codes (torchrun reports any failure as 1) names a file
# here, and the main process writes its code into it.
STATUS_FILE_ENV = "QA_TRAIN_STATUS_FILE"
FINISHED, CRASHED, REFUSED, DIVERGED, EXPORT_FAILED, SAVE_FAILED = 0, 1, 2, 3, 4, 5
HUNG, OUT_OF_MEMORY, PREEMPTED = 6, 7, 75
ERROR_PREFIX = "qa_train: error: "  # the report finds a failed run's reason in its log by it


def one_line(err: BaseException, limit: int = 300) -> str:
    """An error as one line for people: its type and the first line of its message, spaces collapsed, cut at
    `limit` characters. Libraries' messages span lines (tracebacks of their own, hints); a refusal is one line."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {' '.join(lines[0].split())}" if lines else type(err).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def refusal_text(err: BaseException) -> str:
    """A refusal's text: an OSError as the path it names and why ("runs/a: Permission denied"), not Python's
    "[Errno 13] Permission denied: 'runs/a'"; any other error as its own message."""
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        return f"{err.filename}: {err.strerror}"
    return str(err)


def did_you_mean(value: str, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """ " (did you mean X?)" for the choice closest to a mistyped `value`, or "" when none is close (difflib's
    ratio under `cutoff`)."""
    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=cutoff)
    return f" (did you mean {close[0]}?)" if close else ""
