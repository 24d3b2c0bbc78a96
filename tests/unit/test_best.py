"""--save_best without training: refused without evaluations during training, and what a resumed run's best is."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tiny_flags

from qa_train.config.flags import parse_args


def test_save_best_needs_evaluations_during_training(tmp_path: Path) -> None:
    from qa_train.config.settings import ConfigError

    with pytest.raises(ConfigError, match="^--save_best: needs evaluations during training"):
        parse_args(tiny_flags(tmp_path, "--save_best"))


@pytest.mark.parametrize("main", [True, False])
def test_the_warning_that_the_best_evaluation_has_no_kept_model_comes_from_the_main_process_only(
    tmp_path: Path, main: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Every rank builds a BestModel; one line per run, not one per rank (non-main ranks log warnings)."""
    from types import SimpleNamespace

    from qa_train.strategy.best import BestModel

    carried = {"step": 10, "exact_match": 40.0, "f1": 50.0}  # the checkpoint's best; best/ holds no model
    with caplog.at_level("WARNING", logger="qa_train"):
        kept = BestModel(SimpleNamespace(is_main_process=main), tmp_path, keep=True, resumed=True, carried=carried)
    assert kept.score is not None and kept.kept is None
    assert ("predates --save_best" in caplog.text) is main
