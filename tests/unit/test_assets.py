"""The bundled offline demo: invented SQuAD-format data and the tiny BERT trained on it."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import ROOT

import qa_train

ASSETS = Path(qa_train.__file__).resolve().parent / "assets"
GENERATOR = ROOT / "tools" / "make_assets.py"
MODEL_DIR = ASSETS / "tiny-bert"
SPLITS = ("train", "dev")


def load(split: str, folder: str = "demo") -> dict:
    return json.loads((ASSETS / folder / f"{split}.json").read_text(encoding="utf-8"))


def examples(split: str, folder: str = "demo"):
    for article in load(split, folder)["data"]:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                yield article["title"], para["context"], qa


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.mark.parametrize("split", SPLITS)
def test_squad_v11_layout_and_answer_spans(split):
    data = load(split)
    assert data["version"] == "1.1"
    n = 0
    for _title, context, qa in examples(split):
        assert qa["question"].strip() and qa["answers"], f"{split}: {qa['id']} has no question or answers"
        for ans in qa["answers"]:
            s, text = ans["answer_start"], ans["text"]
            assert isinstance(s, int), f"{split}: {qa['id']}: answer_start {s!r} is not an int"
            assert context[s : s + len(text)] == text, f"{split}: {qa['id']}: {s} does not point at {text!r}"
        n += 1
    assert 1200 <= n <= 1800 if split == "train" else 200 <= n <= 300, f"{split}: {n} questions"


def test_dev_has_several_gold_answers_train_has_one():
    train_counts = {len(qa["answers"]) for _, _, qa in examples("train")}
    dev_counts = [len(qa["answers"]) for _, _, qa in examples("dev")]
    assert train_counts == {1}
    assert set(dev_counts) <= {1, 2, 3}
    assert 0.2 < sum(c > 1 for c in dev_counts) / len(dev_counts) < 0.8


def test_question_ids_unique_across_splits():
    ids = [qa["id"] for split in SPLITS for _, _, qa in examples(split)]
    assert len(ids) == len(set(ids))


def test_dev_articles_are_about_unseen_entities():
    train_titles = {a["title"] for a in load("train")["data"]}
    dev_titles = {a["title"] for a in load("dev")["data"]}
    assert not train_titles & dev_titles
    train_words = set(re.findall(r"\w+", " ".join(c for _, c, _ in examples("train"))))
    # The first word of every title is an invented name ("Velmar_Bridge", "Orin_Tavel").
    seen = [t for t in dev_titles if t.split("_")[0] in train_words]
    assert len(seen) <= 0.05 * len(dev_titles), f"dev entities also in train: {seen}"


def test_contexts_fit_one_window(tokenizer):
    lengths = [len(tokenizer(c)["input_ids"]) for split in SPLITS for _, c, _ in examples(split)]
    assert max(lengths) <= 230


def test_tokenizer_is_fast_with_full_vocab(tokenizer):
    from transformers import AutoConfig

    vocab_lines = (MODEL_DIR / "vocab.txt").read_text(encoding="utf-8").splitlines()
    config = AutoConfig.from_pretrained(MODEL_DIR)
    assert tokenizer.is_fast
    assert len(tokenizer) == config.vocab_size == len(vocab_lines)
    assert 3000 <= config.vocab_size <= 5000
    assert vocab_lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tokenizer.pad_token_id == 0
    # uncased, and numbers digit by digit with "##" marking where one continues
    assert tokenizer.tokenize("The Bridge Opened in 1843.") == [
        "the",
        "bridge",
        "opened",
        "in",
        "1",
        "##8",
        "##4",
        "##3",
        ".",
    ]


def test_unknown_token_rate_on_dev_is_low(tokenizer):
    ids = [i for ctx in {c for _, c, _ in examples("dev")} for i in tokenizer(ctx)["input_ids"]]
    assert ids.count(tokenizer.unk_token_id) / len(ids) < 0.01


def test_every_answer_starts_and_ends_on_a_token_boundary(tokenizer):
    """Otherwise no predicted span could ever match the gold text exactly."""
    for split in SPLITS:
        for _, context, qa in examples(split):
            offsets = tokenizer(context, return_offsets_mapping=True)["offset_mapping"]
            starts, ends = {s for s, e in offsets if e > s}, {e for s, e in offsets if e > s}
            for ans in qa["answers"]:
                s = ans["answer_start"]
                assert s in starts and s + len(ans["text"]) in ends, f"{split}: {qa['id']}: {ans}"


def test_overflowing_windows_and_model_forward(tokenizer):
    import torch
    from transformers import AutoConfig, BertForQuestionAnswering

    _, context, qa = next(examples("dev"))
    enc = tokenizer(
        qa["question"],
        context,
        truncation="only_second",
        max_length=64,
        stride=16,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length",
        return_tensors="pt",
    )
    assert enc["input_ids"].shape[0] >= 2 and enc["input_ids"].shape[1] == 64
    assert enc["token_type_ids"].max() == 1  # BERT needs segment ids for the context

    config = AutoConfig.from_pretrained(MODEL_DIR)
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("bert", 128, 2)
    assert (config.num_attention_heads, config.intermediate_size, config.max_position_embeddings) == (2, 512, 512)
    torch.manual_seed(0)
    model = BertForQuestionAnswering(config).eval()
    with torch.no_grad():
        out = model(
            input_ids=enc["input_ids"], token_type_ids=enc["token_type_ids"], attention_mask=enc["attention_mask"]
        )
    assert out.start_logits.shape == out.end_logits.shape == enc["input_ids"].shape


def load_generator(monkeypatch) -> ModuleType:
    """Import tools/make_assets.py from its file: tools/ is deliberately not a package."""
    spec = importlib.util.spec_from_file_location("make_assets", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # @dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_generator_is_not_shipped_and_targets_the_bundled_assets(monkeypatch):
    assert not sorted(ASSETS.rglob("*.py")), "a generator is back inside the package data"
    assert load_generator(monkeypatch).DEFAULT_OUT_DIR == ASSETS


def test_generator_reproduces_the_bundled_json(tmp_path, monkeypatch):
    make_assets = load_generator(monkeypatch)
    make_assets.write_assets(tmp_path, tokenizer=False)
    for split in SPLITS:
        name = f"demo/{split}.json"
        stale = f"{name} is stale: rerun python tools/make_assets.py"
        assert (tmp_path / name).read_bytes() == (ASSETS / name).read_bytes(), stale


# --- the SQuAD v2.0 demo (tools/make_v2_assets.py) ----------------------------

V2_GENERATOR = GENERATOR.with_name("make_v2_assets.py")


def load_v2(split: str) -> dict:
    return load(split, "demo-v2")


def v2_questions(split: str):
    return examples(split, "demo-v2")


@pytest.mark.parametrize("split", SPLITS)
def test_v2_layout_answerable_and_unanswerable(split):
    data = load_v2(split)
    assert data["version"] == "v2.0"
    qas = list(v2_questions(split))
    impossible = [qa for _, _, qa in qas if qa["is_impossible"]]
    assert all(not qa["answers"] for qa in impossible)
    assert all(qa["answers"] for _, _, qa in qas if not qa["is_impossible"])
    # Over a quarter unanswerable in train, nearly half in dev (SQuAD 2.0: a third, a half).
    assert 0.25 <= len(impossible) / len(qas) <= 0.55, f"{split}: {len(impossible)} of {len(qas)} unanswerable"
    assert 3000 <= len(qas) <= 4500 if split == "train" else 200 <= len(qas) <= 300
    for _, context, qa in qas:
        for ans in qa["answers"]:
            s, text = ans["answer_start"], ans["text"]
            assert context[s : s + len(text)] == text, f"{split}: {qa['id']}: {s} does not point at {text!r}"


def test_v2_unanswerable_questions_ask_about_the_paragraphs_own_entity():
    """Not trivially unanswerable: the question names the paragraph's entity (the title's first word), only the
    fact is missing. The v2 files load with qa_train's own validation under --version_2_with_negative, and are
    refused without it."""
    from qa_train.data.load import DataError, load_file

    for split in SPLITS:
        for title, _, qa in v2_questions(split):
            if qa["is_impossible"]:
                assert title.split("_")[0] in qa["question"], f"{split}: {qa['question']!r} ({title})"
    path = ASSETS / "demo-v2" / "dev.json"
    assert len(load_file(path, "may_be_empty")) == len(list(v2_questions("dev")))
    with pytest.raises(DataError, match="no answers .*--version_2_with_negative"):
        load_file(path)


def test_v2_ids_unique_and_dev_entities_unseen():
    ids = [qa["id"] for split in SPLITS for _, _, qa in v2_questions(split)]
    assert len(ids) == len(set(ids))
    train_titles = {a["title"] for a in load_v2("train")["data"]}
    assert not train_titles & {a["title"] for a in load_v2("dev")["data"]}


def test_v2_text_is_covered_by_the_tiny_bert_vocab(tokenizer):
    ids = [i for ctx in {c for _, c, _ in v2_questions("dev")} for i in tokenizer(ctx)["input_ids"]]
    assert ids.count(tokenizer.unk_token_id) / len(ids) < 0.01


def test_v2_generator_reproduces_the_bundled_json(tmp_path, monkeypatch):
    load_generator(monkeypatch)  # make_v2_assets imports make_assets
    spec = importlib.util.spec_from_file_location("make_v2_assets", V2_GENERATOR)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert module.DEFAULT_OUT_DIR == ASSETS
    module.write_assets(tmp_path)
    for split in SPLITS:
        name = f"demo-v2/{split}.json"
        stale = f"{name} is stale: rerun python tools/make_v2_assets.py"
        assert (tmp_path / name).read_bytes() == (ASSETS / name).read_bytes(), stale
