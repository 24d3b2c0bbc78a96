"""What is refused before any data or model work: occupied or unwritable output dirs, windows longer than the
model's positions; and the master weights' precision whatever the checkpoint stores."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from qa_train.config import ConfigError, ModelArgs, OutputArgs
from qa_train.modeling import check_positions, load_config, load_model, load_tokenizer
from qa_train.outputdir import claim, clear_previous_run
from conftest import TINY


def finished_run(out: Path) -> Path:
    (out / "checkpoints" / "step_00000002").mkdir(parents=True)
    (out / "final").mkdir()
    (out / "metrics.json").write_text("{}")
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
    assert clear_previous_run(args, is_main=False) == ["metrics.json", "final", "checkpoints"]
    assert (out / "metrics.json").exists(), "only the main process deletes"
    clear_previous_run(args, is_main=True)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


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
    (tmp_path / "done" / "metrics.json").write_text("{}")
    with pytest.raises(ConfigError, match="without checkpoints"):
        claim(OutputArgs(output_dir=str(tmp_path / "done"), resume_from_checkpoint="latest"))


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


@pytest.mark.parametrize("stored", [torch.float16, torch.bfloat16])
def test_master_weights_are_fp32_whatever_the_checkpoint_stores(stored: torch.dtype, tmp_path: Path) -> None:
    args = ModelArgs(config_name=str(TINY), tokenizer_name=str(TINY))
    tokenizer = load_tokenizer(args)
    model = load_model(args, tokenizer, load_config(args))
    model.to(stored).save_pretrained(tmp_path / "half")
    pretrained = ModelArgs(model_name_or_path=str(tmp_path / "half"), tokenizer_name=str(TINY))
    loaded = load_model(pretrained, tokenizer, load_config(pretrained))
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}


def test_config_name_with_a_model_loads_the_models_weights(tmp_path: Path) -> None:
    """As in transformers' examples: --config_name alone is random initialisation; beside
    --model_name_or_path it only supplies the config, and the pretrained weights still load."""
    scratch = ModelArgs(config_name=str(TINY), tokenizer_name=str(TINY))
    tokenizer = load_tokenizer(scratch)
    torch.manual_seed(1)
    trained = load_model(scratch, tokenizer, load_config(scratch))
    trained.save_pretrained(tmp_path / "model")
    both = ModelArgs(model_name_or_path=str(tmp_path / "model"), config_name=str(TINY), tokenizer_name=str(TINY))
    assert not both.from_scratch and scratch.from_scratch
    torch.manual_seed(2)
    loaded = load_model(both, tokenizer, load_config(both))
    for (name, p), q in zip(trained.named_parameters(), loaded.parameters()):
        assert torch.equal(p, q), name
    torch.manual_seed(2)
    fresh = load_model(scratch, tokenizer, load_config(scratch))
    assert not torch.equal(fresh.qa_outputs.weight, trained.qa_outputs.weight)


def test_the_default_model_is_bert_base_unless_a_config_stands_alone() -> None:
    assert ModelArgs().model_name_or_path == "bert-base-uncased" and not ModelArgs().from_scratch
    scratch = ModelArgs(config_name=str(TINY))
    assert scratch.from_scratch and scratch.config_source == str(TINY)
    assert scratch.tokenizer_source == "bert-base-uncased"  # a config folder need not hold a tokenizer
