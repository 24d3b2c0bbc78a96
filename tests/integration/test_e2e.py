"""The real entry point end to end on CPU: one process, and a refused launch. (Two DDP processes end to end,
evaluation included, are tests/integration/test_strategies.py's reference run.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import DEMO_DEV, PY, main_here, port, read_metrics, run_cmd, run_ok, tiny_flags

from qa_train.observe.recorder import tracker_keys

# Enough steps for the model to beat its untrained F1 by a clear margin.
STEPS = 200


@pytest.fixture(scope="module")
def single_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import base_env

    tmp = tmp_path_factory.mktemp("single")
    env = base_env(tmp)
    env.pop("WANDB_MODE", None)  # no credentials: the run must fall back to offline W&B by itself
    out = tmp / "run"
    flags = tiny_flags(
        out,
        "--max_train_steps",
        str(STEPS),
        "--eval_on_start",
        "--logging_steps",
        "50",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "50",
        "--wandb_log_model",
    )
    flags[flags.index("--report_to") + 1] = "all"
    proc = run_ok([PY, "-m", "qa_train", *flags], env)
    (tmp / "output.txt").write_text(proc.stdout + proc.stderr)  # DeepSpeed's logger writes to stdout
    return out


TRAIN_KEYS = {
    "train/loss",
    "train/lr",
    "train/epoch",
    "train/grad_norm",
    "throughput/samples_per_second",
    "throughput/tokens_per_second",
    "memory/host_rss_gib",
}  # CUDA memory and MFU only on a GPU
EVAL_KEYS = {"eval/exact_match", "eval/f1", "eval/runtime_s"}
# The trackers get Trainer's names where Trainer has the figure (train/learning_rate, eval/runtime).
TRACKED_TRAIN_KEYS, TRACKED_EVAL_KEYS = (
    set(tracker_keys(dict.fromkeys(TRAIN_KEYS))),
    set(tracker_keys(dict.fromkeys(EVAL_KEYS))),
)
LOG_STEPS = [50, 100, 150, 200]
EVAL_STEPS = [0, 50, 100, 150, 200]  # before training, every --eval_steps, and the final evaluation


def test_single_process_metrics_are_sane(single_run: Path) -> None:
    import dataclasses

    from qa_train.observe.schema import RunMetrics

    m = read_metrics(single_run)
    assert list(m) == [f.name for f in dataclasses.fields(RunMetrics)], "metrics.json keys come from the schema"
    assert (m["world_size"], m["strategy"], m["zero_stage"], m["offload"]) == (1, "single", None, "none")
    assert m["train_steps"] == STEPS and m["global_batch_size"] == 8
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
    # Started as `python -m qa_train`, no launcher of ours: its start-up is the process's (imports: seconds) and the
    # build's, which total_runtime_s counts too.
    assert m["startup_launch_s"] is None and m["startup_process_s"] > 0.5 and 0 < m["startup_build_s"]
    assert m["startup_build_s"] < m["total_runtime_s"]
    assert m["startup_s"] == pytest.approx(m["startup_process_s"] + m["startup_build_s"], abs=0.002)


def test_the_log_says_each_evaluation_and_no_library_warns(single_run: Path) -> None:
    """A CPU run's log: every evaluation with its scores; not DeepSpeed's warning that it "was unable to detect"
    a GPU (accelerate imports DeepSpeed at the export whatever the strategy), nor any other WARNING line."""
    log = (single_run.parent / "output.txt").read_text()
    scores = {
        e["step"]: e
        for e in map(json.loads, (single_run / "train_log.jsonl").read_text().splitlines())
        if "eval/f1" in e
    }
    for step in EVAL_STEPS[1:-1]:  # the final evaluation is the summary table's
        assert (
            f"evaluation at step {step} (epoch " in log
            and f"exact_match {scores[step]['eval/exact_match']:.2f}, f1 {scores[step]['eval/f1']:.2f}" in log
        )
    assert "unable to detect" not in log
    assert [line for line in log.splitlines() if "WARNING" in line] == []


def test_predictions_file_matches_the_scorer_cli(single_run: Path, env: dict[str, str]) -> None:
    predictions = json.loads((single_run / "eval_predictions.json").read_text())
    gold = {qa["id"] for a in json.loads(DEMO_DEV.read_text())["data"] for p in a["paragraphs"] for qa in p["qas"]}
    assert set(predictions) == gold
    proc = run_ok([PY, "-m", "qa_train.cli", "score", str(DEMO_DEV), str(single_run / "eval_predictions.json")], env)
    scores = json.loads(proc.stdout.strip().splitlines()[-1])
    m = read_metrics(single_run)
    assert scores["exact_match"] == pytest.approx(m["exact_match"]) and scores["f1"] == pytest.approx(m["f1"])


def test_step_log_holds_every_key_at_every_interval(single_run: Path) -> None:
    lines = [json.loads(line) for line in (single_run / "train_log.jsonl").read_text().splitlines()]
    train = [line for line in lines if "train/loss" in line]
    assert [line["step"] for line in train] == LOG_STEPS
    assert all(set(line) == TRAIN_KEYS | {"step"} for line in train)
    assert train[-1]["train/loss"] < train[0]["train/loss"]
    # the epoch is fractional: 200 steps of batch 8 over the demo's windows
    epochs = [line["train/epoch"] for line in train]
    assert epochs == sorted(epochs) and any(e != int(e) for e in epochs)
    assert [line["step"] for line in lines if "eval/f1" in line] == EVAL_STEPS


def test_offline_wandb_run_holds_history_summary_config_table_and_model(single_run: Path) -> None:
    import wandb_records as w

    recs = w.records(w.run_file(single_run))
    history = w.history(recs)
    by_step: dict[int, dict] = {}
    for row in history:
        by_step.setdefault(row["_step"], {}).update(row)
    for step in LOG_STEPS:
        assert TRACKED_TRAIN_KEYS <= set(by_step[step]), (step, sorted(by_step[step]))
    assert [s for s in sorted(by_step) if TRACKED_EVAL_KEYS <= set(by_step[s])] == EVAL_STEPS
    assert all(row["train/global_step"] == row["_step"] for row in history)  # Trainer's x-axis, on every record
    logged = [json.loads(line) for line in (single_run / "train_log.jsonl").read_text().splitlines()]
    for line in logged:  # W&B holds exactly what the step log holds, under the trackers' names
        values = tracker_keys({k: v for k, v in line.items() if k != "step"})
        assert all(by_step[line["step"]][k] == pytest.approx(v) for k, v in values.items())

    m = read_metrics(single_run)
    summary = w.summary(recs)
    assert summary["eval/exact_match"] == pytest.approx(m["exact_match"])
    assert summary["eval/f1"] == pytest.approx(m["f1"])
    assert summary["train_samples_per_second"] == m["train_samples_per_second"]
    config = w.config(recs)
    assert (config["strategy"], config["world_size"], config["device"], config["mixed_precision"]) == (
        "single",
        1,
        "cpu",
        "no",
    )
    assert config["learning_rate"] == 1e-3 and config["global_batch_size"] == 8

    table = summary["eval/samples"]
    assert table["_type"] == "table-file" and table["ncols"] == 6 and 0 < table["nrows"] <= 100
    saved = json.loads((w.run_file(single_run).parent / "files" / table["path"]).read_text())
    assert saved["columns"] == ["id", "question", "gold answers", "prediction", "exact_match", "f1"]
    predictions = json.loads((single_run / "eval_predictions.json").read_text())
    for qid, _question, gold, prediction, em, f1 in saved["data"]:
        assert prediction == predictions[qid] and em in (0.0, 1.0) and 0 <= f1 <= 1
        assert em == 0.0 or prediction.lower() in gold.lower()
    kinds = {(a.type, a.name.split("-")[0]) for a in w.artifacts(recs)}
    assert ("model", "model") in kinds, kinds  # --wandb_log_model
    (model,) = [a for a in w.artifacts(recs) if a.type == "model"]
    stored = {entry.path for entry in model.manifest.contents}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= stored


def test_tensorboard_events_hold_every_key_at_every_interval(single_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(single_run / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert TRACKED_TRAIN_KEYS | TRACKED_EVAL_KEYS <= tags, sorted(tags)
    for key in TRACKED_TRAIN_KEYS:
        assert [e.step for e in events.Scalars(key)] == LOG_STEPS, key
    assert [e.step for e in events.Scalars("eval/f1")] == EVAL_STEPS
    m = read_metrics(single_run)
    assert events.Scalars("eval/f1")[-1].value == pytest.approx(m["f1"], rel=1e-6)


def test_best_evaluation_is_recorded(single_run: Path) -> None:
    m = read_metrics(single_run)
    lines = [json.loads(line) for line in (single_run / "train_log.jsonl").read_text().splitlines()]
    scored = [(line["eval/f1"], line["step"]) for line in lines if "eval/f1" in line and line["step"] > 0]
    best_f1 = max(f1 for f1, _ in scored)
    assert m["best_f1"] == pytest.approx(best_f1)
    assert m["best_eval_step"] == max(step for f1, step in scored if f1 == best_f1)  # a tie goes to the later
    assert m["exported_step"] == STEPS  # without --save_best the export is the last model
    assert not (single_run / "checkpoints").exists(), "no --checkpointing_steps and no stop request: none written"


def test_exported_model_answers_a_question(single_run: Path) -> None:
    """The export loads with from_pretrained and answers; through transformers' QA pipeline where the
    installed transformers still has it (removed in 5.x), else through qa_train.predict."""
    from transformers.pipelines import SUPPORTED_TASKS

    article = json.loads(DEMO_DEV.read_text())["data"][0]["paragraphs"][0]
    question, context = article["qas"][0]["question"], article["context"]
    if "question-answering" in SUPPORTED_TASKS:
        from transformers import pipeline

        out = pipeline("question-answering", model=str(single_run / "final"), device="cpu")(
            question=question, context=context
        )
    else:
        from qa_train.predict import answer

        out = answer(str(single_run / "final"), question, context)  # in the windows the run recorded, 192/64
        predictions = json.loads((single_run / "eval_predictions.json").read_text())
        assert out["answer"] == predictions[article["qas"][0]["id"]], "same answer as evaluation"
    assert out["answer"] and context[out["start"] : out["end"]] == out["answer"]


def test_world_size_guard_refuses_a_split_launch(tmp_path: Path, env: dict[str, str]) -> None:
    """`accelerate launch --multi_gpu` without CUDA starts 2 lone processes; qa_train must refuse to train."""
    out = tmp_path / "split"
    proc = run_cmd(
        [
            PY,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--main_process_port",
            str(port(29612)),
            "--log_dir",  # accelerate hands torchrun its own None over the suite's PET_LOG_DIR
            os.devnull,
            "-m",
            "qa_train",
            *tiny_flags(out, "--max_train_steps", "5"),
        ],
        env,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "WORLD_SIZE=2" in proc.stderr and "they would train separate models" in proc.stderr
    assert not (out / "metrics.json").exists()


@pytest.mark.usefixtures("in_process", "own_logging")
def test_profile_writes_a_trace_and_prints_top_operators(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    flags = tiny_flags(out, "--max_train_steps", "8", "--profile", "--no_eval", "--save_final_model", "false")
    code, said, err = main_here(flags, capsys)
    assert code == 0, err[-3000:]
    traces = list((out / "profile").glob("rank0*.pt.trace.json"))
    assert len(traces) == 1, list((out / "profile").iterdir())
    events = json.loads(traces[0].read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert "aten::addmm" in names or "aten::mm" in names, "the trace should hold the model's matmuls"
    assert "Self CPU" in said and "aten::" in said, "the top-operator table goes to stdout"
    # metrics.json's eval_runtime_s is present and empty when evaluation is skipped
    assert read_metrics(out)["eval_runtime_s"] is None
