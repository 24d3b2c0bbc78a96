"""Reading the scorer's files: gold answers (official SQuAD JSON, or flat records as training reads them),
predictions and no-answer probabilities, each refused in one line naming the file and the question."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from qa_train.data.json_lines import json_lines


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON: {err}") from err


def _answer_texts(path: Path, qid: str, texts: object) -> list[str]:
    """A list of answer texts; empty (unanswerable) is refused later unless the caller allows it."""
    if not isinstance(texts, list):
        raise ValueError(f"{path}: question {qid}: expected a non-empty list of answers, got {texts!r}")
    if not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{path}: question {qid}: every answer text must be a string, got {texts!r}")
    return texts


def _add(path: Path, refs: dict[str, list[str]], qid: object, texts: list[str]) -> None:
    # Integer ids as training takes them (qa_train.data.load): the predictions file keys them as strings.
    if isinstance(qid, bool) or not isinstance(qid, (str, int)):
        raise ValueError(f"{path}: question id must be a string or an integer, got {qid!r}")
    qid = str(qid)
    # A dict would silently keep the last copy; the official script would
    # count both, so a duplicate means the file is not what the caller thinks.
    if qid in refs:
        raise ValueError(f"{path}: question {qid}: id appears more than once")
    refs[qid] = texts


def _nested_references(path: Path, dataset: Any) -> dict[str, list[str]]:
    """Official layout: data -> paragraphs -> qas -> answers[{"text", ...}]; `dataset` is parsed JSON of any
    shape (a wrong one is a KeyError or TypeError, reported below)."""
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


def _flat_references(path: Path, records: Iterable[tuple[str, object]]) -> dict[str, list[str]]:
    """Flat hub layout, (place, record) pairs: {"id", "answers": {"text": [...]}}."""
    refs: dict[str, list[str]] = {}
    for where, record in records:
        if not isinstance(record, dict) or "id" not in record or "answers" not in record:
            raise ValueError(f"{path}: {where}: expected an object with 'id' and 'answers'")
        answers = record["answers"]
        if not isinstance(answers, dict) or "text" not in answers:
            raise ValueError(f"{path}: {where}: 'answers' must be an object with a 'text' list, got {answers!r}")
        _add(path, refs, record["id"], _answer_texts(path, record["id"], answers["text"]))
    return refs


def _is_flat(records: object) -> bool:
    """A list of flat records (as training also reads them), not of nested articles."""
    return (
        isinstance(records, list)
        and bool(records)
        and isinstance(records[0], dict)
        and ("paragraphs" not in records[0])
    )


def read_references(path: Path) -> tuple[dict[str, list[str]], str | None]:
    """(id -> gold answer texts, the file's "version") from official SQuAD JSON, flat records (a JSON list,
    `{"data": [...]}` or JSON lines) as training reads them."""
    text = path.read_text(encoding="utf-8")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None  # not a single document: try one record per line
    version = None
    if isinstance(whole, dict) and "data" in whole:
        data = whole["data"]
        refs = (
            _flat_references(path, ((f"data[{i}]", r) for i, r in enumerate(data)))
            if _is_flat(data)
            else _nested_references(path, data)
        )
        version = str(whole["version"]) if "version" in whole else None
    elif _is_flat(whole):  # a JSON list of flat records
        refs = _flat_references(path, ((f"record {i}", r) for i, r in enumerate(whole)))
    elif whole is not None and "\n" in text.strip():
        # One multi-line JSON document that is not SQuAD-shaped; reading it
        # line by line would only report a confusing "line 1: not valid JSON".
        raise ValueError(
            f"{path}: JSON document without a top-level 'data' list; "
            "expected official SQuAD JSON, a list of records, or one record per line"
        )
    else:
        refs = _flat_references(path, json_lines(path, text))  # as training reads them
    if not refs:
        raise ValueError(f"{path}: contains no questions")
    return refs, version


def load_references(path: str | Path, allow_empty: bool = False) -> dict[str, list[str]]:
    """Map question id -> gold answer texts from official SQuAD JSON or flat records (list or JSON lines).

    SQuAD v1.1 questions are all answerable, so an empty answer list is refused unless
    ``allow_empty`` (SQuAD v2.0, where it marks an unanswerable question).
    """
    path = Path(path)
    refs, _ = read_references(path)
    if not allow_empty:
        for qid, texts in refs.items():
            if not texts:
                raise ValueError(f"{path}: question {qid}: expected a non-empty list of answers, got []")
    return refs


def _load_mapping(path: str | Path, numbers: bool) -> dict:
    """A ``{question_id: answer text}`` JSON object, or with `numbers` ``{question_id: number}``."""
    path = Path(path)
    mapping = _read_json(path)
    if not isinstance(mapping, dict):
        what = "a no-answer probability" if numbers else "answer text"
        raise ValueError(f"{path}: expected a JSON object mapping question id to {what}")
    for qid, v in mapping.items():
        if numbers and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ValueError(f"{path}: question {qid}: no-answer probability must be a number, got {v!r}")
        if not numbers and not isinstance(v, str):
            raise ValueError(f"{path}: question {qid}: prediction must be a string, got {v!r}")
    return mapping


def load_na_probs(path: str | Path) -> dict[str, float]:
    """Read a ``{question_id: no-answer probability or odds}`` JSON file (the official --na-prob-file)."""
    return {qid: float(v) for qid, v in _load_mapping(path, numbers=True).items()}


def load_predictions(path: str | Path) -> dict[str, str]:
    """Read a ``{question_id: answer_text}`` JSON file."""
    return _load_mapping(path, numbers=False)
