"""SQuAD v2.0 end to end: the bundled v2 demo trains under --version_2_with_negative and reports the official
v2.0 metrics, which the scorer CLI reproduces from the files the run wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ASSETS, PY, TINY, base_env, read_metrics, run_ok

from qa_train.squad.files import load_references

V2_TRAIN, V2_DEV = ASSETS / "demo-v2" / "train.json", ASSETS / "demo-v2" / "dev.json"
THRESHOLD = "-1.5"


@pytest.fixture(scope="module")
def v2_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("v2")
    out = tmp / "run"
    run_ok(
        [
            PY,
            "-m",
            "qa_train",
            "--config_name",
            str(TINY),
            "--tokenizer_name",
            str(TINY),
            "--train_file",
            str(V2_TRAIN),
            "--validation_file",
            str(V2_DEV),
            "--version_2_with_negative",
            "--null_score_diff_threshold",
            THRESHOLD,
            "--max_seq_length",
            "256",
            "--doc_stride",
            "64",
            "--per_device_train_batch_size",
            "16",
            "--learning_rate",
            "1e-3",
            "--max_train_steps",
            "60",
            "--report_to",
            "none",
            "--save_final_model",
            "false",
            "--output_dir",
            str(out),
        ],
        base_env(tmp),
    )
    return out


def test_metrics_hold_the_official_v2_breakdown(v2_run: Path) -> None:
    m = read_metrics(v2_run)
    v2 = m["squad_v2"]
    assert list(v2) == [
        "exact",
        "f1",
        "total",
        "HasAns_exact",
        "HasAns_f1",
        "HasAns_total",
        "NoAns_exact",
        "NoAns_f1",
        "NoAns_total",
        "best_exact",
        "best_exact_thresh",
        "best_f1",
        "best_f1_thresh",
    ]
    assert (m["exact_match"], m["f1"]) == (v2["exact"], v2["f1"])
    golds = load_references(V2_DEV, allow_empty=True)
    has = sum(bool(g) for g in golds.values())
    assert (v2["total"], v2["HasAns_total"], v2["NoAns_total"]) == (len(golds), has, len(golds) - has)
    # The overall scores are the two parts' mean, weighted by their sizes.
    assert v2["exact"] == pytest.approx(
        (v2["HasAns_exact"] * has + v2["NoAns_exact"] * (len(golds) - has)) / len(golds)
    )
    assert v2["best_f1"] >= v2["f1"] - 1e-9 and v2["best_exact"] >= v2["exact"] - 1e-9
    assert m["args"]["version_2_with_negative"] is True


def test_null_answers_follow_the_null_odds_and_threshold(v2_run: Path) -> None:
    predictions = json.loads((v2_run / "eval_predictions.json").read_text())
    odds = json.loads((v2_run / "eval_null_odds.json").read_text())
    assert set(predictions) == set(odds) == set(load_references(V2_DEV, allow_empty=True))
    assert all((predictions[q] == "") == (odds[q] > float(THRESHOLD)) for q in odds)


def test_scorer_cli_reproduces_the_runs_v2_metrics(v2_run: Path, tmp_path: Path) -> None:
    proc = run_ok(
        [
            PY,
            "-m",
            "qa_train.cli",
            "score",
            str(V2_DEV),
            str(v2_run / "eval_predictions.json"),
            "--na-prob-file",
            str(v2_run / "eval_null_odds.json"),
            "--na-prob-thresh",
            THRESHOLD,
        ],
        base_env(tmp_path),
    )
    assert json.loads(proc.stdout) == read_metrics(v2_run)["squad_v2"]
