"""SQuAD examples from the hub or from local files, validated record by record.

Local files may be the official nested SQuAD JSON (`data[].paragraphs[].qas[]`) or flat records
(`id, title, context, question, answers{text, answer_start}`) as JSON lines, the hub's layout.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable


class DataError(ValueError):
    """A record that cannot be trained or scored on; the message names the file and the question."""


@dataclass
class Examples:
    """Questions in columns: cheaper to hold and to slice than a list of dicts."""

    source: str
    ids: list[str] = field(default_factory=list)
    titles: list[str] = field(default_factory=list)
    contexts: list[str] = field(default_factory=list)
    questions: list[str] = field(default_factory=list)
    answer_texts: list[list[str]] = field(default_factory=list)
    answer_starts: list[list[int]] = field(default_factory=list)
    fingerprint: str = ""

    def __len__(self) -> int:
        return len(self.ids)

    def append(self, qid: str, title: str, context: str, question: str, texts: list[str], starts: list[int]) -> None:
        self.ids.append(qid)
        self.titles.append(title)
        self.contexts.append(context)
        self.questions.append(question)
        self.answer_texts.append(texts)
        self.answer_starts.append(starts)

    def head(self, n: int | None) -> Examples:
        if n is None or n >= len(self):
            return self
        return Examples(
            self.source, self.ids[:n], self.titles[:n], self.contexts[:n], self.questions[:n],
            self.answer_texts[:n], self.answer_starts[:n], f"{self.fingerprint}:head{n}",
        )

    def references(self) -> dict[str, list[str]]:
        return dict(zip(self.ids, self.answer_texts))


def _flat_records(path: Path, text: str) -> Iterable[dict[str, Any]]:
    """Yield flat records from nested SQuAD JSON, a JSON list/`{"data": [flat]}`, or JSON lines."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        if "Extra data" not in str(err):
            raise DataError(f"{path}: not valid JSON: {err}") from None
        doc = None
    if doc is None:  # JSON lines
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as err:
                    raise DataError(f"{path}: line {lineno}: not valid JSON: {err}") from None
        return
    if isinstance(doc, dict) and isinstance(doc.get("data"), list):
        doc = doc["data"]
    if not isinstance(doc, list):
        raise DataError(f"{path}: expected SQuAD JSON with a 'data' list, JSON lines, or a list of records")
    for a, article in enumerate(doc):
        if not isinstance(article, dict):
            raise DataError(f"{path}: data[{a}] is not an object")
        if "paragraphs" not in article:
            yield article  # already flat
            continue
        for p, para in enumerate(article["paragraphs"]):
            if "context" not in para or "qas" not in para:
                raise DataError(f"{path}: data[{a}].paragraphs[{p}] lacks 'context' or 'qas'")
            for qa in para["qas"]:
                answers = qa.get("answers")
                if not isinstance(answers, list):
                    raise DataError(f"{path}: question {qa.get('id', '?')}: 'answers' must be a list")
                yield {
                    "id": qa.get("id"), "title": article.get("title", ""), "context": para["context"],
                    "question": qa.get("question"),
                    "answers": {"text": [x.get("text") for x in answers],
                                "answer_start": [x.get("answer_start") for x in answers]},
                }


def _check_record(rec: dict[str, Any], where: str, need_answers: bool) -> tuple[list[str], list[int]]:
    qid = rec.get("id")
    if not isinstance(qid, (str, int)) or str(qid) == "":
        raise DataError(f"{where}: a question has no 'id'")
    for key in ("context", "question"):
        value = rec.get(key)
        if not isinstance(value, str):
            raise DataError(f"{where}: question {qid}: missing field '{key}'")
        if not value.strip():
            raise DataError(f"{where}: question {qid}: empty {key}")
    answers = rec.get("answers")
    if not isinstance(answers, dict) or "text" not in answers or "answer_start" not in answers:
        raise DataError(f"{where}: question {qid}: missing field 'answers' with 'text' and 'answer_start'")
    texts, starts = list(answers["text"]), list(answers["answer_start"])
    if len(texts) != len(starts):
        raise DataError(f"{where}: question {qid}: {len(texts)} answer texts but {len(starts)} answer_start values")
    if need_answers and not texts:
        raise DataError(f"{where}: question {qid}: no answers (SQuAD v1.1 questions are all answerable)")
    context = rec["context"]
    for text, start in zip(texts, starts):
        if not isinstance(text, str) or not text.strip():
            raise DataError(f"{where}: question {qid}: empty answer text")
        if not isinstance(start, int) or start < 0 or start + len(text) > len(context):
            raise DataError(f"{where}: question {qid}: answer_start {start!r} is outside the context "
                            f"({len(context)} characters)")
        if context[start:start + len(text)] != text:
            raise DataError(f"{where}: question {qid}: answer_start {start} does not match text {text!r} "
                            f"(the context there reads {context[start:start + len(text)]!r})")
    return texts, starts


def build_examples(records: Iterable[dict[str, Any]], where: str, need_answers: bool) -> Examples:
    """Validate every record; refuse duplicates and mismatched spans with the question id."""
    out = Examples(source=where)
    seen: set[str] = set()
    for rec in records:
        texts, starts = _check_record(rec, where, need_answers)
        qid = str(rec["id"])
        if qid in seen:
            raise DataError(f"{where}: question {qid}: duplicate id")
        seen.add(qid)
        out.append(qid, rec.get("title") or "", rec["context"], rec["question"], texts, starts)
    if not out.ids:
        raise DataError(f"{where}: no questions found")
    return out


def load_file(path: str | Path, need_answers: bool = True) -> Examples:
    path = Path(path)
    raw = path.read_bytes()
    examples = build_examples(_flat_records(path, raw.decode("utf-8")), str(path), need_answers)
    examples.fingerprint = hashlib.sha256(raw).hexdigest()[:16]
    return examples


def load_hub(name: str, config_name: str | None, split: str, need_answers: bool = True) -> Examples:
    import datasets  # heavy; only needed on the hub path

    ds = datasets.load_dataset(name, config_name, split=split)
    records = ds.select_columns(["id", "title", "context", "question", "answers"]).to_list()
    examples = build_examples(records, f"{name}[{split}]", need_answers)
    examples.fingerprint = getattr(ds, "_fingerprint", "") or hashlib.sha256(name.encode()).hexdigest()[:16]
    return examples


def load_split(file: str | None, dataset_name: str | None, config_name: str | None, split: str,
               limit: int | None) -> Examples:
    """Local file if given, else the hub dataset's split; then the first `limit` questions."""
    examples = load_file(file) if file else load_hub(str(dataset_name), config_name, split)
    return examples.head(limit)
