"""Sweep plans without launches: points x repeats, weak and strong scaling, and refusals before any run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qa_train import bench, slurm_sweep
from qa_train.sweep import Point, SweepError, flag_value, read_point, strong_scaling, with_repeats


def plans_for(argv: list[str]) -> list[Point]:
    opts, user_flags = bench.parse(argv)
    bench.resolve_device(opts)
    return bench.sweep_plans(opts, [*bench.DEFAULT_FLAGS, *user_flags])


def test_every_config_at_every_count_repeated_in_interleaved_order() -> None:
    plans = plans_for(["--cpu", "--configs", "single", "ddp", "zero2", "--num_processes", "4", "1", "2",
                       "--repeats", "3"])
    first = [p.name for p in plans[:7]]
    assert first == ["single-p1-r1", "ddp-p1-r1", "ddp-p2-r1", "ddp-p4-r1", "zero2-p1-r1", "zero2-p2-r1", "zero2-p4-r1"]
    assert [p.name for p in plans[7:14]] == [n.replace("-r1", "-r2") for n in first]
    assert len(plans) == 21 and len({p.name for p in plans}) == 21
    assert all(p.extra == [] for p in plans)  # weak scaling: the flags' per-device batch everywhere


def test_strong_scaling_divides_the_per_device_batch_and_refuses_what_does_not_divide() -> None:
    plans = plans_for(["--cpu", "--configs", "ddp", "--num_processes", "1", "2", "4", "--scaling", "strong", "--",
                       "--per_device_train_batch_size", "16"])
    batches = {p.processes: int(flag_value(p.extra, "per_device_train_batch_size")) for p in plans}
    assert batches == {1: 16, 2: 8, 4: 4}  # global batch 16 throughout
    plans = plans_for(["--cpu", "--configs", "ddp", "--num_processes", "2", "4", "--scaling", "strong",
                       "--global_batch_size", "32", "--", "--gradient_accumulation_steps", "2"])
    assert {p.processes: flag_value(p.extra, "per_device_train_batch_size") for p in plans} == {2: "8", 4: "4"}
    with pytest.raises(SweepError, match=r"global batch of 8 does not split evenly over 3 processes x 1 accumulation"):
        strong_scaling([Point("ddp", "ddp", 1), Point("ddp", "ddp", 3)], bench.DEFAULT_FLAGS, None)
    with pytest.raises(SweepError, match="--procs_per_node"):
        strong_scaling([Point("ddp", "ddp", 0, nodes=2, slurm=True)], [], None)


def test_a_sweep_that_cannot_run_is_refused_in_one_line_before_any_run(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "bench"
    code = bench.main(["--cpu", "--configs", "ddp", "--num_processes", "1", "3", "--scaling", "strong",
                       "--output_dir", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("qa_train.bench: error: --scaling strong: ")
    assert not out.exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--repeats", "0"], "--repeats must be at least 1, got 0"),
    (["--num_processes", "2", "0"], "--num_processes: every count must be at least 1"),
    (["--global_batch_size", "16"], "--global_batch_size 16: only with --scaling strong"),
    (["--nodes", "1", "2"], "--nodes, --procs_per_node and --sbatch_args are for --slurm sweeps"),
    (["--slurm", "--num_processes", "2"], "--slurm: a job's processes are nodes x --procs_per_node"),
    (["--ablation", "--scaling", "strong"], "--ablation runs one local process per feature"),
])
def test_flag_combinations_that_cannot_work_name_the_flag(argv: list[str], message: str,
                                                          capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        bench.parse(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


def test_slurm_points_are_configs_times_node_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_sweep.shutil, "which", lambda name: f"/usr/bin/{name}")  # a login node's sbatch
    opts, flags = bench.parse(["--slurm", "--nodes", "2", "1", "--configs", "single", "ddp", "zero2",
                               "--procs_per_node", "4", "--scaling", "strong", "--global_batch_size", "64"])
    plans = bench.sweep_plans(opts, [*bench.DEFAULT_FLAGS, *flags])
    assert [p.name for p in plans] == ["ddp-n1-r1", "ddp-n2-r1", "zero2-n1-r1", "zero2-n2-r1"]  # single: one process
    assert [(p.nodes, p.processes, flag_value(p.extra, "per_device_train_batch_size")) for p in plans[:2]] == [
        (1, 4, "16"), (2, 8, "8")]


def test_points_round_trip_beside_the_run(tmp_path: Path) -> None:
    point = with_repeats([Point("zero2", "zero2", 2, extra=["--per_device_train_batch_size", "4"])], 2)[1]
    point.write(tmp_path)
    assert read_point(tmp_path) == point and point.name == "zero2-p2-r2"
    (tmp_path / "sweep_point.json").write_text(json.dumps({"label": "x"}))  # damaged: read as "not in a sweep"
    assert read_point(tmp_path) is None and read_point(tmp_path / "missing") is None
