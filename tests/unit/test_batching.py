"""Dynamic padding changes the work, never the answers; length grouping is a seeded permutation."""

from __future__ import annotations

import numpy as np
import torch
from conftest import DEMO_DEV, TINY
from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoTokenizer

from qa_train.data.batching import Collator, LengthGroupedSampler, WindowDataset
from qa_train.data.features import featurize
from qa_train.data.load import load_file


def _features(max_len: int = 384):
    tok = AutoTokenizer.from_pretrained(TINY)
    return tok, featurize(load_file(DEMO_DEV).head(24), tok, max_seq_length=max_len, doc_stride=128)


def test_batch_is_padded_to_longest_rounded_to_eight() -> None:
    tok, feats = _features()
    ds = WindowDataset(feats, with_labels=True)
    batch = Collator(tok.pad_token_id, 384, pad_to_max_length=False)([ds[i] for i in range(6)])
    longest = int(feats.lengths[:6].max())
    assert batch["input_ids"].shape[1] == -(-longest // 8) * 8 < 384
    assert batch["attention_mask"].sum().item() == int(feats.lengths[:6].sum()) == batch["num_tokens"][0]
    assert batch["num_tokens"][1] == 6 * batch["input_ids"].shape[1]
    full = Collator(tok.pad_token_id, 384, pad_to_max_length=True)([ds[i] for i in range(6)])
    assert full["input_ids"].shape[1] == 384


def test_token_counts_stay_on_the_host_when_the_batch_moves() -> None:
    """The loop reads the counts every micro-batch: had the prepared loader moved them to the GPU with the
    tensors, each read would wait for the queued step. accelerate's own device move is applied here."""
    from accelerate.utils import send_to_device

    tok, feats = _features()
    ds = WindowDataset(feats, with_labels=True)
    batch = Collator(tok.pad_token_id, 384, pad_to_max_length=False)([ds[i] for i in range(6)])
    moved = send_to_device(batch, torch.device("meta"), non_blocking=True)
    assert moved["input_ids"].device.type == "meta"
    assert moved["num_tokens"] == (int(feats.lengths[:6].sum()), 6 * batch["input_ids"].shape[1])
    assert all(type(n) is int for n in moved["num_tokens"])


def test_dynamic_padding_keeps_logits() -> None:
    """The same window padded to 384 and to its batch's length gives the same logits (fp32, eval mode)."""
    tok, feats = _features()
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(TINY)
    model = AutoModelForQuestionAnswering.from_config(config, attn_implementation="sdpa").eval()
    ds = WindowDataset(feats, with_labels=False)
    items = [ds[i] for i in range(8)]
    keys = ("input_ids", "token_type_ids", "attention_mask")
    short = Collator(tok.pad_token_id, 384, pad_to_max_length=False)(items)
    full = Collator(tok.pad_token_id, 384, pad_to_max_length=True)(items)
    assert short["input_ids"].shape[1] < 384
    with torch.no_grad():
        a = model(**{k: short[k] for k in keys})
        b = model(**{k: full[k] for k in keys})
    for row in range(len(items)):
        n = int(feats.lengths[row])
        assert torch.allclose(a.start_logits[row, :n], b.start_logits[row, :n], atol=1e-4)
        assert torch.allclose(a.end_logits[row, :n], b.end_logits[row, :n], atol=1e-4)


def test_length_grouped_sampler_is_a_seeded_permutation() -> None:
    lengths = np.random.default_rng(0).integers(20, 384, size=1000)
    sampler = LengthGroupedSampler(lengths, batch_size=8, seed=3)
    first = list(sampler)
    assert sorted(first) == list(range(1000))
    assert list(LengthGroupedSampler(lengths, batch_size=8, seed=3)) == first
    sampler.set_epoch(1)
    assert list(sampler) != first
    # Within a batch lengths are close: far less padding than a plain shuffle.
    grouped = np.asarray(first).reshape(-1, 8)
    shuffled = np.random.default_rng(1).permutation(1000).reshape(-1, 8)
    waste = lambda b: (lengths[b].max(axis=1, keepdims=True) - lengths[b]).sum()  # noqa: E731
    assert waste(grouped) < waste(shuffled) / 5
