"""What is refused before any data or model work: occupied or unwritable output dirs, windows longer than the
model's positions, tokenizers with the classifier token last or left padding; and the master weights' precision
whatever the checkpoint stores."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import PAST_PREFLIGHT, TINY, main_here, preflight_says, tiny_flags

from qa_train.config.outputdir import Cleared, claim, clear_previous_run
from qa_train.config.settings import ConfigError, ModelArgs, OutputArgs
from qa_train.model.modeling import check_positions, load_model, load_model_config, load_tokenizer, loading


def finished_run(out: Path) -> Path:
    """What a run leaves, with the marks that make it provably qa_train's: a checkpoint with its trainer state and
    manifest, an export's config and weights, metrics.json with qa_train's version."""
    step = out / "checkpoints" / "step_00000002"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_text("{}")
    (step / "model.safetensors").write_bytes(b"weights")
    (step / "manifest.json").write_text(json.dumps({"files": {"trainer_state.json": 2, "model.safetensors": 7}}))
    (out / "final").mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt"):
        (out / "final" / name).write_text("{}")
    (out / "metrics.json").write_text(json.dumps({"qa_train_version": "0.1.0"}))
    (out / "notes.txt").write_text("the user's own file")
    return out


def test_a_fresh_or_foreign_folder_is_claimed(tmp_path: Path) -> None:
    claim(OutputArgs(output_dir=str(tmp_path / "new" / "deeper")))
    assert (tmp_path / "new" / "deeper").is_dir()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "job.out").write_text("not a run")
    claim(OutputArgs(output_dir=str(tmp_path / "logs")))


def test_an_occupied_folder_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    out = finished_run(tmp_path / "out")
    with pytest.raises(ConfigError, match=r"holds a run \(metrics.json, final, checkpoints\).*--overwrite_output_dir"):
        claim(OutputArgs(output_dir=str(out)))
    assert (out / "metrics.json").exists() and (out / "checkpoints" / "step_00000002").is_dir()


def test_overwrite_removes_the_old_run_on_the_main_process_only(tmp_path: Path) -> None:
    out = finished_run(tmp_path / "out")
    args = OutputArgs(output_dir=str(out), overwrite_output_dir=True)
    claim(args)
    assert (out / "metrics.json").exists(), "claiming removes nothing: the data has not been read yet"
    assert clear_previous_run(args, is_main=False) == Cleared(["metrics.json", "final", "checkpoints"], [])
    assert (out / "metrics.json").exists(), "only the main process deletes"
    clear_previous_run(args, is_main=True)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_overwrite_refuses_to_train_from_inside_the_run_it_removes(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Training on from the last run's export in the same folder (`--model_name_or_path runs/x/final --output_dir
    runs/x --overwrite_output_dir`) removed that export once the model was loaded, before the first step: a run that
    then failed left neither model. Refused before anything is read; a source beside the run, a hub name, a folder
    that is itself the output_dir, and a resume that continues the run are not."""
    from qa_train.__main__ import main

    out = finished_run(tmp_path / "out")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    final = str(out / "final")
    assert main([*tiny_flags(out, "--max_train_steps", "1", "--overwrite_output_dir"), "--tokenizer_name", final]) == 2
    assert capsys.readouterr().err == (
        f"qa_train: error: --tokenizer_name {final}: is inside the run in --output_dir {out} (final), which "
        "--overwrite_output_dir removes before this run trains; copy it elsewhere first, or choose another "
        "--output_dir\n"
    )
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    overwrite = OutputArgs(output_dir=str(out), overwrite_output_dir=True)
    step = str(out / "checkpoints" / "step_00000002")
    with pytest.raises(ConfigError, match=r"^--model_name_or_path .*step_00000002: is inside .* \(checkpoints\)"):
        claim(overwrite, sources={"--model_name_or_path": step})
    (out / "data.json").write_text("{}")  # the user's, which the overwrite keeps
    claim(overwrite, sources={"--train_file": str(out / "data.json"), "--model_name_or_path": str(out)})
    claim(overwrite, sources={"--model_name_or_path": "bert-base-uncased", "--dataset_name": "squad"})
    resumed = OutputArgs(output_dir=str(out), overwrite_output_dir=True, resume_from_checkpoint="latest")
    claim(resumed, sources={"--model_name_or_path": final})  # continued, not removed


def test_a_stale_stop_request_goes_with_overwrite_and_is_not_a_run(tmp_path: Path) -> None:
    """A PREEMPT file left by a run killed before it answered would stop the next run at its first logging step."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "PREEMPT").touch()
    claim(OutputArgs(output_dir=str(out)))  # a stop request alone is no run to refuse
    finished_run(out)
    with pytest.raises(ConfigError, match=r"holds a run \(metrics.json, final, checkpoints\)"):
        claim(OutputArgs(output_dir=str(out)))
    args = OutputArgs(output_dir=str(out), overwrite_output_dir=True)
    assert clear_previous_run(args, is_main=True).removed == ["metrics.json", "final", "checkpoints", "PREEMPT"]
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    (out / "PREEMPT").touch()
    clear_previous_run(args, is_main=True)  # with no run beside it too
    assert not (out / "PREEMPT").exists()


def test_resume_continues_its_own_run_only(tmp_path: Path) -> None:
    out = finished_run(tmp_path / "out")
    claim(OutputArgs(output_dir=str(out), resume_from_checkpoint="latest"))
    inside = out / "checkpoints" / "step_00000002"
    claim(OutputArgs(output_dir=str(out), resume_from_checkpoint=str(inside)))
    elsewhere = tmp_path / "other" / "step_00000009"
    elsewhere.mkdir(parents=True)
    with pytest.raises(ConfigError, match="holds another run"):
        claim(OutputArgs(output_dir=str(out), resume_from_checkpoint=str(elsewhere)))
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "metrics.json").write_text(json.dumps({"qa_train_version": "0.1.0"}))
    with pytest.raises(ConfigError, match="without checkpoints"):
        claim(OutputArgs(output_dir=str(tmp_path / "done"), resume_from_checkpoint="latest"))


def test_overwrite_beside_a_resume_replaces_only_what_the_resume_does_not_continue(tmp_path: Path) -> None:
    """Both flags (slurm/train.sbatch always adds --resume_from_checkpoint latest): the refusals told the user to
    pass the --overwrite_output_dir they had passed, and the old run was never replaced."""
    done = tmp_path / "done"  # a finished run without checkpoints: nothing to resume, so overwrite replaces it
    done.mkdir()
    (done / "metrics.json").write_text(json.dumps({"qa_train_version": "0.1.0"}))
    args = OutputArgs(output_dir=str(done), resume_from_checkpoint="latest", overwrite_output_dir=True)
    claim(args)
    assert clear_previous_run(args, is_main=True).removed == ["metrics.json"]
    assert not (done / "metrics.json").exists()

    out = finished_run(tmp_path / "out")  # a checkpoint elsewhere: the run in out is not the one continued
    elsewhere = tmp_path / "other" / "step_00000009"
    elsewhere.mkdir(parents=True)
    args = OutputArgs(output_dir=str(out), resume_from_checkpoint=str(elsewhere), overwrite_output_dir=True)
    claim(args)
    assert clear_previous_run(args, is_main=True).removed == ["metrics.json", "final", "checkpoints"]

    out = finished_run(tmp_path / "again")  # its own checkpoints: a requeued job resumes them, overwrite or not
    for resume in ("latest", str(out / "checkpoints" / "step_00000002")):
        args = OutputArgs(output_dir=str(out), resume_from_checkpoint=resume, overwrite_output_dir=True)
        claim(args)
        assert clear_previous_run(args, is_main=True) == Cleared() and (out / "checkpoints" / "step_00000002").is_dir()


def test_an_empty_checkpoints_folder_is_nothing_for_latest_to_continue(tmp_path: Path) -> None:
    """A first save that failed (a full disk) leaves checkpoints/ empty. `latest` took that for this folder's run:
    alone it started over on top of the old files, and beside --overwrite_output_dir it kept the old run's
    predictions next to the new model (found with real runs)."""
    out = finished_run(tmp_path / "out")
    shutil.rmtree(out / "checkpoints" / "step_00000002")
    (out / "eval_predictions.json").write_text("{}")
    with pytest.raises(ConfigError, match="without checkpoints"):
        claim(OutputArgs(output_dir=str(out), resume_from_checkpoint="latest"))
    args = OutputArgs(output_dir=str(out), resume_from_checkpoint="latest", overwrite_output_dir=True)
    claim(args)
    assert "eval_predictions.json" in clear_previous_run(args, is_main=True).removed
    assert sorted(p.name for p in out.iterdir() if p.name != "checkpoints") == ["notes.txt"]  # left empty


def test_an_empty_output_dir_is_refused_and_the_working_directory_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """`--output_dir "$OUT"` with OUT unset: the run wrote into the working directory, and with
    --overwrite_output_dir deleted its final/, checkpoints/ and wandb/ (issue 38, case 2)."""
    from qa_train.__main__ import main

    cwd = finished_run(tmp_path / "thesis")
    (cwd / "final" / "thesis.tex").write_text("\\documentclass{report}")
    before = sorted(p.relative_to(cwd) for p in cwd.rglob("*"))
    monkeypatch.chdir(cwd)
    for extra in ([], ["--overwrite_output_dir"]):
        assert main([*tiny_flags(Path("x"), "--max_train_steps", "1", *extra), "--output_dir", ""]) == 2
        assert capsys.readouterr().err == (
            "qa_train: error: --output_dir: is empty (an unset shell variable?); name the run's folder, "
            "e.g. --output_dir runs/my-run\n"
        )
    assert sorted(p.relative_to(cwd) for p in cwd.rglob("*")) == before


@pytest.mark.usefixtures("in_process")
def test_a_deepspeed_json_against_the_flags_is_refused_before_any_window_or_the_old_run_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A JSON micro-batch of 4 against --per_device_train_batch_size 8 was refused once the data was featurised,
    the model loaded and --overwrite_output_dir had removed the previous run."""
    import qa_train.trainer

    out = finished_run(tmp_path / "out")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}))
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(ds))
    for name, value in {"LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():  # as launched
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(qa_train.trainer, "featurize_splits", lambda *a: pytest.fail("featurised"))
    code, _, err = main_here([*tiny_flags(out, "--max_train_steps", "1", "--overwrite_output_dir")], capsys)
    assert (code, err) == (
        2,
        f"qa_train: error: {ds}: 'train_micro_batch_size_per_gpu' is 4 but --per_device_train_batch_size is 8; "
        'set "train_micro_batch_size_per_gpu": "auto" in the JSON so the flag decides\n',
    )
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_overwrite_removes_only_what_is_provably_qa_trains_and_names_the_rest(tmp_path: Path) -> None:
    out = finished_run(tmp_path / "out")
    (out / "checkpoints" / "step_00000002" / "my-notes.txt").write_text("not in the manifest")
    (out / "checkpoints" / "step_00000009").mkdir()  # no trainer state or manifest: not a checkpoint of ours
    (out / "checkpoints" / "step_00000009" / "weights.pt").write_bytes(b"someone's")
    ours, theirs = out / "wandb" / "offline-run-20261126_1-ab12", out / "wandb" / "run-20240101_0-zz99"
    for run, config in ((ours, "config: {'qa_train_version': '0.1.0'}"), (theirs, "config: {'lr': 0.1}")):
        (run / "logs").mkdir(parents=True)
        (run / "logs" / "debug.log").write_text(config)
    (out / "wandb" / "latest-run").symlink_to(ours.name)
    (out / "tensorboard").mkdir()
    (out / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"a user's TensorBoard run")
    args = OutputArgs(output_dir=str(out), overwrite_output_dir=True)
    claim(args)
    cleared = clear_previous_run(args, is_main=True)
    assert cleared.removed == ["metrics.json", "final", "checkpoints", "wandb"]
    kept = [
        "checkpoints/step_00000002/my-notes.txt",
        "checkpoints/step_00000009",
        "wandb/run-20240101_0-zz99",
        "tensorboard",
    ]
    assert cleared.kept == kept
    left = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert left == [
        "checkpoints/step_00000002/my-notes.txt",
        "checkpoints/step_00000009/weights.pt",
        "notes.txt",
        "tensorboard/events.out.tfevents.1.host",
        "wandb/run-20240101_0-zz99/logs/debug.log",
    ]


def test_overwrite_removes_only_the_event_files_of_qa_trains_own_tensorboard_runs(tmp_path: Path) -> None:
    """One marked event file made every event file under tensorboard/ qa_train's, another experiment's too."""
    out = finished_run(tmp_path / "out")
    board = out / "tensorboard"
    (board / "legacy").mkdir(parents=True)
    (board / "other").mkdir()
    (board / "events.out.tfevents.1.host.1.0").write_bytes(b"hparams: {'qa_train_version': '0.1.0'}")
    (board / "legacy" / "hparams.yml").write_text("qa_train_version: 0.1.0\n")  # accelerate's own tracker
    (board / "legacy" / "events.out.tfevents.2.host.1.0").write_bytes(b"scalars only")
    (board / "other" / "events.out.tfevents.3.host.1.0").write_bytes(b"another experiment's scalars")
    args = OutputArgs(output_dir=str(out), overwrite_output_dir=True)
    claim(args)
    cleared = clear_previous_run(args, is_main=True)
    assert "tensorboard" in cleared.removed and cleared.kept == ["tensorboard/other/events.out.tfevents.3.host.1.0"]
    assert sorted(p.relative_to(board).as_posix() for p in board.rglob("*") if p.is_file()) == [
        "other/events.out.tfevents.3.host.1.0"
    ]


@pytest.mark.parametrize("flags", [{"overwrite_output_dir": True}, {"resume_from_checkpoint": "latest"}])
def test_a_metrics_json_qa_train_did_not_write_is_refused_not_written_over(flags: dict, tmp_path: Path) -> None:
    """It was "kept" by --overwrite_output_dir, said so, and then replaced by the run's own."""
    out = finished_run(tmp_path / "out")
    (out / "metrics.json").write_text('{"accuracy": 0.93}')
    with pytest.raises(ConfigError) as refused:
        claim(OutputArgs(output_dir=str(out), **flags))
    assert str(refused.value) == (
        f"--output_dir {out}: metrics.json is not qa_train's (it names no qa_train_version), and a run writes its "
        "own there; move it, or choose another --output_dir"
    )
    assert (out / "metrics.json").read_text() == '{"accuracy": 0.93}'


def test_a_conversion_left_by_a_killed_resume_goes_with_overwrite(tmp_path: Path) -> None:
    out = finished_run(tmp_path / "out")
    (out / "checkpoints" / ".portable-step_00000002").mkdir()
    (out / "checkpoints" / ".portable-step_00000002" / "weights.safetensors").write_bytes(b"half")
    args = OutputArgs(output_dir=str(out), overwrite_output_dir=True)
    claim(args)
    assert clear_previous_run(args, is_main=True).kept == []
    assert not (out / "checkpoints" / ".portable-step_00000002").exists()


@pytest.mark.parametrize("with_export", [True, False])
def test_a_final_folder_holding_a_users_files_is_never_replaced(with_export: bool, tmp_path: Path) -> None:
    """The export replaces final/ whole: a user's file there would go with it, overwrite or resume alike."""
    out = finished_run(tmp_path / "out")
    if not with_export:
        shutil.rmtree(out / "final")
        (out / "final").mkdir()
    (out / "final" / "thesis.tex").write_text("\\documentclass{report}")
    for args in (
        OutputArgs(output_dir=str(out), overwrite_output_dir=True),
        OutputArgs(output_dir=str(out), resume_from_checkpoint="latest"),
    ):
        with pytest.raises(ConfigError) as refused:
            claim(args)
        assert str(refused.value) == (
            f"--output_dir {out}: final/ holds what qa_train did not write (final/thesis.tex), and a run replaces "
            "that folder whole; move it, or choose another --output_dir"
        )
    assert (out / "final" / "thesis.tex").exists() and (out / "metrics.json").exists()


def test_the_ownership_rules_know_the_checkpoints_file_names() -> None:
    from qa_train.config import ownership
    from qa_train.strategy import checkpoint

    assert (ownership.MANIFEST, ownership.STATE_FILE) == (checkpoint.MANIFEST, checkpoint.STATE_FILE)


def test_an_unwritable_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ConfigError, match="not writable"):
        claim(OutputArgs(output_dir=str(tmp_path / "a_file" / "out")))


def test_windows_longer_than_the_positions_are_refused() -> None:
    config = SimpleNamespace(max_position_embeddings=512, model_type="bert", _name_or_path="bert-base-uncased")
    unset = SimpleNamespace(model_max_length=int(1e30))
    check_positions(config, unset, 512)
    with pytest.raises(ConfigError, match=r"--max_seq_length 513: the model has 512 position embeddings"):
        check_positions(config, unset, 513)
    with pytest.raises(ConfigError, match="256 tokenizer model_max_length"):
        check_positions(config, SimpleNamespace(model_max_length=256), 384)


def test_a_doc_stride_that_leaves_no_room_for_the_question_is_refused_before_any_data() -> None:
    """It was refused only at featurisation, as a DataError naming the first question, after the run had started
    (and, with --overwrite_output_dir, after the old run was deleted)."""
    tokenizer = load_tokenizer(ModelArgs(tokenizer_name=str(TINY)))
    config = SimpleNamespace(max_position_embeddings=512, model_type="bert", _name_or_path="tiny")
    check_positions(config, tokenizer, 64)  # without a stride: positions only, as before
    check_positions(config, tokenizer, 64, doc_stride=59)  # [CLS] q [SEP] c [SEP]: one question token, 60 context
    with pytest.raises(
        ConfigError,
        match=r"^--doc_stride 60: with --max_seq_length 64 and this tokenizer's 3 special "
        r"tokens a window has no room for the question; use --doc_stride at most 59$",
    ):
        check_positions(config, tokenizer, 64, doc_stride=60)


def _xlnet_tokenizer(out: Path) -> str:
    """A tiny XLNet tokenizer trained offline: pair encoding `q <sep> c <sep> <cls>`, <cls> last; right padding
    (XLNet's own is left), so that only the classifier token's place is wrong."""
    from families import _unigram, corpus
    from transformers import XLNetTokenizer

    vocab = _unigram(corpus(200), ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>"])
    XLNetTokenizer(vocab=vocab, unk_id=0, padding_side="right").save_pretrained(out)
    return str(out)


def test_a_tokenizer_with_the_classifier_token_last_or_left_padding_is_refused(tmp_path: Path) -> None:
    """Named by the flag that gave the folder: it said --tokenizer_name for a --model_name_or_path too."""
    xlnet = _xlnet_tokenizer(tmp_path / "xlnet")
    with pytest.raises(ConfigError, match=r"XLNetTokenizer\) has a classifier token after the question, which qa_"):
        with loading("--tokenizer_name", xlnet):
            load_tokenizer(ModelArgs(tokenizer_name=xlnet))
    left = shutil.copytree(TINY, tmp_path / "tiny-left")
    tokenizer_config = left / "tokenizer_config.json"
    tokenizer_config.write_text(json.dumps({**json.loads(tokenizer_config.read_text()), "padding_side": "left"}))
    with pytest.raises(ConfigError) as err:
        with loading("--model_name_or_path", str(left)):
            load_tokenizer(ModelArgs(model_name_or_path=str(left)))
    assert str(err.value).startswith(
        f"--model_name_or_path {left}: its tokenizer (BertTokenizer) has padding_side='left', which qa_train does not "
        "support: it needs the classifier token first and padding on the right"
    )


@pytest.mark.parametrize("stored", [torch.float16, torch.bfloat16])
def test_master_weights_are_fp32_whatever_the_checkpoint_stores(stored: torch.dtype, tmp_path: Path) -> None:
    args = ModelArgs(config_name=str(TINY), tokenizer_name=str(TINY))
    tokenizer = load_tokenizer(args)
    model = load_model(args, tokenizer, load_model_config(args))
    model.to(stored).save_pretrained(tmp_path / "half")
    pretrained = ModelArgs(model_name_or_path=str(tmp_path / "half"), tokenizer_name=str(TINY))
    loaded = load_model(pretrained, tokenizer, load_model_config(pretrained))
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}


def test_config_name_with_a_model_loads_the_models_weights(tmp_path: Path) -> None:
    """As in transformers' examples: --config_name alone is random initialisation; beside
    --model_name_or_path it only supplies the config, and the pretrained weights still load."""
    scratch = ModelArgs(config_name=str(TINY), tokenizer_name=str(TINY))
    tokenizer = load_tokenizer(scratch)
    torch.manual_seed(1)
    trained = load_model(scratch, tokenizer, load_model_config(scratch))
    trained.save_pretrained(tmp_path / "model")
    both = ModelArgs(model_name_or_path=str(tmp_path / "model"), config_name=str(TINY), tokenizer_name=str(TINY))
    assert not both.from_scratch and scratch.from_scratch
    torch.manual_seed(2)
    loaded = load_model(both, tokenizer, load_model_config(both))
    for (name, p), q in zip(trained.named_parameters(), loaded.parameters()):
        assert torch.equal(p, q), name
    torch.manual_seed(2)
    fresh = load_model(scratch, tokenizer, load_model_config(scratch))
    assert not torch.equal(fresh.qa_outputs.weight, trained.qa_outputs.weight)


def test_the_default_model_is_bert_base_unless_a_config_stands_alone() -> None:
    assert ModelArgs().model_name_or_path == "bert-base-uncased" and not ModelArgs().from_scratch
    scratch = ModelArgs(config_name=str(TINY))
    assert scratch.from_scratch and scratch.config_source == str(TINY)
    assert scratch.tokenizer_source == "bert-base-uncased"  # a config folder need not hold a tokenizer


@pytest.mark.parametrize(
    ("flag", "name"),
    [
        ("--model_name_or_path", "runs/fnal"),  # beside --config_name: nothing loaded it before the weights
        ("--model_name_or_path", "./nothing"),
        ("--tokenizer_name", "runs/tok"),
        ("--config_name", "runs/cfg"),
    ],
)
def test_a_mistyped_local_folder_is_no_such_directory_before_any_data(
    flag: str, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`runs/x` reads like a hub id (org/name), so it went to the hub: a folder given beside --config_name was a
    traceback after the data was read, the others said the hub could not be reached. `runs` is a folder here, so
    it is a local path that does not exist."""
    from qa_train import trainer
    from qa_train.config.flags import parse_args

    def no_data(*args: object) -> None:
        raise AssertionError("the data was read before the refusal")

    monkeypatch.setattr(trainer, "load_splits", no_data)
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    flags = tiny_flags(tmp_path / "out", "--no_eval")
    if flag in flags:
        flags[flags.index(flag) + 1] = name
    else:
        flags += [flag, name]
    with pytest.raises(ConfigError) as refused:
        trainer.Trainer(parse_args(flags))
    assert str(refused.value) == f"{flag} {name}: no such directory"


def hub_cache_with(root: Path, hub_id: str, files: list[Path]) -> Path:
    """A huggingface_hub cache holding `files` as the main revision of `hub_id`, as a download would leave it."""
    repo = root / f"models--{hub_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    for f in files:
        shutil.copy(f, snapshot / f.name)
    return root


def offline_hub_preflight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: list[Path]) -> str:
    """What the preflight of a run of `--model_name_or_path someorg/tiny-qa` says, offline, with `files` as the
    hub cache's snapshot of it."""
    from huggingface_hub import constants

    cache = hub_cache_with(tmp_path / "hub", "someorg/tiny-qa", files)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return preflight_says(tmp_path, monkeypatch, "--model_name_or_path", "someorg/tiny-qa")


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        (None, PAST_PREFLIGHT),
        (
            "no weights",
            "--model_name_or_path someorg/tiny-qa: HF_HUB_OFFLINE is set and its weights are not in the hub ",
        ),
        (
            "other sizes",
            "--model_name_or_path someorg/tiny-qa: its weights do not fit its config.json: bert.embeddings."
            "word_embeddings.weight is [3707, 128] in the weights, [5000, 128] by the config",
        ),
        ("truncated", "--model_name_or_path someorg/tiny-qa: model.safetensors is not a readable safetensors file ("),
    ],
)
def test_offline_a_hub_ids_cached_weights_are_checked_before_any_data(
    fault: str | None, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a compute node without a network (HF_HUB_OFFLINE) the cache's snapshot is what from_pretrained loads. A
    hub id whose config and tokenizer were cached (AutoConfig, AutoTokenizer) but not its weights, or whose weights
    were cut short or are of other shapes than the cached config, loaded everything, read and windowed the data,
    and only then failed in from_pretrained."""
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(TINY)).save_pretrained(tmp_path / "w")
    weights, config = tmp_path / "w" / "model.safetensors", tmp_path / "w" / "config.json"
    if fault == "other sizes":
        config.write_text(json.dumps({**json.loads(config.read_text()), "vocab_size": 5000}))
    if fault == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
    files = [p for p in TINY.iterdir() if p.is_file() and p.name != "config.json"] + [config]
    message = offline_hub_preflight(tmp_path, monkeypatch, files if fault == "no weights" else [*files, weights])
    assert message.startswith(said), message


def test_a_model_folder_under_home_is_checked_where_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`~/m` names the folder under $HOME: its weights are looked for there, not in a folder called `~`."""
    from qa_train.model.modeling import check_weights

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    with pytest.raises(ConfigError, match=r"--model_name_or_path ~/m: no weights"):
        check_weights(ModelArgs(model_name_or_path="~/m"))
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1)}, tmp_path / "m" / "model.safetensors")  # its header is read: a real file
    check_weights(ModelArgs(model_name_or_path="~/m"))
