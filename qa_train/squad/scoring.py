"""SQuAD v1.1 and v2.0 exact-match and F1, with the semantics of the official evaluations.

Scores from this module are meant to be comparable with published SQuAD
numbers, so the metric definitions follow the official v1.1 evaluation exactly:

* answers are compared after normalisation (lower-case, drop punctuation, drop
  the articles "a", "an", "the", collapse whitespace), which here begins with
  Unicode NFC, as training reads its records: the official script scores 'José'
  precomposed against decomposed as a miss;
* F1 is computed over the bags of whitespace tokens of the normalised strings;
* each question takes the best score over its gold answers;
* a question without a prediction scores 0 and still counts in the total.

SQuAD v2.0 (``score_v2``) follows the official v2.0 script: gold answers that
normalise to empty are dropped and a question left with none is scored against
"" (F1 1 when both are empty); a question counts as answerable when its file
lists any answer; ``na_probs`` above ``na_prob_thresh`` turn a prediction into
"no answer"; ``best_exact``/``best_f1`` are the scores at the best threshold on
``na_probs``. One deviation: a question without a prediction scores 0 and
counts in every total (the official script leaves it out of ``total`` and then
fails on the HasAns/NoAns breakdown).

Also usable as a drop-in for the official scripts (v2.0 when the file says
version v2.0, has unanswerable questions, or a no-answer file is given)::

    qa-train score dev-v1.1.json predictions.json
    qa-train score dev-v2.0.json predictions.json --na-prob-file null_odds.json [-t 1.0] [-o eval.json]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import string
import sys
import unicodedata
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from qa_train.config.outputdir import check_output_file
from qa_train.config.parser import OneLineParser
from qa_train.squad.files import load_na_probs, load_predictions, read_references

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Unicode NFC (where the official script has none, 'José' precomposed and decomposed differ), lower-case,
    strip punctuation and articles, and collapse whitespace."""
    # The order matters: punctuation goes first so that "the-end" becomes
    # "theend" (no article), exactly as the official script does it.
    text = "".join(ch for ch in unicodedata.normalize("NFC", s).lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, ground_truth: str) -> float:
    """1.0 when both strings normalise to the same text, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1(prediction: str, ground_truth: str) -> float:
    """Token-level F1 between the normalised strings.

    As in the official v1.1 script, no shared token means 0 -- including the
    case where both strings normalise to empty.
    """
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def score(references: Mapping[str, Sequence[str]], predictions: Mapping[str, str]) -> dict[str, float | int]:
    """Mean EM and F1 (in percent) over every question in ``references``.

    Returns ``{"exact_match", "f1", "total", "missing"}``. Questions missing
    from ``predictions`` score 0; predictions for unknown ids are ignored.
    """
    if not references:
        raise ValueError("score: references are empty; there is nothing to evaluate")
    em_sum = f1_sum = 0.0
    missing = 0
    for qid, golds in references.items():
        # A bare string is a Sequence too; iterating it would score characters.
        if isinstance(golds, str) or not golds:
            raise ValueError(f"score: question {qid}: expected a non-empty list of gold answers, got {golds!r}")
        if qid not in predictions:
            missing += 1
            continue
        em, f = question_scores(predictions[qid], golds)
        em_sum += em
        f1_sum += f
    total = len(references)
    return {
        "exact_match": 100.0 * em_sum / total,
        "f1": 100.0 * f1_sum / total,
        "total": total,
        "missing": missing,
    }


def f1_v2(prediction: str, ground_truth: str) -> float:
    """F1 as the official v2.0 script computes it: when either side normalises to empty, 1 if both do."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    return _token_f1(pred_tokens, gold_tokens)


def question_scores(prediction: str, golds: Sequence[str], v2: bool = False) -> tuple[float, float]:
    """One question's official (EM, F1): the best over its gold answers, by v1.1's rules or v2.0's."""
    f1_of = f1
    if v2:
        # As the official v2.0 script: answers that normalise to nothing are dropped, and a question
        # left without any is scored against "" (what a no-answer prediction reads as).
        golds, f1_of = [g for g in golds if normalize_answer(g)] or [""], f1_v2
    return max(exact_match(prediction, g) for g in golds), max(f1_of(prediction, g) for g in golds)


def _raw_scores_v2(
    references: Mapping[str, Sequence[str]], predictions: Mapping[str, str]
) -> tuple[dict[str, float], dict[str, float]]:
    """Per question EM and F1 before any no-answer threshold; a missing prediction scores 0."""
    exact: dict[str, float] = {}
    f1s: dict[str, float] = {}
    for qid, golds in references.items():
        if isinstance(golds, str):
            raise ValueError(f"score_v2: question {qid}: expected a list of gold answers, got {golds!r}")
        if qid not in predictions:
            exact[qid] = f1s[qid] = 0.0
            continue
        exact[qid], f1s[qid] = question_scores(predictions[qid], golds, v2=True)
    return exact, f1s


def _threshold(
    scores: dict[str, float], na_probs: Mapping[str, float], has_ans: dict[str, bool], thresh: float
) -> dict[str, float]:
    """A question whose no-answer probability exceeds `thresh` counts as answered "no answer"."""
    return {
        qid: float(not has_ans[qid]) if qid in na_probs and na_probs[qid] > thresh else s for qid, s in scores.items()
    }


def _summary(exact: dict[str, float], f1s: dict[str, float], qids: Sequence[str]) -> dict[str, float | int]:
    total = len(qids)
    return {
        "exact": 100.0 * sum(exact[q] for q in qids) / total,
        "f1": 100.0 * sum(f1s[q] for q in qids) / total,
        "total": total,
    }


def _best_threshold(
    predictions: Mapping[str, str], scores: dict[str, float], na_probs: Mapping[str, float], has_ans: dict[str, bool]
) -> tuple[float, float]:
    """The official find_best_thresh: start from "every question answered no-answer" and let questions
    in rising na_prob order answer, one at a time; the best score seen and the na_prob where it was.
    A question without a prediction scores 0 at every threshold, so it is not counted as a right no-answer."""
    current: float
    best: float
    current = best = sum(1 for qid, v in has_ans.items() if not v and qid in predictions)
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):  # stable: file order among equal values
        if qid not in scores:
            continue
        if has_ans[qid]:
            current += scores[qid]
        elif predictions.get(qid, ""):
            current -= 1
        if current > best:
            best, best_thresh = current, na_probs[qid]
    return 100.0 * best / len(scores), best_thresh


def score_v2(
    references: Mapping[str, Sequence[str]],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float | int]:
    """The official SQuAD v2.0 metrics (in percent) over every question in ``references``.

    ``references`` maps id -> gold answers, an empty list for an unanswerable question. Keys, in the
    official order: exact, f1, total, HasAns_{exact,f1,total} and NoAns_{exact,f1,total} (each when
    such questions exist), and with ``na_probs`` best_exact, best_exact_thresh, best_f1, best_f1_thresh.
    """
    if not references:
        raise ValueError("score_v2: references are empty; there is nothing to evaluate")
    has_ans = {qid: bool(golds) for qid, golds in references.items()}
    absent = [qid for qid in predictions if qid in references and na_probs is not None and qid not in na_probs]
    if absent:
        raise ValueError(f"score_v2: question {absent[0]}: a prediction without a no-answer probability")
    exact_raw, f1_raw = _raw_scores_v2(references, predictions)
    # Only predicted questions can be turned into "no answer": one without a prediction scores 0 whatever
    # its no-answer probability (the official script leaves it out of every score).
    if na_probs is None:
        probs = {qid: 0.0 for qid in predictions}
    else:
        probs = {qid: p for qid, p in na_probs.items() if qid in predictions}
    exact = _threshold(exact_raw, probs, has_ans, na_prob_thresh)
    f1s = _threshold(f1_raw, probs, has_ans, na_prob_thresh)
    result = _summary(exact, f1s, list(references))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        qids = [qid for qid, has in has_ans.items() if has == wanted]
        if qids:
            result.update({f"{prefix}_{k}": v for k, v in _summary(exact, f1s, qids).items()})
    if na_probs is not None:
        result["best_exact"], result["best_exact_thresh"] = _best_threshold(predictions, exact_raw, probs, has_ans)
        result["best_f1"], result["best_f1_thresh"] = _best_threshold(predictions, f1_raw, probs, has_ans)
    return result


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="qa-train score",
        description="Evaluation for SQuAD v1.1 and v2.0 (the official scripts' semantics). v2.0 when the file "
        "says version v2.0, has unanswerable questions, or --na-prob-file is given.",
    )
    parser.add_argument("dataset_file", help="SQuAD JSON (official nested layout) or JSON lines")
    parser.add_argument("prediction_file", help="JSON object {question_id: answer_text}")
    parser.add_argument("--na-prob-file", "-n", help="v2.0: JSON object {question_id: no-answer probability}")
    parser.add_argument(
        "--na-prob-thresh",
        "-t",
        type=float,
        default=1.0,
        help='v2.0: predict "" if the no-answer probability exceeds this',
    )
    parser.add_argument("--out-file", "-o", help="write the metrics to this file instead of stdout")
    return parser


def _warn_missing(references: Mapping[str, object], predictions: Mapping[str, str]) -> None:
    unanswered = [qid for qid in references if qid not in predictions]
    if unanswered:
        shown = ", ".join(unanswered[:5]) + (", ..." if len(unanswered) > 5 else "")
        print(
            f"{len(unanswered)} of {len(references)} questions have no prediction and score 0: {shown}", file=sys.stderr
        )


def _refusal(err: OSError | ValueError) -> str:
    """One line naming the file: an OSError's own text is "[Errno 2] No such file or directory: 'x'"."""
    if not isinstance(err, OSError) or err.filename is None:
        return str(err)
    if isinstance(err, FileNotFoundError):
        return f"{err.filename}: no such file"
    if isinstance(err, IsADirectoryError):
        return f"{err.filename}: is a directory, not a file"
    return f"{err.filename}: cannot be read: {err.strerror or err}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    # As training and predict refuse a non-finite --null_score_diff_threshold: nan never compares true, and an
    # infinite threshold answers every question alike.
    if not math.isfinite(args.na_prob_thresh):
        parser.error(f"--na-prob-thresh: must be a finite number, got {args.na_prob_thresh}")
    try:
        if args.out_file is not None:
            check_output_file(args.out_file, "--out-file")
        references, version = read_references(Path(args.dataset_file))
        predictions = load_predictions(args.prediction_file)
        na_probs = load_na_probs(args.na_prob_file) if args.na_prob_file else None
        v2 = (version or "").lstrip("v").startswith("2") or na_probs is not None or not all(references.values())
        if not v2:
            result = score(references, predictions)  # v1.1: refuses what a v1.1 file cannot hold
        else:
            result = score_v2(references, predictions, na_probs, args.na_prob_thresh)
    except (OSError, ValueError) as err:  # refused input: exit 2, as everywhere in qa-train
        print(f"qa-train score: error: {_refusal(err)}", file=sys.stderr)
        return 2
    _warn_missing(references, predictions)
    metrics = result if v2 else {"exact_match": result["exact_match"], "f1": result["f1"]}
    if args.out_file is not None:
        Path(args.out_file).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out_file).write_text(json.dumps(metrics), encoding="utf-8")
    else:
        print(json.dumps(metrics, indent=2) if v2 else json.dumps(metrics))
    return 0
