"""SQuAD v1.1 exact-match and F1, with the semantics of the official evaluation.

Scores from this module are meant to be comparable with published SQuAD v1.1
numbers, so the metric definitions follow the official v1.1 evaluation exactly:

* answers are compared after normalisation (lower-case, drop punctuation, drop
  the articles "a", "an", "the", collapse whitespace);
* F1 is computed over the bags of whitespace tokens of the normalised strings;
* each question takes the best score over its gold answers;
* a question without a prediction scores 0 and still counts in the total.

Also usable as a drop-in for the official script::

    python -m qa_train.squad_eval dev-v1.1.json predictions.json
"""

from __future__ import annotations

import argparse
import json
import re
import string
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Lower-case, strip punctuation and articles, and collapse whitespace."""
    # The order matters: punctuation goes first so that "the-end" becomes
    # "theend" (no article), exactly as the official script does it.
    text = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
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
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(ground_truth).split()
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def score(
    references: Mapping[str, Sequence[str]], predictions: Mapping[str, str]
) -> dict[str, float | int]:
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
            raise ValueError(
                f"score: question {qid}: expected a non-empty list of gold answers, got {golds!r}"
            )
        if qid not in predictions:
            missing += 1
            continue
        pred = predictions[qid]
        em_sum += max(exact_match(pred, gold) for gold in golds)
        f1_sum += max(f1(pred, gold) for gold in golds)
    total = len(references)
    return {
        "exact_match": 100.0 * em_sum / total,
        "f1": 100.0 * f1_sum / total,
        "total": total,
        "missing": missing,
    }


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON: {err}") from err


def _answer_texts(path: Path, qid: str, texts: object) -> list[str]:
    if not isinstance(texts, list) or not texts:
        raise ValueError(f"{path}: question {qid}: expected a non-empty list of answers, got {texts!r}")
    if not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{path}: question {qid}: every answer text must be a string, got {texts!r}")
    return texts


def _add(path: Path, refs: dict[str, list[str]], qid: object, texts: list[str]) -> None:
    if not isinstance(qid, str):
        raise ValueError(f"{path}: question id must be a string, got {qid!r}")
    # A dict would silently keep the last copy; the official script would
    # count both, so a duplicate means the file is not what the caller thinks.
    if qid in refs:
        raise ValueError(f"{path}: question {qid}: id appears more than once")
    refs[qid] = texts


def _nested_references(path: Path, dataset: object) -> dict[str, list[str]]:
    """Official layout: data -> paragraphs -> qas -> answers[{"text", ...}]."""
    refs: dict[str, list[str]] = {}
    where = "data"
    try:
        for i, article in enumerate(dataset):
            where = f"data[{i}]"
            for j, paragraph in enumerate(article["paragraphs"]):
                where = f"data[{i}].paragraphs[{j}]"
                for k, qa in enumerate(paragraph["qas"]):
                    where = f"data[{i}].paragraphs[{j}].qas[{k}]"
                    answers = qa["answers"]
                    texts = [a["text"] for a in answers] if isinstance(answers, list) else answers
                    _add(path, refs, qa["id"], _answer_texts(path, qa["id"], texts))
    except (KeyError, TypeError) as err:
        raise ValueError(
            f"{path}: malformed SQuAD JSON near {where} ({type(err).__name__}: {err}); expected "
            '{"data": [{"paragraphs": [{"qas": [{"id", "answers": [{"text"}]}]}]}]}'
        ) from err
    return refs


def _jsonl_references(path: Path, lines: list[str]) -> dict[str, list[str]]:
    """Flat hub layout, one record per line: {"id", "answers": {"text": [...]}}."""
    refs: dict[str, list[str]] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {lineno}: not valid JSON: {err}") from err
        if not isinstance(record, dict) or "id" not in record or "answers" not in record:
            raise ValueError(f"{path}: line {lineno}: expected an object with 'id' and 'answers'")
        answers = record["answers"]
        if not isinstance(answers, dict) or "text" not in answers:
            raise ValueError(
                f"{path}: line {lineno}: 'answers' must be an object with a 'text' list, got {answers!r}"
            )
        _add(path, refs, record["id"], _answer_texts(path, record["id"], answers["text"]))
    return refs


def load_references(path: str | Path) -> dict[str, list[str]]:
    """Map question id -> gold answer texts from official SQuAD JSON or JSON lines."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None  # not a single document: try one record per line
    if isinstance(whole, dict) and "data" in whole:
        refs = _nested_references(path, whole["data"])
    elif whole is not None and "\n" in text.strip():
        # One multi-line JSON document that is not SQuAD-shaped; reading it
        # line by line would only report a confusing "line 1: not valid JSON".
        raise ValueError(
            f"{path}: JSON document without a top-level 'data' list; "
            "expected official SQuAD JSON or one record per line"
        )
    else:
        refs = _jsonl_references(path, text.splitlines())
    if not refs:
        raise ValueError(f"{path}: contains no questions")
    return refs


def load_predictions(path: str | Path) -> dict[str, str]:
    """Read a ``{question_id: answer_text}`` JSON file."""
    path = Path(path)
    preds = _read_json(path)
    if not isinstance(preds, dict):
        raise ValueError(f"{path}: expected a JSON object mapping question id to answer text")
    for qid, answer in preds.items():
        if not isinstance(answer, str):
            raise ValueError(f"{path}: question {qid}: prediction must be a string, got {answer!r}")
    return preds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qa_train.squad_eval",
        description="Evaluation for SQuAD v1.1 (official EM/F1 semantics).",
    )
    parser.add_argument("dataset_file", help="SQuAD JSON (official nested layout) or JSON lines")
    parser.add_argument("prediction_file", help="JSON object {question_id: answer_text}")
    args = parser.parse_args(argv)
    try:
        references = load_references(args.dataset_file)
        predictions = load_predictions(args.prediction_file)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    result = score(references, predictions)
    if result["missing"]:
        unanswered = [qid for qid in references if qid not in predictions]
        shown = ", ".join(unanswered[:5]) + (", ..." if len(unanswered) > 5 else "")
        print(
            f"{result['missing']} of {result['total']} questions have no prediction "
            f"and score 0: {shown}",
            file=sys.stderr,
        )
    print(json.dumps({"exact_match": result["exact_match"], "f1": result["f1"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
