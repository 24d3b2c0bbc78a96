"""A rank that stops answering: the others wait --ddp_timeout in their next collective, then the run ends in one line
per rank, with exit 6 and the last checkpoint intact, instead of every rank waiting torch's default 30 minutes."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, base_env, cpu_launch, error_lines, port, tiny_flags

from qa_train.core.preemption import HOLD_ENV, HOLD_RANKS_ENV

# Every collective of the run gets it, start-up's and featurisation's too: long enough for a loaded 2-core machine's
# skew between ranks there, short beside torch's default.
TIMEOUT_S = 15


@pytest.mark.parametrize(("config", "hung", "base_port"), [("ddp", 1, 29791), ("zero2", 0, 29792)])
def test_a_hung_rank_ends_the_run_after_ddp_timeout_in_one_line(
    config: str, hung: int, base_port: int, tmp_path: Path
) -> None:
    """ZeRO-2 too: DeepSpeed forms its own process group, which must get the timeout as well. Rank 0 hung is the
    case where the launcher cannot read the main process's code: the agent's root cause gives it."""
    out = tmp_path / "run"
    env = {**base_env(tmp_path), HOLD_ENV: "6", HOLD_RANKS_ENV: str(hung)}
    cmd = [
        *cpu_launch(config, port(base_port)),
        *tiny_flags(
            out,
            "--max_train_steps",
            "8",
            "--logging_steps",
            "1",
            "--no_eval",
            "--checkpointing_steps",
            "4",
            "--ddp_timeout",
            str(TIMEOUT_S),
        ),
    ]
    start = time.monotonic()
    # Under torch's default the waiting rank would sit 30 minutes; the hold itself gives up after 300 s.
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)
    waited = time.monotonic() - start
    assert proc.returncode == 6, proc.stderr[-3000:]
    waiting = 1 - hung
    lines = error_lines(proc.stderr)  # and no traceback, from either rank
    # It names the wait: the step log's gather of per-rank figures, where the other rank did not arrive.
    assert re.fullmatch(
        rf"qa_train: error: rank {waiting}: a collective \(in qa_train/observe/monitor\.py:\d+, collect\) "
        rf"waited more than {TIMEOUT_S} s for the other ranks \(--ddp_timeout\): one of them hung or "
        r"died; rerun with --resume_from_checkpoint latest, or raise --ddp_timeout if one rank works "
        r"alone that long",
        lines[0],
    ), lines[0]
    # The held rank, stopped by torchrun, finds its peer gone: one line, and its code does not mask rank 0's.
    [peer] = lines[1:]
    assert re.fullmatch(
        rf"qa_train: error: rank {hung}: another rank left the run during a collective \(in "
        r"qa_train/[\w/]+\.py:\d+, \w+\) \(its own lines say why\)",
        peer,
    ), peer
    assert f"qa-train launch: rank {waiting} exited with 6" in proc.stderr
    assert waited < 120, waited
    assert (out / "checkpoints" / "step_00000004" / "trainer_state.json").is_file()
    assert not (out / "metrics.json").exists()
