"""tools/squad_split.py: whole articles held out, nothing lost, a bad count refused in one line."""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
from pathlib import Path

from conftest import DEMO_TRAIN, ROOT

from qa_train.data.load import load_file

SPLIT = ROOT / "tools" / "squad_split.py"


def test_last_articles_become_validation_and_no_question_is_lost(tmp_path: Path) -> None:
    doc = json.loads(DEMO_TRAIN.read_text())
    source = tmp_path / "train.json.xz"
    with lzma.open(source, "wt", encoding="utf-8") as f:
        json.dump(doc, f)
    proc = subprocess.run(
        [sys.executable, str(SPLIT), str(source), "--holdout_articles", "2", "--out_dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=True,
    )
    train, dev = (
        load_file(str(tmp_path / "out" / "train.json"), "required"),
        load_file(str(tmp_path / "out" / "dev.json"), "required"),
    )
    everything = load_file(str(DEMO_TRAIN), "required")
    assert sorted(train.ids + dev.ids) == sorted(everything.ids) and not set(train.ids) & set(dev.ids)
    held_out = {p["context"] for a in doc["data"][-2:] for p in a["paragraphs"]}
    assert set(dev.contexts) == held_out and not held_out & set(train.contexts)
    assert f"{len(dev.ids)} questions" in proc.stdout


def test_a_holdout_as_large_as_the_file_is_refused(tmp_path: Path) -> None:
    articles = len(json.loads(DEMO_TRAIN.read_text())["data"])
    proc = subprocess.run(
        [
            sys.executable,
            str(SPLIT),
            str(DEMO_TRAIN),
            "--holdout_articles",
            str(articles),
            "--out_dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and f"--holdout_articles {articles}" in proc.stderr
    assert not (tmp_path / "out").exists()
