"""Bad flags are refused before anything is loaded, with a message naming the flag."""

from __future__ import annotations

import time

import pytest

from conftest import PY, run_cmd
from qa_train.config import ConfigError, parse_args


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
    ],
)
def test_impossible_values_name_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        parse_args(argv)


def test_unknown_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--max_seq_lenght", "128"])
    assert exc.value.code == 2
    assert "--max_seq_lenght" in capsys.readouterr().err


def test_defaults_follow_transformers_examples() -> None:
    args = parse_args([])
    assert (args.model_name_or_path, args.dataset_name, args.max_seq_length, args.doc_stride) == (
        "bert-base-uncased", "squad", 384, 128)
    assert (args.learning_rate, args.num_train_epochs, args.n_best_size, args.max_answer_length) == (3e-5, 2.0, 20, 30)


def test_bool_flags_parse_both_ways() -> None:
    assert parse_args(["--pad_to_max_length"]).pad_to_max_length is True
    assert parse_args(["--pad_to_max_length", "false"]).pad_to_max_length is False
    assert parse_args(["--no_eval"]).do_eval is False


def test_cli_refuses_fast_without_loading(env: dict[str, str]) -> None:
    """The refusal comes from the entry point itself, before torch or data are touched."""
    t0 = time.perf_counter()
    proc = run_cmd([PY, "-m", "qa_train", "--doc_stride", "512"], env)
    assert proc.returncode == 2
    assert "--doc_stride" in proc.stderr and "--max_seq_length" in proc.stderr
    assert time.perf_counter() - t0 < 20
    assert "Traceback" not in proc.stderr
