"""Typed settings in groups, validated before anything heavy is imported or loaded (the command line that
fills them is qa_train/config/flags.py).

Names follow transformers' question-answering examples (run_qa_no_trainer.py) and Trainer where they
overlap, so users coming from there feel at home. The flags stay flat (`--learning_rate`); in code
they live in groups (`args.optim.learning_rate`) so each function takes the group it needs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

DEFAULT_MODEL = "bert-base-uncased"
ASSETS = Path(__file__).resolve().parents[1] / "assets"
DEMO_MODEL_DIR = ASSETS / "tiny-bert"
DEMO_TRAIN_FILE = ASSETS / "demo" / "train.json"
DEMO_VALIDATION_FILE = ASSETS / "demo" / "dev.json"

# `--offline_demo`: the bundled tiny BERT and demo data, sized for about a minute on two CPU cores.
# Explicit flags still override these.
DEMO_DEFAULTS: dict[str, Any] = {
    "config_name": str(DEMO_MODEL_DIR),
    "tokenizer_name": str(DEMO_MODEL_DIR),
    "train_file": str(DEMO_TRAIN_FILE),
    "validation_file": str(DEMO_VALIDATION_FILE),
    "max_seq_length": 256,
    "doc_stride": 64,
    "per_device_train_batch_size": 16,
    "learning_rate": 1e-3,
    "weight_decay": 0.01,
    "warmup_ratio": 0.1,
    "num_train_epochs": 6.0,
    "logging_steps": 20,
    "eval_on_start": True,
    "eval_strategy": "epoch",
}

# accelerate's tracker names (accelerate.tracking.LOGGER_TYPE_TO_CLASS; a test keeps the two equal). "all" means
# the two qa-train installs, so a stray mlflow or comet_ml in the environment never starts by surprise.
TRACKERS = ("wandb", "tensorboard", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio")
TRACKERS_ALL = ("wandb", "tensorboard")
EVAL_STRATEGIES = ("no", "steps", "epoch")
# The values transformers' WandbCallback reads from these variables (WandbLogModel, WANDB_WATCH).
WANDB_LOG_MODEL_VALUES = ("end", "checkpoint", "false")
WANDB_WATCH_VALUES = ("gradients", "parameters", "all", "false")
WANDB_MODES = ("online", "offline", "shared", "disabled", "dryrun", "run")  # wandb.Settings' mode (0.31), as spelled

SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup")
# Where transformers' polynomial schedule ends (get_scheduler's lr_end); it refuses a peak not above it.
POLYNOMIAL_LR_END = 1e-7
# Trainer's names (transformers.training_args.OptimizerNames) for the ones offered here.
OPTIMIZERS = ("adamw_torch_fused", "adamw_torch", "adafactor", "adamw_bnb_8bit")
LOG_LEVELS = ("passive", "debug", "info", "warning", "error", "critical")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


# How answers are read from the logits, by evaluation and --do_predict alike.
ANSWER_FLAGS = ("n_best_size", "max_answer_length", "null_score_diff_threshold")


class ConfigError(ValueError):
    """A flag value that can never work; raised before any model or data is loaded."""


def _require(ok: bool, flag: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"--{flag}: {problem}")


def _positive(group: object, *names: str) -> None:
    for name in names:
        value = getattr(group, name)
        _require(value > 0, name, f"must be positive, got {value}")


def _not_negative(group: object, *names: str) -> None:
    for name in names:
        value = getattr(group, name)
        _require(value is None or value >= 0, name, f"must not be negative, got {value}")


def _named(group: object, *names: str) -> None:
    """What an unset shell variable gives (`--dataset_name "$DATA"`): "" is no name, and as a path it is the working
    directory, so a run would quietly fall back to a default or read and write where it was started."""
    for name in names:
        value = getattr(group, name)
        _require(
            value is None or bool(value.strip()),
            name,
            "is empty (an unset shell variable?); give a name or path, or drop the flag",
        )


def _changed(group: object, name: str) -> bool:
    """Whether a flag was set: its value is not its default (the flags carry no other trace of being typed, and one
    given at its default changes nothing)."""
    found = next(f for f in dataclasses.fields(group) if f.name == name)  # type: ignore[arg-type]
    return getattr(group, name) != found.default


def _finite(group: object, *names: str) -> None:
    """inf passes a sign check, but as a step count or an optimizer setting it only ever fails mid-run."""
    for name in names:
        value = getattr(group, name)
        _require(value is None or math.isfinite(value), name, f"must be a finite number, got {value}")


def _check_interval(value: float | None, flag: str) -> None:
    """Trainer's convention for --logging_steps/--eval_steps: a whole number of steps, or a share below 1."""
    if value is None:
        return
    _require(value > 0, flag, f"must be positive, got {value}")
    _require(
        value < 1 or float(value).is_integer(),
        flag,
        f"{value} is neither a whole number of steps nor a share of the run below 1",
    )


def _check_wandb_names(named: list[tuple[str, str, str | None]]) -> None:
    """A W&B project name or run id (by flag or variable, W&B's setting, value) that wandb.init refuses ("a/b"): the
    run's tracker guard turned that into a warning after --overwrite_output_dir had removed the last run, and trained
    on without W&B. wandb's own settings judge them, imported (about a second) only for a name out of the ordinary."""
    given = [(source, setting, value) for source, setting, value in named if value is not None]
    if all(re.fullmatch(r"[\w.-]{1,128}", value) for _, _, value in given):  # what W&B takes for either: no import
        return
    import wandb

    for source, setting, value in given:
        try:
            wandb.Settings(**{setting: value})  # type: ignore[arg-type]
        except wandb.errors.UsageError as err:
            raise ConfigError(f"{source}: {err} (W&B would refuse it as the run starts)") from None


def every_n_steps(value: float, total_steps: int) -> int:
    """The interval in steps: a share below 1 of the run's steps is rounded up, as Trainer does."""
    return max(1, math.ceil(value * total_steps)) if value < 1 else int(value)


def eval_interval(args: TrainArgs, total_steps: int) -> int:
    """Steps between evaluations under --eval_strategy steps: --eval_steps, else --logging_steps (Trainer's habit)."""
    return every_n_steps(args.eval.eval_steps or args.output.logging_steps, total_steps)


def unreached_intervals(args: TrainArgs, total_steps: int, updates_per_epoch: int) -> list[str]:
    """Warnings for a checkpoint or evaluation interval longer than the whole run (steps, or an epoch the run does
    not finish): Trainer says nothing, and a run meant to be resumable, or to be judged as it trains, finds out only
    at its end. Said, not refused: a short trial of a long run's flags is a habit."""
    if not args.eval.do_train or total_steps == 0:
        return []
    said = []
    short = f"more than the run's {total_steps} steps"
    epoch = f"an epoch ({updates_per_epoch} steps), which the run's {total_steps} steps do not finish"
    every = args.output.checkpoint_every
    if (every == "epoch" and total_steps < updates_per_epoch) or (isinstance(every, int) and every > total_steps):
        said.append(
            f"--checkpointing_steps {every} is {epoch if every == 'epoch' else short}: no checkpoint will be saved "
            "(a stop request still writes one)"
        )
    strategy = args.eval.eval_strategy
    interval = eval_interval(args, total_steps)
    if (strategy == "epoch" and total_steps < updates_per_epoch) or (strategy == "steps" and interval > total_steps):
        flag = "--eval_steps" if args.eval.eval_steps else "--eval_steps (by default --logging_steps)"
        said.append(
            (f"--eval_strategy epoch: {epoch}" if strategy == "epoch" else f"{flag} {interval} is {short}")
            + ": no evaluation during training"
            + (" for --save_best to choose from" if args.eval.save_best else "")
        )
    return said


def _kind(path: Path) -> str:
    mode = path.stat().st_mode
    kinds = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"))
    return next((name for test, name in kinds if test(mode)), "a block device")


def _check_file(path: str | None, flag: str) -> None:
    if path is None:
        return
    found = Path(path)
    _require(not found.is_dir(), flag, f"{path!r} is a directory, not a SQuAD JSON file")
    _require(found.exists(), flag, f"file {path!r} does not exist")
    # A named pipe or a device reads once: each rank, and the feature cache's key, read the file again.
    _require(found.is_file(), flag, f"{path!r} is not a regular file ({_kind(found)}): save the data to a file")
    _require(
        path.endswith((".json", ".jsonl")), flag, f"{path!r} must be .json (nested SQuAD) or .jsonl (flat records)"
    )


@dataclass
class ModelArgs:
    """Which encoder and tokenizer to fine-tune."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={
            "help": f"Pretrained model (hub name or local directory) whose weights are fine-tuned. Default: "
            f"{DEFAULT_MODEL}, unless --config_name is given alone (random initialisation)."
        },
    )
    config_name: str | None = field(
        default=None,
        metadata={
            "help": "Model config (name or dir), if not the same as the model's. Given without "
            "--model_name_or_path, the model is randomly initialised from it (offline use, "
            "benchmarks), as in transformers' examples."
        },
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer name or dir, if not the same as the model's."}
    )
    attn_implementation: str = field(
        default="auto",
        metadata={
            "help": "Attention kernel: auto (sdpa where the model supports it, else eager; the log says "
            "which), sdpa (PyTorch fused) or eager."
        },
    )
    model_revision: str = field(
        default="main",
        metadata={"help": "The version of a hub model (and its tokenizer and config): a branch, tag or commit id."},
    )
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "Where hub models and datasets are downloaded to (default: the hub's cache, $HF_HOME)."},
    )
    token: str | None = field(
        default=None,
        metadata={
            "help": "Hub token for private or gated models and datasets (default: $HF_TOKEN, else the one "
            "`hf auth login` saved). Never written to metrics.json or a tracker.",
            "secret": True,
        },
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={
            "help": "Run the model's own code from its hub repo or folder (config.json's auto_map); read it "
            "first. Datasets no longer run loading scripts, so it applies to the model and tokenizer only."
        },
    )

    def __post_init__(self) -> None:
        _named(self, "model_name_or_path", "config_name", "tokenizer_name", "cache_dir", "token")
        _require(self.model_revision != "", "model_revision", "is empty (the default is main)")
        _require(
            self.attn_implementation in ("auto", "sdpa", "eager"),
            "attn_implementation",
            f"{self.attn_implementation!r} is not auto, sdpa or eager",
        )
        if self.config_name is not None and Path(self.config_name).exists():
            _require(
                (Path(self.config_name) / "config.json").is_file() or Path(self.config_name).is_file(),
                "config_name",
                f"{self.config_name!r} has no config.json",
            )
        # A file where a folder belongs (its model.safetensors, its config.json): transformers, reading it as a
        # config or a hub id, said "not a valid JSON file" or "Repo id must be in the form ...".
        for flag, what in (("model_name_or_path", "the model"), ("tokenizer_name", "the tokenizer")):
            name = getattr(self, flag)
            _require(
                name is None or not Path(name).expanduser().is_file(),
                flag,
                f"{name} is a file; name the folder that holds {what} ({Path(name or '').parent})",
            )
        if self.model_name_or_path is None and self.config_name is None:
            self.model_name_or_path = DEFAULT_MODEL

    @property
    def from_scratch(self) -> bool:
        """Random initialisation: --config_name without --model_name_or_path (the examples' rule)."""
        return self.model_name_or_path is None

    @property
    def config_source(self) -> str:
        source = self.config_name or self.model_name_or_path
        assert source is not None  # one of them is set once __post_init__ has run
        return source

    @property
    def tokenizer_source(self) -> str:
        return self.tokenizer_name or self.model_name_or_path or DEFAULT_MODEL


@dataclass
class DataArgs:
    """Where the questions come from and how they become windows and batches."""

    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Dataset on the hub, for the splits no local file gives (default without local files: "
            "squad, or squad_v2 with --version_2_with_negative)."
        },
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Hub dataset config name."})
    train_file: str | None = field(
        default=None, metadata={"help": "Local training data: nested SQuAD JSON or flat JSON lines."}
    )
    validation_file: str | None = field(
        default=None, metadata={"help": "Local evaluation data: nested SQuAD JSON or flat JSON lines."}
    )
    test_file: str | None = field(
        default=None,
        metadata={
            "help": "Questions to answer with --do_predict: nested SQuAD JSON or flat JSON lines; "
            "answers may be missing."
        },
    )
    version_2_with_negative: bool = field(
        default=False,
        metadata={
            "help": "SQuAD v2.0: questions may have no answer (labelled at CLS); evaluation reports "
            "the official v2.0 metrics."
        },
    )
    max_seq_length: int = field(default=384, metadata={"help": "Tokens per window (question + context)."})
    doc_stride: int = field(default=128, metadata={"help": "Overlap in tokens between windows of a long context."})
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Truncate the training questions (debug, benchmarks)."}
    )
    max_eval_samples: int | None = field(default=None, metadata={"help": "Truncate the evaluation questions."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Truncate the --test_file questions."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Ignore cached features."})
    pad_to_max_length: bool = field(
        default=False,
        metadata={"help": "Pad every batch to --max_seq_length instead of the batch's longest window."},
    )
    pad_to_multiple_of: int = field(
        default=8,
        metadata={
            "help": "With dynamic padding, round each batch's width up to a multiple of this (as transformers' "
            "DataCollatorWithPadding). 8 suits tensor cores; a larger multiple means fewer distinct widths, so "
            "fewer CUDA graphs to record under --torch_compile_mode reduce-overhead and fewer attention plans."
        },
    )
    group_by_length: bool = field(
        default=False, metadata={"help": "Batch windows of similar length together (less padding)."}
    )
    per_device_train_batch_size: int = field(default=12, metadata={"help": "Micro-batch per process."})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "Evaluation batch per process."})
    dataloader_num_workers: int | None = field(
        default=None,
        metadata={
            "help": "Dataloader worker processes per rank (default: 2 on GPUs, where collation then overlaps "
            "the step; 0 on CPU, where workers would take cores from the step)."
        },
    )

    def __post_init__(self) -> None:
        _named(self, "dataset_name", "dataset_config_name", "train_file", "validation_file", "test_file")
        _positive(
            self, "max_seq_length", "pad_to_multiple_of", "per_device_train_batch_size", "per_device_eval_batch_size"
        )
        _not_negative(self, "dataloader_num_workers")
        for name in ("max_train_samples", "max_eval_samples", "max_predict_samples"):
            value = getattr(self, name)
            _require(value is None or value > 0, name, f"must be at least 1 question, got {value}")
        _require(self.doc_stride > 0, "doc_stride", f"must be positive, got {self.doc_stride}")
        _require(
            self.doc_stride < self.max_seq_length,
            "doc_stride",
            f"{self.doc_stride} must be smaller than --max_seq_length {self.max_seq_length}",
        )
        _require(self.max_seq_length <= 8192, "max_seq_length", f"{self.max_seq_length} is not a BERT window size")
        _check_file(self.train_file, "train_file")
        _check_file(self.validation_file, "validation_file")
        _check_file(self.test_file, "test_file")


@dataclass
class OptimArgs:
    """AdamW, the learning-rate schedule and how long to train."""

    learning_rate: float = field(default=3e-5, metadata={"help": "Peak learning rate of AdamW."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay (not on biases and LayerNorm)."})
    optim: str = field(
        default="adamw_torch_fused",
        metadata={
            "help": "adamw_torch_fused (one fused kernel on CUDA; plain AdamW elsewhere), adamw_torch, adafactor "
            "(transformers' Adafactor at --learning_rate, as Trainer's: factored second moments, no first "
            "moment) or adamw_bnb_8bit (bitsandbytes' 8-bit AdamW: CUDA GPUs, where bitsandbytes is "
            "installed). A DeepSpeed JSON with its own optimizer section takes the AdamW ones' place."
        },
    )
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1 (not read by adafactor)."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2 (not read by adafactor)."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon (not read by adafactor)."})
    num_train_epochs: float = field(default=2.0, metadata={"help": "Epochs over the training windows."})
    max_train_steps: int | None = field(
        default=None, metadata={"help": "Optimizer steps in total; overrides --num_train_epochs."}
    )
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "Micro-batches per optimizer step."})
    lr_scheduler_type: str = field(
        default="linear",
        metadata={
            "help": f"One of {', '.join(SCHEDULERS)}. polynomial decays to {POLYNOMIAL_LR_END:g} (transformers' "
            "lr_end), so it needs a higher --learning_rate."
        },
    )
    num_warmup_steps: int = field(default=0, metadata={"help": "Linear warm-up steps."})
    warmup_ratio: float = field(
        default=0.0, metadata={"help": "Warm-up as a fraction of all steps (instead of --num_warmup_steps)."}
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm; 0 disables."})

    def __post_init__(self) -> None:
        _positive(self, "gradient_accumulation_steps", "learning_rate")
        _not_negative(
            self,
            "max_train_steps",
            "weight_decay",
            "num_train_epochs",
            "num_warmup_steps",
            "max_grad_norm",
            "adam_epsilon",
        )
        _finite(self, "learning_rate", "weight_decay", "num_train_epochs", "adam_epsilon")
        # 0 epochs is 0 steps: the untrained model exported as a finished run, its summary blaming --max_train_steps 0
        # (the spelling that asks for that on purpose). Under --max_train_steps the epochs are not read.
        _require(
            self.num_train_epochs != 0 or self.max_train_steps is not None,
            "num_train_epochs",
            "is 0, so the run would train no step: give a positive number (--max_train_steps 0 evaluates and "
            "exports the model as built)",
        )
        # torch takes 0, but a weight whose gradient is still 0 (an embedding row of a token not yet seen: every
        # vocabulary has them) gets 0 / (sqrt(0) + 0), nan at the first step, refused only as a divergence.
        _require(
            self.adam_epsilon != 0,
            "adam_epsilon",
            "must be above 0: AdamW divides by sqrt(v) + eps, and v is 0 for every weight with no gradient yet "
            "(embedding rows of unseen tokens), which 0 turns into nan at the first step",
        )
        # torch.optim.AdamW's own limits: it would refuse them with a traceback once the model is built, after
        # --overwrite_output_dir has removed the old run.
        for name in ("adam_beta1", "adam_beta2"):
            _require(0 <= getattr(self, name) < 1, name, f"must be in [0, 1), got {getattr(self, name)}")
        _require(0 <= self.warmup_ratio < 1, "warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        _require(self.optim in OPTIMIZERS, "optim", f"{self.optim!r} is not one of {', '.join(OPTIMIZERS)}")
        _require(
            self.optim != "adamw_bnb_8bit" or importlib.util.find_spec("bitsandbytes") is not None,
            "optim",
            "adamw_bnb_8bit needs bitsandbytes, which is not installed here (pip install bitsandbytes, on a "
            "machine with a CUDA GPU)",
        )
        _require(
            self.lr_scheduler_type in SCHEDULERS,
            "lr_scheduler_type",
            f"{self.lr_scheduler_type!r} is not one of {', '.join(SCHEDULERS)}",
        )
        # step_plan takes --num_warmup_steps where it is given: a --warmup_ratio beside it was dropped without a word.
        _require(
            not (self.num_warmup_steps and self.warmup_ratio),
            "warmup_ratio",
            f"{self.warmup_ratio:g} and --num_warmup_steps {self.num_warmup_steps} both set the warm-up: give one",
        )
        # Trainer's Adafactor is built from --learning_rate alone (torch_optimizer): AdamW's settings would do nothing.
        if self.optim == "adafactor":
            for name in ("adam_beta1", "adam_beta2", "adam_epsilon"):
                _require(
                    not _changed(self, name),
                    name,
                    "is AdamW's, and --optim adafactor (transformers' Adafactor, as Trainer builds it) does not read "
                    "it: drop it, or choose an adamw optimizer",
                )
        # transformers' constant schedule takes no warm-up (get_scheduler returns it before reading one): a warm-up
        # given with it was dropped without a word.
        if self.lr_scheduler_type == "constant":
            for name in ("num_warmup_steps", "warmup_ratio"):
                _require(
                    not getattr(self, name),
                    name,
                    "is a warm-up, and --lr_scheduler_type constant has none: use constant_with_warmup, or drop it",
                )
        # transformers raises this only once the model is built (after --overwrite_output_dir removed the old run).
        _require(
            self.lr_scheduler_type != "polynomial" or self.learning_rate > POLYNOMIAL_LR_END,
            "learning_rate",
            f"{self.learning_rate:g} is not above {POLYNOMIAL_LR_END:g}, where --lr_scheduler_type polynomial "
            "decays to (transformers' lr_end): raise it, or choose another schedule",
        )


@dataclass
class EvalArgs:
    """When to score EM/F1 and how answers are read from the logits."""

    do_train: bool = field(
        default=True,
        metadata={
            "help": "Train (Trainer's flag). --do_train false evaluates --model_name_or_path on the validation "
            "split (and answers --test_file with --do_predict) without reading a training file; it writes "
            "metrics.json and predictions, and no model."
        },
    )
    do_eval: bool = field(default=True, metadata={"help": "Evaluate EM/F1 after training (--no_eval to skip)."})
    eval_on_start: bool = field(
        default=False,
        metadata={
            "help": "Also evaluate the model before the first step (as transformers' Trainer).",
            "aliases": ("--eval_before_training",),
        },
    )
    eval_strategy: Literal["no", "steps", "epoch"] = field(
        default="no",
        metadata={
            "help": "Also evaluate during training: every --eval_steps steps, or every epoch. "
            "EM/F1 go to the trackers as eval/* against the step."
        },
    )
    eval_steps: float | None = field(
        default=None,
        metadata={
            "help": "Steps between evaluations with --eval_strategy steps (default: "
            "--logging_steps); below 1, a share of the run's steps (as Trainer)."
        },
    )
    save_best: bool = field(
        default=False,
        metadata={
            "help": "Keep the model with the best F1 seen (evaluations during training and the final one) in "
            "output_dir/best; the export to output_dir/final, and --do_predict's answers, are then that model."
        },
    )
    n_best_size: int = field(default=20, metadata={"help": "Start/end candidates per window."})
    max_answer_length: int = field(default=30, metadata={"help": "Longest answer in tokens."})
    null_score_diff_threshold: float = field(
        default=0.0,
        metadata={
            "help": 'SQuAD v2.0: answer "" when the null score beats the best span by more than this '
            "(the best_f1_thresh of an evaluation is a good value)."
        },
    )
    do_predict: bool = field(
        default=False,
        metadata={
            "help": "After training, answer --test_file: predict_predictions.json and "
            "predict_nbest_predictions.json (top --n_best_size with probabilities)."
        },
    )

    def __post_init__(self) -> None:
        _positive(self, "n_best_size", "max_answer_length")
        _require(
            self.do_train or self.do_eval or self.do_predict,
            "do_train",
            "false with --do_eval false leaves nothing to do: add --do_eval or --do_predict",
        )
        _require(
            self.eval_strategy in EVAL_STRATEGIES,
            "eval_strategy",
            f"{self.eval_strategy!r} is not one of {', '.join(EVAL_STRATEGIES)}",
        )
        _check_interval(self.eval_steps, "eval_steps")
        _require(
            self.eval_steps is None or self.eval_strategy == "steps",
            "eval_steps",
            f"is only used with --eval_strategy steps (got --eval_strategy {self.eval_strategy})",
        )
        _require(
            self.do_eval or self.eval_strategy == "no",
            "no_eval",
            f"contradicts --eval_strategy {self.eval_strategy}, which evaluates during training: drop one of them",
        )
        _require(
            not self.save_best or self.eval_strategy != "no",
            "save_best",
            "needs evaluations during training to choose from: add --eval_strategy steps or epoch",
        )
        # nan never compares true, and an infinite margin decides every question alike (always or never "").
        _finite(self, "null_score_diff_threshold")

    @property
    def needs_eval_data(self) -> bool:
        return self.do_eval or self.eval_on_start or self.eval_strategy != "no"


@dataclass
class OutputArgs:
    """What a run writes, where, and to which tracker."""

    output_dir: str = field(default="runs/qa_train", metadata={"help": "Where metrics, predictions and the model go."})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Replace the run already in --output_dir: its metrics, model, checkpoints and logs are "
            "removed once the new run's flags, model config and data have passed their checks; only files "
            "provably qa_train's go, anything else stays and is named. Without it an occupied --output_dir is refused, unless resuming."
        },
    )
    checkpointing_steps: str | None = field(
        default=None,
        metadata={
            "help": "Save a resumable checkpoint (output_dir/checkpoints/step_N) every N optimizer steps, or at the end "
            "of each epoch ('epoch'). Without it a run writes one only when a stop request ends it."
        },
    )
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={
            "help": "Checkpoint directory, or 'latest' in --output_dir. It continues under any strategy and number "
            "of processes with the same global batch (the accumulation is refitted when only the processes changed)."
        },
    )
    allow_global_batch_change: bool = field(
        default=False,
        metadata={
            "help": "Resume with another global batch (per-device batch x accumulation x processes) than the "
            "checkpoint's: the steps done and the LR schedule are recounted from the windows trained. Without it "
            "another global batch is refused."
        },
    )
    save_total_limit: int | None = field(default=None, metadata={"help": "Keep at most this many checkpoints."})
    save_final_model: bool = field(default=True, metadata={"help": "Export model + tokenizer to output_dir/final."})
    save_safetensors: bool = field(
        default=True,
        metadata={
            "help": "The export and --save_best's copies are model.safetensors (transformers 5 writes no other "
            "format); false is refused."
        },
    )
    report_to: str = field(
        default="wandb",
        metadata={
            "help": "Trackers, comma- or space-separated: wandb, tensorboard, all (those two), none, or any "
            f"other accelerate tracker ({', '.join(TRACKERS[2:])}). W&B runs offline without "
            "credentials. Default: wandb (transformers' example tracks only with --with_tracking).",
            "nargs": "+",
        },
    )
    wandb_project: str | None = field(
        default=None, metadata={"help": "W&B project (default: $WANDB_PROJECT, else qa-train)."}
    )
    wandb_log_model: bool = field(
        default=False,
        metadata={
            "help": "Log the exported model (output_dir/final) as a W&B artifact. As for Trainer, "
            "WANDB_LOG_MODEL=end does the same, and WANDB_LOG_MODEL=checkpoint logs every checkpoint too; "
            "WANDB_WATCH=gradients, parameters or all logs their histograms every max(100, --logging_steps) steps."
        },
    )
    run_name: str | None = field(default=None, metadata={"help": "Run name in W&B and reports."})
    logging_dir: str | None = field(
        default=None,
        metadata={"help": "TensorBoard's folder, with tensorboard in --report_to (default: output_dir/tensorboard)."},
    )
    logging_steps: float = field(
        default=10,
        metadata={
            "help": "Read the loss back and log every N steps; below 1, a share of the run's steps "
            "(0.01: a hundred logs a run, as Trainer)."
        },
    )
    disable_tqdm: bool = field(default=False, metadata={"help": "No progress bar or progress lines."})
    progress_interval_s: float = field(
        default=30.0,
        metadata={
            "help": "Where stderr is not a terminal (SLURM, CI): seconds between progress lines "
            "instead of a bar (0: every step)."
        },
    )

    def __post_init__(self) -> None:
        # What an unset shell variable gives: Path("") is the working directory, whose final/ and checkpoints/ a run
        # would write into (and --overwrite_output_dir clear).
        _require(
            bool(self.output_dir.strip()),
            "output_dir",
            "is empty (an unset shell variable?); name the run's folder, e.g. --output_dir runs/my-run",
        )
        _named(self, "resume_from_checkpoint", "logging_dir", "run_name", "wandb_project")
        _check_interval(self.logging_steps, "logging_steps")
        _not_negative(self, "progress_interval_s")
        names = self._report_names
        unknown = [n for n in names if n not in (*TRACKERS, "all", "none")]
        _require(
            bool(names) and not unknown,
            "report_to",
            f"{self.report_to!r}: {', '.join(unknown) or 'empty'} is not a tracker "
            f"(choose from {', '.join(TRACKERS)}, all, none)",
        )
        _require(
            len(names) == 1 or not {"all", "none"} & set(names),
            "report_to",
            f"{self.report_to!r}: all and none stand alone",
        )
        _not_negative(self, "save_total_limit")
        _require(self.save_total_limit != 0, "save_total_limit", "must be at least 1 (omit it to keep all)")
        _require(
            self.save_total_limit is None or self.checkpointing_steps is not None,
            "save_total_limit",
            "limits checkpoints, and none are written without --checkpointing_steps N or epoch",
        )
        # As --save_total_limit without checkpoints: a flag that could do nothing is refused, not ignored.
        _require(
            not self.wandb_log_model or "wandb" in self.trackers,
            "wandb_log_model",
            f"logs the model to W&B, which --report_to {self.report_to} leaves out: add wandb to --report_to",
        )
        _require(
            not self.wandb_log_model or self.save_final_model,
            "wandb_log_model",
            "logs the exported model (output_dir/final), which --save_final_model false does not write",
        )
        _require(
            self.save_safetensors,
            "save_safetensors",
            "false: transformers 5 saves weights only as safetensors (pickled pytorch_model.bin is gone), so "
            "the export is model.safetensors; drop the flag",
        )
        _require(
            self.logging_dir is None or "tensorboard" in self.trackers,
            "logging_dir",
            f"is TensorBoard's folder, which --report_to {self.report_to} leaves out: add tensorboard to --report_to",
        )
        _require(
            self.wandb_project is None or "wandb" in self.trackers,
            "wandb_project",
            f"is W&B's project, which --report_to {self.report_to} leaves out: add wandb to --report_to, or drop it",
        )
        if "wandb" in self.trackers:  # as Trainer, the variables matter only where W&B runs
            for variable, values in (("WANDB_LOG_MODEL", WANDB_LOG_MODEL_VALUES), ("WANDB_WATCH", WANDB_WATCH_VALUES)):
                value = os.environ.get(variable, "false").lower()
                if value not in values:
                    raise ConfigError(f"{variable}={value}: not one of {', '.join(values)} (transformers' values)")
            mode = os.environ.get("WANDB_MODE")
            if mode and mode not in WANDB_MODES:  # wandb.init would fail, and accelerate go on without W&B
                raise ConfigError(f"WANDB_MODE={mode}: not one of {', '.join(WANDB_MODES)} (W&B's modes)")
            # An empty variable is unset, as the run takes it.
            from_variable = None if self.wandb_project else os.environ.get("WANDB_PROJECT") or None
            run_id = os.environ.get("WANDB_RUN_ID") or None
            _check_wandb_names(
                [
                    ("--wandb_project", "project", self.wandb_project),
                    ("WANDB_PROJECT", "project", from_variable),
                    ("WANDB_RUN_ID", "run_id", run_id),
                ]
            )
        if self.wandb_project is None:
            self.wandb_project = os.environ.get("WANDB_PROJECT") or "qa-train"
        if self.checkpointing_steps is not None and self.checkpointing_steps != "epoch":
            # ASCII digits only: str.isdigit takes "²" (int() then fails) and "١٢" (int() reads 12).
            _require(
                re.fullmatch("[0-9]+", self.checkpointing_steps) is not None and int(self.checkpointing_steps) > 0,
                "checkpointing_steps",
                f"{self.checkpointing_steps!r} is neither a positive number of steps nor 'epoch'",
            )
        if self.resume_from_checkpoint not in (None, "latest"):
            _require(
                Path(self.resume_from_checkpoint).is_dir(),
                "resume_from_checkpoint",
                f"{self.resume_from_checkpoint!r} is not a checkpoint directory",
            )
        _require(not Path(self.output_dir).is_file(), "output_dir", f"{self.output_dir!r} is a file")

    @property
    def _report_names(self) -> list[str]:
        return [n.strip() for n in self.report_to.split(",") if n.strip()]

    @property
    def trackers(self) -> list[str]:
        names = self._report_names
        if names == ["all"]:
            return list(TRACKERS_ALL)
        return [] if names == ["none"] else list(dict.fromkeys(names))

    @property
    def log_model_when(self) -> str | None:
        """When the model goes to W&B as an artifact: "end" (the export), "checkpoint" (every checkpoint, and the
        export), or None."""
        if "wandb" not in self.trackers:
            return None
        env = os.environ.get("WANDB_LOG_MODEL", "false").lower()
        return "checkpoint" if env == "checkpoint" else "end" if self.wandb_log_model or env == "end" else None

    @property
    def wandb_watch(self) -> str | None:
        """What W&B watches (WANDB_WATCH): gradients, parameters, all, or None."""
        value = os.environ.get("WANDB_WATCH", "false").lower()
        return value if "wandb" in self.trackers and value != "false" else None

    @property
    def tensorboard_dir(self) -> Path:
        return Path(self.logging_dir) if self.logging_dir else Path(self.output_dir) / "tensorboard"

    @property
    def checkpoint_every(self) -> int | Literal["epoch"] | None:
        if self.checkpointing_steps is None or self.checkpointing_steps == "epoch":
            return self.checkpointing_steps  # type: ignore[return-value]
        return int(self.checkpointing_steps)


@dataclass
class SystemArgs:
    """Precision, compilation, seeding and measurement: how the work runs, not what it computes."""

    mixed_precision: Literal["auto", "no", "fp16", "bf16"] = field(
        default="auto",
        metadata={
            "help": "auto: the accelerate config's choice if it set one, else bf16 on a GPU that "
            "supports it and fp32 on CPU."
        },
    )
    torch_compile: bool = field(default=False, metadata={"help": "Compile the model with torch.compile."})
    torch_compile_mode: str | None = field(
        default=None,
        metadata={
            "help": f"torch.compile's mode ({', '.join(COMPILE_MODES)}); naming one implies --torch_compile, "
            "as in transformers' Trainer. reduce-overhead replays CUDA graphs, one recorded per batch shape: "
            "one with --pad_to_max_length, one per padded length with dynamic padding."
        },
    )
    torch_compile_backend: str | None = field(
        default=None,
        metadata={
            "help": "torch.compile's backend (inductor by default; aot_eager traces and runs the graphs "
            "without generating kernels, to tell a compiler fault from a model fault); naming one implies "
            "--torch_compile, as in transformers' Trainer."
        },
    )
    torch_compile_regional: bool = field(
        default=False,
        metadata={
            "help": "Compile only the encoder's repeated layers (accelerate's regional compilation): one "
            "layer's graph is compiled and reused by the others, so a cold compile takes a fraction of the "
            "whole model's, for a few percent of step time; the embeddings and the QA head are compiled "
            "apart. Implies --torch_compile."
        },
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata={
            "help": "Keep only each encoder layer's input through the forward pass and recompute the layer "
            "in the backward pass (transformers' non-reentrant activation checkpointing): activation memory "
            "falls from every layer's tensors to one layer's plus the layers' inputs, for about one more "
            "forward pass of compute per step. The model family must support it (ALBERT, MPNet and a few "
            "others do not)."
        },
    )
    tf32: bool = field(
        default=False,
        metadata={
            "help": "TF32 matmuls and convolutions for fp32 work (as Trainer: transformers' enable_tf32); "
            "needs an Ampere or newer NVIDIA GPU. Off: torch's defaults."
        },
    )
    log_level: Literal["passive", "debug", "info", "warning", "error", "critical"] = field(
        default="passive",
        metadata={
            "help": "Log level of the main process, qa_train's and the libraries' (transformers, datasets, "
            "accelerate, DeepSpeed) alike; passive keeps qa_train at info and the libraries at warning. "
            "Other ranks log warnings and errors only."
        },
    )
    seed: int = field(default=42, metadata={"help": "Seed for weights init, dropout and shuffling."})
    ddp_timeout: float = field(
        default=1800,
        metadata={
            "help": "Seconds (1 at least) a rank waits in a collective (all-reduce, barrier) for the others before "
            "the run stops with an error: a rank that hangs or died ends the job instead of holding every GPU. "
            "As transformers' Trainer (1800); NCCL's own default would be 600. Raise it where one rank works "
            "alone for long (featurising a large dataset first, uploading a model)."
        },
    )
    throughput_warmup_steps: int = field(
        default=2, metadata={"help": "First optimizer steps left out of throughput figures."}
    )
    profile: bool = field(default=False, metadata={"help": "Write a PyTorch profiler trace of a few steps."})

    def __post_init__(self) -> None:
        _not_negative(self, "throughput_warmup_steps", "seed")
        _require(
            0 < self.ddp_timeout <= 10**9,
            "ddp_timeout",
            f"must be a positive number of seconds up to 1e9, got {self.ddp_timeout:g}",
        )  # nan and inf too
        # torch forms the process group (TCPStore, gloo's mesh) under this timeout, in whole milliseconds: 0.01 s
        # failed there with a traceback on every rank before any collective.
        _require(
            self.ddp_timeout >= 1,
            "ddp_timeout",
            f"{self.ddp_timeout:g} s is too short for the ranks even to connect (torch forms the process group under "
            "it too): give 1 s at least",
        )
        _require(self.seed < 2**32, "seed", f"must be below 2**32 (numpy's limit), got {self.seed}")
        _require(
            self.log_level in LOG_LEVELS,
            "log_level",
            f"{self.log_level!r} is not one of {', '.join(LOG_LEVELS)}",
        )
        _require(
            self.torch_compile_mode in (None, *COMPILE_MODES),
            "torch_compile_mode",
            f"{self.torch_compile_mode!r} is not one of {', '.join(COMPILE_MODES)}",
        )
        if self.torch_compile_backend is not None:
            import torch._dynamo  # only when the flag is given: it is a heavy import for a config check

            known = torch._dynamo.list_backends(exclude_tags=())
            _require(
                self.torch_compile_backend in known,
                "torch_compile_backend",
                f"{self.torch_compile_backend!r} is not one of torch's backends ({', '.join(known)})",
            )
            _require(
                self.torch_compile_mode in (None, "default") or self.torch_compile_backend == "inductor",
                "torch_compile_mode",
                f"{self.torch_compile_mode!r} is an inductor mode; "
                f"--torch_compile_backend {self.torch_compile_backend} takes none",
            )
        if self.torch_compile_mode is not None or self.torch_compile_backend is not None or self.torch_compile_regional:
            self.torch_compile = True  # as transformers' Trainer: naming a mode or backend asks for compiling

    @property
    def compile_mode(self) -> str | None:
        """torch.compile's mode argument (None: its default)."""
        return None if self.torch_compile_mode in (None, "default") else self.torch_compile_mode

    def compile_flags_given(self) -> dict[str, bool]:
        """The --torch_compile* flags that were given (a mode, backend or --torch_compile_regional implies
        --torch_compile, which is then not named itself)."""
        implied = {
            "torch_compile_mode": self.torch_compile_mode is not None,
            "torch_compile_backend": self.torch_compile_backend is not None,
            "torch_compile_regional": self.torch_compile_regional,
        }
        return {"torch_compile": self.torch_compile and not any(implied.values()), **implied}


GROUPS: dict[str, type] = {
    "model": ModelArgs,
    "data": DataArgs,
    "optim": OptimArgs,
    "eval": EvalArgs,
    "output": OutputArgs,
    "system": SystemArgs,
}


@dataclass
class TrainArgs:
    """Everything one qa_train run needs, one group per concern; each group field is one flag."""

    model: ModelArgs = field(default_factory=ModelArgs)
    data: DataArgs = field(default_factory=DataArgs)
    optim: OptimArgs = field(default_factory=OptimArgs)
    eval: EvalArgs = field(default_factory=EvalArgs)
    output: OutputArgs = field(default_factory=OutputArgs)
    system: SystemArgs = field(default_factory=SystemArgs)

    def __post_init__(self) -> None:
        d = self.data
        needs_eval, training = self.eval.needs_eval_data, self.eval.do_train
        if not training:
            self._check_evaluation_only()
        self._check_unread()
        if d.dataset_name is None and d.train_file is None and d.validation_file is None and (training or needs_eval):
            d.dataset_name = "squad_v2" if d.version_2_with_negative else "squad"
        # After the implicit squad above, which takes the config: here no hub dataset is read at all.
        _require(
            d.dataset_config_name is None or d.dataset_name is not None,
            "dataset_config_name",
            "is a config of --dataset_name, and this run reads only local files: add --dataset_name, or drop it",
        )
        # A local file and an implicit hub split would mix sources silently (and need the network).
        _require(
            d.dataset_name is not None or d.train_file is not None or not training,
            "validation_file",
            "is given without --train_file: add --train_file, or --dataset_name to train on a hub dataset",
        )
        _require(
            d.dataset_name is not None or d.validation_file is not None or not needs_eval,
            "train_file",
            "is given without --validation_file, so there is nothing to evaluate on: add --validation_file, "
            "--dataset_name to evaluate on a hub dataset's validation split, or --no_eval",
        )
        _require(
            not self.eval.do_predict or d.test_file is not None,
            "do_predict",
            "needs --test_file (the questions to answer: SQuAD JSON or JSON lines, answers optional)",
        )
        _require(d.test_file is None or self.eval.do_predict, "test_file", "is only read with --do_predict")

    def _check_unread(self) -> None:
        """As --test_file without --do_predict: a flag that nothing in this run reads is refused, not ignored."""
        d, e = self.data, self.eval
        _require(
            not _changed(e, "null_score_diff_threshold") or d.version_2_with_negative,
            "null_score_diff_threshold",
            "only decides SQuAD v2.0's empty answers: add --version_2_with_negative, or drop it",
        )
        if not e.needs_eval_data:
            for flag, given in (
                ("validation_file", d.validation_file is not None),
                ("max_eval_samples", d.max_eval_samples is not None),
            ):
                _require(not given, flag, "is only read to evaluate, and --no_eval evaluates nothing: drop it")
        if not (e.needs_eval_data or e.do_predict):  # both batch the windows and read answers from the logits
            for group, flag in ((d, "per_device_eval_batch_size"), *((e, n) for n in ANSWER_FLAGS)):
                _require(
                    not _changed(group, flag),
                    flag,
                    "is only read to evaluate or to answer --test_file, and --no_eval without --do_predict does "
                    "neither: drop it",
                )
        _require(
            d.max_predict_samples is None or e.do_predict,
            "max_predict_samples",
            "truncates --test_file's questions, which are only read with --do_predict",
        )

    def _check_evaluation_only(self) -> None:
        """--do_train false: a flag that only training reads would do nothing, so it is refused, not ignored."""
        _require(
            not self.model.from_scratch,
            "do_train",
            "false evaluates the weights of --model_name_or_path, and --config_name alone is a randomly "
            "initialised model: add --model_name_or_path",
        )
        d, e, o = self.data, self.eval, self.output
        training_only = {
            "train_file": d.train_file is not None,
            "max_train_samples": d.max_train_samples is not None,
            "eval_on_start": e.eval_on_start,
            "eval_strategy": e.eval_strategy != "no",
            "save_best": e.save_best,
            "checkpointing_steps": o.checkpointing_steps is not None,
            "resume_from_checkpoint": o.resume_from_checkpoint is not None,
            "wandb_log_model": o.wandb_log_model,
            "gradient_checkpointing": self.system.gradient_checkpointing,
            # Evaluation and prediction run eagerly (evaluation.py) and the profiler traces training steps.
            **self.system.compile_flags_given(),
            "profile": self.system.profile,
        }
        # Flags whose default is a value: given when not at it. Every optimizer and schedule flag is training's.
        defaulted = [
            (self.optim, [f.name for f in dataclasses.fields(self.optim)]),
            (d, ["per_device_train_batch_size", "group_by_length"]),
            (o, ["allow_global_batch_change", "save_final_model", "logging_steps"]),
            (self.system, ["throughput_warmup_steps"]),
        ]
        training_only |= {name: _changed(group, name) for group, names in defaulted for name in names}
        given = [f"--{name}" for name, on in training_only.items() if on]
        _require(
            not given,
            "do_train",
            f"false trains nothing, so {', '.join(given)} would do nothing (nor is a model exported): drop it",
        )

    @classmethod
    def from_flags(cls, values: dict[str, Any]) -> TrainArgs:
        """Build from flat flag values ({"learning_rate": 3e-5, ...}); every group validates its own."""
        unknown = set(values) - {f.name for group in GROUPS.values() for f in dataclasses.fields(group)}
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        groups = {
            name: group(**{f.name: values[f.name] for f in dataclasses.fields(group) if f.name in values})
            for name, group in GROUPS.items()
        }
        return cls(**groups)

    def to_dict(self) -> dict[str, Any]:
        """Flat {flag: value}, as metrics.json's `args` and the tracker's config record them; a secret (--token)
        only as whether it was given."""
        return {
            f.name: _shown(f, getattr(getattr(self, name), f.name))
            for name, group in GROUPS.items()
            for f in dataclasses.fields(group)
        }

    def answering(self) -> dict[str, Any]:
        """The windows and span rules this run reads answers with, as its export records them (ANSWERING_KEY)."""
        return answering(self.data, self.eval)

    def sources(self) -> dict[str, str]:
        """{flag: value} of every model, tokenizer and data source the run reads, as given (hub names too)."""
        m, d = self.model, self.data
        given = {
            "--model_name_or_path": m.model_name_or_path,
            "--config_name": m.config_name,
            "--tokenizer_name": m.tokenizer_name,
            "--dataset_name": d.dataset_name,
            "--train_file": d.train_file,
            "--validation_file": d.validation_file,
            "--test_file": d.test_file,
        }
        return {flag: value for flag, value in given.items() if value}


def answering(d: DataArgs, e: EvalArgs) -> dict[str, Any]:
    """The windows and span rules of these settings, by flag name (what ANSWERING_KEY records)."""
    return {
        "max_seq_length": d.max_seq_length,
        "doc_stride": d.doc_stride,
        "n_best_size": e.n_best_size,
        "max_answer_length": e.max_answer_length,
        "version_2_with_negative": d.version_2_with_negative,
        "null_score_diff_threshold": e.null_score_diff_threshold if d.version_2_with_negative else None,
    }


# The key of an export's config.json that holds TrainArgs.answering(): `qa-train predict` takes those as its
# defaults, so that it answers as the run's evaluation did. transformers records none of them (its QA pipeline's
# 384/128 windows are not those of a run trained at 192/64).
ANSWERING_KEY = "qa_train_answering"


def _shown(f: dataclasses.Field, value: Any) -> Any:
    if f.metadata.get("secret"):
        return None if value is None else "<given>"
    return value
