"""Any encoder a user brings (tests/families.py), trained through qa_train with default flags.

Per family, a real run (in this process, one family after another) trains a few steps, evaluates, answers a file
of unlabelled questions and exports; the export reloads with transformers and qa_train.predict gives the run's
answers. The two families whose layout differs most from BERT's train under FSDP on two CPU processes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import DEMO_DEV, DEMO_TRAIN, base_env, cpu_launch, port, read_metrics, run_ok
from families import FAMILIES, write_families

from qa_train.data.load import load_file


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_families(tmp_path_factory.mktemp("families"))


@pytest.fixture(scope="module")
def questions_without_answers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Demo dev questions as JSON lines with no `answers` field: what a user asks to predict."""
    path = tmp_path_factory.mktemp("test_file") / "test.jsonl"
    ex = load_file(DEMO_DEV).head(24)
    path.write_text(
        "".join(
            json.dumps({"id": i, "title": t, "context": c, "question": q}) + "\n"
            for i, t, c, q in zip(ex.ids, ex.titles, ex.contexts, ex.questions)
        )
    )
    return path


def family_flags(model_dir: str, test_file: Path, out: Path) -> list[str]:
    """A few steps of a family's model on the demo data, evaluated, then answering `test_file`."""
    return [
        *("--config_name", model_dir, "--tokenizer_name", model_dir),
        *("--train_file", str(DEMO_TRAIN), "--validation_file", str(DEMO_DEV)),
        *("--max_train_samples", "64", "--max_eval_samples", "16", "--max_seq_length", "128", "--doc_stride", "32"),
        *("--per_device_train_batch_size", "8", "--max_train_steps", "4", "--learning_rate", "1e-3"),
        *("--do_predict", "--test_file", str(test_file)),
        *("--report_to", "none", "--disable_tqdm", "--output_dir", str(out)),
    ]


@pytest.fixture(autouse=True)
def fresh_accelerator():
    """Runs share this process: each family starts from a blank accelerate state."""
    from accelerate.state import AcceleratorState, GradientState

    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


@pytest.mark.parametrize("family", FAMILIES)
def test_family_trains_exports_and_predicts_with_default_flags(
    family: str,
    family_dirs: dict[str, Path],
    questions_without_answers: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from transformers import AutoModelForQuestionAnswering

    from qa_train.config.flags import parse_args
    from qa_train.predict import Predictor
    from qa_train.run import run

    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    out, model_dir = tmp_path / "run", str(family_dirs[family])
    args = parse_args(family_flags(model_dir, questions_without_answers, out))
    metrics = run(args)
    assert metrics is not None and metrics.train_steps == 4 and np.isfinite(metrics.train_loss)
    assert 0 <= metrics.exact_match <= metrics.f1 <= 100
    predicted = json.loads((out / "predict_predictions.json").read_text())
    nbest = json.loads((out / "predict_nbest_predictions.json").read_text())
    assert sorted(predicted) == sorted(nbest) == sorted(load_file(questions_without_answers, "optional").ids)
    assert all(abs(sum(e["probability"] for e in v) - 1) < 1e-6 for v in nbest.values())

    model = AutoModelForQuestionAnswering.from_pretrained(out / "final")
    assert model.config.model_type == family
    reloaded = Predictor(str(out / "final"), args.data, device="cpu").predict(
        load_file(questions_without_answers, "optional")
    )
    assert reloaded.predictions == predicted, "the export answers as the run did"


@pytest.mark.parametrize("family", ["deberta-v2", "modernbert"])
def test_family_trains_under_fsdp_on_two_processes_and_its_export_answers_alike(
    family: str, family_dirs: dict[str, Path], questions_without_answers: Path, tmp_path: Path
) -> None:
    """DeBERTa-v3 shares its relative position embeddings across the layers from outside them (they stay in the
    root FSDP unit); ModernBERT has its own embeddings module and layer class and no token types. Each trains
    sharded by layer, and the export gathered from the shards answers the test file as the run did."""
    from qa_train.config.flags import parse_args
    from qa_train.predict import Predictor

    out, model_dir = tmp_path / "run", str(family_dirs[family])
    flags = family_flags(model_dir, questions_without_answers, out)
    run_ok([*cpu_launch("fsdp", port(29760 + FAMILIES.index(family))), *flags], base_env(tmp_path))
    m = read_metrics(out)
    assert (m["strategy"], m["distributed_type"], m["world_size"], m["train_steps"]) == ("fsdp", "FSDP", 2, 4)
    predicted = json.loads((out / "predict_predictions.json").read_text())
    reloaded = Predictor(str(out / "final"), parse_args(flags).data, device="cpu").predict(
        load_file(questions_without_answers, "optional")
    )
    assert reloaded.predictions == predicted, "the export answers as the run did"
