"""qa-train dashboard: the history plot is drawn from the step log, and a bad log is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qa_train.observe import dashboard


def write_log(run: Path, rows: list[dict]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    (run / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_every_panel_plots_its_logged_series(tmp_path: Path) -> None:
    rows = [{"step": 0, "eval/f1": 5.0, "eval/exact_match": 1.0}]
    rows += [{"step": s, "train/loss": 4.0 / s, "throughput/samples_per_second": 100.0 + s} for s in (10, 20, 30)]
    rows += [{"step": 30, "eval/f1": 40.0, "eval/exact_match": 30.0, "eval/runtime_s": 1.5}]
    write_log(tmp_path, rows)
    series = dashboard.read_history(tmp_path)
    assert series["eval/f1"] == [(0, 5.0), (30, 40.0)] and series["train/loss"][0] == (10, 0.4)
    fig = dashboard.history_figure(series, "run")
    lines = {
        ax.get_title(): [(line.get_label(), list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()]
        for ax in fig.axes
    }
    assert lines["training loss"] == [("loss", [10, 20, 30], [0.4, 0.2, 4.0 / 30])]
    assert lines["evaluation"] == [("f1", [0, 30], [5.0, 40.0]), ("exact_match", [0, 30], [1.0, 30.0])]
    assert lines["samples/s"][0][2] == [110.0, 120.0, 130.0]
    assert dashboard.main([str(tmp_path)]) == 0 and (tmp_path / "history.png").stat().st_size > 10_000


def test_a_torn_last_line_is_skipped_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A run still writing, or killed mid-write, ends its log in half a line: the history up to it is drawn."""
    log = tmp_path / "train_log.jsonl"
    log.write_text('{"step": 1, "train/loss": 1.0}\n{"step": 2, "train/loss": 0.5}\n{"step": 3, "train/lo')
    assert dashboard.main([str(tmp_path)]) == 0
    assert dashboard.read_history(tmp_path)["train/loss"] == [(1, 1.0), (2, 0.5)]
    assert (tmp_path / "history.png").is_file()
    warnings = {r.getMessage() for r in caplog.records if r.levelname == "WARNING"}
    assert len(warnings) == 1 and warnings.pop().startswith(f"{log}: line 3 ")


def test_a_broken_middle_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only the last line can be torn by an interrupted write: a bad one before it is refused."""
    (tmp_path / "train_log.jsonl").write_text(
        '{"step": 1, "train/loss": 1.0}\n{"step": 2, "train/lo\n{"step": 3, "train/loss": 0.5}\n'
    )
    assert dashboard.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"qa-train dashboard: error: {tmp_path / 'train_log.jsonl'}: line 2 is not JSON")
    assert not (tmp_path / "history.png").exists()


def test_a_run_without_training_steps_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_log(tmp_path, [{"step": 0, "eval/f1": 5.0}])
    assert dashboard.main([str(tmp_path)]) == 2
    assert "no training steps logged" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("run_is", "says"),
    [
        ("missing", "no such run directory"),
        ("a file", "a file, not a run directory (give the folder that holds train_log.jsonl)"),
        ("empty", "holds no train_log.jsonl (not a qa_train run's output dir)"),
        ("a log folder", "train_log.jsonl: is a directory, not a file"),
    ],
)
def test_a_run_dir_without_a_step_log_is_named(
    run_is: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each was the raw OSError text: "[Errno 2] No such file or directory: '.../train_log.jsonl'"."""
    run = tmp_path / "run"
    if run_is == "a file":
        run.write_text("x")
    elif run_is == "empty":
        run.mkdir()
    elif run_is == "a log folder":
        (run / "train_log.jsonl").mkdir(parents=True)
    assert dashboard.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert err == f"qa-train dashboard: error: {run}{'/' if run_is == 'a log folder' else ': '}{says}\n", err


@pytest.mark.parametrize("record", ['{"train/loss": 1.0}', '{"step": "a", "train/loss": 1.0}'])
def test_a_record_without_an_integer_step_is_named(
    record: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A record without a step was a KeyError traceback (exit 1); a text step, int()'s own message."""
    log = tmp_path / "train_log.jsonl"
    log.write_text('{"step": 1, "train/loss": 1.0}\n' + record + "\n")
    assert dashboard.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qa-train dashboard: error: {log}: record 2 has no integer step: "), err


@pytest.mark.parametrize(
    ("output", "says"),
    [
        ("run", "is a directory, not a file"),  # matplotlib wrote run.png beside it and said "wrote run"
        ("notes.txt/h.png", "{tmp}/notes.txt is a file, not a directory"),
        ("h.txt", "not the name of an image type matplotlib writes (.png, .svg, .pdf, ...)"),
        ("history", "not the name of an image type matplotlib writes (.png, .svg, .pdf, ...)"),
        ("/sys/qa_train_test_history.png", "/sys is not writable"),
    ],
)
def test_an_output_that_cannot_be_written_is_refused_before_drawing(
    output: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each was a traceback after the figure was drawn (exit 1), or a PNG written under another name."""
    write_log(tmp_path / "run", [{"step": 1, "train/loss": 1.0}])
    (tmp_path / "notes.txt").write_text("mine")
    target = tmp_path / output
    assert dashboard.main([str(tmp_path / "run"), "--output", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qa-train dashboard: error: --output {target}: {says.format(tmp=tmp_path)}"), err
    assert err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "run"]


def test_an_outputs_missing_folders_are_made(tmp_path: Path) -> None:
    """It was a FileNotFoundError traceback."""
    write_log(tmp_path, [{"step": 1, "train/loss": 1.0}])
    assert dashboard.main([str(tmp_path), "--output", str(tmp_path / "plots" / "h.svg")]) == 0
    assert (tmp_path / "plots" / "h.svg").read_text().startswith("<?xml")
