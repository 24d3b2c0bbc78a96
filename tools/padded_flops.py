"""An epoch's training FLOPs counted at each batch's padded width (as MFU counts them) against every batch at
--max_seq_length (as MFU counted them before 2026-11-25): how far dynamic padding's MFU read high. The batches are
qa_train's own: its featurisation, length-grouped sampler (or, with --shuffled, a plain shuffle, qa_train's order
without --group_by_length) and collator.

    python tools/padded_flops.py squad-train-v1.1.json --tokenizer_name .device/minilm \
        --config_name qa_train/assets/bert-base-shape [--batch 64] [--max_seq_length 384] [--doc_stride 128] \
        [--max_samples N] [--shuffled] [--pad_to_multiple_of 8]
"""

from __future__ import annotations

import argparse

import numpy as np
from transformers import AutoConfig, AutoTokenizer

from qa_train.data.batching import Collator, LengthGroupedSampler
from qa_train.data.features import featurize
from qa_train.data.load import load_file
from qa_train.model.modeling import flop_coefficients
from qa_train.observe.monitor import ModelCost


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("train_file")
    p.add_argument("--tokenizer_name", required=True)
    p.add_argument("--config_name", required=True)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max_seq_length", type=int, default=384)
    p.add_argument("--doc_stride", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--max_samples", type=int, default=None, help="The first N questions, as --max_train_samples.")
    p.add_argument("--shuffled", action="store_true", help="Batches of a plain shuffle, not length-grouped.")
    p.add_argument("--pad_to_multiple_of", type=int, default=8, help="The width multiple, as qa_train's flag.")
    a = p.parse_args()

    tokenizer = AutoTokenizer.from_pretrained(a.tokenizer_name)
    cost = ModelCost(*flop_coefficients(AutoConfig.from_pretrained(a.config_name)), peak_tflops=None)
    lengths = featurize(load_file(a.train_file).head(a.max_samples), tokenizer, a.max_seq_length, a.doc_stride).lengths
    collator = Collator(
        tokenizer.pad_token_id, a.max_seq_length, pad_to_max_length=False, multiple=a.pad_to_multiple_of
    )
    order = (
        np.random.default_rng(a.seed).permutation(len(lengths))
        if a.shuffled
        else np.fromiter(iter(LengthGroupedSampler(lengths, a.batch, a.seed)), dtype=np.int64)
    )
    padded = at_width = at_max = 0.0
    widths = []
    for start in range(0, len(order), a.batch):
        batch = lengths[order[start : start + a.batch]]
        width = collator.width(int(batch.max()))
        widths.append(width)
        padded += len(batch) * width
        at_width += cost.batch_flops(len(batch) * width, width)
        at_max += cost.batch_flops(len(batch) * width, a.max_seq_length)
    print(f"windows {len(lengths)}, mean length {lengths.mean():.1f}, mean padded width {padded / len(lengths):.1f}")
    # A GPU pays once for each new shape (kernel choices; a recompile when compiled): how many a run meets.
    full = sum(w == a.max_seq_length for w in widths)
    print(
        f"batches {len(widths)}: {len(set(widths))} distinct widths, {full} ({full / len(widths):.1%}) at "
        f"{a.max_seq_length}; distinct widths in the first 50 / 100 batches: {len(set(widths[:50]))} / "
        f"{len(set(widths[:100]))}"
    )
    print(
        f"FLOPs an epoch: at each batch's width {at_width:.4e}, every batch at {a.max_seq_length} {at_max:.4e}: "
        f"{at_max / at_width:.4f}x"
    )


if __name__ == "__main__":
    main()
