"""Bad flags are refused before anything is loaded, with a message naming the flag."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import DEMO_DEV, TINY

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
        # transformers' constant schedule has no warm-up: it was dropped silently.
        (["--lr_scheduler_type", "constant", "--warmup_ratio", "0.1"], "^--warmup_ratio: is a warm-up, and --lr_sch"),
        (["--lr_scheduler_type", "constant", "--num_warmup_steps", "5"], "^--num_warmup_steps: is a warm-up, and"),
        # --num_warmup_steps won, and the ratio was dropped silently.
        (
            ["--num_warmup_steps", "5", "--warmup_ratio", "0.1"],
            "^--warmup_ratio: 0.1 and --num_warmup_steps 5 both set the warm-up: give one$",
        ),
        (
            ["--lr_scheduler_type", "polynomial", "--learning_rate", "1e-7"],
            "^--learning_rate: 1e-07 is not above 1e-07, where --lr_scheduler_type polynomial decays to",
        ),
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
        (["--pad_to_multiple_of", "0"], "--pad_to_multiple_of: must be positive, got 0"),
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
        (["--adam_epsilon", "0"], "--adam_epsilon: must be above 0: AdamW divides by sqrt\\(v\\) \\+ eps"),
        (["--num_train_epochs", "inf"], "--num_train_epochs: must be a finite number"),
        # Adafactor is built from the learning rate alone: these were taken and did nothing.
        (["--optim", "adafactor", "--adam_beta1", "0.8"], "^--adam_beta1: is AdamW's, and --optim adafactor"),
        (["--optim", "adafactor", "--adam_beta2", "0.99"], "^--adam_beta2: is AdamW's, and --optim adafactor"),
        (["--optim", "adafactor", "--adam_epsilon", "1e-6"], "^--adam_epsilon: is AdamW's, and --optim adafactor"),
        (["--num_train_epochs", "0"], "--num_train_epochs: is 0, so the run would train no step"),
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
        args = parse_args(["--version_2_with_negative", "--null_score_diff_threshold", text])
        assert args.eval.null_score_diff_threshold == value


def test_every_flag_lives_in_exactly_one_group_and_round_trips() -> None:
    import dataclasses

    from qa_train.config.flags import build_parser
    from qa_train.config.settings import GROUPS, TrainArgs

    names = [f.name for group in GROUPS.values() for f in dataclasses.fields(group)]
    assert len(names) == len(set(names)) == 77
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


# --- the flags a transformers user types ---------------------------------------------------------------------


def test_hub_flags_reach_from_pretrained_and_the_token_is_never_recorded() -> None:
    from qa_train.model.modeling import hub_options

    typed = ["--model_revision", "v2.0", "--cache_dir", "/tmp/hub", "--token", "hf_secret", "--trust_remote_code"]
    args = parse_args(typed)
    assert hub_options(args.model) == {
        "revision": "v2.0",
        "cache_dir": "/tmp/hub",
        "token": "hf_secret",
        "trust_remote_code": True,
    }
    recorded = args.to_dict()
    assert recorded["token"] == "<given>" and "hf_secret" not in json.dumps(recorded)  # metrics.json, trackers
    default = parse_args([])
    assert (default.model.model_revision, default.model.token, default.to_dict()["token"]) == ("main", None, None)
    assert default.model.trust_remote_code is False


@pytest.mark.parametrize(
    ("typed", "says"),
    [
        ("--model_revison", "did you mean --model_revision?"),
        ("--log_levl", "did you mean --log_level?"),
        ("--tf23", "did you mean --tf32?"),
        ("--lerning_rate", "did you mean --learning_rate?"),
        # Far from every flag: no suggestion rather than an unrelated one (difflib named --n_best_size, --no_eval).
        ("--label_names", "python -m qa_train --help lists every flag"),
        ("--dataloader_drop_last", "python -m qa_train --help lists every flag"),
        ("--logging_first_step", "python -m qa_train --help lists every flag"),
        ("--tokenizer", "python -m qa_train --help lists every flag"),
    ],
)
def test_a_suggestion_is_made_only_for_a_close_typo(typed: str, says: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args([typed, "1"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == f"qa_train: error: unknown flag {typed}: {says}"


def test_edit_distance_counts_insertions_deletions_substitutions_and_swaps() -> None:
    from qa_train.config.flags import edit_distance

    assert edit_distance("", "abc") == 3 and edit_distance("kitten", "sitting") == 3
    assert edit_distance("max_seq_lenght", "max_seq_length") == 1  # one swap of neighbours
    assert edit_distance("model_revision", "mixed_precision") > 2 and edit_distance("token", "tokenizer_name") == 9


def test_dashes_in_a_flag_name_are_underscores() -> None:
    args = parse_args(["--output-dir=runs/x", "--per-device-train-batch-size", "4", "--do-eval", "false"])
    assert (args.output.output_dir, args.data.per_device_train_batch_size, args.eval.do_eval) == ("runs/x", 4, False)


def _flags_of_accelerate_launch() -> set[str]:
    from accelerate.commands.launch import launch_command_parser

    return {o for a in launch_command_parser()._actions for o in a.option_strings}


@pytest.mark.parametrize("name", sorted(__import__("qa_train.config.flags", fromlist=["ELSEWHERE"]).ELSEWHERE))
def test_every_trainer_spelling_is_refused_saying_where_to_go(name: str, capsys: pytest.CaptureFixture) -> None:
    """The table of Trainer's and run_qa's spellings: each refused with its line, and every flag a line names is one
    that exists (ours, or accelerate launch's for the strategy)."""
    from qa_train.config.flags import ELSEWHERE, build_parser

    with pytest.raises(SystemExit) as exc:
        parse_args([f"--{name}"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == f"qa_train: error: unknown flag --{name}: {ELSEWHERE[name]}"
    ours = {o for a in build_parser()._actions for o in a.option_strings}
    named = re.findall(r"--\w+", ELSEWHERE[name])
    assert all(flag in ours or flag in _flags_of_accelerate_launch() for flag in named), named
    assert f"--{name}" not in ours, "a spelling we accept cannot be in the table of those we refuse"


def test_the_docs_table_of_trainer_spellings_is_the_code_s() -> None:
    from conftest import ROOT

    from qa_train.config.flags import ELSEWHERE

    text = (ROOT / "docs" / "training.md").read_text()
    rows = re.findall(r"^\| `--(\w+)` \| (.+) \|$", text, flags=re.MULTILINE)
    assert dict(rows) == ELSEWHERE


def test_an_arguments_file_comes_first_and_the_command_line_overrides_it(tmp_path: Path) -> None:
    """As transformers' examples take `python run_qa.py args.json`: JSON or YAML, Trainer's value types (a list for
    report_to, booleans as JSON or as text)."""
    values = {
        "learning_rate": 1e-4,
        "num_train_epochs": 3,
        "report_to": ["wandb", "tensorboard"],
        "do_eval": "false",
        "output_dir": str(tmp_path / "from-file"),
        "train_file": str(DEMO_DEV),
    }
    as_json = tmp_path / "args.json"
    as_json.write_text(json.dumps(values))
    as_yaml = tmp_path / "args.yaml"
    as_yaml.write_text(
        "".join(f"{k.replace('_', '-', 1) if k == 'do_eval' else k}: {json.dumps(v)}\n" for k, v in values.items())
    )
    for path in (as_json, as_yaml):
        args = parse_args([str(path), "--learning_rate", "2e-4"])
        assert args.optim.learning_rate == 2e-4, "the command line wins"
        assert (args.optim.num_train_epochs, args.output.trackers) == (3.0, ["wandb", "tensorboard"])
        assert (args.eval.do_eval, args.output.run_name) == (False, "from-file")
    assert parse_args([str(as_json)]).optim.learning_rate == 1e-4


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"learning_rat": 1e-4}', "learning_rat: did you mean --learning_rate?"),
        ('{"fp16": true}', "unknown flag --fp16: --mixed_precision fp16"),
        ('{"learning_rate": "fast"}', "learning_rate: expected a float, got 'fast'"),
        ('{"per_device_train_batch_size": 2.5}', "per_device_train_batch_size: expected a whole number, got 2.5"),
        ('{"do_eval": "maybe"}', "do_eval: expected true or false, got 'maybe'"),
        ('{"mixed_precision": "fp8"}', "mixed_precision: 'fp8' is not one of auto, no, fp16, bf16"),
        ('["--learning_rate", "1e-4"]', "must hold an object of flag: value, found list"),
        ('{"learning_rate": 1e-4,}', "not valid JSON"),
        (b'\xff\xfe{"learning_rate": 1e-4}', "not UTF-8 text (byte 0)"),  # escaped as a traceback
    ],
)
def test_a_bad_arguments_file_is_one_line_naming_the_file_and_key(
    content: str | bytes, says: str, tmp_path: Path
) -> None:
    path = tmp_path / "args.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError, match=re.escape(says)) as err:
        parse_args([str(path)])
    assert str(err.value).startswith(f"arguments file {path}: ") and "\n" not in str(err.value)


def test_an_arguments_file_that_is_missing_or_not_first_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(ConfigError, match="arguments file .*missing.json: cannot be read"):
        parse_args([str(tmp_path / "missing.json")])
    path = tmp_path / "args.yaml"
    path.write_text("learning_rate: 1e-4\n")
    with pytest.raises(SystemExit):
        parse_args(["--seed", "1", str(path)])
    assert "a file of arguments comes first" in capsys.readouterr().err


def test_do_train_false_evaluates_a_named_model_and_refuses_what_only_training_reads() -> None:
    args = parse_args(["--do_train", "false", "--model_name_or_path", "m", "--validation_file", str(DEMO_DEV)])
    assert (args.eval.do_train, args.data.train_file, args.data.dataset_name) == (False, None, None)
    with pytest.raises(ConfigError, match="--do_train: false evaluates the weights of --model_name_or_path"):
        parse_args(["--do_train", "false", "--config_name", str(TINY)])
    with pytest.raises(ConfigError, match="--do_train: false with --do_eval false leaves nothing to do"):
        parse_args(["--do_train", "false", "--no_eval"])
    for flag in (
        ["--train_file", str(DEMO_DEV)],
        ["--max_train_steps", "5"],
        ["--eval_on_start"],
        ["--save_best", "--eval_strategy", "epoch"],
        ["--checkpointing_steps", "5"],
    ):
        with pytest.raises(ConfigError, match=f"--do_train: false trains nothing, so .*{flag[0]}.* would do nothing"):
            parse_args(["--do_train", "false", "--validation_file", str(DEMO_DEV), *flag])
    predict_only = parse_args(["--do_train", "false", "--no_eval", "--do_predict", "--test_file", str(DEMO_DEV)])
    assert predict_only.data.dataset_name is None, "nothing reads the hub's squad"


def test_offline_demo_evaluates_a_named_model_without_the_demos_training_settings() -> None:
    from qa_train.config.settings import DEMO_VALIDATION_FILE

    args = parse_args(["--offline_demo", "--do_train", "false", "--model_name_or_path", str(TINY)])
    assert (args.data.train_file, args.eval.eval_on_start, args.eval.eval_strategy) == (None, False, "no")
    assert args.model.config_name is None and args.model.tokenizer_name is None, "the model's own config"
    assert args.data.validation_file == str(DEMO_VALIDATION_FILE) and args.data.max_seq_length == 256
    trains = parse_args(["--offline_demo", "--model_name_or_path", str(TINY)])
    assert trains.model.config_name is None and trains.eval.eval_on_start is True  # fine-tunes that model


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["--save_safetensors", "false"],
            "--save_safetensors: false: transformers 5 saves weights only as safetensors",
        ),
        (["--logging_dir", "tb"], "--logging_dir: is TensorBoard's folder, which --report_to wandb leaves out"),
        (["--model_revision", ""], "--model_revision: is empty"),
        (
            ["--report_to", "tensorboard", "--wandb_project", "p"],
            "--wandb_project: is W&B's project, which --report_to tensorboard leaves out",
        ),
    ],
)
def test_flags_that_would_do_nothing_say_why(argv: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        parse_args(argv)


def test_trainers_output_and_system_flags_are_taken() -> None:
    args = parse_args(["--save_safetensors", "--tf32", "--log_level", "debug", "--optim", "adafactor"])
    assert (args.output.save_safetensors, args.system.tf32, args.system.log_level) == (True, True, "debug")
    assert args.optim.optim == "adafactor"
    board = parse_args(["--report_to", "tensorboard", "--logging_dir", "/tmp/tb"]).output
    assert board.tensorboard_dir == Path("/tmp/tb")
    assert parse_args(["--output_dir", "runs/a"]).output.tensorboard_dir == Path("runs/a/tensorboard")


def test_an_unknown_log_level_is_refused_in_one_line(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--log_level", "verbose"])
    [line] = capsys.readouterr().err.splitlines()
    assert "argument --log_level: invalid choice: 'verbose'" in line


def test_8bit_adamw_needs_bitsandbytes(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a)
    )
    with pytest.raises(ConfigError, match="--optim: adamw_bnb_8bit needs bitsandbytes, which is not installed"):
        parse_args(["--optim", "adamw_bnb_8bit"])
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "bitsandbytes" else real(name, *a)
    )
    assert parse_args(["--optim", "adamw_bnb_8bit"]).optim.optim == "adamw_bnb_8bit"


def test_wandb_variables_are_read_as_trainer_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (parse_args([]).output.log_model_when, parse_args([]).output.wandb_watch) == (None, None)
    assert parse_args(["--wandb_log_model"]).output.log_model_when == "end"
    monkeypatch.setenv("WANDB_LOG_MODEL", "end")
    assert parse_args([]).output.log_model_when == "end"
    assert parse_args(["--report_to", "none"]).output.log_model_when is None  # as Trainer: only where W&B runs
    monkeypatch.setenv("WANDB_LOG_MODEL", "checkpoint")
    monkeypatch.setenv("WANDB_WATCH", "all")
    out = parse_args([]).output
    assert (out.log_model_when, out.wandb_watch) == ("checkpoint", "all")
    monkeypatch.setenv("WANDB_LOG_MODEL", "yes")
    with pytest.raises(ConfigError, match="WANDB_LOG_MODEL=yes: not one of end, checkpoint, false"):
        parse_args([])
    assert parse_args(["--report_to", "tensorboard"]).output.log_model_when is None
    monkeypatch.setenv("WANDB_LOG_MODEL", "false")
    monkeypatch.setenv("WANDB_WATCH", "weights")
    with pytest.raises(ConfigError, match="WANDB_WATCH=weights: not one of gradients, parameters, all, false"):
        parse_args([])


def test_a_wandb_mode_wandb_does_not_have_is_refused_where_wandb_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """WANDB_MODE=bogus trained to the end without W&B: wandb.init refused the mode, and accelerate's tracker
    went on without it after a UserWarning amid the start-up lines."""
    monkeypatch.setenv("WANDB_MODE", "Offline")
    with pytest.raises(ConfigError) as err:
        parse_args([])
    assert (
        str(err.value) == "WANDB_MODE=Offline: not one of online, offline, shared, disabled, dryrun, run (W&B's modes)"
    )
    assert parse_args(["--report_to", "tensorboard"]).output.trackers == ["tensorboard"]
    for mode in ("", "disabled", "offline"):
        monkeypatch.setenv("WANDB_MODE", mode)
        parse_args([])


@pytest.mark.parametrize(
    ("variables", "argv", "said"),
    [
        ({"WANDB_PROJECT": "team/squad"}, [], "WANDB_PROJECT: Invalid project name 'team/squad': cannot contain "),
        ({}, ["--wandb_project", "squad:v2"], "--wandb_project: Invalid project name 'squad:v2': cannot contain "),
        ({}, ["--wandb_project", "x" * 129], "--wandb_project: Invalid project name 'xxx"),
        ({"WANDB_RUN_ID": "job 7"}, [], None),  # W&B takes a space within
        ({"WANDB_RUN_ID": "job:7"}, [], "WANDB_RUN_ID: Run ID cannot contain the characters: "),
        ({"WANDB_RUN_ID": " job-7"}, [], "WANDB_RUN_ID: Run ID cannot start or end with whitespace"),
        ({"WANDB_PROJECT": "team/squad"}, ["--wandb_project", "squad"], None),  # the flag wins
        ({"WANDB_PROJECT": "team/squad"}, ["--report_to", "none"], None),  # W&B does not run
        ({"WANDB_PROJECT": "", "WANDB_RUN_ID": ""}, [], None),  # empty: unset
        ({"WANDB_PROJECT": "équipe.squad-v2", "WANDB_RUN_ID": "qa-train-1234"}, [], None),
    ],
)
def test_a_wandb_project_or_run_id_wandb_refuses_is_refused_where_wandb_runs(
    variables: dict[str, str], argv: list[str], said: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """WANDB_PROJECT=team/squad trained to the end without W&B, after --overwrite_output_dir had removed the last
    run: wandb.init refused the name, and the tracker's guard went on without it after a warning."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    if said is None:
        parse_args(argv)
        return
    with pytest.raises(ConfigError) as err:
        parse_args(argv)
    assert str(err.value).startswith(said) and str(err.value).endswith("(W&B would refuse it as the run starts)")


def test_the_log_level_sets_qa_trains_and_the_libraries_loggers_on_the_main_process() -> None:
    import logging

    from qa_train.trainer import setup_logging

    levels = {name: logging.getLogger(name).level for name in ("qa_train", "transformers", "datasets")}
    try:
        setup_logging(True, bars=False, level="debug")
        assert logging.getLogger("qa_train").level == logging.getLogger("transformers").level == logging.DEBUG
        setup_logging(True, bars=False, level="error")
        assert logging.getLogger("qa_train").level == logging.getLogger("datasets").level == logging.ERROR
        setup_logging(True, bars=False)  # passive
        assert (logging.getLogger("qa_train").level, logging.getLogger("transformers").level) == (
            logging.INFO,
            logging.WARNING,
        )
        setup_logging(False, bars=False, level="debug")  # other ranks: warnings and errors only
        assert (logging.getLogger("qa_train").level, logging.getLogger("transformers").level) == (
            logging.WARNING,
            logging.ERROR,
        )
    finally:
        setup_logging(True, bars=False)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


NAMES = (
    "dataset_name",
    "dataset_config_name",
    "train_file",
    "validation_file",
    "test_file",
    "model_name_or_path",
    "config_name",
    "tokenizer_name",
    "cache_dir",
    "token",
    "resume_from_checkpoint",
    "logging_dir",
    "run_name",
    "wandb_project",
)


@pytest.mark.parametrize("value", ["", "  "])
@pytest.mark.parametrize("flag", NAMES)
def test_an_empty_name_or_path_is_refused_as_an_unset_variable(flag: str, value: str) -> None:
    """`--dataset_name "$DATA"` with DATA unset: "" crashed, fell back to bert-base-uncased, or named the working
    directory ("." for --resume_from_checkpoint), instead of saying which flag was empty."""
    with pytest.raises(ConfigError) as err:
        parse_args([f"--{flag}", value])
    assert str(err.value).startswith(f"--{flag}: is empty (an unset shell variable?); ") and "\n" not in str(err.value)


@pytest.mark.parametrize("value", ["²", "١٢", "0", "+3", " 3", "3.0"])
def test_checkpointing_steps_are_ascii_digits_or_epoch(value: str) -> None:
    """str.isdigit took "²" (then int() crashed) and Arabic-Indic "١٢" (run as 12)."""
    with pytest.raises(ConfigError, match=f"^--checkpointing_steps: {re.escape(repr(value))} is neither a positive"):
        parse_args(["--checkpointing_steps", value])
    assert parse_args(["--checkpointing_steps", "12"]).output.checkpoint_every == 12
    assert parse_args(["--checkpointing_steps", "epoch"]).output.checkpoint_every == "epoch"


TRAIN = ["--train_file", str(DEMO_DEV)]
NO_EVAL = [*TRAIN, "--no_eval"]
NEITHER = "is only read to evaluate or to answer --test_file, and --no_eval without --do_predict does neither: drop it"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            [*NO_EVAL, "--validation_file", str(DEMO_DEV)],
            "--validation_file: is only read to evaluate, and --no_eval evaluates nothing: drop it",
        ),
        (
            [*NO_EVAL, "--max_eval_samples", "5"],
            "--max_eval_samples: is only read to evaluate, and --no_eval evaluates nothing: drop it",
        ),
        ([*NO_EVAL, "--per_device_eval_batch_size", "8"], f"--per_device_eval_batch_size: {NEITHER}"),
        ([*NO_EVAL, "--n_best_size", "5"], f"--n_best_size: {NEITHER}"),
        ([*NO_EVAL, "--max_answer_length", "10"], f"--max_answer_length: {NEITHER}"),
        (
            [*NO_EVAL, "--version_2_with_negative", "--null_score_diff_threshold", "1"],
            f"--null_score_diff_threshold: {NEITHER}",
        ),
        (
            ["--max_predict_samples", "3"],
            "--max_predict_samples: truncates --test_file's questions, which are only read with --do_predict",
        ),
        (
            ["--dataset_config_name", "x", *TRAIN, "--validation_file", str(DEMO_DEV)],
            "--dataset_config_name: is a config of --dataset_name, and this run reads only local files: "
            "add --dataset_name, or drop it",
        ),
        (
            ["--null_score_diff_threshold", "1"],
            "--null_score_diff_threshold: only decides SQuAD v2.0's empty answers: add --version_2_with_negative, "
            "or drop it",
        ),
        (
            ["--version_2_with_negative", "--null_score_diff_threshold", "-inf"],
            "--null_score_diff_threshold: must be a finite number, got -inf",
        ),
    ],
)
def test_a_flag_no_part_of_the_run_reads_is_refused_saying_why(argv: list[str], says: str) -> None:
    """Accepted and silently ignored before (as --test_file without --do_predict is not)."""
    with pytest.raises(ConfigError) as err:
        parse_args(argv)
    assert str(err.value) == says


def test_flags_read_by_prediction_or_a_first_evaluation_are_taken_under_no_eval() -> None:
    predicting = [*NO_EVAL, "--do_predict", "--test_file", str(DEMO_DEV), "--max_predict_samples", "3"]
    args = parse_args(
        [*predicting, "--n_best_size", "5", "--max_answer_length", "10", "--per_device_eval_batch_size", "8"]
    )
    assert (args.eval.n_best_size, args.data.per_device_eval_batch_size, args.data.max_predict_samples) == (5, 8, 3)
    first = parse_args([*NO_EVAL, "--eval_on_start", "--validation_file", str(DEMO_DEV), "--max_eval_samples", "5"])
    assert first.data.max_eval_samples == 5
    assert parse_args(["--dataset_config_name", "plain_text"]).data.dataset_name == "squad", "the implicit squad's"


@pytest.mark.parametrize(
    "flag",
    [
        ["--num_train_epochs", "3"],
        ["--learning_rate", "1e-4"],
        ["--weight_decay", "0.01"],
        ["--optim", "adamw_torch"],
        ["--adam_beta1", "0.8"],
        ["--adam_beta2", "0.99"],
        ["--adam_epsilon", "1e-6"],
        ["--lr_scheduler_type", "cosine"],
        ["--num_warmup_steps", "10"],
        ["--warmup_ratio", "0.1"],
        ["--gradient_accumulation_steps", "2"],
        ["--max_grad_norm", "0.5"],
        ["--per_device_train_batch_size", "4"],
        ["--group_by_length"],
        ["--save_final_model", "false"],
        ["--allow_global_batch_change"],
        ["--logging_steps", "5"],
        ["--throughput_warmup_steps", "0"],
        # Evaluation runs the model eagerly and the profiler traces training steps: these were taken and did
        # nothing (an audit of docs/training.md's "every flag only training reads" claim, by running it).
        ["--torch_compile"],
        ["--torch_compile_mode", "max-autotune"],
        ["--torch_compile_backend", "aot_eager"],
        ["--torch_compile_regional"],
        ["--profile"],
    ],
)
def test_do_train_false_refuses_every_flag_only_training_reads(flag: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_args(["--do_train", "false", "--model_name_or_path", "m", "--validation_file", str(DEMO_DEV), *flag])
    assert str(err.value) == (
        f"--do_train: false trains nothing, so {flag[0]} would do nothing (nor is a model exported): drop it"
    )


def test_offline_demo_gives_way_to_a_named_dataset_and_to_no_eval() -> None:
    """A named dataset's splits were silently replaced by the demo's files; --no_eval was refused for the demo's
    --eval_strategy, which the user never typed."""
    named = parse_args(["--offline_demo", "--dataset_name", "squad"])
    assert (named.data.dataset_name, named.data.train_file, named.data.validation_file) == ("squad", None, None)
    assert named.model.config_name is not None, "the demo's model still"
    quiet = parse_args(["--offline_demo", "--no_eval"])
    assert (quiet.eval.eval_strategy, quiet.eval.eval_on_start, quiet.data.validation_file) == ("no", False, None)
    assert quiet.data.train_file is not None
    first = parse_args(["--offline_demo", "--no_eval", "--eval_on_start"])
    assert first.data.validation_file is not None, "a first evaluation reads the demo's dev set"
    constant = parse_args(["--offline_demo", "--lr_scheduler_type", "constant"]).optim
    assert (constant.lr_scheduler_type, constant.warmup_ratio) == ("constant", 0.0), "the demo's warm-up gives way"
    steps = parse_args(["--offline_demo", "--num_warmup_steps", "5"]).optim
    assert (steps.num_warmup_steps, steps.warmup_ratio) == (5, 0.0), "the demo's warm-up ratio gives way"


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("args.json", '{"max_train_steps": Infinity}', "max_train_steps: expected a whole number, got inf"),
        ("args.json", '{"seed": 1e400}', "seed: expected a whole number, got inf"),
        ("args.json", '{"seed": NaN}', "seed: expected a whole number, got nan"),
        ("args.yaml", "max_train_steps: .inf\n", "max_train_steps: expected a whole number, got inf"),
        ("args.json", '{"output_dir": ["a"]}', "output_dir: expected a string, got list ['a']"),
        ("args.json", '{"output_dir": true}', "output_dir: expected a string, got bool True"),
        ("args.yaml", "dataset_name: {a: 1}\n", "dataset_name: expected a string, got dict {'a': 1}"),
    ],
)
def test_an_arguments_file_value_of_the_wrong_type_is_refused_naming_the_key(
    name: str, content: str, says: str, tmp_path: Path
) -> None:
    """OverflowError tracebacks before, or a folder named "['a']" or "True"."""
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        parse_args([str(path)])
    assert str(err.value) == f"arguments file {path}: {says}"


def test_an_arguments_file_takes_a_whole_number_for_checkpointing_steps(tmp_path: Path) -> None:
    path = tmp_path / "args.yaml"
    path.write_text("checkpointing_steps: 500\n")  # YAML reads it as a number
    assert parse_args([str(path)]).output.checkpoint_every == 500


@pytest.mark.parametrize(
    ("argv", "total", "said"),
    [
        (["--checkpointing_steps", "50"], 40, ["--checkpointing_steps 50 is more than the run's 40 steps: no check"]),
        (["--checkpointing_steps", "40"], 40, []),
        (["--checkpointing_steps", "epoch"], 40, []),
        (["--checkpointing_steps", "epoch"], 20, ["--checkpointing_steps epoch is an epoch (30 steps), which the run"]),
        (["--eval_strategy", "epoch"], 40, []),
        (["--eval_strategy", "epoch"], 20, ["--eval_strategy epoch: an epoch (30 steps), which the run's 20 steps do"]),
        (["--eval_strategy", "steps", "--eval_steps", "41"], 40, ["--eval_steps 41 is more than the run's 40 steps"]),
        (["--eval_strategy", "steps", "--eval_steps", "0.5"], 40, []),
        # Trainer's habit: --eval_steps falls back on --logging_steps (10 here).
        (["--eval_strategy", "steps"], 8, ["--eval_steps (by default --logging_steps) 10 is more than the run's 8"]),
        (["--eval_strategy", "steps"], 10, []),
        (["--eval_strategy", "steps", "--save_best"], 8, ["--eval_steps (by default --logging_steps) 10 is more"]),
        (["--do_train", "false", "--do_eval"], 0, []),
        (["--checkpointing_steps", "50", "--max_train_steps", "0"], 0, []),
    ],
)
def test_an_interval_longer_than_the_run_is_said(argv: list[str], total: int, said: list[str]) -> None:
    """Trainer says nothing; a run meant to leave checkpoints or scores as it trains found out only at its end."""
    from qa_train.config.settings import unreached_intervals

    warnings = unreached_intervals(parse_args(argv), total, 30)
    assert len(warnings) == len(said) and all(w.startswith(s) for w, s in zip(warnings, said, strict=True)), warnings
    if "--save_best" in argv:
        assert warnings[0].endswith("no evaluation during training for --save_best to choose from")
