"""`--save_best`: the model with the best F1 seen so far, kept in output_dir/best (with best.json saying which
step and scores), so that the export can be the best model rather than the last one."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypedDict

log = logging.getLogger("qa_train")
BEST_FILE = "best.json"


class BestFields(TypedDict):
    """metrics.json's best_* and exported_step (RunMetrics fields of the same names)."""

    best_eval_step: int | None
    best_exact_match: float | None
    best_f1: float | None
    exported_step: int | None


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


class BestModel:
    """The best evaluation so far; with `keep` (--save_best) also its model, in output_dir/best.

    Scores exist on the main process only; every method that decides is a collective all ranks call, so
    they all decide alike."""

    def __init__(
        self, accelerator: Any, output_dir: Path, keep: bool, resumed: bool, carried: dict[str, Any] | None = None
    ) -> None:
        """`carried`: the best evaluation a resumed checkpoint recorded; with `keep`, the model kept in
        output_dir/best says which one it is."""
        self.accelerator, self.output_dir, self.keep = accelerator, output_dir, keep
        # Two bests, apart when --save_best joins a resumed run: the best evaluation (metrics' best_*) may
        # predate it and have no model in best/; only `kept` can be exported.
        self.kept = read_best(output_dir) if keep and resumed else None
        seen = [b for b in (self.kept, BestScore(**carried) if resumed and carried else None) if b is not None]
        self.score = max(seen, key=lambda b: b.f1) if seen else None
        if keep and self.score is not None and self.score != self.kept and accelerator.is_main_process:
            log.warning(
                "the best evaluation so far (step %d, F1 %.2f) predates --save_best and has no model in "
                "%s: metrics.json's best_* count it; the export is chosen among the models evaluated "
                "from now on",
                self.score.step,
                self.score.f1,
                output_dir / "best",
            )

    def _from_main(self, value: float) -> float:
        import torch

        mine = torch.tensor(
            value if self.accelerator.is_main_process else 0.0, dtype=torch.float64, device=self.accelerator.device
        )
        return float(self.accelerator.reduce(mine, reduction="sum"))

    def offer(self, result: Any, step: int, export: Callable[[Path], Path]) -> None:
        """An evaluation's result (None off the main process); a better F1 becomes the best, kept if asked."""
        f1 = self._from_main(result.f1 if result is not None else -1.0)
        if f1 < 0:
            return
        scored = BestScore(step, result.exact_match if result is not None else float("nan"), f1)
        if self.score is None or f1 > self.score.f1:
            self.score = scored
        if self.keep and (self.kept is None or f1 > self.kept.f1):
            folder = export(self.output_dir / "best")
            self.kept = scored
            if self.accelerator.is_main_process:
                write_best(folder, scored)

    def as_record(self) -> dict[str, Any] | None:
        """What a checkpoint carries of it (TrainerState.best_eval)."""
        return asdict(self.score) if self.score is not None else None

    def replaces_last(self, final_scores: Any) -> bool:
        """Whether the kept model, not the last, is the export: it scored higher than the final evaluation (a
        tie goes to the later model), or there was no final evaluation."""
        if not self.keep or self.kept is None:
            return False
        f1 = self._from_main(final_scores.f1 if final_scores is not None else -1.0)
        return f1 < 0 or f1 < self.kept.f1

    def fields(self, final_scores: Any, step: int, exported: bool) -> BestFields:
        """metrics.json's best_* (the final evaluation included) and which step final/ holds (main process)."""
        last = BestScore(step, final_scores.exact_match, final_scores.f1) if final_scores is not None else None
        seen, kept = self.score, self.kept
        top = seen if seen is not None and (last is None or seen.f1 > last.f1) else last
        held = kept.step if self.keep and kept is not None and (last is None or kept.f1 > last.f1) else step
        return {
            "best_eval_step": top.step if top else None,
            "best_exact_match": top.exact_match if top else None,
            "best_f1": top.f1 if top else None,
            "exported_step": held if exported else None,
        }
