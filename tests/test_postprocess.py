"""Post-processing picks the right span; checked by hand and against a slow reference."""

from __future__ import annotations

import numpy as np
import pytest

from qa_train.postprocess import Questions, SpanRules, postprocess_predictions

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


def test_empty_answer_when_nothing_valid() -> None:
    offsets = _window(0, 4, 3, 10)[None]
    start = np.zeros((1, 10))
    end = np.zeros((1, 10))
    start[0, 0] = end[0, 1] = 100  # only question tokens make the top-1
    assert _run(start, end, offsets, n_best_size=1) == {"q": ""}
    preds, nbest = _run(start, end, offsets, n_best_size=1, return_nbest=True)
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
        positions = range(len(start[f]))
        # Highest logits first; equal logits -> lower position first.
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
            start, end, offsets, Questions(fei, ids, contexts), SpanRules(n_best_size, max_answer_length),
            return_nbest=True,
        )
        want_preds, want_nbest = _reference(*batch, n_best_size, max_answer_length)
        assert preds == want_preds
        got_nbest = {q: [(c["score"], c["text"], c["start"], c["end"]) for c in v] for q, v in nbest.items()}
        assert got_nbest == want_nbest
