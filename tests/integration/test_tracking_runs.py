"""W&B's own service in processes of their own: a key with no server goes offline in seconds, and a resumed
offline run logs no step backwards."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT


def step_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


# --- a real wandb against a server that is down ------------------------------------------------------

PROBE = """
import json, logging, sys, time
from pathlib import Path
logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.WARNING)
from qa_train.observe.trackers import build_trackers
(tracker,) = build_trackers(["wandb"], Path(sys.argv[1]), "qa-test", {"name": "down"})
t0 = time.monotonic()
tracker.start()
elapsed = time.monotonic() - t0
run = tracker.tracker
tracker.log({"train/loss": 1.0}, step=1)
tracker.finish()
print(json.dumps({"elapsed_s": elapsed, "mode": run and run.settings.mode, "dir": run and str(run.dir)}))
"""


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_wandb_with_a_key_and_no_server_goes_offline_in_seconds(tmp_path: Path) -> None:
    """wandb's own service, a fake key, a closed port (about 7 s). Measured before the timeout (2 cores): start()
    blocked 101 s and then turned W&B off altogether; now about 6.5 s, and the run is kept offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}  # WANDB_MODE unset, not silent
    env.update(
        {
            "WANDB_API_KEY": "k" * 40,
            "WANDB_BASE_URL": f"http://127.0.0.1:{_closed_port()}",
            "WANDB_CONFIG_DIR": str(tmp_path / "config"),
            "WANDB_CACHE_DIR": str(tmp_path / "cache"),
            "WANDB_DATA_DIR": str(tmp_path / "data"),
            "NETRC": str(tmp_path / "netrc"),
            "PYTHONPATH": str(ROOT),
        }
    )
    out = tmp_path / "run"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(out)], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr[-3000:]
    # wandb prints its run summary to stdout too
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith('{"elapsed_s"')))
    assert result["elapsed_s"] < 15 and wall < 30, (result, wall)
    fallback = [line for line in proc.stderr.splitlines() if line.startswith("WARNING qa_train")]
    assert len(fallback) == 1 and "W&B online run did not start (CommError" in fallback[0], proc.stderr[-3000:]
    assert "logging offline to" in fallback[0] and "wandb sync" in fallback[0]
    assert "UserWarning" not in proc.stderr  # not "W&B disabled": the run keeps its W&B record, offline
    assert result["mode"] == "offline"
    offline = list((out / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and str(offline[0]) in result["dir"]
    assert list(offline[0].glob("*.wandb")), "the offline run writes the file `wandb sync` uploads"


# --- a resumed run and its W&B run ------------------------------------------------------------------

RESUME_PROBE = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from qa_train.observe.trackers import build_trackers
from qa_train.observe.recorder import Tracker
from fake_accelerator import Stand

out, resumed_at, steps = Path(sys.argv[1]), int(sys.argv[3]), json.loads(sys.argv[4])
tracker = Tracker(Stand(build_trackers(["wandb"], out, "qa-test", {"id": "job-42", "resume": "allow"})), out)
tracker.start("qa-test", {"lr": 1e-3}, resumed_at=resumed_at)
for step in steps:
    tracker.log_step(step, {"train/loss": 1.0 / step})
tracker.close()
"""


def test_real_offline_wandb_resumed_under_the_same_id_logs_no_step_backwards(tmp_path: Path) -> None:
    """wandb's own offline runs (a few seconds): the killed run logged steps 5 to 15, the resumed one (checkpoint
    10) logs 10 to 20; each offline run's history, uploaded into one W&B run by `wandb sync`, goes forward."""
    import wandb_records as w

    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        {
            "WANDB_MODE": "offline",
            "WANDB_SILENT": "true",
            "WANDB_CONFIG_DIR": str(tmp_path / "config"),
            "WANDB_CACHE_DIR": str(tmp_path / "cache"),
            "WANDB_DATA_DIR": str(tmp_path / "data"),
            "PYTHONPATH": str(ROOT),
        }
    )
    out = tmp_path / "run"
    for resumed_at, steps in ((0, [5, 10, 15]), (10, [15, 20])):
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                RESUME_PROBE,
                str(out),
                str(ROOT / "tests"),
                str(resumed_at),
                json.dumps(steps),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = sorted((out / "wandb").glob("offline-run-*-job-42/run-job-42.wandb"))
    assert [h["_step"] for h in w.history(w.records(first))] == [5, 10, 15]
    assert [h["_step"] for h in w.history(w.records(second))] == [20]
    assert [r["step"] for r in step_lines(out)] == [5, 10, 15, 20]
