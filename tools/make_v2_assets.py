"""Write qa-train's offline SQuAD v2.0 demo: invented articles with answerable and unanswerable questions.

The articles come from the v1.1 demo's templates and name pool (tools/make_assets.py), with a seed of
their own, so the bundled v1.1 files are untouched. Each paragraph states only some of the facts its kind
of article can hold; it gets answerable questions as in the v1.1 demo, and unanswerable ones about its own
entity asking for a fact it leaves out ("When was the Velmar Bridge restored?" of a paragraph that never
says): SQuAD 2.0's most common kind, answered in the paragraph's words by a plausible but wrong span (often
a year or a name of the asked-for type is there). SQuAD 2.0's other common kind, a stated fact asked of an
entity the paragraph never names, was left out: a 2-layer model trained from scratch for a minute learnt
nothing of it (a third of those questions answered "", as of the answerable ones) and span-finding got worse.

    python tools/make_v2_assets.py [OUT_DIR]    # default: qa_train/assets in this checkout

writes OUT_DIR/demo-v2/{train,dev}.json in SQuAD 2.0's layout ("version": "v2.0", unanswerable
questions with "is_impossible": true and "answers": []), byte-for-byte deterministic for a seed. The
bundled tiny BERT's vocabulary (tools/make_assets.py) covers this text: the words are the same.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/ is deliberately not a package
import make_assets as v1  # noqa: E402

SEED = 2020
# A training article asks up to 4 answerable questions and up to 2 left-out facts (about a third unanswerable,
# as SQuAD 2.0's training set): ~1,300 answerable questions, what the v1.1 demo needs to learn spans at all.
# Dev: up to 2 + 2 per article, about half unanswerable as SQuAD 2.0's.
N_TRAIN_ARTICLES = 700
N_DEV_ARTICLES = 70
DEFAULT_OUT_DIR = v1.DEFAULT_OUT_DIR


def answerable(kind: v1.Kind, slot: str, article: tuple[str, dict, dict], rng: random.Random, dev: bool) -> dict:
    context, values, spans = article
    start, text = spans[slot], values[slot]
    answers = [(text, start)]
    if dev:  # several annotators, sometimes marking a wider or narrower span
        extra = v1.answer_variants(context, start, text)
        answers += rng.sample(extra, rng.randint(0, min(len(extra), v1.MAX_ANSWERS - 1)))
    return {
        "id": f"{rng.getrandbits(96):024x}",
        "question": rng.choice(kind.asks[slot]).format(**values),
        "answers": [{"text": t, "answer_start": s} for t, s in answers],
        "is_impossible": False,
    }


def unstated(kind: v1.Kind, slot: str, values: dict, rng: random.Random) -> dict:
    """A fact of this kind of article that the paragraph leaves out."""
    return {
        "id": f"{rng.getrandbits(96):024x}",
        "question": rng.choice(kind.asks[slot]).format(**values),
        "answers": [],
        "is_impossible": True,
    }


def make_article(kinds: list[v1.Kind], namer: v1.Namer, rng: random.Random, dev: bool) -> dict:
    kind = rng.choice(kinds)
    # 3 facts up to all but one: every paragraph leaves a fact out, for the unstated-fact question.
    article = v1.make_paragraph(kind, namer, rng, (3, len(kind.groups) - 2))
    context, values, spans = article
    stated = [s for s in kind.asks if s in spans]
    left_out = [s for s in kind.asks if s not in spans]
    qas = [answerable(kind, slot, article, rng, dev) for slot in rng.sample(stated, 2 if dev else min(4, len(stated)))]
    qas += [unstated(kind, slot, values, rng) for slot in rng.sample(left_out, min(2, len(left_out)))]
    rng.shuffle(qas)
    title = kind.title.format(**values).replace(" ", "_")
    return {"title": title, "paragraphs": [{"context": context, "qas": qas}]}


def make_datasets(seed: int = SEED) -> tuple[dict, dict]:
    rng = random.Random(seed)
    kinds = v1.parse_templates(v1.TEMPLATES)
    namer = v1.Namer(rng)  # shared, so every dev entity differs from every train entity
    train = [make_article(kinds, namer, rng, dev=False) for _ in range(N_TRAIN_ARTICLES)]
    dev = [make_article(kinds, namer, rng, dev=True) for _ in range(N_DEV_ARTICLES)]
    return {"version": "v2.0", "data": train}, {"version": "v2.0", "data": dev}


def write_assets(out_dir: Path, seed: int = SEED) -> dict[str, int]:
    """(Re)write demo-v2/{train,dev}.json under out_dir; returns question counts."""
    out = Path(out_dir) / "demo-v2"
    out.mkdir(parents=True, exist_ok=True)
    stats: dict[str, int] = {}
    for name, ds in zip(("train", "dev"), make_datasets(seed)):
        text = json.dumps(ds, ensure_ascii=False, indent=None, separators=(",", ":"))
        (out / f"{name}.json").write_text(text + "\n", encoding="utf-8")
        qas = [qa for a in ds["data"] for p in a["paragraphs"] for qa in p["qas"]]
        stats[f"{name}_questions"] = len(qas)
        stats[f"{name}_unanswerable"] = sum(qa["is_impossible"] for qa in qas)
    return stats


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    print(json.dumps(write_assets(Path(argv[0]) if argv else DEFAULT_OUT_DIR)))


if __name__ == "__main__":
    main()
