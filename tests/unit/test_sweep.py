"""Sweep plans without launches: points x repeats, weak and strong scaling, and refusals before any run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_runs import fake_metrics

from qa_train.studies import bench, slurm_sweep
from qa_train.studies.sweep import Point, SweepError, flag_value, read_point, strong_scaling, with_repeats


def plans_for(argv: list[str]) -> list[Point]:
    opts, user_flags = bench.parse(argv)
    bench.resolve_device(opts)
    return bench.sweep_plans(opts, [*bench.DEFAULT_FLAGS, *user_flags])


def test_every_config_at_every_count_repeated_in_interleaved_order() -> None:
    plans = plans_for(
        ["--cpu", "--configs", "single", "ddp", "zero2", "--num_processes", "4", "1", "2", "--repeats", "3"]
    )
    first = [p.name for p in plans[:7]]
    assert first == ["single-p1-r1", "ddp-p1-r1", "ddp-p2-r1", "ddp-p4-r1", "zero2-p1-r1", "zero2-p2-r1", "zero2-p4-r1"]
    assert [p.name for p in plans[7:14]] == [n.replace("-r1", "-r2") for n in first]
    assert len(plans) == 21 and len({p.name for p in plans}) == 21
    assert all(p.extra == [] for p in plans)  # weak scaling: the flags' per-device batch everywhere


def test_strong_scaling_divides_the_per_device_batch_and_refuses_what_does_not_divide() -> None:
    plans = plans_for(
        [
            "--cpu",
            "--configs",
            "ddp",
            "--num_processes",
            "1",
            "2",
            "4",
            "--scaling",
            "strong",
            "--",
            "--per_device_train_batch_size",
            "16",
        ]
    )
    batches = {p.processes: int(flag_value(p.extra, "per_device_train_batch_size")) for p in plans}
    assert batches == {1: 16, 2: 8, 4: 4}  # global batch 16 throughout
    plans = plans_for(
        [
            "--cpu",
            "--configs",
            "ddp",
            "--num_processes",
            "2",
            "4",
            "--scaling",
            "strong",
            "--global_batch_size",
            "32",
            "--",
            "--gradient_accumulation_steps",
            "2",
        ]
    )
    assert {p.processes: flag_value(p.extra, "per_device_train_batch_size") for p in plans} == {2: "8", 4: "4"}
    with pytest.raises(SweepError, match=r"global batch of 8 does not split evenly over 3 processes x 1 accumulation"):
        strong_scaling([Point("ddp", "ddp", 1), Point("ddp", "ddp", 3)], bench.DEFAULT_FLAGS, None)
    with pytest.raises(SweepError, match="--procs_per_node"):
        strong_scaling([Point("ddp", "ddp", 0, nodes=2, slurm=True)], [], None)


def test_a_sweep_that_cannot_run_is_refused_in_one_line_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "bench"
    code = bench.main(
        ["--cpu", "--configs", "ddp", "--num_processes", "1", "3", "--scaling", "strong", "--output_dir", str(out)]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("qa-train bench: error: --scaling strong: ")
    assert not out.exists()


def test_an_unknown_config_is_refused_input(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """It exited 1, the code of a crash, where every other refusal is 2 (issue 38, case 16)."""
    out = tmp_path / "bench"
    assert bench.main(["--cpu", "--configs", "zero9", "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("qa-train bench: error: --configs zero9: no ")
    assert "(have: single, ddp," in err[0] and not out.exists()


def test_a_sweep_whose_every_config_is_skipped_on_cpu_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It ran nothing, said "0 of 0 runs finished" and exited 1, the code of a failed run (found running
    docs/comparing.md's claims on CPU)."""
    configs = tmp_path / "configs"
    configs.mkdir()
    fsdp = (bench.CONFIG_DIR / "fsdp.yaml").read_text()
    (configs / "fsdp_offload.yaml").write_text(fsdp.replace("fsdp_offload_params: false", "fsdp_offload_params: true"))
    monkeypatch.setattr(bench, "CONFIG_DIR", configs)
    out = tmp_path / "bench"
    assert bench.main(["--cpu", "--configs", "fsdp_offload", "--output_dir", str(out)]) == 2
    said = capsys.readouterr()
    assert said.out.startswith("skipping fsdp_offload on CPU: ")
    assert said.err.strip().splitlines() == [
        "qa-train bench: error: --configs fsdp_offload: nothing to run on CPU (each is skipped above)"
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeats", "0"], "--repeats must be at least 1, got 0"),
        (["--timeout_s", "0"], "--timeout_s must be a positive finite number of seconds, got 0"),
        (["--num_processes", "2", "0"], "--num_processes: every count must be at least 1"),
        (["--global_batch_size", "16"], "--global_batch_size 16: only with --scaling strong"),
        (["--nodes", "1", "2"], "--nodes, --procs_per_node and --sbatch_args are for --slurm sweeps"),
        (["--slurm", "--num_processes", "2"], "--slurm: a job's processes are nodes x --procs_per_node"),
        (["--ablation", "--scaling", "strong"], "--ablation runs one local process per feature"),
    ],
)
def test_flag_combinations_that_cannot_work_name_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as stop:
        bench.parse(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_sbatch_args_takes_its_value_after_a_space(monkeypatch: pytest.MonkeyPatch) -> None:
    """argparse refused `--sbatch_args --wait` (a value that looks like a flag of its own); only
    `--sbatch_args=--wait` went through."""
    monkeypatch.setattr(slurm_sweep.shutil, "which", lambda name: f"/usr/bin/{name}")  # a login node's sbatch
    for value in ("--wait", "-p gpu", "--partition gpu --time 01:00:00"):
        opts, flags = bench.parse(["--slurm", "--sbatch_args", value, "--nodes", "2", "--", "--seed", "3"])
        assert (opts.sbatch_args, opts.nodes, flags) == (value, [2], ["--seed", "3"])
    assert bench.parse(["--slurm", "--sbatch_args=--wait"])[0].sbatch_args == "--wait"


def test_slurm_points_are_configs_times_node_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_sweep.shutil, "which", lambda name: f"/usr/bin/{name}")  # a login node's sbatch
    opts, flags = bench.parse(
        [
            "--slurm",
            "--nodes",
            "2",
            "1",
            "--configs",
            "single",
            "ddp",
            "zero2",
            "--procs_per_node",
            "4",
            "--scaling",
            "strong",
            "--global_batch_size",
            "64",
        ]
    )
    plans = bench.sweep_plans(opts, [*bench.DEFAULT_FLAGS, *flags])
    assert [p.name for p in plans] == ["ddp-n1-r1", "ddp-n2-r1", "zero2-n1-r1", "zero2-n2-r1"]  # single: one process
    assert [(p.nodes, p.processes, flag_value(p.extra, "per_device_train_batch_size")) for p in plans[:2]] == [
        (1, 4, "16"),
        (2, 8, "8"),
    ]


def test_points_round_trip_beside_the_run(tmp_path: Path) -> None:
    point = with_repeats([Point("zero2", "zero2", 2, extra=["--per_device_train_batch_size", "4"])], 2)[1]
    point.write(tmp_path)
    assert read_point(tmp_path) == point and point.name == "zero2-p2-r2"
    (tmp_path / "sweep_point.json").write_text(json.dumps({"label": "x"}))  # damaged: read as "not in a sweep"
    assert read_point(tmp_path) is None and read_point(tmp_path / "missing") is None


def test_configs_named_twice_run_once() -> None:
    plans = plans_for(["--cpu", "--configs", "ddp", "single", "ddp", "--num_processes", "2"])
    assert [p.name for p in plans] == ["ddp-p2-r1", "single-p1-r1"]


def fake_bench(monkeypatch: pytest.MonkeyPatch, results: dict[str, int | type[BaseException]]):
    """bench.run_one without launches: each point's run dir as the bench leaves it, with a metrics.json
    (exit 0), none (another exit status), or the exception the run raised (Ctrl-C)."""

    def run_one(point: Point, opts, train_flags, port) -> bench.Outcome:
        run_dir = Path(opts.output_dir) / point.name
        result = results[point.name]
        if not isinstance(result, int):
            run_dir.mkdir(parents=True)
            point.write(run_dir)  # as the real run_one does before it launches
            raise result()
        if result == 0:
            fake_metrics(
                run_dir, "single" if point.processes == 1 else point.config, point.processes, 40.0, 0.5, point=point
            )
        else:
            run_dir.mkdir(parents=True)
            point.write(run_dir)
        (run_dir / "launch.log").write_text("the last lines\n")
        return bench.Outcome(point, run_dir, run_dir / "launch.log", result)

    monkeypatch.setattr(bench, "run_one", run_one)


def test_a_failed_point_is_a_row_of_the_report_that_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    fake_bench(monkeypatch, {"single-p1-r1": 0, "ddp-p2-r1": 1})
    out = tmp_path / "bench"
    code = bench.main(["--cpu", "--configs", "single", "ddp", "--num_processes", "2", "--output_dir", str(out)])
    assert code == 1 and "FAILED ddp-p2-r1 (exit 1)" in capsys.readouterr().err
    text = (out / "report" / "report.md").read_text()
    assert "| ddp | ddp | 1 | 2 | 0 + 1 failed |" in text and "ddp-p2-r1: no metrics.json" in text
    assert "| single | single | 1 | 1 | 1 |" in text


def test_ctrl_c_reports_the_runs_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    fake_bench(monkeypatch, {"single-p1-r1": 0, "ddp-p2-r1": KeyboardInterrupt})
    out = tmp_path / "bench"
    code = bench.main(
        ["--cpu", "--configs", "single", "ddp", "zero2", "--num_processes", "2", "--output_dir", str(out)]
    )
    captured = capsys.readouterr()
    assert code == 130 and "interrupted during run 2 of 3" in captured.err
    assert "1 of 1 runs finished" in captured.out
    assert "| single | single | 1 | 1 | 1 |" in (out / "report" / "report.md").read_text()


@pytest.mark.parametrize(
    ("output_dir", "says"),
    [
        ("notes.txt", "--output_dir {tmp}/notes.txt: is a file, not a directory"),
        ("notes.txt/bench", "--output_dir {tmp}/notes.txt/bench: {tmp}/notes.txt is a file, not a directory"),
        ("mine", "--output_dir {tmp}/mine/report: holds report.md, which no qa-train report wrote"),
    ],
)
def test_an_output_dir_that_cannot_take_the_runs_or_report_is_refused_before_any_run(
    output_dir: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A file was a NotADirectoryError traceback (exit 1) at the first run; a report/ of the user's was found only
    once every run had finished ("[bench] no report: ...")."""
    fake_bench(monkeypatch, {})  # any run at all fails the test: a KeyError
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "mine" / "report").mkdir(parents=True)
    (tmp_path / "mine" / "report" / "report.md").write_text("my notes")
    assert bench.main(["--cpu", "--configs", "single", "--output_dir", str(tmp_path / output_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qa-train bench: error: {says.format(tmp=tmp_path)}") and err.count("\n") == 1, err
    assert (tmp_path / "mine" / "report" / "report.md").read_text() == "my notes"


def test_a_waiting_sbatch_past_the_timeout_is_a_failed_submission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    def run(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

    monkeypatch.setattr(slurm_sweep.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(slurm_sweep.subprocess, "run", run)
    opts, _ = bench.parse(["--slurm", "--nodes", "1", "--timeout_s", "5", "--output_dir", str(tmp_path)])
    run_dir, code, job = slurm_sweep.submit(Point("ddp", "ddp", 0, nodes=1, slurm=True), opts, [], bench.CONFIG_DIR)
    assert (code, job) == (124, "") and "did not return within 5 s" in (run_dir / "sbatch.log").read_text()
