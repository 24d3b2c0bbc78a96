"""Time featurisation, post-processing and start-up on SQuAD-sized inputs; prints the figures.

    python tools/bench_data.py [--train_file train-v1.1.json --validation_file dev-v1.1.json]
                                  [--tokenizer_name bert-base-uncased]

Without files it writes synthetic SQuAD-shaped data of the real size (87,599 training questions
on 18,896 paragraphs, 10,570 dev questions on 2,067) from the bundled vocabulary, with context
lengths spread so that a few percent need a second window, as in SQuAD v1.1.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from qa_train.config.settings import DEMO_MODEL_DIR, DEMO_TRAIN_FILE, DEMO_VALIDATION_FILE


def synthetic_squad(path: Path, paragraphs: int, questions: int, seed: int, tokenizer) -> None:
    """SQuAD-shaped nested JSON: ~120-word contexts at ~1.3 word pieces per word (as bert-base-uncased
    cuts real SQuAD text), a tail long enough that ~1-2% of questions need a second 384/128 window,
    ~10-word questions, 1-3-word answers, every paragraph with at least one question."""
    rng = random.Random(seed)
    words = sorted(
        {
            w
            for f in (DEMO_TRAIN_FILE, DEMO_VALIDATION_FILE)
            for a in json.loads(f.read_text())["data"]
            for p in a["paragraphs"]
            for w in p["context"].split()
        }
    )
    pieces = [len(ids) for ids in tokenizer(words, add_special_tokens=False)["input_ids"]]
    one = [w for w, n in zip(words, pieces) if n == 1]
    two = [w for w, n in zip(words, pieces) if n == 2]
    per_para = 1 + np.random.default_rng(seed).multinomial(questions - paragraphs, [1 / paragraphs] * paragraphs)
    data, qid = [], 0
    for p in range(paragraphs):
        n_words = int(min(650, max(25, rng.lognormvariate(4.7, 0.4))))
        tokens = [rng.choice(one) if rng.random() < 0.7 else rng.choice(two) for _ in range(n_words)]
        context = " ".join(tokens)
        qas = []
        for _ in range(per_para[p]):
            k = rng.randrange(len(tokens) - 3)
            answer = " ".join(tokens[k : k + rng.randint(1, 3)])
            start = len(" ".join(tokens[:k])) + (1 if k else 0)
            question = " ".join(rng.choice(one) for _ in range(rng.randint(6, 14))) + "?"
            qas.append({"id": f"q{qid}", "question": question, "answers": [{"text": answer, "answer_start": start}]})
            qid += 1
        data.append({"title": f"t{p // 40}", "paragraphs": [{"context": context, "qas": qas}]})
    path.write_text(json.dumps({"version": "1.1", "data": data}))


def timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


def bench_features(train_file: Path, dev_file: Path, tok, max_len: int, stride: int) -> dict:
    from qa_train.data.features import featurize, window_offsets
    from qa_train.data.load import load_file
    from qa_train.squad.postprocess import Questions, postprocess_predictions

    train, t_load = timed(load_file, train_file)
    feats, t_train = timed(featurize, train, tok, max_len, stride)
    dev = load_file(dev_file)
    dev_feats, t_dev = timed(featurize, dev, tok, max_len, stride, with_offsets=True)
    offsets, t_off = timed(window_offsets, dev_feats, max_len)
    rng = np.random.default_rng(0)
    start = rng.standard_normal((len(dev_feats), max_len)).astype(np.float32)
    end = rng.standard_normal((len(dev_feats), max_len)).astype(np.float32)
    questions = Questions(dev_feats.example_index, dev.ids, dev.contexts)
    _, t_post = timed(postprocess_predictions, start, end, offsets, questions)
    return {
        "train_questions": len(train),
        "train_features": len(feats),
        "load_validate_train_s": t_load,
        "featurize_train_s": t_train,
        "dev_questions": len(dev),
        "dev_features": len(dev_feats),
        "featurize_dev_s": t_dev,
        "dev_offsets_s": t_off,
        "postprocess_dev_s": t_post,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2,
    }


def bench_startup(workdir: Path) -> float:
    """Seconds from `python -m qa_train` to its first log line."""
    cmd = [
        sys.executable,
        "-m",
        "qa_train",
        "--offline_demo",
        "--max_train_steps",
        "1",
        "--no_eval",
        "--report_to",
        "none",
        "--save_final_model",
        "false",
        "--output_dir",
        str(workdir / "startup"),
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    first = None
    for line in proc.stderr:
        if " qa_train: " in line and first is None:
            first = time.perf_counter() - t0
    proc.wait()
    return first if first is not None else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train_file", type=Path)
    p.add_argument("--validation_file", type=Path)
    p.add_argument("--tokenizer_name", default=str(DEMO_MODEL_DIR))
    p.add_argument("--max_seq_length", type=int, default=384)
    p.add_argument("--doc_stride", type=int, default=128)
    p.add_argument("--skip_startup", action="store_true")
    p.add_argument(
        "--keep_data",
        type=Path,
        metavar="DIR",
        help="write the synthetic train.json/dev.json here and keep them (e.g. for a full-size training run)",
    )
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer_name)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        train, dev = args.train_file, args.validation_file
        if train is None or dev is None:
            data_dir = args.keep_data or work
            data_dir.mkdir(parents=True, exist_ok=True)
            train, dev = data_dir / "train.json", data_dir / "dev.json"
            synthetic_squad(train, 18_896, 87_599, seed=1, tokenizer=tok)
            synthetic_squad(dev, 2_067, 10_570, seed=2, tokenizer=tok)
        figures = bench_features(train, dev, tok, args.max_seq_length, args.doc_stride)
        if not args.skip_startup:
            figures["startup_to_first_log_s"] = bench_startup(work)
    for key, value in figures.items():
        print(f"{key:28s} {value:,.3f}" if isinstance(value, float) else f"{key:28s} {value:,}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
