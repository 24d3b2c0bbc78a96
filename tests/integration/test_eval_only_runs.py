"""--do_train false, as Trainer users type it: a model evaluated on the validation split, under any strategy and
process count, with no training file read, and metrics.json, the summary and `plan --check` saying so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DEMO_DEV, PY, TINY, base_env, export_answers, main_here, port, read_metrics, run_ok
from hub_folders import hub_download

PORTS = iter(range(port(29720), port(29740)))
TRAINING_FIGURES = (
    "train_samples_per_second",
    "train_runtime_s",
    "train_steps",
    "train_loss",
    "num_train_examples",
    "global_batch_size",
    "timed_steps",
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny BERT with a QA head and weights (seeded random): any saved model is one to evaluate."""
    import torch
    from transformers import AutoConfig, AutoModelForQuestionAnswering, AutoTokenizer

    folder = tmp_path_factory.mktemp("model") / "tiny-qa"
    torch.manual_seed(0)
    AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(TINY)).save_pretrained(folder)
    AutoTokenizer.from_pretrained(TINY).save_pretrained(folder)
    return folder


def eval_flags(model: Path, out: Path, *extra: str) -> list[str]:
    """tiny_flags' windows and batch, less everything that trains."""
    return [
        "--do_train",
        "false",
        "--model_name_or_path",
        str(model),
        "--max_seq_length",
        "192",
        "--doc_stride",
        "64",
        "--per_device_eval_batch_size",
        "32",
        "--report_to",
        "none",
        "--output_dir",
        str(out),
        *extra,
    ]


def assert_an_evaluation(out: Path, model: Path, world_size: int) -> dict:
    """metrics.json of an evaluation: scores and what it ran on, no training figure, no export; the answers are
    the model's own (as qa-train predict gives them)."""
    m = read_metrics(out)
    assert m["args"]["do_train"] is False and m["world_size"] == world_size
    assert {k: m[k] for k in TRAINING_FIGURES} == dict.fromkeys(TRAINING_FIGURES), "no training figure, not even 0"
    assert m["num_eval_examples"] == 250 and 0 <= m["exact_match"] <= m["f1"] <= 100 and m["eval_runtime_s"] > 0
    assert not (out / "final").exists() and not (out / "checkpoints").exists(), "nothing trained, nothing exported"
    answers = json.loads((out / "eval_predictions.json").read_text())
    assert answers == export_answers(model)
    return m


def test_an_evaluation_only_run_reads_no_training_data_and_says_what_it_did(model_dir: Path, tmp_path: Path) -> None:
    # A hub-layout folder holding only the validation split: a run that asked for "train" would be refused.
    data = hub_download(tmp_path / "squad", splits=("validation",))
    out = tmp_path / "eval"
    env = base_env(tmp_path)
    proc = run_ok([PY, "-m", "qa_train", *eval_flags(model_dir, out, "--dataset_name", str(data))], env)
    assert_an_evaluation(out, model_dir, world_size=1)
    assert "no training; eval: 250 questions -> 250 windows" in proc.stderr
    assert "--do_train false: nothing trained, nothing exported" in proc.stdout
    assert "throughput" not in proc.stdout and "global batch" not in proc.stdout and "train steps" not in proc.stdout
    logged = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [sorted(line) for line in logged] == [["eval/exact_match", "eval/f1", "eval/runtime_s", "step"]]

    check = run_ok([PY, "-m", "qa_train.cli", "plan", "--check", str(out)], env)
    assert "skipped: an evaluation-only run (--do_train false) measured no training memory" in check.stdout
    assert "estimate / measured" in check.stdout and "274" not in check.stdout


# The two runs below need nothing of a process of their own: main() in this process.
@pytest.mark.usefixtures("in_process", "own_logging")
def test_the_demo_evaluates_a_named_model_without_its_training_file(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo-eval"
    flags = ["--offline_demo", "--do_train", "false", "--model_name_or_path", str(model_dir), "--output_dir", str(out)]
    code, _, said = main_here([*flags, "--report_to", "none"], capsys)
    assert code == 0, said[-3000:]
    m = read_metrics(out)
    assert m["num_train_examples"] is None and m["args"]["train_file"] is None and m["num_eval_examples"] == 250
    assert "no training;" in said


@pytest.mark.usefixtures("in_process", "own_logging")
def test_a_flag_only_training_reads_is_refused_in_one_line(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = eval_flags(model_dir, tmp_path / "o", "--validation_file", str(DEMO_DEV))
    code, _, said = main_here([*flags, "--max_train_steps", "5"], capsys)
    assert code == 2
    assert "Traceback" not in said
    assert said.strip().splitlines()[-1] == (
        "qa_train: error: --do_train: false trains nothing, so --max_train_steps would do nothing (nor is a model "
        "exported): drop it"
    )


@pytest.mark.parametrize("config", ["zero2", "zero3", "fsdp"])
def test_an_evaluation_only_run_under_each_sharded_strategy_on_two_processes(
    config: str, model_dir: Path, tmp_path: Path
) -> None:
    """ZeRO-2 has no optimizer to shard and runs at stage 0; ZeRO-3 and FSDP shard the weights: the answers are the
    single-process model's under each."""
    out = tmp_path / config
    launch = [PY, "-m", "qa_train.cli", "launch", "--cpu", "--config_file", f"accelerate_configs/{config}.yaml"]
    launch += ["--num_processes", "2", "--main_process_port", str(next(PORTS)), "--"]
    run_ok([*launch, *eval_flags(model_dir, out, "--validation_file", str(DEMO_DEV))], base_env(tmp_path))
    m = assert_an_evaluation(out, model_dir, world_size=2)
    assert m["strategy"] == config and len(m["peak_host_rss_gb"]["per_rank"]) == 2
