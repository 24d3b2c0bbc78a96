"""The strategy runs that test_strategies.py and test_resume_anywhere_runs.py share: a short launch of the tiny BERT
under any accelerate config and its step log (tests/conftest.py runs one uninterrupted run per config)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import cpu_launch, port, tiny_flags

STEPS = 8
PORTS = iter(range(port(29620), port(29700)))


def launch_cmd(config: str, out: Path, *extra: str, processes: int = 2) -> list[str]:
    return [
        *cpu_launch(config, next(PORTS), processes),
        *tiny_flags(
            out,
            "--max_train_steps",
            str(STEPS),
            "--logging_steps",
            "1",
            "--no_eval",
            "--checkpointing_steps",
            "4",
            *extra,
        ),
    ]


def step_log(out: Path) -> dict[int, dict]:
    """Last training entry per step: a resumed run re-logs the steps after its checkpoint (evaluations log their
    own eval/* lines at a step)."""
    entries = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    return {e["step"]: e for e in entries if "train/loss" in e}
