"""`qa-train score` as users run it, in its own process: the official scripts' interfaces for SQuAD v1.1 and v2.0,
what they print and how they refuse a bad file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from squad_cases import GOLD, NA_PROBS, NESTED, PREDICTIONS

from qa_train.squad.files import load_references
from qa_train.squad.scoring import score_v2


def _cli(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qa_train.cli", "score", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_prints_official_json(tmp_path: Path) -> None:
    dataset = tmp_path / "dev.json"
    dataset.write_text(json.dumps(NESTED), encoding="utf-8")
    predictions = tmp_path / "predictions.json"
    # q1: "santa clara" matches the second gold -> EM 1, F1 1; q2 missing -> 0.
    predictions.write_text(json.dumps({"q1": "Santa Clara"}), encoding="utf-8")
    proc = _cli(dataset, predictions)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"exact_match": 50.0, "f1": 50.0}
    assert "1 of 2 questions have no prediction" in proc.stderr
    assert "q2" in proc.stderr


def test_cli_reports_malformed_file(tmp_path: Path) -> None:
    dataset = tmp_path / "bad.jsonl"
    dataset.write_text('{"id": "q1"}\n', encoding="utf-8")
    predictions = tmp_path / "predictions.json"
    predictions.write_text("{}", encoding="utf-8")
    proc = _cli(dataset, predictions)
    assert proc.returncode == 2  # refused input, as everywhere in qa-train
    assert str(dataset) in proc.stderr
    assert "line 1" in proc.stderr
    assert proc.stdout == ""


CONTEXT = "Super Bowl 50 was played at Levi's Stadium in Santa Clara, California, in 1990."


def _v2_file(tmp_path: Path) -> Path:
    qas = [
        {
            "id": qid,
            "question": f"Question {qid}?",
            "is_impossible": not golds,
            "answers": [{"text": g, "answer_start": 0} for g in golds],
        }
        for qid, golds in GOLD.items()
    ]
    path = tmp_path / "dev-v2.0.json"
    path.write_text(
        json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": CONTEXT, "qas": qas}]}]}),
        encoding="utf-8",
    )
    return path


def test_cli_has_the_official_v2_interface(tmp_path: Path) -> None:
    data = _v2_file(tmp_path)
    assert load_references(data, allow_empty=True) == GOLD
    with pytest.raises(ValueError, match="question q3: expected a non-empty list"):
        load_references(data)  # v1.1 callers still refuse unanswerable questions
    preds, probs = tmp_path / "pred.json", tmp_path / "na_prob.json"
    preds.write_text(json.dumps(PREDICTIONS))
    probs.write_text(json.dumps(NA_PROBS))
    proc = _cli(data, preds)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == pytest.approx(score_v2(GOLD, PREDICTIONS))
    proc = _cli(data, preds, "-n", probs, "-t", "0.6", "-o", tmp_path / "eval.json")
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    written = json.loads((tmp_path / "eval.json").read_text())
    assert written == pytest.approx(score_v2(GOLD, PREDICTIONS, NA_PROBS, 0.6)) and written["best_f1_thresh"] == 0.7


def test_cli_refuses_bad_no_answer_file(tmp_path: Path) -> None:
    preds, probs = tmp_path / "pred.json", tmp_path / "na_prob.json"
    preds.write_text(json.dumps(PREDICTIONS))
    probs.write_text(json.dumps({**NA_PROBS, "q2": "high"}))
    proc = _cli(_v2_file(tmp_path), preds, "--na-prob-file", probs)
    assert proc.returncode == 2 and "na_prob.json: question q2: no-answer probability must be a number" in proc.stderr
