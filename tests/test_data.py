"""Loading and validation of SQuAD files; windows and labels against the tokenizer itself."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from conftest import DEMO_DEV, DEMO_TRAIN, TINY
from qa_train.data import DataError, load_file
from qa_train.features import featurize, window_offsets

CONTEXT = "The harbour of Quellin opened in 1871. Its first keeper, Orla Venn, lit the lamp each night."


def nested(qas: list[dict], context: str = CONTEXT) -> dict:
    return {"version": "1.1", "data": [{"title": "Quellin", "paragraphs": [{"context": context, "qas": qas}]}]}


def qa(qid: str, question: str, text: str, start: int | None = None) -> dict:
    return {"id": qid, "question": question,
            "answers": [{"text": text, "answer_start": CONTEXT.index(text) if start is None else start}]}


def write(tmp_path: Path, payload: dict | list, name: str = "d.json") -> Path:
    path = tmp_path / name
    if name.endswith(".jsonl"):
        path.write_text("\n".join(json.dumps(r) for r in payload) + "\n")
    else:
        path.write_text(json.dumps(payload))
    return path


@pytest.fixture(scope="module")
def tokenizer():
    tok = AutoTokenizer.from_pretrained(TINY)
    assert tok.is_fast and len(tok) > 1000
    return tok


def test_nested_and_jsonl_forms_load_the_same(tmp_path: Path) -> None:
    qas = [qa("q1", "When did the harbour open?", "1871"), qa("q2", "Who kept it?", "Orla Venn")]
    a = load_file(write(tmp_path, nested(qas)))
    flat = [{"id": q["id"], "title": "Quellin", "context": CONTEXT, "question": q["question"],
             "answers": {"text": [x["text"] for x in q["answers"]],
                         "answer_start": [x["answer_start"] for x in q["answers"]]}} for q in qas]
    b = load_file(write(tmp_path, flat, "d.jsonl"))
    assert a.ids == b.ids == ["q1", "q2"]
    assert a.answer_texts == b.answer_texts == [["1871"], ["Orla Venn"]]
    assert a.contexts == b.contexts


@pytest.mark.parametrize(
    ("qas", "context", "message"),
    [
        ([qa("q7", "When?", "1871", start=5)], CONTEXT, r"question q7: answer_start 5 does not match text '1871'"),
        ([qa("q8", "   ", "1871")], CONTEXT, r"question q8: empty question"),
        ([qa("q9", "When?", "1871")], "   ", r"question q9: empty context"),
        ([{"id": "q10", "answers": [{"text": "1871", "answer_start": 32}]}], CONTEXT,
         r"question q10: missing field 'question'"),
        ([qa("q11", "When?", "1871"), qa("q11", "Who?", "Orla Venn")], CONTEXT, r"question q11: duplicate id"),
        ([qa("q12", "When?", "1871", start=9999)], CONTEXT, r"question q12: answer_start 9999 is outside"),
    ],
)
def test_bad_records_name_file_and_question(tmp_path: Path, qas: list[dict], context: str, message: str) -> None:
    path = write(tmp_path, nested(qas, context))
    with pytest.raises(DataError, match=message) as exc:
        load_file(path)
    assert str(path) in str(exc.value)


def test_broken_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"data": [')
    with pytest.raises(DataError, match="broken.json"):
        load_file(path)


def test_bundled_files_pass_validation() -> None:
    assert len(load_file(DEMO_TRAIN)) > 500
    assert len(load_file(DEMO_DEV)) > 100


def test_windows_match_the_tokenizers_own_overflow(tokenizer) -> None:
    """Cutting windows from once-tokenised contexts gives the same ids as tokenizer(q, c, stride=...)."""
    ex = load_file(DEMO_DEV).head(60)
    feats = featurize(ex, tokenizer, max_seq_length=64, doc_stride=16)
    ref = tokenizer([q.lstrip() for q in ex.questions], ex.contexts, truncation="only_second", max_length=64,
                    stride=16, return_overflowing_tokens=True)
    assert len(feats) == len(ref["input_ids"]) > len(ex)  # several windows per question
    assert feats.example_index.tolist() == list(ref["overflow_to_sample_mapping"])
    for i, ids in enumerate(ref["input_ids"]):
        lo, hi = feats.row_start[i], feats.row_start[i + 1]
        assert feats.input_ids[lo:hi].tolist() == ids
        assert feats.token_type_ids[lo:hi].tolist() == ref["token_type_ids"][i]


def test_every_in_window_label_decodes_to_the_answer(tokenizer) -> None:
    ex = load_file(DEMO_TRAIN).head(300)
    feats = featurize(ex, tokenizer, max_seq_length=64, doc_stride=16, with_offsets=True)
    offsets = window_offsets(feats, 64)
    labelled = feats.start_positions > 0
    assert labelled.sum() >= len(ex)  # every answer lies wholly inside at least one window
    for f in np.flatnonzero(labelled):
        i, s, e = feats.example_index[f], feats.start_positions[f], feats.end_positions[f]
        assert offsets[f, s, 0] >= 0 and offsets[f, e, 1] >= 0
        assert ex.contexts[i][offsets[f, s, 0]: offsets[f, e, 1]] == ex.answer_texts[i][0]
    # A window that cuts the answer off points at [CLS] instead.
    assert (feats.start_positions[~labelled] == 0).all() and (feats.end_positions[~labelled] == 0).all()


def test_consecutive_windows_share_doc_stride_tokens(tokenizer) -> None:
    ex = load_file(DEMO_DEV).head(40)
    feats = featurize(ex, tokenizer, max_seq_length=64, doc_stride=16)
    spans = feats.context_span
    for f in range(1, len(feats)):
        if feats.example_index[f] == feats.example_index[f - 1]:
            assert spans[f - 1][1] - spans[f][0] == 16


def test_offsets_kept_by_featurisation_are_the_tokenizers_own(tokenizer, tmp_path: Path, monkeypatch) -> None:
    """Evaluation reads answers through offsets cut with the windows, not from a second tokenisation:
    they must equal what the tokenizer gives for the same context tokens, and survive the cache."""
    from qa_train.features import load_or_featurize

    ex = load_file(DEMO_DEV).head(80)
    feats = featurize(ex, tokenizer, max_seq_length=64, doc_stride=16, with_offsets=True)
    offsets = window_offsets(feats, 64)
    assert featurize(ex, tokenizer, 64, 16).offsets is None  # training windows do not carry them
    for f in range(len(feats)):
        ctx = ex.contexts[feats.example_index[f]]
        want = np.asarray(tokenizer(ctx, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"])
        first, end = feats.context_span[f]
        base = feats.context_offset[f]
        np.testing.assert_array_equal(offsets[f, base: base + end - first], want[first:end])
        outside = np.ones(64, dtype=bool)
        outside[base: base + end - first] = False
        assert (offsets[f, outside] == -1).all(), f"window {f}: a non-context token has an offset"
    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path))
    first, hit = load_or_featurize(ex, tokenizer, 64, 16, with_offsets=True)
    again, hit_again = load_or_featurize(ex, tokenizer, 64, 16, with_offsets=True)
    plain, plain_hit = load_or_featurize(ex, tokenizer, 64, 16)
    assert (hit, hit_again, plain_hit) == (False, True, False)  # with and without offsets are cached apart
    np.testing.assert_array_equal(window_offsets(again, 64), offsets)
    assert plain.offsets is None
