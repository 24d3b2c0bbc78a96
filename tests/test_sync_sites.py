"""tools/sync_sites.py (the GPU test's witness) records each synchronising operation of the loop with the step
and phase it fell in: checked on CPU by making the monitor's per-micro-batch call warn as a CUDA sync would."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from conftest import ROOT, tiny_flags


def test_sites_are_recorded_by_step_and_phase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from qa_train import monitor

    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    import sync_sites

    micro_batch = monitor.IntervalMonitor.micro_batch

    def syncing(self, *args):
        warnings.warn("called a synchronizing CUDA operation")
        return micro_batch(self, *args)

    monkeypatch.setattr(monitor.IntervalMonitor, "micro_batch", syncing)
    sites_file = tmp_path / "sites.json"
    sync_sites.main([str(sites_file), "--", *tiny_flags(tmp_path / "run", "--max_train_steps", "4", "--no_eval",
                                                         "--disable_tqdm", "--save_final_model", "false")])
    sites = json.loads(sites_file.read_text())
    assert [(step, phase) for step, phase, *_ in sites] == [(0, "step"), (1, "step"), (2, "step"), (3, "step")]
    assert all(Path(f).name == "test_sync_sites.py" for _, _, f, _ in sites)
    from qa_train.trainer import Trainer

    assert (Trainer._train_epoch.__name__, Trainer._micro_step.__name__) == ("_train_epoch", "_micro_step"), "the tool's hooks stayed"


def test_evaluation_is_its_own_phase_and_work_after_it_the_update_s(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Evaluation runs inside the update's bookkeeping and is recorded as "eval"; a checkpoint written after
    it is still the update's."""
    from qa_train.trainer import Trainer

    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    import sync_sites

    def syncing(method):
        def wrapped(self, *args, **kwargs):
            warnings.warn("called a synchronizing CUDA operation")
            return method(self, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(Trainer, "_save_checkpoint", syncing(Trainer._save_checkpoint))
    monkeypatch.setattr(Trainer, "evaluate", syncing(Trainer.evaluate))
    sites_file = tmp_path / "sites.json"
    sync_sites.main([str(sites_file), "--", *tiny_flags(
        tmp_path / "run", "--max_train_steps", "4", "--eval_strategy", "steps", "--eval_steps", "2",
        "--checkpointing_steps", "2", "--max_eval_samples", "16", "--disable_tqdm", "--save_final_model", "false")])
    sites = json.loads(sites_file.read_text())
    # The evaluation at step 2 is its own phase; the final one (after step 4) is outside the loop.
    assert [(step, phase) for step, phase, *_ in sites] == [(2, "eval"), (2, "after"), (4, "after")]


@pytest.mark.parametrize("every", ["2", "epoch"])
def test_the_weight_check_after_the_last_step_is_not_the_loaders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 every: str) -> None:
    """The weight check runs before each checkpoint (the update's bookkeeping, also at an epoch's end) and once
    after the loop; that last one stalls no step (the H100 run of 2026-11-25 had it as a "loader" sync at the
    last step)."""
    from qa_train.trainer import Trainer

    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    monkeypatch.setenv("QA_TRAIN_CACHE", str(tmp_path / "cache"))
    import sync_sites

    check = Trainer._check_weights

    def syncing(self):
        warnings.warn("called a synchronizing CUDA operation")
        return check(self)

    monkeypatch.setattr(Trainer, "_check_weights", syncing)
    sites_file = tmp_path / "sites.json"
    length = ["--max_train_steps", "4"] if every == "2" else ["--max_train_samples", "24", "--num_train_epochs", "1"]
    sync_sites.main([str(sites_file), "--", *tiny_flags(
        tmp_path / "run", *length, "--checkpointing_steps", every, "--no_eval", "--disable_tqdm",
        "--save_final_model", "false")])
    sites = [(step, phase) for step, phase, *_ in json.loads(sites_file.read_text())]
    steps = json.loads((tmp_path / "run" / "metrics.json").read_text())["train_steps"]
    assert sites == ([(2, "after"), (4, "after")] if every == "2" else [(steps, "after")])
