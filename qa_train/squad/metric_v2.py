"""SQuAD v2.0 metrics as an `evaluate` metric, scored by qa_train.squad.scoring.score_v2.

Inputs and outputs are those of the hub's "squad_v2" metric, so code written for
evaluate.load("squad_v2") (transformers' run_qa examples with --version_2_with_negative) works
unchanged, offline, with the official script's numbers:

    metric = evaluate.load(qa_train.squad.metric_v2.SCRIPT)
    metric.compute(
        predictions=[{"id": "q1", "prediction_text": "", "no_answer_probability": 0.0}],
        references=[{"id": "q1", "answers": {"text": [], "answer_start": []}}],
    )  # -> {"exact": 100.0, "f1": 100.0, "total": 1, "NoAns_exact": 100.0, ...}

A module of its own because evaluate.load takes the first metric class a script defines.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import evaluate

from qa_train.squad.metric import _by_id, squad_info
from qa_train.squad.scoring import score_v2

SCRIPT: str = str(Path(__file__).resolve())

_CITATION = """\
@inproceedings{Rajpurkar2018SQuAD2,
  title={Know What You Don't Know: Unanswerable Questions for SQuAD},
  author={Pranav Rajpurkar and Robin Jia and Percy Liang},
  booktitle={ACL},
  year={2018}
}
"""

_DESCRIPTION = (
    "SQuAD v2.0 metrics with the official script's semantics (qa_train.squad.scoring.score_v2): exact and F1 "
    "over answerable (HasAns) and unanswerable (NoAns) questions, a prediction counted as 'no answer' when "
    "its no_answer_probability exceeds no_answer_threshold, and the best thresholds."
)

_INPUTS = """
Args:
    predictions: list of {"id": str, "prediction_text": str, "no_answer_probability": float}.
    references: list of {"id": str, "answers": {"text": [str, ...], "answer_start": [int, ...]}}, empty
        lists for an unanswerable question.
    no_answer_threshold: float, 1.0 by default (the probability above which the answer is "").
Returns:
    exact, f1, total, HasAns_exact/f1/total, NoAns_exact/f1/total (when such questions exist),
    best_exact, best_exact_thresh, best_f1, best_f1_thresh.
"""


class SquadV2(evaluate.Metric):
    """The hub's "squad_v2" metric, computed offline by qa_train.squad.scoring.score_v2."""

    def _info(self) -> evaluate.MetricInfo:
        return squad_info(_DESCRIPTION, _CITATION, _INPUTS, no_answer_probability=datasets.Value("float32"))

    def _compute(
        self, predictions: list[dict], references: list[dict], no_answer_threshold: float = 1.0
    ) -> dict[str, float | int]:
        golds = _by_id("references", references, lambda r: list(r["answers"]["text"]))
        preds = _by_id("predictions", predictions, lambda p: p["prediction_text"])
        na_probs = _by_id("predictions", predictions, lambda p: float(p["no_answer_probability"]))
        return score_v2(golds, preds, na_probs, no_answer_threshold)
