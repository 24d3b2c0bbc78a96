"""--overwrite_output_dir against a real run: everything a run writes counts as a run and goes."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ASSETS, tiny_flags

from qa_train.config.outputdir import claim, clear_previous_run
from qa_train.config.settings import ConfigError, OutputArgs


def test_overwrite_removes_every_file_a_real_run_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A short real run with everything that writes to output_dir switched on (v2.0's null odds, prediction, the
    profiler, TensorBoard): whatever it left there must count as a run and go with --overwrite_output_dir, so
    RUN_FILES cannot fall behind what runs write."""
    from qa_train.config.flags import parse_args
    from qa_train.run import run

    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    v2_dev = str(ASSETS / "demo-v2" / "dev.json")
    run(
        parse_args(
            tiny_flags(
                out,
                "--train_file",
                str(ASSETS / "demo-v2" / "train.json"),
                "--validation_file",
                v2_dev,
                "--version_2_with_negative",
                "--do_predict",
                "--test_file",
                v2_dev,
                "--max_train_samples",
                "64",
                "--max_eval_samples",
                "16",
                "--max_predict_samples",
                "16",
                "--max_train_steps",
                "6",
                "--logging_steps",
                "2",
                "--eval_strategy",
                "steps",
                "--eval_steps",
                "3",
                "--save_best",
                "--checkpointing_steps",
                "3",
                "--profile",
                "--throughput_warmup_steps",
                "0",
                "--report_to",
                "tensorboard",
                "--disable_tqdm",
            )
        )
    )
    written = sorted(p.name for p in out.iterdir())
    assert {"predict_predictions.json", "predict_null_odds.json", "profile", "tensorboard"} <= set(written)
    with pytest.raises(ConfigError, match="holds a run"):
        claim(OutputArgs(output_dir=str(out)))
    args = OutputArgs(output_dir=str(out), overwrite_output_dir=True)
    cleared = clear_previous_run(args, is_main=True)
    assert sorted(cleared.removed) == written and cleared.kept == [], "everything a run writes is provably its own"
    assert not list(out.iterdir())
