"""qa_train's reader of DeepSpeed's ZeRO checkpoint files (qa_train.strategy.zero_files), held to DeepSpeed's own
consolidation on checkpoints that two CPU processes wrote: the fp32 weights to zero_to_fp32's, Adam's moments to
ds_to_universal's per-parameter files, parameters whose sizes two ranks do not divide (padded) included."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qa_train.strategy import portable
from qa_train.strategy.zero_files import DeepSpeedFiles, ZeroFilesError

# ZeRO-3 without offload writes the same files with one flat group per parameter group, a layout the offload case's
# sub-groups include; test_resume_anywhere_runs.py holds its conversion to the uninterrupted run's losses.
CASES = [(2, "none"), (3, "offload")]


@pytest.fixture
def written(deepspeed_probes: Path) -> Callable[[int, str], Path]:
    """The probe's checkpoint after two steps of ZeRO-<stage> on two processes (deepspeed_probes.py)."""
    return lambda stage, offload: deepspeed_probes / f"checkpoint-{stage}-{offload}"


def universal(checkpoint: Path, out: Path) -> Path:
    """DeepSpeed's own per-parameter files of the checkpoint (its `zero` folder)."""
    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    settings = {
        "input_folder": str(checkpoint / "pytorch_model"),
        "output_folder": str(out),
        "num_extract_workers": 1,
        "num_merge_workers": 1,
        "keep_temp_folder": False,
        "strict": True,
        "inject_missing_state": True,
    }
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # its bars
        ds_to_universal(argparse.Namespace(**settings))
    return out / "zero"


def _moment(folder: Path, name: str, kind: str) -> torch.Tensor:
    saved = torch.load(folder / name / f"{kind}.pt", weights_only=True)
    return saved["param"] if isinstance(saved, dict) else saved


@pytest.mark.parametrize(("stage", "offload"), CASES)
def test_zero_files_convert_as_deepspeed_consolidates_them(
    stage: int, offload: str, written: Callable[[int, str], Path], tmp_path: Path
) -> None:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from deepspeed_probes import CheckpointProbe

    checkpoint = written(stage, offload)
    with torch.device("meta"):
        shapes = {name: tuple(p.shape) for name, p in CheckpointProbe().named_parameters()}
    assert shapes["odd"] == (7,) and shapes["lin.bias"] == (5,)  # padded: two ranks divide neither
    folder = tmp_path / "portable"
    portable.convert(checkpoint, shapes, folder)
    assert json.loads((folder / portable.META).read_text())["step"] == 2

    weights = load_file(folder / "weights.safetensors")
    with contextlib.redirect_stdout(io.StringIO()):
        expected = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint), tag="pytorch_model")
    assert set(weights) == set(expected) == set(shapes)
    for name, tensor in expected.items():
        torch.testing.assert_close(weights[name], tensor, rtol=0, atol=0, msg=name)

    reference = universal(checkpoint, tmp_path / "universal")
    for kind in ("exp_avg", "exp_avg_sq"):
        moments = load_file(folder / f"{kind}.safetensors")
        assert set(moments) == set(shapes)
        for name, shape in shapes.items():
            assert moments[name].shape == shape, (kind, name)
            torch.testing.assert_close(moments[name], _moment(reference, name, kind).view(shape), rtol=0, atol=0)
            assert moments[name].abs().sum() > 0, (kind, name)  # trained: not the zeros of a fresh state


def test_a_zero_checkpoint_missing_a_ranks_file_is_refused_in_one_line(
    written: Callable[[int, str], Path], tmp_path: Path
) -> None:
    checkpoint = shutil.copytree(written(2, "none"), tmp_path / "checkpoint")
    (checkpoint / "pytorch_model" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(ZeroFilesError, match=r"optim_states.pt: partitioned over \[2, 2\] ranks, 1 optimizer files"):
        DeepSpeedFiles(checkpoint)
    (checkpoint / "pytorch_model" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"not a zip")
    with pytest.raises(ZeroFilesError, match=r"optim_states.pt: not readable as DeepSpeed's checkpoint file \("):
        DeepSpeedFiles(checkpoint)
