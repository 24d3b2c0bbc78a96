"""Windows -> padded batches: dynamic padding, length grouping, token counts for throughput, and an epoch's order
that is the same on every number of processes."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from qa_train.data.features import Features


class WindowDataset(Dataset):
    """Index -> one window as numpy slices; padding happens per batch in `Collator`."""

    def __init__(self, features: Features, with_labels: bool) -> None:
        self.f = features
        self.with_labels = with_labels

    def __len__(self) -> int:
        return len(self.f)

    def __getitem__(self, i: int) -> dict:
        # Past the end: a window that only pads an epoch's last global batch (WholeGlobalBatches), trained with no
        # weight; its copy of window i - len keeps the batch's shapes.
        real = i < len(self)
        i = i % len(self)
        lo, hi = self.f.row_start[i], self.f.row_start[i + 1]
        item = {
            "input_ids": self.f.input_ids[lo:hi],
            "token_type_ids": self.f.token_type_ids[lo:hi],
            "feature_index": i,
        }
        if self.with_labels:
            item["start_positions"] = self.f.start_positions[i]
            item["end_positions"] = self.f.end_positions[i]
            item["real"] = real
        return item


class Collator:
    """Pad to the batch's longest window rounded up to `multiple` (tensor-core friendly), or to `max_length`.

    `token_types=False` leaves token_type_ids out, for models that take none (DistilBERT, ModernBERT) or
    whose tokenizer makes none (RoBERTa, XLM-R).
    """

    def __init__(
        self, pad_token_id: int, max_length: int, pad_to_max_length: bool, multiple: int = 8, token_types: bool = True
    ) -> None:
        self.pad_token_id = pad_token_id
        self.max_length = max_length
        self.pad_to_max_length = pad_to_max_length
        self.multiple = multiple
        self.token_types = token_types

    def width(self, longest: int) -> int:
        if self.pad_to_max_length:
            return self.max_length
        return min(self.max_length, -(-longest // self.multiple) * self.multiple)

    def widths(self) -> int:
        """How many different widths `width` can give: shapes the model meets (each a CUDA graph under
        reduce-overhead)."""
        return 1 if self.pad_to_max_length else -(-self.max_length // self.multiple)

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor | tuple[int, int] | int]:
        lengths = np.fromiter((len(x["input_ids"]) for x in items), dtype=np.int64, count=len(items))
        width = self.width(int(lengths.max()))
        ids = np.full((len(items), width), self.pad_token_id, dtype=np.int64)
        types = np.zeros((len(items), width), dtype=np.int64)
        for row, x in enumerate(items):
            ids[row, : lengths[row]] = x["input_ids"]
            types[row, : lengths[row]] = x["token_type_ids"]
        mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
        # The windows that only pad an epoch's last step (weight 0) are work done, not samples trained.
        real = np.fromiter((x.get("real", True) for x in items), dtype=bool, count=len(items))
        batch: dict[str, torch.Tensor | tuple[int, int] | int] = {
            "input_ids": torch.from_numpy(ids),
            "attention_mask": torch.from_numpy(mask),
            "feature_index": torch.tensor([x["feature_index"] for x in items], dtype=torch.long),
            # Python ints, not a tensor: the prepared loader moves every tensor to the device, and reading
            # one back there would wait for the whole queued step, every micro-batch.
            "num_tokens": (int(lengths[real].sum()), len(items) * width),  # (real windows' tokens, all padded)
            "num_windows": int(real.sum()),
        }
        if self.token_types:
            batch["token_type_ids"] = torch.from_numpy(types)
        if "start_positions" in items[0]:
            batch["start_positions"] = torch.tensor([int(x["start_positions"]) for x in items], dtype=torch.long)
            batch["end_positions"] = torch.tensor([int(x["end_positions"]) for x in items], dtype=torch.long)
        if "real" in items[0]:
            batch["real"] = torch.tensor([x["real"] for x in items], dtype=torch.float32)
        return batch


class LengthGroupedSampler(Sampler[int]):
    """Shuffled order in which each run of `group` windows is sorted by length, so batches pad little.

    Deterministic in (seed, epoch) so a resumed run sees the same order; `set_epoch` is called
    through accelerate's prepared dataloader.
    """

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int, groups_per_mega: int = 50) -> None:
        self.lengths = lengths
        self.group = batch_size * groups_per_mega
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng((self.seed, self.epoch))
        order = rng.permutation(len(self.lengths))
        chunks = [order[i : i + self.group] for i in range(0, len(order), self.group)]
        sorted_chunks = [c[np.argsort(-self.lengths[c], kind="stable")] for c in chunks]
        return iter(np.concatenate(sorted_chunks).tolist())


class SeededPermutation(Sampler[int]):
    """A shuffle deterministic in (seed, epoch): torch.randperm seeded with seed + epoch, the order accelerate's
    SeedableRandomSampler gave before, so a checkpoint written then resumes on the order it started."""

    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.n, generator=generator).tolist())


class WholeGlobalBatches(Sampler[int]):
    """An epoch's order made whole global batches: its last, short one is filled with pad windows, numbered past the
    dataset's end (WindowDataset gives them weight 0), so every window is trained once an epoch.

    accelerate hands rank r micro-batches r, r + N, ... of this order, so optimizer step k trains windows
    [k G, (k + 1) G) of the epoch's shuffle whatever the number of processes N and the per-device x accumulation
    split of G. accelerate's own filling of an epoch's end (to whole batches of per-device x N, with real windows
    trained twice) would depend on N: here every step is whole, and accelerate adds nothing.
    """

    def __init__(self, order: LengthGroupedSampler | SeededPermutation, global_batch: int) -> None:
        self.order = order
        self.global_batch = global_batch

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.order, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)

    def __len__(self) -> int:
        return math.ceil(len(self.order) / self.global_batch) * self.global_batch

    def __iter__(self) -> Iterator[int]:
        order = list(self.order)
        windows = len(order)
        pad = [windows + order[i % windows] for i in range(len(self) - windows)] if windows else []
        return iter(order + pad)


def windows_in_step(step_in_epoch: int, windows: int, global_batch: int) -> int:
    """The real windows of an epoch's optimizer step: the global batch, or what is left of the epoch."""
    return max(0, min(global_batch, windows - step_in_epoch * global_batch))
