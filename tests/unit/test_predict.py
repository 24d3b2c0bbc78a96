"""qa_train.predict's refusals: one line, exit 2, before any work is spent; and what it prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DEMO_DEV, TINY, high_padding_model, tiny_flags

from qa_train import predict
from qa_train.config.flags import parse_args
from qa_train.data.load import Examples, load_file
from qa_train.data.splits import load_splits, unanswered_note
from qa_train.model.modeling import loading
from qa_train.squad.postprocess import Answers


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """predict.main(argv)'s one-line refusal (exit 2, no answer, no traceback; libraries that got to load may
    still print their own notices)."""
    code = predict.main(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("qa-train predict")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, (code, out, err)
    assert not [line for line in out.splitlines() if line.startswith(("{", "/"))], out
    assert lines[0].startswith("qa-train predict: error: ")
    return lines[0][len("qa-train predict: error: ") :]


def a_run(tmp_path: Path) -> Path:
    """A run folder as training leaves it: a checkpoint, and the export in final/."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_00000010").mkdir(parents=True)
    (run / "checkpoints" / "step_00000010" / "trainer_state.json").write_text("{}")
    (run / "checkpoints" / "step_00000010" / "model.safetensors").write_bytes(b"")
    (run / "final").mkdir()
    for name in ("config.json", "tokenizer.json"):
        (run / "final" / name).write_text((TINY / name).read_text())
    return run


@pytest.mark.parametrize(
    ("model_dir", "says"),
    [
        (
            "empty",
            "empty: no config.json, so not an exported model (a run's final/ holds config.json, the weights and "
            "the tokenizer)",
        ),
        ("nope/x", "nope/x: no such directory"),
        ("run/final/config.json", "config.json: is a file, not a model directory"),
        (
            "run/checkpoints/step_00000010",
            "step_00000010: is a training checkpoint (weights and optimizer state, "
            "without the model config and tokenizer), not an exported model: use {final}",
        ),
        ("run", "run: is a run directory, not a model: use {final}"),
        (
            "config_only",
            "config_only: no tokenizer (tokenizer.json, vocab.txt, ...): a run's final/ holds the "
            "tokenizer it trained with",
        ),
    ],
)
def test_a_model_dir_that_is_not_an_exported_model_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model_dir: str, says: str
) -> None:
    """Each was a transformers traceback (exit 1); a checkpoint or run folder now says which final/ to use."""
    run = a_run(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "config_only").mkdir()
    (tmp_path / "config_only" / "config.json").write_text((TINY / "config.json").read_text())
    message = refused([str(tmp_path / model_dir), "-q", "Who?", "-c", "Somebody."], capsys)
    assert message.startswith("MODEL_DIR ") and message.endswith(says.format(final=(run / "final").resolve()))


def test_a_mistyped_relative_model_dir_is_no_such_directory_not_a_hub_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`runs/x` reads like a hub id (org/name): it was sent to the hub, and the line said the hub could not be
    reached. Its first part is a folder here, so it is a local path that does not exist."""
    a_run(tmp_path)
    monkeypatch.chdir(tmp_path)
    message = refused(["run/fnal", "-q", "Who?", "-c", "Somebody."], capsys)
    assert message == "MODEL_DIR run/fnal: no such directory"


def test_a_model_dir_transformers_cannot_load_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The bundled tiny BERT has a config and a tokenizer but no weights."""
    message = refused([str(TINY), "-q", "Who?", "-c", "Somebody."], capsys)
    assert message.startswith(f"MODEL_DIR {TINY}: cannot load the model (OSError: ")
    assert "model.safetensors" in message


def test_a_tokenizer_transformers_cannot_read_is_refused_as_model_dirs_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """predict has no --model_name_or_path: its refusal names MODEL_DIR, not the training flag."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((TINY / "config.json").read_text())
    (broken / "tokenizer.json").write_text("not json")
    message = refused([str(broken), "-q", "Who?", "-c", "Somebody."], capsys)
    assert message.startswith(f"MODEL_DIR {broken}: cannot load the model (JSONDecodeError: ")


def test_a_hub_id_transformers_cannot_fetch_is_refused_in_one_line() -> None:
    predict.check_model_dir("org/model")  # no such folder here, but a hub id: left to transformers
    with pytest.raises(
        predict.ConfigError,
        match=r"^MODEL_DIR org/model: cannot load the model \(OSError: "
        r"We couldn't connect\)$",
    ):
        with loading("MODEL_DIR", "org/model", "the model"):
            raise OSError("We couldn't connect\nto the hub")


@pytest.mark.parametrize(
    ("question", "context", "says"),
    [
        ("Who?", "", "empty context"),
        ("Who?", "  \u200b", "empty context (only invisible characters: U+200B)"),
        ("", "Somebody did it.", "empty question"),
        ("   ", "Somebody did it.", "empty question"),
    ],
)
def test_an_empty_question_or_context_is_refused(
    capsys: pytest.CaptureFixture[str], question: str, context: str, says: str
) -> None:
    """A file's empty question is refused; -q/-c answered it: "" with score NaN (not JSON), or a span of a
    context for an empty question."""
    message = refused([str(TINY), "-q", question, "-c", context], capsys)
    assert message == f"<command line>: -q/-c: question q: {says}"


@pytest.mark.parametrize("inside", [False, True])
def test_an_output_dir_that_is_a_file_is_refused_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], inside: bool
) -> None:
    """It was a FileExistsError / NotADirectoryError traceback after every question had been answered."""
    file = tmp_path / "preds"
    file.write_text("not a folder")
    target = file / "sub" if inside else file
    message = refused([str(tmp_path / "no-model"), "--test_file", str(DEMO_DEV), "--output_dir", str(target)], capsys)
    assert message == (
        f"--output_dir {target}: {file} is a file, not a directory"
        if inside
        else f"--output_dir {target}: is a file, not a directory"
    )


def test_an_output_dir_that_cannot_be_written_is_refused_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """os.access says yes to root under /sys, where nothing can be made: that was a FileNotFoundError traceback
    (exit 1) after every question had been answered. The same folder training refuses (test_faults.py)."""
    target = Path("/sys/qa_train_test_predict_out")
    message = refused([str(tmp_path / "no-model"), "--test_file", str(DEMO_DEV), "--output_dir", str(target)], capsys)
    assert message.startswith(f"--output_dir {target}: /sys is not writable"), message


def test_data_refused_while_windowing_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windowing refuses some questions (a text the tokenizer turns into nothing, flags that leave a question no
    room): that was a traceback (exit 1) from Predictor.predict."""
    import qa_train.data.features

    def refuse(examples: Examples, *args: object, **kwargs: object) -> None:
        raise predict.DataError(f"{examples.source}: question q: the context tokenises to nothing")

    model = high_padding_model(tmp_path / "model")
    monkeypatch.setattr(qa_train.data.features, "featurize", refuse)
    message = refused([str(model), "-q", "Who?", "-c", "\ufffd", "--device", "cpu"], capsys)
    assert message == "<command line>: question q: the context tokenises to nothing"


def test_a_model_without_a_trained_qa_head_is_refused_naming_the_missing_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A masked-LM checkpoint answered from a randomly initialised QA head with exit 0 (issue 38, case 10)."""
    import shutil

    import torch
    from transformers import AutoConfig, BertForMaskedLM

    model = tmp_path / "mlm"
    torch.manual_seed(0)
    BertForMaskedLM(AutoConfig.from_pretrained(TINY)).save_pretrained(model)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(TINY / name, model / name)
    message = refused([str(model), "-q", "Who?", "-c", "Somebody.", "--device", "cpu"], capsys)
    assert message == (
        f"{model}: not a trained question-answering model: its weights lack qa_outputs.bias, qa_outputs.weight "
        "(randomly initialised, they would answer at random); fine-tune it with qa-train first"
    )
    # A trained one (every weight in its file) still answers.
    trained = high_padding_model(tmp_path / "qa")
    assert predict.main([str(trained), "-q", "Who?", "-c", "Somebody.", "--device", "cpu"]) == 0


def test_a_transformers_trainer_checkpoint_answers_as_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers' Trainer writes checkpoint-N/ with its own trainer_state.json beside config.json, the weights
    and the tokenizer: a model from_pretrained loads, which predict refused as a qa_train training checkpoint."""
    checkpoint = high_padding_model(tmp_path / "hf-run" / "checkpoint-500")
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 500, "log_history": []}))
    assert predict.main([str(checkpoint), "-q", "Who?", "-c", "Somebody.", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["answer"]


def test_an_inductor_cache_that_cannot_be_made_is_named_not_blamed_on_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was "MODEL_DIR ...: cannot load the model (NotADirectoryError: ...)": torch makes the folder on import."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "file" / "inductor"))
    message = refused([str(TINY), "-q", "Who?", "-c", "Somebody."], capsys)
    assert message.startswith(f"TORCHINDUCTOR_CACHE_DIR={tmp_path}/file/inductor: cannot be created (Not a directory)")


def test_no_answer_at_all_prints_json_not_nan() -> None:
    """No window held a valid span: the score was NaN, which json.dumps writes and JSON readers refuse."""
    entry = predict.best_entry(Answers({"q": ""}, {"q": []}), "q")
    assert json.loads(json.dumps(entry, allow_nan=False)) == {
        "answer": "",
        "score": None,
        "probability": 0.0,
        "start": 0,
        "end": 0,
    }


def test_v2_data_without_version_2_with_negative_gets_a_note() -> None:
    """Its unanswerable questions would each get a span, silently."""
    v2 = load_file(DEMO_DEV.parent.parent / "demo-v2" / "dev.json", "optional")
    unanswered = sum(not texts for texts in v2.answer_texts)
    assert 0 < unanswered < len(v2)
    assert unanswered_note(v2, v2=False) == (
        f"{v2.source}: {unanswered} of {len(v2)} questions have no answer (SQuAD v2.0 data?); without "
        '--version_2_with_negative every question gets a span, never ""'
    )
    assert unanswered_note(v2, v2=True) is None
    assert unanswered_note(load_file(DEMO_DEV, "optional"), v2=False) is None  # v1.1: every question answered
    unlabelled = Examples("questions.jsonl")
    unlabelled.append("q1", "", "Some text.", "Who?", [], [])
    assert unanswered_note(unlabelled, v2=False) is None  # no answers at all: nothing to tell v1.1 from v2.0


def test_a_training_runs_do_predict_notes_v2_data_as_qa_train_predict_does() -> None:
    """docs/training.md: such a --test_file gets a note; only `qa-train predict` gave it, --do_predict said
    nothing (found running the doc's claims on CPU)."""
    v2_dev = DEMO_DEV.parent.parent / "demo-v2" / "dev.json"
    flags = ["--model_name_or_path", "m", "--do_train", "false", "--no_eval", "--do_predict"]
    splits = load_splits(parse_args([*flags, "--test_file", str(v2_dev)]))
    assert splits.warnings == [unanswered_note(splits.test, v2=False)]
    assert splits.warnings[0] is not None
    v2_splits = load_splits(parse_args([*flags, "--test_file", str(v2_dev), "--version_2_with_negative"]))
    assert v2_splits.warnings == []


def test_a_nan_null_threshold_is_refused_as_training_refuses_it(capsys: pytest.CaptureFixture[str]) -> None:
    """Every comparison with nan is false: the null answer could never win, and every question got a span."""
    message = refused(
        [
            str(TINY),
            "-q",
            "Who?",
            "-c",
            "Somebody did it.",
            "--version_2_with_negative",
            "--null_score_diff_threshold",
            "nan",
        ],
        capsys,
    )
    assert message == "--null_score_diff_threshold: must be a finite number, got nan"


class _Answering:
    """A Predictor stand-in (no model): what Predictor.predict returns on the main process, or elsewhere None."""

    def __init__(self, answers: Answers | None) -> None:
        self.answers = answers

    def __call__(self, *args: object, **kwargs: object) -> _Answering:
        return self

    def predict(self, examples: Examples) -> Answers | None:
        assert examples.ids == ["q"]
        return self.answers


def test_answer_is_none_off_the_main_process_as_predict_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a launch only the main process answers: answer() said nothing there but failed on the missing
    Answers (AttributeError), where Predictor.predict and the command line return None and exit 0."""
    monkeypatch.setattr(predict, "Predictor", _Answering(None))
    assert predict.answer("unused", "Who?", "Someone.") is None
    monkeypatch.setattr(predict, "Predictor", _Answering(Answers({"q": ""}, {"q": []})))
    assert predict.answer("unused", "Who?", "Someone.") == {
        "answer": "",
        "score": None,
        "probability": 0.0,
        "start": 0,
        "end": 0,
    }


def test_an_export_records_how_its_run_answers_and_predict_answers_so(tmp_path: Path) -> None:
    """`qa-train predict` defaulted to 384/128 windows whatever the run trained and evaluated with, so a model
    trained at 96/64 answered 121 of the demo's 250 dev questions as its evaluation had (found running
    docs/training.md's claims). The export records the run's windows and span rules in its config.json; predict
    takes them unless a flag says otherwise."""
    from transformers import AutoConfig, AutoTokenizer, BertForQuestionAnswering

    from qa_train.config.settings import ANSWERING_KEY
    from qa_train.strategy.saving import _write_export

    train = [*tiny_flags(tmp_path / "run"), "--max_seq_length", "96", "--doc_stride", "32", "--n_best_size", "7"]
    args = parse_args([*train, "--version_2_with_negative", "--null_score_diff_threshold", "1.5"])
    model = BertForQuestionAnswering(AutoConfig.from_pretrained(TINY))
    export = tmp_path / "final"
    _write_export(model, model.state_dict(), AutoTokenizer.from_pretrained(TINY), export, args.answering())
    recorded = predict.recorded_answering(str(export))
    assert recorded == args.answering() == json.loads((export / "config.json").read_text())[ANSWERING_KEY]

    def settings(*flags: str) -> tuple[object, ...]:
        data, rules = predict._settings(
            predict._parser().parse_args([str(export), "-q", "Who?", "-c", "Him.", *flags]), recorded
        )
        return (
            data.max_seq_length,
            data.doc_stride,
            rules.n_best_size,
            rules.max_answer_length,
            rules.null_score_diff_threshold,
        )

    assert settings() == (96, 32, 7, 30, 1.5)
    assert settings("--max_seq_length", "128", "--null_score_diff_threshold", "0") == (128, 32, 7, 30, 0.0)
    # A model that records nothing (a hub model, an older export): training's defaults, v1.1.
    assert predict.recorded_answering(str(TINY)) == predict.RECORDED
    data, rules = predict._settings(
        predict._parser().parse_args([str(TINY), "-q", "Who?", "-c", "Him."]), predict.RECORDED
    )
    assert (data.max_seq_length, data.doc_stride, rules.null_score_diff_threshold) == (384, 128, None)


def test_a_damaged_answering_record_is_refused_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from qa_train.config.settings import ANSWERING_KEY

    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (model / name).write_text((TINY / name).read_text())
    config = json.loads((TINY / "config.json").read_text())
    for record, at in (
        ({"max_seq_length": "96"}, "max_seq_length"),
        ({"version_2_with_negative": 1}, "version_2_with_negative"),
        ([96], "it"),
    ):
        (model / "config.json").write_text(json.dumps({**config, ANSWERING_KEY: record}))
        assert refused([str(model), "-q", "Who?", "-c", "Him."], capsys) == (
            f"{model / 'config.json'}: {ANSWERING_KEY} is not a qa_train export's record (at {at})"
        )
