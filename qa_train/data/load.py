"""SQuAD examples from the hub or from local files, validated record by record.

Local files may be the official nested SQuAD JSON (`data[].paragraphs[].qas[]`) or flat records
(`id, title, context, question, answers{text, answer_start}`) as JSON lines, the hub's layout (layouts.py).
Every fault is one DataError line naming the file, the record's place (`data[a].paragraphs[p].qas[q]`,
`line N` of JSON lines, `record i` of a list) with its id when it has one, and the problem.

What a record must say about its answers depends on the split (`AnswerRule`): SQuAD v1.1 questions all
have one, SQuAD v2.0 ones may have none (an empty list), and questions to predict need not say.
"""

from __future__ import annotations

import codecs
import hashlib
import logging
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from qa_train.data.hub import HubDataset, folder_fingerprint, open_split
from qa_train.data.layouts import Located, file_records

# DataError and AnswerRule are imported from here by the rest of qa_train; records.py only checks.
from qa_train.data.records import AnswerRule, DataError, check_record, shown_id


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
    # Records read as NFC from another Unicode form: their windows differ from the file's, so do cached ones.
    normalised: int = 0

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
            self.source,
            self.ids[:n],
            self.titles[:n],
            self.contexts[:n],
            self.questions[:n],
            self.answer_texts[:n],
            self.answer_starts[:n],
            f"{self.fingerprint}:head{n}",
        )

    def references(self) -> dict[str, list[str]]:
        return dict(zip(self.ids, self.answer_texts))


log = logging.getLogger("qa_train")

# What compressed files start with: they are refused by name rather than as "not UTF-8".
_COMPRESSED = (
    (b"\x1f\x8b", "gzip", "gunzip"),
    (b"\xfd7zXZ\x00", "xz", "unxz"),
    (b"BZh", "bzip2", "bunzip2"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
    (b"PK\x03\x04", "zip", "unzip"),
)


def _refuse_compressed(path: Path, raw: bytes) -> None:
    for magic, kind, tool in _COMPRESSED:
        if raw.startswith(magic):
            raise DataError(f"{path}: is {kind}-compressed, not JSON text; decompress it first ({tool} {path})")


def _decode(path: Path, raw: bytes) -> str:
    _refuse_compressed(path, raw)
    try:
        return raw.decode("utf-8-sig")  # a leading BOM (Windows editors write one) is not data
    except UnicodeDecodeError as err:
        offset = err.start + (len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0)
        line = raw.count(b"\n", 0, offset) + 1
        raise DataError(
            f"{path}: not UTF-8 text: byte {offset} (line {line}) is 0x{raw[offset]:02x} "
            f"({err.reason}); save the file as UTF-8"
        ) from None


def build_examples(records: Iterable[Located], where: str, rule: AnswerRule) -> Examples:
    """Validate every (place, record); refuse duplicates and mismatched spans with the place and question id."""
    out = Examples(source=where)
    first_at: dict[str, str] = {}
    for loc, rec in records:
        qid, texts, starts = check_record(rec, where, loc, rule)
        if qid in first_at:
            raise DataError(f"{where}: {loc}: question {shown_id(qid)}: duplicate id (first at {first_at[qid]})")
        first_at[qid] = loc
        context, question, texts, starts, changed = _nfc(rec["context"], rec["question"], texts, starts)
        out.normalised += changed
        out.append(qid, rec.get("title") or "", context, question, texts, starts)
    if not out.ids:
        raise DataError(f"{where}: no questions found")
    if out.normalised:
        log.info("%s: %d record(s) not in Unicode NFC are read as NFC", where, out.normalised)
    return out


def _nfc(
    context: str, question: str, texts: list[str], starts: list[int]
) -> tuple[str, str, list[str], list[int], bool]:
    """The record in NFC, its answer starts moved with the text. Decomposed text ('Jose' + U+0301) could never
    match exactly: an uncased tokenizer drops the lone mark, so a predicted span ends before it while the
    reference keeps it. A span whose text composes with what follows it in the context stays as written."""
    if all(unicodedata.is_normalized("NFC", t) for t in (context, question, *texts)):
        return context, question, texts, starts, False
    nfc_context = unicodedata.normalize("NFC", context)
    nfc_texts = [unicodedata.normalize("NFC", t) for t in texts]
    nfc_starts = [len(unicodedata.normalize("NFC", context[:start])) for start in starts]
    if any(nfc_context[s : s + len(t)] != t for s, t in zip(nfc_starts, nfc_texts)):
        return context, question, texts, starts, False
    return nfc_context, unicodedata.normalize("NFC", question), nfc_texts, nfc_starts, True


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not a file") from None
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as err:
        raise DataError(f"{path}: cannot be read: {err.strerror or err}") from None


def load_file(path: str | Path, rule: AnswerRule = "required") -> Examples:
    path = Path(path)
    raw = _read(path)
    examples = build_examples(file_records(path, _decode(path, raw)), str(path), rule)
    examples.fingerprint = hashlib.sha256(raw).hexdigest()[:16]  # of the bytes as stored, BOM and all
    if examples.normalised:  # windows cached before records were read as NFC are not these
        examples.fingerprint += "+nfc"
    return examples


def load_hub(source: HubDataset, split: str, rule: AnswerRule = "required") -> Examples:
    ds = open_split(source, split)
    columns = [c for c in ("id", "title", "context", "question", "answers") if c in ds.column_names]
    records = ds.select_columns(columns).to_list()
    located = ((f"record {i}", rec) for i, rec in enumerate(records))
    examples = build_examples(located, f"{source.name}[{split}]", rule)
    examples.fingerprint = (
        folder_fingerprint(source, split)
        or getattr(ds, "_fingerprint", "")
        or hashlib.sha256(source.name.encode()).hexdigest()[:16]
    )
    if examples.normalised:
        examples.fingerprint += "+nfc"
    return examples


def load_split(
    file: str | None, hub: HubDataset | None, split: str, limit: int | None, rule: AnswerRule = "required"
) -> Examples:
    """Local file if given, else the hub dataset's split; then the first `limit` questions."""
    if file:
        return load_file(file, rule).head(limit)
    assert hub is not None, "a split comes from a file or from the hub (TrainArgs makes sure of one)"
    return load_hub(hub, split, rule).head(limit)
