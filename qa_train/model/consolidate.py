"""`qa-train consolidate CHECKPOINT --output_dir DIR`: a checkpoint of any strategy as the folder
`from_pretrained` reads (and `qa-train predict` answers with), as the training export `final/` holds it.

    qa-train consolidate runs/bert-base/checkpoints/step_00000800 --output_dir runs/bert-base/step_800

One CPU process, nothing launched: the weights come whole from the checkpoint's own files through the readers the
resume conversion uses (qa_train.strategy.portable: accelerate's, FSDP's and DeepSpeed's files, all read without
unpickling code, so another user's checkpoint is safe to read), in fp32. A checkpoint holds no config.json: it comes from
--config_name, else from the run's own export (final/ or best/ in its output dir) or the --config_name or
--model_name_or_path the run recorded in metrics.json, and must build the checkpoint's model shape. The tokenizer
comes from --tokenizer_name, else from the run's export; without one the folder holds the model alone. Its
config.json records the windows and span rules the run answered with, from the checkpoint's trainer_state.json, as
the export's does, so that `qa-train predict` answers as the run's evaluation did; a checkpoint of an older qa_train
records none, and predict then answers with its defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from qa_train.config.outputdir import check_output_folder
from qa_train.config.parser import OneLineParser
from qa_train.config.settings import ConfigError
from qa_train.core.errors import one_line, refusal_text
from qa_train.model.modeling import model_shape
from qa_train.model.optimization import optimizer_order
from qa_train.strategy import checkpoint, describe, portable, saving
from qa_train.strategy.train_state import TrainerState

EXPORTS = ("final", "best")  # the run's own exports, which hold its config and tokenizer


def run_dir(path: Path) -> Path | None:
    """The output dir of the run that wrote step folder `path` (OUTPUT_DIR/checkpoints/step_N)."""
    return path.parent.parent if path.parent.name == "checkpoints" else None


def config_sources(path: Path, flag: str | None) -> list[str]:
    """Where the model's config may be, in order: --config_name alone when given, else the run's exports and what
    it recorded."""
    if flag:
        return [flag]
    out = run_dir(path)
    if out is None:
        return []
    found = [str(out / name) for name in EXPORTS if (out / name / "config.json").is_file()]
    with contextlib.suppress(OSError, ValueError, AttributeError):
        args = json.loads((out / "metrics.json").read_text())["args"]
        recorded = [args.get("config_name"), args.get("model_name_or_path")]
        found += [s for s in recorded if s and (Path(s) / "config.json").is_file()]
    return found


def model_config(path: Path, saved: TrainerState, flag: str | None):
    """The first config that builds the checkpoint's model shape; ConfigError naming what was tried."""
    from transformers import AutoConfig

    sources = config_sources(path, flag)
    tried = []
    for source in sources:
        try:
            config = AutoConfig.from_pretrained(source)
        except (OSError, ValueError) as err:
            tried.append(f"{source}: {one_line(err)}")
            continue
        if saved.model_shape is None or model_shape(config) == saved.model_shape:
            return config
        tried.append(f"{source} builds {model_shape(config)}")
    if not sources:
        raise ConfigError(
            f"{path}: a checkpoint holds no config.json and its run has no export to take it from: pass --config_name "
            "(the run's --config_name or --model_name_or_path)"
        )
    raise ConfigError(f"{path}: no config builds its model shape ({saved.model_shape}): {'; '.join(tried)}")


def load_tokenizer(path: Path, flag: str | None):
    """--tokenizer_name's, else the run's export's tokenizer, loaded before any weight is read; None without one."""
    from transformers import AutoTokenizer

    out = run_dir(path)
    exports = [out / name for name in EXPORTS] if out is not None else []
    source = flag or next((str(e) for e in exports if (e / "tokenizer_config.json").is_file()), None)
    if source is None:
        return None
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        said = "--tokenizer_name" if flag else "the run's export"
        raise ConfigError(f"{said} {source}: cannot load the tokenizer ({one_line(err)})") from None


def fp32_weights(path: Path, config) -> tuple[dict, Any]:
    """The checkpoint's full weights in fp32, checked against the model `config` builds (built on the meta device:
    names and shapes only), and that model (its save_pretrained writes them as the export does)."""
    import torch
    from transformers import AutoModelForQuestionAnswering

    with torch.device("meta"):
        model = AutoModelForQuestionAnswering.from_config(config)
    shapes = optimizer_order(model)
    try:
        weights = portable.read_weights(path, shapes)
    except portable.PortableError as err:
        raise ConfigError(str(err)) from None
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    missing = sorted(set(expected) - set(weights))
    wrong = sorted(n for n, t in weights.items() if n in expected and tuple(t.shape) != expected[n])
    extra = sorted(set(weights) - set(expected))
    if missing or wrong or extra:
        what = (
            f"lacks {missing[0]}"
            if missing
            else f"{wrong[0]} is {tuple(weights[wrong[0]].shape)}, the model's {expected[wrong[0]]}"
            if wrong
            else f"has {extra[0]}, which the model has not"
        )
        raise ConfigError(f"{path}: its weights do not fit the config's model: {what}")
    return {n: (t.float() if t.is_floating_point() else t).contiguous() for n, t in weights.items()}, model


def write_folder(path: Path, out: Path, config, tokenizer, answering: dict[str, Any] | None) -> None:
    """The from_pretrained folder, written under a temporary name beside `out` and renamed into place; its
    config.json as the export's, recording `answering` (the checkpoint's)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one small file's "Writing model shards" bar says nothing here
    tmp = out.with_name(f".tmp-{out.name}-{os.getpid()}")
    tmp.mkdir(parents=True)
    try:
        weights, model = fp32_weights(path, config)
        model.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
        saving.write_config(config, tmp, "float32", answering)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if out.exists():
            out.rmdir()  # empty, checked before: the rename needs the name free
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # only ever this command's own folder


def check_output(out: Path) -> None:
    if out.is_file() or (out.is_dir() and any(out.iterdir())):
        raise ConfigError(f"--output_dir {out}: exists and is not empty; name a new or empty folder")
    check_output_folder(out)


def consolidate(arg: Path, out: Path, config_name: str | None, tokenizer_name: str | None) -> Path:
    check_output(out)
    path, _ = describe.locate(arg)
    saved = checkpoint.read_state(path)
    config = model_config(path, saved, config_name)
    tokenizer = load_tokenizer(path, tokenizer_name)
    if tokenizer is None:
        print(
            f"{path}: no tokenizer in its run's export: the folder holds the model alone (--tokenizer_name adds one)",
            file=sys.stderr,
        )
    if saved.answering is None:
        print(
            f"{path}: written by a qa-train that did not record the run's windows and span rules: qa-train predict "
            "will answer with its defaults unless given --max_seq_length, --doc_stride, --n_best_size, "
            "--max_answer_length (and --version_2_with_negative)",
            file=sys.stderr,
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    write_folder(path, out, config, tokenizer, saved.answering)
    return path


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(
        prog="qa-train consolidate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("checkpoint", type=Path, help="a checkpoint (OUTPUT_DIR/checkpoints/step_N) or an output dir")
    p.add_argument("--output_dir", type=Path, required=True, help="the folder to write: new or empty")
    p.add_argument("--config_name", help="the model's config (default: the run's export, or what the run recorded)")
    p.add_argument("--tokenizer_name", help="the tokenizer to add (default: the run's export's, if any)")
    args = p.parse_args(argv)
    describe.quiet_libraries()
    try:
        path = consolidate(args.checkpoint, args.output_dir, args.config_name, args.tokenizer_name)
    except (ConfigError, checkpoint.CheckpointError, describe.DescribeError, OSError) as err:
        print(f"qa-train consolidate: error: {refusal_text(err)}", file=sys.stderr)
        return 2
    print(f"consolidated {path} -> {args.output_dir}")
    return 0
