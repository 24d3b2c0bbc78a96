"""Model and tokenizer construction for any transformers encoder with a QA head; FLOPs per token for MFU."""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from qa_train.config.settings import ConfigError, ModelArgs, SystemArgs
from qa_train.core.errors import one_line
from qa_train.data.features import PairTemplate, question_room

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger("qa_train")

# Families whose position ids start after the padding index (RoBERTa's create_position_ids_from_input_ids),
# so a window may hold max_position_embeddings - pad_token_id - 1 tokens, not max_position_embeddings.
OFFSET_POSITIONS = {
    "roberta",
    "xlm-roberta",
    "xlm-roberta-xl",
    "camembert",
    "roberta-prelayernorm",
    "data2vec-text",
    "xmod",
}


# What from_pretrained reads a PyTorch model's weights from (transformers' SAFE_WEIGHTS_NAME, WEIGHTS_NAME and their
# sharded indexes).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


# What the hub takes for a model id: "name" or "org/name".
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def local_path(name: str) -> bool:
    """Whether `name` means a folder on this machine rather than a hub id: one that exists, one the hub cannot
    take (absolute, ./, ~, more than one /), or org/name whose org is a folder here (a mistyped `runs/x/final`
    would otherwise be sent to the hub, and the error would be that the hub cannot be reached)."""
    path = Path(name).expanduser()
    return path.exists() or not HUB_ID.fullmatch(name) or (path.parent != Path(".") and path.parent.is_dir())


class SourceError(ConfigError):
    """What is wrong with a model, config or tokenizer folder, in words that do not name it: loading() prefixes the
    flag and the folder it was given as (a training flag, or predict's MODEL_DIR)."""


def home(name: str) -> str:
    """`name` with a leading `~` expanded: the shell leaves it in --flag=~/x and in quotes, and transformers, which
    does not expand it, took `~/x` for a malformed hub id. Messages keep the name as given."""
    return str(Path(name).expanduser()) if name.startswith("~") else name


@contextlib.contextmanager
def loading(flag: str, source: str, what: str = "it") -> Iterator[None]:
    """transformers' own failures (a missing folder or hub id, no tokenizer files or weights, a JSON that is not a
    config) as one ConfigError line naming the flag, instead of a traceback."""
    if local_path(source) and not Path(source).expanduser().exists():  # before transformers asks the hub for it
        raise ConfigError(f"{flag} {source}: no such directory")
    from huggingface_hub.errors import StrictDataclassError

    _check_config_object(flag, source)
    try:
        yield
    except SourceError as err:
        raise ConfigError(f"{flag} {source}: {err}") from None
    except ConfigError:
        raise
    except (OSError, ValueError) as err:
        raise ConfigError(f"{flag} {source}: cannot load {what} ({one_line(err)})") from None
    except StrictDataclassError as err:  # a config value of the wrong type ("hidden_size": "128"): no ValueError
        # Its first line names only the field; the next says what is wrong with it.
        said = " ".join(str(err).split())
        raise ConfigError(f"{flag} {source}: config.json does not validate ({said})") from None


# JSON's names for what json.loads returns, for a config.json that holds something other than an object.
JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}


def _check_config_object(flag: str, source: str) -> None:
    """A local config.json that parses but is not an object (a list, a string): transformers passes it on as keyword
    arguments and fails with a TypeError traceback, in the tokenizer's loading as well as the config's."""
    try:
        value = json.loads((Path(source).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no such file (a hub id, a tokenizer folder), or not JSON: transformers says so
        return
    if not isinstance(value, dict):
        kind = JSON_KINDS.get(type(value), "null")
        raise ConfigError(f"{flag} {source}: config.json holds {kind}, not a JSON object of config keys")


def check_weights(args: ModelArgs, config=None) -> None:
    """A local --model_name_or_path without weights, or (given the run's `config`) with weights of other shapes:
    from_pretrained would fail only once the model is built, after --overwrite_output_dir has removed the old run."""
    source = args.model_name_or_path
    if source is None:  # from scratch: nothing to load
        return
    path = Path(source).expanduser()
    if not path.is_dir():
        if local_path(source):  # with --config_name, nothing has tried to load it yet
            what = "is a file, not a model folder" if path.exists() else "no such directory"
            raise ConfigError(f"--model_name_or_path {source}: {what}")
        cached = _cached_snapshot(args, source)
        if cached is None:  # online: from_pretrained downloads the weights, and checks them then
            return
        path = cached
    elif not any((path / name).is_file() for name in WEIGHT_FILES):
        raise ConfigError(
            f"--model_name_or_path {source}: no weights ({', '.join(WEIGHT_FILES[::2])}"
            "); to train from random initialisation, pass the folder as --config_name instead"
        )
    shapes = weight_shapes("--model_name_or_path", source, path)
    if config is not None:
        check_weight_shapes(shapes, config, f"--model_name_or_path {source}", _config_named(args))


def _config_named(args: ModelArgs) -> str:
    """The config the weights are held against, as the refusals name it."""
    return f"--config_name {args.config_name}" if args.config_name else "its config.json"


def weight_shapes(flag: str, source: str, folder: Path | None = None) -> dict[str, tuple[int, ...]]:
    """Each weight's shape by its name in a local folder's weights files (the one from_pretrained reads, or the
    shards its index names), read without their data: safetensors headers, or a PyTorch zip file's records mapped
    to the meta device; {} for a hub id or a file of the pre-zip format. A file that cannot be read (a truncated
    download or copy) or a shard the index names but the folder lacks is refused here: from_pretrained met them only
    once the data was featurised, as a traceback. `folder`: where `source` is (a hub id's cached snapshot)."""
    folder = folder or Path(source).expanduser()
    found = next((name for name in WEIGHT_FILES if (folder / name).is_file()), None)  # from_pretrained's order
    if found is None:
        return {}
    safetensors = found.startswith("model.safetensors")
    files = [folder / found]
    if found.endswith(".index.json"):
        try:
            files = [folder / name for name in sorted(set(json.loads(files[0].read_text())["weight_map"].values()))]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            kind = "safetensors" if safetensors else "PyTorch weights"
            raise ConfigError(f"{flag} {source}: {found} is not a {kind} index ({one_line(err)})") from None
    read = _safetensors_shapes if safetensors else _torch_shapes
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        if not path.is_file():
            raise ConfigError(f"{flag} {source}: {found} names the shard {path.name}, which is not in the folder")
        try:
            shapes.update(read(path))
        except _Unreadable as err:
            raise ConfigError(
                f"{flag} {source}: {path.name} is not a readable {err.kind} file ({err.why}): truncated or damaged; "
                "copy or download it again"
            ) from None
    return shapes


class _Unreadable(Exception):
    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind, self.why = kind, why


def _safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt") as weights:
            return {key: tuple(weights.get_slice(key).get_shape()) for key in weights.keys()}
    except (SafetensorError, OSError) as err:
        raise _Unreadable("safetensors", one_line(err)) from None


def _torch_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """A pytorch_model.bin's shapes: its records mapped, not read, onto the meta device (milliseconds for any size),
    under weights_only, as transformers loads it."""
    import pickle

    import torch

    try:
        state = torch.load(path, map_location="meta", weights_only=True, mmap=True)
    except RuntimeError as err:
        if "_use_new_zipfile_serialization" in str(err):  # the pre-zip format cannot be mapped: from_pretrained checks
            return {}
        raise _Unreadable("PyTorch weights", one_line(err)) from None
    except (pickle.UnpicklingError, OSError, EOFError, ValueError) as err:
        raise _Unreadable("PyTorch weights", one_line(err)) from None
    if not isinstance(state, dict):
        raise _Unreadable("PyTorch weights", f"it holds a {type(state).__name__}, not a dict of tensors")
    return {key: tuple(t.shape) for key, t in state.items() if isinstance(t, torch.Tensor)}


def check_weight_shapes(shapes: dict[str, tuple[int, ...]], config, weights: str, fits: str) -> None:
    """Weights (`shapes`, by name) that the config would build in other shapes: a vocab_size or hidden_size edited in
    config.json, a --config_name of another model size. from_pretrained refused them only once the data was
    featurised, in a RuntimeError traceback pointing at a report above it. Names transformers would rename are
    not compared: from_pretrained still checks those."""
    if not shapes:
        return
    model = meta_model(config)
    built = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    base = f"{model.base_model_prefix}."  # a base model's checkpoint (BertModel) names its weights without it
    wrong = [
        f"{name} is {list(shape)} in the weights, {list(want)} by the config"
        for name, shape in sorted(shapes.items())
        if (want := built.get(name, built.get(base + name))) is not None and want != shape
    ]
    if wrong:
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise ConfigError(
            f"{weights}: its weights do not fit {fits}: {wrong[0]}{more}; a config edited after the weights were "
            "saved, or the config of another model size"
        )


def _cached_snapshot(args: ModelArgs, hub_id: str) -> Path | None:
    """Offline (HF_HUB_OFFLINE, as on compute nodes without a network), the hub cache's snapshot holding the weights
    from_pretrained will read, checked as a local folder is. A hub id whose config and tokenizer are cached but whose
    weights are not would fail in from_pretrained only after the data was read and windowed. None online, where
    from_pretrained may download newer files than the cache holds."""
    from huggingface_hub import constants, try_to_load_from_cache

    if not constants.is_offline_mode():
        return None
    where = {"cache_dir": args.cache_dir, "revision": args.model_revision}
    for name in WEIGHT_FILES:  # from_pretrained's order
        cached = try_to_load_from_cache(hub_id, name, **where)
        if isinstance(cached, str):
            return Path(cached).parent
    raise ConfigError(
        f"--model_name_or_path {hub_id}: HF_HUB_OFFLINE is set and its weights are not in the hub "
        f"cache ({args.cache_dir or constants.HF_HUB_CACHE}); download them where there is a network (hf download "
        f"{hub_id}) or pass a local folder"
    )


def hub_options(args: ModelArgs) -> dict[str, object]:
    """What from_pretrained takes from the hub flags, as transformers' examples pass them (token None: HF_TOKEN or
    the saved login, as huggingface_hub resolves it)."""
    return {
        "revision": args.model_revision,
        "cache_dir": args.cache_dir,
        "token": args.token,
        "trust_remote_code": args.trust_remote_code,
    }


def load_tokenizer(args: ModelArgs):
    from transformers import AutoTokenizer

    name = args.tokenizer_source
    tokenizer = AutoTokenizer.from_pretrained(home(name), use_fast=True, **hub_options(args))
    # SourceError: the folder may have been given as --model_name_or_path or predict's MODEL_DIR.
    if not tokenizer.is_fast:
        raise SourceError("a fast tokenizer is needed for offset mappings")
    # transformers 5 can silently build a near-empty vocab from a bad vocab file: every word -> [UNK].
    if len(tokenizer) < 100:
        raise SourceError(
            f"the tokenizer's vocabulary has only {len(tokenizer)} tokens; "
            "check that the folder holds tokenizer.json or a valid vocab.txt"
        )
    try:  # refuses a layout the windows cannot hold, before any data is read
        PairTemplate.from_tokenizer(tokenizer)
    except ConfigError as err:
        raise SourceError(str(err)) from None
    return tokenizer


def load_model_config(args: ModelArgs):
    """The config of the model a run trains or answers with (--config_name, else --model_name_or_path); a family
    without a QA head or an attention kernel it lacks is refused here, before any data is read."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(home(args.config_source), **hub_options(args))
    resolve_attention(args, config)
    _check_builds(config)
    return config


def _check_builds(config) -> None:
    """The config's QA model, built on the meta device (shapes, no memory; milliseconds for BERT-large). A config
    that builds none (a hidden_size no multiple of num_attention_heads) failed only in load_model, after the data
    was featurised, and named --model_name_or_path even from scratch. A config with a classifier's labels
    (num_labels 3, an id2label of 3) gives most QA heads that many outputs: the forward's unpacking of start and end
    logits failed at the first step. Decoder families' heads have 2 outputs whatever num_labels says: the head
    built decides."""
    import torch

    try:
        model = meta_model(config)
    except (ValueError, TypeError, ZeroDivisionError, RuntimeError) as err:
        raise SourceError(f"config.json does not build a model ({one_line(err)})") from None
    # An encoder-decoder's QA head (T5's, BART's) reads a decoder fed the input shifted right after this token:
    # T5Config no longer defaults it (hub T5 configs still hold it), and the first step ended in an AttributeError.
    # Absent, not None: MBart's is None and unused (it starts from the language code).
    if config.is_encoder_decoder and not hasattr(config, "decoder_start_token_id"):
        raise SourceError(
            f"config.json has no decoder_start_token_id, which {type(model).__name__} feeds its decoder first "
            f"(T5's is its pad_token_id, {getattr(config, 'pad_token_id', None)}); add it"
        )
    # A size of 0 in config.json (type_vocab_size 0): every id indexes past the table, an IndexError at step 1.
    empty = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Embedding) and m.num_embeddings == 0]
    if empty:
        raise SourceError(
            f"config.json gives the embedding {empty[0]} no rows (a size of 0): every id would index past it"
        )
    head = getattr(model, "qa_outputs", None)
    if isinstance(head, torch.nn.Linear) and head.out_features != 2:
        raise SourceError(
            f"config.json has num_labels {config.num_labels} (its id2label), and a question-answering head needs 2 "
            "(start and end logits): set num_labels to 2, or remove id2label and label2id"
        )


def meta_model(config) -> PreTrainedModel:
    """The config's QA model on the meta device: its modules and shapes without the memory (milliseconds)."""
    import copy

    import torch

    with torch.device("meta"):
        return qa_model_class(config)(copy.deepcopy(config))


def qa_model_class(config) -> type[PreTrainedModel]:
    """transformers' XxxForQuestionAnswering class for this config."""
    from transformers import AutoModelForQuestionAnswering

    remote = (getattr(config, "auto_map", None) or {}).get("AutoModelForQuestionAnswering")
    if remote and type(config) not in AutoModelForQuestionAnswering._model_mapping:
        # The model's own code (--trust_remote_code): its config class, loaded from that code, is in no mapping.
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        return get_class_from_dynamic_module(remote, config._name_or_path)
    try:
        return AutoModelForQuestionAnswering._model_mapping[type(config)]
    except KeyError:
        raise ConfigError(
            f"model type {config.model_type!r} has no question-answering head in transformers "
            "(AutoModelForQuestionAnswering does not know it)"
        ) from None


def resolve_attention(args: ModelArgs, config) -> str:
    """auto: PyTorch SDPA where the model class supports it (DeBERTa-v2/v3 does not), else eager."""
    cls = qa_model_class(config)
    sdpa = bool(getattr(cls, "_supports_sdpa", False))
    if args.attn_implementation == "auto":
        return "sdpa" if sdpa else "eager"
    if args.attn_implementation == "sdpa" and not sdpa:
        raise ConfigError(
            f"--attn_implementation sdpa: {cls.__name__} does not support "
            "scaled_dot_product_attention; use auto (the default) or eager"
        )
    return args.attn_implementation


def check_checkpointing(config, enabled: bool) -> None:
    """--gradient_checkpointing for a family whose QA class cannot recompute its layers (ALBERT, MPNet, ...) is refused
    from the config alone: transformers would refuse it only once the weights are loaded, after the data."""
    why = checkpointing_unsupported(config)
    if enabled and why:
        raise ConfigError(f"--gradient_checkpointing: {why}; drop the flag")


def checkpointing_unsupported(config) -> str | None:
    """Why this config's QA class cannot recompute its layers, or None (ConfigError: no QA class at all)."""
    cls = qa_model_class(config)
    if getattr(cls, "supports_gradient_checkpointing", False):
        return None
    return (
        f"{cls.__name__} (model type {config.model_type!r}) does not support activation checkpointing in transformers"
    )


def enable_checkpointing(model) -> None:
    """Recompute each encoder layer in the backward pass. Non-reentrant, as PyTorch recommends (named here though it
    is transformers' default too): it composes with ZeRO-3's and FSDP's parameter hooks and with torch.compile."""
    kwargs = {"use_reentrant": False}
    try:
        if hasattr(model, "activation_checkpointing_enable"):  # the new name: 5.23 deprecates the old one, warning
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    except ValueError as err:  # a class that claims support but has no layer to checkpoint
        raise ConfigError(f"--gradient_checkpointing: {err}") from None


GRAPH_MODES = ("reduce-overhead", "max-autotune")  # the --torch_compile_mode values that record CUDA graphs


def compile_model(model, system: SystemArgs, dynamic: bool, on_cuda: bool = True) -> None:
    """torch.compile in place: torch.compile(model)'s wrapper prefixes every weight name with `_orig_mod.`, so the
    export would load as a fresh model and checkpoints would not resume without compiling."""
    kwargs = {"backend": system.torch_compile_backend or "inductor", "dynamic": dynamic, "mode": system.compile_mode}
    if system.compile_mode in GRAPH_MODES and not on_cuda:
        # Inductor skips CUDA graphs off CUDA and says so only in its debug log.
        log.warning(
            "--torch_compile_mode %s: no CUDA device, so no CUDA graphs (compiled without them)", system.compile_mode
        )
    if dynamic and kwargs["backend"] == "inductor":
        _no_size_guards()
    _constant_floats()
    if not system.torch_compile_regional:
        model.compile(**kwargs)
        return
    from accelerate.utils.other import compile_regions_deepspeed, has_repeated_blocks

    if not has_repeated_blocks(model):  # accelerate would compile nothing, and the run would train eagerly unsaid
        raise ConfigError(
            f"--torch_compile_regional: {type(model).__name__} has no repeated layers to compile (use --torch_compile)"
        )
    # accelerate's in-place variant (written for DeepSpeed's engine): its other one wraps the layers and renames them.
    compile_regions_deepspeed(model, **kwargs)


def _no_size_guards() -> None:
    """Inductor's mix-order reduction (LayerNorm's backward, GPU only) fuses only above a size, and guards on it: over
    dynamic padding the first batch on the other side of batch x width x hidden = 5 Mi recompiles every graph,
    which doubled the two-epoch compile (docs/benchmarks/2026-11-26-gpu-h100.md). Non-strict mode skips that
    size test, so one graph serves every batch shape."""
    from torch._inductor import config

    if hasattr(config.triton, "mix_order_reduction_non_strict_mode"):  # torch 2.10 and later
        config.triton.mix_order_reduction_non_strict_mode = True


def uses_graphs_per_width(system: SystemArgs, dynamic: bool) -> bool:
    """Whether the compiled step records a CUDA graph per padded width (reduce-overhead or max-autotune, inductor)."""
    inductor = (system.torch_compile_backend or "inductor") == "inductor"
    return system.torch_compile and dynamic and inductor and system.compile_mode in GRAPH_MODES


def allow_graphs_per_width(widths: int) -> None:
    """Under CUDA graphs inductor records one graph per input size and, past 8 sizes, warns that too many are
    recorded and advises padding to a few shapes. Padded widths are already a few shapes (a multiple of
    --pad_to_multiple_of, up to --max_seq_length), each with full batches and an epoch's last, smaller one: the
    warning is kept for more sizes than those. Call it after the first step, once the step is compiled: the limit is
    part of inductor's cache key, and set before the compile it made a warm cache miss whenever the widths changed
    (another --pad_to_multiple_of rebuilt every kernel)."""
    from torch._inductor import config

    limit = getattr(config.triton, "cudagraph_dynamic_shape_warn_limit", None)
    if limit:  # None: the user silenced it
        config.triton.cudagraph_dynamic_shape_warn_limit = max(limit, 2 * widths)


def _constant_floats() -> None:
    """The model's Python floats (dropout p, LayerNorm eps, the attention scale) are constants from the first trace.
    Traced as symbols (torch's default), they are specialised later by inductor's scalar pass, which restarts the
    frame: every compile, warm cache or not, traced the model and built its joint graph twice
    (docs/benchmarks/2026-11-27-cpu-compile-restart.md)."""
    import torch._dynamo.config

    torch._dynamo.config.specialize_float = True


class CompileFigures(NamedTuple):
    """What torch.compile did in this process (counts as floats: NaN where nothing was compiled)."""

    seconds: float
    """Seconds spent compiling (tracing, the forward's and backward's inductor builds)."""
    graphs: float
    """Distinct graphs dynamo compiled."""
    cache_hits: float
    """Inductor graphs (a forward and a backward each) loaded from its on-disk cache..."""
    cache_misses: float
    """...and built anew: a warm compile has no misses, so a slow one is not the cache's doing."""

    @classmethod
    def nothing(cls) -> CompileFigures:
        """A run that compiled nothing: not zero seconds, no figure."""
        return cls(math.nan, math.nan, math.nan, math.nan)

    def since(self, earlier: CompileFigures) -> CompileFigures:
        """What was compiled after `earlier`, an earlier reading of compile_figures()."""
        return CompileFigures(*(now - then for now, then in zip(self, earlier, strict=True)))


def compile_figures() -> CompileFigures:
    """What --torch_compile cost a run so far, which its throughput leaves out with the warm-up steps but its
    training time holds (a recompile for a new batch shape lands mid-run). torch has no public record of these:
    they are dynamo's and inductor's own counters."""
    from torch._dynamo.utils import compilation_time_metrics, counters

    seconds = sum(compilation_time_metrics.get("_compile.compile_inner", ()))
    inductor = counters["inductor"]
    return CompileFigures(
        seconds,
        int(counters["stats"]["unique_graphs"]),
        int(inductor["fxgraph_cache_hit"]),
        int(inductor["fxgraph_cache_miss"]),
    )


def uses_token_types(config, tokenizer) -> bool:
    """token_type_ids go to the model only when its tokenizer makes them and its forward takes them:
    RoBERTa's and XLM-R's tokenizers make none, DistilBERT and ModernBERT take none."""
    takes = "token_type_ids" in inspect.signature(qa_model_class(config).forward).parameters
    return takes and "token_type_ids" in tokenizer.model_input_names


def position_limit(config) -> int | None:
    """The longest window the model embeds: RoBERTa-style models start their positions after the padding index,
    so max_position_embeddings 514 holds 512 tokens."""
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and config.model_type in OFFSET_POSITIONS:
        limit -= (config.pad_token_id or 0) + 1
    return limit


def check_positions(config, tokenizer, max_seq_length: int, doc_stride: int | None = None) -> None:
    """Refuse windows longer than the model can embed, before featurisation rather than at the first long batch;
    with `doc_stride`, also windows whose stride leaves no room for the question (featurize would refuse them
    too, but only after the run has started: with --overwrite_output_dir, after the old run is gone)."""
    limits = {"position embeddings": position_limit(config)}
    if 0 < tokenizer.model_max_length < 1_000_000:  # unset lengths are stored as a huge sentinel
        limits["tokenizer model_max_length"] = tokenizer.model_max_length
    for what, limit in limits.items():
        if limit is not None and max_seq_length > limit:
            raise ConfigError(
                f"--max_seq_length {max_seq_length}: the model has {limit} {what} "
                f"({getattr(config, '_name_or_path', '') or config.model_type}); use at most {limit}"
            )
    if doc_stride is not None:
        question_room(PairTemplate.from_tokenizer(tokenizer), max_seq_length, doc_stride)


def check_vocab(config, tokenizer, tokenizer_from: str, model_from: str) -> None:
    """A tokenizer with more tokens than the pretrained model has embeddings (another model's, or tokens added to
    it): its ids past vocab_size would index past the embedding table. Refused before the data is featurised; it
    was refused only once the weights were loaded. From scratch the vocabulary is sized to the tokenizer instead."""
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int) and len(tokenizer) > vocab:
        model = "" if model_from == tokenizer_from else f" ({model_from})"
        raise ConfigError(
            f"{tokenizer_from}: the tokenizer has {len(tokenizer)} tokens, more than the model's vocab_size {vocab}"
            f"{model}: ids from {vocab} on have no embedding; use the model's own tokenizer"
        )


def window_losses(outputs, starts, ends, attention_mask):
    """Each window's span loss, as transformers' question-answering heads average it over a batch: the cross-entropy
    of the start and of the end position, halved; a position outside the window (qa_train's windows have none: an
    answer outside is labelled at CLS) counts 0.

    Unlike those heads, padding is no candidate position: with rows padded to the longest window of a micro-batch,
    the softmax over pad columns made a window's loss, and its gradient, depend on which windows shared its
    micro-batch, so on the world size and accumulation a global batch was split into."""
    import torch.nn.functional as F

    outside = outputs.start_logits.size(1)
    padding = attention_mask == 0

    def entropy(logits, positions):
        logits = logits.masked_fill(padding, float("-inf"))
        return F.cross_entropy(logits, positions.clamp(0, outside), ignore_index=outside, reduction="none")

    return (entropy(outputs.start_logits, starts) + entropy(outputs.end_logits, ends)) / 2


@contextlib.contextmanager
def _quiet_load_report(quiet: bool) -> Iterator[None]:
    """transformers' table of missing and unexpected weights, silenced where the refusal names them in one line."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    if quiet:
        hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def load_model(args: ModelArgs, tokenizer, config, *, trained: bool = False):
    """Pretrained weights (with --config_name's config if given); random init from --config_name alone.
    `trained`: every weight must come from the checkpoint (answering, not fine-tuning): a model without a QA head
    (a masked-LM checkpoint) is refused, naming the weights it lacks, instead of answering from a random head.

    Master weights are fp32 whatever the checkpoint stores: transformers 5 loads a checkpoint in its
    stored dtype, so an fp16/bf16 upload would otherwise train in half precision (autocast is how
    mixed precision is done here).
    """
    import torch
    from transformers import AutoModelForQuestionAnswering

    attention = resolve_attention(args, config)
    if args.attn_implementation == "auto":
        why = "" if attention == "sdpa" else f": {qa_model_class(config).__name__} does not support SDPA"
        log.info("attention: %s (auto%s)", attention, why)
    if args.from_scratch:
        config.vocab_size = max(config.vocab_size, len(tokenizer))
        model = AutoModelForQuestionAnswering.from_config(
            config, attn_implementation=attention, dtype=torch.float32, trust_remote_code=args.trust_remote_code
        )
    else:
        with _quiet_load_report(trained):
            try:
                model, info = AutoModelForQuestionAnswering.from_pretrained(
                    home(str(args.model_name_or_path)),
                    config=config,
                    attn_implementation=attention,
                    dtype=torch.float32,
                    output_loading_info=True,
                    **hub_options(args),
                )
            except RuntimeError as err:  # shapes check_weights could not read (a hub id's files, a pre-zip .bin)
                if "ignore_mismatched_sizes" not in str(err):
                    raise
                raise ConfigError(
                    f"{args.model_name_or_path}: its weights do not fit the model's config (a tensor of another "
                    "shape): a config edited after the weights were saved, or the config of another model size"
                ) from None
        missing = sorted(info["missing_keys"])
        if trained and missing:
            shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
            raise ConfigError(
                f"{args.model_name_or_path}: not a trained question-answering model: its weights lack {shown} "
                "(randomly initialised, they would answer at random); fine-tune it with qa-train first"
            )
        _check_some_loaded(model, info, args)
        _check_finite(model, str(args.model_name_or_path))
    return model


def _check_some_loaded(model, info: dict, args: ModelArgs) -> None:
    """Weights of which not one fits the model's encoder (a --config_name of another family beside
    --model_name_or_path: RobertaForQuestionAnswering finds bert.* weights): transformers printed its table of
    missing and unexpected weights and the run fine-tuned a randomly initialised model to the end, exit 0."""
    base = f"{model.base_model_prefix}."
    encoder = [name for name in model.state_dict() if name.startswith(base)]
    missing = set(info["missing_keys"])
    if encoder and all(name in missing for name in encoder):
        unexpected = sorted(info["unexpected_keys"])
        held = f" (it holds {unexpected[0]} and {len(unexpected) - 1} more unused)" if unexpected else ""
        raise ConfigError(
            f"{args.model_name_or_path}: none of its weights fit the {type(model).__name__} of {_config_named(args)}"
            f"{held}: the config of another model family; without one of its own, the encoder would train from "
            "random weights"
        )


def _check_finite(model, source: str) -> None:
    """Weights holding nan or inf (a checkpoint saved after its training diverged, bytes damaged in place): training
    stopped at its first step as "diverged, lower the learning rate", and predict ended in a traceback from the
    answer's softmax. One pass over the weights, already in memory; under ZeRO-3 each rank reads its partition."""
    from qa_train.strategy.sharded import first_nonfinite

    name = first_nonfinite(model)
    if name is not None:
        raise ConfigError(
            f"{source}: its weights hold nan or inf (first in {name}): saved from a diverged run, or damaged; "
            "use an earlier checkpoint of it"
        )


def flop_coefficients(config) -> tuple[float, float]:
    """Training FLOPs per token, in two parts: 6 x matmul weights (forward + backward), and attention's per
    position of the padded width (12 * layers * hidden: QK^T and AV, forward 2 x 2, backward twice that).

    Embedding lookups do no matmul work and are left out; the QA head is counted.
    """
    h, layers = config.hidden_size, config.num_hidden_layers
    inter = getattr(config, "intermediate_size", 4 * h)
    per_layer = 4 * h * h + 2 * h * inter  # Q, K, V, output projections + the two MLP matrices
    matmul_params = layers * per_layer + 2 * h  # + QA head
    return 6.0 * matmul_params, 12.0 * layers * h


# The config values that size the weights: a checkpoint saved under other values cannot be loaded into this model.
SHAPE_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "type_vocab_size",
)


def model_shape(config) -> str:
    """The architecture and the sizes of its weights in one line (`bert, hidden_size 128, ...`)."""
    sizes = [f"{key} {value}" for key in SHAPE_KEYS if type(value := getattr(config, key, None)) is int]
    return ", ".join([str(config.model_type), *sizes])


def import_model_code(config) -> None:
    """Import the QA model class's module now. It is ~110 MB of Python for BERT, which would otherwise land
    in host memory measured as the model's own (HostMemory.mark_baseline comes right after this)."""
    qa_model_class(config)
