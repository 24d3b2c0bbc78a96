"""A run's start-up in three parts (qa_train/observe/startup.py): what each part counts from, and what is unknown."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest

from qa_train.core.preemption import RUN_STARTED_ENV
from qa_train.observe import startup
from qa_train.observe.metrics import RankFigures, slowest_startup
from qa_train.observe.recorder import summary_table
from qa_train.observe.schema import RunMetrics
from qa_train.observe.startup import Startup

NAN = math.nan

# A process started for a run, by a launcher that stamped its start 2 s earlier: what measure() makes of it.
CHILD = """
import json, sys, time
t0 = time.time()
from qa_train.observe import startup
startup.entered()
time.sleep(0.3)
began = startup.now()
s = startup.measure(began, began + 1.5)
print(json.dumps({"launch": s.launch_s, "process": s.process_s, "build": s.build_s, "total": s.total_s,
                  "since_t0": began - t0}))
"""


def measured_in_a_child(stamp_offset_s: float | None) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != RUN_STARTED_ENV}
    if stamp_offset_s is not None:
        env[RUN_STARTED_ENV] = f"{time.time() + stamp_offset_s:.3f}"
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_a_launched_process_counts_the_launch_its_own_start_and_the_build() -> None:
    s = measured_in_a_child(-2.0)  # the launcher began 2 s before this process
    # The process's start is read to the clock tick (psutil's create_time can be a second off): the launch's share
    # is the 2 s less nothing but the time to spawn Python.
    assert 1.95 <= s["launch"] <= 2.3, s
    # The sleep and the interpreter's own start: from the process's start, not the launcher's 2 s before.
    assert 0.3 <= s["process"] <= s["since_t0"] + 1.0, s
    assert s["build"] == pytest.approx(1.5)
    assert s["total"] == pytest.approx(s["launch"] + s["process"] + s["build"])


def test_no_stamp_or_a_stamp_after_the_process_began_leaves_the_launch_unknown() -> None:
    for offset in (None, 30.0):  # no launcher of ours; a stamp from the future (a clock step, an inherited one)
        s = measured_in_a_child(offset)
        assert math.isnan(s["launch"]) and s["process"] >= 0.3, s
        assert s["total"] == pytest.approx(s["process"] + s["build"])


def test_main_called_in_a_process_of_the_callers_counts_the_build_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(startup, "_entered", False)
    monkeypatch.setenv(RUN_STARTED_ENV, f"{time.time() - 100:.3f}")  # this pytest process was no run's
    s = startup.measure(1000.0, 1004.25)
    assert math.isnan(s.launch_s) and math.isnan(s.process_s)
    assert (s.build_s, s.total_s) == (4.25, 4.25)


def test_the_slowest_ranks_start_up_is_the_runs() -> None:
    ranks = [
        RankFigures(*([0.0] * 14), startup_launch_s=1.0, startup_process_s=3.0, startup_build_s=2.0),
        RankFigures(*([0.0] * 14), startup_launch_s=1.0, startup_process_s=2.5, startup_build_s=4.0),
        RankFigures(*([0.0] * 14), startup_launch_s=NAN, startup_process_s=NAN, startup_build_s=5.0),
    ]
    assert slowest_startup(ranks) == Startup(1.0, 2.5, 4.0)


def row(table: str, label: str) -> str:
    return next(line[len(label) :].strip() for line in table.splitlines() if line.startswith(label + " "))


def test_the_summary_says_the_start_up_and_its_known_parts() -> None:
    known = dict(startup_s=9.3, startup_launch_s=1.2, startup_process_s=3.1, startup_build_s=5.0)
    trained = RunMetrics(strategy="ddp", world_size=2, train_steps=4, **known)
    assert (
        row(summary_table(trained), "start-up")
        == "9.30 s until the run was built (launch 1.20 s, process 3.10 s, build 5.00 s)"
    )
    direct = RunMetrics(strategy="single", world_size=1, train_steps=4, **{**known, "startup_launch_s": None})
    assert row(summary_table(direct), "start-up").endswith("(process 3.10 s, build 5.00 s)")
    evaluated = RunMetrics(strategy="single", world_size=1, num_eval_examples=3, args={"do_train": False}, **known)
    assert row(summary_table(evaluated), "start-up").startswith("9.30 s until the run was built (launch 1.20 s")
    older = RunMetrics(strategy="ddp", world_size=2, train_steps=4)  # a metrics.json from before it was measured
    assert "start-up" not in summary_table(older)
