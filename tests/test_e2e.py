"""The real entry point end to end on CPU: one process, and a refused launch. (Two DDP processes end to end,
evaluation included, are tests/test_strategies.py's reference run.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import DEMO_DEV, PY, read_metrics, run_cmd, run_ok, tiny_flags

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def single_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import base_env

    tmp = tmp_path_factory.mktemp("single")
    env = base_env(tmp)
    env.pop("WANDB_MODE", None)  # no credentials: the run must fall back to offline W&B by itself
    out = tmp / "run"
    flags = tiny_flags(out, "--max_train_steps", "300", "--eval_before_training", "--logging_steps", "50")
    flags[flags.index("--report_to") + 1] = "wandb"
    run_ok([PY, "-m", "qa_train", *flags], env)
    return out


def test_single_process_metrics_are_sane(single_run: Path) -> None:
    import dataclasses

    from qa_train.schema import RunMetrics

    m = read_metrics(single_run)
    assert list(m) == [f.name for f in dataclasses.fields(RunMetrics)], "metrics.json keys come from the schema"
    assert (m["world_size"], m["strategy"], m["zero_stage"], m["offload"]) == (1, "single", None, "none")
    assert m["train_steps"] == 300 and m["global_batch_size"] == 8
    assert 0 <= m["exact_match"] <= m["f1"] <= 100
    assert m["f1"] > m["initial_f1"] + 5, "training must beat the untrained model"
    assert m["train_samples_per_second"] > 0 and m["train_tokens_per_second"] > 0
    assert m["train_padded_tokens_per_second"] >= m["train_tokens_per_second"]
    assert m["peak_memory_gb"]["max"] > 0.05 and len(m["peak_memory_gb"]["per_rank"]) == 1
    assert m["peak_host_rss_gb"]["max"] >= m["train_host_rss_gb"]["max"] * 0.99
    assert m["num_eval_features"] >= m["num_eval_examples"] > 0 and m["eval_runtime_s"] > 0
    assert m["max_seq_length"] == 192 and m["args"]["learning_rate"] == 1e-3
    for key in ("train_runtime_s", "mixed_precision", "num_train_features"):
        assert key in m


def test_predictions_file_matches_the_scorer_cli(single_run: Path, env: dict[str, str]) -> None:
    predictions = json.loads((single_run / "eval_predictions.json").read_text())
    gold = {qa["id"] for a in json.loads(DEMO_DEV.read_text())["data"] for p in a["paragraphs"] for qa in p["qas"]}
    assert set(predictions) == gold
    proc = run_ok([PY, "-m", "qa_train.squad_eval", str(DEMO_DEV), str(single_run / "eval_predictions.json")], env)
    scores = json.loads(proc.stdout.strip().splitlines()[-1])
    m = read_metrics(single_run)
    assert scores["exact_match"] == pytest.approx(m["exact_match"]) and scores["f1"] == pytest.approx(m["f1"])


def test_step_log_and_offline_wandb(single_run: Path) -> None:
    steps = [json.loads(line) for line in (single_run / "train_log.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [50, 100, 150, 200, 250, 300]
    assert steps[-1]["train/loss"] < steps[0]["train/loss"]
    assert list((single_run / "wandb").glob("offline-run-*")), "W&B should have written an offline run"


def test_exported_model_answers_a_question(single_run: Path) -> None:
    """The export loads with from_pretrained and answers; through transformers' QA pipeline where the
    installed transformers still has it (removed in 5.x), else through qa_train.predict."""
    from transformers.pipelines import SUPPORTED_TASKS

    article = json.loads(DEMO_DEV.read_text())["data"][0]["paragraphs"][0]
    question, context = article["qas"][0]["question"], article["context"]
    if "question-answering" in SUPPORTED_TASKS:
        from transformers import pipeline

        out = pipeline("question-answering", model=str(single_run / "final"), device="cpu")(
            question=question, context=context)
    else:
        from qa_train.predict import answer

        out = answer(str(single_run / "final"), question, context, max_seq_length=192, doc_stride=64)
        predictions = json.loads((single_run / "eval_predictions.json").read_text())
        assert out["answer"] == predictions[article["qas"][0]["id"]], "same answer as evaluation"
    assert out["answer"] and context[out["start"]:out["end"]] == out["answer"]


def test_world_size_guard_refuses_a_split_launch(tmp_path: Path, env: dict[str, str]) -> None:
    """`accelerate launch --multi_gpu` without CUDA starts 2 lone processes; qa_train must refuse to train."""
    out = tmp_path / "split"
    proc = run_cmd([PY, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                    "--main_process_port", "29612", "-m", "qa_train", *tiny_flags(out, "--max_train_steps", "5")],
                   env, timeout=300)
    assert proc.returncode != 0
    assert "WORLD_SIZE=2" in proc.stderr and "they would train separate models" in proc.stderr
    assert not (out / "metrics.json").exists()


def test_profile_writes_a_trace_and_prints_top_operators(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "run"
    proc = run_ok([PY, "-m", "qa_train", *tiny_flags(out, "--max_train_steps", "8", "--profile", "--no_eval",
                                                      "--save_final_model", "false")], env)
    traces = list((out / "profile").glob("rank0*.pt.trace.json"))
    assert len(traces) == 1, list((out / "profile").iterdir())
    events = json.loads(traces[0].read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert "aten::addmm" in names or "aten::mm" in names, "the trace should hold the model's matmuls"
    assert "Self CPU" in proc.stdout and "aten::" in proc.stdout, "the top-operator table goes to stdout"
    # metrics.json's eval_runtime_s is present and empty when evaluation is skipped
    assert read_metrics(out)["eval_runtime_s"] is None
