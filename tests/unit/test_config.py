"""Bad flags are refused before anything is loaded, with a message naming the flag."""

from __future__ import annotations

import pytest
from conftest import DEMO_DEV

from qa_train.config.flags import parse_args
from qa_train.config.settings import ConfigError, every_n_steps


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--max_train_steps", "-1"], "--max_train_steps"),
        (["--doc_stride", "384"], "--doc_stride"),
        (["--doc_stride", "400", "--max_seq_length", "256"], "--doc_stride"),
        (["--train_file", "/nonexistent/train.json"], "--train_file"),
        (["--validation_file", "/nonexistent/dev.json"], "--validation_file"),
        (["--per_device_train_batch_size", "0"], "--per_device_train_batch_size"),
        (["--learning_rate", "0"], "--learning_rate"),
        (["--warmup_ratio", "1.5"], "--warmup_ratio"),
        (["--lr_scheduler_type", "zigzag"], "--lr_scheduler_type"),
        (["--checkpointing_steps", "often"], "--checkpointing_steps"),
        (["--resume_from_checkpoint", "/nonexistent/ckpt"], "--resume_from_checkpoint"),
        (["--save_total_limit", "0"], "--save_total_limit"),
        (["--attn_implementation", "flash"], "--attn_implementation"),
        (["--do_predict"], "--do_predict.*--test_file"),
        (["--test_file", str(DEMO_DEV)], "--test_file.*--do_predict"),
        (["--do_predict", "--test_file", "/nonexistent/test.json"], "--test_file"),
        (["--max_predict_samples", "-1"], "--max_predict_samples"),
        (["--null_score_diff_threshold", "nan"], "--null_score_diff_threshold"),
        (["--seed", "-1"], "--seed"),
        (["--max_train_samples", "0"], "--max_train_samples: must be at least 1"),
        (["--max_eval_samples", "0"], "--max_eval_samples"),
        (["--save_total_limit", "2"], "--save_total_limit: .*--checkpointing_steps"),
        (["--torch_compile_mode", "fastest"], "--torch_compile_mode"),
        (["--torch_compile_backend", "fastest"], "--torch_compile_backend: 'fastest' is not one of torch's"),
        (
            ["--torch_compile_backend", "aot_eager", "--torch_compile_mode", "reduce-overhead"],
            "--torch_compile_mode: 'reduce-overhead' is an inductor mode",
        ),
        (["--logging_steps", "0"], "--logging_steps: must be positive"),
        # Accepted silently (issue 38, case 15), as --wandb_log_model without wandb is not.
        (
            ["--eval_strategy", "steps", "--no_eval"],
            "^--no_eval: contradicts --eval_strategy steps, which evaluates during training: drop one of them$",
        ),
        (["--eval_strategy", "epoch", "--no_eval", "--save_best"], "--no_eval: contradicts --eval_strategy epoch"),
        (["--logging_steps", "2.5"], "--logging_steps: 2.5 is neither a whole number"),
        (["--eval_strategy", "steps", "--eval_steps", "-0.1"], "--eval_steps: must be positive"),
        (["--eval_strategy", "steps", "--eval_steps", "1.5"], "--eval_steps: 1.5 is neither"),
        # A local file beside an implicit hub split would mix sources without saying so.
        (["--train_file", str(DEMO_DEV)], "--train_file: .*--validation_file.*--no_eval"),
        (["--validation_file", str(DEMO_DEV)], "--validation_file: .*--train_file"),
        # torch.optim.AdamW refuses these with a traceback only once the model is built (after
        # --overwrite_output_dir has removed the old run); inf passes a sign check and fails mid-run.
        (["--adam_beta1", "1.5"], "--adam_beta1: must be in \\[0, 1\\)"),
        (["--adam_beta2", "1"], "--adam_beta2: must be in \\[0, 1\\)"),
        (["--adam_epsilon", "-1e-8"], "--adam_epsilon: must not be negative"),
        (["--num_train_epochs", "inf"], "--num_train_epochs: must be a finite number"),
        (["--learning_rate", "inf"], "--learning_rate: must be a finite number"),
        (["--weight_decay", "inf"], "--weight_decay: must be a finite number"),
        # Logging the model needs a W&B run and an exported model; without either the flag did nothing.
        (["--wandb_log_model", "--report_to", "none"], "--wandb_log_model: .*--report_to none"),
        (["--wandb_log_model", "--report_to", "tensorboard"], "--wandb_log_model: .*add wandb to --report_to"),
        (["--wandb_log_model", "--save_final_model", "false"], "--wandb_log_model: .*--save_final_model false"),
    ],
)
def test_impossible_values_name_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        parse_args(argv)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--max_seq_lenght", "128"], "unknown flag --max_seq_lenght: did you mean --max_seq_length?"),
        (["--fp16"], "unknown flag --fp16: --mixed_precision fp16"),
        (
            ["--with_tracking", "--max_steps=3"],
            "--with_tracking: qa_train tracks by default; choose trackers with "
            "--report_to; unknown flag --max_steps: --max_train_steps",
        ),
        (["--logging_steps", "x"], "argument --logging_steps: invalid float value: 'x'"),
    ],
)
def test_unknown_flags_are_refused_in_one_line_saying_where_to_go(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("qa_train: error: ") and says in line


def test_trainer_spellings_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_args(["--eval_on_start"]).eval.eval_on_start is True
    assert parse_args(["--eval_before_training"]).eval.eval_on_start is True  # the earlier name still works
    assert parse_args(["--report_to", "wandb", "tensorboard"]).output.trackers == ["wandb", "tensorboard"]
    assert parse_args(["--report_to", "wandb,tensorboard"]).output.trackers == ["wandb", "tensorboard"]
    assert parse_args([]).output.wandb_project == "qa-train"
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    assert parse_args([]).output.wandb_project == "from-env"
    assert parse_args(["--wandb_project", "flag"]).output.wandb_project == "flag"


@pytest.mark.parametrize(
    ("value", "total", "every"),
    [(10, 1000, 10), (10.0, 3, 10), (0.1, 1000, 100), (0.1, 95, 10), (0.001, 50, 1), (0.5, 1, 1)],
)
def test_a_share_below_one_is_that_share_of_the_run_rounded_up(value: float, total: int, every: int) -> None:
    assert every_n_steps(value, total) == every


def test_defaults_follow_transformers_examples() -> None:
    args = parse_args([])
    assert (args.model.model_name_or_path, args.data.dataset_name, args.data.max_seq_length, args.data.doc_stride) == (
        "bert-base-uncased",
        "squad",
        384,
        128,
    )
    assert (
        args.optim.learning_rate,
        args.optim.num_train_epochs,
        args.eval.n_best_size,
        args.eval.max_answer_length,
    ) == (3e-5, 2.0, 20, 30)
    assert (args.data.version_2_with_negative, args.eval.null_score_diff_threshold, args.eval.do_predict) == (
        False,
        0.0,
        False,
    )
    assert args.model.attn_implementation == "auto"  # SDPA where the family supports it, else eager
    assert parse_args(["--version_2_with_negative"]).data.dataset_name == "squad_v2"
    local = ["--train_file", str(DEMO_DEV), "--validation_file", str(DEMO_DEV)]
    assert parse_args(local).data.dataset_name is None  # nothing comes from the hub
    assert parse_args(["--train_file", str(DEMO_DEV), "--no_eval"]).data.dataset_name is None
    assert parse_args(["--train_file", str(DEMO_DEV), "--dataset_name", "squad"]).data.dataset_name == "squad"


def test_a_compile_mode_or_backend_asks_for_compiling() -> None:
    """As transformers' Trainer: naming any mode, default included, or any backend turns compiling on."""
    assert parse_args([]).system.torch_compile is False
    assert parse_args(["--torch_compile"]).system.compile_mode is None
    assert parse_args(["--torch_compile_mode", "default"]).system.torch_compile is True
    reduce = parse_args(["--torch_compile_mode", "reduce-overhead"]).system
    assert reduce.torch_compile is True and reduce.compile_mode == "reduce-overhead"
    assert parse_args(["--torch_compile_backend", "aot_eager"]).system.torch_compile is True
    assert parse_args(
        ["--torch_compile_backend", "inductor", "--torch_compile_mode", "max-autotune"]
    ).system.torch_compile


def test_gradient_checkpointing_is_trainers_flag_off_by_default_and_recorded() -> None:
    assert parse_args([]).system.gradient_checkpointing is False
    args = parse_args(["--gradient_checkpointing"])
    assert args.system.gradient_checkpointing is True and args.to_dict()["gradient_checkpointing"] is True
    assert parse_args(["--gradient_checkpointing", "false"]).system.gradient_checkpointing is False


def test_bool_flags_parse_both_ways() -> None:
    assert parse_args(["--pad_to_max_length"]).data.pad_to_max_length is True
    assert parse_args(["--pad_to_max_length", "false"]).data.pad_to_max_length is False
    assert parse_args(["--no_eval"]).eval.do_eval is False


def test_negative_values_in_any_float_spelling_are_values_not_flags() -> None:
    """argparse before Python 3.13 took `-1e-3` for a flag and refused it with "expected one argument"."""
    for text, value in [("-1e-3", -1e-3), ("-4.38", -4.38), ("-.5", -0.5), ("-2", -2.0)]:
        assert parse_args(["--null_score_diff_threshold", text]).eval.null_score_diff_threshold == value


def test_every_flag_lives_in_exactly_one_group_and_round_trips() -> None:
    import dataclasses

    from qa_train.config.flags import build_parser
    from qa_train.config.settings import GROUPS, TrainArgs

    names = [f.name for group in GROUPS.values() for f in dataclasses.fields(group)]
    assert len(names) == len(set(names)) == 67
    parser_flags = {a.dest for a in build_parser()._actions if a.dest != "help"}
    assert parser_flags == set(names)
    args = parse_args(
        [
            "--learning_rate",
            "1e-4",
            "--max_seq_length",
            "256",
            "--doc_stride",
            "64",
            "--no_eval",
            "--output_dir",
            "runs/x",
            "--mixed_precision",
            "bf16",
        ]
    )
    assert (args.optim.learning_rate, args.data.max_seq_length, args.eval.do_eval) == (1e-4, 256, False)
    assert (args.output.run_name, args.system.mixed_precision) == ("x", "bf16")  # run name defaults to the dir
    flat = args.to_dict()
    assert list(flat) == names and TrainArgs.from_flags(flat) == args
    with pytest.raises(ConfigError, match="unknown setting.*learning_rat"):
        TrainArgs.from_flags({**flat, "learning_rat": 1.0})


def test_help_lists_flags_under_their_groups(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = capsys.readouterr().out
    sections = [text.index(f"\n{name}:") for name in ("model", "data", "optim", "eval", "output", "system")]
    assert sections == sorted(sections)
    assert sections[1] < text.index("\n  --doc_stride") < sections[2] < text.index("\n  --learning_rate") < sections[3]


def test_a_named_pipe_as_data_is_not_a_regular_file_not_missing(tmp_path) -> None:
    """A FIFO as --train_file was refused as "does not exist" (issue 38, case 14)."""
    import os

    fifo = tmp_path / "train.json"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError) as err:
        parse_args(["--train_file", str(fifo), "--validation_file", str(DEMO_DEV)])
    assert (
        str(err.value) == f"--train_file: {str(fifo)!r} is not a regular file (a named pipe): save the data to a file"
    )
