"""Turn start/end logits of tokenized windows into answer text.

Standard BERT SQuAD post-processing, vectorized over all features at once:

1. per feature, keep the ``n_best_size`` highest start positions and the
   ``n_best_size`` highest end positions among the window's *context* tokens;
2. a pair (s, e) of those is a candidate when e >= s and the span is at most
   ``max_answer_length`` tokens;
3. its score is ``start_logits[s] + end_logits[e]``; each question takes the
   best candidate over all of its windows and reads the text from the
   character offsets of s and e.

Step 1 differs from the reference BERT code and transformers' utils_qa, which
take the top n over the whole padded row and drop out-of-context positions
afterwards: there padding and question tokens use up candidate slots, and how
many padding tokens a window has depends on the batch it was evaluated in, so
the answers changed with the evaluation batch size. Masking first makes them a
function of the weights alone.

SQuAD v2.0 (``SpanRules.null_score_diff_threshold`` set): the null answer scores
``start_logits[cls] + end_logits[cls]``, its lowest value over the question's
windows is compared with the best span whose text is non-empty, and the question
gets "" when the null score beats the span by more than the threshold
(transformers' run_qa rule). SQuAD v1.1 answers with the best span even when its
text is empty, as utils_qa does; utils_qa then reports the placeholder "empty"
when that span is the only candidate, where this module keeps "".

Ties are broken deterministically: among equal logits the lower position is
kept in the top-k, and among equal scores the earlier feature, then the lower
start, then the lower end wins.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import numpy as np

# The null odds of a question none of whose windows offers a span: the null answer is its only
# candidate. Finite, so the odds file stays strict JSON, and above any threshold a user can set.
NO_SPAN_ODDS = sys.float_info.max


@dataclass(frozen=True)
class Questions:
    """Which question each window belongs to, and every question's id and context."""

    feature_example_index: np.ndarray  # [F]: index into example_ids/contexts
    example_ids: Sequence[str]
    contexts: Sequence[str]
    null_index: np.ndarray | None = None  # [F]: where each window's null answer (CLS) sits; SQuAD v2.0 only


@dataclass(frozen=True)
class SpanRules:
    """How many start/end candidates a window offers, the longest answer in tokens, and for SQuAD v2.0
    how far the null score must beat the best span for the answer to be "" (None: v1.1, always a span)."""

    n_best_size: int = 20
    max_answer_length: int = 30
    null_score_diff_threshold: float | None = None

    @classmethod
    def of(cls, answering: Mapping[str, Any]) -> SpanRules:
        """The rules of an answering record (`TrainArgs.answering()`, or what an export recorded of it): a null
        threshold only for SQuAD v2.0, 0.0 where none was recorded."""
        v2 = answering["version_2_with_negative"]
        threshold = float(answering["null_score_diff_threshold"] or 0.0) if v2 else None
        return cls(answering["n_best_size"], answering["max_answer_length"], threshold)


@dataclass
class Answers:
    """Post-processing's conclusion for every question."""

    predictions: dict[str, str]  # the answer text; "" for no answer
    # Up to n_best_size entries per question, best first: text, probability (softmax over the listed
    # scores, as transformers' utils_qa), score, start_logit, end_logit, start and end (character offsets).
    nbest: dict[str, list[dict]]
    null_odds: dict[str, float] | None = None  # v2.0: null score minus the best span's score


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
        raise ValueError(f"feature_example_index must have shape {(num_features,)}, got {feature_example_index.shape}")
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
        raise ValueError(f"n_best_size ({n_best_size}) and max_answer_length ({max_answer_length}) must both be >= 1")
    if questions.null_index is not None:
        _check_null_index(np.asarray(questions.null_index), num_features, seq_len)


def _check_null_index(null_index: np.ndarray, num_features: int, seq_len: int) -> None:
    if null_index.shape != (num_features,) or not np.issubdtype(null_index.dtype, np.integer):
        raise ValueError(
            f"null_index must be an integer array of shape {(num_features,)}, got {null_index.dtype} {null_index.shape}"
        )
    if num_features and (null_index.min() < 0 or null_index.max() >= seq_len):
        raise ValueError(
            f"null_index must lie in [0, {seq_len}), got values in [{null_index.min()}, {null_index.max()}]"
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
    # Masked before the top-k (see the module docstring): candidates never depend on how much
    # padding or question the row holds.
    start_logits = np.where(in_context, start_logits, -np.inf)
    end_logits = np.where(in_context, end_logits, -np.inf)
    starts = _top_k_positions(start_logits, k)
    ends = _top_k_positions(end_logits, k)
    # float64 so that the sum of two float32/float16 logits is exact and the
    # ranking matches adding them as Python floats.
    start_vals = np.take_along_axis(start_logits, starts, axis=1).astype(np.float64)
    end_vals = np.take_along_axis(end_logits, ends, axis=1).astype(np.float64)
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
    candidates: tuple[np.ndarray, np.ndarray, np.ndarray],
    logits: tuple[np.ndarray, np.ndarray],
    offsets: np.ndarray,
    questions: Questions,
    n_best_size: int,
    text_span: bool = False,
) -> dict[str, list[dict]]:
    """Up to n_best_size valid candidates per example, best first, same tie order as the answer; with `text_span`
    one more, the best candidate with text, when none of those has any (SQuAD v2.0's null competes with it)."""
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
    start_logit = logits[0][feat, s_pos].tolist()
    end_logit = logits[1][feat, e_pos].tolist()
    cand_scores = cand_scores[order].tolist()
    nbest: dict[str, list[dict]] = {qid: [] for qid in example_ids}

    # Building ~200k dicts dominates here; one list comprehension per example
    # is about 1.4x faster than appending candidate by candidate.
    def listed(context: str, rows: slice) -> list[dict]:
        return [
            {"text": context[a:b], "score": sc, "start_logit": sl, "end_logit": el, "start": a, "end": b}
            for a, b, sc, sl, el in zip(
                char_start[rows], char_end[rows], cand_scores[rows], start_logit[rows], end_logit[rows]
            )
        ]

    for lo, hi in zip(bounds[:-1], bounds[1:]):
        i = ex[lo]
        top = slice(lo, min(hi, lo + n_best_size))
        entries = listed(contexts[i], top)
        if text_span and not any(e["text"] for e in entries):
            j = next((j for j in range(top.stop, hi) if char_start[j] < char_end[j]), None)
            if j is not None:
                entries += listed(contexts[i], slice(j, j + 1))
        nbest[example_ids[i]] = entries
    return nbest


@overload
def postprocess_predictions(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    offsets: np.ndarray,
    questions: Questions,
    rules: SpanRules = ...,
    return_nbest: Literal[False] = ...,
) -> dict[str, str]: ...


@overload
def postprocess_predictions(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    offsets: np.ndarray,
    questions: Questions,
    rules: SpanRules = ...,
    *,
    return_nbest: Literal[True],
) -> tuple[dict[str, str], dict[str, list[dict]]]: ...


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
    example id, up to ``rules.n_best_size`` candidates ``{"text", "score",
    "start_logit", "end_logit", "start", "end"}`` (start and end are character
    offsets), best first; the same span seen from overlapping windows may appear
    more than once. Spans only: ``answer_questions`` adds SQuAD v2.0's null answer.
    """
    start_logits = np.asarray(start_logits)
    end_logits = np.asarray(end_logits)
    offsets = np.asarray(offsets)
    questions = Questions(
        np.asarray(questions.feature_example_index), questions.example_ids, questions.contexts, questions.null_index
    )
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
    v2 = rules.null_score_diff_threshold is not None
    return predictions, _nbest(candidates, (start_logits, end_logits), offsets, questions, rules.n_best_size, v2)


def _null_answers(start_logits: np.ndarray, end_logits: np.ndarray, questions: Questions) -> list[dict | None]:
    """Per example, the null answer of its window with the lowest null score (None without windows)."""
    fei = np.asarray(questions.feature_example_index)
    if questions.null_index is None:
        raise ValueError("SQuAD v2.0 post-processing needs Questions.null_index (where each window's CLS sits)")
    rows = np.arange(len(fei))
    null_index = np.asarray(questions.null_index)
    s = start_logits[rows, null_index].astype(np.float64)
    e = end_logits[rows, null_index].astype(np.float64)
    # The lowest null score over the windows, as transformers' utils_qa and BERT's run_squad take it;
    # lexsort is stable, so a tie goes to the earlier window.
    order = np.lexsort((s + e, fei))
    first = order[_first_per_group(fei[order])]
    out: list[dict | None] = [None] * len(questions.example_ids)
    for f in first.tolist():
        out[int(fei[f])] = {
            "text": "",
            "score": float(s[f] + e[f]),
            "start_logit": float(s[f]),
            "end_logit": float(e[f]),
            "start": 0,
            "end": 0,
        }
    return out


def _with_probabilities(entries: list[dict]) -> list[dict]:
    """Softmax over the listed scores, as transformers' utils_qa reports it; `probability` after `text`."""
    if not entries:
        return entries
    scores = np.asarray([e["score"] for e in entries], dtype=np.float64)
    p = np.exp(scores - scores.max())
    p /= p.sum()
    return [
        {"text": e["text"], "probability": float(q), **{k: v for k, v in e.items() if k != "text"}}
        for e, q in zip(entries, p.tolist())
    ]


def answer_questions(
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    offsets: np.ndarray,
    questions: Questions,
    rules: SpanRules = SpanRules(),
) -> Answers:
    """Every question's answer and n-best list with probabilities; SQuAD v2.0's null answer and odds when
    ``rules.null_score_diff_threshold`` is set (a question gets "" when null - best span > threshold)."""
    start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
    predictions, nbest = postprocess_predictions(start_logits, end_logits, offsets, questions, rules, return_nbest=True)
    if rules.null_score_diff_threshold is None:
        return Answers(predictions, {qid: _with_probabilities(v) for qid, v in nbest.items()})
    nulls = _null_answers(start_logits, end_logits, questions) if len(start_logits) else [None] * len(nbest)
    odds: dict[str, float] = {}
    for qid, null in zip(questions.example_ids, nulls):
        if null is None:  # no window at all: nothing to say but ""
            odds[qid], predictions[qid] = NO_SPAN_ODDS, ""
            continue
        # The null competes with the best span that has text among all the candidates (_nbest adds it when
        # the n_best_size best have none), not only among those left in the n-best once the null joins it:
        # with n_best_size 1 a null above the best span would push it out.
        best = next((c for c in nbest[qid] if c["text"]), None)
        # As utils_qa: the null joins the spans (after those of equal score: the sort is stable) and
        # stays in the list even when n_best_size spans beat it; so does the best span with text, which
        # may be the answer.
        ranked = sorted([*nbest[qid], null], key=lambda c: -c["score"])[: rules.n_best_size]
        kept = [c for c in (null, best) if c is not None and not any(c is r for r in ranked)]
        nbest[qid] = sorted([*ranked, *kept], key=lambda c: -c["score"])
        odds[qid], predictions[qid] = _null_or_span(best, null, rules.null_score_diff_threshold)
    return Answers(predictions, {qid: _with_probabilities(v) for qid, v in nbest.items()}, odds)


def _null_or_span(best: dict | None, null: dict, threshold: float) -> tuple[float, str]:
    """(null odds, answer) of one v2.0 question from its best span with non-empty text and its null.

    The null competes with the best span whose text is non-empty, as utils_qa's best_non_null_pred:
    byte-level BPE (RoBERTa, ModernBERT) gives a lone 'Ġ' zero-width offsets, and such a span would
    otherwise answer "" with odds against a span that says nothing.
    """
    if best is None:  # no span with text (utils_qa invents "empty" or fails): the null is all there is
        return NO_SPAN_ODDS, ""
    odds = null["score"] - best["score"]
    return odds, "" if odds > threshold else best["text"]
