"""JSON lines, one document per line, each named `line N` for messages: the one reader of the format, for
training data (qa_train.data.load) and the scorer's gold answers (qa_train.squad.files)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from qa_train.data.records import DataError


def text_lines(text: str) -> list[str]:
    r"""Lines ended by \n, \r\n or \r. Not str.splitlines: it also breaks at U+2028, U+2029 and U+0085,
    which JSON allows raw inside strings, and would cut a valid record in two."""
    if "\r" in text:  # raw \r cannot occur inside a JSON string, so it can only end a line
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.split("\n")


def json_lines(path: Path, text: str) -> Iterator[tuple[str, Any]]:
    """(`line N`, document) for each non-blank line of `text`, read from `path`; a line that is not JSON is a
    DataError naming the file, the line and the column."""
    for lineno, line in enumerate(text_lines(text), 1):
        if line.strip():
            try:
                yield f"line {lineno}", json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}: line {lineno}: not valid JSON: {err.msg} at column {err.colno}") from None
            except (ValueError, RecursionError) as err:  # an integer of over 4,300 digits; nested too deeply
                raise DataError(f"{path}: line {lineno}: not valid JSON: {err}") from None
