"""The strategy report from synthetic runs (fake_runs.py), and the benchmark driver's plans and environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY
from fake_runs import fake_metrics, rewrite, three_runs

from qa_train.studies import report, report_data, report_plots
from qa_train.studies.report_plots import IDEAL
from qa_train.studies.sweep import Point

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return three_runs(tmp_path / "runs")


def table_rows(markdown: str) -> list[dict[str, str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def test_a_compiled_runs_training_time_says_how_much_of_it_was_compiling(tmp_path: Path) -> None:
    """Its samples/s leave the compile out with the warm-up steps; its training time holds it, and read alone
    made a compiled run look slow (the H200 ablation's 55.4 s, 53 s of them compiling)."""
    root = tmp_path / "runs"
    fake_metrics(root / "eager", "single", 1, 40.0, 0.5)
    fake_metrics(root / "compiled", "single", 1, 60.0, 0.5, compile_s=0.64)
    _, paths = report.build_report([root / "eager", root / "compiled"], tmp_path / "report")
    rows = {r["run"]: r for r in table_rows(paths["markdown"].read_text())}
    assert rows["compiled"]["train time s"] == "0.80 (0.6 compiling)"
    assert rows["eager"]["train time s"] == "1.20", "nothing compiled, nothing said"


def test_table_has_every_column_speedup_and_dash_for_missing_scores(runs: Path, tmp_path: Path) -> None:
    run_dirs = [runs / "single", runs / "ddp", runs / "zero2"]
    groups, paths = report.build_report(run_dirs, tmp_path / "report")
    assert [g.vs_baseline for g in groups] == [1.0, 1.5, 1.25]
    rows = {r["run"]: r for r in table_rows(paths["markdown"].read_text())}
    assert list(rows) == ["single", "ddp", "zero2"]
    assert list(rows["ddp"]) == list(report.COLUMNS)
    assert rows["single"]["vs baseline"] == "1.00x" and rows["ddp"]["vs baseline"] == "1.50x"
    assert rows["zero2"]["vs baseline"] == "1.25x"
    # One scale per config: no speed-up or efficiency (vs baseline compares across configs).
    assert all(rows[r]["speed-up"] == rows[r]["efficiency"] == report.DASH for r in rows)
    assert rows["ddp"]["EM / F1"] == "11.0 / 21.0" and rows["zero2"]["EM / F1"] == report.DASH
    assert rows["zero2"]["strategy"] == "zero2+offload(optimizer)"
    assert (rows["ddp"]["processes"], rows["ddp"]["global batch"], rows["ddp"]["samples/s"]) == ("2", "16", "60.0")
    assert (rows["ddp"]["nodes"], rows["ddp"]["runs"], rows["ddp"]["train time s"]) == ("1", "1", "1.60")
    assert rows["ddp"]["tokens/s"] == "9,000" and rows["ddp"]["MFU"] == report.DASH
    assert rows["ddp"]["peak memory/rank max / mean"] == "0.60 / 0.54 GiB (host RSS)"
    assert rows["ddp"]["host RSS lifetime max"] == "0.85 GiB"
    saved = json.loads(paths["json"].read_text())
    assert saved["baseline"] == "single x1" and len(saved["rows"]) == 3 and len(saved["groups"]) == 3
    assert saved["rows"][1]["samples_per_s"] == 60.0 and saved["rows"][2]["exact_match"] is None
    assert saved["groups"][1]["figures"]["samples_per_s"] == {"median": 60.0, "lo": 60.0, "hi": 60.0}
    assert not (tmp_path / "report" / "speedup.png").exists()  # no config ran at two scales


def test_parent_dir_expands_and_no_single_run_means_no_baseline(runs: Path, tmp_path: Path) -> None:
    _, groups, base = report_data.build_groups(report_data.find_runs([runs]))
    assert [g.label for g in groups] == ["ddp", "single", "zero2"] and base is not None and base.label == "single"
    _, groups, base = report_data.build_groups([runs / "ddp", runs / "zero2"])
    assert base is None and all(g.vs_baseline is None for g in groups)
    assert all(r["vs baseline"] == report.DASH for r in table_rows(report.markdown_table(groups)))


def sweep(root: Path, label: str, strategy: str, rates: dict[int, list[float]], batch: dict[int, int]) -> None:
    """Fake runs of one config at several process counts and repeats, as a bench sweep leaves them."""
    for procs, per_repeat in rates.items():
        for k, rate in enumerate(per_repeat, 1):
            point = Point(label, label, procs, repeat=k)
            fake_metrics(
                root / point.name,
                strategy if procs > 1 else "single",
                procs,
                rate,
                0.5 + 0.1 * k,
                em=10.0 + k,
                f1=20.0 + k,
                point=point,
                batch=batch[procs],
            )


def test_the_start_up_column_gives_the_repeats_median_and_range_and_a_dash_for_older_files(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    sweep(root, "zero3", "zero3", {2: [70.0, 80.0, 75.0]}, {2: 8})
    sweep(root, "ddp", "ddp", {2: [90.0]}, {2: 8})
    for name, seconds in (("zero3-p2-r1", 9.5), ("zero3-p2-r2", 12.0), ("zero3-p2-r3", 10.25)):
        rewrite(root / name, startup_s=seconds)
    rewrite(root / "ddp-p2-r1", startup_s=None)  # written before qa_train measured its start-up
    _, groups, _ = report_data.build_groups(report_data.find_runs([root]))
    column = {r["run"]: r["start-up s"] for r in table_rows(report.markdown_table(groups))}
    assert column == {"zero3": "10.2 (9.5-12.0)", "ddp": report.DASH}
    rewrite(root / "ddp-p2-r1", startup_s="4.0")  # a hand-edited file: a failed run, not printed as if measured
    _, groups, _ = report_data.build_groups(report_data.find_runs([root]))
    (ddp,) = [g for g in groups if g.label == "ddp"]
    assert ddp.runs == [] and "startup_s='4.0' not a finite number" in ddp.failed[0]


def test_repeats_give_median_and_range_and_speedup_against_one_process(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    # Strong scaling: global batch 16 at 1, 2 and 4 processes.
    sweep(
        root,
        "ddp",
        "ddp",
        {1: [40.0, 44.0, 42.0], 2: [70.0, 84.0, 80.0], 4: [120.0, 140.0, 126.0]},
        {1: 16, 2: 8, 4: 4},
    )
    sweep(root, "zero2", "zero2", {1: [30.0, 30.0, 30.0], 2: [45.0, 48.0, 51.0]}, {1: 8, 2: 8})  # weak
    groups, paths = report.build_report([root], tmp_path / "report")
    by = {(g.label, g.processes): g for g in groups}
    assert list(by) == [("ddp", 1), ("ddp", 2), ("ddp", 4), ("zero2", 1), ("zero2", 2)]
    ddp2 = by["ddp", 2]
    assert ddp2.runs == ["ddp-p2-r1", "ddp-p2-r2", "ddp-p2-r3"]
    assert (ddp2.figures.samples_per_s.median, ddp2.figures.samples_per_s.lo, ddp2.figures.samples_per_s.hi) == (
        80.0,
        70.0,
        84.0,
    )
    speedup = (ddp2.speedup.median, ddp2.speedup.lo, ddp2.speedup.hi)
    assert speedup == pytest.approx((80 / 42, 70 / 42, 84 / 42))  # each over 42.0, the 1-process median
    assert ddp2.efficiency.median == pytest.approx(80 / 42 / 2) and by["ddp", 4].efficiency.median == 0.75
    assert by["ddp", 1].speedup.median == 1.0 and by["zero2", 2].speedup.median == pytest.approx(48 / 30)
    rows = {(r["run"], r["processes"]): r for r in table_rows(paths["markdown"].read_text())}
    assert rows["ddp", "2"]["samples/s"] == "80.0 (70.0-84.0)" and rows["ddp", "2"]["runs"] == "3"
    assert rows["ddp", "2"]["speed-up"] == "1.90x (1.67-2.00x)" and rows["ddp", "2"]["efficiency"] == "95% (83-100%)"
    assert (
        rows["zero2", "1"]["samples/s"] == "30.0"
        and rows["ddp", "2"]["EM / F1"] == "12.0 (11.0-13.0) / 22.0 (21.0-23.0)"
    )
    assert rows["ddp", "2"]["train time s"] == "1.20 (1.14-1.37)"  # 96 samples / samples/s of each repeat
    text = paths["markdown"].read_text()
    assert "ddp strong (global batch 16)" in text and "zero2 weak (per-device batch 8)" in text
    assert "![speedup](speedup.png)" in text and paths["speedup"].read_bytes()[:8] == PNG_MAGIC


def test_plots_carry_error_bars_and_the_ideal_speedup_line(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    sweep(
        root,
        "ddp",
        "ddp",
        {1: [40.0, 44.0, 42.0], 2: [70.0, 84.0, 80.0], 4: [120.0, 140.0, 126.0]},
        {1: 16, 2: 8, 4: 4},
    )
    _, groups, _ = report_data.build_groups(report_data.find_runs([root]))
    lines = report_plots.line_data(report_plots.speedup_figure(groups))
    assert lines["ddp"][0] == [1.0, 2.0, 4.0] and lines["ddp"][1] == pytest.approx([1.0, 80 / 42, 3.0])
    assert lines[IDEAL] == ([1.0, 2.0, 4.0], [1.0, 2.0, 4.0])
    fig = report_plots.throughput_figure(groups)
    assert report_plots.bar_heights(fig) == {"samples/s": [42.0, 80.0, 126.0]}
    # The error bar of each point spans its repeats' min to max.
    caps = sorted(round(y, 1) for line in fig.axes[0].get_lines() for y in line.get_ydata())
    assert caps == [40.0, 44.0, 70.0, 84.0, 120.0, 140.0]
    assert report_plots.bar_labels(groups) == ["ddp\n(single)\n1 proc", "ddp\n2 proc", "ddp\n4 proc"]
    assert report_plots.speedup_figure(groups[:1]) is None


def test_gpu_run_shows_allocated_memory_and_mfu(tmp_path: Path) -> None:
    run = fake_metrics(tmp_path / "gpu-ddp", "ddp", 8, 900.0, 3.0, gpu=7.5)
    _, groups, _ = report_data.build_groups([run])
    cells = dict(zip(report.COLUMNS, report.cells(groups[0])))
    assert cells["MFU"] == "41.2%" and cells["peak memory/rank max / mean"] == "7.50 / 6.75 GiB (GPU allocated)"
    heights = report_plots.bar_heights(report_plots.memory_figure(groups))
    assert heights == {report_plots.GPU_SERIES: [7.5], report_plots.HOST_SERIES: [3.0]}


def test_plots_are_pngs_with_the_runs_figures(runs: Path, tmp_path: Path) -> None:
    from matplotlib.image import imread

    groups, paths = report.build_report([runs / "single", runs / "ddp", runs / "zero2"], tmp_path / "report")
    for name in ("throughput", "memory"):
        assert paths[name].read_bytes()[:8] == PNG_MAGIC
        image = imread(paths[name])
        assert image.shape[0] > 200 and image.shape[1] > 300 and image.std() > 0.01, f"{name}.png looks blank"
    assert report_plots.bar_heights(report_plots.throughput_figure(groups)) == {"samples/s": [40.0, 60.0, 50.0]}
    fig = report_plots.memory_figure(groups)
    heights = report_plots.bar_heights(fig)
    gpu_label = report_plots.GPU_SERIES + " (none: CPU runs)"
    assert heights == {gpu_label: [0.0, 0.0, 0.0], report_plots.HOST_SERIES: [0.5, 0.6, 0.55]}
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == [gpu_label, report_plots.HOST_SERIES]
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["single", "ddp", "zero2\n+offload(optimizer)"]


def test_shared_strategy_bars_are_labelled_by_run(tmp_path: Path) -> None:
    a = fake_metrics(tmp_path / "single-pad192", "single", 1, 30.0, 0.5)
    b = fake_metrics(tmp_path / "single-grouped", "single", 1, 45.0, 0.5)
    _, groups, base = report_data.build_groups([a, b])
    assert base is not None and base.label == "single-pad192" and groups[1].vs_baseline == 1.5
    assert report_plots.bar_labels(groups) == ["single-pad192\n(single)", "single-grouped\n(single)"]


def test_errors_name_the_run_dir(runs: Path, tmp_path: Path) -> None:
    empty = tmp_path / "crashed-run"
    empty.mkdir()
    with pytest.raises(report_data.ReportError, match="crashed-run.*no metrics.json"):
        report.build_report([runs / "single", empty], tmp_path / "report")
    with pytest.raises(report_data.ReportError, match="crashed-run.*no metrics.json"):
        report_data.load_metrics(empty)
    (empty / "metrics.json").write_text("{not json")
    with pytest.raises(report_data.ReportError, match="crashed-run.*not valid JSON"):
        report.build_report([empty])
    with pytest.raises(report_data.ReportError, match="--baseline nope"):
        report_data.build_groups([runs / "single"], baseline="nope")


def test_bench_runs_share_the_reports_wandb_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qa_train.studies import bench
    from qa_train.studies.sweep import Point

    monkeypatch.delenv("WANDB_RUN_GROUP", raising=False)
    opts = bench.parse(["--output_dir", str(tmp_path / "study"), "--cpu"])[0]
    env = bench.run_env(Point("zero2", "zero2", 2), opts)
    assert (env["WANDB_RUN_GROUP"], env["WANDB_JOB_TYPE"]) == ("bench-study", "zero2")
    assert report.wandb_group([tmp_path / "study" / "zero2-p2-r1", tmp_path / "study" / "ddp-p2-r1"]) == "bench-study"
    monkeypatch.setenv("WANDB_RUN_GROUP", "mine")
    assert bench.run_env(Point("ddp", "ddp", 1), opts)["WANDB_RUN_GROUP"] == "mine"


@pytest.mark.parametrize("on_cpu", [True, False])
def test_ablation_flips_one_real_flag_per_run(on_cpu: bool) -> None:
    from qa_train.config.flags import parse_args
    from qa_train.studies import bench

    plans = bench.ablation_plans(on_cpu)
    assert plans[0].label == "default" and plans[0].name == "default-p1-r1" and plans[0].extra == []
    assert len({p.name for p in plans}) == len({p.label for p in plans}) == len(plans)
    defaults = parse_args(["--offline_demo"]).to_dict()
    for plan in plans[1:]:
        args = parse_args(["--offline_demo", *plan.extra]).to_dict()  # a misspelt flag would be refused here
        flipped = [name for name in defaults if args[name] != defaults[name]]
        assert len(flipped) == 1, (plan.name, flipped)
    cuda_only = {"fp32", "unfused-adamw", "no-workers"}
    assert ({p.label for p in plans} & cuda_only) == (set() if on_cpu else cuda_only)
    assert plans[-1].label == "gradient-checkpointing"  # the trade-off last: a run cut short keeps the speed flips


def test_ablation_leaves_out_checkpointing_for_a_family_without_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An MPNet (or ALBERT) ablation used to end with a run that training refuses at its start: reported as failed
    after every other run, exit status 1. The plan now leaves the flip out and says why, as it skips FSDP on CPU."""
    from qa_train.studies import bench

    mpnet = tmp_path / "mpnet"
    mpnet.mkdir()
    (mpnet / "config.json").write_text(
        json.dumps(
            {
                "model_type": "mpnet",
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "intermediate_size": 64,
            }
        )
    )

    def labels(*user: str) -> list[str]:
        opts, user_flags = bench.parse(["--ablation", "--cpu", "--", *user])
        flags = [*bench.model_and_data_defaults(user_flags), *bench.DEFAULT_FLAGS, *user_flags]
        return [p.label for p in bench.sweep_plans(opts, flags)]

    without = labels("--config_name", str(mpnet), "--tokenizer_name", str(TINY))
    assert "gradient-checkpointing" not in without and without[0] == "default" and len(without) > 2
    assert (
        "skipping gradient-checkpointing: MPNetForQuestionAnswering (model type 'mpnet') does not support "
        "activation checkpointing" in capsys.readouterr().out
    )
    assert labels()[-1] == "gradient-checkpointing"  # the bundled tiny BERT
    assert labels("--model_name_or_path", "bert-base-uncased")[-1] == "gradient-checkpointing"  # a built-in shape
    assert labels("--config_name", str(tmp_path / "nowhere"))[-1] == "gradient-checkpointing"  # the run will say
    assert "skipping" not in capsys.readouterr().out


def test_a_failed_runs_reason_is_its_own_error_line(tmp_path: Path) -> None:
    """Which configs did not fit is itself a result of a strategy comparison: the report says "out of memory ..."
    where the run said it, not only that metrics.json is missing."""
    root = tmp_path / "sweep"
    sweep(root, "ddp", "ddp", {1: [40.0], 2: [70.0]}, {1: 8, 2: 8})
    (root / "ddp-p2-r1" / "metrics.json").unlink()
    oom = (
        "rank 1: out of memory at training step 1 (a 2.25 GiB allocation on a 79.11 GiB GPU; a micro-batch of 64 "
        "windows x 384 tokens): lower --per_device_train_batch_size"
    )
    (root / "ddp-p2-r1" / "launch.log").write_text(
        f"+ accelerate launch ...\n12:00:01 INFO qa_train: training 30 steps\nqa_train: error: {oom}\n"
        "qa_train: error: rank 0: another rank left the run during a collective (its own lines say why)\n"
        "qa-train launch: rank 1 exited with 7 (its own lines above say why)\n"
    )
    (root / "ddp-p1-r1" / "launch.log").write_text("+ accelerate launch ...\n")  # finished: its figures count
    groups, paths = report.build_report([root], tmp_path / "report")
    by = {g.processes: g for g in groups}
    assert by[2].failed == [f"ddp-p2-r1: {oom}"] and by[1].runs == ["ddp-p1-r1"]
    assert f"ddp-p2-r1: {oom}" in paths["markdown"].read_text()


def test_a_sweeps_failed_and_torn_runs_are_rows_and_speedup_names_its_base(tmp_path: Path) -> None:
    """The 1-process point failed, one repeat at 2 processes left a torn metrics.json: neither vanishes nor stops
    the report, and speed-up is against the smallest point that has a throughput, named in the notes."""
    root = tmp_path / "sweep"
    sweep(root, "ddp", "ddp", {1: [40.0], 2: [70.0, 99.0], 4: [126.0]}, {1: 8, 2: 8, 4: 8})
    (root / "ddp-p1-r1" / "metrics.json").unlink()  # failed: the bench wrote sweep_point.json, the run nothing
    (root / "ddp-p2-r2" / "metrics.json").write_text('{"strategy": "ddp", "world_si')  # killed mid-write
    groups, paths = report.build_report([root], tmp_path / "report")
    by = {g.processes: g for g in groups}
    assert list(by) == [1, 2, 4] and by[1].runs == [] and by[2].runs == ["ddp-p2-r1"]
    assert by[1].failed == ["ddp-p1-r1: no metrics.json (did the run finish?)"]
    assert by[2].failed[0].startswith("ddp-p2-r2: metrics.json is not valid JSON")
    assert by[2].figures.samples_per_s.median == 70.0  # the torn repeat is not a zero
    assert by[1].speedup is None and by[2].speedup.median == 1.0 and by[2].scale_base == "ddp x2"
    assert by[4].speedup.median == pytest.approx(1.8) and by[4].efficiency.median == pytest.approx(0.9)  # 4 vs 2
    rows = {r["processes"]: r for r in table_rows(paths["markdown"].read_text())}
    assert rows["1"]["runs"] == "0 + 1 failed" and rows["1"]["samples/s"] == report.DASH
    assert rows["2"]["runs"] == "1 + 1 failed" and rows["4"]["efficiency"] == "90%"
    text = paths["markdown"].read_text()
    assert "Speed-up bases: `ddp x2`." in text and "ddp-p1-r1: no metrics.json" in text and "ddp-p2-r2" in text
    # A run dir outside a sweep still has to hold a readable run (test_errors_name_the_run_dir).


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("null", "not in the layout this qa_train reads"),
        (
            '{"strategy": "ddp", "world_size": 2, "train_samples_per_second": 1.0, "peak_memory_gb": 0.5}',
            "peak_memory_gb not per-rank figures",
        ),
    ],
)
def test_metrics_of_another_layout_are_one_line_not_a_traceback(content: str, message: str, tmp_path: Path) -> None:
    run = tmp_path / "old-run"
    run.mkdir()
    (run / "metrics.json").write_text(content)
    with pytest.raises(report_data.ReportError, match=f"old-run: .*{message}"):
        report.build_report([run], tmp_path / "report")


def test_no_timed_steps_is_no_throughput_in_the_table_plot_and_old_files(tmp_path: Path) -> None:
    """None (today's files) and 0 with timed_steps 0 (files from before) both read as "no throughput", never 0."""
    base = fake_metrics(tmp_path / "single", "single", 1, 40.0, 0.5)
    now = rewrite(
        fake_metrics(tmp_path / "resumed-done", "single", 1, 1.0, 0.5),
        train_samples_per_second=None,
        train_tokens_per_second=None,
        timed_steps=0,
    )
    old = rewrite(
        fake_metrics(tmp_path / "old-untimed", "single", 1, 1.0, 0.5),
        train_samples_per_second=0.0,
        train_tokens_per_second=0.0,
        timed_steps=0,
    )
    _, groups, _ = report_data.build_groups([base, now, old])
    for g in groups[1:]:
        cells = dict(zip(report.COLUMNS, report.cells(g)))
        assert (cells["samples/s"], cells["tokens/s"], cells["vs baseline"]) == (report.DASH,) * 3, g.label
    fig = report_plots.throughput_figure(groups)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "40.0" in texts and "0.0" not in texts and texts.count(report_plots.NO_DATA) == 2


def test_runs_of_other_models_or_lengths_are_labelled_apart_and_not_compared(tmp_path: Path) -> None:
    """A bench dir rerun at another --max_seq_length keeps the old points: a speed-up across them would compare
    different work (here an "efficiency" of 225%)."""
    root = tmp_path / "bench"
    rewrite(fake_metrics(root / "ddp-p1-r1", "single", 1, 20.0, 0.5, point=Point("ddp", "ddp", 1)), max_seq_length=384)
    rewrite(fake_metrics(root / "ddp-p2-r1", "ddp", 2, 90.0, 0.5, point=Point("ddp", "ddp", 2)), max_seq_length=128)
    groups, paths = report.build_report([root], tmp_path / "report")
    assert [g.label for g in groups] == ["ddp (seq 384)", "ddp (seq 128)"]
    assert all(g.speedup is None for g in groups) and [g.vs_baseline for g in groups] == [1.0, None]
    assert "more than one model or sequence length" in paths["markdown"].read_text()
    other = rewrite(
        fake_metrics(tmp_path / "large", "single", 1, 10.0, 0.5),
        {"config_name": "/models/bert-large"},
        max_seq_length=384,
    )
    _, groups, _ = report_data.build_groups([root / "ddp-p1-r1", other])
    assert [g.label for g in groups] == ["ddp (model ?)", "large (bert-large)"]  # the fake runs name no model


def test_the_same_point_in_two_sweeps_is_not_merged_and_a_run_counts_once(tmp_path: Path) -> None:
    for name, rate in (("before", 40.0), ("after", 60.0)):
        sweep(tmp_path / name, "ddp", "ddp", {1: [rate], 2: [2 * rate]}, {1: 8, 2: 8})
    groups, _ = report.build_report([tmp_path / "before", tmp_path / "after"], tmp_path / "report")
    assert [(g.label, g.processes, g.runs) for g in groups] == [
        ("before/ddp", 1, ["ddp-p1-r1"]),
        ("before/ddp", 2, ["ddp-p2-r1"]),
        ("after/ddp", 1, ["ddp-p1-r1"]),
        ("after/ddp", 2, ["ddp-p2-r1"]),
    ]
    assert [g.speedup.median for g in groups] == [1.0, 2.0, 1.0, 2.0]
    # One run given as itself and within its parent is one run, not two repeats.
    _, groups, _ = report_data.build_groups(
        report_data.find_runs([tmp_path / "before", tmp_path / "before" / "ddp-p1-r1"])
    )
    assert [len(g.runs) for g in groups] == [1, 1]
    # Two run dirs with one --run_name are told apart by their folders.
    a = rewrite(fake_metrics(tmp_path / "adhoc" / "a", "single", 1, 30.0, 0.5), {"run_name": "exp"})
    b = rewrite(fake_metrics(tmp_path / "adhoc" / "b", "single", 1, 45.0, 0.5), {"run_name": "exp"})
    _, groups, _ = report_data.build_groups([a, b])
    assert [(g.label, g.runs) for g in groups] == [("a", ["exp"]), ("b", ["exp"])]


def test_a_local_and_a_slurm_sweep_of_one_config_plot_as_separate_bars(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for point, world in (
        (Point("ddp", "ddp", 2), 2),
        (Point("ddp", "ddp", 4), 4),
        (Point("ddp", "ddp", 8, nodes=2, slurm=True), 8),
    ):
        fake_metrics(root / point.name, "ddp", world, 10.0 * world, 0.5, point=point)
    _, groups, _ = report_data.build_groups(report_data.find_runs([root]))
    labels = report_plots.bar_labels(groups)
    assert len(set(labels)) == 3, labels
    assert report_plots.bar_heights(report_plots.throughput_figure(groups)) == {"samples/s": [20.0, 40.0, 80.0]}


def test_each_config_is_held_to_its_own_ideal_speedup(tmp_path: Path) -> None:
    """zero2's 1-process run failed, so its speed-up is against 2 processes: its ideal is N/2, not N."""
    root = tmp_path / "sweep"
    sweep(root, "ddp", "ddp", {1: [40.0], 2: [80.0]}, {1: 8, 2: 8})
    sweep(root, "zero2", "zero2", {1: [30.0], 2: [50.0], 4: [100.0]}, {1: 8, 2: 8, 4: 8})
    (root / "zero2-p1-r1" / "metrics.json").unlink()
    _, groups, _ = report_data.build_groups(report_data.find_runs([root]))
    lines = report_plots.line_data(report_plots.speedup_figure(groups))
    assert lines[f"{IDEAL}, from 1"] == ([1.0, 2.0], [1.0, 2.0])
    assert lines[f"{IDEAL}, from 2"] == ([2.0, 4.0], [1.0, 2.0])
    assert lines["zero2"] == ([2.0, 4.0], [1.0, 2.0])


def test_a_config_rerun_on_another_device_or_precision_is_neither_repeat_nor_speedup_base(tmp_path: Path) -> None:
    """A sweep dir rerun on a GPU (bf16, 2 repeats) keeps the CPU sweep's points and its third repeat: merged, the
    2-process median mixed both devices (range 70-901) and its "speed-up" over the CPU run was the hardware's."""
    root = tmp_path / "bench"
    sweep(root, "ddp", "ddp", {1: [40.0, 40.0, 40.0], 2: [70.0, 70.0, 70.0]}, {1: 8, 2: 8})
    for k in (1, 2):
        rewrite(
            root / f"ddp-p2-r{k}",
            device="NVIDIA H100 80GB HBM3",
            mixed_precision="bf16",
            train_samples_per_second=900.0 + k,
        )
    groups, paths = report.build_report([root], tmp_path / "report")
    by = {(g.label, g.processes): g for g in groups}
    cpu, gpu = "ddp (cpu, fp32)", "ddp (NVIDIA H100 80GB HBM3, bf16)"
    assert list(by) == [(cpu, 1), (cpu, 2), (gpu, 2)]
    assert by[cpu, 2].runs == ["ddp-p2-r3"] and by[gpu, 2].runs == ["ddp-p2-r1", "ddp-p2-r2"]
    assert by[cpu, 2].speedup.median == pytest.approx(70 / 40) and by[gpu, 2].speedup is None
    assert by[gpu, 2].figures.samples_per_s.lo == 901.0
    text = paths["markdown"].read_text()
    assert f"more than one device or precision (cpu, fp32: `{cpu}`; NVIDIA H100 80GB HBM3, bf16: `{gpu}`)" in text
    # Across configs another precision is what an ablation measures: compared, and the labels stay as they were.
    default = fake_metrics(tmp_path / "ablation" / "default", "single", 1, 50.0, 0.5)
    fp32 = fake_metrics(tmp_path / "ablation" / "fp32", "single", 1, 25.0, 0.5)
    rewrite(default, mixed_precision="bf16")
    _, groups, _ = report_data.build_groups([default, fp32])
    assert [(g.label, g.vs_baseline) for g in groups] == [("default", 1.0), ("fp32", 0.5)]


def test_a_pipe_in_a_run_name_stays_in_its_cell(tmp_path: Path) -> None:
    import re

    run = rewrite(fake_metrics(tmp_path / "lr-sweep", "single", 1, 40.0, 0.5), {"run_name": "lr=1e-3|bs=16"})
    _, groups, _ = report_data.build_groups([run])
    (line,) = [line for line in report.markdown_table(groups).splitlines()[2:]]
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))]  # markdown's own reading: \| is text
    assert len(cells) == len(report.COLUMNS) and cells[0] == r"lr=1e-3\|bs=16"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"train_samples_per_second": float("nan")}, r"train_samples_per_second=nan not a finite number or null"),
        ({"f1": float("inf")}, r"f1=inf not a finite number or null"),
        ({"train_samples_per_second": "37.7"}, r"train_samples_per_second='37.7' not a finite number or null"),
        ({"args": None}, r"args is not the object of the run's flags"),
    ],
)
def test_figures_that_are_not_numbers_are_one_line_or_a_failed_run(changes: dict, message: str, tmp_path: Path) -> None:
    """NaN printed `nan` and `nanx` as if measured; a string or a null args ended in a traceback."""
    run = fake_metrics(tmp_path / "edited", "single", 1, 40.0, 0.5)
    payload = json.loads((run / "metrics.json").read_text())
    (run / "metrics.json").write_text(json.dumps({**payload, **changes}))
    with pytest.raises(report_data.ReportError, match=f"edited: metrics.json: {message}"):
        report_data.build_groups([run])
    # In a sweep the run is a failed one of its point, as a torn metrics.json is.
    point = fake_metrics(tmp_path / "sweep" / "ddp-p1-r1", "single", 1, 40.0, 0.5, point=Point("ddp", "ddp", 1))
    (point / "metrics.json").write_text(json.dumps({**payload, **changes}))
    _, (group,), _ = report_data.build_groups([point])
    assert group.runs == [] and group.failed[0].startswith("ddp-p1-r1: metrics.json: ")


def test_a_bad_output_or_a_file_for_a_run_dir_is_one_line(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = runs / "single" / "metrics.json"
    for output in (metrics, metrics / "report"):  # an existing file; a path through one
        assert report.main([str(runs / "single"), "--output_dir", str(output)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"qa-train report: error: --output_dir {output}: cannot write the report there (")
        assert err.count("\n") == 1
    assert report.main([str(metrics), "--output_dir", str(tmp_path / "out")]) == 2
    assert "metrics.json: a file, not a run directory" in capsys.readouterr().err


def test_a_folder_holding_files_no_report_wrote_is_refused_and_left_as_it_was(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "report.md").write_text("my own notes\n")
    (mine / "speedup.png").write_bytes(b"my own plot")
    assert report.main([str(runs / "single"), "--output_dir", str(mine)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"qa-train report: error: --output_dir {mine}: holds report.md, speedup.png, which no qa-train report "
        "wrote; name a new folder, or one that an earlier report wrote\n"
    )
    assert sorted(p.name for p in mine.iterdir()) == ["report.md", "speedup.png"]
    assert (mine / "report.md").read_text() == "my own notes\n"
    assert (mine / "speedup.png").read_bytes() == b"my own plot"


def test_a_report_rewrites_its_own_folder_beside_other_files_and_drops_its_stale_speedup_plot(
    runs: Path, tmp_path: Path
) -> None:
    root, out = tmp_path / "sweep", tmp_path / "report"
    sweep(root, "ddp", "ddp", {1: [40.0, 41.0], 2: [78.0, 79.0]}, {1: 16, 2: 8})
    out.mkdir()
    (out / "notes.txt").write_text("kept\n")  # a file of the user's that no report writes
    assert report.main([str(root), "--output_dir", str(out)]) == 0
    assert (out / "speedup.png").is_file()
    assert report.main([str(runs / "single"), "--output_dir", str(out)]) == 0  # one run: no speed-up to draw
    assert sorted(p.name for p in out.iterdir()) == [
        "memory.png",
        "notes.txt",
        "report.json",
        "report.md",
        "throughput.png",
    ]
    assert (out / "notes.txt").read_text() == "kept\n"
    assert "| single |" in (out / "report.md").read_text()


@pytest.mark.parametrize("flag", ["--output_dir", "--output"])
def test_the_report_folder_is_named_as_other_verbs_name_theirs_or_by_its_earlier_flag(
    flag: str, runs: Path, tmp_path: Path
) -> None:
    """--output_dir, as bench, predict and consolidate and transformers' scripts; --output still works."""
    out = tmp_path / "mine"
    assert report.main([str(runs / "single"), flag, str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["memory.png", "report.json", "report.md", "throughput.png"]


def test_scores_of_other_evaluation_sets_are_named_apart(runs: Path, tmp_path: Path) -> None:
    """A v1.1 and a v2.0 run read as 11.0 against 60.0 EM, as if one trained better: a note says they do not
    compare."""
    v1 = rewrite(fake_metrics(tmp_path / "v1", "single", 1, 40.0, 0.5, em=11.0, f1=21.0), {"dataset_name": "squad"})
    v2 = rewrite(
        fake_metrics(tmp_path / "v2", "single", 1, 40.0, 0.5, em=60.0, f1=62.0),
        {"dataset_name": "squad_v2", "version_2_with_negative": True},
        squad_v2={"exact": 60.0, "f1": 62.0},
    )
    _, groups, base = report_data.build_groups([v1, v2])
    assert "EM / F1 are over more than one evaluation set (squad v1.1: `v1`; squad_v2 v2.0: `v2`)" in " ".join(
        report.notes(groups, base)
    )
    _, groups, base = report_data.build_groups(report_data.find_runs([runs]))  # one set (zero2 has no scores): no note
    assert not any("evaluation set" in line for line in report.notes(groups, base))


# --- how far a comparison can be trusted: repeats and the machine's load ------------------------------------


def test_others_cpu_is_the_busiest_nodes_less_its_own_ranks() -> None:
    from qa_train.observe.machine import others_on_busiest_node

    # one node, two ranks: each saw the node 2.5 cores busy, and they took 1.0 each
    assert others_on_busiest_node([1.0, 1.0], [2.5, 2.4], 2) == pytest.approx(0.5)
    # two nodes: the second's neighbours took 3 cores; the first's ranks had it to themselves (never below 0)
    assert others_on_busiest_node([1.0, 1.0, 1.0, 1.0], [1.9, 1.8, 5.0, 4.0], 2) == pytest.approx(3.0)
    assert others_on_busiest_node([1.2], [1.0], 1) == 0.0


def test_the_load_meter_counts_this_processs_cpu_and_the_nodes() -> None:
    import os
    import time

    import psutil

    from qa_train.observe.machine import LoadMeter

    meter = LoadMeter()
    end = time.process_time() + 0.3
    while time.process_time() < end:  # 0.3 s of this process's own CPU
        pass
    load = meter.read()
    # Loosely: on a shared machine the wall time can be several times the CPU time.
    assert 0.05 < load.own_cpu_cores <= 1.1 and load.node_busy_cores >= load.own_cpu_cores * 0.8
    assert load.cpu_count == psutil.cpu_count() and load.load_average_1m == pytest.approx(os.getloadavg()[0], abs=2)


def loaded(root: Path, name: str, cores: float) -> None:
    rewrite(root / name, other_processes_cpu_cores=cores, load_average_1m=cores + 1.0, cpu_count=2)


def test_a_speedup_from_one_repeat_or_under_load_gets_a_warning_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    root = tmp_path / "sweep"
    sweep(root, "ddp", "ddp", {1: [40.0], 2: [378.0]}, {1: 16, 2: 8})  # a 9.45x from one run each
    groups, paths = report.build_report([root], tmp_path / "report")
    assert json.loads(paths["json"].read_text())["warnings"] == [
        "warning: ddp x2 speed-up 9.45x over ddp x1 rests on one run of ddp x2 and of ddp x1"
    ]
    loaded(root, "ddp-p2-r1", 1.5)
    assert report.main([str(root), "--output", str(tmp_path / "report2")]) == 0
    lines = capsys.readouterr().out.splitlines()
    under_table = lines[max(i for i, line in enumerate(lines) if line.startswith("|")) + 1]
    assert under_table == (
        "warning: ddp x2 speed-up 9.45x over ddp x1 rests on one run of ddp x2 and of ddp x1; "
        "ddp x2 ran under load (other processes kept 1.5 of 2 cores busy, load average 2.5)"
    )
    assert "- warning: ddp x2 speed-up" in (tmp_path / "report2" / "report.md").read_text()


def test_repeats_on_a_quiet_machine_give_no_warning(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    sweep(root, "ddp", "ddp", {1: [40.0, 41.0], 2: [70.0, 72.0]}, {1: 16, 2: 8})
    for name in ("ddp-p1-r1", "ddp-p1-r2", "ddp-p2-r1", "ddp-p2-r2"):
        loaded(root, name, 0.2)  # below BUSY_CORES: noise of the machine's own
    _, paths = report.build_report([root], tmp_path / "report")
    assert json.loads(paths["json"].read_text())["warnings"] == []
    loaded(root, "ddp-p1-r2", 0.9)  # the speed-up's base measured under load
    _, paths = report.build_report([root], tmp_path / "report3")
    [line] = json.loads(paths["json"].read_text())["warnings"]
    assert line.startswith("warning: ddp x2 speed-up") and "ddp x1 ran under load (other processes kept 0.9" in line


def test_bench_runs_log_to_wandb_unless_told_not_to() -> None:
    from qa_train.studies import bench

    assert "--report_to" not in bench.DEFAULT_FLAGS, "the run's default (wandb, offline without credentials)"


def test_a_plot_that_fails_to_save_keeps_the_earlier_one_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.figure import Figure

    earlier = tmp_path / "throughput.png"
    earlier.write_bytes(PNG_MAGIC + b"earlier")

    def full_disk(self: Figure, fname: object, **kwargs: object) -> None:
        Path(str(fname)).write_bytes(b"half a")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    with pytest.raises(OSError) as failed:
        report_plots.save_figure(Figure(), earlier)
    assert failed.value.filename == str(earlier)  # the plot's name, not the temporary file's
    assert earlier.read_bytes() == PNG_MAGIC + b"earlier" and sorted(tmp_path.iterdir()) == [earlier]
