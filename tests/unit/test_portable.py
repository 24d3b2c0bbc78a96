"""qa_train's portable layout without a launch: accelerate's and torch.distributed.checkpoint's files of a trained
model convert by parameter name, and an optimizer loaded from them continues exactly as the one that wrote them.
(DeepSpeed's files, and every strategy pair end to end, are tests/integration/test_strategies.py's.)"""

from __future__ import annotations

import json
import types
import warnings
from pathlib import Path

import pytest
import torch
from conftest import TINY
from transformers import AutoConfig, AutoModelForQuestionAnswering

from qa_train.model.optimization import optimizer_order, param_groups
from qa_train.strategy import portable


def _model(seed: int):
    torch.manual_seed(seed)
    return AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(TINY))


def _adamw(model) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups(model, 0.01), lr=1e-3)


def _train(model, optimizer, steps: int, seed: int = 0) -> list[float]:
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        ids = torch.randint(1, 3000, (4, 32), generator=generator)
        labels = torch.randint(0, 32, (4,), generator=generator)
        loss = model(input_ids=ids, start_positions=labels, end_positions=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _trained(steps: int) -> tuple[torch.nn.Module, torch.optim.AdamW]:
    model = _model(seed=0)
    optimizer = _adamw(model)
    _train(model, optimizer, steps)
    return model, optimizer


def _accelerate_files(checkpoint: Path, model, optimizer_state: dict) -> Path:
    """The files accelerate writes for single and DDP: optimizer.bin keyed by index."""
    from safetensors.torch import save_file

    checkpoint.mkdir()
    save_file(model.state_dict(), checkpoint / "model.safetensors")
    torch.save(optimizer_state, checkpoint / "optimizer.bin")
    return checkpoint


def _accelerator():
    """What load_optimizer asks of an Accelerator on one process outside any strategy."""
    from accelerate.utils import DistributedType

    return types.SimpleNamespace(distributed_type=DistributedType.NO, unwrap_model=lambda m: m)


def _continued(folder: Path, steps: int) -> tuple[torch.nn.Module, list[float]]:
    """A fresh model and optimizer loaded from the portable folder, trained `steps` more."""
    model = _model(seed=99)  # other initial weights: the load must replace every one
    portable.load_weights(model, folder)
    optimizer = _adamw(model)
    portable.load_optimizer(_accelerator(), model, types.SimpleNamespace(optimizer=optimizer), folder)
    return model, _train(model, optimizer, steps, seed=1)


def _assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), (_, y) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=name)


def test_accelerates_files_convert_by_name_and_continue_exactly(tmp_path: Path) -> None:
    model, optimizer = _trained(steps=3)
    checkpoint = _accelerate_files(tmp_path / "step_00000003", model, optimizer.state_dict())

    folder = tmp_path / "portable"
    portable.convert(checkpoint, optimizer_order(model), folder)
    assert json.loads((folder / portable.META).read_text())["step"] == 3
    assert sorted(p.name for p in folder.iterdir()) == [
        "exp_avg.safetensors",
        "exp_avg_sq.safetensors",
        "portable.json",
        "weights.safetensors",
    ]
    continued, losses = _continued(folder, steps=2)
    assert losses == _train(model, optimizer, steps=2, seed=1), "the same two steps, bit for bit"
    _assert_same(continued, model)


def test_fsdp_sharded_files_convert_through_torch_distributed_checkpoint(tmp_path: Path) -> None:
    """The keys accelerate gives FSDP's sharded state dict ("model.<name>", "optimizer.state.<name>.<kind>"), written
    by torch.distributed.checkpoint on one process: read back whole by name."""
    import torch.distributed.checkpoint as dcp

    model, optimizer = _trained(steps=2)
    names = {id(p): name for name, p in model.named_parameters()}
    checkpoint = tmp_path / "step_00000002"
    state = {
        f"optimizer.state.{names[id(p)]}.{kind}": value
        for p, entry in optimizer.state.items()
        for kind, value in entry.items()
    }
    with warnings.catch_warnings():  # torch's note that no_dist means one process: what this test means
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(
            {f"model.{k}": v for k, v in model.state_dict().items()},
            checkpoint_id=checkpoint / "pytorch_model_fsdp_0",
            no_dist=True,
        )
        dcp.save(state, checkpoint_id=checkpoint / "optimizer_0", no_dist=True)

    folder = tmp_path / "portable"
    with warnings.catch_warnings(record=True) as seen:  # a resume on one process says nothing of torch's
        warnings.simplefilter("always")
        portable.convert(checkpoint, optimizer_order(model), folder)
    assert [str(w.message) for w in seen] == []
    assert json.loads((folder / portable.META).read_text())["step"] == 2
    continued, losses = _continued(folder, steps=2)
    assert losses == _train(model, optimizer, steps=2, seed=1)
    _assert_same(continued, model)


def test_a_checkpoint_without_every_moment_or_of_another_model_is_refused_in_one_line(tmp_path: Path) -> None:
    model, optimizer = _trained(steps=1)
    saved = optimizer.state_dict()
    del saved["state"][3]
    checkpoint = _accelerate_files(tmp_path / "step_00000001", model, saved)
    with pytest.raises(portable.PortableError, match=r"optimizer.bin: state for 38 parameters, this model has 39$"):
        portable.convert(checkpoint, optimizer_order(model), tmp_path / "portable")
    with pytest.raises(portable.PortableError, match="neither accelerate's, FSDP's nor DeepSpeed's"):
        portable.convert(tmp_path, [], tmp_path / "other")
    # Refused after the weights were written: the model-sized half of a conversion stayed behind.
    saved = optimizer.state_dict()
    del saved["state"][3]["exp_avg"]
    checkpoint = _accelerate_files(tmp_path / "step_00000002", model, saved)
    with pytest.raises(portable.PortableError, match="no exp_avg for"):
        portable.convert(checkpoint, optimizer_order(model), tmp_path / "portable")
    assert not (tmp_path / "portable").exists() and not (tmp_path / "other").exists()
