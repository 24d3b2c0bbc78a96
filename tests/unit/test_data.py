"""Loading and validation of SQuAD files; windows and labels against the tokenizer itself."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import DEMO_DEV, DEMO_TRAIN, TINY, tiny_flags
from transformers import AutoTokenizer

from qa_train.config.settings import ConfigError
from qa_train.data.features import MAX_QUERY_LENGTH, featurize, window_offsets
from qa_train.data.load import DataError, build_examples, load_file

CONTEXT = "The harbour of Quellin opened in 1871. Its first keeper, Orla Venn, lit the lamp each night."


def nested(qas: list[dict], context: str = CONTEXT) -> dict:
    return {"version": "1.1", "data": [{"title": "Quellin", "paragraphs": [{"context": context, "qas": qas}]}]}


def qa(qid: str, question: str, text: str, start: int | None = None) -> dict:
    return {
        "id": qid,
        "question": question,
        "answers": [{"text": text, "answer_start": CONTEXT.index(text) if start is None else start}],
    }


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
    flat = [
        {
            "id": q["id"],
            "title": "Quellin",
            "context": CONTEXT,
            "question": q["question"],
            "answers": {
                "text": [x["text"] for x in q["answers"]],
                "answer_start": [x["answer_start"] for x in q["answers"]],
            },
        }
        for q in qas
    ]
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
        (
            [{"id": "q10", "answers": [{"text": "1871", "answer_start": 32}]}],
            CONTEXT,
            r"question q10: missing field 'question'",
        ),
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
    ref = tokenizer(
        [q.lstrip() for q in ex.questions],
        ex.contexts,
        truncation="only_second",
        max_length=64,
        stride=16,
        return_overflowing_tokens=True,
    )
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
        assert ex.contexts[i][offsets[f, s, 0] : offsets[f, e, 1]] == ex.answer_texts[i][0]
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
    from qa_train.data.features import load_or_featurize

    ex = load_file(DEMO_DEV).head(80)
    feats = featurize(ex, tokenizer, max_seq_length=64, doc_stride=16, with_offsets=True)
    offsets = window_offsets(feats, 64)
    assert featurize(ex, tokenizer, 64, 16).offsets is None  # training windows do not carry them
    for f in range(len(feats)):
        ctx = ex.contexts[feats.example_index[f]]
        want = np.asarray(tokenizer(ctx, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"])
        first, end = feats.context_span[f]
        base = feats.context_offset[f]
        np.testing.assert_array_equal(offsets[f, base : base + end - first], want[first:end])
        outside = np.ones(64, dtype=bool)
        outside[base : base + end - first] = False
        assert (offsets[f, outside] == -1).all(), f"window {f}: a non-context token has an offset"
    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path))
    first, hit = load_or_featurize(ex, tokenizer, 64, 16, with_offsets=True)
    again, hit_again = load_or_featurize(ex, tokenizer, 64, 16, with_offsets=True)
    plain, plain_hit = load_or_featurize(ex, tokenizer, 64, 16)
    assert (hit, hit_again, plain_hit) == (False, True, False)  # with and without offsets are cached apart
    np.testing.assert_array_equal(window_offsets(again, 64), offsets)
    assert plain.offsets is None


def one_question(context: str, question: str, text: str | None, start: int | None = None, qid: str = "q1"):
    record = {
        "id": qid,
        "title": "",
        "context": context,
        "question": question,
        "answers": {
            "text": [] if text is None else [text],
            "answer_start": [] if text is None else [context.index(text) if start is None else start],
        },
    }
    return build_examples([("record 0", record)], "mem.json", "may_be_empty")


def labelled_text(examples, features, width: int) -> list[str]:
    """The context text each window's start/end labels cover ("" for windows labelled at CLS)."""
    offsets = window_offsets(features, width)
    out = []
    for f, (s, e) in enumerate(zip(features.start_positions, features.end_positions)):
        context = examples.contexts[features.example_index[f]]
        out.append("" if s == features.cls_index[f] else context[offsets[f, s, 0] : offsets[f, e, 1]])
    return out


@pytest.mark.parametrize(
    ("context", "text"),
    [
        ("It opened in 1871 AD.", " 1871"),
        ("It opened in 1871 AD.", "1871 "),
        ("It opened in\u00a01871\u00a0AD.", "\u00a01871\u00a0"),
        ("It opened in\u200b1871 AD.", "\u200b1871"),
        ("It opened in 1871\u200bAD.", "1871\u200b"),
    ],
    ids=["leading space", "trailing space", "NBSP both ends", "leading ZWSP", "trailing ZWSP"],
)
def test_an_answer_with_blank_ends_labels_only_its_words(tokenizer, context: str, text: str) -> None:
    """Labels are the tokens the answer overlaps: with "the token holding each end", an answer that began
    with a space started at the word before ("in 1871"), one that ended with a space took the next ("1871 A")."""
    ex = one_question(context, "When did it open?", text)
    feats = featurize(ex, tokenizer, max_seq_length=64, doc_stride=16, with_offsets=True)
    assert labelled_text(ex, feats, 64) == ["1871"]


def test_a_question_longer_than_the_window_allows_is_cut_not_refused(tokenizer, caplog) -> None:
    """It used to be refused at featurisation ("leaves -3 context tokens per window"), after the run had
    started (and, with --overwrite_output_dir, after the old run was deleted); now it is cut, as BERT cuts
    questions beyond max_query_length, to what leaves the context more than --doc_stride tokens."""
    context = CONTEXT
    ex = one_question(context, "When " * 200 + "did it open?", "1871")
    with caplog.at_level(logging.INFO, logger="qa_train"):
        feats = featurize(ex, tokenizer, max_seq_length=64, doc_stride=16, with_offsets=True)
    room = 64 - 3 - 16 - 1  # [CLS] q [SEP] c [SEP]; the context keeps doc_stride + 1 tokens
    assert (feats.context_offset == 2 + room).all() and (feats.lengths <= 64).all()
    assert "1871" in labelled_text(ex, feats, 64)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning == (
        "mem.json: 1 question(s) cut to their first 44 tokens: --max_seq_length 64 less "
        "--doc_stride 16 leaves no more room"
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="qa_train"):  # BERT's own limit: no warning, just a note
        wide = featurize(ex, tokenizer, max_seq_length=384, doc_stride=128)
    assert (wide.context_offset == 2 + MAX_QUERY_LENGTH).all()
    assert [r.levelno for r in caplog.records] == [logging.INFO]


def test_flags_that_leave_no_room_for_a_question_are_a_flag_error(tokenizer) -> None:
    """Not a DataError naming whichever question came first."""
    ex = one_question(CONTEXT, "When?", "1871")
    with pytest.raises(
        ConfigError, match=r"^--doc_stride 60: with --max_seq_length 64 .* use --doc_stride at most 59$"
    ):
        featurize(ex, tokenizer, max_seq_length=64, doc_stride=60)
    assert len(featurize(ex, tokenizer, max_seq_length=64, doc_stride=59)) == 1  # one question token fits


@pytest.mark.parametrize(
    ("context", "question", "text", "match"),
    [
        (
            CONTEXT,
            "\ufffd\ufffd",
            "1871",
            r"^mem\.json: question q1: the question tokenises to nothing: "
            r"--tokenizer_name '.*tiny-bert' drops every character of it",
        ),
        ("\ufffd \ufffd", "When?", None, r"^mem\.json: question q1: the context tokenises to nothing"),
        (
            "Opened in \ufffd 1871.",
            "What?",
            "\ufffd",
            r"^mem\.json: question q1: answer '\ufffd' at character 10 "
            r"covers no token",
        ),
    ],
    ids=["question", "context", "answer"],
)
def test_text_the_tokenizer_drops_entirely_is_refused(
    tokenizer, context: str, question: str, text: str | None, match: str
) -> None:
    """BERT's normaliser deletes U+FFFD: such a question trained as a window without a question, and such an
    answer was labelled on whatever token came next."""
    with pytest.raises(DataError, match=match):
        featurize(one_question(context, question, text), tokenizer, max_seq_length=64, doc_stride=16)


def test_long_contexts_raise_no_indexing_errors_warning(caplog) -> None:
    """Contexts longer than the model's positions are what windows are for; transformers' warning that they
    "will result in indexing errors" was a false alarm in every run's log."""
    fresh = AutoTokenizer.from_pretrained(TINY)  # transformers warns once per tokenizer
    ex = one_question("word " * 700 + "1871.", "When?", "1871")
    library = logging.getLogger("transformers")  # it does not propagate to the root logger caplog listens on
    level = library.level
    library.addHandler(caplog.handler)
    library.setLevel(logging.WARNING)  # as a run's main process sets it
    try:
        featurize(ex, fresh, max_seq_length=64, doc_stride=16)
    finally:
        library.removeHandler(caplog.handler)
        library.setLevel(level)
    assert not [r for r in caplog.records if "indexing errors" in r.getMessage()]


def test_evaluation_questions_that_also_train_are_warned_about_once(tmp_path: Path, monkeypatch, caplog) -> None:
    """--validation_file equal to --train_file trained and scored silently; now the main process warns, in one
    line naming both, before featurising. A partial overlap names a few of the shared ids."""
    from qa_train.config.flags import parse_args
    from qa_train.data.loaders import featurize_splits
    from qa_train.data.splits import load_splits, shared_questions

    args = parse_args(
        tiny_flags(
            tmp_path / "out",
            "--validation_file",
            str(DEMO_TRAIN),
            "--max_train_samples",
            "40",
            "--max_eval_samples",
            "30",
        )
    )
    splits = load_splits(args)
    assert splits.warnings == [
        f"{DEMO_TRAIN}: all 30 evaluation questions are training questions too (their ids "
        f"are in {DEMO_TRAIN}); EM/F1 will measure recall of the training data, not answering "
        "unseen questions"
    ]
    full = load_file(DEMO_TRAIN)
    [same] = shared_questions(full, full)
    assert "; the files are identical" in same
    [partial] = shared_questions(full.head(3), full.head(5))
    assert partial.startswith(
        f"{DEMO_TRAIN}: 3 of 5 evaluation questions share an id with a training question "
        f"in {DEMO_TRAIN} (e.g. {full.ids[0]!r}, {full.ids[1]!r}, {full.ids[2]!r})"
    )
    assert shared_questions(full, load_file(DEMO_DEV)) == []
    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    for is_main in (True, False):
        accelerator = SimpleNamespace(
            is_main_process=is_main, is_local_main_process=is_main, local_main_process_first=contextlib.nullcontext
        )
        with caplog.at_level(logging.WARNING, logger="qa_train"):
            featurize_splits(accelerator, load_splits(args), args.data, tokenizer)
    assert [r.getMessage() for r in caplog.records] == splits.warnings  # from the main process only


def test_overwrite_cache_is_rewritten_by_the_first_process_alone(tmp_path: Path, monkeypatch) -> None:
    """Found by a rank-discipline hunt: with --overwrite_cache every rank featurised again and wrote the same cache
    files. Now the node's first process does, and the others read what it has just written; a cache older than
    that (the first could not replace it) is still not reused."""
    import os
    import time

    from qa_train.config.flags import parse_args
    from qa_train.data import features
    from qa_train.data.loaders import featurize_splits
    from qa_train.data.splits import load_splits

    args = parse_args(
        tiny_flags(tmp_path / "out", "--max_train_samples", "40", "--max_eval_samples", "30", "--overwrite_cache")
    )
    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    tokenizer = AutoTokenizer.from_pretrained(TINY)
    built: list[int] = []
    real = features.featurize
    monkeypatch.setattr(features, "featurize", lambda *a, **k: built.append(1) or real(*a, **k))

    def first_process() -> SimpleNamespace:
        return SimpleNamespace(
            is_main_process=True, is_local_main_process=True, local_main_process_first=contextlib.nullcontext
        )

    @contextlib.contextmanager
    def after_the_first():  # the others wait here while the node's first process featurises
        time.sleep(0.05)  # past the coarse clock some file systems stamp files with
        featurize_splits(first_process(), load_splits(args), args.data, tokenizer)
        yield

    other = SimpleNamespace(
        is_main_process=False, is_local_main_process=False, local_main_process_first=after_the_first
    )
    featurize_splits(first_process(), load_splits(args), args.data, tokenizer)  # an earlier run's cache
    assert len(built) == 2
    assert featurize_splits(other, load_splits(args), args.data, tokenizer).cache_hits == [True, True]
    assert len(built) == 4  # the first process featurised again; the other read what it wrote
    for cached in (tmp_path / "cache" / "features").iterdir():  # a cache from before this run only
        os.utime(cached, (time.time() - 3600, time.time() - 3600))
    other.local_main_process_first = contextlib.nullcontext
    assert featurize_splits(other, load_splits(args), args.data, tokenizer).cache_hits == [False, False]
    assert len(built) == 6


def test_decomposed_text_is_read_as_nfc_so_a_span_can_match_its_answer(tmp_path: Path, tokenizer) -> None:
    """'Jose' + U+0301 (NFD) could never match exactly: the uncased tokenizer drops the lone mark, so the labelled
    span ended before it while the reference kept it (issue 38, case 11). Records are read as NFC, starts moved."""
    import unicodedata

    context = "Jose\u0301 Mari\u0301a opened the harbour of Quellin in 1871, and kept it."
    texts = ["Jose\u0301", "Quellin"]
    record = {
        "id": "q1",
        "title": "t",
        "context": context,
        "question": "Who opened the harbour of Quelli\u0301n?",
        "answers": {"text": texts, "answer_start": [context.index(t) for t in texts]},
    }
    raw = load_file(write(tmp_path, [record], "nfd.jsonl"))
    nfc = unicodedata.normalize("NFC", context)
    assert raw.contexts == [nfc] and raw.answer_texts == [["Jos\u00e9", "Quellin"]]
    assert raw.answer_starts == [[0, nfc.index("Quellin")]] and raw.questions[0].endswith("Quell\u00edn?")
    assert raw.fingerprint.endswith("+nfc"), "windows cached from the decomposed text are not these"
    feats = featurize(raw, tokenizer, max_seq_length=64, doc_stride=16, with_offsets=True)
    offsets = window_offsets(feats, 64)
    [f] = np.flatnonzero(feats.start_positions > 0)
    span = nfc[offsets[f, feats.start_positions[f], 0] : offsets[f, feats.end_positions[f], 1]]
    assert span == "Jos\u00e9" == raw.answer_texts[0][0]
