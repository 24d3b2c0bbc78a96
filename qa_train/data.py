"""SQuAD examples from the hub or from local files, validated record by record.

Local files may be the official nested SQuAD JSON (`data[].paragraphs[].qas[]`) or flat records
(`id, title, context, question, answers{text, answer_start}`) as JSON lines, the hub's layout.
Every fault is one DataError line naming the file, the record's place (`data[a].paragraphs[p].qas[q]`,
`line N` of JSON lines, `record i` of a list) with its id when it has one, and the problem.

What a record must say about its answers depends on the split (`AnswerRule`): SQuAD v1.1 questions all
have one, SQuAD v2.0 ones may have none (an empty list), and questions to predict need not say.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal

# required: SQuAD v1.1, every question answered; may_be_empty: SQuAD v2.0, `answers` present but possibly
# empty (unanswerable); optional: questions to predict, `answers` may be absent altogether.
AnswerRule = Literal["required", "may_be_empty", "optional"]


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


# Where a record sits, for messages: `data[a].paragraphs[p].qas[q]`, `line N` or `record i`.
Located = tuple[str, Any]

# Characters that show nothing: whitespace, controls and format characters (zero-width space U+200B,
# BOM U+FEFF, joiners, bidi marks). A question made of them tokenises to nothing.
_INVISIBLE = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})
# Combining marks (U+0301, ...) show only on a base character; uncased tokenizers strip them as accents, so a
# text made of nothing else (and invisible characters) tokenises to nothing too.
_MARKS = frozenset({"Mn", "Me"})

# What compressed files start with: they are refused by name rather than as "not UTF-8".
_COMPRESSED = ((b"\x1f\x8b", "gzip", "gunzip"), (b"\xfd7zXZ\x00", "xz", "unxz"), (b"BZh", "bzip2", "bunzip2"),
               (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"), (b"PK\x03\x04", "zip", "unzip"))


def _kind(value: Any) -> str:
    """A JSON value's type, in JSON's words, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for types, name in ((str, "a string"), ((int, float), "a number"), (list, "a list"), (dict, "an object")):
        if isinstance(value, types):
            return name
    return type(value).__name__


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
        raise DataError(f"{path}: not UTF-8 text: byte {offset} (line {line}) is 0x{raw[offset]:02x} "
                        f"({err.reason}); save the file as UTF-8") from None


def text_lines(text: str) -> list[str]:
    r"""Lines ended by \n, \r\n or \r. Not str.splitlines: it also breaks at U+2028, U+2029 and U+0085,
    which JSON allows raw inside strings, and would cut a valid record in two."""
    if "\r" in text:  # raw \r cannot occur inside a JSON string, so it can only end a line
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.split("\n")


def _json_lines(path: Path, text: str) -> Iterator[Located]:
    for lineno, line in enumerate(text_lines(text), 1):
        if line.strip():
            try:
                yield f"line {lineno}", json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}: line {lineno}: not valid JSON: {err.msg} at column {err.colno}") from None
            except RecursionError as err:  # nested too deeply
                raise DataError(f"{path}: line {lineno}: not valid JSON: {err}") from None


def _list_at(path: Path, where: str, value: Any, of: str) -> list:
    if not isinstance(value, list):
        raise DataError(f"{path}: {where} must be a list of {of}, found {_kind(value)}")
    return value


def _flatten_qa(path: Path, loc: str, qa: Any, title: Any, context: Any) -> Any:
    """One nested question as a flat record; a qa that is not an object is left for _check_record to name."""
    if not isinstance(qa, dict):
        return qa
    answers = qa.get("answers")
    if answers is None and "answers" not in qa:  # a question to predict; _checked decides if that is allowed
        return {"id": qa.get("id"), "title": title, "context": context, "question": qa.get("question")}
    if not isinstance(answers, list):
        raise DataError(f"{path}: {_at(loc, qa)}: 'answers' must be a list, found {_kind(answers)}")
    for k, x in enumerate(answers):
        if not isinstance(x, dict):
            raise DataError(f"{path}: {_at(loc, qa)}: answers[{k}] must be an object with 'text' and "
                            f"'answer_start', found {_kind(x)}")
    flat = {"id": qa.get("id"), "title": title, "context": context, "question": qa.get("question"),
            "answers": {"text": [x.get("text") for x in answers],
                        "answer_start": [x.get("answer_start") for x in answers]}}
    if "is_impossible" in qa:  # SQuAD v2.0's own flag, checked against the answers in _check_impossible
        flat["is_impossible"] = qa["is_impossible"]
    return flat


def _article_records(path: Path, base: str, article: dict[str, Any]) -> Iterator[Located]:
    """The questions of one nested SQuAD article, as flat records."""
    for p, para in enumerate(_list_at(path, f"{base}.paragraphs", article["paragraphs"], "paragraphs")):
        where = f"{base}.paragraphs[{p}]"
        if not isinstance(para, dict):
            raise DataError(f"{path}: {where} must be an object with 'context' and 'qas', found {_kind(para)}")
        for key in ("context", "qas"):
            if key not in para:
                raise DataError(f"{path}: {where} lacks '{key}'")
        for q, qa in enumerate(_list_at(path, f"{where}.qas", para["qas"], "questions")):
            loc = f"{where}.qas[{q}]"
            yield loc, _flatten_qa(path, loc, qa, article.get("title", ""), para["context"])


def _not_an_article(item: Any) -> str:
    if isinstance(item, dict):
        return "lacks 'paragraphs' (the articles before it are nested SQuAD)"
    return f"must be an article (an object with 'paragraphs'), found {_kind(item)}"


def _flat_records(path: Path, text: str) -> Iterator[Located]:
    """Located flat records from nested SQuAD JSON, a JSON list/`{"data": [flat]}`, or JSON lines."""
    if not text.strip():
        raise DataError(f"{path}: the file is empty")
    json_lines = False
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg != "Extra data":
            raise DataError(f"{path}: not valid JSON: {err}") from None
        json_lines = True  # one document per line
    except RecursionError as err:
        raise DataError(f"{path}: not valid JSON: {err}") from None
    if json_lines:
        yield from _json_lines(path, text)
        return
    if isinstance(doc, dict) and "data" not in doc and "question" in doc:
        yield "line 1", doc  # JSON lines holding a single record
        return
    wrapped = isinstance(doc, dict) and "data" in doc
    if wrapped:
        doc = _list_at(path, "'data'", doc["data"], "articles or records")
    if not isinstance(doc, list):
        raise DataError(f"{path}: expected SQuAD JSON with a 'data' list, JSON lines, or a list of records; "
                        f"found {_kind(doc)}")
    nested = bool(doc) and isinstance(doc[0], dict) and "paragraphs" in doc[0]
    for a, article in enumerate(doc):
        if isinstance(article, dict) and "paragraphs" in article:
            yield from _article_records(path, f"data[{a}]" if wrapped else f"[{a}]", article)
        elif nested:  # read as a flat record, an article without paragraphs would be blamed for its 'id'
            raise DataError(f"{path}: {'data' if wrapped else ''}[{a}] {_not_an_article(article)}")
        else:
            yield (f"data[{a}]" if wrapped else f"record {a}"), article  # a flat record


class _Problem(ValueError):
    """What is wrong with one record; _check_record adds the file, the place and the id."""


def _usable_id(rec: dict[str, Any]) -> str | None:
    qid = rec.get("id")
    if isinstance(qid, bool) or not isinstance(qid, (str, int)) or not str(qid).strip():
        return None
    return str(qid)


def _shown(qid: str) -> str:
    """The id as a message shows it: quoted when it holds a line break or other unprintable character."""
    return qid if qid.isprintable() else repr(qid)


def _at(loc: str, rec: Any) -> str:
    """The record's place, and its id when it has one."""
    qid = _usable_id(rec) if isinstance(rec, dict) else None
    return loc if qid is None else f"{loc}: question {_shown(qid)}"


def _invisible(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch) in _INVISIBLE


def _check_shows_something(text: str, what: str) -> None:
    """Callers skip this when the text starts with a letter or digit: it runs three times per question."""
    shown = text.strip()
    if not shown:
        raise _Problem(f"empty {what}")
    if all(_invisible(ch) or unicodedata.category(ch) in _MARKS for ch in shown):  # stops at the first visible one
        codes = sorted({f"U+{ord(ch):04X}" for ch in text if not ch.isspace()})
        kinds = ("invisible characters and combining marks" if any(unicodedata.category(ch) in _MARKS for ch in shown)
                 else "invisible characters")
        raise _Problem(f"empty {what} (only {kinds}: {', '.join(codes[:4])})")


def _check_encodable(text: str, what: str) -> None:
    """A lone UTF-16 surrogate (a JSON \\ud83d escape cut from its pair) is a str no tokenizer can encode."""
    if text.isascii():  # the common case, ~50x cheaper than encoding
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise _Problem(f"{what} holds a lone UTF-16 surrogate U+{ord(text[err.start]):04X} at character {err.start} "
                       "(half of a \\uXXXX pair; the other half was lost)") from None


def _check_id(rec: dict[str, Any]) -> str:
    qid = _usable_id(rec)
    if qid is None:
        raw = rec.get("id")
        raise _Problem("question has no 'id'" if raw is None or isinstance(raw, str)
                       else f"'id' must be a string or an integer, found {_kind(raw)}")
    _check_encodable(qid, "'id'")  # the predictions files are written as UTF-8, after training
    return qid


def _check_texts(rec: dict[str, Any]) -> None:
    for key in ("context", "question"):
        value = rec.get(key)
        if not isinstance(value, str):
            raise _Problem(f"missing field '{key}'" if value is None
                           else f"'{key}' must be a string, found {_kind(value)}")
        if not value[:1].isalnum():
            _check_shows_something(value, key)
        _check_encodable(value, f"'{key}'")
    title = rec.get("title")
    if title is not None and not isinstance(title, str):
        raise _Problem(f"'title' must be a string, found {_kind(title)}")


def _answer_lists(rec: dict[str, Any], rule: AnswerRule) -> tuple[list, list]:
    answers = rec.get("answers")
    if answers is None and "answers" not in rec and rule == "optional":
        return [], []
    if not isinstance(answers, dict):
        raise _Problem("missing field 'answers' with 'text' and 'answer_start'" if answers is None else
                       f"'answers' must be an object with 'text' and 'answer_start' lists, found {_kind(answers)}")
    for key in ("text", "answer_start"):
        if key not in answers:
            raise _Problem(f"missing field 'answers' with 'text' and 'answer_start' (no '{key}')")
        if not isinstance(answers[key], (list, tuple)):
            raise _Problem(f"'answers.{key}' must be a list, found {_kind(answers[key])}")
    texts, starts = list(answers["text"]), list(answers["answer_start"])
    if len(texts) != len(starts):
        raise _Problem(f"{len(texts)} answer texts but {len(starts)} answer_start values")
    return texts, starts


def _check_span(k: int, text: Any, start: Any, context: str) -> None:
    """Answer k's text must sit at its start in the context."""
    if not isinstance(text, str):
        raise _Problem(f"answer {k}: 'text' must be a string, found {_kind(text)}")
    if not text[:1].isalnum():
        _check_shows_something(text, "answer text")
    if isinstance(start, bool) or not isinstance(start, int):
        raise _Problem(f"answer {k}: 'answer_start' must be an integer, found {start!r}")
    if start < 0 or start + len(text) > len(context):
        raise _Problem(f"answer_start {start!r} is outside the context ({len(context)} characters)")
    if context[start:start + len(text)] != text:
        there = context[start:start + len(text)]
        raise _Problem(f"answer_start {start} does not match text {text!r} (the context there reads {there!r})"
                       f"{_unicode_form_hint(text, context)}")


def _unicode_form_hint(text: str, context: str) -> str:
    """'café' precomposed and 'cafe' + U+0301 print alike: say so, or the message looks like a contradiction."""
    if text in context or unicodedata.normalize("NFC", text) not in unicodedata.normalize("NFC", context):
        return ""
    return "; the context writes the text in another Unicode form: normalise the file to NFC"


def _check_impossible(rec: dict[str, Any], texts: list) -> None:
    """SQuAD v2.0's is_impossible must agree with the answers, or the question trains as the opposite of what
    the file says it is."""
    flag = rec["is_impossible"]
    if not isinstance(flag, bool):
        raise _Problem(f"'is_impossible' must be true or false, found {_kind(flag)}")
    if flag and texts:
        raise _Problem(f"'is_impossible' is true but it has {len(texts)} answer(s) (unanswerable questions have "
                       "none; SQuAD v2.0 keeps their spans in 'plausible_answers')")
    if not flag and not texts:
        raise _Problem("'is_impossible' is false but 'answers' is empty")


def _checked(rec: Any, rule: AnswerRule) -> tuple[str, list[str], list[int]]:
    if not isinstance(rec, dict):
        raise _Problem(f"expected an object (one question), found {_kind(rec)}")
    qid = _check_id(rec)
    _check_texts(rec)
    texts, starts = _answer_lists(rec, rule)
    if "is_impossible" in rec and "answers" in rec:
        _check_impossible(rec, texts)
    if rule == "required" and not texts:
        raise _Problem("no answers (SQuAD v1.1 questions are all answerable; for SQuAD v2.0 data, where a "
                       "question may have none, pass --version_2_with_negative)")
    for k, (text, start) in enumerate(zip(texts, starts)):
        _check_span(k, text, start, rec["context"])
    return qid, texts, starts


def _check_record(rec: Any, where: str, loc: str, rule: AnswerRule) -> tuple[str, list[str], list[int]]:
    """The record's (id, answer texts, answer starts); a DataError naming the file, the place and the id."""
    try:
        return _checked(rec, rule)
    except _Problem as problem:
        raise DataError(f"{where}: {_at(loc, rec)}: {problem}") from None


def build_examples(records: Iterable[Located], where: str, rule: AnswerRule) -> Examples:
    """Validate every (place, record); refuse duplicates and mismatched spans with the place and question id."""
    out = Examples(source=where)
    first_at: dict[str, str] = {}
    for loc, rec in records:
        qid, texts, starts = _check_record(rec, where, loc, rule)
        if qid in first_at:
            raise DataError(f"{where}: {loc}: question {_shown(qid)}: duplicate id (first at {first_at[qid]})")
        first_at[qid] = loc
        out.append(qid, rec.get("title") or "", rec["context"], rec["question"], texts, starts)
    if not out.ids:
        raise DataError(f"{where}: no questions found")
    return out


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
    examples = build_examples(_flat_records(path, _decode(path, raw)), str(path), rule)
    examples.fingerprint = hashlib.sha256(raw).hexdigest()[:16]  # of the bytes as stored, BOM and all
    return examples


def load_hub(name: str, config_name: str | None, split: str, rule: AnswerRule = "required") -> Examples:
    import datasets  # heavy; only needed on the hub path

    ds = datasets.load_dataset(name, config_name, split=split)
    columns = [c for c in ("id", "title", "context", "question", "answers") if c in ds.column_names]
    records = ds.select_columns(columns).to_list()
    located = ((f"record {i}", rec) for i, rec in enumerate(records))
    examples = build_examples(located, f"{name}[{split}]", rule)
    examples.fingerprint = getattr(ds, "_fingerprint", "") or hashlib.sha256(name.encode()).hexdigest()[:16]
    return examples


def load_split(file: str | None, dataset_name: str | None, config_name: str | None, split: str,
               limit: int | None, rule: AnswerRule = "required") -> Examples:
    """Local file if given, else the hub dataset's split; then the first `limit` questions."""
    examples = load_file(file, rule) if file else load_hub(str(dataset_name), config_name, split, rule)
    return examples.head(limit)
