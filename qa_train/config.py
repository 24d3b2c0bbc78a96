"""Typed command-line arguments, validated before anything heavy is imported or loaded.

Flag names follow transformers' question-answering examples (run_qa_no_trainer.py) where they
overlap, so users coming from there feel at home.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

ASSETS = Path(__file__).resolve().parent / "assets"
DEMO_MODEL_DIR = ASSETS / "tiny-bert"
DEMO_TRAIN_FILE = ASSETS / "demo" / "train.json"
DEMO_VALIDATION_FILE = ASSETS / "demo" / "dev.json"

# `--offline_demo`: the bundled tiny BERT and demo data, sized for about a minute on two CPU cores.
# Explicit flags still override these.
DEMO_DEFAULTS: dict[str, Any] = {
    "config_name": str(DEMO_MODEL_DIR), "tokenizer_name": str(DEMO_MODEL_DIR),
    "train_file": str(DEMO_TRAIN_FILE), "validation_file": str(DEMO_VALIDATION_FILE),
    "max_seq_length": 256, "doc_stride": 64, "per_device_train_batch_size": 16, "learning_rate": 1e-3,
    "weight_decay": 0.01, "warmup_ratio": 0.1, "num_train_epochs": 6.0, "logging_steps": 20,
    "eval_before_training": True,
}

SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup")
OPTIMIZERS = ("adamw_torch_fused", "adamw_torch")


class ConfigError(ValueError):
    """A flag value that can never work; raised before any model or data is loaded."""


@dataclass
class TrainArgs:
    """Everything one qa_train run needs. Each field is one command-line flag."""

    # --- model -------------------------------------------------------------------------------
    model_name_or_path: str = field(
        default="bert-base-uncased",
        metadata={"help": "Pretrained model name on the hub or local directory."},
    )
    config_name: str | None = field(
        default=None,
        metadata={"help": "Model config (name or dir). With it, the model is randomly initialised "
                  "from this config instead of loading pretrained weights (offline use, tests)."},
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer name or dir, if not the same as the model's."}
    )
    attn_implementation: str = field(
        default="sdpa", metadata={"help": "Attention kernel: sdpa (PyTorch fused) or eager."}
    )
    # --- data --------------------------------------------------------------------------------
    dataset_name: str | None = field(
        default="squad", metadata={"help": "Dataset on the hub; ignored when --train_file/--validation_file are given."}
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Hub dataset config name."})
    train_file: str | None = field(
        default=None, metadata={"help": "Local training data: nested SQuAD JSON or flat JSON lines."}
    )
    validation_file: str | None = field(
        default=None, metadata={"help": "Local evaluation data: nested SQuAD JSON or flat JSON lines."}
    )
    max_seq_length: int = field(default=384, metadata={"help": "Tokens per window (question + context)."})
    doc_stride: int = field(default=128, metadata={"help": "Overlap in tokens between windows of a long context."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Truncate the training questions (debug, benchmarks)."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Truncate the evaluation questions."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Ignore cached features."})
    pad_to_max_length: bool = field(
        default=False,
        metadata={"help": "Pad every batch to --max_seq_length instead of the batch's longest window."},
    )
    group_by_length: bool = field(
        default=False, metadata={"help": "Batch windows of similar length together (less padding)."}
    )
    dataloader_num_workers: int | None = field(
        default=None,
        metadata={"help": "Dataloader worker processes per rank (default: 2 on GPUs, where collation then overlaps "
                          "the step; 0 on CPU, where workers would take cores from the step)."},
    )
    # --- optimisation ------------------------------------------------------------------------
    per_device_train_batch_size: int = field(default=12, metadata={"help": "Micro-batch per process."})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "Evaluation batch per process."})
    learning_rate: float = field(default=3e-5, metadata={"help": "Peak learning rate of AdamW."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay (not on biases and LayerNorm)."})
    optim: str = field(
        default="adamw_torch_fused",
        metadata={"help": "adamw_torch_fused (one fused kernel on CUDA; plain AdamW elsewhere) or adamw_torch. "
                          "A DeepSpeed JSON with its own optimizer section overrides both."},
    )
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    num_train_epochs: float = field(default=2.0, metadata={"help": "Epochs over the training windows."})
    max_train_steps: int | None = field(
        default=None, metadata={"help": "Optimizer steps in total; overrides --num_train_epochs."}
    )
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Micro-batches per optimizer step."})
    lr_scheduler_type: str = field(default="linear", metadata={"help": f"One of {', '.join(SCHEDULERS)}."})
    num_warmup_steps: int = field(default=0, metadata={"help": "Linear warm-up steps."})
    warmup_ratio: float = field(default=0.0, metadata={"help": "Warm-up as a fraction of all steps (if --num_warmup_steps is 0)."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm; 0 disables."})
    mixed_precision: Literal["auto", "no", "fp16", "bf16"] = field(
        default="auto",
        metadata={"help": "auto: the accelerate config's choice if it set one, else bf16 on a GPU that "
                  "supports it and fp32 on CPU."},
    )
    torch_compile: bool = field(default=False, metadata={"help": "Compile the model with torch.compile."})
    seed: int = field(default=42, metadata={"help": "Seed for weights init, dropout and shuffling."})
    # --- evaluation --------------------------------------------------------------------------
    do_eval: bool = field(default=True, metadata={"help": "Evaluate EM/F1 after training (--no_eval to skip)."})
    eval_before_training: bool = field(default=False, metadata={"help": "Also evaluate the untrained model first."})
    n_best_size: int = field(default=20, metadata={"help": "Start/end candidates per window."})
    max_answer_length: int = field(default=30, metadata={"help": "Longest answer in tokens."})
    # --- output, checkpoints, logging --------------------------------------------------------
    output_dir: str = field(default="runs/qa_train", metadata={"help": "Where metrics, predictions and the model go."})
    checkpointing_steps: str | None = field(
        default=None, metadata={"help": "Save a resumable checkpoint every N steps, or 'epoch'."}
    )
    resume_from_checkpoint: str | None = field(
        default=None, metadata={"help": "Checkpoint directory, or 'latest' in --output_dir."}
    )
    save_total_limit: int | None = field(default=None, metadata={"help": "Keep at most this many checkpoints."})
    save_final_model: bool = field(default=True, metadata={"help": "Export model + tokenizer to output_dir/final."})
    report_to: Literal["wandb", "none"] = field(default="wandb", metadata={"help": "Tracker: wandb or none."})
    wandb_project: str = field(default="qa-train", metadata={"help": "W&B project."})
    run_name: str | None = field(default=None, metadata={"help": "Run name in W&B and reports."})
    logging_steps: int = field(default=10, metadata={"help": "Read the loss back and log every N steps."})
    throughput_warmup_steps: int = field(
        default=2, metadata={"help": "First optimizer steps left out of throughput figures."}
    )
    profile: bool = field(default=False, metadata={"help": "Write a PyTorch profiler trace of a few steps."})

    def __post_init__(self) -> None:
        validate(self)

    @property
    def checkpoint_every(self) -> int | Literal["epoch"] | None:
        if self.checkpointing_steps is None or self.checkpointing_steps == "epoch":
            return self.checkpointing_steps  # type: ignore[return-value]
        return int(self.checkpointing_steps)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _require(ok: bool, flag: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"--{flag}: {problem}")


def _check_file(path: str | None, flag: str) -> None:
    if path is None:
        return
    _require(Path(path).is_file(), flag, f"file {path!r} does not exist")
    _require(
        path.endswith((".json", ".jsonl")), flag, f"{path!r} must be .json (nested SQuAD) or .jsonl (flat records)"
    )


def validate(a: TrainArgs) -> None:
    """Refuse impossible values with a message naming the flag."""
    for name in ("max_seq_length", "per_device_train_batch_size", "per_device_eval_batch_size",
                 "gradient_accumulation_steps", "n_best_size", "max_answer_length", "logging_steps"):
        _require(getattr(a, name) > 0, name, f"must be positive, got {getattr(a, name)}")
    for name in ("max_train_steps", "max_train_samples", "max_eval_samples", "save_total_limit"):
        value = getattr(a, name)
        _require(value is None or value >= 0, name, f"must not be negative, got {value}")
    _require(a.save_total_limit != 0, "save_total_limit", "must be at least 1 (omit it to keep all)")
    _require(a.doc_stride > 0, "doc_stride", f"must be positive, got {a.doc_stride}")
    _require(a.doc_stride < a.max_seq_length, "doc_stride",
             f"{a.doc_stride} must be smaller than --max_seq_length {a.max_seq_length}")
    _require(a.max_seq_length <= 8192, "max_seq_length", f"{a.max_seq_length} is not a BERT window size")
    _require(a.learning_rate > 0, "learning_rate", f"must be positive, got {a.learning_rate}")
    _require(a.weight_decay >= 0, "weight_decay", f"must not be negative, got {a.weight_decay}")
    _require(a.num_train_epochs >= 0, "num_train_epochs", f"must not be negative, got {a.num_train_epochs}")
    _require(a.num_warmup_steps >= 0, "num_warmup_steps", f"must not be negative, got {a.num_warmup_steps}")
    _require(0 <= a.warmup_ratio < 1, "warmup_ratio", f"must be in [0, 1), got {a.warmup_ratio}")
    _require(a.max_grad_norm >= 0, "max_grad_norm", f"must not be negative, got {a.max_grad_norm}")
    _require(a.throughput_warmup_steps >= 0, "throughput_warmup_steps", "must not be negative")
    _require(a.dataloader_num_workers is None or a.dataloader_num_workers >= 0, "dataloader_num_workers",
             "must not be negative")
    _require(a.optim in OPTIMIZERS, "optim", f"{a.optim!r} is not one of {', '.join(OPTIMIZERS)}")
    _require(a.lr_scheduler_type in SCHEDULERS, "lr_scheduler_type",
             f"{a.lr_scheduler_type!r} is not one of {', '.join(SCHEDULERS)}")
    _require(a.attn_implementation in ("sdpa", "eager"), "attn_implementation",
             f"{a.attn_implementation!r} is not sdpa or eager")
    _check_file(a.train_file, "train_file")
    _check_file(a.validation_file, "validation_file")
    if a.train_file is None or (a.do_eval and a.validation_file is None):
        _require(bool(a.dataset_name), "dataset_name", "give a hub dataset or --train_file/--validation_file")
    if a.config_name is not None and Path(a.config_name).exists():
        _require((Path(a.config_name) / "config.json").is_file() or Path(a.config_name).is_file(),
                 "config_name", f"{a.config_name!r} has no config.json")
    if a.checkpointing_steps is not None and a.checkpointing_steps != "epoch":
        _require(a.checkpointing_steps.isdigit() and int(a.checkpointing_steps) > 0, "checkpointing_steps",
                 f"{a.checkpointing_steps!r} is neither a positive number of steps nor 'epoch'")
    if a.resume_from_checkpoint not in (None, "latest"):
        _require(Path(a.resume_from_checkpoint).is_dir(), "resume_from_checkpoint",
                 f"{a.resume_from_checkpoint!r} is not a checkpoint directory")
    _require(not Path(a.output_dir).is_file(), "output_dir", f"{a.output_dir!r} is a file")


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "y"):
        return True
    if text.lower() in ("0", "false", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="qa_train",
        description="Fine-tune a BERT-style encoder on SQuAD. The strategy (DDP, FSDP, ZeRO-1/2/3, offload) "
        "comes from the config file given to `accelerate launch --config_file`.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    for f in dataclasses.fields(TrainArgs):
        help_text = f.metadata.get("help", "")
        if f.type in ("bool", bool):
            # `--flag` turns it on, `--flag false` or `--no_flag` turns it off.
            parser.add_argument(f"--{f.name}", type=_parse_bool, nargs="?", const=True, default=f.default, help=help_text)
            parser.add_argument(f"--no_{f.name}", dest=f.name, action="store_false", help=argparse.SUPPRESS)
            continue
        kind = str(f.type)
        if kind.startswith("int"):
            conv: Any = int
        elif kind.startswith("float"):
            conv = float
        else:
            conv = str
        choices = None
        if kind.startswith("Literal"):
            choices = [c.strip(" '\"") for c in kind[len("Literal["):-1].split(",")]
        parser.add_argument(f"--{f.name}", type=conv, default=f.default, choices=choices, help=help_text)
    parser.add_argument("--no_eval", dest="do_eval", action="store_false", help="Skip evaluation.")
    return parser


def parse_args(argv: list[str] | None = None) -> TrainArgs:
    """Parse and validate; argparse exits with code 2 on unknown flags, ConfigError is raised on bad values."""
    parser = build_parser()
    parser.add_argument("--offline_demo", action="store_true",
                        help="Train the bundled tiny BERT on the bundled demo data (no network needed).")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--offline_demo" in argv:
        parser.set_defaults(**DEMO_DEFAULTS)
    namespace = parser.parse_args(argv)
    del namespace.offline_demo
    if namespace.run_name is None:
        namespace.run_name = os.environ.get("QA_TRAIN_RUN_NAME") or Path(namespace.output_dir).name
    return TrainArgs(**vars(namespace))
