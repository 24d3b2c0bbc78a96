"""The argparse parser every qa-train verb builds: a refusal is one line, `PROG: error: MESSAGE`, exit 2, as the
training parser's (argparse prints its whole usage first, burying the line that says what is wrong)."""

from __future__ import annotations

import argparse
import re
from typing import Any, NoReturn

# argparse (before Python 3.13) takes `-1e-3`, `-inf` or `-nan` for a flag, and refuses the flag before it with
# "expected one argument". No qa-train flag starts with a digit or spells inf or nan: each of these is a value, which
# the flag's own check then judges (a non-finite threshold is refused by name).
NEGATIVE_NUMBER = re.compile(r"^-(\.?\d|inf(inity)?$|nan$)", re.IGNORECASE)


class OneLineParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose errors are one line; --help prints as argparse's does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")
