"""`qa-train report` and `qa-train bench` as users run them: the table over run folders, W&B offline, and
a benchmark sweep on CPU end to end (strong scaling with repeats, failed runs named and the sweep going on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import PY, base_env, read_metrics, run_cmd, run_ok
from fake_runs import three_runs

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return three_runs(tmp_path / "runs")


def test_cli_prints_the_table_and_refuses_a_bad_dir(runs: Path, tmp_path: Path) -> None:
    env = base_env(tmp_path)
    proc = run_ok([PY, "-m", "qa_train.cli", "report", str(runs), "--output_dir", str(tmp_path / "out")], env)
    assert "| run | strategy | nodes | processes |" in proc.stdout and "1.50x" in proc.stdout
    assert (tmp_path / "out" / "report.md").is_file()
    proc = run_cmd([PY, "-m", "qa_train.cli", "report", str(tmp_path / "missing")], env)
    assert proc.returncode == 2 and str(tmp_path / "missing") in proc.stderr


def test_wandb_logging_goes_offline_without_credentials(runs: Path, tmp_path: Path) -> None:
    """`report --wandb` as a user runs it (its own process: no other W&B run in it), without credentials."""
    env = {k: v for k, v in base_env(tmp_path).items() if k not in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_RUN_GROUP")}
    env["NETRC"] = str(tmp_path / "no-netrc")
    run_ok(
        [
            PY,
            "-m",
            "qa_train.cli",
            "report",
            str(runs),
            "--output",
            str(tmp_path / "report"),
            "--wandb",
            "--wandb_project",
            "qa-train-test",
        ],
        env,
    )
    (run_file,) = list((tmp_path / "report" / "wandb").glob("offline-run-*/run-*.wandb"))
    import wandb_records as w

    recs = w.records(run_file)
    (run,) = [r.run for r in recs if r.WhichOneof("record_type") == "run"]
    assert (run.run_group, run.job_type) == (f"bench-{runs.name}", "report")  # beside the bench's runs
    table = w.summary(recs)["report/table"]
    assert table["_type"] == "table-file" and table["nrows"] >= 2


def test_bench_sweeps_processes_with_repeats_under_strong_scaling(tmp_path: Path) -> None:
    """One command: ddp at 1 and 2 processes, twice each, global batch fixed; the report's medians,
    speed-up against the 1-process runs and efficiency come from the runs' own metrics."""
    import wandb_records as w

    out = tmp_path / "bench"
    proc = run_ok(
        [
            PY,
            "-m",
            "qa_train.cli",
            "bench",
            "--configs",
            "ddp",
            "--num_processes",
            "1",
            "2",
            "--repeats",
            "2",
            "--scaling",
            "strong",
            "--cpu",
            "--max_train_steps",
            "4",
            "--output_dir",
            str(out),
            "--",
            "--no_eval",
            "--logging_steps",
            "2",
            "--max_train_samples",
            "300",
        ],
        base_env(tmp_path),
    )
    names = ["ddp-p1-r1", "ddp-p2-r1", "ddp-p1-r2", "ddp-p2-r2"]  # every point once, then again
    started = [line.split()[1].rstrip(":") for line in proc.stdout.splitlines() if line.startswith("[bench] ddp-")]
    assert started == names
    metrics = {name: read_metrics(out / name) for name in names}
    for name, m in metrics.items():
        world = 1 if "-p1-" in name else 2
        assert (m["world_size"], m["train_steps"], m["global_batch_size"]) == (world, 4, 8), name
        assert m["per_device_train_batch_size"] == 8 // world and m["args"]["run_name"] == name
        assert json.loads((out / name / "sweep_point.json").read_text())["label"] == "ddp"
        # The machine's load, which the report's warnings read, and the run's W&B records (offline, no credentials)
        assert m["cpu_count"] >= 1 and m["load_average_1m"] >= 0 and m["other_processes_cpu_cores"] >= 0, name
        (run_file,) = (out / name / "wandb").glob("offline-run-*/run-*.wandb")
        (run,) = [r.run for r in w.records(run_file) if r.WhichOneof("record_type") == "run"]
        assert (run.run_group, run.job_type) == ("bench-bench", "ddp"), name
    assert metrics["ddp-p1-r1"]["strategy"] == "single" and metrics["ddp-p2-r1"]["strategy"] == "ddp"
    saved = json.loads((out / "report" / "report.json").read_text())
    one, two = saved["groups"]
    assert (one["processes"], one["runs"], two["processes"], two["runs"]) == (1, names[0::2], 2, names[1::2])
    rate = {n: m["train_samples_per_second"] for n, m in metrics.items()}
    base = (rate["ddp-p1-r1"] + rate["ddp-p1-r2"]) / 2  # the median of two
    expected = [rate["ddp-p2-r1"] / base, rate["ddp-p2-r2"] / base]
    assert two["speedup"]["median"] == pytest.approx(sum(expected) / 2)
    assert (two["speedup"]["lo"], two["speedup"]["hi"]) == pytest.approx((min(expected), max(expected)))
    assert two["efficiency"]["median"] == pytest.approx(sum(expected) / 4) and one["speedup"]["median"] == 1.0
    text = (out / "report" / "report.md").read_text()
    assert "Scaling: ddp strong (global batch 8)." in text and "over its 2 run(s)" in text
    assert (out / "report" / "speedup.png").read_bytes()[:8] == PNG_MAGIC
    assert "[bench] strong scaling: global batch 8 at every process count" in proc.stdout
    assert "4 of 4 runs finished" in proc.stdout
    # Two repeats each: a warning only if the machine was loaded, printed as report.json holds it.
    assert all(line in proc.stdout.splitlines() for line in saved["warnings"])
    assert not [line for line in saved["warnings"] if "rests on one run" in line]


def test_bench_reports_failed_runs_and_goes_on(tmp_path: Path) -> None:
    """Each failed run is named with its log and why; the next run still starts; the exit is 1."""
    out = tmp_path / "bench"
    proc = run_cmd(
        [
            PY,
            "-m",
            "qa_train.cli",
            "bench",
            "--configs",
            "single",
            "ddp",
            "fsdp",
            "--cpu",
            "--max_train_steps",
            "2",
            "--output_dir",
            str(out),
            "--",
            "--no_eval",
            "--max_seq_length",
            "0",
        ],
        base_env(tmp_path),
    )
    assert proc.returncode == 1
    for name in ("single-p1-r1", "ddp-p2-r1", "fsdp-p2-r1"):  # FSDP runs on CPU processes too
        assert f"FAILED {name}" in proc.stderr and str(out / name / "launch.log") in proc.stderr
    assert "--max_seq_length: must be positive" in proc.stderr  # the last lines of the log say why
    assert "0 of 3 runs finished; failed: single-p1-r1, ddp-p2-r1, fsdp-p2-r1" in proc.stdout
    # The report names each run's own error line as its reason.
    assert "ddp-p2-r1: --max_seq_length: must be positive, got 0" in (out / "report" / "report.md").read_text()
