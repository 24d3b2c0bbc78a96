"""W&B, metrics.json, the per-step log and the end-of-run summary. Main process only.

W&B is driven directly rather than through `Accelerator(log_with="wandb")` because a run must
fall back to offline mode without credentials or without a reachable server, and a tracker failure
must never stop training.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import warnings
from pathlib import Path
from typing import Any

from qa_train.schema import RunMetrics

log = logging.getLogger("qa_train")
# wandb.init waits 90 s for an unreachable server by default (and its service 10 s more) while every other
# rank waits at the next collective; after this long the run goes offline instead. WANDB_INIT_TIMEOUT wins.
WANDB_INIT_TIMEOUT_S = 5.0


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def atomic_write_json(path: Path, payload: Any) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=False, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _has_wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text() or bool(os.environ.get("WANDB_BASE_URL"))
    except OSError:
        return False


class Tracker:
    """Writes on the main process; every other rank gets a tracker that does nothing."""

    def __init__(self, enabled: bool, output_dir: Path, use_wandb: bool) -> None:
        self.enabled = enabled
        self.output_dir = output_dir
        self.run = None
        self.use_wandb = enabled and use_wandb
        self.step_log = output_dir / "train_log.jsonl"

    def start(self, project: str, name: str | None, config: dict[str, Any], resuming: bool) -> None:
        if not self.enabled:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        if not resuming and self.step_log.exists():
            self.step_log.unlink()
        if not self.use_wandb:
            return
        # Without credentials wandb.init raises in a non-interactive job; offline runs sync later.
        mode = os.environ.get("WANDB_MODE") or ("online" if _has_wandb_credentials() else "offline")
        kwargs = dict(project=project, name=name, config=config, dir=str(self.output_dir),
                      group=os.environ.get("WANDB_RUN_GROUP"), resume="allow" if resuming else None,
                      id=os.environ.get("WANDB_RUN_ID"))
        try:
            import wandb

            if mode == "online":
                self.run = self._init_online(wandb, kwargs)
                mode = "online" if self.run is not None else "offline"
            if self.run is None:
                self.run = wandb.init(mode=mode, **kwargs)
            log.info("W&B run %s (mode=%s)", getattr(self.run, "name", "?"), mode)
        except Exception as err:  # noqa: BLE001 - any tracker failure must leave training running
            warnings.warn(f"W&B disabled: wandb.init failed: {err}", stacklevel=2)
            self.run = None

    def _init_online(self, wandb: Any, kwargs: dict[str, Any]) -> Any:
        """The online run, or None (after one warning line) when it cannot start in time: the run then goes
        offline, its files in output_dir/wandb for `wandb sync`."""
        timeout = float(os.environ.get("WANDB_INIT_TIMEOUT") or WANDB_INIT_TIMEOUT_S)
        # Before init's own timeout even starts, its "logged in as" line asks the server who the key belongs to
        # (5 s a try, and it tries twice). Only that line needs the answer, so the question is not asked.
        with contextlib.suppress(Exception):
            wandb.setup(settings=wandb.Settings(x_disable_viewer=True))
        try:
            return wandb.init(mode="online", settings=wandb.Settings(init_timeout=timeout), **kwargs)
        except Exception as err:  # noqa: BLE001 - CommError on timeout, AuthenticationError, ...
            reason = (str(err).strip().splitlines() or [""])[0][:200]
            log.warning("W&B online run did not start (%s: %s; init timeout %g s): logging offline to %s, "
                        "upload later with `wandb sync %s`", type(err).__name__, reason, timeout,
                        self.output_dir / "wandb", self.output_dir / "wandb" / "offline-run-*")
            return None

    def _wandb(self, fn: str, *args: Any, **kwargs: Any) -> None:
        if self.run is None:
            return
        try:
            getattr(self.run, fn)(*args, **kwargs)
        except Exception as err:  # noqa: BLE001
            warnings.warn(f"W&B {fn} failed, continuing without it: {err}", stacklevel=2)
            self.run = None

    def log_step(self, step: int, values: dict[str, float]) -> None:
        if not self.enabled:
            return
        with self.step_log.open("a") as f:
            f.write(json.dumps({"step": step, **values}) + "\n")
        self._wandb("log", values, step=step)

    def finish(self, metrics: RunMetrics) -> None:
        if not self.enabled:
            return
        payload = metrics.to_json()
        atomic_write_json(self.output_dir / "metrics.json", payload)
        summary = {k: v for k, v in _flatten(payload).items() if not k.startswith("args/")}
        if self.run is not None:
            try:
                self.run.summary.update(summary)
            except Exception as err:  # noqa: BLE001
                warnings.warn(f"W&B summary failed: {err}", stacklevel=2)
        self.close()

    def close(self) -> None:
        """Finish the W&B run once, whether or not finish() wrote metrics first."""
        self._wandb("finish")
        self.run = None


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}/"))
        elif not isinstance(value, list):
            out[name] = value
    return out


def _fmt(value: Any, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.2f}{unit}"
    return f"{value}{unit}"


def summary_table(m: RunMetrics) -> str:
    """One screen: what a user compares strategies by."""
    mem, rss = m.peak_memory_gb, m.peak_host_rss_gb
    before = ""
    if m.initial_exact_match is not None:
        label = f"at step {m.initial_eval_step}, resumed" if m.initial_eval_step else "untrained"
        before = f"  ({label}: EM {_fmt(m.initial_exact_match)}, F1 {_fmt(m.initial_f1)})"
    rows = [
        ("strategy", f"{m.strategy} (zero_stage={m.zero_stage}, offload={m.offload}), "
                     f"world_size={m.world_size}, {m.mixed_precision}"),
        ("exact match / F1", f"{_fmt(m.exact_match)} / {_fmt(m.f1)}{before}"),
        ("train steps", f"{m.train_steps} x global batch {m.global_batch_size} "
                        f"({m.num_train_features} windows of {m.max_seq_length} max)"),
        ("throughput", f"{_fmt(m.train_samples_per_second)} samples/s, "
                       f"{_fmt(m.train_tokens_per_second)} tokens/s "
                       f"({_fmt(m.train_padded_tokens_per_second)} padded)"),
        ("step time", f"{_fmt(m.train_step_time_s_mean, ' s')}, MFU {_fmt(m.mfu)}"),
        ("peak memory", f"max {_fmt(mem.max, ' GiB')} / mean {_fmt(mem.mean, ' GiB')} per rank "
                        f"[{m.peak_memory_source}]"),
        ("peak host RSS", f"max {_fmt(rss.max, ' GiB')} per rank (lifetime)"),
        ("runtime", f"{_fmt(m.train_runtime_s, ' s')} training, {_fmt(m.total_runtime_s, ' s')} total"),
        ("output", str(m.output_dir)),
    ]
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 60)
    return "\n".join([line, *(f"{k:<{width}}  {v}" for k, v in rows), line])


def forget_steps_after(step_log: Path, step: int) -> None:
    """A resumed run logs again the steps after its checkpoint: drop the interrupted run's lines for them."""
    if not step_log.exists():
        return
    lines = step_log.read_text().splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= step]
    if len(kept) != len(lines):
        atomic_write_text(step_log, "".join(f"{line}\n" for line in kept))
