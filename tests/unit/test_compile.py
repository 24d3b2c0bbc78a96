"""--torch_compile: regional compilation compiles each encoder layer apart and refuses a model without repeated
layers; evaluation runs the compiled model eagerly."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY
from transformers import AutoConfig, AutoModelForQuestionAnswering

from qa_train.config.settings import ConfigError, SystemArgs
from qa_train.model.modeling import compile_model


def test_regional_compilation_compiles_each_encoder_layer_alone_and_the_rest_apart() -> None:
    model = AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(TINY))
    system = SystemArgs(torch_compile_regional=True, torch_compile_backend="eager")
    assert system.torch_compile, "--torch_compile_regional implies --torch_compile"
    compile_model(model, system, dynamic=True)
    compiled = {name for name, m in model.named_modules() if m._compiled_call_impl is not None}
    layers = {f"bert.encoder.layer.{i}" for i in range(model.config.num_hidden_layers)}
    assert compiled == layers | {"bert.embeddings", "qa_outputs"}, "never the whole model or the encoder in one graph"


def test_regional_compilation_of_a_model_without_repeated_layers_is_refused() -> None:
    """accelerate compiles nothing then, and the run would have trained eagerly without a word."""
    with pytest.raises(ConfigError, match="--torch_compile_regional: Linear has no repeated layers"):
        compile_model(torch.nn.Linear(2, 2), SystemArgs(torch_compile_regional=True), dynamic=True)


def test_evaluation_runs_the_compiled_model_eagerly() -> None:
    """A compiled model's forward without gradients is a second graph (its own compile, which cost a GPU run more
    than the evaluation itself): evaluation leaves torch.compile out, and still answers as the model does."""
    from accelerate import Accelerator

    from qa_train.evaluation import predict_logits
    from qa_train.model.modeling import compile_figures

    torch.manual_seed(0)
    model = AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(TINY)).eval()
    ids = torch.randint(5, 100, (3, 12))
    with torch.no_grad():
        expected = model(input_ids=ids).start_logits
    compile_model(model, SystemArgs(torch_compile=True, torch_compile_backend="eager"), dynamic=True)
    before = compile_figures()[1]
    batch = {"input_ids": ids, "feature_index": torch.arange(3), "num_tokens": torch.tensor(36)}
    start, _, order = predict_logits(Accelerator(cpu=True), model, [batch], width=16)
    assert compile_figures()[1] == before, "evaluation compiled a graph"
    assert order.tolist() == [0, 1, 2]
    torch.testing.assert_close(torch.from_numpy(start[:, :12]), expected)
    assert model.training, "back in training mode for the next step"


def test_a_compile_traces_the_model_once() -> None:
    """The model's Python floats (dropout p, LayerNorm eps) traced as symbols made torch restart the frame when it
    specialised them: every compile traced the model and built its joint graph twice, warm cache or not."""
    from torch._dynamo.utils import counters

    model = AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(TINY))
    compile_model(model, SystemArgs(torch_compile=True, torch_compile_backend="aot_eager"), dynamic=True)
    counters.clear()
    ids = torch.randint(5, 100, (2, 16))
    zeros = torch.zeros(2, dtype=torch.long)
    model(input_ids=ids, start_positions=zeros, end_positions=zeros).loss.backward()
    assert counters["aot_autograd"]["total"] == 1, "the frame was traced more than once"


# Importing torch._inductor warns of torch.jit's deprecation, torch's own modules' doing.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_cuda_graphs_over_padded_widths_do_not_warn_below_their_number(monkeypatch) -> None:
    """Inductor warns past 8 recorded sizes and advises padding to a few shapes, which dynamic padding already
    does: the limit becomes the number of widths it can make, and stays where more would be a real surprise."""
    from torch._inductor import config

    monkeypatch.setattr(config.triton, "cudagraph_dynamic_shape_warn_limit", 8)
    compile_model(torch.nn.Linear(2, 2), SystemArgs(torch_compile_mode="default"), dynamic=True, widths=48)
    assert config.triton.cudagraph_dynamic_shape_warn_limit == 8  # no CUDA graphs: nothing to say
    compile_model(torch.nn.Linear(2, 2), SystemArgs(torch_compile_mode="reduce-overhead"), dynamic=False, widths=48)
    assert config.triton.cudagraph_dynamic_shape_warn_limit == 8  # fixed length: one graph
    compile_model(torch.nn.Linear(2, 2), SystemArgs(torch_compile_mode="reduce-overhead"), dynamic=True, widths=48)
    assert config.triton.cudagraph_dynamic_shape_warn_limit == 48


def test_compile_figures_tell_a_cold_compile_from_a_warm_one(tmp_path) -> None:
    """A GPU compile took 48 s with inductor's cache filled by the run before, and nothing said whether the cache was
    used: the figures count the graphs inductor built and the ones it loaded. A real inductor compile, twice in one
    empty cache folder (in a child process, so this process's caches and settings stay out of it)."""
    import json
    import os
    import subprocess
    import sys

    code = """
import json, torch
from qa_train.model.modeling import compile_figures
readings = []
for _ in range(2):
    torch._dynamo.reset()  # forget the compiled code in memory: the second compile must go to the disk cache
    before = compile_figures()
    torch.compile(lambda x: torch.relu(x) * 2)(torch.randn(4))
    readings.append(compile_figures().since(before))
print(json.dumps(readings))
"""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (cold_s, cold_graphs, cold_hits, cold_misses), (_, warm_graphs, warm_hits, warm_misses) = json.loads(
        proc.stdout.splitlines()[-1]
    )
    assert cold_s > 0 and cold_graphs == warm_graphs == 1
    assert (cold_hits, cold_misses) == (0, 1), "an empty cache: the kernel was built"
    assert (warm_hits, warm_misses) == (1, 0), "the same graph again: loaded from the cache"


def test_the_summary_says_whether_the_compile_built_or_loaded_its_kernels() -> None:
    from qa_train.observe.recorder import summary_table
    from qa_train.observe.schema import RunMetrics

    def compile_row(**cache: int) -> str:
        run = RunMetrics(
            strategy="single", world_size=1, train_steps=4, compile_time_s=48.2, compiled_graphs=1, **cache
        )
        return next(line for line in summary_table(run).splitlines() if line.startswith("compile "))

    assert compile_row(compile_cache_hits=2, compile_cache_misses=0).endswith(
        "1 graph(s) in 48.20 s, part of the training time (inductor's cache: 2 graph(s) loaded, 0 built)"
    )
    # Another backend (eager, aot_eager) meets no inductor graph: nothing to say of a cache.
    assert compile_row(compile_cache_hits=0, compile_cache_misses=0).endswith("part of the training time")
