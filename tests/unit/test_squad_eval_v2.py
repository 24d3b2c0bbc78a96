"""SQuAD v2.0 metrics: hand-computed cases with the official script's semantics (the cases in squad_cases.py)."""

from __future__ import annotations

import pytest
from squad_cases import GOLD, NA_PROBS, PREDICTIONS

from qa_train.squad.scoring import f1, f1_v2, score, score_v2


def test_f1_when_either_side_is_empty() -> None:
    assert f1_v2("", "") == 1.0 and f1_v2("the", "") == 1.0  # both normalise to nothing: agreement
    assert f1_v2("", "1990") == 0.0 and f1_v2("1990", "") == 0.0
    assert f1("", "") == 0.0  # v1.1 keeps its own rule: no shared token, 0
    assert f1_v2("Santa Clara", "Santa Clara, California") == pytest.approx(0.8)


def test_scores_without_no_answer_probabilities() -> None:
    # per question EM / F1: q1 1/1 ("the Broncos"), q2 0/0.8, q3 1/1, q4 0/0, q5 1/1 (gold -> ""), q6 0/0
    result = score_v2(GOLD, PREDICTIONS)
    assert list(result) == [
        "exact",
        "f1",
        "total",
        "HasAns_exact",
        "HasAns_f1",
        "HasAns_total",
        "NoAns_exact",
        "NoAns_f1",
        "NoAns_total",
    ]
    assert result["exact"] == pytest.approx(100 * 3 / 6) and result["f1"] == pytest.approx(100 * 3.8 / 6)
    assert result["total"] == 6
    # answerable: q1, q2, q5, q6
    assert result["HasAns_exact"] == pytest.approx(50.0) and result["HasAns_f1"] == pytest.approx(70.0)
    assert result["HasAns_total"] == 4
    assert (result["NoAns_exact"], result["NoAns_f1"], result["NoAns_total"]) == (50.0, 50.0, 2)


def test_threshold_turns_predictions_into_no_answer_and_best_thresholds() -> None:
    result = score_v2(GOLD, PREDICTIONS, NA_PROBS, na_prob_thresh=0.6)
    # na_prob > 0.6: q3 (no answer: 1), q5 and q6 (answerable: 0; q5 loses the 1 its raw score had);
    # q4 (0.3) keeps its wrong span. EM: q1 1 + q3 1 = 2 of 6; F1: 1 + 0.8 + 1 = 2.8 of 6.
    assert result["exact"] == pytest.approx(100 * 2 / 6) and result["f1"] == pytest.approx(100 * 2.8 / 6)
    assert (result["HasAns_exact"], result["HasAns_f1"]) == (pytest.approx(25.0), pytest.approx(45.0))
    assert (result["NoAns_exact"], result["NoAns_f1"]) == (50.0, 50.0)
    # Best threshold, walking questions by rising na_prob from "all no-answer" (2 of 6 right):
    # EM: q1 +1 -> 3 (best, at 0.1), q4 answered wrongly -1 -> 2, q2 +0, q5 +1 -> 3 (not better), q3 +0, q6 +0.
    assert result["best_exact"] == pytest.approx(50.0) and result["best_exact_thresh"] == 0.1
    # F1: q1 -> 3, q4 -> 2, q2 -> 2.8, q5 -> 3.8 (best, at 0.7), q3, q6 -> 3.8.
    assert result["best_f1"] == pytest.approx(100 * 3.8 / 6) and result["best_f1_thresh"] == 0.7
    assert list(result)[-4:] == ["best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"]


def test_ties_in_no_answer_probability_follow_the_files_order() -> None:
    gold = {"a": ["x"], "b": []}
    preds = {"a": "x", "b": "y"}
    # Equal probabilities: sorted() is stable, so the official walk follows the file. From 1 of 2 right
    # ("all no-answer"): "a" then "b" reaches 2 after "a"; "b" then "a" drops to 0 and climbs back to 1.
    first_a = score_v2(gold, preds, {"a": 0.5, "b": 0.5})
    assert (first_a["best_exact"], first_a["best_exact_thresh"]) == (100.0, 0.5)
    first_b = score_v2(gold, preds, {"b": 0.5, "a": 0.5})
    assert (first_b["best_exact"], first_b["best_exact_thresh"]) == (50.0, 0.0)


def test_missing_prediction_scores_zero_and_is_counted() -> None:
    result = score_v2({"a": ["x"], "b": []}, {"a": "x"})
    assert result["total"] == 2 and result["exact"] == pytest.approx(50.0) and result["NoAns_exact"] == 0.0


def test_v1_data_scores_the_same_as_v11_when_every_prediction_is_a_span() -> None:
    refs = {"q1": ["Denver Broncos"], "q2": ["Santa Clara, California"]}
    preds = {"q1": "Broncos", "q2": "Santa Clara"}
    v1, v2 = score(refs, preds), score_v2(refs, preds)
    assert (v2["exact"], v2["f1"]) == (pytest.approx(v1["exact_match"]), pytest.approx(v1["f1"]))
    assert "NoAns_total" not in v2


def test_refusals() -> None:
    with pytest.raises(ValueError, match="empty"):
        score_v2({}, {})
    with pytest.raises(ValueError, match="question q2: a prediction without a no-answer probability"):
        score_v2(GOLD, PREDICTIONS, {"q1": 0.0})


def test_missing_prediction_scores_zero_at_every_threshold() -> None:
    """The unanswered "b" is unanswerable: it must not count as a right no-answer, neither from a no-answer
    probability the file gives it nor in the walk for the best threshold (which starts from all no-answer)."""
    gold, preds = {"a": ["x"], "b": []}, {"a": "x"}
    for na_probs in ({"a": 0.0}, {"a": 0.0, "b": 5.0}):
        result = score_v2(gold, preds, na_probs)
        assert (result["exact"], result["NoAns_exact"]) == (50.0, 0.0)
        assert (result["best_exact"], result["best_f1"]) == (50.0, 50.0)
