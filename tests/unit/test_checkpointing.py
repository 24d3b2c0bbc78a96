"""--gradient_checkpointing: a family that cannot recompute its layers is refused before any weights or data
are loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_flags


def test_a_family_without_checkpointing_is_refused_before_weights_or_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MPNet's QA class has no checkpointing in transformers: refused from its config, in one line naming the flag
    and the model, before the data is read (transformers itself would refuse only once the model exists)."""
    from qa_train import trainer
    from qa_train.config.flags import parse_args
    from qa_train.config.settings import ConfigError

    def no_data(*args: object) -> None:
        raise AssertionError("the data was read before the refusal")

    monkeypatch.setattr(trainer, "load_splits", no_data)
    monkeypatch.setattr(trainer, "load_model", no_data)
    mpnet = tmp_path / "mpnet"
    mpnet.mkdir()
    (mpnet / "config.json").write_text(json.dumps({"model_type": "mpnet"}))
    flags = tiny_flags(tmp_path / "out", "--gradient_checkpointing", "--no_eval")
    flags[flags.index("--config_name") + 1] = str(mpnet)
    with pytest.raises(ConfigError) as refused:
        trainer.Trainer(parse_args(flags))
    message = str(refused.value)
    assert message.startswith("--gradient_checkpointing: MPNetForQuestionAnswering (model type 'mpnet')")
    assert "\n" not in message and not (tmp_path / "out").exists()
