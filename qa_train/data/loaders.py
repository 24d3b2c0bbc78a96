"""What the model reads: SQuAD splits -> windows (cached) -> loaders, built once per run."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, SequentialSampler

from qa_train.config.settings import DataArgs
from qa_train.core.preemption import shield_loader_worker
from qa_train.data.batching import Collator, LengthGroupedSampler, SeededPermutation, WholeGlobalBatches, WindowDataset
from qa_train.data.features import Features, cache_key, load_or_featurize
from qa_train.data.load import Examples
from qa_train.data.splits import Splits

log = logging.getLogger("qa_train")


@dataclass
class Inputs:
    """Training keeps only its windows (the question and context text is not needed once they are cut,
    and is ~120 MB for SQuAD); evaluation and prediction keep their examples and offsets for post-processing."""

    num_train_examples: int
    train_features: Features | None  # None when the run does not train (--do_train false)
    eval_examples: Examples | None = None
    eval_features: Features | None = None
    cache_hits: list[bool] = field(default_factory=list)
    # The training windows' identity (their cache key: the data's bytes, the tokenizer, the windowing), which a
    # checkpoint records so that a mid-epoch resume on other data is refused.
    train_fingerprint: str = ""
    test_examples: Examples | None = None
    test_features: Features | None = None

    def describe(self) -> str:
        evaluation = (
            f"eval: {len(self.eval_examples)} questions -> {len(self.eval_features)} windows"
            if self.eval_examples is not None and self.eval_features is not None
            else "no eval split"
        )
        if self.test_examples is not None and self.test_features is not None:
            evaluation += f"; predict: {len(self.test_examples)} questions -> {len(self.test_features)} windows"
        training = (
            f"train: {self.num_train_examples} questions -> {len(self.train_features)} windows"
            if self.train_features is not None
            else "no training"
        )
        return f"{training}; {evaluation} (cache hits {self.cache_hits})"


def featurize_splits(accelerator, splits: Splits, data: DataArgs, tokenizer) -> Inputs:
    """The first process on each node tokenises and caches; the others then read its cache."""
    if accelerator.is_main_process:
        for warning in splits.warnings:
            log.warning("%s", warning)
    # --overwrite_cache: only the first process on each node featurises again and replaces the cache; the others
    # read what it has just written (a file older than this moment is the cache the flag refuses, left in place
    # if the first process could not replace it), instead of each featurising and writing the same files again.
    since = 0.0 if not data.overwrite_cache else math.inf if accelerator.is_local_main_process else time.time()
    with accelerator.local_main_process_first():
        inputs = Inputs(0, None)
        if splits.train is not None:
            inputs.train_features, hit = load_or_featurize(
                splits.train, tokenizer, data.max_seq_length, data.doc_stride, fresh_since=since
            )
            inputs.train_fingerprint = cache_key(
                splits.train, tokenizer, data.max_seq_length, data.doc_stride, with_offsets=False
            )
            inputs.num_train_examples = len(splits.train)
            inputs.cache_hits.append(hit)
            splits.train = None  # the text is not needed once the windows are cut
        if splits.evaluation is not None:
            inputs.eval_examples = splits.evaluation
            inputs.eval_features, hit = load_or_featurize(
                splits.evaluation, tokenizer, data.max_seq_length, data.doc_stride, fresh_since=since, with_offsets=True
            )
            inputs.cache_hits.append(hit)
        if splits.test is not None:
            inputs.test_examples = splits.test
            inputs.test_features, hit = load_or_featurize(
                splits.test, tokenizer, data.max_seq_length, data.doc_stride, fresh_since=since, with_offsets=True
            )
            inputs.cache_hits.append(hit)
    return inputs


def _loader_options(data: DataArgs, on_cuda: bool) -> dict[str, Any]:
    workers = data.dataloader_num_workers if data.dataloader_num_workers is not None else (2 if on_cuda else 0)
    # Worker seeding stays torch's own (base seed + worker id): the init function only changes signal handling.
    return {
        "num_workers": workers,
        "pin_memory": on_cuda,
        "persistent_workers": workers > 0,
        "worker_init_fn": shield_loader_worker if workers > 0 else None,
    }


def collator(tokenizer, data: DataArgs, token_types: bool = True) -> Collator:
    return Collator(
        tokenizer.pad_token_id, data.max_seq_length, data.pad_to_max_length, data.pad_to_multiple_of, token_types
    )


def inference_loader(features: Features, collate: Collator, data: DataArgs, on_cuda: bool) -> DataLoader:
    """Windows in order, without labels: evaluation and prediction alike (unprepared)."""
    windows = WindowDataset(features, with_labels=False)
    # An own generator, as the training loader's: without one every iterator draws its seed from the global RNG,
    # so each evaluation would shift the dropout of every later step (and a resumed run's --eval_on_start would
    # leave it on another path than the uninterrupted run).
    return DataLoader(
        windows,
        batch_size=data.per_device_eval_batch_size,
        sampler=SequentialSampler(windows),
        generator=torch.Generator(),
        collate_fn=collate,
        **_loader_options(data, on_cuda),
    )


@dataclass
class TrainOrder:
    """What decides which windows each optimizer step trains: the seed and the global batch (never the number of
    processes, so a checkpoint continues on another one exactly)."""

    seed: int
    global_batch: int


def build_loaders(
    inputs: Inputs, tokenizer, data: DataArgs, order: TrainOrder, on_cuda: bool, token_types: bool = True
) -> tuple[DataLoader | None, DataLoader | None]:
    """Unprepared loaders (None for a split the run does not read): accelerate shards them per rank in `prepare`."""
    collate = collator(tokenizer, data, token_types)
    evaluation = None
    if inputs.eval_features is not None:
        evaluation = inference_loader(inputs.eval_features, collate, data, on_cuda)
    if inputs.train_features is None:
        return None, evaluation
    train_set = WindowDataset(inputs.train_features, with_labels=True)
    shuffle = (
        LengthGroupedSampler(inputs.train_features.lengths, data.per_device_train_batch_size, order.seed)
        if data.group_by_length
        else SeededPermutation(len(train_set), order.seed)
    )
    # An own generator: otherwise every new iterator draws a seed from the global RNG, and a resumed
    # run (which makes one more iterator after restoring RNG state) would see different dropout.
    train = DataLoader(
        train_set,
        batch_size=data.per_device_train_batch_size,
        sampler=WholeGlobalBatches(shuffle, order.global_batch),
        generator=torch.Generator().manual_seed(order.seed),
        collate_fn=collate,
        **_loader_options(data, on_cuda),
    )
    return train, evaluation
