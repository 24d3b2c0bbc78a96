"""Split a SQuAD-format training file by article: the last N articles become a validation set.

    python tools/squad_split.py ../shared/data/squad-train-v1.1-reconstructed.json.xz --holdout_articles 40 \
        --out_dir data/squad-holdout

Writes OUT_DIR/train.json and OUT_DIR/dev.json in the official nested layout. The SQuAD dev set is not at
hand here, so accuracy runs hold out whole articles: no paragraph of a validation question is seen in
training. The held-out questions have one gold answer each (the official dev set has three), so EM/F1
read lower than on the official dev set.
"""

from __future__ import annotations

import argparse
import json
import lzma
from pathlib import Path
from typing import Any

from qa_train.observe.recorder import atomic_write_text


def read_squad(path: Path) -> dict[str, Any]:
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise SystemExit(f"{path}: not SQuAD JSON (expected an object with a 'data' list of articles)")
    return doc


def split(doc: dict[str, Any], holdout: int) -> tuple[dict[str, Any], dict[str, Any]]:
    articles = doc["data"]
    if not 0 < holdout < len(articles):
        raise SystemExit(
            f"--holdout_articles {holdout}: must be between 1 and {len(articles) - 1} "
            f"(the file has {len(articles)} articles)"
        )
    version = doc.get("version", "1.1")
    return ({"version": version, "data": articles[:-holdout]}, {"version": version, "data": articles[-holdout:]})


def count_questions(doc: dict[str, Any]) -> int:
    return sum(len(p["qas"]) for a in doc["data"] for p in a["paragraphs"])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path, help="SQuAD JSON (.json or .json.xz)")
    p.add_argument("--holdout_articles", type=int, default=40)
    p.add_argument("--out_dir", type=Path, required=True)
    opts = p.parse_args(argv)
    train, dev = split(read_squad(opts.source), opts.holdout_articles)
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    for name, doc in (("train", train), ("dev", dev)):
        # Whole or not at all: a rerun skips the split when both files exist (tools/gpu_session.sh).
        atomic_write_text(opts.out_dir / f"{name}.json", json.dumps(doc))
        print(f"{opts.out_dir / name}.json: {len(doc['data'])} articles, {count_questions(doc)} questions")


if __name__ == "__main__":
    main()
