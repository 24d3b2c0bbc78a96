"""Dynamic padding changes the work, never the answers; length grouping is a seeded permutation."""

from __future__ import annotations

import numpy as np
import torch
from conftest import DEMO_DEV, TINY
from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoTokenizer

from qa_train.config.settings import DataArgs
from qa_train.data.batching import Collator, LengthGroupedSampler, WindowDataset
from qa_train.data.features import featurize
from qa_train.data.load import load_file
from qa_train.data.loaders import collator
from qa_train.model.modeling import window_losses


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


def test_pad_to_multiple_of_reaches_the_training_and_evaluation_collator() -> None:
    """Fewer distinct widths (fewer CUDA graphs, fewer attention plans) at the cost of more padding."""
    tok, feats = _features()
    ds = WindowDataset(feats, with_labels=True)
    items = [ds[i] for i in range(6)]
    longest = int(feats.lengths[:6].max())
    data = DataArgs(pad_to_multiple_of=48)
    batch = collator(tok, data)(items)
    assert batch["input_ids"].shape[1] == -(-longest // 48) * 48 != -(-longest // 8) * 8
    assert collator(tok, DataArgs())(items)["input_ids"].shape[1] == -(-longest // 8) * 8
    assert batch["attention_mask"].sum().item() == int(feats.lengths[:6].sum())  # the padding stays masked


def test_widths_counts_every_width_a_collator_can_pad_to() -> None:
    """What compile_model is told to expect as CUDA graphs: each width some window length leads to."""
    for multiple, fixed in [(8, False), (48, False), (100, False), (8, True)]:
        collate = Collator(0, 384, pad_to_max_length=fixed, multiple=multiple)
        assert collate.widths() == len({collate.width(longest) for longest in range(1, 385)}), (multiple, fixed)


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


def test_a_windows_loss_and_gradient_do_not_depend_on_its_padding() -> None:
    """The softmax of the loss ran over pad columns too, so a window's loss and its gradient changed with the width
    of its micro-batch: with dynamic padding, with how a global batch was split over ranks and accumulation."""
    tok, feats = _features()
    torch.manual_seed(0)
    model = AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(TINY), attn_implementation="sdpa")
    model.eval()  # no dropout: the same windows must give the same numbers
    ds = WindowDataset(feats, with_labels=True)
    items = [ds[i] for i in range(8)]
    keys = ("input_ids", "token_type_ids", "attention_mask")

    def loss_and_grad(padded: dict) -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad()
        out = model(**{k: padded[k] for k in keys})
        losses = window_losses(out, padded["start_positions"], padded["end_positions"], padded["attention_mask"])
        losses.sum().backward()
        return losses.detach(), model.qa_outputs.weight.grad.clone()

    short = loss_and_grad(Collator(tok.pad_token_id, 384, pad_to_max_length=False)(items))
    full = loss_and_grad(Collator(tok.pad_token_id, 384, pad_to_max_length=True)(items))
    assert torch.allclose(short[0], full[0], atol=1e-5) and torch.allclose(short[1], full[1], atol=1e-5)


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


class _Ids:
    """Window ids as a dataset indexes them: past its end, a pad window (a copy, marked) as WindowDataset has it."""

    def __init__(self, windows: int) -> None:
        self.windows = windows

    def __len__(self) -> int:
        return self.windows

    def __getitem__(self, i: int) -> int:
        return i if i < self.windows else -1 - (i % self.windows)  # a pad: negative, its copy's id recoverable


def _global_steps(processes: int, windows: int, global_batch: int, per_device: int, epoch: int = 0, skip: int = 0):
    """The window ids each optimizer step trains (pads negative) when `processes` ranks share the global batch
    (accumulation making up the rest), read through accelerate's own sharding of the training loader, from step
    `skip` on."""
    from accelerate.data_loader import prepare_data_loader, skip_first_batches
    from torch.utils.data import DataLoader

    from qa_train.data.batching import SeededPermutation, WholeGlobalBatches

    accumulation = global_batch // (per_device * processes)
    ranks = []
    for rank in range(processes):
        sampler = WholeGlobalBatches(SeededPermutation(windows, seed=7), global_batch)
        loader = DataLoader(_Ids(windows), batch_size=per_device, sampler=sampler)
        shard = prepare_data_loader(loader, num_processes=processes, process_index=rank, put_on_device=False)
        shard = skip_first_batches(shard, skip * accumulation) if skip else shard
        shard.set_epoch(epoch)
        batches = [b.tolist() for b in shard]
        ranks.append([sum(batches[i : i + accumulation], []) for i in range(0, len(batches), accumulation)])
    assert len({len(r) for r in ranks}) == 1, "every rank takes as many steps"
    return [sorted(sum((r[k] for r in ranks), [])) for k in range(len(ranks[0]))]


def test_each_optimizer_step_trains_the_same_windows_on_1_2_and_4_processes() -> None:
    """The global order is the seed's and the global batch's alone: a checkpoint continues on another number of
    processes (accumulation keeping the global batch) with the same windows at every step, the epoch's last too."""
    from qa_train.data.batching import windows_in_step

    one, two, four = (_global_steps(n, windows=50, global_batch=8, per_device=2) for n in (1, 2, 4))
    assert one == two == four
    print("window ids per global step (1, 2 and 4 processes; pads negative):", one)
    assert len(one) == 7 and all(len(step) == 8 for step in one), "ceil(50 / 8) whole steps"
    real = [[w for w in step if w >= 0] for step in one]
    assert sorted(sum(real, [])) == list(range(50)), "every window once in the epoch"
    assert [len(r) for r in real] == [windows_in_step(k, 50, 8) for k in range(7)] == [8] * 6 + [2]
    # Another epoch, another order; and resuming after step 3 on another world size continues at step 4.
    assert _global_steps(2, 50, 8, 2, epoch=1) != one
    assert _global_steps(4, 50, 8, 2, skip=3) == _global_steps(1, 50, 8, 2)[3:]
    # Another split of the same global batch (per-device 4 x accumulation 2 on one process) trains the same windows.
    assert _global_steps(1, 50, 8, 4) == one


def test_a_pad_window_is_a_marked_copy() -> None:
    from qa_train.data.batching import WindowDataset

    tok, feats = _features()
    data = WindowDataset(feats, with_labels=True)
    pad, window = data[len(data) + 3], data[3]
    assert (pad["real"], window["real"]) == (False, True) and pad["feature_index"] == 3
    assert (pad["input_ids"] == window["input_ids"]).all()
    batch = Collator(tok.pad_token_id, 384, False)([window, pad])
    assert batch["real"].tolist() == [1.0, 0.0]
    # Trained with no weight, so no sample or token of the throughput: it was counted as one.
    assert batch["num_windows"] == 1 and batch["num_tokens"] == (
        len(window["input_ids"]),
        2 * batch["input_ids"].shape[1],
    )


def test_the_shuffle_is_the_one_earlier_checkpoints_were_written_with() -> None:
    """accelerate's seedable sampler gave the training order before: a mid-epoch checkpoint written then skips
    the windows it really trained."""
    from accelerate.data_loader import SeedableRandomSampler

    from qa_train.data.batching import SeededPermutation

    ours = SeededPermutation(97, seed=42)
    theirs = SeedableRandomSampler(data_source=range(97), data_seed=42)
    for epoch in (0, 3):
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        assert list(ours) == list(theirs)
