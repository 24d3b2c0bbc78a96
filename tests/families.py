"""Tiny models of the encoder families users bring, with tokenizers trained offline on our own demo text.

Each tokenizer is made the way its family's real one works: WordPiece for BERT, DistilBERT and ELECTRA,
byte-level BPE for RoBERTa and ModernBERT, SentencePiece-style Unigram for XLM-R and DeBERTa-v3. The
vocabulary is trained with the `tokenizers` library and handed to the family's own transformers class,
which builds its normalizer, pre-tokenizer and special-token template (ModernBERT has no class of its
own: its hub tokenizer is a PreTrainedTokenizerFast around a byte-level BPE, built the same way here).
Configs are 2 layers of width 32, so a family trains a few steps in about a second on a CPU.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from conftest import DEMO_TRAIN

FAMILIES = ("bert", "roberta", "distilbert", "electra", "xlm-roberta", "deberta-v2", "modernbert")
VOCAB_SIZE = 800
MAX_POSITIONS = 256
# DeBERTa-v3's own settings (microsoft/deberta-v3-*): relative attention, no absolute positions, no segments.
DEBERTA_V3 = {
    "relative_attention": True,
    "pos_att_type": ["p2c", "c2p"],
    "position_biased_input": False,
    "max_relative_positions": -1,
    "position_buckets": 256,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "type_vocab_size": 0,
}


def corpus(limit: int = 1200) -> list[str]:
    """Contexts and questions of the bundled demo training set: our own text, no download."""
    texts: list[str] = []
    for article in json.loads(DEMO_TRAIN.read_text(encoding="utf-8"))["data"]:
        for para in article["paragraphs"]:
            texts.append(para["context"])
            texts.extend(qa["question"] for qa in para["qas"])
    return texts[:limit]


def _wordpiece(texts: list[str], cls: type):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(
        texts, trainers.WordPieceTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials, show_progress=False)
    )
    return cls(vocab=tok.get_vocab(), do_lower_case=True, model_max_length=MAX_POSITIONS)


def _byte_bpe(texts: list[str], specials: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return tok


def _unigram(texts: list[str], specials: list[str]) -> list[tuple[str, float]]:
    """A SentencePiece-style Unigram vocabulary, specials first at score 0, as sentencepiece writes them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.train_from_iterator(
        texts,
        trainers.UnigramTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=specials,
            unk_token=specials[specials.index("<unk>") if "<unk>" in specials else 3],
            show_progress=False,
        ),
    )
    return [tuple(piece) for piece in json.loads(tok.to_str())["model"]["vocab"]]


def _roberta(texts: list[str]):
    from transformers import RobertaTokenizerFast

    tok = _byte_bpe(texts, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    return RobertaTokenizerFast(vocab=model["vocab"], merges=merges, model_max_length=MAX_POSITIONS)


def _xlm_roberta(texts: list[str]):
    from transformers import XLMRobertaTokenizerFast

    return XLMRobertaTokenizerFast(
        vocab=_unigram(texts, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]), model_max_length=MAX_POSITIONS
    )


def _deberta_v3(texts: list[str]):
    from transformers import DebertaV2TokenizerFast

    vocab = _unigram(texts, ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"])
    return DebertaV2TokenizerFast(vocab=vocab, unk_id=3, model_max_length=MAX_POSITIONS)


def _modernbert(texts: list[str]):
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = _byte_bpe(texts, specials)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=True),
            processors.TemplateProcessing(
                single="[CLS] $A [SEP]",
                pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
            ),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=MAX_POSITIONS,
        model_input_names=["input_ids", "attention_mask"],
    )


def _bert_like(cls_name: str) -> Callable[[list[str]], object]:
    def build(texts: list[str]):
        import transformers

        return _wordpiece(texts, getattr(transformers, cls_name))

    return build


TOKENIZERS: dict[str, Callable[[list[str]], object]] = {
    "bert": _bert_like("BertTokenizerFast"),
    "distilbert": _bert_like("DistilBertTokenizerFast"),
    "electra": _bert_like("ElectraTokenizerFast"),
    "roberta": _roberta,
    "xlm-roberta": _xlm_roberta,
    "deberta-v2": _deberta_v3,
    "modernbert": _modernbert,
}


def tiny_config(family: str, tokenizer):
    """2 layers, width 32: the family's own config class, sized to the tokenizer."""
    from transformers import AutoConfig

    ids = {"pad_token_id": tokenizer.pad_token_id}
    size = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": MAX_POSITIONS,
        "initializer_range": 0.1,
    }
    if family == "distilbert":
        size = {
            "dim": 32,
            "n_layers": 2,
            "n_heads": 2,
            "hidden_dim": 64,
            "max_position_embeddings": MAX_POSITIONS,
            "initializer_range": 0.1,
        }
    elif family in ("roberta", "xlm-roberta"):  # positions start after the padding index
        size["max_position_embeddings"] = MAX_POSITIONS + tokenizer.pad_token_id + 1
        size["type_vocab_size"] = 1
    elif family == "electra":
        size["embedding_size"] = 16  # ELECTRA projects smaller embeddings up to the hidden size
    elif family == "deberta-v2":
        size.update(DEBERTA_V3)
    elif family == "modernbert":
        size.update(
            global_attn_every_n_layers=2,
            local_attention=64,
            cls_token_id=tokenizer.cls_token_id,
            sep_token_id=tokenizer.sep_token_id,
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
        )
    return AutoConfig.for_model(family, vocab_size=len(tokenizer), **ids, **size)


def write_family(family: str, out: Path, texts: list[str]) -> Path:
    """A `--config_name`/`--tokenizer_name` folder for `family`: config.json plus the saved tokenizer."""
    tokenizer = TOKENIZERS[family](texts)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    tiny_config(family, tokenizer).save_pretrained(out)
    return out


def write_families(root: Path) -> dict[str, Path]:
    """Every family's tiny model under `root`, by family name."""
    texts = corpus()
    return {family: write_family(family, root / family, texts) for family in FAMILIES}
