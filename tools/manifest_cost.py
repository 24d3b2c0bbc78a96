"""What the checkpoint manifest's CRC32s cost a save: a BERT-base-sized DDP checkpoint (fp32 weights and AdamW's two
moments, 1.32 GB) written with torch.save, then its manifest written as qa_train.strategy.saving does, and timed.

    python tools/manifest_cost.py [--params 110000000] [--dir /tmp/manifest-cost] [--repeats 3]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch

from qa_train.strategy.saving import MANIFEST, _write_manifest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=int, default=110_000_000)
    p.add_argument("--dir", type=Path, default=Path("/tmp/manifest-cost"))
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    try:
        start = time.perf_counter()
        torch.save({"weights": torch.randn(args.params)}, args.dir / "model.bin")
        torch.save(
            {"exp_avg": torch.randn(args.params), "exp_avg_sq": torch.randn(args.params)}, args.dir / "optimizer.bin"
        )
        written = time.perf_counter() - start
        size = sum(f.stat().st_size for f in args.dir.iterdir()) / 1e9
        print(f"checkpoint: {size:.2f} GB written by torch.save in {written:.2f} s")
        for _ in range(args.repeats):
            start = time.perf_counter()
            _write_manifest(args.dir)
            print(f"manifest with CRC32s: {time.perf_counter() - start:.2f} s")
            (args.dir / MANIFEST).unlink()
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
