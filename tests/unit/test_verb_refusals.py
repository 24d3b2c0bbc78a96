"""Every verb's refusal is one line, `qa-train VERB: error: ...`, exit 2, as the training parser's: argparse's
multi-line usage came first before, and flags that could do nothing were accepted."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DEMO_DEV, TINY

from qa_train import cli


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """`qa-train ARGV`'s one error line (its verb's prefix, exit 2, nothing else on stderr)."""
    try:
        code = cli.main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and err.endswith("\n") and err.count("\n") == 1, (code, err)
    assert err.startswith(f"qa-train {argv[0]}: error: "), err
    return err.rstrip("\n")


# A flag no verb has: argparse's own refusal, once per verb (required arguments may be named first).
@pytest.mark.parametrize("verb", sorted(set(cli.VERBS) - {"train"}))
def test_an_unknown_flag_is_one_line_for_every_verb(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    refusal([verb, "--no_such_flag"], capsys)


def test_help_is_still_argparses_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        cli.main(["report", "--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0 and out.startswith("usage: qa-train report") and "--wandb_project" in out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        # bench: flags after -- that the bench sets for every run itself were silently overridden.
        (
            ["bench", "--", "--max_train_steps", "5"],
            "--max_train_steps after --: the bench sets it for every run; use qa-train bench --max_train_steps "
            "(before --)",
        ),
        (["bench", "--", "--output_dir=runs/x"], "--output_dir after --: the bench sets it for every run"),
        (["bench", "--", "--run-name", "x"], "--run_name after --: the bench sets it for every run"),
        (["bench", "--", "--overwrite_output_dir"], "--overwrite_output_dir after --: the bench sets it"),
        (["bench", "--timeout_s", "nan"], "--timeout_s must be a positive finite number of seconds, got nan"),
        (["bench", "--timeout_s", "inf"], "--timeout_s must be a positive finite number of seconds, got inf"),
        (["bench", "--output_dir", ""], "--output_dir: is empty (an unset shell variable?); name the bench's folder"),
        # launch
        (
            ["launch", "--config_file", "c.yaml", "--main_process_port", "70000"],
            "--main_process_port: must be a port from 1 to 65535 (or 0: any free one), got 70000",
        ),
        (["launch", "--config_file", "c.yaml", "--main_process_port", "-1"], "--main_process_port: must be a port"),
        (["launch", "--config_file", "c.yaml", "--stop_grace_s", "nan"], "--stop_grace_s: must be a finite number"),
        (["launch", "--config_file", "c.yaml", "--stop_grace_s", "inf"], "--stop_grace_s: must be a finite number"),
        (["launch", "--config_file", "c.yaml", "--stop_grace_s", "-1"], "--stop_grace_s: must be a finite number"),
        # score: as training's and predict's --null_score_diff_threshold
        (["score", str(DEMO_DEV), "p.json", "-t", "nan"], "--na-prob-thresh: must be a finite number, got nan"),
        (["score", str(DEMO_DEV), "p.json", "-t", "-inf"], "--na-prob-thresh: must be a finite number, got -inf"),
        # report
        (["report", "runs", "--output_dir", ""], "--output_dir: is empty (an unset shell variable?); name the report"),
        (
            ["report", "runs", "--wandb_project", "x"],
            "--wandb_project: names the W&B project of --wandb, which is not given: add --wandb, or drop it",
        ),
        # predict: flags with no effect on what is asked
        (
            ["predict", str(TINY), "-q", "Who?", "-c", "Someone.", "--max_predict_samples", "2"],
            "--max_predict_samples: truncates --test_file's questions, and -q/-c ask one: drop it",
        ),
        (
            ["predict", str(TINY), "-q", "Who?", "-c", "Someone.", "--null_score_diff_threshold", "1"],
            "--null_score_diff_threshold: only decides SQuAD v2.0's empty answers: add --version_2_with_negative",
        ),
        (
            [
                "predict",
                str(TINY),
                "-q",
                "Who?",
                "-c",
                "x",
                "--version_2_with_negative",
                "--null_score_diff_threshold",
                "-inf",
            ],
            "--null_score_diff_threshold: must be a finite number, got -inf",
        ),
    ],
)
def test_a_verbs_flag_that_cannot_work_is_one_line_naming_it(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing a refusal might write lands in the repository
    if argv[0] == "bench":  # were the flag taken, the bench would stop at this config instead of running a sweep
        argv = ["bench", "--configs", "no_such_config", *argv[1:]]
    line = refusal(argv, capsys)
    assert line.startswith(f"qa-train {argv[0]}: error: {says}"), line


LONG = "x" * 300  # a name the OS refuses (ENAMETOOLONG), as root; EACCES on another user's run takes the same path


@pytest.mark.parametrize(
    "argv",
    [
        ["dashboard", LONG],
        ["report", LONG],
        ["report", str(TINY.parent), "--output_dir", LONG],
        ["describe", LONG],
        ["consolidate", LONG, "--output_dir", "out"],
        ["predict", LONG, "-q", "Who?", "-c", "Someone."],
        ["predict", str(TINY), "-q", "Who?", "-c", "Someone.", "--output_dir", LONG],
        ["plan", "--check", LONG],
        ["launch", "--config_file", LONG],
        ["bench", "--output_dir", LONG],
    ],
    ids=lambda argv: " ".join(argv).replace(LONG, "LONG"),
)
def test_a_path_the_os_refuses_is_one_line_naming_it(
    argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each was an OSError traceback (exit 1), or Python's "[Errno 36] File name too long: '...'"."""
    monkeypatch.chdir(tmp_path)
    line = refusal(argv, capsys)
    assert LONG in line and ": File name too long" in line and "Errno" not in line, line
