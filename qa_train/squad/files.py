"""Reading the scorer's files: gold answers (official SQuAD JSON, or flat records as training reads them),
predictions and no-answer probabilities, each refused in one line naming the file and the question."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import math
from collections.abc import Callable, Iterable
from pathlib import Path

from qa_train.data.layouts import located_records, read_json

# The SQuAD files are often kept compressed (dev-v1.1.json.xz): read as they are, not refused as "not UTF-8".
_COMPRESSED: tuple[tuple[bytes, str, Callable[[bytes], bytes]], ...] = (
    (b"\xfd7zXZ\x00", "xz", lzma.decompress),
    (b"\x1f\x8b", "gzip", gzip.decompress),
    (b"BZh", "bzip2", bz2.decompress),
)


def read_text(path: Path) -> str:
    """The file's UTF-8 text, decompressed first when it is xz, gzip or bzip2."""
    raw = path.read_bytes()
    for magic, kind, decompress in _COMPRESSED:
        if raw.startswith(magic):
            try:
                raw = decompress(raw)
            except (lzma.LZMAError, OSError, EOFError, ValueError) as err:
                raise ValueError(f"{path}: a damaged {kind} file ({err})") from None
            break
    try:
        return raw.decode("utf-8-sig")  # a leading BOM is not data, as training reads it
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None


def _read_json(path: Path) -> object:
    try:
        return json.loads(read_text(path))
    except (ValueError, RecursionError) as err:  # JSONDecodeError, an integer of over 4,300 digits, deep nesting
        raise ValueError(f"{path}: not valid JSON: {err}") from None


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


def _flat_references(path: Path, records: Iterable[tuple[str, object]]) -> dict[str, list[str]]:
    """(place, record) pairs of flat records: {"id", "answers": {"text": [...]}}."""
    refs: dict[str, list[str]] = {}
    for where, record in records:
        if not isinstance(record, dict) or "id" not in record or "answers" not in record:
            raise ValueError(f"{path}: {where}: expected an object with 'id' and 'answers'")
        answers = record["answers"]
        if not isinstance(answers, dict) or "text" not in answers:
            raise ValueError(f"{path}: {where}: 'answers' must be an object with a 'text' list, got {answers!r}")
        _add(path, refs, record["id"], _answer_texts(path, record["id"], answers["text"]))
    return refs


def read_references(path: Path) -> tuple[dict[str, list[str]], str | None]:
    """(id -> gold answer texts, the file's "version") from any file training reads (qa_train.data.layouts):
    official SQuAD JSON, a JSON list of flat records, `{"data": [...]}` or JSON lines."""
    text = read_text(path)
    whole = read_json(path, text)
    refs = _flat_references(path, located_records(path, text, whole))
    if not refs:
        raise ValueError(f"{path}: contains no questions")
    version = whole.get("version") if isinstance(whole, dict) else None
    return refs, (None if version is None else str(version))


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
        # json reads NaN and Infinity; training's odds are always finite (postprocess.NO_SPAN_ODDS).
        if numbers and not math.isfinite(v):
            raise ValueError(f"{path}: question {qid}: no-answer probability must be a finite number, got {v}")
        if not numbers and not isinstance(v, str):
            raise ValueError(f"{path}: question {qid}: prediction must be a string, got {v!r}")
    return mapping


def load_na_probs(path: str | Path) -> dict[str, float]:
    """Read a ``{question_id: no-answer probability or odds}`` JSON file (the official --na-prob-file)."""
    return {qid: float(v) for qid, v in _load_mapping(path, numbers=True).items()}


def load_predictions(path: str | Path) -> dict[str, str]:
    """Read a ``{question_id: answer_text}`` JSON file."""
    return _load_mapping(path, numbers=False)
