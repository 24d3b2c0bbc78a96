"""Post-processing picks the right span; checked by hand and against a slow reference."""

from __future__ import annotations

import numpy as np
import pytest

from qa_train.predict import best_entry
from qa_train.squad.postprocess import NO_SPAN_ODDS, Questions, SpanRules, answer_questions, postprocess_predictions

CONTEXT = "Super Bowl 50 was played at Levi's Stadium in Santa Clara California"
WORDS = CONTEXT.split()  # 12 words; "Santa" is word 9, "Clara" word 10


def _word_offsets(context: str) -> list[tuple[int, int]]:
    spans, pos = [], 0
    for word in context.split():
        start = context.index(word, pos)
        spans.append((start, start + len(word)))
        pos = start + len(word)
    return spans


def _window(first_word: int, last_word: int, question_len: int, seq_len: int) -> np.ndarray:
    """Offsets [seq_len, 2] of one window: question tokens, then words, then padding."""
    offsets = np.full((seq_len, 2), -1, dtype=np.int32)
    words = _word_offsets(CONTEXT)[first_word : last_word + 1]
    offsets[question_len : question_len + len(words)] = words
    return offsets


def _run(start: np.ndarray, end: np.ndarray, offsets: np.ndarray, return_nbest: bool = False, **rules):
    return postprocess_predictions(
        np.asarray(start, dtype=np.float32),
        np.asarray(end, dtype=np.float32),
        offsets,
        Questions(np.zeros(len(offsets), dtype=np.int64), ["q"], [CONTEXT]),
        SpanRules(**rules),
        return_nbest=return_nbest,
    )


def test_best_span_across_overlapping_windows() -> None:
    # Window A: 2 question tokens + words 3..9; window B: 2 question tokens +
    # words 6..11 + 1 padding. "Santa Clara" (words 9..10) is only whole in B.
    offsets = np.stack([_window(3, 9, 2, 9), _window(6, 11, 2, 9)])
    start = np.zeros((2, 9))
    end = np.zeros((2, 9))
    # A can only offer "Santa" (token 8): 5 + 4 = 9.
    start[0, 8], end[0, 8] = 5, 4
    # B has "Santa Clara" (tokens 5..6): 6 + 6 = 12, the best across windows.
    start[1, 5], end[1, 6] = 6, 6
    assert _run(start, end, offsets) == {"q": "Santa Clara"}
    # The winner does not depend on the order of the windows.
    assert _run(start[::-1], end[::-1], offsets[::-1]) == {"q": "Santa Clara"}
    # Raise A's span to 10 + 4 = 14 and it wins instead.
    start[0, 8] = 10
    assert _run(start, end, offsets) == {"q": "Santa"}


def test_respects_max_answer_length_and_order() -> None:
    offsets = _window(0, 11, 0, 12)[None]  # token t is word t
    start = np.zeros((1, 12))
    end = np.zeros((1, 12))
    start[0, 10], end[0, 9] = 10, 10  # (10, 9) = 20 ends before it starts: never valid
    start[0, 0] = 7  # (0, 9) = 7 + 10 = 17, 10 tokens long
    end[0, 11] = 6  # (10, 11) = 10 + 6 = 16, 2 tokens long
    assert _run(start, end, offsets, max_answer_length=10) == {"q": " ".join(WORDS[:10])}
    assert _run(start, end, offsets, max_answer_length=9) == {"q": "Clara California"}
    assert _run(start, end, offsets, max_answer_length=2) == {"q": "Clara California"}


def test_ignores_non_context_tokens_with_highest_logits() -> None:
    # 3 question tokens, words 0..4, 2 padding tokens.
    offsets = _window(0, 4, 3, 10)[None]
    start = np.zeros((1, 10))
    end = np.zeros((1, 10))
    start[0, [0, 1, 8]] = 100  # question and padding tokens dominate
    end[0, [2, 9]] = 100
    start[0, 4], end[0, 5] = 3, 3  # words 1..2: "Bowl 50"
    assert _run(start, end, offsets) == {"q": "Bowl 50"}


def test_question_and_padding_tokens_never_take_candidate_slots() -> None:
    """The reference BERT code picks the top n over the whole row, so here (n = 1) it would find no valid
    span; candidates are chosen among context tokens only."""
    offsets = _window(0, 4, 3, 10)[None]
    start = np.zeros((1, 10))
    end = np.zeros((1, 10))
    start[0, 0] = end[0, 1] = 100  # question tokens have the highest logits
    start[0, 9] = end[0, 9] = 200  # and so does padding
    start[0, 5], end[0, 6] = 1, 1  # words 2..3: "50 was"
    assert _run(start, end, offsets, n_best_size=1) == {"q": "50 was"}


def test_answers_do_not_depend_on_padding() -> None:
    """The same window padded to any width, with any logits on the padding, gives the same n-best."""
    rng = np.random.default_rng(7)
    offsets = _window(0, 11, 4, 16)
    start, end = rng.standard_normal(16), rng.standard_normal(16)
    want = _run(start[None], end[None], offsets[None], return_nbest=True, n_best_size=5)
    for width in (16, 17, 24, 64):
        padded_offsets = np.full((1, width, 2), -1, dtype=np.int32)
        padded_offsets[0, :16] = offsets
        s, e = np.full((1, width), 50.0), np.full((1, width), 50.0)  # padding logits above every real one
        s[0, :16], e[0, :16] = start, end
        assert _run(s, e, padded_offsets, return_nbest=True, n_best_size=5) == want


def test_empty_answer_when_no_window_has_context() -> None:
    offsets = np.full((1, 10, 2), -1, dtype=np.int32)  # a window of question and special tokens only
    logits = np.arange(10, dtype=np.float32)[None]
    preds, nbest = _run(logits, logits, offsets, return_nbest=True)
    assert preds == {"q": ""} and nbest == {"q": []}


def test_example_without_features_gets_empty_answer() -> None:
    offsets = _window(0, 4, 0, 5)[None]
    logits = np.arange(5, dtype=np.float32)[None]
    preds = postprocess_predictions(logits, logits, offsets, Questions(np.array([1]), ["a", "b"], ["unused", CONTEXT]))
    # start and end logits both peak at token 4 = word 4: (4, 4) = 8 beats (3, 4) = 7.
    assert preds == {"a": "", "b": "played"}


def test_nbest_ordering() -> None:
    offsets = _window(0, 11, 1, 13)[None]
    start = np.zeros((1, 13))
    end = np.zeros((1, 13))
    start[0, 10], start[0, 11] = 5, 4  # words 9, 10
    end[0, 11], end[0, 12] = 3, 2  # words 10, 11
    preds, nbest = _run(start, end, offsets, n_best_size=2, return_nbest=True, max_answer_length=5)
    # Token t is word t - 1. Top-2 starts {10, 11}, top-2 ends {11, 12}:
    # (10,11)=8, (10,12)=7, (11,11)=7, (11,12)=6. Only 2 are kept, and the tie
    # at 7 goes to the lower start, so "Clara" (11,11) is cut.
    got = [(c["text"], c["score"]) for c in nbest["q"]]
    assert got == [("Santa Clara", 8.0), ("Santa Clara California", 7.0)]
    assert preds["q"] == nbest["q"][0]["text"]
    first = nbest["q"][0]
    assert CONTEXT[first["start"] : first["end"]] == "Santa Clara"


def test_shape_mismatch_errors() -> None:
    offsets = _window(0, 4, 0, 5)[None]
    logits = np.zeros((1, 5), dtype=np.float32)
    fei = np.zeros(1, dtype=np.int64)
    with pytest.raises(ValueError, match="end_logits shape"):
        postprocess_predictions(logits, np.zeros((1, 6)), offsets, Questions(fei, ["q"], [CONTEXT]))
    with pytest.raises(ValueError, match="offsets must have shape"):
        postprocess_predictions(logits, logits, offsets[:, :4], Questions(fei, ["q"], [CONTEXT]))
    with pytest.raises(ValueError, match="feature_example_index must have shape"):
        postprocess_predictions(logits, logits, offsets, Questions(np.zeros(2, dtype=np.int64), ["q"], [CONTEXT]))
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\)"):
        postprocess_predictions(logits, logits, offsets, Questions(np.array([1]), ["q"], [CONTEXT]))
    with pytest.raises(ValueError, match="1 example_ids but 2 contexts"):
        postprocess_predictions(logits, logits, offsets, Questions(fei, ["q"], [CONTEXT, CONTEXT]))
    with pytest.raises(ValueError, match="NaN or infinite"):
        postprocess_predictions(np.full((1, 5), np.nan), logits, offsets, Questions(fei, ["q"], [CONTEXT]))


# --- randomized equivalence with a deliberately naive implementation ---------


def _reference(start, end, offsets, fei, ids, contexts, n_best_size, max_answer_length):
    """Pure-Python double loop with the documented tie rules."""
    candidates: dict[int, list[tuple]] = {i: [] for i in range(len(ids))}
    for f in range(len(start)):
        # Context tokens only; highest logits first; equal logits -> lower position first.
        positions = [t for t in range(len(start[f])) if offsets[f][t][0] != -1]
        top_s = sorted(positions, key=lambda t: (-float(start[f][t]), t))[:n_best_size]
        top_e = sorted(positions, key=lambda t: (-float(end[f][t]), t))[:n_best_size]
        for s in top_s:
            for e in top_e:
                if offsets[f][s][0] == -1 or offsets[f][e][0] == -1:
                    continue
                if e < s or e - s + 1 > max_answer_length:
                    continue
                sc = float(start[f][s]) + float(end[f][e])
                candidates[int(fei[f])].append((-sc, f, int(s), int(e)))
    preds, nbest = {}, {}
    for i, qid in enumerate(ids):
        ranked = sorted(candidates[i])[:n_best_size]
        spans = [(-neg, int(offsets[f][s][0]), int(offsets[f][e][1])) for neg, f, s, e in ranked]
        nbest[qid] = [(sc, contexts[i][a:b], a, b) for sc, a, b in spans]
        preds[qid] = nbest[qid][0][1] if ranked else ""
    return preds, nbest


def _random_batch(rng: np.random.Generator, integer_logits: bool):
    num_examples = int(rng.integers(1, 8))
    seq_len = int(rng.integers(4, 40))
    contexts = [" ".join(f"w{i}x{j}" for j in range(int(rng.integers(1, 60)))) for i in range(num_examples)]
    # Each example gets 0-3 windows; example order is shuffled to mimic a sharded eval.
    fei = np.array([i for i in range(num_examples) for _ in range(int(rng.integers(0, 4)))], dtype=np.int64)
    fei = rng.permutation(fei)
    offsets = np.full((len(fei), seq_len, 2), -1, dtype=np.int32)
    for f, i in enumerate(fei):
        words = _word_offsets(contexts[i])
        question = int(rng.integers(0, seq_len))
        room = min(seq_len - question, len(words))
        count = int(rng.integers(0, room + 1))
        first = int(rng.integers(0, len(words) - count + 1))
        if count:
            offsets[f, question : question + count] = words[first : first + count]
    shape = (len(fei), seq_len)
    if integer_logits:  # few distinct values -> many ties in top-k and in scores
        start, end = (rng.integers(-3, 4, shape).astype(np.float32) for _ in range(2))
    else:
        start, end = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    ids = [f"q{i}" for i in range(num_examples)]
    return start, end, offsets, fei, ids, contexts


@pytest.mark.parametrize("integer_logits", [False, True])
def test_matches_slow_reference(integer_logits: bool) -> None:
    rng = np.random.default_rng(1234 + integer_logits)
    for _ in range(300):
        batch = _random_batch(rng, integer_logits)
        n_best_size = int(rng.integers(1, 8))
        max_answer_length = int(rng.integers(1, 10))
        start, end, offsets, fei, ids, contexts = batch
        preds, nbest = postprocess_predictions(
            start,
            end,
            offsets,
            Questions(fei, ids, contexts),
            SpanRules(n_best_size, max_answer_length),
            return_nbest=True,
        )
        want_preds, want_nbest = _reference(*batch, n_best_size, max_answer_length)
        assert preds == want_preds
        got_nbest = {q: [(c["score"], c["text"], c["start"], c["end"]) for c in v] for q, v in nbest.items()}
        assert got_nbest == want_nbest


# --- SQuAD v2.0: the null answer, and the n-best with probabilities ---------


def _v2(start, end, offsets, null_index, **rules):
    questions = Questions(np.zeros(len(offsets), dtype=np.int64), ["q"], [CONTEXT], np.asarray(null_index))
    return answer_questions(
        np.asarray(start, dtype=np.float32), np.asarray(end, dtype=np.float32), offsets, questions, SpanRules(**rules)
    )


def _cls_window() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CLS at 0, 2 question tokens, words 0..4 at positions 3..7, 2 padding; null 2 + 2 = 4, "Bowl 50" 3 + 3 = 6."""
    offsets = _window(0, 4, 3, 10)[None]
    start, end = np.zeros((1, 10)), np.zeros((1, 10))
    start[0, 0] = end[0, 0] = 2
    start[0, 4], end[0, 5] = 3, 3
    return start, end, offsets


def test_null_answer_wins_when_it_beats_the_span_by_more_than_the_threshold() -> None:
    start, end, offsets = _cls_window()
    kept = _v2(start, end, offsets, [0], null_score_diff_threshold=0.0)
    assert kept.predictions == {"q": "Bowl 50"} and kept.null_odds == {"q": -2.0}  # 4 - 6
    assert _v2(start, end, offsets, [0], null_score_diff_threshold=-2.0).predictions == {"q": "Bowl 50"}
    assert _v2(start, end, offsets, [0], null_score_diff_threshold=-2.5).predictions == {"q": ""}
    nbest = kept.nbest["q"]
    assert [e["text"] for e in nbest[:2]] == ["Bowl 50", ""] and nbest[1]["score"] == 4.0
    assert (nbest[1]["start_logit"], nbest[1]["end_logit"]) == (2.0, 2.0)
    assert sum(e["probability"] for e in nbest) == pytest.approx(1.0)
    assert nbest[0]["probability"] / nbest[1]["probability"] == pytest.approx(np.exp(6 - 4))


def test_null_score_is_the_lowest_over_the_windows() -> None:
    start, end, offsets = _cls_window()
    start2, end2 = start.copy(), end.copy()
    start2[0, 0], end2[0, 0] = 0.25, 0.5  # the second window's null: 0.75
    answers = _v2(
        np.concatenate([start, start2]),
        np.concatenate([end, end2]),
        np.concatenate([offsets, offsets]),
        [0, 0],
        null_score_diff_threshold=0.0,
    )
    assert answers.null_odds == {"q": 0.75 - 6}
    null = next(e for e in answers.nbest["q"] if e["text"] == "")
    assert (null["score"], null["start_logit"], null["end_logit"]) == (0.75, 0.25, 0.5)


def test_null_stays_in_the_nbest_when_spans_fill_it() -> None:
    start, end, offsets = _cls_window()
    answers = _v2(start, end, offsets, [0], null_score_diff_threshold=0.0, n_best_size=1)
    assert [e["text"] for e in answers.nbest["q"]] == ["Bowl 50", ""]


def test_v1_nbest_has_probabilities_and_no_null() -> None:
    start, end, offsets = _cls_window()
    answers = answer_questions(start, end, offsets, Questions(np.zeros(1, dtype=np.int64), ["q"], [CONTEXT]))
    assert answers.null_odds is None and "" not in [e["text"] for e in answers.nbest["q"]]
    probs = [e["probability"] for e in answers.nbest["q"]]
    assert sum(probs) == pytest.approx(1.0) and probs == sorted(probs, reverse=True)
    assert list(answers.nbest["q"][0]) == ["text", "probability", "score", "start_logit", "end_logit", "start", "end"]


def _zero_width_window() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CLS, a question token, "Super" "Bowl" and a zero-width token (byte-level BPE's lone 'Ġ' of a double space)
    at character 10. Scores: the zero-width span alone 10 (text ""), "Bowl" to it 9, "Bowl" 8, the null 6."""
    offsets = np.full((1, 6, 2), -1, dtype=np.int32)
    offsets[0, 2:5] = [(0, 5), (6, 10), (10, 10)]
    start, end = np.full((1, 6), -10.0), np.full((1, 6), -10.0)
    start[0, 4] = end[0, 4] = 5
    start[0, 3] = end[0, 3] = 4
    start[0, 0] = end[0, 0] = 3
    return start, end, offsets


def test_v2_null_competes_with_the_best_span_that_has_text() -> None:
    answers = _v2(*_zero_width_window(), [0], null_score_diff_threshold=0.0)
    # utils_qa's best_non_null_pred: "Bowl" (9), not the empty span (10) ranked above it.
    assert answers.predictions == {"q": "Bowl"} and answers.null_odds == {"q": 6.0 - 9.0}
    assert [e["text"] for e in answers.nbest["q"][:4]] == ["", "Bowl", "Bowl", ""]
    assert _v2(*_zero_width_window(), [0], null_score_diff_threshold=-3.5).predictions == {"q": ""}


def test_v2_without_a_span_that_has_text_answers_the_null() -> None:
    start, end, offsets = _zero_width_window()
    offsets[0, 2:4] = -1  # only the zero-width token is context
    answers = _v2(start, end, offsets, [0], null_score_diff_threshold=0.0)
    assert answers.predictions == {"q": ""} and answers.null_odds == {"q": NO_SPAN_ODDS}


def test_v2_finds_the_span_with_text_below_n_best_size_empty_ones() -> None:
    """Three zero-width tokens after "Bowl" make six empty spans (16-20) above the best with text, "Bowl" to the
    first of them (11): with n_best_size 4 none of the four listed had text, and the question answered "" with
    odds no threshold could reach, though its candidates held "Bowl"."""
    offsets = np.full((1, 8, 2), -1, dtype=np.int32)
    offsets[0, 2:7] = [(0, 5), (6, 10), (10, 10), (10, 10), (10, 10)]
    start, end = np.full((1, 8), -10.0), np.full((1, 8), -10.0)
    start[0, 3:7] = end[0, 3:7] = [1, 10, 9, 8]
    start[0, 0] = end[0, 0] = 3
    for n_best_size in (4, 20):
        answers = _v2(start, end, offsets, [0], null_score_diff_threshold=0.0, n_best_size=n_best_size)
        assert answers.predictions == {"q": "Bowl"} and answers.null_odds == {"q": 6.0 - 11.0}
    assert [e["text"] for e in answers.nbest["q"]][:7] == [""] * 6 + ["Bowl"]


def test_v1_answers_the_best_span_even_when_empty() -> None:
    start, end, offsets = _zero_width_window()
    answers = answer_questions(start, end, offsets, Questions(np.zeros(1, dtype=np.int64), ["q"], [CONTEXT]))
    assert answers.predictions == {"q": ""}  # utils_qa v1: predictions[0]["text"]


def test_best_entry_of_a_v2_null_answer_is_the_null_not_an_empty_span() -> None:
    answers = _v2(*_zero_width_window(), [0], null_score_diff_threshold=-3.5)
    entry = best_entry(answers, "q")
    assert (entry["answer"], entry["score"], entry["start"], entry["end"]) == ("", 6.0, 0, 0)


def test_v2_null_above_the_only_listed_span_still_competes_with_it() -> None:
    """n_best_size 1: the null (score 7) takes the n-best's one place ahead of "Bowl 50" (6), yet it is that span
    the null is compared with, so the answer and odds do not depend on n_best_size, and the span stays listed."""
    start, end, offsets = _cls_window()
    start[0, 0] = end[0, 0] = 3.5
    for n_best_size in (1, 2, 20):
        answers = _v2(start, end, offsets, [0], null_score_diff_threshold=5.0, n_best_size=n_best_size)
        assert answers.predictions == {"q": "Bowl 50"} and answers.null_odds == {"q": 1.0}
        assert [e["text"] for e in answers.nbest["q"]][:2] == ["", "Bowl 50"]
        assert best_entry(answers, "q")["score"] == 6.0
    assert _v2(start, end, offsets, [0], null_score_diff_threshold=0.0, n_best_size=1).predictions == {"q": ""}


@pytest.mark.parametrize(
    ("v2", "threshold", "expected"),
    [(False, 0.0, None), (False, None, None), (True, None, 0.0), (True, -1.5, -1.5)],
)
def test_span_rules_of_an_answering_record_keep_a_null_threshold_for_v2_only(v2, threshold, expected) -> None:
    """Training's evaluation (TrainArgs.answering()) and predict (an export's record) read their rules alike: a
    v1.1 run never answers "", and a v2 record without a threshold takes the default 0.0."""
    from qa_train.config.settings import DataArgs, EvalArgs, answering

    record = {
        **answering(DataArgs(dataset_name=None), EvalArgs(n_best_size=7, max_answer_length=11)),
        "version_2_with_negative": v2,
        "null_score_diff_threshold": threshold,
    }
    assert SpanRules.of(record) == SpanRules(7, 11, expected)
