"""Every command the README and docs show parses as written: the verb exists and each flag is one its parser (and,
for the flags passed on to training, the training parser; for `accelerate launch`, accelerate's) accepts.

Each parser is stopped right after it has read the command line, so nothing runs; what a flag's value must satisfy
beyond its type (files that exist, a GPU) is checked by the tests of each verb.
"""

from __future__ import annotations

import argparse
import re
import shlex
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from qa_train import cli
from qa_train.config import flags

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
STARTS = re.compile(r"^(srun\s+(-\S+\s+)*)?(qa-train |python -m qa_train( |$)|accelerate launch )")


def documented_commands() -> Iterator[tuple[str, str]]:
    """(file:line, command) for every indented code line that runs qa-train, continuation lines joined."""
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        i = 0
        while i < len(lines):
            start, line = i, lines[i]
            i += 1
            if not line.startswith("    ") or not STARTS.match(line.strip()):
                continue
            while line.rstrip().endswith("\\") and i < len(lines):
                line = line.rstrip()[:-1] + " " + lines[i].strip()
                i += 1
            yield f"{doc.relative_to(ROOT)}:{start + 1}", line.split(" #")[0].strip()


class Parsed(Exception):
    def __init__(self, extra: list[str]) -> None:
        self.extra = extra


@pytest.fixture
def parse_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every argparse parser raises Parsed once it has read its arguments (SystemExit(2) as usual when it refuses)."""
    strict = threading.local()
    base_parse_args = argparse.ArgumentParser.parse_args
    base_known = argparse.ArgumentParser.parse_known_args
    train_parse_args = flags._Parser.parse_args

    def stopping(original):
        def parse_args(self, args=None, namespace=None):
            strict.on = True
            try:
                original(self, args, namespace)
            finally:
                strict.on = False
            raise Parsed([])

        return parse_args

    def parse_known_args(self, args=None, namespace=None):
        values, extra = base_known(self, args, namespace)
        if getattr(strict, "on", False):
            return values, extra
        raise Parsed(extra)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stopping(base_parse_args))
    monkeypatch.setattr(flags._Parser, "parse_args", stopping(train_parse_args))
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_args)


def _parses(run, argv: list[str]) -> list[str]:
    """Run a parser on argv; return what it left for the next one. A refusal fails the test with its message."""
    try:
        run(argv)
    except Parsed as done:
        return done.extra
    except SystemExit as refused:
        pytest.fail(f"refused ({refused.code}): {argv}")
    pytest.fail(f"no parser read {argv}")


def _check(command: str) -> None:
    # Usage notation: an optional flag `[--x 1]` is checked as written; a placeholder (`[flags]`, `...`) is dropped.
    command = re.sub(r"\[[^\]-][^\]]*\]", "", re.sub(r"\[(--[^\]]*)\]", r"\1", command))
    words = [w for w in shlex.split(command) if w != "..."]
    if words[0] == "srun":
        words = words[words.index("accelerate") :]
    if words[:2] == ["accelerate", "launch"]:
        from accelerate.commands.launch import launch_command_parser

        cut = words.index("-m")
        launcher = launch_command_parser()
        _parses(launcher.parse_args, [*words[2:cut], "x"])
        assert words[cut + 1] == "qa_train", command
        _parses(flags.parse_args, words[cut + 2 :])
        return
    if words[:3] == ["python", "-m", "qa_train"]:
        _parses(flags.parse_args, words[3:])
        return
    verb, argv = words[1], words[2:]
    assert verb in cli.VERBS, f"unknown verb {verb!r}"
    tail = argv[argv.index("--") + 1 :] if "--" in argv else []
    extra = _parses(cli.entry_point(verb), argv)
    if verb == "launch" or tail:
        _parses(flags.parse_args, [t for t in extra if t not in tail] + tail)


def test_the_docs_show_commands_of_every_kind() -> None:
    commands = [c for _, c in documented_commands()]
    assert len(commands) >= 20
    for start in ("qa-train launch", "qa-train bench", "python -m qa_train", "accelerate launch"):
        assert any(c.startswith(start) for c in commands), start


@pytest.mark.parametrize(("where", "command"), list(documented_commands()))
def test_a_documented_command_parses_as_written(where: str, command: str, parse_only: None) -> None:
    _check(command)


def test_a_misspelled_flag_in_a_command_is_caught(parse_only: None) -> None:
    with pytest.raises(pytest.fail.Exception, match="refused"):
        _check("qa-train launch --cpu --config_file accelerate_configs/ddp.yaml -- --max_train_step 3")
    with pytest.raises(pytest.fail.Exception, match="refused"):
        _check("qa-train bench --configz single --max_train_steps 3")
