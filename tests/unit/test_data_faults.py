"""Bad input and damaged caches: every data fault is one DataError line naming the file, the place and the
problem; what is valid but unusual (a BOM, U+2028 in a context) loads; a damaged feature cache is rebuilt."""

from __future__ import annotations

import codecs
import gzip
import hashlib
import json
import logging
import lzma
from pathlib import Path

import numpy as np
import pytest
from conftest import DEMO_DEV, TINY
from transformers import AutoTokenizer

from qa_train.data.features import Features, featurize, load_or_featurize
from qa_train.data.load import DataError, load_file

CONTEXT = "The harbour of Quellin opened in 1871. Its first keeper, Orla Venn, lit the lamp each night."
GOOD_QA = {"id": "q1", "question": "When did it open?", "answers": [{"text": "1871", "answer_start": 33}]}
FLAT = {
    "id": "f1",
    "title": "Quellin",
    "context": CONTEXT,
    "question": "When did it open?",
    "answers": {"text": ["1871"], "answer_start": [33]},
}


def nested_with(para: object = None, qas: object = None) -> dict:
    """A one-article SQuAD file whose paragraphs (or its first paragraph's qas) are replaced."""
    if para is None:
        para = [{"context": CONTEXT, "qas": [GOOD_QA] if qas is None else qas}]
    return {"version": "1.1", "data": [{"title": "Quellin", "paragraphs": para}]}


def lines(*records: object) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def refused(path: Path, match: str) -> str:
    """The one-line message a bad file is refused with; it names the file and matches `match`."""
    with pytest.raises(DataError, match=match) as exc:
        load_file(path)
    message = str(exc.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    return message


PRETTY = json.dumps(nested_with(), indent=2)
MALFORMED = {
    "paragraphs not a list": (
        json.dumps(nested_with(para=5)),
        r"data\[0\]\.paragraphs must be a list of paragraphs, found a number",
    ),
    "paragraph not an object": (
        json.dumps(nested_with(para=[7])),
        r"data\[0\]\.paragraphs\[0\] must be an object with 'context' and 'qas'",
    ),
    "qas not a list": (
        json.dumps(nested_with(qas=3)),
        r"data\[0\]\.paragraphs\[0\]\.qas must be a list of questions, found a number",
    ),
    "qa not an object": (
        json.dumps(nested_with(qas=[GOOD_QA, "q2"])),
        r"data\[0\]\.paragraphs\[0\]\.qas\[1\]: expected an object \(one question\), found a string",
    ),
    "answer not an object": (
        json.dumps(nested_with(qas=[{**GOOD_QA, "answers": ["1871"]}])),
        r"qas\[0\]: question q1: answers\[0\] must be an object with 'text' and 'answer_start'",
    ),
    "answers not a list": (
        json.dumps(nested_with(qas=[{**GOOD_QA, "answers": {"text": "1871"}}])),
        r"qas\[0\]: question q1: 'answers' must be a list, found an object",
    ),
    "context not a string": (
        json.dumps({"data": [{"paragraphs": [{"context": 12, "qas": [GOOD_QA]}]}]}),
        r"qas\[0\]: question q1: 'context' must be a string, found a number",
    ),
    "id not a string": (
        json.dumps(nested_with(qas=[{**GOOD_QA, "id": ["q1"]}])),
        r"qas\[0\]: 'id' must be a string or an integer, found a list",
    ),
    "answer_start not an integer": (
        json.dumps(nested_with(qas=[{**GOOD_QA, "answers": [{"text": "1871", "answer_start": 33.0}]}])),
        r"question q1: answer 0: 'answer_start' must be an integer, found 33\.0",
    ),
    "answer texts not a list": (
        lines({**FLAT, "answers": {"text": "1871", "answer_start": [33]}}, FLAT),
        r"line 1: question f1: 'answers\.text' must be a list, found a string",
    ),
    "answer starts not a list": (
        lines(FLAT, {**FLAT, "id": "f2", "answers": {"text": ["1871"], "answer_start": 33}}),
        r"line 2: question f2: 'answers\.answer_start' must be a list, found a number",
    ),
    "flat record not an object": (lines(FLAT, 5), r"line 2: expected an object \(one question\), found a number"),
    "title not a string": (
        json.dumps([FLAT, {**FLAT, "id": "f2", "title": 3}]),
        r"record 1: question f2: 'title' must be a string, found a number",
    ),
    "nested too deeply": ("[" * 100_000, r"not valid JSON: maximum recursion depth exceeded"),
    # A ValueError that is not a JSONDecodeError: it escaped as a traceback.
    "an integer of 5,000 digits": (
        json.dumps(nested_with(qas=[{**GOOD_QA, "answers": [{"text": "1871", "answer_start": "@"}]}])).replace(
            '"@"', "1" * 5000
        ),
        r"not valid JSON: Exceeds the limit \(4300 digits\)",
    ),
    "an integer of 5,000 digits in JSON lines": (
        lines(FLAT)
        + json.dumps({**FLAT, "id": "f2", "answers": {"text": ["1871"], "answer_start": ["@"]}}).replace(
            '"@"', "1" * 5000
        ),
        r"line 2: not valid JSON: Exceeds the limit \(4300 digits\)",
    ),
    # What follows a whole document is named where it is, not read as line 1 of JSON lines.
    "a stray brace after a pretty-printed file": (
        PRETTY + "\n}\n",
        rf"not valid JSON: Extra data: line {PRETTY.count(chr(10)) + 2} column 1",
    ),
    "a stray brace after a one-line file": (
        json.dumps(nested_with()) + "\n}\n",
        r"not valid JSON: Extra data: line 2 column 1",
    ),
    "two files joined": (
        PRETTY * 2,
        rf"not valid JSON: Extra data: line {PRETTY.count(chr(10)) + 1} column 2",
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_shapes_are_one_line_data_errors(tmp_path: Path, case: str) -> None:
    text, match = MALFORMED[case]
    path = tmp_path / "d.json"
    path.write_text(text, encoding="utf-8")
    refused(path, match)


def test_bytes_that_are_not_utf8_name_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    text = lines(FLAT, {**FLAT, "id": "f2", "question": "Which café?"})
    path.write_bytes(codecs.BOM_UTF8 + text.encode("latin-1"))  # the offset counts the BOM's 3 bytes too
    offset = path.read_bytes().index(b"\xe9")
    refused(path, rf"not UTF-8 text: byte {offset} \(line 2\) is 0xe9 \(invalid continuation byte\)")


@pytest.mark.parametrize(
    ("name", "payload", "match"),
    [
        (
            "d.json",
            nested_with(qas=[GOOD_QA, {k: v for k, v in GOOD_QA.items() if k != "id"}]),
            r"d\.json: data\[0\]\.paragraphs\[0\]\.qas\[1\]: question has no 'id'$",
        ),
        ("d.jsonl", [FLAT, {k: v for k, v in FLAT.items() if k != "id"}], r"d\.jsonl: line 2: question has no 'id'$"),
        ("d.json", [FLAT, {**FLAT, "id": ""}], r"d\.json: record 1: question has no 'id'$"),
        (
            "d.json",
            nested_with(qas=[GOOD_QA, {**GOOD_QA, "question": "Again?"}]),
            r"qas\[1\]: question q1: duplicate id \(first at data\[0\]\.paragraphs\[0\]\.qas\[0\]\)$",
        ),
        (
            "d.jsonl",
            [FLAT, {**FLAT, "id": "f2", "answers": {"text": ["1871"], "answer_start": [5]}}],
            r"d\.jsonl: line 2: question f2: answer_start 5 does not match text '1871'",
        ),
        (
            "d.json",
            nested_with(qas=[{**GOOD_QA, "id": "q\n1", "question": " "}]),
            r"qas\[0\]: question 'q\\n1': empty question$",
        ),
    ],
)
def test_every_record_message_says_where_it_is(tmp_path: Path, name: str, payload: object, match: str) -> None:
    path = tmp_path / name
    path.write_text(lines(*payload) if name.endswith(".jsonl") else json.dumps(payload), encoding="utf-8")
    refused(path, match)


def test_a_leading_bom_is_accepted_and_the_fingerprint_is_of_the_raw_bytes(tmp_path: Path) -> None:
    for name, text in (("d.json", json.dumps(nested_with())), ("d.jsonl", lines(FLAT))):
        plain, bom = tmp_path / f"plain-{name}", tmp_path / f"bom-{name}"
        plain.write_text(text, encoding="utf-8")
        bom.write_bytes(codecs.BOM_UTF8 + text.encode())
        a, b = load_file(plain), load_file(bom)
        assert (a.ids, a.contexts, a.questions, a.answer_starts) == (b.ids, b.contexts, b.questions, b.answer_starts)
        assert b.fingerprint == hashlib.sha256(bom.read_bytes()).hexdigest()[:16] != a.fingerprint


def test_line_separators_inside_a_json_lines_record_are_data(tmp_path: Path) -> None:
    """JSON allows U+2028, U+2029 and U+0085 raw inside strings; they must not split a JSON lines record."""
    context = "Quellin\u2028harbour\x85opened\u2029in 1871."
    path = tmp_path / "d.jsonl"
    answers = {"text": ["1871"], "answer_start": [context.index("1871")]}
    path.write_text(
        lines({**FLAT, "context": context, "answers": answers}, {**FLAT, "id": "f2"}).replace("\n", "\r\n"),
        encoding="utf-8",
    )
    ex = load_file(path)
    assert ex.ids == ["f1", "f2"] and ex.contexts[0] == context


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("question", "\u200b\u200b", r"question q1: empty question \(only invisible characters: U\+200B\)"),
        ("question", " \ufeff\u2060\t", r"empty question \(only invisible characters: U\+2060, U\+FEFF\)"),
        ("context", "\u200d \u200e", r"question q1: empty context \(only invisible characters: U\+200D, U\+200E\)"),
    ],
)
def test_invisible_only_text_is_blank(tmp_path: Path, field: str, value: str, match: str) -> None:
    qa = {**GOOD_QA, "answers": []} if field == "context" else {**GOOD_QA, field: value}
    para = {"context": value if field == "context" else CONTEXT, "qas": [qa]}
    path = tmp_path / "d.json"
    path.write_text(json.dumps(nested_with(para=[para])), encoding="utf-8")
    refused(path, match)


def test_invisible_only_answer_is_blank_but_a_leading_invisible_character_is_fine(tmp_path: Path) -> None:
    context = "Opened in\u200b1871."
    bad = {**GOOD_QA, "answers": [{"text": "\u200b", "answer_start": 9}]}
    path = tmp_path / "d.json"
    path.write_text(json.dumps(nested_with(para=[{"context": context, "qas": [bad]}])), encoding="utf-8")
    refused(path, r"question q1: empty answer text \(only invisible characters: U\+200B\)")
    fine = {**GOOD_QA, "question": "\u200bWhen?", "answers": [{"text": "1871", "answer_start": 11}]}
    path.write_text(json.dumps(nested_with(para=[{"context": "\ufeff" + context, "qas": [fine]}])), encoding="utf-8")
    assert load_file(path).questions == ["\u200bWhen?"]


def test_a_directory_or_a_missing_file_is_refused_in_one_line(tmp_path: Path) -> None:
    refused(tmp_path, "is a directory, not a file$")
    refused(tmp_path / "absent.json", "no such file$")


# ---- the feature cache ----


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TINY)


@pytest.fixture(scope="module")
def examples():
    return load_file(DEMO_DEV).head(12)


def assert_same(a: Features, b: Features) -> None:
    for name, value in a.__dict__.items():
        other = getattr(b, name)
        assert (value is None and other is None) or np.array_equal(value, other), name


def damage(path: Path, how: str) -> None:
    raw = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    else:  # one flipped bit in the first array's data: the zip CRC no longer matches
        flipped = bytearray(raw)
        flipped[200] ^= 1
        path.write_bytes(bytes(flipped))


@pytest.mark.parametrize("how", ["empty", "truncated", "flipped bit"])
def test_a_damaged_cache_is_rebuilt_with_one_warning(
    tmp_path: Path, monkeypatch, caplog, tokenizer, examples, how: str
) -> None:
    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path))
    fresh = featurize(examples, tokenizer, 64, 16, with_offsets=True)
    _, hit = load_or_featurize(examples, tokenizer, 64, 16, with_offsets=True)
    [path] = (tmp_path / "features").glob("*.npz")
    damage(path, how)
    with caplog.at_level(logging.WARNING, logger="qa_train"):
        rebuilt, rebuilt_hit = load_or_featurize(examples, tokenizer, 64, 16, with_offsets=True)
    assert (hit, rebuilt_hit) == (False, False)
    assert_same(rebuilt, fresh)
    [warning] = [r.getMessage() for r in caplog.records if r.name == "qa_train"]
    assert str(path) in warning and "featurising again" in warning and "\n" not in warning
    assert_same(Features.load(path), fresh)  # the file was replaced by a whole one
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="qa_train"):
        _, hit_after = load_or_featurize(examples, tokenizer, 64, 16, with_offsets=True)
    assert hit_after and not caplog.records
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary files left


def test_a_write_cut_short_leaves_no_cache_and_no_litter(
    tmp_path: Path, monkeypatch, caplog, tokenizer, examples
) -> None:
    """A run that dies while writing the cache must not leave a truncated file that the next run trusts."""
    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path))

    def dies_halfway(file, **arrays) -> None:
        file.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", dies_halfway)
    with caplog.at_level(logging.WARNING, logger="qa_train"):
        features, hit = load_or_featurize(examples, tokenizer, 64, 16)
    assert not hit and len(features) > 0
    assert not list((tmp_path / "features").iterdir())
    [warning] = [r.getMessage() for r in caplog.records if r.name == "qa_train"]
    assert "could not be written (No space left on device)" in warning


# ---- inputs that used to load and then crash, mislead, or train as something they are not ----


@pytest.mark.parametrize(("compress", "kind"), [(gzip.compress, "gzip"), (lzma.compress, "xz")], ids=["gzip", "xz"])
def test_a_compressed_file_is_named_as_such_not_as_bad_utf8(tmp_path: Path, compress, kind: str) -> None:
    path = tmp_path / "train.json"  # the name says JSON; the bytes are not
    path.write_bytes(compress(json.dumps(nested_with()).encode()))
    refused(path, rf"is {kind}-compressed, not JSON text; decompress it first")


@pytest.mark.parametrize(
    ("where", "match"),
    [
        ("context", r"question q1: 'context' holds a lone UTF-16 surrogate U\+D83D at character 4"),
        ("question", r"question q1: 'question' holds a lone UTF-16 surrogate U\+D83D at character 0"),
        ("id", r"qas\[0\]: question 'q\\ud83d': 'id' holds a lone UTF-16 surrogate U\+D83D at character 1"),
    ],
    ids=["context", "question", "id"],
)
def test_a_lone_surrogate_is_refused_before_the_tokenizer_meets_it(tmp_path: Path, where: str, match: str) -> None:
    """JSON's "\\ud83d" without its low half decodes to a str that no tokenizer (and no UTF-8 file) takes: it
    loaded, then featurisation crashed with a TypeError from inside the tokenizer."""
    context = "The \ud83d harbour opened in 1871."
    qa = {"id": "q1", "question": "When did it open?", "answers": [{"text": "1871", "answer_start": 26}]}
    if where == "question":
        qa["question"] = "\ud83d When did it open?"
    if where == "id":
        qa["id"] = "q\ud83d"
    para = {"context": context if where == "context" else context.replace("\ud83d", "x"), "qas": [qa]}
    path = tmp_path / "d.json"
    path.write_text(json.dumps(nested_with(para=[para])), encoding="ascii")  # the escape as tools write it
    refused(path, match)


def test_combining_marks_alone_are_blank(tmp_path: Path) -> None:
    """An uncased tokenizer strips accents: a question of lone combining marks became a window without a question."""
    path = tmp_path / "d.json"
    path.write_text(json.dumps(nested_with(qas=[{**GOOD_QA, "question": "\u0301 \u0308"}])), encoding="utf-8")
    refused(path, r"question q1: empty question \(only invisible characters and combining marks: U\+0301, U\+0308\)")
    accented = {**GOOD_QA, "question": "Caf\u0301e?"}  # a mark on a letter is text
    path.write_text(json.dumps(nested_with(qas=[accented])), encoding="utf-8")
    assert load_file(path).questions == ["Caf\u0301e?"]


@pytest.mark.parametrize(
    ("flag", "answers", "match"),
    [
        (
            True,
            [{"text": "1871", "answer_start": 33}],
            r"question q1: 'is_impossible' is true but it has 1 answer\(s\)",
        ),
        (False, [], r"question q1: 'is_impossible' is false but 'answers' is empty$"),
        ("yes", [], r"question q1: 'is_impossible' must be true or false, found a string$"),
    ],
    ids=["true with answers", "false without", "not a boolean"],
)
def test_is_impossible_must_agree_with_the_answers(tmp_path: Path, flag: object, answers: list, match: str) -> None:
    """Otherwise a question the file calls unanswerable trained as answerable (or the reverse), silently."""
    path = tmp_path / "d.json"
    path.write_text(json.dumps(nested_with(qas=[{**GOOD_QA, "is_impossible": flag, "answers": answers}])))
    with pytest.raises(DataError, match=match):
        load_file(path, "may_be_empty")
    official = [
        {**GOOD_QA, "is_impossible": False},
        {
            **GOOD_QA,
            "id": "q2",
            "is_impossible": True,
            "answers": [],
            "plausible_answers": [{"text": "Orla Venn", "answer_start": 57}],
        },
    ]
    path.write_text(json.dumps(nested_with(qas=official)))
    assert load_file(path, "may_be_empty").answer_texts == [["1871"], []]


def test_an_article_without_paragraphs_is_named_as_an_article(tmp_path: Path) -> None:
    """It was read as a flat record and refused for "question has no 'id'"."""
    doc = nested_with()
    doc["data"].append({"title": "Second"})
    path = tmp_path / "d.json"
    path.write_text(json.dumps(doc))
    refused(path, r"d\.json: data\[1\] lacks 'paragraphs' \(data\[0\] is a nested SQuAD article\)$")
    # The first article too: it was read as a flat record, as if the file were a list of them.
    doc["data"].reverse()
    path.write_text(json.dumps(doc))
    refused(path, r"d\.json: data\[0\] lacks 'paragraphs' \(data\[1\] is a nested SQuAD article\)$")


def test_an_answer_in_another_unicode_form_says_so(tmp_path: Path) -> None:
    """'café' precomposed and 'cafe' + U+0301 print the same: the message must not read as a contradiction."""
    context = "The Cafe\u0301 Venn opened in 1871."
    qa = {"id": "q1", "question": "Which cafe?", "answers": [{"text": "Caf\u00e9 Venn", "answer_start": 4}]}
    path = tmp_path / "d.json"
    path.write_text(json.dumps(nested_with(para=[{"context": context, "qas": [qa]}])))
    refused(path, r"answer_start 4 does not match text .*another Unicode form: normalise the file to NFC$")


def test_a_cache_is_never_reused_for_another_tokenizer_or_window(
    tmp_path: Path, monkeypatch, tokenizer, examples
) -> None:
    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path))
    cased = AutoTokenizer.from_pretrained(TINY)
    cased.backend_tokenizer.normalizer.lowercase = False  # same vocabulary, different tokens
    built = {}
    for name, tok, length, stride in (
        ("base", tokenizer, 64, 16),
        ("length", tokenizer, 96, 16),
        ("stride", tokenizer, 64, 24),
        ("cased", cased, 64, 16),
    ):
        built[name], hit = load_or_featurize(examples, tok, length, stride)
        assert not hit, name
    assert len(list((tmp_path / "features").glob("*.npz"))) == 4
    again, hit = load_or_featurize(examples, tokenizer, 64, 16)
    assert hit
    assert_same(again, built["base"])
    assert not np.array_equal(built["cased"].input_ids, built["base"].input_ids)


def test_an_empty_cache_variable_means_the_default_folder(monkeypatch) -> None:
    """Path("") is the working directory: QA_TRAIN_CACHE= put a features/ folder wherever the run started."""
    from qa_train.data.features import cache_dir

    monkeypatch.setenv("QA_TRAIN_CACHE", "")
    assert cache_dir() == Path.home() / ".cache" / "qa_train" / "features"


def test_a_bad_file_is_refused_before_torch_transformers_and_accelerate_are_imported(tmp_path: Path) -> None:
    """Data refusals took 9-18 s: torch, transformers and accelerate were imported first (issue 38, Also). The
    records are read and checked before them now; the one line is the same."""
    import subprocess
    import sys

    from conftest import ROOT, base_env, tiny_flags

    bad = tmp_path / "train.json"
    context = "The harbour opened in 1871."
    qa = {"id": "q1", "question": "When?", "answers": [{"text": "1871", "answer_start": 3}]}
    bad.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": context, "qas": [qa]}]}]}))
    flags = tiny_flags(tmp_path / "out", "--no_eval")
    flags[flags.index("--train_file") + 1] = str(bad)
    probe = (
        "import sys; from qa_train.__main__ import main; code = main(sys.argv[1:]); "
        "print(code, [m for m in ('torch', 'transformers', 'accelerate', 'datasets') if m in sys.modules])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, *flags], cwd=ROOT, env=base_env(tmp_path), capture_output=True, text=True
    )
    assert proc.stdout.strip() == "2 []", proc.stdout + proc.stderr[-2000:]
    assert proc.stderr.startswith(f"qa_train: error: {bad}: data[0].paragraphs[0].qas[0]: question q1: "), proc.stderr
    assert len(proc.stderr.splitlines()) == 1
