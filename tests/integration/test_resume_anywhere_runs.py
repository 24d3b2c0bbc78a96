"""A checkpoint continues on another number of processes, and under another strategy, as the uninterrupted run goes
on: step by step the same learning rate, the same loss to rounding, and close final weights."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import base_env, read_metrics, run_ok
from safetensors.torch import load_file
from strategy_runs import launch_cmd, step_log

STRATEGY = {"zero2_offload": "zero2", "zero3_offload": "zero3"}  # the others are named as their config
# Measured: losses after such a resume differ from the uninterrupted run's by at most 1.1e-6 (of about 4): another
# reduction order (one process accumulating two micro-batches, or another library's all-reduce) rounds otherwise.
LOSS_TOL = 1e-5
# Adam divides by the root of its second moment, so where a gradient is near zero that rounding moves a weight by up
# to the learning rate (1e-4 measured, in about 0.02% of the weights); the weights as a whole agree to 6e-6.
WEIGHTS_TOL = 2e-5


def continue_run(config: str, processes: int, checkpoint: Path, out: Path, *extra: str) -> str:
    """The checkpoint continued by `processes` processes under `config`, into a new output dir; what it said."""
    cmd = [*launch_cmd(config, out, *extra, processes=processes), "--resume_from_checkpoint", str(checkpoint)]
    proc = run_ok(cmd, base_env(out.parent))
    return proc.stdout + proc.stderr


def assert_continues(out: Path, reference: Path, steps: range) -> None:
    """Step by step the uninterrupted run's learning rate exactly and its loss to rounding; its final weights."""
    ours, ref = step_log(out), step_log(reference)
    assert sorted(ours) == list(steps)
    # Printed for the record (pytest -rA shows it): the figures the tolerances were set from.
    diffs = {step: abs(ours[step]["train/loss"] - ref[step]["train/loss"]) for step in steps}
    print(f"{out.parent.name}: |loss - uninterrupted| per step {diffs}")
    for step in steps:
        assert ours[step]["train/lr"] == ref[step]["train/lr"], f"LR differs at step {step}"
        assert ours[step]["train/loss"] == pytest.approx(ref[step]["train/loss"], abs=LOSS_TOL), f"loss, step {step}"
    resumed = load_file(out / "final" / "model.safetensors")
    expected = load_file(reference / "final" / "model.safetensors")
    assert set(resumed) == set(expected)
    off = sum(float((resumed[k] - t).pow(2).sum()) for k, t in expected.items()) ** 0.5
    whole = sum(float(t.pow(2).sum()) for t in expected.values()) ** 0.5
    print(f"{out.parent.name}: final weights, relative L2 difference {off / whole:.2e}")
    assert off <= WEIGHTS_TOL * whole
    assert max(float((resumed[k] - t).abs().max()) for k, t in expected.items()) < 1e-3


@pytest.fixture(scope="module")
def on_one(
    tmp_path_factory: pytest.TempPathFactory, uninterrupted: Callable[[str], Path]
) -> Callable[[str, str], tuple[Path, str]]:
    """A 2-process run's step-4 checkpoint continued on one process (checkpointing every 2 steps), once per pair."""
    done: dict[tuple[str, str], tuple[Path, str]] = {}

    def run(source: str, config: str) -> tuple[Path, str]:
        if (source, config) not in done:
            out = tmp_path_factory.mktemp(f"{source}-to-{config}") / "run"
            step_4 = uninterrupted(source) / "checkpoints" / "step_00000004"
            done[source, config] = (out, continue_run(config, 1, step_4, out, "--checkpointing_steps", "2"))
        return done[source, config]

    return run


# In the reverse of test_strategies.py's order: under two pytest workers the two files then start different
# uninterrupted runs (the shared fixture's), where the same order kept one worker waiting for the other's.
@pytest.mark.parametrize(
    ("source", "config"),
    [
        ("fsdp", "fsdp"),
        # ZeRO-3 offload: DeepSpeed's partitions and its CPU Adam's state; ZeRO-3 without offload writes the same
        # files (its partitions are converted at another strategy below). ZeRO-2 offload's CPU Adam loads a
        # converted checkpoint below.
        ("zero3_offload", "zero3_offload"),
        # ZeRO-2's (and ZeRO-1's, the same files) are read at another strategy below, and ZeRO-2 is a target on one
        # process there (fsdp -> zero2_offload), through the same conversion.
        ("ddp", "single"),
    ],
)
def test_a_checkpoint_of_two_processes_continues_on_one_with_accumulation_2(
    source: str, config: str, uninterrupted: Callable[[str], Path], on_one: Callable[[str, str], tuple[Path, str]]
) -> None:
    """The command unchanged but for the process count: the run refits its accumulation to keep the global batch of
    16, and steps 5-8 go as in the uninterrupted 2-process run. DeepSpeed's partitions are converted; accelerate's
    single/DDP files and FSDP2's sharded ones (torch.distributed.checkpoint) load as saved."""
    out, said = on_one(source, config)
    m = read_metrics(out)
    assert (m["world_size"], m["strategy"], m["global_batch_size"]) == (1, STRATEGY.get(config, config), 16)
    assert m["args"]["gradient_accumulation_steps"] == 2
    assert "--gradient_accumulation_steps 1 -> 2 keeps its global batch of 16" in said
    assert ("Adam moments and step were converted by parameter name" in said) == source.startswith("zero"), said[-3000:]
    assert_continues(out, uninterrupted(source), range(5, 9))


# ZeRO-3 offload's partitions of one process converted for two under ZeRO-1 (torch's Adam after DeepSpeed's CPU
# Adam): another strategy and world size at once.
@pytest.mark.parametrize(
    ("source", "via", "config"),
    [("ddp", "single", "ddp"), ("fsdp", "fsdp", "fsdp"), ("zero3_offload", "zero3_offload", "zero1")],
)
def test_a_checkpoint_of_one_process_continues_on_two(
    source: str,
    via: str,
    config: str,
    uninterrupted: Callable[[str], Path],
    on_one: Callable[[str, str], tuple[Path, str]],
    tmp_path: Path,
) -> None:
    """The 1-process continuation's step-6 checkpoint (accumulation 2) continued by 2 processes (accumulation 1)."""
    one, _ = on_one(source, via)
    out = tmp_path / "run"
    said = continue_run(config, 2, one / "checkpoints" / "step_00000006", out)
    assert "it was written by 1 process, this run has 2, with the same global batch of 16" in said
    assert read_metrics(out)["world_size"] == 2
    assert_continues(out, uninterrupted(source), range(7, 9))


@pytest.mark.parametrize(
    ("source", "config", "processes"),
    [
        ("ddp", "zero3", 2),
        ("zero2", "fsdp", 2),
        ("zero3", "ddp", 1),
        # Offload's optimizer (DeepSpeed's CPU Adam) as the target of a conversion; as its source, 2 -> 1 above.
        ("fsdp", "zero2_offload", 1),
    ],
)
def test_a_checkpoint_continues_under_another_strategy(
    source: str, config: str, processes: int, uninterrupted: Callable[[str], Path], tmp_path: Path
) -> None:
    """Converted through the portable layout on resume, with no step of the user's; ZeRO-3 x2 -> DDP x1 changes the
    number of processes too."""
    reference = uninterrupted(source)
    out = tmp_path / "run"
    said = continue_run(config, processes, reference / "checkpoints" / "step_00000004", out)
    saved = json.loads((reference / "checkpoints" / "step_00000004" / "trainer_state.json").read_text())
    now = json.loads((out / "checkpoints" / "step_00000008" / "trainer_state.json").read_text())
    assert (
        f"saved as {saved['checkpoint_layout']}, loaded as {now['checkpoint_layout']}, so its weights, Adam moments"
        in said
    )
    assert not list((out / "checkpoints").glob(".portable-*")), "the converted folder is removed once loaded"
    assert read_metrics(out)["world_size"] == processes
    assert_continues(out, reference, range(5, 9))
