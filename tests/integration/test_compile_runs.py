"""--torch_compile changes how the model runs, never what a run writes: the export and the checkpoints carry the
model's own weight names, so the export reloads as the trained model and a checkpoint resumes either way; a backend
that cannot compile is one line and exit 2.

The runs compile with the eager backend (dynamo captures the graphs and runs them as they are): the wrapper that
would rename the weights is the same for every backend, and inductor's C++ kernel builds would cost ~40 s of the
suite's CPU time on a fresh machine to prove nothing more here (the benchmarks' torch-compile ablation runs it).
Inductor's cache is held by a two-layer network's compile instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PY, TINY, base_env, error_lines, export_answers, main_here, read_metrics, run_ok, tiny_flags
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForQuestionAnswering


@pytest.mark.parametrize("how", [[], ["--torch_compile_regional"]], ids=["whole", "regional"])
def test_compiled_run_exports_and_checkpoints_the_plain_weight_names(tmp_path: Path, how: list[str]) -> None:
    env, out = base_env(tmp_path), tmp_path / "compiled"
    flags = tiny_flags(
        out, "--max_train_steps", "4", "--checkpointing_steps", "2", "--max_eval_samples", "40", "--disable_tqdm"
    )
    # --eval_on_start evaluates before training, eagerly: it compiles nothing, and training compiles every graph.
    proc = run_ok([PY, "-m", "qa_train", *flags, "--torch_compile_backend", "eager", "--eval_on_start", *how], env)
    metrics = read_metrics(out)
    assert 0 < metrics["compile_time_s"] < metrics["train_runtime_s"], "compiling is timed, inside training"
    # One graph over every padded width (dynamic shapes); by layer, one for all the encoder layers, as they share
    # their code (the cold compile of one layer that regional compiling promises), one for the embeddings and one
    # for the head.
    assert metrics["compiled_graphs"] == (3 if how else 1)
    assert f"{metrics['compiled_graphs']} graph(s) in {metrics['compile_time_s']:.2f} s" in proc.stdout + proc.stderr

    names = set(AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(TINY)).state_dict())
    assert set(load_file(out / "final" / "model.safetensors")) == names
    assert set(load_file(out / "checkpoints" / "step_00000002" / "model.safetensors")) == names

    evaluated = json.loads((out / "eval_predictions.json").read_text())
    assert export_answers(out / "final", 40, device="cpu") == evaluated, "the export answers as the compiled run did"

    if not how:
        return  # the checkpoints hold the same names either way: one resume shows they load without compiling
    run_ok([PY, "-m", "qa_train", *flags, "--max_train_steps", "6", "--resume_from_checkpoint", "latest"], env)
    resumed = read_metrics(out)
    assert resumed["train_steps"] == 6 and resumed["compile_time_s"] is None, "nothing compiled: no compile time"


@pytest.mark.usefixtures("in_process", "own_logging")
def test_a_backend_that_cannot_compile_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch.compile fails at the first step (here tvm, whose package is not installed): it was a multi-line
    traceback and exit 1; now one line naming the flag and the cause, exit 2, and nothing written."""
    import importlib.util

    import torch

    assert importlib.util.find_spec("tvm") is None, "this test needs a machine without apache-tvm"
    out = tmp_path / "run"
    flags = tiny_flags(out, "--max_train_steps", "2", "--no_eval", "--torch_compile_backend", "tvm", "--disable_tqdm")
    try:
        code, _, err = main_here(flags, capsys)
    finally:
        torch._dynamo.reset()  # the failed compile's state is this process's, not the next test's
    assert code == 2, err[-3000:]
    [line] = error_lines(err)
    assert line.startswith("qa_train: error: --torch_compile_backend tvm: compiling the model failed (ImportError: ")
    assert list(out.iterdir()) == []


RUN = """
import json, sys, torch
from qa_train.config.settings import SystemArgs
from qa_train.model.modeling import allow_graphs_per_width, compile_figures, compile_model

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.Linear(16, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))

net = Net()
compile_model(net, SystemArgs(torch_compile_mode="reduce-overhead"), dynamic=True)
net(torch.randn(4, 8)).sum().backward()  # the first step compiles the forward and the backward
allow_graphs_per_width(int(sys.argv[1]))  # as the trainer does after it
print(json.dumps(compile_figures()))
"""


def test_a_warm_compile_loads_its_kernels_under_other_padded_widths(tmp_path) -> None:
    """A GPU compile with CUDA graphs took 48 s after a run that had filled inductor's cache, and nothing said
    whether the cache was used: the figures count the graphs inductor built and the ones it loaded. They showed
    why: the warning limit raised for the padded widths was part of inductor's cache key, so another
    --pad_to_multiple_of (41 widths, then 11) rebuilt every kernel. Two runs' processes, one empty cache folder,
    a real inductor compile (CUDA graphs need a GPU; their mode's cache key is the same on the CPU)."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    figures = []
    for widths in ("41", "11"):
        proc = subprocess.run([sys.executable, "-c", RUN, widths], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        figures.append(json.loads(proc.stdout.splitlines()[-1]))
    (cold_s, cold_graphs, cold_hits, cold_misses), (_, warm_graphs, warm_hits, warm_misses) = figures
    assert cold_s > 0 and cold_graphs == warm_graphs == 1
    assert (cold_hits, cold_misses) == (0, 2), "an empty cache: the forward and the backward were built"
    assert (warm_hits, warm_misses) == (2, 0), "the same model again: both loaded from the cache"
