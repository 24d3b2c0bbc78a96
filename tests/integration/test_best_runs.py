"""--save_best: the export is the model of the best evaluation, with the same weights, or the last on a tie;
--do_predict answers with the exported model.

The run is real (tiny model, in this process); only the F1 each evaluation reports is scripted, so which
evaluation is best is known in advance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import DEMO_DEV, export_answers, tiny_flags

from qa_train.config.flags import parse_args
from qa_train.run import run
from qa_train.trainer import Trainer


def scripted_run(out: Path, monkeypatch: pytest.MonkeyPatch, f1s: list[float], *extra: str) -> dict[int, dict]:
    """Train 30 steps, evaluating at 10 and 20 and at the end, each reporting the next scripted F1.
    Returns the model's weights at each evaluation, by step."""
    real_evaluate = Trainer.evaluate
    weights: dict[int, dict] = {}
    script = iter(f1s)

    def evaluate(self: Trainer, predictions_path: Path | None = None):
        result = real_evaluate(self, predictions_path)
        step = self.state.completed_steps
        weights[step] = {
            k: v.detach().clone() for k, v in self.accelerator.unwrap_model(self.model).state_dict().items()
        }
        result.f1 = next(script)
        return result

    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    run(
        parse_args(
            tiny_flags(
                out,
                "--max_train_steps",
                "30",
                "--logging_steps",
                "10",
                "--eval_strategy",
                "steps",
                "--eval_steps",
                "10",
                "--max_eval_samples",
                "40",
                "--save_best",
                *extra,
            )
        )
    )
    return weights


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "final" / "model.safetensors"))


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k].float(), b[k].float()) for k in b)


def test_the_last_model_wins_a_tie(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    weights = scripted_run(out, monkeypatch, [10.0, 50.0, 50.0])
    assert same(weights[30], final_weights(out))
    assert not (out / "final" / "best.json").exists() and not (out / "best").exists()
    m = json.loads((out / "metrics.json").read_text())
    assert (m["best_eval_step"], m["exported_step"]) == (30, 30)


# The first 40 demo questions, as --max_eval_samples 40 evaluates them: eval_predictions.json is then the last
# model's answers to the questions predicted.
PREDICT_40 = ("--do_predict", "--test_file", str(DEMO_DEV), "--max_predict_samples", "40")


def answers(path: Path) -> dict[str, str]:
    return json.loads(path.read_text())


def test_an_earlier_best_model_is_the_export_and_answers_the_predictions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    weights = scripted_run(out, monkeypatch, [10.0, 50.0, 30.0], *PREDICT_40)
    assert sorted(weights) == [10, 20, 30]
    assert json.loads((out / "final" / "best.json").read_text())["step"] == 20
    assert same(weights[20], final_weights(out)) and not same(weights[30], final_weights(out))
    assert not (out / "best").exists()
    m = json.loads((out / "metrics.json").read_text())
    assert (m["best_eval_step"], m["best_f1"], m["exported_step"], m["f1"]) == (20, 50.0, 20, 30.0)

    predicted = answers(out / "predict_predictions.json")
    assert predicted != answers(out / "eval_predictions.json"), "the best and the last model must answer apart"
    assert predicted == export_answers(out / "final", 40)
    assert "predict: answering with the best model (step 20, F1 50.00)" in capfd.readouterr().err


def test_save_best_joining_a_resumed_run_exports_a_model_it_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The checkpoint's best evaluation (step 10) has no model in best/: it counts in best_*, but the export is
    the best of the models kept from then on (step 20), not a best/ that does not exist."""
    out = tmp_path / "run"
    flags = ["--checkpointing_steps", "10"]
    scripted_run(out, monkeypatch, [50.0, 10.0, 10.0], *flags, "--save_best", "false")  # the last flag wins
    monkeypatch.undo()  # the next run scripts Trainer.evaluate afresh
    weights = scripted_run(
        out, monkeypatch, [30.0, 20.0], *flags, "--resume_from_checkpoint", str(out / "checkpoints" / "step_00000010")
    )
    assert "predates --save_best" in capfd.readouterr().err
    assert json.loads((out / "final" / "best.json").read_text())["step"] == 20
    assert same(weights[20], final_weights(out))
    m = json.loads((out / "metrics.json").read_text())
    assert (m["best_eval_step"], m["best_f1"], m["exported_step"], m["f1"]) == (10, 50.0, 20, 20.0)


def test_a_resume_on_other_evaluation_questions_does_not_compare_their_scores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """F1 50 at step 10 scored the first 40 dev questions; the resumed run evaluates the first 20. Carried, it stayed
    best_* in metrics.json, the best of questions the run no longer asks."""
    out = tmp_path / "run"
    flags = ["--checkpointing_steps", "10"]
    scripted_run(out, monkeypatch, [50.0, 10.0, 10.0], *flags)
    monkeypatch.undo()
    weights = scripted_run(
        out,
        monkeypatch,
        [30.0, 20.0],
        *flags,
        "--max_eval_samples",
        "20",
        "--resume_from_checkpoint",
        str(out / "checkpoints" / "step_00000010"),
    )
    err = capfd.readouterr().err
    assert "the evaluation questions changed" in err and "(step 10, F1 50.00) scored the others" in err
    assert json.loads((out / "final" / "best.json").read_text())["step"] == 20
    assert same(weights[20], final_weights(out))
    m = json.loads((out / "metrics.json").read_text())
    assert (m["best_eval_step"], m["best_f1"], m["exported_step"], m["f1"]) == (20, 30.0, 20, 20.0)


def test_without_save_best_predictions_come_from_the_last_model(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run(parse_args(tiny_flags(out, "--max_train_steps", "10", "--max_eval_samples", "40", *PREDICT_40)))
    predicted = answers(out / "predict_predictions.json")
    assert predicted == answers(out / "eval_predictions.json") == export_answers(out / "final", 40)
