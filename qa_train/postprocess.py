"""Turn start/end logits of tokenized windows into answer text.

Standard BERT SQuAD post-processing, vectorized over all features at once:

1. per feature, keep the ``n_best_size`` highest start positions and the
   ``n_best_size`` highest end positions (over the whole row, as the reference
   BERT code does -- question or padding tokens may take some of those slots);
2. a pair (s, e) of those is a candidate when both tokens lie in the context,
   e >= s and the span is at most ``max_answer_length`` tokens;
3. its score is ``start_logits[s] + end_logits[e]``; each question takes the
   best candidate over all of its windows and reads the text from the
   character offsets of s and e.

Ties are broken deterministically: among equal logits the lower position is
kept in the top-k, and among equal scores the earlier feature, then the lower
start, then the lower end wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Questions:
    """Which question each window belongs to, and every question's id and context."""

    feature_example_index: np.ndarray  # [F]: index into example_ids/contexts
    example_ids: Sequence[str]
    contexts: Sequence[str]


@dataclass(frozen=True)
class SpanRules:
    """How many start/end candidates a window offers, and the longest answer in tokens."""

    n_best_size: int = 20
    max_answer_length: int = 30


def _check_inputs(
    start_logits: np.ndarray, end_logits: np.ndarray, offsets: np.ndarray, questions: Questions, rules: SpanRules
) -> None:
    feature_example_index, example_ids, contexts = (
        questions.feature_example_index, questions.example_ids, questions.contexts,
    )  # fmt: skip
    n_best_size, max_answer_length = rules.n_best_size, rules.max_answer_length
    if start_logits.ndim != 2:
        raise ValueError(f"start_logits must be [features, seq_len], got shape {start_logits.shape}")
    num_features, seq_len = start_logits.shape
    if end_logits.shape != start_logits.shape:
        raise ValueError(f"end_logits shape {end_logits.shape} != start_logits shape {start_logits.shape}")
    if offsets.shape != (num_features, seq_len, 2):
        raise ValueError(f"offsets must have shape {(num_features, seq_len, 2)}, got {offsets.shape}")
    if feature_example_index.shape != (num_features,):
        raise ValueError(
            f"feature_example_index must have shape {(num_features,)}, got {feature_example_index.shape}"
        )
    if not all(np.issubdtype(a.dtype, np.integer) for a in (feature_example_index, offsets)):
        raise ValueError(
            f"feature_example_index and offsets must be integer arrays, "
            f"got {feature_example_index.dtype} and {offsets.dtype}"
        )
    if len(contexts) != len(example_ids):
        raise ValueError(f"{len(example_ids)} example_ids but {len(contexts)} contexts")
    if len(set(example_ids)) != len(example_ids):
        raise ValueError("example_ids contains duplicates; each question needs its own id")
    if num_features and (feature_example_index.min() < 0 or feature_example_index.max() >= len(example_ids)):
        raise ValueError(
            f"feature_example_index must lie in [0, {len(example_ids)}), "
            f"got values in [{feature_example_index.min()}, {feature_example_index.max()}]"
        )
    # Non-finite logits would make "invalid" (-inf) and "valid but -inf"
    # candidates indistinguishable, and inf - inf gives NaN scores.
    for name, logits in (("start_logits", start_logits), ("end_logits", end_logits)):
        if not np.isfinite(logits).all():
            raise ValueError(f"{name} contains NaN or infinite values; mask with a finite number instead")
    if n_best_size < 1 or max_answer_length < 1:
        raise ValueError(
            f"n_best_size ({n_best_size}) and max_answer_length ({max_answer_length}) must both be >= 1"
        )


def _top_k_positions(logits: np.ndarray, k: int) -> np.ndarray:
    """[F, k] positions of the k largest logits per row, ascending by position.

    argpartition picks an arbitrary subset when the k-th largest value is
    tied; those (rare) rows are redone with a stable sort so that ties always
    go to the lower position.
    """
    seq_len = logits.shape[1]
    top = np.argpartition(logits, seq_len - k, axis=1)[:, seq_len - k :]
    kth = np.take_along_axis(logits, top, axis=1).min(axis=1, keepdims=True)
    tied = np.flatnonzero((logits >= kth).sum(axis=1) > k)
    if tied.size:
        top[tied] = np.argsort(-logits[tied], axis=1, kind="stable")[:, :k]
    return np.sort(top, axis=1)


def _candidates(
    start_logits: np.ndarray, end_logits: np.ndarray, in_context: np.ndarray, rules: SpanRules
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start positions [F, k], end positions [F, k] and pair scores [F, k, k].

    Invalid pairs score -inf; inputs are checked to be finite, so -inf marks
    invalid and nothing else.
    """
    k = min(rules.n_best_size, start_logits.shape[1])
    starts = _top_k_positions(start_logits, k)
    ends = _top_k_positions(end_logits, k)
    # float64 so that the sum of two float32/float16 logits is exact and the
    # ranking matches adding them as Python floats.
    start_vals = np.take_along_axis(start_logits, starts, axis=1).astype(np.float64)
    end_vals = np.take_along_axis(end_logits, ends, axis=1).astype(np.float64)
    start_vals[~np.take_along_axis(in_context, starts, axis=1)] = -np.inf
    end_vals[~np.take_along_axis(in_context, ends, axis=1)] = -np.inf
    scores = start_vals[:, :, None] + end_vals[:, None, :]
    # int32 keeps the [F, k, k] span grid at half the size of intp.
    span = ends.astype(np.int32)[:, None, :] - starts.astype(np.int32)[:, :, None]
    np.putmask(scores, (span < 0) | (span >= rules.max_answer_length), -np.inf)
    return starts, ends, scores


def _first_per_group(groups: np.ndarray) -> np.ndarray:
    """Boolean mask of the first element of each run in a sorted array."""
    first = np.ones(len(groups), dtype=bool)
    first[1:] = groups[1:] != groups[:-1]
    return first


def _best_spans(
    starts: np.ndarray, ends: np.ndarray, scores: np.ndarray, feature_example_index: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per example with a valid candidate: (example, feature, start pos, end pos)."""
    num_features, k = starts.shape
    flat = scores.reshape(num_features, k * k)
    # argmax returns the first maximum; positions ascend within a row, so a
    # tie goes to the lower start, then the lower end.
    best = flat.argmax(axis=1)
    best_score = flat[np.arange(num_features), best]
    feats = np.flatnonzero(best_score > -np.inf)
    # lexsort: last key is primary -> by example, best score first, earlier feature.
    order = np.lexsort((feats, -best_score[feats], feature_example_index[feats]))
    feats = feats[order]
    feats = feats[_first_per_group(feature_example_index[feats])]
    s_pos = starts[feats, best[feats] // k]
    e_pos = ends[feats, best[feats] % k]
    return feature_example_index[feats], feats, s_pos, e_pos


def _nbest(
    candidates: tuple[np.ndarray, np.ndarray, np.ndarray], offsets: np.ndarray, questions: Questions, n_best_size: int
) -> dict[str, list[dict]]:
    """Up to n_best_size valid candidates per example, best first, same tie order as the answer."""
    starts, ends, scores = candidates
    feature_example_index, example_ids, contexts = (
        questions.feature_example_index, questions.example_ids, questions.contexts,
    )  # fmt: skip
    feat, si, ei = np.nonzero(scores > -np.inf)
    s_pos, e_pos = starts[feat, si], ends[feat, ei]
    cand_scores = scores[feat, si, ei]
    ex = feature_example_index[feat]
    # nonzero already lists candidates by feature, then start, then end (top-k
    # positions are sorted), and lexsort is stable, so two keys give the full
    # tie order at about half the cost of five keys.
    order = np.lexsort((-cand_scores, ex))
    feat, s_pos, e_pos, ex = feat[order], s_pos[order], e_pos[order], ex[order]
    bounds = np.flatnonzero(_first_per_group(ex)).tolist() + [len(ex)]
    ex = ex.tolist()
    char_start = offsets[feat, s_pos, 0].tolist()
    char_end = offsets[feat, e_pos, 1].tolist()
    cand_scores = cand_scores[order].tolist()
    nbest: dict[str, list[dict]] = {qid: [] for qid in example_ids}
    # Building ~200k dicts dominates here; one list comprehension per example
    # is about 1.4x faster than appending candidate by candidate.
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        i = ex[lo]
        context = contexts[i]
        top = slice(lo, min(hi, lo + n_best_size))
        nbest[example_ids[i]] = [
            {"text": context[a:b], "score": sc, "start": a, "end": b}
            for a, b, sc in zip(char_start[top], char_end[top], cand_scores[top])
        ]
    return nbest


def postprocess_predictions(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    offsets: np.ndarray,
    questions: Questions,
    rules: SpanRules = SpanRules(),
    return_nbest: bool = False,
) -> dict[str, str] | tuple[dict[str, str], dict[str, list[dict]]]:
    """Best answer text for every example id ("" when no window has a valid span).

    ``offsets[f, t]`` holds the character span of token t of feature f within
    ``questions.contexts[questions.feature_example_index[f]]``, or (-1, -1) for
    question, special and padding tokens. With ``return_nbest`` also returns, per
    example id, up to ``rules.n_best_size`` candidates ``{"text", "score", "start",
    "end"}`` (start and end are character offsets), best first; the same span seen
    from overlapping windows may appear more than once.
    """
    start_logits = np.asarray(start_logits)
    end_logits = np.asarray(end_logits)
    offsets = np.asarray(offsets)
    questions = Questions(np.asarray(questions.feature_example_index), questions.example_ids, questions.contexts)
    _check_inputs(start_logits, end_logits, offsets, questions, rules)
    ids, contexts = questions.example_ids, questions.contexts
    predictions = {qid: "" for qid in ids}
    if start_logits.size == 0:
        return (predictions, {qid: [] for qid in ids}) if return_nbest else predictions

    in_context = (offsets[..., 0] >= 0) & (offsets[..., 1] >= 0)
    candidates = _candidates(start_logits, end_logits, in_context, rules)
    examples, feats, s_pos, e_pos = _best_spans(*candidates, questions.feature_example_index)
    char_start = offsets[feats, s_pos, 0].tolist()
    char_end = offsets[feats, e_pos, 1].tolist()
    for i, a, b in zip(examples.tolist(), char_start, char_end):
        predictions[ids[i]] = contexts[i][a:b]
    if not return_nbest:
        return predictions
    return predictions, _nbest(candidates, offsets, questions, rules.n_best_size)
