"""The layouts of a SQuAD file, read into located flat records: the official nested JSON
(`data[].paragraphs[].qas[]`), a JSON list of flat records or `{"data": [records]}`, and JSON lines. The one
reader of them, for training data (qa_train.data.load) and the scorer's gold answers (qa_train.squad.files), so
that the scorer reads every file a run evaluated on, and both say the same of a broken one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qa_train.data.json_lines import json_lines
from qa_train.data.records import DataError, json_kind, place

# Where a record sits, for messages: `data[a].paragraphs[p].qas[q]`, `line N` or `record i`.
Located = tuple[str, Any]

JSON_LINES = object()
"""What `read_json` returns for a file of JSON lines (several documents, one per line)."""


def read_json(path: Path, text: str) -> Any:
    """The file's one JSON document, or JSON_LINES; a file that is neither is a DataError naming it."""
    if not text.strip():
        raise DataError(f"{path}: the file is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data" and _first_of_lines(text[: err.pos]):
            return JSON_LINES
        raise DataError(f"{path}: not valid JSON: {err}") from None
    except (ValueError, RecursionError) as err:  # an integer of over 4,300 digits; nesting past the stack
        raise DataError(f"{path}: not valid JSON: {err}") from None


def _first_of_lines(first: str) -> bool:
    """Whether the first of several JSON documents is the first record of JSON lines: one line, not a whole SQuAD
    file. Otherwise what follows the document is a fault to name where it is (a stray brace after a pretty-printed
    file, two files joined), not line 1 of JSON lines."""
    first = first.strip()
    if "\n" in first or "\r" in first:
        return False
    doc = json.loads(first)
    return not (isinstance(doc, dict) and "data" in doc)


def _list_at(path: Path, where: str, value: Any, of: str) -> list:
    if not isinstance(value, list):
        raise DataError(f"{path}: {where} must be a list of {of}, found {json_kind(value)}")
    return value


def _flatten_qa(path: Path, loc: str, qa: Any, title: Any, context: Any) -> Any:
    """One nested question as a flat record; a qa that is not an object is left for check_record to name."""
    if not isinstance(qa, dict):
        return qa
    answers = qa.get("answers")
    if answers is None and "answers" not in qa:  # a question to predict; check_record decides if that is allowed
        return {"id": qa.get("id"), "title": title, "context": context, "question": qa.get("question")}
    if not isinstance(answers, list):
        raise DataError(f"{path}: {place(loc, qa)}: 'answers' must be a list, found {json_kind(answers)}")
    for k, x in enumerate(answers):
        if not isinstance(x, dict):
            raise DataError(
                f"{path}: {place(loc, qa)}: answers[{k}] must be an object with 'text' and "
                f"'answer_start', found {json_kind(x)}"
            )
    flat = {
        "id": qa.get("id"),
        "title": title,
        "context": context,
        "question": qa.get("question"),
        "answers": {"text": [x.get("text") for x in answers], "answer_start": [x.get("answer_start") for x in answers]},
    }
    if "is_impossible" in qa:  # SQuAD v2.0's own flag, checked against the answers in _check_impossible
        flat["is_impossible"] = qa["is_impossible"]
    return flat


def _article_records(path: Path, base: str, article: dict[str, Any]) -> Iterator[Located]:
    """The questions of one nested SQuAD article, as flat records."""
    for p, para in enumerate(_list_at(path, f"{base}.paragraphs", article["paragraphs"], "paragraphs")):
        where = f"{base}.paragraphs[{p}]"
        if not isinstance(para, dict):
            raise DataError(f"{path}: {where} must be an object with 'context' and 'qas', found {json_kind(para)}")
        for key in ("context", "qas"):
            if key not in para:
                raise DataError(f"{path}: {where} lacks '{key}'")
        for q, qa in enumerate(_list_at(path, f"{where}.qas", para["qas"], "questions")):
            loc = f"{where}.qas[{q}]"
            yield loc, _flatten_qa(path, loc, qa, article.get("title", ""), para["context"])


def _not_an_article(item: Any, article: str) -> str:
    if isinstance(item, dict):
        return f"lacks 'paragraphs' ({article} is a nested SQuAD article)"
    return f"must be an article (an object with 'paragraphs'), found {json_kind(item)}"


def located_records(path: Path, text: str, doc: Any) -> Iterator[Located]:
    """Located flat records of `text`, read from `path` and parsed by `read_json` into `doc`."""
    if doc is JSON_LINES:
        yield from json_lines(path, text)
        return
    if isinstance(doc, dict) and "data" not in doc and ("question" in doc or "\n" not in text.strip()):
        yield "line 1", doc  # JSON lines holding a single record
        return
    wrapped = isinstance(doc, dict) and "data" in doc
    if wrapped:
        doc = _list_at(path, "'data'", doc["data"], "articles or records")
    if not isinstance(doc, list):
        raise DataError(
            f"{path}: expected SQuAD JSON with a 'data' list, JSON lines, or a list of records; found {json_kind(doc)}"
        )
    name = "data[{}]" if wrapped else "[{}]"
    # Nested if any item is an article: an article whose 'paragraphs' is misspelt is named for it wherever it is,
    # not read as a flat record and blamed for its 'id'.
    nested = next((a for a, item in enumerate(doc) if isinstance(item, dict) and "paragraphs" in item), None)
    for a, article in enumerate(doc):
        if isinstance(article, dict) and "paragraphs" in article:
            yield from _article_records(path, name.format(a), article)
        elif nested is not None:
            raise DataError(f"{path}: {name.format(a)} {_not_an_article(article, name.format(nested))}")
        else:
            yield (f"data[{a}]" if wrapped else f"record {a}"), article  # a flat record


def file_records(path: Path, text: str) -> Iterator[Located]:
    """Located flat records of a file's text."""
    return located_records(path, text, read_json(path, text))
