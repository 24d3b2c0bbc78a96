"""Answers are a function of the weights alone: the same model gives the same answers for any evaluation
batch size and padding, on a model whose padding logits beat every real token's (the worst case for
picking candidates over the padded row). Across processes: tests/integration/test_predict_runs.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DEMO_DEV, high_padding_model

from qa_train.config.settings import DataArgs
from qa_train.data.load import Examples, load_file
from qa_train.evaluation import sample_rows
from qa_train.squad.scoring import score, score_v2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return high_padding_model(tmp_path_factory.mktemp("high-padding"))


def test_padding_logits_are_the_highest(model_dir: Path) -> None:
    """The premise: in a padded batch, every padding position outscores every real token."""
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForQuestionAnswering.from_pretrained(model_dir).eval()
    ex = load_file(DEMO_DEV).head(8)
    enc = tokenizer(ex.questions, ex.contexts, padding="max_length", max_length=256, return_tensors="pt")
    with torch.no_grad():
        out = model(**enc)
    real = enc["attention_mask"].bool()
    for logits in (out.start_logits, out.end_logits):
        assert logits[~real].min() > logits[real].max()


def _answers(model_dir: Path, batch_size: int, pad_to_max_length: bool = False) -> dict[str, str]:
    from qa_train.predict import Predictor

    data = DataArgs(
        dataset_name=None,
        max_seq_length=192,
        doc_stride=64,
        per_device_eval_batch_size=batch_size,
        pad_to_max_length=pad_to_max_length,
    )
    return Predictor(str(model_dir), data, device="cpu").predict(load_file(DEMO_DEV).head(64)).predictions


def test_answers_do_not_depend_on_batch_size_or_padding(model_dir: Path) -> None:
    reference = _answers(model_dir, 64)
    assert len(reference) == 64
    assert sum(a == "" for a in reference.values()) == 0, "every question has a span among its context tokens"
    for batch_size, pad in ((1, False), (8, False), (64, True)):
        got = _answers(model_dir, batch_size, pad)
        differ = [qid for qid in reference if got[qid] != reference[qid]]
        assert not differ, f"batch {batch_size}, pad_to_max_length {pad}: {len(differ)} answers changed"


def _sample_questions() -> tuple[Examples, dict[str, str]]:
    """An unanswerable question answered "", one whose gold "The" normalises to nothing, and a plain span."""
    ex = Examples(source="<test>")
    context = "The bridge was designed by Berg in 1890."
    ex.append("none", "", context, "Who painted it?", [], [])
    ex.append("article", "", context, "Which bridge?", ["The", "bridge"], [0, 4])
    ex.append("span", "", context, "Who designed it?", ["Berg"], [27])
    return ex, {"none": "", "article": "the", "span": "by Berg"}


def test_sample_rows_score_each_question_as_the_runs_official_metric() -> None:
    ex, predictions = _sample_questions()
    rows = sample_rows(ex, predictions, 10, v2=True)
    assert [(r[0], r[4], r[5]) for r in rows] == [("none", 1.0, 1.0), ("article", 0.0, 0.0), ("span", 0.0, 0.6667)]
    official = score_v2(ex.references(), predictions)
    assert (official["exact"], official["f1"]) == pytest.approx(
        (100 * sum(r[4] for r in rows) / 3, 100 * sum(r[5] for r in rows) / 3), abs=0.01
    )
    answerable = Examples(source="<test>")
    for i in (1, 2):  # v1.1 keeps "The" as a gold answer
        answerable.append(ex.ids[i], "", ex.contexts[i], ex.questions[i], ex.answer_texts[i], ex.answer_starts[i])
    v1 = sample_rows(answerable, predictions, 10, v2=False)
    assert [(r[0], r[4], r[5]) for r in v1] == [("article", 1.0, 0.0), ("span", 0.0, 0.6667)]
    assert score(answerable.references(), predictions)["exact_match"] == 50.0
