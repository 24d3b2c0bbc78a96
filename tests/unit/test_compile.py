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
