"""One SQuAD record checked: its id, texts and answers, each fault one line naming the file, place and id.

load.py reads files into located records (the place of each in its file) and calls `check_record` on each.
"""

from __future__ import annotations

import unicodedata
from typing import Any, Literal

# required: SQuAD v1.1, every question answered; may_be_empty: SQuAD v2.0, `answers` present but possibly
# empty (unanswerable); optional: questions to predict, `answers` may be absent altogether.
AnswerRule = Literal["required", "may_be_empty", "optional"]


class DataError(ValueError):
    """A record that cannot be trained or scored on; the message names the file and the question."""


# Characters that show nothing: whitespace, controls and format characters (zero-width space U+200B,
# BOM U+FEFF, joiners, bidi marks). A question made of them tokenises to nothing.
_INVISIBLE = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})
# Combining marks (U+0301, ...) show only on a base character; uncased tokenizers strip them as accents, so a
# text made of nothing else (and invisible characters) tokenises to nothing too.
_MARKS = frozenset({"Mn", "Me"})


def json_kind(value: Any) -> str:
    """A JSON value's type, in JSON's words, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for types, name in ((str, "a string"), ((int, float), "a number"), (list, "a list"), (dict, "an object")):
        if isinstance(value, types):
            return name
    return type(value).__name__


class _Problem(ValueError):
    """What is wrong with one record; check_record adds the file, the place and the id."""


def usable_id(rec: dict[str, Any]) -> str | None:
    qid = rec.get("id")
    if isinstance(qid, bool) or not isinstance(qid, (str, int)) or not str(qid).strip():
        return None
    return str(qid)


def shown_id(qid: str) -> str:
    """The id as a message shows it: quoted when it holds a line break or other unprintable character."""
    return qid if qid.isprintable() else repr(qid)


def place(loc: str, rec: Any) -> str:
    """The record's place, and its id when it has one."""
    qid = usable_id(rec) if isinstance(rec, dict) else None
    return loc if qid is None else f"{loc}: question {shown_id(qid)}"


def _invisible(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch) in _INVISIBLE


def _check_shows_something(text: str, what: str) -> None:
    """Callers skip this when the text starts with a letter or digit: it runs three times per question."""
    shown = text.strip()
    if not shown:
        raise _Problem(f"empty {what}")
    if all(_invisible(ch) or unicodedata.category(ch) in _MARKS for ch in shown):  # stops at the first visible one
        codes = sorted({f"U+{ord(ch):04X}" for ch in text if not ch.isspace()})
        kinds = (
            "invisible characters and combining marks"
            if any(unicodedata.category(ch) in _MARKS for ch in shown)
            else "invisible characters"
        )
        raise _Problem(f"empty {what} (only {kinds}: {', '.join(codes[:4])})")


def _check_encodable(text: str, what: str) -> None:
    """A lone UTF-16 surrogate (a JSON \\ud83d escape cut from its pair) is a str no tokenizer can encode."""
    if text.isascii():  # the common case, ~50x cheaper than encoding
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise _Problem(
            f"{what} holds a lone UTF-16 surrogate U+{ord(text[err.start]):04X} at character {err.start} "
            "(half of a \\uXXXX pair; the other half was lost)"
        ) from None


def _check_id(rec: dict[str, Any]) -> str:
    qid = usable_id(rec)
    if qid is None:
        raw = rec.get("id")
        raise _Problem(
            "question has no 'id'"
            if raw is None or isinstance(raw, str)
            else f"'id' must be a string or an integer, found {json_kind(raw)}"
        )
    _check_encodable(qid, "'id'")  # the predictions files are written as UTF-8, after training
    return qid


def _check_texts(rec: dict[str, Any]) -> None:
    for key in ("context", "question"):
        value = rec.get(key)
        if not isinstance(value, str):
            raise _Problem(
                f"missing field '{key}'" if value is None else f"'{key}' must be a string, found {json_kind(value)}"
            )
        if not value[:1].isalnum():
            _check_shows_something(value, key)
        _check_encodable(value, f"'{key}'")
    title = rec.get("title")
    if title is not None and not isinstance(title, str):
        raise _Problem(f"'title' must be a string, found {json_kind(title)}")


def _answer_lists(rec: dict[str, Any], rule: AnswerRule) -> tuple[list, list]:
    answers = rec.get("answers")
    if answers is None and "answers" not in rec and rule == "optional":
        return [], []
    if not isinstance(answers, dict):
        raise _Problem(
            "missing field 'answers' with 'text' and 'answer_start'"
            if answers is None
            else f"'answers' must be an object with 'text' and 'answer_start' lists, found {json_kind(answers)}"
        )
    for key in ("text", "answer_start"):
        if key not in answers:
            raise _Problem(f"missing field 'answers' with 'text' and 'answer_start' (no '{key}')")
        if not isinstance(answers[key], (list, tuple)):
            raise _Problem(f"'answers.{key}' must be a list, found {json_kind(answers[key])}")
    texts, starts = list(answers["text"]), list(answers["answer_start"])
    if len(texts) != len(starts):
        raise _Problem(f"{len(texts)} answer texts but {len(starts)} answer_start values")
    return texts, starts


def _check_span(k: int, text: Any, start: Any, context: str) -> None:
    """Answer k's text must sit at its start in the context."""
    if not isinstance(text, str):
        raise _Problem(f"answer {k}: 'text' must be a string, found {json_kind(text)}")
    if not text[:1].isalnum():
        _check_shows_something(text, "answer text")
    if isinstance(start, bool) or not isinstance(start, int):
        raise _Problem(f"answer {k}: 'answer_start' must be an integer, found {start!r}")
    if start < 0 or start + len(text) > len(context):
        raise _Problem(f"answer_start {start!r} is outside the context ({len(context)} characters)")
    if context[start : start + len(text)] != text:
        there = context[start : start + len(text)]
        raise _Problem(
            f"answer_start {start} does not match text {text!r} (the context there reads {there!r})"
            f"{_unicode_form_hint(text, context)}"
        )


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
        raise _Problem(f"'is_impossible' must be true or false, found {json_kind(flag)}")
    if flag and texts:
        raise _Problem(
            f"'is_impossible' is true but it has {len(texts)} answer(s) (unanswerable questions have "
            "none; SQuAD v2.0 keeps their spans in 'plausible_answers')"
        )
    if not flag and not texts:
        raise _Problem("'is_impossible' is false but 'answers' is empty")


def _checked(rec: Any, rule: AnswerRule) -> tuple[str, list[str], list[int]]:
    if not isinstance(rec, dict):
        raise _Problem(f"expected an object (one question), found {json_kind(rec)}")
    qid = _check_id(rec)
    _check_texts(rec)
    texts, starts = _answer_lists(rec, rule)
    if "is_impossible" in rec and "answers" in rec:
        _check_impossible(rec, texts)
    if rule == "required" and not texts:
        raise _Problem(
            "no answers (SQuAD v1.1 questions are all answerable; for SQuAD v2.0 data, where a "
            "question may have none, pass --version_2_with_negative)"
        )
    for k, (text, start) in enumerate(zip(texts, starts)):
        _check_span(k, text, start, rec["context"])
    return qid, texts, starts


def check_record(rec: Any, where: str, loc: str, rule: AnswerRule) -> tuple[str, list[str], list[int]]:
    """The record's (id, answer texts, answer starts); a DataError naming the file, the place and the id."""
    try:
        return _checked(rec, rule)
    except _Problem as problem:
        raise DataError(f"{where}: {place(loc, rec)}: {problem}") from None
