"""SQuAD v1.1 exact match and F1 as an `evaluate` metric, scored by qa_train.squad.scoring.

Inputs and outputs are those of the hub's "squad" metric, so code written for
evaluate.load("squad") works unchanged, but nothing is downloaded and the numbers
are exactly qa_train.squad.scoring.score's:

    metric = evaluate.load(qa_train.squad.metric.SCRIPT)  # evaluate's own loader, offline
    metric = qa_train.squad.metric.Squad()  # or construct it directly
    metric.compute(
        predictions=[{"id": "q1", "prediction_text": "Denver Broncos"}],
        references=[{"id": "q1", "answers": {"text": ["Denver Broncos"], "answer_start": [177]}}],
    )  # -> {"exact_match": 100.0, "f1": 100.0}

This is the only module that imports evaluate (which pulls in transformers' pipelines,
several seconds), so importing qa_train or starting its CLI never pays for it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import evaluate

from qa_train.squad.scoring import score

# evaluate.load copies this file into its modules cache and imports the copy; it finds the
# metric as the first non-abstract EvaluationModule subclass in the module's namespace, so
# import evaluate itself here, never `from evaluate import Metric`.
SCRIPT: str = str(Path(__file__).resolve())

_CITATION = """\
@inproceedings{Rajpurkar2016SQuAD10,
  title={SQuAD: 100,000+ Questions for Machine Comprehension of Text},
  author={Pranav Rajpurkar and Jian Zhang and Konstantin Lopyrev and Percy Liang},
  booktitle={EMNLP},
  year={2016}
}
"""

_DESCRIPTION = (
    "SQuAD v1.1 exact match and F1 with the official script's semantics (qa_train.squad.scoring): "
    "answers normalised (case, punctuation, articles, whitespace), best score over the gold "
    "answers, a question whose id has no prediction scores 0."
)

_INPUTS = """
Args:
    predictions: list of {"id": str, "prediction_text": str}.
    references: list of {"id": str, "answers": {"text": [str, ...], "answer_start": [int, ...]}},
        the rows of the hub's "squad" dataset; answer_start is accepted and not used.
Returns:
    {"exact_match": float, "f1": float}, both in percent over the references.
"""


class Squad(evaluate.Metric):
    """The hub's "squad" metric, computed offline by qa_train.squad.scoring.score."""

    def _info(self) -> evaluate.MetricInfo:
        return squad_info(_DESCRIPTION, _CITATION, _INPUTS)

    def _compute(self, predictions: list[dict], references: list[dict]) -> dict[str, float]:
        golds = _by_id("references", references, lambda r: list(r["answers"]["text"]))
        preds = _by_id("predictions", predictions, lambda p: p["prediction_text"])
        result = score(golds, preds)
        if result["missing"]:
            # The rows come in pairs, so a reference without a prediction means the ids do not
            # line up; say so rather than report a silently lower score.
            unanswered = [qid for qid in golds if qid not in preds]
            warnings.warn(
                f"squad_metric: {result['missing']} of {result['total']} reference ids have no "
                f"prediction and score 0: {', '.join(unanswered[:5])}",
                stacklevel=2,
            )
        return {"exact_match": result["exact_match"], "f1": result["f1"]}


def squad_info(description: str, citation: str, inputs: str, **prediction_fields: Any) -> evaluate.MetricInfo:
    """The hub SQuAD metrics' input layout: predictions by id (plus `prediction_fields`), references as the
    hub dataset's rows."""
    return evaluate.MetricInfo(
        description=description,
        citation=citation,
        inputs_description=inputs,
        features=datasets.Features(
            {
                "predictions": {
                    "id": datasets.Value("string"),
                    "prediction_text": datasets.Value("string"),
                    **prediction_fields,
                },
                "references": {
                    "id": datasets.Value("string"),
                    "answers": datasets.Sequence(
                        {"text": datasets.Value("string"), "answer_start": datasets.Value("int32")}
                    ),
                },
            }
        ),
        reference_urls=["https://rajpurkar.github.io/SQuAD-explorer/"],
    )


def _by_id(what: str, rows: list[dict], value: Callable[[dict], Any]) -> dict[str, Any]:
    """{row["id"]: value(row)}, refusing duplicates that a dict would silently collapse."""
    out: dict[str, Any] = {}
    for row in rows:
        qid = row["id"]
        if qid in out:
            raise ValueError(f"squad_metric: {what}: question {qid}: id appears more than once")
        out[qid] = value(row)
    return out
