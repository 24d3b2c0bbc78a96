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
    does: the limit becomes the sizes it can make (each width with full batches and an epoch's smaller last one),
    and stays where more would be a real surprise."""
    from torch._inductor import config

    from qa_train.model.modeling import allow_graphs_per_width, uses_graphs_per_width

    assert not uses_graphs_per_width(SystemArgs(torch_compile=True), dynamic=True), "no CUDA graphs"
    assert not uses_graphs_per_width(SystemArgs(torch_compile_mode="reduce-overhead"), dynamic=False), "one graph"
    assert uses_graphs_per_width(SystemArgs(torch_compile_mode="reduce-overhead"), dynamic=True)
    assert uses_graphs_per_width(SystemArgs(torch_compile_mode="max-autotune"), dynamic=True)
    monkeypatch.setattr(config.triton, "cudagraph_dynamic_shape_warn_limit", 8)
    allow_graphs_per_width(48)
    assert config.triton.cudagraph_dynamic_shape_warn_limit == 96
    monkeypatch.setattr(config.triton, "cudagraph_dynamic_shape_warn_limit", None)
    allow_graphs_per_width(48)
    assert config.triton.cudagraph_dynamic_shape_warn_limit is None, "the user silenced it"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # importing torch._inductor: as above
def test_cuda_graphs_asked_for_without_cuda_are_said_to_be_left_out(caplog) -> None:
    """Inductor drops CUDA graphs off CUDA and says so only in its debug log: a CPU run asking for them would have
    compiled without them unsaid."""
    with caplog.at_level("WARNING", logger="qa_train"):
        compile_model(
            torch.nn.Linear(2, 2), SystemArgs(torch_compile_mode="reduce-overhead"), dynamic=True, on_cuda=False
        )
        compile_model(torch.nn.Linear(2, 2), SystemArgs(torch_compile_mode="reduce-overhead"), dynamic=True)
        compile_model(torch.nn.Linear(2, 2), SystemArgs(torch_compile=True), dynamic=True, on_cuda=False)
    assert [r.getMessage() for r in caplog.records] == [
        "--torch_compile_mode reduce-overhead: no CUDA device, so no CUDA graphs (compiled without them)"
    ]


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
