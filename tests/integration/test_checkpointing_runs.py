"""--gradient_checkpointing recomputes the encoder layers in the backward pass and changes nothing a run computes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import TINY, tiny_flags


def layer_runs(out: Path, config: Path, *extra: str) -> int:
    """Train 4 steps in this process; how many times the encoder layers' attention ran in training mode."""
    from qa_train.config.flags import parse_args
    from qa_train.run import run

    calls = 0

    def count(module: torch.nn.Module, args: object, output: object) -> None:
        nonlocal calls
        calls += type(module).__name__ == "BertAttention" and module.training

    flags = tiny_flags(
        out,
        "--max_train_samples",
        "64",
        "--max_train_steps",
        "4",
        "--logging_steps",
        "1",
        "--no_eval",
        "--disable_tqdm",
        "--throughput_warmup_steps",
        "0",
        *extra,
    )
    flags[flags.index("--config_name") + 1] = str(config)
    handle = torch.nn.modules.module.register_module_forward_hook(count)
    try:
        run(parse_args(flags))
    finally:
        handle.remove()
    return calls


def losses(out: Path) -> list[float]:
    entries = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return [e["train/loss"] for e in entries if "train/loss" in e]


def test_checkpointing_recomputes_every_layer_and_trains_the_same_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny BERT with dropout on: checkpointing replays each layer under the forward pass's RNG state, so the
    dropout masks, losses and weights are those of the run without it, while every layer runs twice a step."""
    from safetensors.torch import load_file

    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    config = json.loads((TINY / "config.json").read_text())
    config.update(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    (tmp_path / "dropout").mkdir()
    (tmp_path / "dropout" / "config.json").write_text(json.dumps(config))
    plain = layer_runs(tmp_path / "plain", tmp_path / "dropout")
    recomputed = layer_runs(tmp_path / "recomputed", tmp_path / "dropout", "--gradient_checkpointing")
    assert (plain, recomputed) == (4 * 2, 2 * 4 * 2)  # 4 steps x 2 layers, once more in each backward pass
    assert json.loads((tmp_path / "recomputed" / "metrics.json").read_text())["args"]["gradient_checkpointing"] is True
    assert len(losses(tmp_path / "plain")) == 4
    assert losses(tmp_path / "recomputed") == pytest.approx(losses(tmp_path / "plain"), rel=1e-6, abs=0)
    before, after = (load_file(tmp_path / run / "final" / "model.safetensors") for run in ("plain", "recomputed"))
    assert before.keys() == after.keys()
    for name, weight in before.items():
        torch.testing.assert_close(after[name], weight, rtol=1e-6, atol=1e-7, msg=name)
    # The export is the same model: checkpointing is training's business, not the config's.
    assert (tmp_path / "plain" / "final" / "config.json").read_text() == (
        tmp_path / "recomputed" / "final" / "config.json"
    ).read_text()
