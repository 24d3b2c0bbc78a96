"""The command line: one flag per setting of qa_train.config.settings's groups, refusals in one line that name the flag
(and, for Trainer's or the example's spellings, where to go instead)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from qa_train.config.parser import OneLineParser
from qa_train.config.settings import DEMO_DEFAULTS, GROUPS, ConfigError, TrainArgs


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


# Flags of transformers' Trainer and question-answering examples (run_qa.py, run_qa_no_trainer.py) that qa_train spells
# differently or leaves to another tool: refused, with where to go instead (docs/training.md shows this table, and a
# test holds the two equal and checks every flag named here).
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
    "use_auth_token": "--token (or HF_TOKEN)",
    "auto_find_batch_size": "not supported: qa-train plan gives each strategy's memory per GPU for a batch size",
    "log_level_replica": "--log_level sets the main process; other ranks log warnings and errors only",
    "include_tokens_per_second": "tokens/s is always measured (throughput/tokens_per_second, metrics.json)",
    "logging_nan_inf_filter": "a non-finite loss stops the run (exit 3) instead of being filtered",
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
ARGS_FILE_SUFFIXES = (".json", ".yaml", ".yml")


def edit_distance(a: str, b: str) -> int:
    """Edits (insert, delete, substitute, swap two neighbours) from a to b. By hand: difflib's similarity ratio
    suggested --mixed_precision for --model_revision, and the standard library has no edit distance."""
    previous: list[int] = []  # the row before the last: a swap looks two rows back
    current = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        before, previous, current = previous, current, [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                current[j] = min(current[j], before[j - 2] + 1)
    return current[-1]


def closest_flag(name: str, known: list[str]) -> str | None:
    """The known flag a typo most likely meant: at most one edit from a name of 4 to 7 letters, two from a
    longer one; None when nothing is that close (an unrelated suggestion misleads more than none)."""
    bare = name.lstrip("-")
    allowed = 2 if len(bare) >= 8 else 1 if len(bare) >= 4 else 0
    scored = sorted((edit_distance(bare, k.lstrip("-")), k) for k in known)
    return scored[0][1] if scored and scored[0][0] <= allowed else None


def _unknown_flag(token: str, known: list[str]) -> str:
    name = token.split("=", 1)[0]
    hint = ELSEWHERE.get(name.lstrip("-"))
    if hint is None:
        close = closest_flag(name, known)
        hint = f"did you mean {close}?" if close else "python -m qa_train --help lists every flag"
    return f"unknown flag {name}: {hint}"


def _unexpected(token: str) -> str:
    if token.endswith(ARGS_FILE_SUFFIXES):
        return f"unexpected value {token!r}: a file of arguments comes first (python -m qa_train {token} --flag ...)"
    return f"unexpected value {token!r}"


class _Parser(OneLineParser):
    """One line per refusal, naming the flag (argparse would print its 50-line usage first); every unknown flag
    with where to go instead."""

    def parse_args(self, args=None, namespace=None):
        values, rest = self.parse_known_args(args, namespace)
        if rest:
            known = [o for a in self._actions for o in a.option_strings if a.help != argparse.SUPPRESS]
            flags = [t for t in rest if t.startswith("-")] or rest
            self.error("; ".join(_unknown_flag(t, known) if t.startswith("-") else _unexpected(t) for t in flags))
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
    """Parse and validate; argparse exits with code 2 on unknown flags, ConfigError is raised on bad values.

    As transformers' examples: a JSON or YAML file of arguments may come first (`python -m qa_train args.json`);
    flags on the command line override it, and it overrides --offline_demo's settings."""
    parser = build_parser()
    parser.add_argument(
        "--offline_demo",
        action="store_true",
        help="Train the bundled tiny BERT on the bundled demo data (no network needed).",
    )
    argv = [_underscored(t) for t in (sys.argv[1:] if argv is None else argv)]
    path = argv.pop(0) if argv and not argv[0].startswith("-") and argv[0].endswith(ARGS_FILE_SUFFIXES) else None
    given = {**(read_args_file(Path(path), parser) if path else {}), **_given(parser, argv)}
    values = vars(parser.parse_args([]))
    if given.get("offline_demo"):
        values.update(demo_defaults(given))
    values.update(given)
    del values["offline_demo"]
    if values["run_name"] is None:
        # The folder's own name, also for "." (whose Path name is "")
        values["run_name"] = os.environ.get("QA_TRAIN_RUN_NAME") or Path(os.path.abspath(values["output_dir"])).name
    return TrainArgs.from_flags(values)


def _underscored(token: str) -> str:
    """`--output-dir` as `--output_dir` (transformers' HfArgumentParser takes both spellings)."""
    if not token.startswith("--"):
        return token
    name, sep, value = token.partition("=")
    return name.replace("-", "_").replace("__", "--", 1) + sep + value


_UNSET = object()


def _given(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, Any]:
    """What the command line sets, and nothing else: a namespace already holding every name keeps argparse from
    filling in defaults, so the arguments file and the demo's settings apply only under what was typed."""
    names = {a.dest for a in parser._actions if a.dest not in ("help", argparse.SUPPRESS)}
    namespace = parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(names, _UNSET)))
    return {k: v for k, v in vars(namespace).items() if v is not _UNSET}


# The demo's settings that only training reads (refused under --do_train false), and those that only evaluation does.
DEMO_TRAINING_ONLY = {
    "train_file",
    "per_device_train_batch_size",
    "learning_rate",
    "weight_decay",
    "warmup_ratio",
    "num_train_epochs",
    "logging_steps",
    "eval_on_start",
    "eval_strategy",
}
DEMO_EVALUATION_ONLY = {"validation_file", "eval_on_start", "eval_strategy"}


def demo_defaults(given: dict[str, Any]) -> dict[str, Any]:
    """--offline_demo's settings under what was given: a model named leaves the demo's config and tokenizer out (its
    own are used), a dataset named the demo's files (its splits are read: the demo's files would silently take their
    place), --do_train false what only training reads, --no_eval what only evaluation reads, and
    --lr_scheduler_type constant or --num_warmup_steps the warm-up."""
    left_out: set[str] = set()
    if given.get("model_name_or_path"):
        left_out |= {"config_name", "tokenizer_name"}
    if given.get("dataset_name"):
        left_out |= {"train_file", "validation_file"}
    if given.get("do_train") is False:
        left_out |= DEMO_TRAINING_ONLY
    if given.get("lr_scheduler_type") == "constant" or given.get("num_warmup_steps"):  # none, or one of its own
        left_out.add("warmup_ratio")
    if given.get("do_eval") is False:
        left_out |= DEMO_EVALUATION_ONLY - ({"validation_file"} if given.get("eval_on_start") else set())
    return {k: v for k, v in DEMO_DEFAULTS.items() if k not in left_out}


def read_args_file(path: Path, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """A JSON or YAML object of {flag: value}, as Trainer's HfArgumentParser reads one; each value checked as its
    flag's would be on the command line, and every fault one ConfigError line naming the file and the key."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"arguments file {path}: cannot be read ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"arguments file {path}: not UTF-8 text (byte {err.start}); save it as UTF-8") from None
    try:
        if path.suffix == ".json":
            doc = json.loads(text)
        else:
            import yaml  # accelerate's dependency, so always installed

            doc = yaml.safe_load(text)
    except ValueError as err:  # json.JSONDecodeError and yaml.YAMLError's parser errors alike
        raise ConfigError(
            f"arguments file {path}: not valid {path.suffix[1:].upper()}: {' '.join(str(err).split())}"
        ) from None
    except Exception as err:  # noqa: BLE001 - yaml's own error types, without importing yaml up front
        raise ConfigError(f"arguments file {path}: not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"arguments file {path}: must hold an object of flag: value, found {type(doc).__name__}")
    actions = {o[2:]: a for a in parser._actions for o in a.option_strings if o.startswith("--")}
    known = [o for a in parser._actions for o in a.option_strings if a.help != argparse.SUPPRESS]
    values: dict[str, Any] = {}
    for key, value in doc.items():
        action = actions.get(_underscored(f"--{key}")[2:])
        if action is None:
            raise ConfigError(f"arguments file {path}: {_unknown_flag(f'--{key}', known)}")
        values[action.dest] = _file_value(action, value, f"arguments file {path}: {key}")
    return values


def _file_value(action: argparse.Action, value: Any, where: str) -> Any:
    """One value from an arguments file, converted as argparse converts the same text on the command line."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction) or action.type is _parse_bool:
        flag = value if isinstance(value, bool) else _file_bool(value, where)
        return (not flag) if isinstance(action, argparse._StoreFalseAction) else flag
    if isinstance(action, _CommaJoin) and isinstance(value, list):
        value = ",".join(map(str, value))
    # A name or path must be text (a whole number, YAML's reading of `checkpointing_steps: 500`, is its digits):
    # str() would make a list or true a folder named "['a']" or "True".
    if action.type is str and value is not None and (isinstance(value, bool) or not isinstance(value, str | int)):
        raise ConfigError(f"{where}: expected a string, got {type(value).__name__} {value!r}")
    if action.type is int and isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: expected a whole number, got {value!r}")  # int() raises OverflowError on inf
    if value is None or isinstance(value, bool) and action.type is not str:
        if value is None and action.default is None:
            return None
        raise ConfigError(f"{where}: expected a {getattr(action.type, '__name__', 'value')}, got {value!r}")
    convert = action.type if callable(action.type) else None
    try:
        converted = convert(value) if convert is not None else value
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: expected a {getattr(convert, '__name__', 'value')}, got {value!r}") from None
    if action.type is int and isinstance(value, float) and value != converted:
        raise ConfigError(f"{where}: expected a whole number, got {value!r}")
    if action.choices is not None and converted not in action.choices:
        raise ConfigError(f"{where}: {converted!r} is not one of {', '.join(map(str, action.choices))}")
    return converted


def _file_bool(value: Any, where: str) -> bool:
    try:
        return _parse_bool(str(value))
    except argparse.ArgumentTypeError:
        raise ConfigError(f"{where}: expected true or false, got {value!r}") from None
