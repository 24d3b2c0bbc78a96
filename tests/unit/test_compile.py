"""--torch_compile_regional compiles each encoder layer apart, and refuses a model without repeated layers."""

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
