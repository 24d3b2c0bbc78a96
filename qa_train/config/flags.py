"""The command line: one flag per setting of qa_train.config.settings's groups, refusals in one line that name the flag
(and, for Trainer's or the example's spellings, where to go instead)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from qa_train.config.settings import DEMO_DEFAULTS, GROUPS, TrainArgs


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "y"):
        return True
    if text.lower() in ("0", "false", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


class _CommaJoin(argparse.Action):
    """`--report_to wandb tensorboard` (Trainer's form) and `--report_to wandb,tensorboard` mean the same."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, ",".join(values))


def _add_flag(parser: argparse._ActionsContainer, f: dataclasses.Field) -> None:
    help_text = f.metadata.get("help", "")
    names = [f"--{f.name}", *f.metadata.get("aliases", ())]
    if f.type in ("bool", bool):
        # `--flag` turns it on, `--flag false` or `--no_flag` turns it off.
        parser.add_argument(
            *names, dest=f.name, type=_parse_bool, nargs="?", const=True, default=f.default, help=help_text
        )
        parser.add_argument(f"--no_{f.name}", dest=f.name, action="store_false", help=argparse.SUPPRESS)
        return
    kind = str(f.type)
    conv: Any = int if kind.startswith("int") else float if kind.startswith("float") else str
    choices = None
    if kind.startswith("Literal"):
        choices = [c.strip(" '\"") for c in kind[len("Literal[") : -1].split(",")]
    extra: dict[str, Any] = {"nargs": "+", "action": _CommaJoin} if f.metadata.get("nargs") == "+" else {}
    parser.add_argument(*names, dest=f.name, type=conv, default=f.default, choices=choices, help=help_text, **extra)


# Flags of transformers' Trainer and question-answering examples that qa_train spells differently or leaves to
# another tool: refused, with where to go instead.
ELSEWHERE = {
    "fp16": "--mixed_precision fp16",
    "bf16": "--mixed_precision bf16",
    "max_steps": "--max_train_steps",
    "warmup_steps": "--num_warmup_steps (or --warmup_ratio for a fraction of all steps)",
    "with_tracking": "qa_train tracks by default; choose trackers with --report_to",
    "evaluation_strategy": "--eval_strategy",
    "save_steps": "--checkpointing_steps N",
    "save_strategy": "--checkpointing_steps N or epoch",
    "logging_strategy": "--logging_steps N",
    "load_best_model_at_end": "--save_best (keeps and exports the model with the best F1)",
    "metric_for_best_model": "--save_best (the best model is the one with the best F1)",
    "per_gpu_train_batch_size": "--per_device_train_batch_size",
    "per_gpu_eval_batch_size": "--per_device_eval_batch_size",
    "data_seed": "--seed",
    "do_train": "qa_train always trains; answer questions with a trained model through qa-train predict",
    "preprocessing_num_workers": "featurisation runs in one process with the fast tokenizer, and is cached",
    "use_slow_tokenizer": "answer offsets need a fast tokenizer",
    "model_type": "--config_name (random initialisation)",
    "push_to_hub": "not supported: upload output_dir/final",
    "hub_model_id": "not supported: upload output_dir/final",
    "hub_token": "not supported: upload output_dir/final",
    "deepspeed": "the strategy comes from accelerate launch --config_file accelerate_configs/<strategy>.yaml",
    "fsdp": "the strategy comes from accelerate launch --config_file accelerate_configs/fsdp.yaml",
    "local_rank": "launch through accelerate launch (or qa-train launch), which sets ranks itself",
}


def _unknown_flag(token: str, known: list[str]) -> str:
    name = token.split("=", 1)[0]
    hint = ELSEWHERE.get(name.lstrip("-"))
    if hint is None:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]}?" if close else "python -m qa_train --help lists every flag"
    return f"unknown flag {name}: {hint}"


class _Parser(argparse.ArgumentParser):
    """One line per refusal, naming the flag (argparse would print its 50-line usage first)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse (before Python 3.13) takes `-1e-3` for a flag, so `--null_score_diff_threshold -1e-3` was refused
        # with "expected one argument". No flag here starts with a digit: anything like -1, -.5 or -1e-3 is a value.
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_args(self, args=None, namespace=None):
        values, rest = self.parse_known_args(args, namespace)
        if rest:
            known = [o for a in self._actions for o in a.option_strings if a.help != argparse.SUPPRESS]
            flags = [t for t in rest if t.startswith("-")] or rest
            self.error(
                "; ".join(_unknown_flag(t, known) if t.startswith("-") else f"unexpected value {t!r}" for t in flags)
            )
        return values


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Defaults shown where they say something: not None, and not where the help already names its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or "default" in text.lower() or isinstance(action, argparse._StoreFalseAction):
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="qa_train",
        description="Fine-tune a BERT-style encoder on SQuAD. The strategy (DDP, FSDP, ZeRO-1/2/3, offload) "
        "comes from the config file given to `accelerate launch --config_file`.",
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
    )
    for name, group in GROUPS.items():
        section = parser.add_argument_group(name, (group.__doc__ or "").strip())
        for f in dataclasses.fields(group):
            _add_flag(section, f)
    parser.add_argument(
        "--no_eval",
        dest="do_eval",
        action="store_false",
        help="Skip evaluation (refused with --eval_strategy steps or epoch, which evaluate).",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> TrainArgs:
    """Parse and validate; argparse exits with code 2 on unknown flags, ConfigError is raised on bad values."""
    parser = build_parser()
    parser.add_argument(
        "--offline_demo",
        action="store_true",
        help="Train the bundled tiny BERT on the bundled demo data (no network needed).",
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--offline_demo" in argv:
        parser.set_defaults(**DEMO_DEFAULTS)
    values = vars(parser.parse_args(argv))
    del values["offline_demo"]
    if values["run_name"] is None:
        values["run_name"] = os.environ.get("QA_TRAIN_RUN_NAME") or Path(values["output_dir"]).name
    return TrainArgs.from_flags(values)
