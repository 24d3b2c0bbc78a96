"""Local dataset folders as the hub's tools leave them, built from the bundled demo data: what `hf download
rajpurkar/squad --repo-type dataset --local-dir DIR` writes (a README whose YAML names the config's parquet files)
and what `save_to_disk` writes. No test has a network; these stand in for the hub's squad."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import DEMO_DEV, DEMO_TRAIN

# The README front matter of rajpurkar/squad on the hub, as `hf download` fetches it (its configs section).
SQUAD_README = """---
configs:
- config_name: plain_text
  data_files:
{files}
  default: true
---
# squad (demo stand-in)
"""
SPLITS = {"train": DEMO_TRAIN, "validation": DEMO_DEV}


def flat_records(path: Path) -> list[dict]:
    """A nested SQuAD file's questions as the hub's squad holds them: id, title, context, question, answers."""
    return [
        {
            "id": qa["id"],
            "title": article.get("title", ""),
            "context": para["context"],
            "question": qa["question"],
            "answers": {
                "text": [a["text"] for a in qa["answers"]],
                "answer_start": [a["answer_start"] for a in qa["answers"]],
            },
        }
        for article in json.loads(path.read_text())["data"]
        for para in article["paragraphs"]
        for qa in para["qas"]
    ]


def hub_download(folder: Path, splits: tuple[str, ...] = ("train", "validation")) -> Path:
    """The folder `hf download rajpurkar/squad --repo-type dataset` leaves: README.md and plain_text/*.parquet."""
    import datasets

    (folder / "plain_text").mkdir(parents=True)
    for split in splits:
        parquet = folder / "plain_text" / f"{split}-00000-of-00001.parquet"
        datasets.Dataset.from_list(flat_records(SPLITS[split])).to_parquet(str(parquet))
    # A repo with only some splits names only those (a README naming files that are absent is a damaged download).
    files = "\n".join(f"  - split: {s}\n    path: plain_text/{s}-*" for s in splits)
    (folder / "README.md").write_text(SQUAD_README.format(files=files))
    return folder
