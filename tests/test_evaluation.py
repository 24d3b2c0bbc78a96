"""Answers are a function of the weights alone: the same model gives the same answers for any evaluation
batch size and padding, on a model whose padding logits beat every real token's (the worst case for
picking candidates over the padded row). Across processes: tests/test_predict.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import DEMO_DEV, high_padding_model
from qa_train.config import DataArgs
from qa_train.data import load_file


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

    data = DataArgs(dataset_name=None, max_seq_length=192, doc_stride=64, per_device_eval_batch_size=batch_size,
                    pad_to_max_length=pad_to_max_length)
    return Predictor(str(model_dir), data, device="cpu").predict(load_file(DEMO_DEV).head(64)).predictions


def test_answers_do_not_depend_on_batch_size_or_padding(model_dir: Path) -> None:
    reference = _answers(model_dir, 64)
    assert len(reference) == 64
    assert sum(a == "" for a in reference.values()) == 0, "every question has a span among its context tokens"
    for batch_size, pad in ((1, False), (8, False), (64, True)):
        got = _answers(model_dir, batch_size, pad)
        differ = [qid for qid in reference if got[qid] != reference[qid]]
        assert not differ, f"batch {batch_size}, pad_to_max_length {pad}: {len(differ)} answers changed"
