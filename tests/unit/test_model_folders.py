"""Model, config and tokenizer folders a user damaged or mixed up, given to training (--model_name_or_path,
--config_name, --tokenizer_name) or to predict (MODEL_DIR): each is refused in one line naming the flag and the
file, before any window is made or weight loaded, instead of a traceback after the data was featurised."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import high_padding_model, tiny_flags

from qa_train import predict, trainer
from qa_train.config.flags import parse_args
from qa_train.config.settings import ConfigError


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A whole tiny BERT QA model folder (config, weights, tokenizer), never altered: tests alter copies."""
    return high_padding_model(tmp_path_factory.mktemp("model") / "qa")


def copy(model: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model, tmp_path / "altered"))


def refused_by_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> str:
    """The preflight's refusal of a run with `flags` (the tiny run's --config_name/--tokenizer_name replaced),
    failing the test if the run got as far as windowing its data."""

    def no_windows(*args: object, **kwargs: object) -> None:
        raise AssertionError("the data was featurised before the refusal")

    monkeypatch.setattr(trainer, "featurize_splits", no_windows)
    argv = tiny_flags(tmp_path / "out", "--no_eval")
    for flag in ("--config_name", "--tokenizer_name"):
        at = argv.index(flag)
        del argv[at : at + 2]
    with pytest.raises(ConfigError) as refused:
        trainer.Trainer(parse_args([*argv, *flags]))
    return str(refused.value)


def refused_by_predict(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    code = predict.main([str(model_dir), "-q", "Who?", "-c", "Somebody.", "--device", "cpu"])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("qa-train predict: error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, (code, out, err)
    return lines[0].removeprefix("qa-train predict: error: ")


@pytest.mark.parametrize(("content", "kind"), [("[1, 2]", "an array"), ('"bert"', "a string"), ("null", "null")])
def test_a_config_json_that_is_not_an_object_is_refused(
    content: str,
    kind: str,
    model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """transformers passed a JSON array on as keyword arguments: a TypeError traceback, in training and predict."""
    altered = copy(model, tmp_path)
    (altered / "config.json").write_text(content)
    says = f"config.json holds {kind}, not a JSON object of config keys"
    message = refused_by_training(tmp_path, monkeypatch, "--model_name_or_path", str(altered))
    assert message == f"--model_name_or_path {altered}: {says}"
    message = refused_by_training(tmp_path, monkeypatch, "--config_name", str(altered), "--tokenizer_name", str(model))
    assert message == f"--config_name {altered}: {says}"
    assert refused_by_predict(altered, capsys) == f"MODEL_DIR {altered}: {says}"
