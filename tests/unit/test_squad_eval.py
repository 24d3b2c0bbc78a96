"""Hand-computed checks of the official SQuAD v1.1 EM/F1 semantics."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import DEMO_DEV
from squad_cases import NESTED

from qa_train.data.load import load_file
from qa_train.squad.files import load_references
from qa_train.squad.scoring import exact_match, f1, normalize_answer, score


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The  Quick, brown FOX!", "quick brown fox"),  # case, punctuation, article, spaces
        ("an apple a day", "apple day"),
        ("  Denver\tBroncos\n", "denver broncos"),  # tabs and newlines are whitespace
        ("theater anthem", "theater anthem"),  # articles only as whole words
        ("A-team", "ateam"),  # punctuation goes before articles: "a-team" -> "ateam"
        ("the", ""),
    ],
)
def test_normalize_answer(raw: str, expected: str) -> None:
    assert normalize_answer(raw) == expected


def test_exact_match_ignores_case_punctuation_and_articles() -> None:
    assert exact_match("the Broncos!", "Broncos") == 1.0
    assert exact_match("Denver Broncos", "Broncos") == 0.0


def test_f1_partial_overlap() -> None:
    # pred tokens [denver, broncos, team], gold [denver, broncos] (article dropped):
    # 2 shared, precision 2/3, recall 2/2 -> F1 = 2 * (2/3) * 1 / (2/3 + 1) = 0.8
    assert f1("Denver Broncos team", "the Denver Broncos") == pytest.approx(0.8)
    assert exact_match("Denver Broncos team", "the Denver Broncos") == 0.0


def test_f1_counts_repeated_tokens_once_per_match() -> None:
    # pred [x, x, y], gold [x, y, y]: shared = min(2,1) + min(1,2) = 2,
    # precision = recall = 2/3 -> F1 = 2/3
    assert f1("x x y", "x y y") == pytest.approx(2 / 3)


def test_f1_zero_without_shared_tokens() -> None:
    assert f1("Paris", "London") == 0.0
    # Both normalise to "", so EM is 1 but the official F1 is 0 (no shared token).
    assert exact_match("the", "a") == 1.0
    assert f1("the", "a") == 0.0


def test_score_takes_max_over_gold_answers() -> None:
    # pred [denver, broncos]
    #   vs "Broncos":             P 1/2, R 1   -> F1 2/3, EM 0
    #   vs "Denver Broncos team": P 1,   R 2/3 -> F1 0.8, EM 0
    refs = {"q": ["Broncos", "Denver Broncos team"]}
    result = score(refs, {"q": "Denver Broncos"})
    assert result["f1"] == pytest.approx(80.0)
    assert result["exact_match"] == 0.0


def test_score_missing_prediction_counts_as_zero_and_extra_ids_are_ignored() -> None:
    refs = {
        "q1": ["Denver Broncos", "the Broncos"],
        "q2": ["Santa Clara, California"],
        "q3": ["1990"],
    }
    preds = {"q1": "Broncos", "q2": "Santa Clara", "not-a-question": "whatever"}
    # q1: "broncos" == normalised "the Broncos" -> EM 1, F1 1
    # q2: [santa, clara] vs [santa, clara, california]: P 1, R 2/3 -> F1 0.8, EM 0
    # q3: no prediction -> 0, still in the total
    # EM = 100 * 1 / 3, F1 = 100 * (1 + 0.8) / 3 = 60
    result = score(refs, preds)
    assert result["exact_match"] == pytest.approx(100 / 3)
    assert result["f1"] == pytest.approx(60.0)
    assert result["total"] == 3
    assert result["missing"] == 1
    without_extra = {k: v for k, v in preds.items() if k in refs}
    assert score(refs, without_extra) == result


def test_score_rejects_bad_references() -> None:
    with pytest.raises(ValueError, match="empty"):
        score({}, {})
    # A bare string would otherwise be scored character by character.
    with pytest.raises(ValueError, match="question q1"):
        score({"q1": "Denver"}, {"q1": "Denver"})


FLAT = [
    {
        "id": "q1",
        "title": "Super_Bowl_50",
        "context": "Super Bowl 50 was played in Santa Clara, California.",
        "question": "Where was Super Bowl 50 played?",
        "answers": {"text": ["Santa Clara, California", "Santa Clara"], "answer_start": [28, 28]},
    },
    {
        "id": "q2",
        "title": "Super_Bowl_50",
        "context": "Super Bowl 50 was played in Santa Clara, California.",
        "question": "Which Super Bowl?",
        "answers": {"text": ["50"], "answer_start": [11]},
    },
]
EXPECTED_REFS = {"q1": ["Santa Clara, California", "Santa Clara"], "q2": ["50"]}


def _write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_load_references_nested_json(tmp_path: Path) -> None:
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(NESTED), encoding="utf-8")
    assert load_references(path) == EXPECTED_REFS


def test_load_references_jsonl(tmp_path: Path) -> None:
    assert load_references(_write_jsonl(tmp_path / "dev.jsonl", FLAT)) == EXPECTED_REFS


def test_integer_ids_are_read_as_training_reads_them(tmp_path: Path) -> None:
    """Training accepts integer ids and keys its predictions by their text; the scorer must match them."""
    records = [{**FLAT[0], "id": 7}, FLAT[1]]
    refs = load_references(_write_jsonl(tmp_path / "dev.jsonl", records))
    assert refs["7"] == EXPECTED_REFS[FLAT[0]["id"]]
    with pytest.raises(ValueError, match="question id must be a string or an integer, got True"):
        load_references(_write_jsonl(tmp_path / "bad.jsonl", [{**FLAT[0], "id": True}]))


def test_load_references_jsonl_with_raw_line_separators_in_strings(tmp_path: Path) -> None:
    """json.dumps(ensure_ascii=False) writes U+2028/U+2029/U+0085 raw; they are not line ends in JSON lines."""
    records = [{**FLAT[0], "context": "Super Bowl 50\u2028was played\u2029in\x85Santa Clara, California."}, FLAT[1]]
    path = tmp_path / "dev.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in records), encoding="utf-8")
    assert "\u2028" in path.read_text(encoding="utf-8")
    assert load_references(path) == EXPECTED_REFS


def test_load_references_malformed_jsonl_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(FLAT[0]) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.jsonl: line 2: not valid JSON: .* at column 2$"):
        load_references(path)
    # Training's loader reads the same lines with the same reader, and says the same.
    with pytest.raises(ValueError, match=r"broken\.jsonl: line 2: not valid JSON: .* at column 2$"):
        load_file(path)


def test_load_references_malformed_nested_names_file_and_location(tmp_path: Path) -> None:
    broken = json.loads(json.dumps(NESTED))
    del broken["data"][0]["paragraphs"][0]["qas"][1]["answers"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(broken), encoding="utf-8")
    where = r"data\[0\]\.paragraphs\[0\]\.qas\[1\]"
    with pytest.raises(ValueError, match=rf"broken\.json: {where}: expected an object with 'id' and 'answers'$"):
        load_references(path)


def test_flat_records_read_as_training_reads_them_and_other_documents_are_refused(tmp_path: Path) -> None:
    """A JSON list of flat records and `{"data": [flat records]}` are --validation_file layouts training takes: the
    scorer read only JSON lines of them, and refused the gold file of such a run."""
    expected = load_references(_write_jsonl(tmp_path / "records.jsonl", FLAT))
    for name, document in (("records.json", FLAT), ("wrapped.json", {"data": FLAT})):
        path = tmp_path / name
        path.write_text(json.dumps(document, indent=2), encoding="utf-8")
        assert load_references(path) == expected
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"questions": FLAT}, indent=2), encoding="utf-8")
    with pytest.raises(ValueError, match=r"other\.json: expected SQuAD JSON with a 'data' list, JSON lines, or a list"):
        load_references(path)
    path.write_text(json.dumps([{"id": "q1", "answers": ["Paris"]}]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"other\.json: record 0: 'answers' must be an object with a 'text' list"):
        load_references(path)


def test_the_scorer_reads_every_file_training_reads(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """One reader for both (qa_train.data.layouts): a dev file with a BOM, or a JSON list of nested articles, was
    evaluated on by training and then refused by the scorer meant to reproduce the run's figures."""
    from qa_train.squad import scoring

    expected = load_references(DEMO_DEV)
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps({qid: golds[0] for qid, golds in expected.items()}))
    articles = json.loads(DEMO_DEV.read_text())["data"]
    for name, raw in (
        ("bom.json", b"\xef\xbb\xbf" + DEMO_DEV.read_bytes()),
        ("articles.json", json.dumps(articles).encode()),
    ):
        path = tmp_path / name
        path.write_bytes(raw)
        assert len(load_file(path)) == len(expected)
        assert load_references(path) == expected
        assert scoring.main([str(path), str(predictions)]) == 0
        assert json.loads(capsys.readouterr().out) == {"exact_match": 100.0, "f1": 100.0}


@pytest.mark.parametrize(
    ("which", "text", "match"),
    [
        ("dev", "[" * 100_000 + "]" * 100_000, "not valid JSON: maximum recursion depth exceeded"),
        ("predictions", '{"q1": ' + "[" * 100_000 + "]" * 100_000 + "}", "not valid JSON: maximum recursion depth"),
        ("predictions", '{"q1": ' + "1" * 5000 + "}", r"not valid JSON: Exceeds the limit \(4300 digits\)"),
    ],
)
def test_json_no_parser_can_hold_is_refused_in_one_line_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture, which: str, text: str, match: str
) -> None:
    """Deep nesting and a 5,000-digit integer are ValueError and RecursionError, not JSONDecodeError: they
    escaped as tracebacks, or as a line without the file's name."""
    from qa_train.squad import scoring

    files = {"dev": DEMO_DEV, "predictions": tmp_path / "predictions.json"}
    files["predictions"].write_text("{}")
    files[which] = tmp_path / f"{which}.json"
    files[which].write_text(text)
    assert scoring.main([str(files["dev"]), str(files["predictions"])]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qa-train score: error: {files[which]}: ") and err.count("\n") == 1, err
    assert re.search(match, err), err


def test_load_references_rejects_duplicate_ids_and_empty_answers(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"dup\.jsonl: question q1: id appears more than once"):
        load_references(_write_jsonl(tmp_path / "dup.jsonl", [FLAT[0], FLAT[0]]))
    no_answer = dict(FLAT[1], answers={"text": [], "answer_start": []})
    with pytest.raises(ValueError, match=r"empty\.jsonl: question q2: expected a non-empty list"):
        load_references(_write_jsonl(tmp_path / "empty.jsonl", [FLAT[0], no_answer]))


def test_precomposed_and_decomposed_answers_are_the_same_answer() -> None:
    """A decomposed reference ('Jose' + U+0301) scored 0 against the same name precomposed (issue 38, case 11)."""
    assert exact_match("Jos\u00e9", "Jose\u0301") == 1.0 and exact_match("Jos\u00e9", "Jose") == 0.0
    assert score({"q": ["Jose\u0301 Mari\u0301a"]}, {"q": "Jos\u00e9 Mar\u00eda"})["exact_match"] == 100.0


def test_a_missing_file_is_refused_in_one_line_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """It exited 1 with a raw "error: [Errno 2] No such file or directory: '...'" (issue 38, case 16)."""
    from qa_train.squad import scoring

    predictions = tmp_path / "predictions.json"
    predictions.write_text("{}")
    assert scoring.main([str(tmp_path / "dev.json"), str(predictions)]) == 2
    assert capsys.readouterr().err == f"qa-train score: error: {tmp_path / 'dev.json'}: no such file\n"
    assert scoring.main([str(DEMO_DEV), str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"qa-train score: error: {tmp_path}: is a directory, not a file\n"


@pytest.mark.parametrize("kind", ["xz", "gz", "bz2"])
def test_a_compressed_dev_file_is_read_as_it_is(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture) -> None:
    """The SQuAD dev set is kept as .json.xz: it was refused as not UTF-8 (issue 38, case 16)."""
    import bz2
    import gzip
    import lzma

    from qa_train.squad import scoring

    compress = {"xz": lzma.compress, "gz": gzip.compress, "bz2": bz2.compress}[kind]
    packed = tmp_path / f"dev.json.{kind}"
    packed.write_bytes(compress(DEMO_DEV.read_bytes()))
    references = load_references(DEMO_DEV)
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps({qid: golds[0] for qid, golds in references.items()}))
    assert load_references(packed) == references
    assert scoring.main([str(packed), str(predictions)]) == 0
    assert json.loads(capsys.readouterr().out) == {"exact_match": 100.0, "f1": 100.0}


@pytest.mark.parametrize(
    ("out", "says"),
    [
        ("", "is a directory, not a file"),
        ("notes.txt/metrics.json", "{tmp}/notes.txt is a file, not a directory"),
        ("/sys/qa_train_test_metrics.json", "/sys is not writable"),
    ],
)
def test_an_out_file_that_cannot_be_written_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, out: str, says: str
) -> None:
    """Each was an IsADirectoryError, NotADirectoryError or OSError traceback (exit 1) after the scoring."""
    from qa_train.squad import scoring

    (tmp_path / "notes.txt").write_text("mine")
    files = [tmp_path / "predictions.json", tmp_path / "na.json"]
    for file in files:
        file.write_text("{}")
    target = tmp_path / out
    assert scoring.main([str(DEMO_DEV), str(files[0]), "-n", str(files[1]), "-o", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qa-train score: error: --out-file {target}: {says.format(tmp=tmp_path)}"), err
    assert err.count("\n") == 1


def test_an_out_files_missing_folders_are_made(tmp_path: Path) -> None:
    """It was a FileNotFoundError traceback."""
    from qa_train.squad import scoring

    files = [tmp_path / "predictions.json", tmp_path / "na.json"]
    for file in files:
        file.write_text("{}")
    target = tmp_path / "scores" / "metrics.json"
    assert scoring.main([str(DEMO_DEV), str(files[0]), "-n", str(files[1]), "-o", str(target)]) == 0
    assert json.loads(target.read_text())["exact"] == 0.0


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_no_answer_probability_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture, value: str
) -> None:
    """Python's json reads NaN and Infinity: a NaN never passes the threshold and was scored without a word, and
    the best threshold could come out as NaN in the metrics."""
    from qa_train.squad import scoring

    qid = next(iter(load_references(DEMO_DEV)))
    predictions, na_probs = tmp_path / "predictions.json", tmp_path / "na.json"
    predictions.write_text(json.dumps({qid: ""}))
    na_probs.write_text(f'{{"{qid}": {value}}}')
    assert scoring.main([str(DEMO_DEV), str(predictions), "-n", str(na_probs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qa-train score: error: {na_probs}: question {qid}: no-answer probability must be a finite")
    assert err.count("\n") == 1


def test_out_file_takes_v11_metrics_too(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A v1.1 dataset printed its metrics and left -o unwritten, without a word."""
    from qa_train.squad import scoring

    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps({qid: golds[0] for qid, golds in load_references(DEMO_DEV).items()}))
    out = tmp_path / "metrics.json"
    assert scoring.main([str(DEMO_DEV), str(predictions), "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == {"exact_match": 100.0, "f1": 100.0} and capsys.readouterr().out == ""
