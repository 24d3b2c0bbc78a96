"""Model, config and tokenizer folders a user damaged or mixed up, given to training (--model_name_or_path,
--config_name, --tokenizer_name) or to predict (MODEL_DIR): each is refused in one line naming the flag and the
file, before any window is made or weight loaded, instead of a traceback after the data was featurised."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import PAST_PREFLIGHT, high_padding_model, preflight_says, tiny_flags, write_config

from qa_train import predict
from qa_train.config.flags import parse_args
from qa_train.config.settings import ConfigError


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A whole tiny BERT QA model folder (config, weights, tokenizer), never altered: tests alter copies."""
    return high_padding_model(tmp_path_factory.mktemp("model") / "qa")


def copy(model: Path, tmp_path: Path, **config: object) -> Path:
    """A copy of the model folder, its config.json given these keys."""
    altered = Path(shutil.copytree(model, tmp_path / "altered"))
    if config:
        saved = json.loads((altered / "config.json").read_text())
        (altered / "config.json").write_text(json.dumps({**saved, **config}))
    return altered


def refused_by_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> str:
    """The preflight's refusal of the tiny run with `flags` in place of its --config_name/--tokenizer_name."""
    said = preflight_says(tmp_path, monkeypatch, *flags)
    assert said != PAST_PREFLIGHT, "the run went on to read its data"
    return said


def refused_by_predict(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> str:
    code = predict.main([str(model_dir), "-q", "Who?", "-c", "Somebody.", "--device", "cpu"])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("qa-train predict: error: ")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in out + err, (code, out, err)
    return lines[0].removeprefix("qa-train predict: error: ")


@pytest.mark.parametrize(("content", "kind"), [("[1, 2]", "an array"), ('"bert"', "a string"), ("null", "null")])
def test_a_config_json_that_is_not_an_object_is_refused(
    content: str,
    kind: str,
    model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """transformers passed a JSON array on as keyword arguments: a TypeError traceback, in training and predict."""
    altered = copy(model, tmp_path)
    (altered / "config.json").write_text(content)
    says = f"config.json holds {kind}, not a JSON object of config keys"
    message = refused_by_training(tmp_path, monkeypatch, "--model_name_or_path", str(altered))
    assert message == f"--model_name_or_path {altered}: {says}"
    message = refused_by_training(tmp_path, monkeypatch, "--config_name", str(altered), "--tokenizer_name", str(model))
    assert message == f"--config_name {altered}: {says}"
    assert refused_by_predict(altered, capsys) == f"MODEL_DIR {altered}: {says}"


def _truncated(weights: Path) -> None:
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _not_safetensors(weights: Path) -> None:
    weights.write_bytes(b"<html>404 Not Found</html>")


def _one_shard_missing(weights: Path) -> None:
    """Two shards and their index, as save_pretrained's max_shard_size writes them, less the second shard."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    names = sorted(tensors)
    shards = {name: f"model-0000{1 + i % 2}-of-00002.safetensors" for i, name in enumerate(names)}
    save_file(
        {n: t for n, t in tensors.items() if shards[n].startswith("model-00001")}, weights.parent / shards[names[0]]
    )
    (weights.parent / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": shards}))
    weights.unlink()


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (_truncated, r"model.safetensors is not a readable safetensors file \(SafetensorError: .*\): truncated or "),
        (_not_safetensors, r"model.safetensors is not a readable safetensors file \(SafetensorError: "),
        (_one_shard_missing, r"model.safetensors.index.json names the shard model-00002-of-00002.safetensors, which "),
    ],
)
def test_weights_that_cannot_be_read_are_refused_before_the_data_is_featurised(
    damage: Callable[[Path], None],
    says: str,
    model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A truncated or foreign model.safetensors was a SafetensorError traceback once the data was featurised (in
    predict too), and a missing shard a refusal only then."""
    altered = copy(model, tmp_path)
    damage(altered / "model.safetensors")
    message = refused_by_training(tmp_path, monkeypatch, "--model_name_or_path", str(altered))
    assert re.match(rf"--model_name_or_path {re.escape(str(altered))}: {says}", message), message
    assert re.match(rf"MODEL_DIR {re.escape(str(altered))}: {says}", refused_by_predict(altered, capsys))


@pytest.mark.parametrize(
    ("sizes", "says"),
    [
        (
            {"vocab_size": 5000},
            "bert.embeddings.word_embeddings.weight is [3707, 128] in the weights, [5000, 128] by the config;",
        ),
        ({"hidden_size": 64, "intermediate_size": 256}, "bert.embeddings.LayerNorm.bias is [128] in the weights, "),
    ],
)
def test_weights_the_config_does_not_fit_are_refused_before_the_data_is_featurised(
    sizes: dict[str, int],
    says: str,
    model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A config.json edited after the weights were saved, or a --config_name of another size: from_pretrained's
    RuntimeError traceback (`ignore_mismatched_sizes`), after the data was featurised."""
    altered = copy(model, tmp_path, **sizes)
    message = refused_by_training(tmp_path, monkeypatch, "--model_name_or_path", str(altered))
    assert message.startswith(f"--model_name_or_path {altered}: its weights do not fit its config.json: {says}")
    other = write_config(tmp_path / "other-size", **sizes)
    message = refused_by_training(
        tmp_path, monkeypatch, "--model_name_or_path", str(model), "--config_name", str(other)
    )
    assert message.startswith(f"--model_name_or_path {model}: its weights do not fit --config_name {other}: {says}")
    assert refused_by_predict(altered, capsys).startswith(
        f"MODEL_DIR {altered}: its weights do not fit its config.json: {says}"
    )


def as_pytorch_bin(folder: Path, *, zip_format: bool = True) -> Path:
    """The folder's weights as pytorch_model.bin, in place of model.safetensors."""
    import torch
    from safetensors.torch import load_file

    torch.save(
        load_file(folder / "model.safetensors"), folder / "pytorch_model.bin", _use_new_zipfile_serialization=zip_format
    )
    (folder / "model.safetensors").unlink()
    return folder / "pytorch_model.bin"


def test_a_pytorch_bin_the_config_does_not_fit_is_refused_before_the_data_is_featurised(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Older checkpoints hold pytorch_model.bin; its records give the shapes without their data."""
    altered = copy(model, tmp_path, vocab_size=5000)
    as_pytorch_bin(altered)
    message = refused_by_training(tmp_path, monkeypatch, "--model_name_or_path", str(altered))
    assert message.startswith(
        f"--model_name_or_path {altered}: its weights do not fit its config.json: bert.embeddings.word_embeddings."
        "weight is [3707, 128] in the weights, [5000, 128] by the config;"
    ), message


def test_a_damaged_pytorch_bin_or_a_missing_shard_is_refused_before_the_data_is_featurised(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    altered = copy(model, tmp_path)
    weights = as_pytorch_bin(altered)
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    message = refused_by_training(tmp_path, monkeypatch, "--model_name_or_path", str(altered))
    assert re.match(
        rf"--model_name_or_path {re.escape(str(altered))}: pytorch_model.bin is not a readable PyTorch weights file "
        r"\(RuntimeError: .*\): truncated or damaged; copy or download it again$",
        message,
    ), message
    index = {"weight_map": {"a": "pytorch_model-00001-of-00002.bin", "b": "pytorch_model-00002-of-00002.bin"}}
    weights.rename(altered / "pytorch_model-00001-of-00002.bin").write_bytes(whole)
    (altered / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    message = refused_by_training(tmp_path, monkeypatch, "--model_name_or_path", str(altered))
    assert message == (
        f"--model_name_or_path {altered}: pytorch_model.bin.index.json names the shard "
        "pytorch_model-00002-of-00002.bin, which is not in the folder"
    )


def test_a_pre_zip_pytorch_bin_the_config_does_not_fit_is_refused_in_one_line_at_load(
    model: Path, tmp_path: Path
) -> None:
    """A file of torch's format before 1.6 cannot be mapped without reading it: from_pretrained's refusal is the
    check, in one line."""
    from qa_train.config.settings import ModelArgs
    from qa_train.model.modeling import check_weights, load_model, load_model_config, load_tokenizer

    altered = copy(model, tmp_path, vocab_size=5000)
    as_pytorch_bin(altered, zip_format=False)
    args = ModelArgs(model_name_or_path=str(altered))
    check_weights(args, load_model_config(args))  # nothing it can read
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(altered))}: its weights do not fit the model's config"):
        load_model(args, load_tokenizer(args), load_model_config(args))


@pytest.mark.parametrize("labels", [{"num_labels": 3}, {"num_labels": 1}, {"id2label": {"0": "a", "1": "b", "2": "c"}}])
def test_a_config_with_a_classifiers_labels_is_refused(
    labels: dict[str, object],
    model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """num_labels other than 2 gave BERT's head that many outputs: from --config_name, `too many values to unpack`
    at the first step after the data was featurised; beside weights, a shape mismatch traceback."""
    altered = copy(model, tmp_path, **labels)
    n = 1 if labels.get("num_labels") == 1 else 3
    says = (
        f"config.json has num_labels {n} (its id2label), and a question-answering head needs 2 (start and end "
        "logits): set num_labels to 2, or remove id2label and label2id"
    )
    message = refused_by_training(tmp_path, monkeypatch, "--config_name", str(altered), "--tokenizer_name", str(model))
    assert message == f"--config_name {altered}: {says}"
    message = refused_by_training(tmp_path, monkeypatch, "--model_name_or_path", str(altered))
    assert message == f"--model_name_or_path {altered}: {says}"
    assert refused_by_predict(altered, capsys) == f"MODEL_DIR {altered}: {says}"


def test_a_config_that_sizes_an_embedding_at_zero_is_refused(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """type_vocab_size 0 built a token-type table of no rows: an IndexError traceback at the first step."""
    altered = copy(model, tmp_path, type_vocab_size=0)
    message = refused_by_training(tmp_path, monkeypatch, "--config_name", str(altered), "--tokenizer_name", str(model))
    assert message == (
        f"--config_name {altered}: config.json gives the embedding bert.embeddings.token_type_embeddings no rows "
        "(a size of 0): every id would index past it"
    )


def test_a_head_of_two_outputs_whatever_num_labels_says_is_not_refused(tmp_path: Path) -> None:
    """GPT-2's QA head has 2 outputs whatever its config's num_labels: the head built decides, not the number."""
    from transformers import GPT2Config

    from qa_train.config.settings import ModelArgs
    from qa_train.model.modeling import load_model_config

    GPT2Config(n_layer=1, n_embd=32, n_head=2, num_labels=3).save_pretrained(tmp_path / "gpt2")
    assert load_model_config(ModelArgs(config_name=str(tmp_path / "gpt2"))).num_labels == 3


def test_a_tokenizer_larger_than_the_models_vocabulary_is_refused_before_the_data_is_featurised(
    model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    own_logging: None,  # the run from scratch gets as far as setting up its logging
) -> None:
    """Another model's tokenizer, or tokens added to this one: its ids past vocab_size have no embedding. Refused
    only once the data was featurised and the weights loaded, in a line that named no flag."""
    from transformers import AutoTokenizer

    altered = copy(model, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(altered)
    tokenizer.add_tokens([f"added{i}" for i in range(50)])
    tokenizer.save_pretrained(altered)
    says = "the tokenizer has 3757 tokens, more than the model's vocab_size 3707"
    message = refused_by_training(
        tmp_path, monkeypatch, "--model_name_or_path", str(model), "--tokenizer_name", str(altered)
    )
    assert message == (
        f"--tokenizer_name {altered}: {says} (--model_name_or_path {model}): ids from 3707 on have no embedding; "
        "use the model's own tokenizer"
    )
    assert refused_by_predict(altered, capsys) == (
        f"MODEL_DIR {altered}: {says}: ids from 3707 on have no embedding; use the model's own tokenizer"
    )
    # From scratch the embeddings are sized to the tokenizer: nothing to refuse.
    flags = ["--config_name", str(model), "--tokenizer_name", str(altered), "--max_train_steps", "1"]
    assert preflight_says(tmp_path, monkeypatch, *flags) == PAST_PREFLIGHT


def test_weights_holding_nan_are_refused_not_blamed_on_the_learning_rate(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Training from them said it diverged at step 1 and advised a lower --learning_rate; predict ended in a
    ValueError traceback from the softmax of the answer's logits."""
    from safetensors.torch import load_file, save_file

    from qa_train.config.settings import ModelArgs
    from qa_train.model.modeling import load_model, load_model_config, load_tokenizer

    altered = copy(model, tmp_path)
    weights = load_file(altered / "model.safetensors")
    weights["bert.encoder.layer.0.attention.self.query.weight"][0, 0] = float("nan")
    save_file(weights, altered / "model.safetensors", metadata={"format": "pt"})
    says = (
        f"{altered}: its weights hold nan or inf (first in bert.encoder.layer.0.attention.self.query.weight): saved "
        "from a diverged run, or damaged; use an earlier checkpoint of it"
    )
    args = ModelArgs(model_name_or_path=str(altered))
    with pytest.raises(ConfigError) as refused:
        load_model(args, load_tokenizer(args), load_model_config(args))
    assert str(refused.value) == says
    assert refused_by_predict(altered, capsys) == says


def test_a_broken_tokenizer_is_refused_naming_the_flag_it_came_from(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty vocab.txt without tokenizer.json: the refusal said --tokenizer_name, also for a folder given as
    --model_name_or_path, and in predict, which has no such flag."""
    altered = copy(model, tmp_path)
    (altered / "tokenizer.json").unlink()
    (altered / "vocab.txt").write_text("")
    says = (
        "the tokenizer's vocabulary has only 5 tokens; check that the folder holds tokenizer.json or a valid vocab.txt"
    )
    message = refused_by_training(tmp_path, monkeypatch, "--model_name_or_path", str(altered))
    assert message == f"--model_name_or_path {altered}: {says}"
    message = refused_by_training(
        tmp_path, monkeypatch, "--model_name_or_path", str(model), "--tokenizer_name", str(altered)
    )
    assert message == f"--tokenizer_name {altered}: {says}"
    assert refused_by_predict(altered, capsys) == f"MODEL_DIR {altered}: {says}"


@pytest.mark.parametrize(
    ("flag", "file"), [("--model_name_or_path", "model.safetensors"), ("--tokenizer_name", "tokenizer.json")]
)
def test_a_file_where_a_model_or_tokenizer_folder_belongs_is_refused(flag: str, file: str, model: Path) -> None:
    """transformers read the file as a config or a hub id: `It looks like the config file at ... is not a valid JSON
    file`, or `Repo id must be in the form 'repo_name' or 'namespace/repo_name'`."""
    what = "the model" if flag == "--model_name_or_path" else "the tokenizer"
    with pytest.raises(ConfigError) as refused:
        parse_args([*tiny_flags(Path("out"), "--no_eval"), flag, str(model / file)])
    assert str(refused.value) == f"{flag}: {model / file} is a file; name the folder that holds {what} ({model})"


def test_a_model_folder_under_home_loads_through_a_tilde(
    model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    own_logging: None,  # the run gets as far as setting up its logging
) -> None:
    """`--model_name_or_path=~/m` (the shell expands no `~` after `=`, nor in quotes): qa_train's checks found the
    folder, but transformers took `~/m` for a hub id and refused it (`Repo id must use alphanumeric chars`)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copytree(model, tmp_path / "m")
    assert predict.main(["~/m", "-q", "Who?", "-c", "Somebody.", "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["answer"]
    for flags in (["--model_name_or_path", "~/m"], ["--config_name", "~/m", "--tokenizer_name", "~/m"]):
        assert preflight_says(tmp_path, monkeypatch, *flags) == PAST_PREFLIGHT  # its model loads


def test_a_config_value_of_the_wrong_type_is_refused(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """transformers 5 validates a config's fields as a strict dataclass, whose error is no ValueError: a traceback."""
    altered = copy(model, tmp_path, hidden_size="128")
    says = (
        "config.json does not validate (Validation error for field 'hidden_size': TypeError: Field 'hidden_size' "
        "expected int, got str (value: '128'))"
    )
    message = refused_by_training(tmp_path, monkeypatch, "--model_name_or_path", str(altered))
    assert message == f"--model_name_or_path {altered}: {says}"
    message = refused_by_training(tmp_path, monkeypatch, "--config_name", str(altered), "--tokenizer_name", str(model))
    assert message == f"--config_name {altered}: {says}"
    assert refused_by_predict(altered, capsys) == f"MODEL_DIR {altered}: {says}"


def test_a_config_that_builds_no_model_is_refused_before_the_data_is_featurised(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hidden_size that is no multiple of num_attention_heads failed in load_model, after the data was
    featurised, and from --config_name alone the line named `--model_name_or_path :`."""
    altered = copy(model, tmp_path, hidden_size=130, num_attention_heads=4)
    says = (
        "config.json does not build a model (ValueError: The hidden size (130) is not a multiple of the number of "
        "attention heads (4))"
    )
    message = refused_by_training(tmp_path, monkeypatch, "--config_name", str(altered), "--tokenizer_name", str(model))
    assert message == f"--config_name {altered}: {says}"
    assert refused_by_predict(altered, capsys) == f"MODEL_DIR {altered}: {says}"


def test_weights_of_another_family_than_the_config_are_refused(model: Path, tmp_path: Path) -> None:
    """BERT's weights under --config_name of a RoBERTa config of the same sizes: transformers printed its table of
    unexpected and missing weights, and the run fine-tuned a randomly initialised encoder to exit 0."""
    from qa_train.config.settings import ModelArgs
    from qa_train.model.modeling import load_model, load_model_config, load_tokenizer

    roberta = write_config(tmp_path / "roberta", model_type="roberta", max_position_embeddings=514, pad_token_id=1)
    args = ModelArgs(model_name_or_path=str(model), config_name=str(roberta), tokenizer_name=str(model))
    with pytest.raises(ConfigError) as refused:
        load_model(args, load_tokenizer(args), load_model_config(args))
    assert str(refused.value).startswith(
        f"{model}: none of its weights fit the RobertaForQuestionAnswering of --config_name {roberta} (it holds bert."
    )
    own = ModelArgs(model_name_or_path=str(model))
    load_model(own, load_tokenizer(own), load_model_config(own))  # under its own config they load


def test_an_encoder_decoder_config_without_a_decoder_start_token_is_refused(
    model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A T5Config saved by transformers 5 holds no decoder_start_token_id: from --config_name the run featurised its
    data and ended at the first step in an AttributeError traceback. With it (as hub T5 configs have it), it builds."""
    from transformers import T5Config

    from qa_train.config.settings import ModelArgs
    from qa_train.model.modeling import load_model_config

    t5 = tmp_path / "t5"
    T5Config(num_layers=1, d_model=32, num_heads=2, d_kv=16, d_ff=64, vocab_size=3707).save_pretrained(t5)
    message = refused_by_training(tmp_path, monkeypatch, "--config_name", str(t5), "--tokenizer_name", str(model))
    assert message == (
        f"--config_name {t5}: config.json has no decoder_start_token_id, which T5ForQuestionAnswering feeds its "
        "decoder first (T5's is its pad_token_id, 0); add it"
    )
    config = json.loads((t5 / "config.json").read_text())
    (t5 / "config.json").write_text(json.dumps({**config, "decoder_start_token_id": 0}))
    load_model_config(ModelArgs(config_name=str(t5)))
