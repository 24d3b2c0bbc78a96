"""`qa-train describe` and `qa-train consolidate` without a launch: the continuation table follows the resume rules,
a checkpoint of accelerate's files is described from its metadata and consolidated exactly, and bad input is one
line with exit 2. (Every strategy's real checkpoints: tests/integration/test_checkpoint_tools_runs.py.)"""

from __future__ import annotations

import json
import types
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, TINY, write_config
from transformers import AutoConfig, AutoModelForQuestionAnswering

from qa_train.model import consolidate
from qa_train.model.modeling import model_shape
from qa_train.strategy import build, describe
from qa_train.strategy.saving import _write_manifest
from qa_train.strategy.train_state import TrainerState, resume_conflicts

CONFIGS = ROOT / "accelerate_configs"


@pytest.fixture(autouse=True)
def own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands set DS_ACCELERATOR (describe.quiet_libraries): restored after each test."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


def state(**fields: object) -> TrainerState:
    settings: dict = {
        "completed_steps": 8,
        "batches_in_epoch": 8,
        "world_size": 2,
        "global_batch_size": 16,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 1,
        "total_steps": 8,
        "seed": 42,
        "group_by_length": False,
        "checkpoint_layout": describe.ACCELERATE_LAYOUT,
    }
    return TrainerState(**(settings | fields))


def test_the_eight_configs_and_their_layouts_are_the_repository_s() -> None:
    """CONFIG_LAYOUTS names every accelerate config, each with the layout build.checkpoint_layout records for it."""
    assert set(describe.CONFIG_LAYOUTS) == {p.stem for p in CONFIGS.glob("*.yaml")}
    for name, layout in describe.CONFIG_LAYOUTS.items():
        config = yaml.safe_load((CONFIGS / f"{name}.yaml").read_text())
        stage = None
        if config["distributed_type"] == "DEEPSPEED":
            ds = json.loads((ROOT / config["deepspeed_config"]["deepspeed_config_file"]).read_text())
            stage = ds["zero_optimization"]["stage"]
        kind = config.get("fsdp_config", {}).get("fsdp_state_dict_type")
        accelerator = types.SimpleNamespace(
            state=types.SimpleNamespace(fsdp_plugin=types.SimpleNamespace(state_dict_type=kind))
        )
        strategy = build.Strategy("fsdp" if kind else name, stage, "none", config["distributed_type"])
        assert build.checkpoint_layout(strategy, accelerator) == layout, name


def test_same_batch_lists_the_world_sizes_whose_accumulation_is_whole() -> None:
    assert describe.same_batch(state()) == describe.SameBatch(16, 8, {1: 2, 2: 1}, [1, 2, 4, 8, 16])
    odd = describe.same_batch(state(global_batch_size=24, gradient_accumulation_steps=3, world_size=1))
    assert odd is not None and odd.accumulation_by_world_size == {1: 3, 3: 1}
    assert odd.world_sizes_any_split == [1, 2, 3, 4, 6, 8, 12, 24]
    assert describe.same_batch(state(global_batch_size=None)) is None  # a checkpoint before the record


def test_every_listed_world_size_passes_the_resume_contract() -> None:
    """What describe offers is what a resume accepts: the same global batch, no refusal."""
    saved = state()
    batch = describe.same_batch(saved)
    assert batch is not None
    for n, accumulation in batch.accumulation_by_world_size.items():
        now = state(world_size=n, gradient_accumulation_steps=accumulation)
        assert not resume_conflicts(saved, now)[0], n
    another = state(world_size=3, global_batch_size=24)
    assert "--allow_global_batch_change" in resume_conflicts(saved, another)[0][0]


def test_mid_epoch_under_group_by_length_keeps_the_per_device_batch() -> None:
    grouped = describe.same_batch(state(group_by_length=True))
    assert grouped is not None and grouped.world_sizes_any_split is None
    at_boundary = describe.same_batch(state(group_by_length=True, batches_in_epoch=0))
    assert at_boundary is not None and at_boundary.world_sizes_any_split == [1, 2, 4, 8, 16]


def test_a_ddp_checkpoint_loads_as_saved_under_ddp_and_converts_for_the_others() -> None:
    rows = {c.config: c for c in describe.continuations(state())}
    assert rows["ddp"].how == "loads as saved" and rows["ddp"].as_saved_at == 2
    assert rows["single"].world_sizes == "1" and rows["single"].how == "loads as saved"
    assert rows["single"].as_saved_at is None  # written by 2 processes: their RNG states do not carry to one
    for config in ("fsdp", "zero1", "zero2", "zero2_offload", "zero3", "zero3_offload"):
        assert rows[config].how.startswith("converted"), config
        assert rows[config].as_saved_at is None


def test_a_zero2_checkpoint_converts_at_another_world_size() -> None:
    rows = {c.config: c for c in describe.continuations(state(checkpoint_layout="DeepSpeed ZeRO-2 files"))}
    for config in ("zero2", "zero2_offload"):
        assert rows[config].as_saved_at == 2
        assert "converted at others" in rows[config].how
    assert rows["zero3"].how.startswith("converted") and rows["ddp"].how.startswith("converted")


# --- a checkpoint of accelerate's files, made here ------------------------------------------------


# TrainArgs.answering() of a run trained and evaluated at 96/64 (what its checkpoints record).
ANSWERING = {
    "max_seq_length": 96,
    "doc_stride": 64,
    "n_best_size": 7,
    "max_answer_length": 30,
    "version_2_with_negative": False,
    "null_score_diff_threshold": None,
}


def accelerate_checkpoint(
    output_dir: Path, seed: int = 0, answering: dict | None = ANSWERING
) -> tuple[Path, torch.nn.Module]:
    """step_00000008 of a run under DDP: the tiny model's weights, Adam's state keyed by index, and what qa-train
    writes beside them (`answering` None: as a qa-train before the record wrote it)."""
    from safetensors.torch import save_file

    from qa_train.model.optimization import param_groups

    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(TINY)
    model = AutoModelForQuestionAnswering.from_config(config)
    optimizer = torch.optim.AdamW(param_groups(model, 0.0), lr=1e-3)
    model(
        input_ids=torch.ones(1, 8, dtype=torch.long),
        start_positions=torch.zeros(1, dtype=torch.long),
        end_positions=torch.zeros(1, dtype=torch.long),
    ).loss.backward()
    optimizer.step()
    path = output_dir / "checkpoints" / "step_00000008"
    path.mkdir(parents=True)
    save_file(model.state_dict(), path / "model.safetensors")
    torch.save(optimizer.state_dict(), path / "optimizer.bin")
    saved = state(
        model_shape=model_shape(config),
        train_data="ab12",
        num_train_windows=1500,
        qa_train_version="0.1.0",
        answering=answering,
    )
    (path / "trainer_state.json").write_text(json.dumps(asdict(saved)))
    _write_manifest(path)
    return path, model


def test_describe_reads_the_metadata(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, model = accelerate_checkpoint(tmp_path / "run")
    assert describe.main([str(tmp_path / "run"), "--json"]) == 0  # the output dir: its latest checkpoint
    found = json.loads(capsys.readouterr().out)
    assert found["path"] == str(path)
    assert found["weights"]["parameters"] == sum(p.numel() for p in model.parameters())
    assert found["weights"]["tensors"] == len(model.state_dict()) and found["weights"]["dtype"] == "float32"
    assert found["strategy"] == "ddp" and found["manifest"].startswith("verified")
    assert describe.main([str(path)]) == 0
    text = capsys.readouterr().out
    assert "global 16 = per-device 8 x accumulation 1 x 2 processes" in text
    assert "per-device 8: 1 process x accumulation 2, 2 processes x accumulation 1" in text
    assert "--allow_global_batch_change" in text and "zero3_offload" in text


@pytest.mark.parametrize("damage", ["flip", "remove", "no_state"])
def test_bad_checkpoints_are_one_line_and_exit_2(
    damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = accelerate_checkpoint(tmp_path / "run")
    weights = path / "model.safetensors"
    if damage == "flip":
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "remove":
        weights.unlink()
    else:
        (path / "trainer_state.json").unlink()
    expected = {
        "flip": "contents differ from the manifest's CRC32",
        "remove": "model.safetensors: missing",
        "no_state": "no trainer_state.json",
    }[damage]
    for main, extra in ((describe.main, []), (consolidate.main, ["--output_dir", str(tmp_path / "out")])):
        assert main([str(path), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(path) in err and expected in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("layout", ["pytorch_model_fsdp.bin", "deepspeed"])
def test_a_pickle_that_would_build_code_is_refused_in_one_line(
    layout: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Files that match the manifest but whose pickle builds an object no checkpoint holds (here argparse's
    Namespace): refused unread in one line naming the file, where plain weights_only raised a traceback."""
    import argparse

    path, model = accelerate_checkpoint(tmp_path / "run")
    (path / "model.safetensors").unlink()
    state = {"param_shapes": [{k: t.shape for k, t in model.state_dict().items()}], "args": argparse.Namespace()}
    if layout == "deepspeed":
        (path / "latest").write_text("pytorch_model")
        (path / "pytorch_model").mkdir()
        file = path / "pytorch_model" / "mp_rank_00_model_states.pt"
    else:
        file = path / "pytorch_model_fsdp.bin"  # FSDP's full state dict
        state = {**model.state_dict(), "args": argparse.Namespace()}
    torch.save(state, file)
    (path / "manifest.json").unlink()
    _write_manifest(path)
    assert describe.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"qa-train describe: error: {file}: not readable as"), err
    assert "Namespace" in err, err


def test_not_a_checkpoint_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert describe.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"qa-train describe: error: {tmp_path}: neither a checkpoint (no trainer_state.json) nor a run with one\n"
    )


def test_consolidate_writes_the_exact_weights_with_a_given_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No export and no metrics.json beside the checkpoint (a run killed before its end): --config_name names the
    config, and without a tokenizer the folder holds the model alone."""
    path, model = accelerate_checkpoint(tmp_path / "run")
    out = tmp_path / "out"
    assert consolidate.main([str(path), "--output_dir", str(out)]) == 2
    assert "pass --config_name" in capsys.readouterr().err
    assert consolidate.main([str(path), "--output_dir", str(out), "--config_name", str(TINY)]) == 0
    loaded = AutoModelForQuestionAnswering.from_pretrained(out)
    assert loaded.dtype == torch.float32
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert "the folder holds the model alone (--tokenizer_name adds one)" in capsys.readouterr().err
    assert not list(tmp_path.glob(".tmp-*"))
    with_tokenizer = tmp_path / "with_tokenizer"
    argv = [str(path), "--output_dir", str(with_tokenizer), "--config_name", str(TINY), "--tokenizer_name"]
    assert consolidate.main([*argv, str(tmp_path / "nowhere")]) == 2
    assert f"--tokenizer_name {tmp_path / 'nowhere'}: cannot load the tokenizer" in capsys.readouterr().err
    assert not with_tokenizer.exists()
    assert consolidate.main([*argv, str(TINY)]) == 0
    assert (with_tokenizer / "tokenizer_config.json").is_file()


def test_consolidate_records_how_the_run_answers_as_the_export_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A consolidated folder recorded nothing, so `qa-train predict` answered a model trained and evaluated at 96/64
    with 384/128 windows (half the demo's answers differed from its own evaluation's): its config.json records the
    checkpoint's windows and span rules, over any record its config came with (another run's export)."""
    from qa_train.config.settings import ANSWERING_KEY
    from qa_train.predict import recorded_answering

    path, _ = accelerate_checkpoint(tmp_path / "run")
    elsewhere = write_config(tmp_path / "other_run_final", **{ANSWERING_KEY: {**ANSWERING, "max_seq_length": 384}})
    out = tmp_path / "out"
    assert consolidate.main([str(path), "--output_dir", str(out), "--config_name", str(elsewhere)]) == 0
    assert json.loads((out / "config.json").read_text())[ANSWERING_KEY] == ANSWERING
    assert recorded_answering(str(out)) == ANSWERING
    assert "windows and span rules" not in capsys.readouterr().err


def test_consolidate_says_predict_uses_its_defaults_for_an_older_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint of format 2 records no windows or span rules: the folder is written, records none (not the one
    its config came with, which is another run's), and one line says so."""
    from qa_train.config.settings import ANSWERING_KEY
    from qa_train.predict import RECORDED, recorded_answering

    path, model = accelerate_checkpoint(tmp_path / "run", answering=None)
    elsewhere = write_config(tmp_path / "other_run_final", **{ANSWERING_KEY: ANSWERING})
    out = tmp_path / "out"
    assert consolidate.main([str(path), "--output_dir", str(out), "--config_name", str(elsewhere)]) == 0
    assert ANSWERING_KEY not in json.loads((out / "config.json").read_text())
    assert recorded_answering(str(out)) == RECORDED
    said = [line for line in capsys.readouterr().err.splitlines() if "windows and span rules" in line]
    assert said == [
        f"{path}: written by a qa-train that did not record the run's windows and span rules: qa-train predict will "
        "answer with its defaults unless given --max_seq_length, --doc_stride, --n_best_size, --max_answer_length "
        "(and --version_2_with_negative)"
    ]
    loaded = AutoModelForQuestionAnswering.from_pretrained(out)
    assert all(torch.equal(loaded.state_dict()[n], t) for n, t in model.state_dict().items())


def test_consolidate_refuses_another_model_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = accelerate_checkpoint(tmp_path / "run")
    other = write_config(tmp_path / "other", hidden_size=64)
    assert consolidate.main([str(path), "--output_dir", str(tmp_path / "out"), "--config_name", str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no config builds its model shape" in err and "hidden_size 64" in err


def test_consolidate_never_writes_into_a_folder_with_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = accelerate_checkpoint(tmp_path / "run")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert consolidate.main([str(path), "--output_dir", str(out), "--config_name", str(TINY)]) == 2
    assert capsys.readouterr().err == (
        f"qa-train consolidate: error: --output_dir {out}: exists and is not empty; name a new or empty folder\n"
    )
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()  # an empty folder is taken
    assert consolidate.main([str(path), "--output_dir", str(out), "--config_name", str(TINY)]) == 0
    assert (out / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("output_dir", "says"),
    [
        ("notes.txt/out", "{tmp}/notes.txt is a file, not a directory"),
        ("/sys/qa_train_test_consolidated", "/sys is not writable"),
    ],
)
def test_consolidate_refuses_an_output_dir_it_cannot_make_before_reading_the_weights(
    output_dir: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under a file it was the raw "[Errno 17] File exists: '...'" once the config and tokenizer were loaded."""
    path, _ = accelerate_checkpoint(tmp_path / "run")
    (tmp_path / "notes.txt").write_text("mine")
    out = tmp_path / output_dir
    assert consolidate.main([str(path), "--output_dir", str(out), "--config_name", str(TINY)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qa-train consolidate: error: --output_dir {out}: {says.format(tmp=tmp_path)}"), err
    assert err.count("\n") == 1 and (tmp_path / "notes.txt").read_text() == "mine"


def test_a_format_1_checkpoint_says_what_it_did_not_record() -> None:
    """Written before the contract was recorded: no world size, batch or layout; the table still renders."""
    old = TrainerState(completed_steps=4, epoch=1, batches_in_epoch=2)
    weights = describe.Weights(tensors=2, parameters=10, dtype="float32")
    described = describe.Description(
        path="step_00000004",
        manifest="verified",
        state=asdict(old),
        strategy=describe.strategy_of(old, weights),
        weights=weights,
        same_batch=describe.same_batch(old),
        continuations=describe.continuations(old),
        refused_changes=describe.refused_changes(old),
    )
    text = describe.render(described)
    assert "a number of processes not recorded" in text and "batch        not recorded" in text
    assert "data         (not recorded)" in text and "None" not in text.split("continues")[0]
