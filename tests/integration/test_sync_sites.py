"""tools/sync_sites.py (the GPU test's witness) records each synchronising operation of the loop with the step
and phase it fell in: checked on CPU by making the monitor's per-micro-batch call warn as a CUDA sync would."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import ModuleType

import pytest
from conftest import ROOT, tiny_flags


@pytest.fixture
def sync_sites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    import sync_sites

    return sync_sites


def syncing(method):
    """`method`, warning first as a synchronising CUDA operation does under the tool's debug mode."""

    def wrapped(self, *args, **kwargs):
        warnings.warn("called a synchronizing CUDA operation")
        return method(self, *args, **kwargs)

    return wrapped


def recorded(sync_sites: ModuleType, tmp_path: Path, *flags: str) -> list[list]:
    """The sites the tool records over a tiny run with `flags`."""
    sites_file = tmp_path / "sites.json"
    sync_sites.main(
        [str(sites_file), "--", *tiny_flags(tmp_path / "run", *flags, "--disable_tqdm", "--save_final_model", "false")]
    )
    return json.loads(sites_file.read_text())


def test_sites_are_recorded_by_step_and_phase(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync_sites: ModuleType
) -> None:
    from qa_train.observe import monitor
    from qa_train.trainer import Trainer

    hooked = ("_train_epoch", "_micro_step", "_after_update", "_save_checkpoint", "_evaluate_during_training")
    before = {name: Trainer.__dict__[name] for name in hooked}
    monkeypatch.setattr(monitor.TrainingMetrics, "micro_batch", syncing(monitor.TrainingMetrics.micro_batch))
    sites = recorded(sync_sites, tmp_path, "--max_train_steps", "4", "--no_eval")
    assert [(step, phase) for step, phase, *_ in sites] == [(0, "step"), (1, "step"), (2, "step"), (3, "step")]
    assert all(Path(f).name == "test_sync_sites.py" for _, _, f, _ in sites)
    stayed = [name for name in hooked if Trainer.__dict__[name] is not before[name]]
    assert not stayed, f"the tool's hooks stayed on {stayed}: a later run in this process would be recorded"


def test_evaluation_is_its_own_phase_and_work_after_it_the_update_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync_sites: ModuleType
) -> None:
    """Evaluation runs inside the update's bookkeeping and is recorded as "eval"; a checkpoint written after
    it is still the update's."""
    from qa_train.trainer import Trainer

    monkeypatch.setattr(Trainer, "_save_checkpoint", syncing(Trainer._save_checkpoint))
    monkeypatch.setattr(Trainer, "evaluate", syncing(Trainer.evaluate))
    sites = recorded(
        sync_sites,
        tmp_path,
        "--max_train_steps",
        "4",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "2",
        "--checkpointing_steps",
        "2",
        "--max_eval_samples",
        "16",
    )
    # The evaluation at step 2 is its own phase; the final one (after step 4) is outside the loop.
    assert [(step, phase) for step, phase, *_ in sites] == [(2, "eval"), (2, "after"), (4, "after")]


@pytest.mark.parametrize("every", ["2", "epoch"])
def test_the_weight_check_after_the_last_step_is_not_the_loaders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync_sites: ModuleType, every: str
) -> None:
    """The weight check runs before each checkpoint (the update's bookkeeping, also at an epoch's end) and once
    after the loop; that last one stalls no step (the H100 run of 2026-11-25 had it as a "loader" sync at the
    last step)."""
    from qa_train.trainer import Trainer

    monkeypatch.setattr(Trainer, "_check_weights", syncing(Trainer._check_weights))
    length = ["--max_train_steps", "4"] if every == "2" else ["--max_train_samples", "24", "--num_train_epochs", "1"]
    sites = recorded(sync_sites, tmp_path, *length, "--checkpointing_steps", every, "--no_eval")
    steps = json.loads((tmp_path / "run" / "metrics.json").read_text())["train_steps"]
    assert [(step, phase) for step, phase, *_ in sites] == (
        [(2, "after"), (4, "after")] if every == "2" else [(steps, "after")]
    )
