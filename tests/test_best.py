"""--save_best: the export is the model of the best evaluation, with the same weights, or the last on a tie.

The run is real (tiny model, in this process); only the F1 each evaluation reports is scripted, so which
evaluation is best is known in advance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import tiny_flags

from qa_train.flags import parse_args
from qa_train.run import run
from qa_train.trainer import Trainer

pytestmark = pytest.mark.distributed  # real training runs


def scripted_run(out: Path, monkeypatch: pytest.MonkeyPatch, f1s: list[float]) -> dict[int, dict]:
    """Train 30 steps, evaluating at 10 and 20 and at the end, each reporting the next scripted F1.
    Returns the model's weights at each evaluation, by step."""
    real_evaluate = Trainer.evaluate
    weights: dict[int, dict] = {}
    script = iter(f1s)

    def evaluate(self: Trainer, predictions_path: Path | None = None):
        result = real_evaluate(self, predictions_path)
        step = self.state.completed_steps
        weights[step] = {k: v.detach().clone() for k, v in self.accelerator.unwrap_model(self.model).state_dict().items()}
        result.f1 = next(script)
        return result

    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    run(parse_args(tiny_flags(out, "--max_train_steps", "30", "--logging_steps", "10", "--eval_strategy", "steps",
                              "--eval_steps", "10", "--max_eval_samples", "40", "--save_best")))
    return weights


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "final" / "model.safetensors"))


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k].float(), b[k].float()) for k in b)


def test_an_earlier_best_model_is_the_export(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    weights = scripted_run(out, monkeypatch, [10.0, 50.0, 30.0])
    assert sorted(weights) == [10, 20, 30]
    assert json.loads((out / "final" / "best.json").read_text())["step"] == 20
    assert same(weights[20], final_weights(out)) and not same(weights[30], final_weights(out))
    assert not (out / "best").exists()
    m = json.loads((out / "metrics.json").read_text())
    assert (m["best_eval_step"], m["best_f1"], m["exported_step"], m["f1"]) == (20, 50.0, 20, 30.0)


def test_the_last_model_wins_a_tie(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    weights = scripted_run(out, monkeypatch, [10.0, 50.0, 50.0])
    assert same(weights[30], final_weights(out))
    assert not (out / "final" / "best.json").exists() and not (out / "best").exists()
    m = json.loads((out / "metrics.json").read_text())
    assert (m["best_eval_step"], m["exported_step"]) == (30, 30)


def test_save_best_needs_evaluations_during_training(tmp_path: Path) -> None:
    from qa_train.config import ConfigError

    with pytest.raises(ConfigError, match="^--save_best: needs evaluations during training"):
        parse_args(tiny_flags(tmp_path, "--save_best"))
