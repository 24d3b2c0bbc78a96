"""--do_predict on two DDP processes, and `qa-train predict` on a file, alone or on two processes: one answer per
question, the same answers whatever the world size, batch size or entry point (on a model whose padding logits beat
every real token's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import (
    DEMO_DEV,
    DEMO_TRAIN,
    PY,
    base_env,
    cpu_launch,
    exit_probe_env,
    high_padding_model,
    main_here,
    port,
    run_ok,
)

from qa_train.data.load import load_file


def _unlabelled(path: Path) -> Path:
    """The demo dev set in nested SQuAD JSON without any `answers`: what a user asks to predict."""
    data = json.loads(DEMO_DEV.read_text())
    for article in data["data"]:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                del qa["answers"]
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two DDP processes, eval batch 8 per process, no training: evaluation and prediction of the same weights."""
    tmp = tmp_path_factory.mktemp("ddp-predict")
    paths = {"model": high_padding_model(tmp / "model"), "test": _unlabelled(tmp / "test.json"), "out": tmp / "run"}
    run_ok(
        [
            *cpu_launch("ddp", port(29711)),
            "--model_name_or_path",
            str(paths["model"]),
            "--train_file",
            str(DEMO_TRAIN),
            "--validation_file",
            str(DEMO_DEV),
            "--max_train_samples",
            "32",
            "--max_seq_length",
            "192",
            "--doc_stride",
            "64",
            "--max_train_steps",
            "0",
            "--per_device_eval_batch_size",
            "8",
            "--do_predict",
            "--test_file",
            str(paths["test"]),
            "--report_to",
            "none",
            "--save_final_model",
            "false",
            "--output_dir",
            str(paths["out"]),
        ],
        base_env(tmp),
    )
    return paths


def test_ddp_writes_exactly_one_prediction_per_question(ddp_run: dict[str, Path]) -> None:
    out = ddp_run["out"]
    ids = load_file(ddp_run["test"], "optional").ids
    assert len(ids) == 250
    for name in ("predict_predictions.json", "predict_nbest_predictions.json"):
        # A JSON object cannot hold a key twice; count the keys as written, not as parsed.
        pairs = json.loads((out / name).read_text(), object_pairs_hook=lambda kv: kv)
        assert sorted(k for k, _ in pairs) == sorted(ids), name
    predictions = json.loads((out / "predict_predictions.json").read_text())
    nbest = json.loads((out / "predict_nbest_predictions.json").read_text())
    for qid, entries in nbest.items():
        assert 1 <= len(entries) <= 20 and entries[0]["text"] == predictions[qid]
        assert sum(e["probability"] for e in entries) == pytest.approx(1.0)
    assert json.loads((out / "metrics.json").read_text())["world_size"] == 2


def predict_here(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`qa-train predict` in this process (main_here): the process path, ranks leaving their group and exiting, is
    held by the two-process test below."""
    from qa_train import predict

    return main_here(argv, capsys, predict.main)


@pytest.mark.usefixtures("in_process")
def test_answers_do_not_depend_on_world_size_or_entry_point(
    ddp_run: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One process, batch 64, through qa_train.predict's file mode: the DDP run's answers, for evaluation
    (the same questions, labelled) and prediction alike."""
    out = tmp_path / "single"
    flags = ["--test_file", str(ddp_run["test"]), "--max_seq_length", "192", "--doc_stride", "64"]
    flags += ["--per_device_eval_batch_size", "64", "--output_dir", str(out)]
    code, _, err = predict_here([str(ddp_run["model"]), *flags], capsys)
    assert code == 0, err[-3000:]
    single = json.loads((out / "predict_predictions.json").read_text())
    assert single == json.loads((ddp_run["out"] / "predict_predictions.json").read_text())
    assert single == json.loads((ddp_run["out"] / "eval_predictions.json").read_text())
    # The same candidates in the same order; their scores agree to float rounding (other batch shapes).
    ours = json.loads((out / "predict_nbest_predictions.json").read_text())
    theirs = json.loads((ddp_run["out"] / "predict_nbest_predictions.json").read_text())
    for qid, entries in ours.items():
        assert [(e["text"], e["start"], e["end"]) for e in entries] == [
            (e["text"], e["start"], e["end"]) for e in theirs[qid]
        ], qid
        assert [e["score"] for e in entries] == pytest.approx([e["score"] for e in theirs[qid]], abs=1e-4)


def test_predict_on_two_processes_answers_as_one_and_leaves_its_group(ddp_run: dict[str, Path], tmp_path: Path) -> None:
    """`qa-train predict` under a launcher (torchrun on CPU; `accelerate launch -m qa_train.cli predict` on GPUs):
    the windows shared over two ranks, the DDP run's answers. Each rank leaves the process group before it exits
    (no gloo thread left for the interpreter's teardown) and ends through qa_train's exit with 0."""
    out, probes = tmp_path / "two", tmp_path / "exit"
    env = {**base_env(tmp_path), "ACCELERATE_USE_CPU": "true", **exit_probe_env(probes)}
    launch = [PY, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port(29712))]
    flags = ["--test_file", str(ddp_run["test"]), "--max_seq_length", "192", "--doc_stride", "64"]
    run_ok([*launch, "-m", "qa_train.cli", "predict", str(ddp_run["model"]), *flags, "--output_dir", str(out)], env)
    two = json.loads((out / "predict_predictions.json").read_text())
    assert two == json.loads((ddp_run["out"] / "predict_predictions.json").read_text())
    ranks = sorted((json.loads(p.read_text()) for p in probes.glob("*.json")), key=lambda r: r["rank"])
    assert [(r["rank"], r["gloo_threads"], r["os_exit"]) for r in ranks] == [("0", 0, 0), ("1", 0, 0)], ranks


@pytest.mark.usefixtures("in_process")
def test_predict_cli_answers_one_question_and_refuses_bad_input(
    ddp_run: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    article = json.loads(DEMO_DEV.read_text())["data"][0]["paragraphs"][0]
    question = ["-q", article["qas"][0]["question"], "-c", article["context"]]
    code, said, err = predict_here(
        [str(ddp_run["model"]), *question, "--max_seq_length", "192", "--doc_stride", "64"], capsys
    )
    assert code == 0, err[-3000:]
    one = json.loads(said.strip().splitlines()[-1])
    assert article["context"][one["start"] : one["end"]] == one["answer"] != ""
    assert (
        one["answer"] == json.loads((ddp_run["out"] / "predict_predictions.json").read_text())[article["qas"][0]["id"]]
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x1", "context": "Some text.", "question": "  "}) + "\n")
    code, _, err = predict_here([str(ddp_run["model"]), "--test_file", str(bad)], capsys)
    assert code == 2 and f"{bad}: line 1: question x1: empty question" in err
    assert "Traceback" not in err
