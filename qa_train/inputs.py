"""What the model reads: SQuAD splits -> windows (cached) -> loaders, built once per run.

The first process on each node featurises and caches; the others then read its cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

from qa_train.batching import Collator, LengthGroupedSampler, WindowDataset
from qa_train.config import DataArgs, TrainArgs
from qa_train.data import Examples, load_split
from qa_train.features import Features, load_or_featurize


@dataclass
class Inputs:
    """Training keeps only its windows (the question and context text is not needed once they are cut,
    and is ~120 MB for SQuAD); evaluation keeps its examples and offsets for post-processing and scoring."""

    num_train_examples: int
    train_features: Features
    eval_examples: Examples | None = None
    eval_features: Features | None = None
    cache_hits: list[bool] = field(default_factory=list)

    def describe(self) -> str:
        evaluation = (f"eval: {len(self.eval_examples)} questions -> {len(self.eval_features)} windows"
                      if self.eval_examples is not None and self.eval_features is not None else "no eval split")
        return (f"train: {self.num_train_examples} questions -> {len(self.train_features)} windows; {evaluation} "
                f"(cache hits {self.cache_hits})")


def load_inputs(accelerator, args: TrainArgs, tokenizer) -> Inputs:
    d = args.data
    with accelerator.local_main_process_first():
        train = load_split(d.train_file, d.dataset_name, d.dataset_config_name, "train", d.max_train_samples)
        features, hit = load_or_featurize(train, tokenizer, d.max_seq_length, d.doc_stride,
                                          overwrite=d.overwrite_cache)
        inputs = Inputs(len(train), features, cache_hits=[hit])
        del train
        if args.eval.needs_eval_data:
            inputs.eval_examples = load_split(d.validation_file, d.dataset_name, d.dataset_config_name,
                                              "validation", d.max_eval_samples)
            inputs.eval_features, hit = load_or_featurize(inputs.eval_examples, tokenizer, d.max_seq_length,
                                                          d.doc_stride, overwrite=d.overwrite_cache,
                                                          with_offsets=True)
            inputs.cache_hits.append(hit)
    return inputs


def build_loaders(inputs: Inputs, tokenizer, data: DataArgs, seed: int,
                  on_cuda: bool) -> tuple[DataLoader, DataLoader | None]:
    """Unprepared loaders: accelerate shards them per rank in `prepare`."""
    collate = Collator(tokenizer.pad_token_id, data.max_seq_length, data.pad_to_max_length)
    workers = data.dataloader_num_workers if data.dataloader_num_workers is not None else (2 if on_cuda else 0)
    common: dict[str, Any] = {"collate_fn": collate, "num_workers": workers,
                              "pin_memory": on_cuda, "persistent_workers": workers > 0}
    train_set = WindowDataset(inputs.train_features, with_labels=True)
    sampler = (LengthGroupedSampler(inputs.train_features.lengths, data.per_device_train_batch_size, seed)
               if data.group_by_length else RandomSampler(train_set))
    # An own generator: otherwise every new iterator draws a seed from the global RNG, and a resumed
    # run (which makes one more iterator after restoring RNG state) would see different dropout.
    train = DataLoader(train_set, batch_size=data.per_device_train_batch_size, sampler=sampler,
                       generator=torch.Generator().manual_seed(seed), **common)
    evaluation = None
    if inputs.eval_features is not None:
        eval_set = WindowDataset(inputs.eval_features, with_labels=False)
        evaluation = DataLoader(eval_set, batch_size=data.per_device_eval_batch_size,
                                sampler=SequentialSampler(eval_set), **common)
    return train, evaluation
