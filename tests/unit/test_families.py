"""Any encoder a user brings: BERT, RoBERTa, DistilBERT, ELECTRA, XLM-R, DeBERTa-v3 and ModernBERT, each a tiny
random model with a tokenizer trained offline (tests/families.py).

Per family: the windows and labels are the tokenizer's own overflow encoding; no normalisation layer or bias is
decayed, whatever the family calls it; FSDP wraps each family's layers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import DEMO_DEV
from families import FAMILIES, write_families

from qa_train.data.features import featurize, window_offsets
from qa_train.data.load import load_file


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_families(tmp_path_factory.mktemp("families"))


@pytest.mark.parametrize("family", FAMILIES)
def test_windows_and_labels_are_the_tokenizers_own(family: str, family_dirs: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(family_dirs[family])
    ex = load_file(DEMO_DEV).head(40)
    feats = featurize(ex, tokenizer, max_seq_length=64, doc_stride=16, with_offsets=True)
    ref = tokenizer(
        [q.lstrip() for q in ex.questions],
        ex.contexts,
        truncation="only_second",
        max_length=64,
        stride=16,
        return_overflowing_tokens=True,
    )
    assert len(feats) == len(ref["input_ids"]) > len(ex)  # several windows per question
    assert feats.example_index.tolist() == list(ref["overflow_to_sample_mapping"])
    for i, ids in enumerate(ref["input_ids"]):
        assert feats.input_ids[feats.row_start[i] : feats.row_start[i + 1]].tolist() == ids, f"window {i}"
    offsets = window_offsets(feats, 64)
    labelled = feats.start_positions != feats.cls_index
    assert labelled.sum() >= len(ex) and (feats.cls_index == 0).all()  # CLS (<s>) opens every family's pair
    for f in np.flatnonzero(labelled):
        i, s, e = feats.example_index[f], feats.start_positions[f], feats.end_positions[f]
        # SentencePiece offsets (XLM-R, DeBERTa-v3) include the space a "▁" token stands for.
        assert ex.contexts[i][offsets[f, s, 0] : offsets[f, e, 1]].strip() == ex.answer_texts[i][0]


@pytest.mark.parametrize("family", FAMILIES)
def test_no_decay_for_every_norm_and_bias(family: str, family_dirs: dict[str, Path]) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    from qa_train.model.optimization import param_groups

    model = AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(family_dirs[family]))
    decay, no_decay = (set(map(id, g["params"])) for g in param_groups(model, 0.01))
    assert not decay & no_decay and len(decay | no_decay) == len(list(model.parameters()))
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            is_norm = "norm" in type(module).__name__.lower()
            if is_norm or pname == "bias":
                assert id(p) in no_decay, f"{name}.{pname} ({type(module).__name__}) is decayed"
            elif isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                assert id(p) in decay, f"{name}.{pname} is not decayed"


@pytest.mark.parametrize("family", FAMILIES)
def test_fsdp_wraps_every_encoder_layer_of_every_family(family: str, family_dirs: dict[str, Path]) -> None:
    """Through accelerate's own FSDP2 wrap policy (no process group needed): the shipped fsdp.yaml names no
    layer class, and each family's encoder layers become FSDP units; a class named in the config still wins,
    and naming BertLayer fails every other family as it did before."""
    from types import SimpleNamespace

    import yaml
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
    from conftest import ROOT
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    from qa_train.strategy.sharded import fit_fsdp_wrap

    shipped = yaml.safe_load((ROOT / "accelerate_configs" / "fsdp.yaml").read_text())["fsdp_config"]
    assert "fsdp_transformer_layer_cls_to_wrap" not in shipped
    config = AutoConfig.from_pretrained(family_dirs[family])
    model = AutoModelForQuestionAnswering.from_config(config)

    def wrapped(names: list[str] | None) -> list[str]:
        plugin = FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy=shipped["fsdp_auto_wrap_policy"], transformer_cls_names_to_wrap=names
        )
        fit_fsdp_wrap(SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)), model)
        policy = fsdp2_prepare_auto_wrap_policy(plugin, model)
        return [type(m).__name__ for m in model.modules() if policy(m)]

    units = wrapped(None)
    layers = getattr(config, "num_hidden_layers", None) or config.n_layers
    assert max(units.count(name) for name in set(units)) == layers == 2, units
    if family != "bert":
        with pytest.raises(ValueError, match="Could not find the transformer layer class BertLayer"):
            wrapped(["BertLayer"])
    else:
        assert wrapped(["BertLayer"]) == ["BertLayer"] * 2


def test_fsdp_leaves_the_input_embeddings_to_accelerate(
    family_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers 5.17 declares BertEmbeddings no-split; accelerate's FSDP2 preparation shards the input
    embedding itself after the wrap, and sharding it inside an already-sharded BertEmbeddings failed on an
    H100 (fully_shard: "Invariant encountered: value was None"). The class holding it is not wrapped."""
    from transformers import AutoConfig, AutoModelForQuestionAnswering

    from qa_train.strategy.sharded import fsdp_layer_classes

    model = AutoModelForQuestionAnswering.from_config(AutoConfig.from_pretrained(family_dirs["bert"]))
    monkeypatch.setattr(type(model), "_no_split_modules", ["BertEmbeddings", "BertLayer"], raising=False)
    assert fsdp_layer_classes(model) == ["BertLayer"]
