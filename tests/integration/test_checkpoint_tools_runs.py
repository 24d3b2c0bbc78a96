"""`qa-train describe` and `qa-train consolidate` on the real checkpoints of the session's uninterrupted 2-process
runs (tests/conftest.py: no launch of their own): the step-8 checkpoint of DDP, ZeRO-2, ZeRO-3 and FSDP becomes a
folder that from_pretrained loads and that holds exactly the weights the run exported at that step."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from conftest import read_metrics
from safetensors.torch import load_file
from transformers import AutoModelForQuestionAnswering

from qa_train.config.settings import ANSWERING_KEY
from qa_train.model import consolidate
from qa_train.strategy import checkpoint, describe

STEP_8 = Path("checkpoints") / "step_00000008"
LAYOUTS = {"ddp": "model.safetensors", "zero2": "latest", "zero3": "latest", "fsdp": "pytorch_model_fsdp_0"}


@pytest.fixture(autouse=True)
def own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands set DS_ACCELERATOR (describe.quiet_libraries): restored after each test."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


@pytest.mark.parametrize("config", list(LAYOUTS))
def test_consolidated_step_8_is_the_run_s_export(
    config: str,
    uninterrupted: Callable[[str], Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = uninterrupted(config)
    assert (run / STEP_8 / LAYOUTS[config]).exists()  # the library's own files, not a converted copy
    out = tmp_path / "model"
    assert consolidate.main([str(run / STEP_8), "--output_dir", str(out)]) == 0, capsys.readouterr().err
    model, info = AutoModelForQuestionAnswering.from_pretrained(out, output_loading_info=True)
    assert not any(info.values()), info
    assert model.dtype == torch.float32
    exported = load_file(run / "final" / "model.safetensors")
    weights = load_file(out / "model.safetensors")
    assert set(weights) == set(exported)
    for name, tensor in exported.items():
        assert weights[name].dtype == torch.float32 and torch.equal(weights[name], tensor), name
    assert (out / "tokenizer.json").is_file()  # the run's export's tokenizer
    # The checkpoint's record of how the run answers, as its export's config.json has it: predict answers alike.
    recorded = [json.loads((folder / "config.json").read_text())[ANSWERING_KEY] for folder in (out, run / "final")]
    assert recorded[0] == recorded[1] == json.loads((run / STEP_8 / checkpoint.STATE_FILE).read_text())["answering"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary or scratch folder left
    assert checkpoint.verify(run / STEP_8, contents=True) is None  # DeepSpeed's conversion wrote nothing there


@pytest.mark.parametrize("config", list(LAYOUTS))
def test_describe_a_run_names_its_latest_checkpoint_and_strategy(
    config: str, uninterrupted: Callable[[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    run = uninterrupted(config)
    assert describe.main([str(run), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["path"] == str(run / STEP_8)
    assert found["strategy"] == config
    assert found["weights"]["parameters"] == read_metrics(run)["num_parameters"]
    assert found["state"]["completed_steps"] == 8 and found["state"]["world_size"] == 2
    rows = {row["config"]: row for row in found["continuations"]}
    assert rows[config]["as_saved_at"] == 2
    same_files = {"ddp": ["ddp"], "zero2": ["zero2", "zero2_offload"], "zero3": ["zero3", "zero3_offload"]}
    assert [c for c, row in rows.items() if row["as_saved_at"]] == same_files.get(config, [config])


def test_describe_skips_a_damaged_latest_checkpoint(
    uninterrupted: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As --resume_from_checkpoint latest does: the newest checkpoint that verifies, the damaged one named."""
    run = tmp_path / "run"
    shutil.copytree(uninterrupted("ddp") / "checkpoints", run / "checkpoints")
    weights = run / STEP_8 / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert describe.main([str(run)]) == 0
    text = capsys.readouterr().out
    assert f"checkpoint   {run / 'checkpoints' / 'step_00000004'}" in text
    assert "skipped    step_00000008: model.safetensors: its contents differ from the manifest's CRC32" in text
    assert describe.main([str(run / STEP_8)]) == 2
    assert "CRC32" in capsys.readouterr().err
