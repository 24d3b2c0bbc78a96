"""DeepSpeed's JSON reconciled with the flags (its "auto" values filled), and the optimizer and schedule it builds."""

from __future__ import annotations

import copy
import difflib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qa_train.config.settings import ConfigError, TrainArgs
from qa_train.core.errors import did_you_mean

log = logging.getLogger("qa_train")


def _is_auto(value: object) -> bool:
    return isinstance(value, str) and value == "auto"


def reconcile_deepspeed(cfg: dict, args: TrainArgs, world_size: int, mixed_precision: str, source: str) -> None:
    """Fill the DeepSpeed JSON's "auto" values (in place) from our flags; refuse one that says otherwise.

    accelerate would fill gradient_clipping "auto" with 1.0 whatever --max_grad_norm says, and would
    silently prefer the JSON's accumulation steps over the flag; a value set in two places that
    disagree is an error here instead. `source` names the JSON in messages.
    """
    optim, micro = args.optim, args.data.per_device_train_batch_size
    wanted = {
        "train_micro_batch_size_per_gpu": (micro, "per_device_train_batch_size"),
        "gradient_accumulation_steps": (optim.gradient_accumulation_steps, "gradient_accumulation_steps"),
        "gradient_clipping": (float(optim.max_grad_norm), "max_grad_norm"),
    }
    for key, (value, flag) in wanted.items():
        current = cfg.get(key, "auto")
        if _is_auto(current):
            cfg[key] = value
        elif float(current) != float(value):
            raise ConfigError(
                f"{source}: '{key}' is {current} but --{flag} is {value}; "
                f'set "{key}": "auto" in the JSON so the flag decides'
            )
    if "train_batch_size" in cfg and not _is_auto(cfg["train_batch_size"]):
        expected = micro * optim.gradient_accumulation_steps * world_size
        if int(cfg["train_batch_size"]) != expected:
            raise ConfigError(
                f"{source}: 'train_batch_size' is {cfg['train_batch_size']} but the flags give {expected}; use \"auto\""
            )
    for dtype in ("fp16", "bf16"):
        enabled = cfg.get(dtype, {}).get("enabled", "auto")
        # DeepSpeed's pydantic config reads "yes", "on" and 1 as true too.
        if not _is_auto(enabled) and str(enabled).lower() in ("true", "yes", "on", "1") and mixed_precision != dtype:
            raise ConfigError(
                f"{source}: {dtype} is enabled but --mixed_precision resolved to {mixed_precision}; "
                f'set "{dtype}": {{"enabled": "auto"}} so the flag decides'
            )
    _fill_optimizer(cfg, args, source)


def _fill_optimizer(cfg: dict, args: TrainArgs, source: str) -> None:
    """DeepSpeed's own optimizer (CPUAdam under offload) takes its hyper-parameters from the flags: a value the
    JSON sets otherwise would train with it while metrics.json records the flag's, so it is refused."""
    params = cfg.get("optimizer", {}).get("params")
    if params is None:
        return
    o = args.optim
    values: dict[str, tuple[Any, str]] = {
        "lr": (o.learning_rate, "--learning_rate"),
        "betas": ([o.adam_beta1, o.adam_beta2], "--adam_beta1/--adam_beta2"),
        "eps": (o.adam_epsilon, "--adam_epsilon"),
        "weight_decay": (o.weight_decay, "--weight_decay"),
    }
    for key, (value, flag) in values.items():
        current = params.get(key, "auto")
        if _is_auto(current):
            params[key] = value
        elif _floats(current) != _floats(value):
            raise ConfigError(
                f"{source}: optimizer '{key}' is {current} but {flag} is {value}; "
                f'set "{key}": "auto" in the JSON so the flag decides'
            )


def _floats(value: object) -> list[float]:
    return [float(v) for v in value] if isinstance(value, list | tuple) else [float(value)]  # type: ignore[arg-type]


ZERO_STAGES = (0, 1, 2, 3)
# The JSON's settings that the flags decide, compared with them as numbers.
NUMBERS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping", "train_batch_size")


def check_launch_json(args: TrainArgs, mixed_precision: str) -> None:
    """The DeepSpeed JSON of this launch (accelerate launch names it in ACCELERATE_DEEPSPEED_CONFIG_FILE), refused in
    one line before any window is cut or weight loaded: accelerate and DeepSpeed would fail on a malformed one with a
    traceback (inside Accelerator(), or at prepare after featurisation), and reconcile_with_flags, which fills the
    live copy, comes only after the model is built and --overwrite_output_dir has removed the old run."""
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() != "true":
        return
    path = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if not path or path == "none":  # accelerate's own marker: the YAML's deepspeed_config keys, no JSON
        return
    cfg = _read_json(path)
    if "zero_optimization" not in cfg:  # accelerate requires it, in a ValueError from inside Accelerator()
        close = difflib.get_close_matches("zero_optimization", [str(k) for k in cfg], n=1)
        hint = f" (is {close[0]!r} it, misspelt?)" if close else ""
        raise ConfigError(f"{path}: no 'zero_optimization' section, which accelerate needs{hint}")
    zero = cfg["zero_optimization"]
    if not isinstance(zero, dict):
        raise ConfigError(f"{path}: 'zero_optimization' must be a JSON object, got {json.dumps(zero)}")
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ConfigError(
            f"{path}: zero_optimization 'stage' is {json.dumps(stage)}; DeepSpeed's ZeRO stages are 0 to 3"
        )
    _check_zero_keys(zero, path)
    _check_top_keys(cfg, path)
    _check_flag_values(cfg, path)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    reconcile_deepspeed(copy.deepcopy(cfg), args, world_size, mixed_precision, path)


def _read_json(path: str) -> dict:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file (a relative path is from the directory you launch from)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot be read ({err.strerror if isinstance(err, OSError) else err})") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: not valid JSON: line {err.lineno}, column {err.colno}: {err.msg}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: not a DeepSpeed config (a JSON object of settings)")
    return cfg


def _check_flag_values(cfg: dict, path: str) -> None:
    """The values reconcile_deepspeed compares with the flags, each a number (or "auto") in an object where it
    should be: anything else failed there with a TypeError, ValueError or AttributeError traceback."""
    optimizer = cfg.get("optimizer", {})
    for name, section in (("fp16", cfg.get("fp16", {})), ("bf16", cfg.get("bf16", {})), ("optimizer", optimizer)):
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: '{name}' must be a JSON object, got {json.dumps(section)}")
    params = optimizer.get("params", {})
    if not isinstance(params, dict):
        raise ConfigError(f"{path}: optimizer 'params' must be a JSON object, got {json.dumps(params)}")
    values = [(f"'{k}'", cfg.get(k, "auto")) for k in NUMBERS]
    values += [(f"optimizer '{k}'", params.get(k, "auto")) for k in ("lr", "eps", "weight_decay", "betas")]
    for label, value in values:
        numbers = value if label == "optimizer 'betas'" and isinstance(value, list) else [value]
        if not (_is_auto(value) or all(_is_number(v) for v in numbers)):
            raise ConfigError(f'{path}: {label} is {json.dumps(value)}: neither a number nor "auto"')


def _is_number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def _check_zero_keys(zero: dict, source: str) -> None:
    """DeepSpeed's ZeRO section forbids unknown keys, but says so only once the engine is built."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    fields = DeepSpeedZeroConfig.model_fields
    known = set(fields) | {f.alias for f in fields.values() if f.alias}
    for key in zero:
        if key not in known:
            hint = did_you_mean(key, sorted(known))
            raise ConfigError(f"{source}: zero_optimization: unknown key {key!r}{hint}, which DeepSpeed refuses")


def _check_top_keys(cfg: dict, source: str) -> None:
    """DeepSpeed ignores a top-level key it does not read: a misspelt "bf16" or "gradient_clipping" trained without
    it. One close to a key DeepSpeed reads is refused; any other (a "_comment") is said once."""
    known = deepspeed_top_level_keys()
    if known is None:
        return
    for key in cfg:
        if key in known:
            continue
        # Closer than difflib's default: a "comment" is 0.83 from "comet", a misspelt "bf_16" 0.89 from "bf16".
        hint = did_you_mean(str(key), sorted(known), cutoff=0.85)
        if hint:
            raise ConfigError(f"{source}: unknown key {key!r}{hint}, which DeepSpeed would ignore")
        if os.environ.get("RANK", "0") == "0":
            log.warning("%s: %r is not a key DeepSpeed reads: it has no effect", source, key)


# Read only with a process group up (DeepSpeedConfig's world size), so the recording below misses it.
_READ_WITH_A_PROCESS_GROUP = frozenset({"sequence_parallel_size"})


def deepspeed_top_level_keys() -> frozenset[str] | None:
    """The top-level keys the installed DeepSpeed's config reads, recorded from one DeepSpeedConfig built on a dict
    that notes every key asked for (20 ms; DeepSpeed is imported for the ZeRO check already). DeepSpeed keeps no list
    of them, and a list written here would refuse the keys of a newer DeepSpeed. None when that build fails on a
    DeepSpeed version unlike this one: then nothing is checked."""
    from deepspeed.runtime.config import DeepSpeedConfig

    seen: set[str] = set()

    class Recording(dict):
        """DeepSpeed reads its config with get, `in`, [] and `in cfg.keys()`; a shallow copy keeps `seen`."""

        def get(self, key, default=None):
            seen.add(key)
            return super().get(key, default)

        def __contains__(self, key: object) -> bool:
            seen.add(str(key))
            return super().__contains__(key)

        def __getitem__(self, key):
            seen.add(key)
            return super().__getitem__(key)

        def keys(self):
            return Recording({k: None for k in super().keys()})

    try:
        DeepSpeedConfig(Recording({"zero_optimization": {"stage": 0}, "train_micro_batch_size_per_gpu": 1}))
    except Exception:  # noqa: BLE001 - a DeepSpeed that cannot build this minimal config is not checked, not refused
        return None
    return frozenset(seen) | _READ_WITH_A_PROCESS_GROUP


def reconcile_with_flags(accelerator, args: TrainArgs, mixed_precision: str) -> None:
    """reconcile_deepspeed on the live plugin's config; nothing to do outside DeepSpeed."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    source = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE") or "the DeepSpeed config"
    reconcile_deepspeed(plugin.deepspeed_config, args, accelerator.num_processes, mixed_precision, source)


def uses_deepspeed_optimizer(accelerator) -> bool:
    plugin = accelerator.state.deepspeed_plugin
    return plugin is not None and "optimizer" in plugin.deepspeed_config


def scheduler_steps_per_update(accelerator) -> int:
    """How far one optimizer update advances a prepared LR scheduler.

    accelerate wraps a torch scheduler in AcceleratedScheduler, which steps it once per process per
    update (under DeepSpeed too), while a DummyScheduler handed to DeepSpeed's own optimizer is
    stepped by the engine exactly once. Sizing the schedule by this factor gives the same LR curve
    under every strategy.
    """
    return 1 if uses_deepspeed_optimizer(accelerator) else accelerator.num_processes


def optimizer_and_scheduler(
    accelerator,
    groups: list[dict],
    args: TrainArgs,
    torch_optimizer: Callable[[list[dict]], Any],
    schedule: Callable[[Any], Any],
) -> tuple[Any, Any]:
    """Placeholders when the DeepSpeed JSON brings its own optimizer (DeepSpeed builds it), else torch's."""
    if uses_deepspeed_optimizer(accelerator):
        from accelerate.utils import DummyOptim, DummyScheduler

        optimizer = DummyOptim(groups, lr=args.optim.learning_rate, weight_decay=args.optim.weight_decay)
        return optimizer, DummyScheduler(optimizer, lr_scheduler_callable=schedule)
    optimizer = torch_optimizer(groups)
    return optimizer, schedule(optimizer)
