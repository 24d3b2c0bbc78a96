"""The strategy report from synthetic runs, and the benchmark driver end to end on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import PY, base_env, read_metrics, run_cmd, run_ok
from qa_train import report
from qa_train.schema import PerRank, RunMetrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_metrics(out: Path, strategy: str, world: int, samples_s: float, rss: float,
                 em: float | None = None, f1: float | None = None, offload: str = "none",
                 gpu: float | None = None) -> Path:
    """A metrics.json written from the one schema run.py writes it from, with the figures the report reads."""
    out.mkdir(parents=True)
    mem = gpu if gpu is not None else rss

    def per_rank(v: float | None) -> PerRank:
        return PerRank(None if v is None else [v] * world, v, None if v is None else v * 0.9)

    metrics = RunMetrics(
        exact_match=em, f1=f1, train_samples_per_second=samples_s,
        train_tokens_per_second=samples_s * 150, train_padded_tokens_per_second=samples_s * 192,
        train_step_time_s_mean=0.5, tflops_per_device=0.01, mfu=0.412 if gpu is not None else None,
        peak_memory_source="cuda_max_allocated" if gpu is not None else "host_rss_during_training",
        peak_memory_gb=per_rank(mem), peak_memory_reserved_gb=per_rank(gpu),
        train_host_rss_gb=per_rank(rss), peak_host_rss_gb=per_rank(rss + 0.25),
        train_runtime_s=10.0, train_steps=6, world_size=world, strategy=strategy,
        zero_stage=int(strategy[-1]) if strategy.startswith("zero") else None, offload=offload,
        mixed_precision="no", device="cpu", global_batch_size=8 * world,
        per_device_train_batch_size=8, max_seq_length=192, num_parameters=1000,
        output_dir=str(out), args={"run_name": out.name},
    )
    (out / "metrics.json").write_text(json.dumps(metrics.to_json()))
    return out


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    fake_metrics(root / "single", "single", 1, 40.0, 0.5, em=10.0, f1=20.5)
    fake_metrics(root / "ddp", "ddp", 2, 60.0, 0.6, em=11.0, f1=21.0)
    fake_metrics(root / "zero2", "zero2", 2, 50.0, 0.55, offload="optimizer")  # --no_eval: no EM/F1
    return root


def table_rows(markdown: str) -> list[dict[str, str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def test_table_has_every_column_speedup_and_dash_for_missing_scores(runs: Path, tmp_path: Path) -> None:
    run_dirs = [runs / "single", runs / "ddp", runs / "zero2"]
    out_rows, paths = report.build_report(run_dirs, tmp_path / "report")
    assert [r.speedup for r in out_rows] == [1.0, 1.5, 1.25]
    rows = {r["run"]: r for r in table_rows(paths["markdown"].read_text())}
    assert list(rows) == ["single", "ddp", "zero2"]
    assert list(rows["ddp"]) == list(report.COLUMNS)
    assert rows["single"]["speed-up"] == "1.00x" and rows["ddp"]["speed-up"] == "1.50x"
    assert rows["zero2"]["speed-up"] == "1.25x"
    assert rows["ddp"]["EM / F1"] == "11.0 / 21.0" and rows["zero2"]["EM / F1"] == report.DASH
    assert rows["zero2"]["strategy"] == "zero2+offload(optimizer)"
    assert (rows["ddp"]["processes"], rows["ddp"]["global batch"], rows["ddp"]["samples/s"]) == ("2", "16", "60.0")
    assert rows["ddp"]["tokens/s"] == "9,000" and rows["ddp"]["MFU"] == report.DASH
    assert rows["ddp"]["peak memory/rank max / mean"] == "0.60 / 0.54 GiB (host RSS)"
    assert rows["ddp"]["host RSS lifetime max"] == "0.85 GiB"
    saved = json.loads(paths["json"].read_text())
    assert saved["baseline"] == "single" and len(saved["rows"]) == 3
    assert saved["rows"][1]["samples_per_s"] == 60.0 and saved["rows"][2]["exact_match"] is None


def test_parent_dir_expands_and_no_single_run_means_no_speedup(runs: Path, tmp_path: Path) -> None:
    rows, base = report.build_rows(report.find_runs([runs]))
    assert [r.run for r in rows] == ["ddp", "single", "zero2"] and base is not None and base.run == "single"
    rows, base = report.build_rows([runs / "ddp", runs / "zero2"])
    assert base is None and all(r.speedup is None for r in rows)
    assert all(r["speed-up"] == report.DASH for r in table_rows(report.markdown_table(rows)))


def test_gpu_run_shows_allocated_memory_and_mfu(tmp_path: Path) -> None:
    run = fake_metrics(tmp_path / "gpu-ddp", "ddp", 8, 900.0, 3.0, gpu=7.5)
    rows, _ = report.build_rows([run])
    cells = dict(zip(report.COLUMNS, report.cells(rows[0])))
    assert cells["MFU"] == "41.2%" and cells["peak memory/rank max / mean"] == "7.50 / 6.75 GiB (GPU allocated)"
    heights = report.bar_heights(report.memory_figure(rows))
    assert heights == {report.GPU_SERIES: [7.5], report.HOST_SERIES: [3.0]}


def test_plots_are_pngs_with_the_runs_figures(runs: Path, tmp_path: Path) -> None:
    from matplotlib.image import imread

    rows, paths = report.build_report([runs / "single", runs / "ddp", runs / "zero2"], tmp_path / "report")
    for name in ("throughput", "memory"):
        assert paths[name].read_bytes()[:8] == PNG_MAGIC
        image = imread(paths[name])
        assert image.shape[0] > 200 and image.shape[1] > 300 and image.std() > 0.01, f"{name}.png looks blank"
    assert report.bar_heights(report.throughput_figure(rows)) == {"samples/s": [40.0, 60.0, 50.0]}
    fig = report.memory_figure(rows)
    heights = report.bar_heights(fig)
    gpu_label = report.GPU_SERIES + " (none: CPU runs)"
    assert heights == {gpu_label: [0.0, 0.0, 0.0], report.HOST_SERIES: [0.5, 0.6, 0.55]}
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == [gpu_label, report.HOST_SERIES]
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["single", "ddp", "zero2\n+offload(optimizer)"]


def test_shared_strategy_bars_are_labelled_by_run(tmp_path: Path) -> None:
    a = fake_metrics(tmp_path / "single-pad192", "single", 1, 30.0, 0.5)
    b = fake_metrics(tmp_path / "single-grouped", "single", 1, 45.0, 0.5)
    rows, base = report.build_rows([a, b])
    assert base is not None and base.run == "single-pad192" and rows[1].speedup == 1.5
    assert report.bar_labels(rows) == ["single-pad192\n(single)", "single-grouped\n(single)"]


def test_errors_name_the_run_dir(runs: Path, tmp_path: Path) -> None:
    empty = tmp_path / "crashed-run"
    empty.mkdir()
    with pytest.raises(report.ReportError, match="crashed-run.*no metrics.json"):
        report.build_report([runs / "single", empty], tmp_path / "report")
    with pytest.raises(report.ReportError, match="crashed-run.*no metrics.json"):
        report.load_metrics(empty)
    (empty / "metrics.json").write_text("{not json")
    with pytest.raises(report.ReportError, match="crashed-run.*not valid JSON"):
        report.build_report([empty])
    with pytest.raises(report.ReportError, match="--baseline nope"):
        report.build_rows([runs / "single"], baseline="nope")


def test_cli_prints_the_table_and_refuses_a_bad_dir(runs: Path, tmp_path: Path) -> None:
    env = base_env(tmp_path)
    proc = run_ok([PY, "-m", "qa_train.report", str(runs), "--output", str(tmp_path / "out")], env)
    assert "| run | strategy |" in proc.stdout and "1.50x" in proc.stdout
    assert (tmp_path / "out" / "report.md").is_file()
    proc = run_cmd([PY, "-m", "qa_train.report", str(tmp_path / "missing")], env)
    assert proc.returncode == 2 and str(tmp_path / "missing") in proc.stderr


def test_wandb_logging_goes_offline_without_credentials(runs: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in base_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    report.build_report([runs], tmp_path / "report", wandb_project="qa-train-test")
    assert list((tmp_path / "report" / "wandb").glob("offline-run-*"))


@pytest.mark.distributed
def test_bench_single_and_ddp_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = run_ok([PY, "-m", "qa_train.bench", "--configs", "single", "ddp", "--num_processes", "2", "--cpu",
                   "--max_train_steps", "6", "--output_dir", str(out), "--", "--no_eval", "--report_to", "none",
                   "--logging_steps", "2"], base_env(tmp_path))
    single, ddp = read_metrics(out / "single"), read_metrics(out / "ddp")
    assert (single["world_size"], single["strategy"], single["train_steps"]) == (1, "single", 6)
    assert (ddp["world_size"], ddp["strategy"], ddp["train_steps"]) == (2, "ddp", 6)
    assert single["args"]["run_name"] == "single" and single["args"]["save_final_model"] is False
    for name in ("report.md", "report.json", "throughput.png", "memory.png"):
        assert (out / "report" / name).is_file(), name
    saved = json.loads((out / "report" / "report.json").read_text())
    assert [r["run"] for r in saved["rows"]] == ["single", "ddp"] and saved["rows"][0]["speedup"] == 1.0
    assert [r["run"] for r in table_rows((out / "report" / "report.md").read_text())] == ["single", "ddp"]
    assert "| single |" in proc.stdout and "2 of 2 runs finished" in proc.stdout


@pytest.mark.distributed
def test_bench_reports_failed_runs_and_goes_on(tmp_path: Path) -> None:
    """Each failed run is named with its log and why; the next run still starts; the exit is 1."""
    out = tmp_path / "bench"
    proc = run_cmd([PY, "-m", "qa_train.bench", "--configs", "single", "ddp", "fsdp", "--cpu",
                    "--max_train_steps", "2", "--output_dir", str(out), "--", "--no_eval", "--max_seq_length", "0"],
                   base_env(tmp_path))
    assert proc.returncode == 1
    assert "skipping fsdp: accelerate does not apply FSDP on CPU" in proc.stdout
    for name in ("single", "ddp"):
        assert f"FAILED {name}" in proc.stderr and str(out / name / "launch.log") in proc.stderr
    assert "--max_seq_length: must be positive" in proc.stderr  # the last lines of the log say why
    assert "0 of 2 runs finished; failed: single, ddp" in proc.stdout


@pytest.mark.parametrize("on_cpu", [True, False])
def test_ablation_flips_one_real_flag_per_run(on_cpu: bool) -> None:
    from qa_train import bench
    from qa_train.config import parse_args

    plans = bench.ablation_plans(on_cpu)
    assert plans[0].name == "default" and plans[0].extra == []
    assert len({p.name for p in plans}) == len(plans)
    defaults = parse_args(["--offline_demo"]).to_dict()
    for plan in plans[1:]:
        args = parse_args(["--offline_demo", *plan.extra]).to_dict()  # a misspelt flag would be refused here
        flipped = [name for name in defaults if args[name] != defaults[name]]
        assert len(flipped) == 1, (plan.name, flipped)
    cuda_only = {"fp32", "unfused-adamw", "no-workers"}
    assert ({p.name for p in plans} & cuda_only) == (set() if on_cpu else cuda_only)
