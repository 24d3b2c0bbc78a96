"""`--save_best`: the model with the best F1 seen so far, kept in output_dir/best (with best.json saying which
step and scores), so that the export can be the best model rather than the last one."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger("qa_train")
BEST_FILE = "best.json"


@dataclass
class BestScore:
    step: int
    exact_match: float
    f1: float


def read_best(output_dir: Path) -> BestScore | None:
    """The best model kept so far (a resumed run carries on from it), or None."""
    try:
        return BestScore(**json.loads((output_dir / "best" / BEST_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_best(folder: Path, best: BestScore) -> None:
    """Written into the exported folder last, so a best/ without best.json is never taken for a complete one."""
    (folder / BEST_FILE).write_text(json.dumps(asdict(best)) + "\n")
    log.info("best model so far (step %d, F1 %.2f): %s", best.step, best.f1, folder)


def promote(output_dir: Path) -> Path:
    """Make output_dir/best the export: output_dir/final is replaced by it (main process)."""
    final, best = output_dir / "final", output_dir / "best"
    if final.is_dir():
        shutil.rmtree(final)
    best.rename(final)
    return final
