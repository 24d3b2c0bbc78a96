"""Experiment trackers through accelerate's tracker API (`Accelerator(log_with=...)`, `init_trackers`, `log`).

accelerate lets any tracker failure propagate into the training loop, and its W&B tracker calls
`wandb.init` as is: without credentials that raises, and with an unreachable server it blocks 90 s
while every other rank waits at the next collective. So each tracker is wrapped: a failure warns once
and turns that tracker off, and W&B starts offline without credentials or falls back to offline when
the server does not answer in a few seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from accelerate.tracking import (
    LOGGER_TYPE_TO_CLASS,
    GeneralTracker,
    TensorBoardTracker,
    WandBTracker,
    on_main_process,
)

from qa_train.config.settings import ConfigError
from qa_train.core.errors import one_line
from qa_train.observe.recorder import GLOBAL_STEP

log = logging.getLogger("qa_train")
# wandb.init waits 90 s for an unreachable server by default (and its service 10 s more) while every other
# rank waits at the next collective; after this long the run goes offline instead. WANDB_INIT_TIMEOUT wins.
WANDB_INIT_TIMEOUT_S = 5.0
# The figures TensorBoard's HParams view sets beside the hyper-parameters (their scalars are in the same run).
HPARAM_METRICS = ("eval/exact_match", "eval/f1", "train/loss")


def has_wandb_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text() or bool(os.environ.get("WANDB_BASE_URL"))
    except OSError:
        return False


def start_wandb_run(output_dir: Path, **init_kwargs: Any) -> Any:
    """wandb.init as qa-train starts every run: offline without credentials; online with a short init timeout,
    falling back to offline (one log line) so that nothing waits 90 s on an unreachable server."""
    import wandb

    mode = os.environ.get("WANDB_MODE") or ("online" if has_wandb_credentials() else "offline")
    run = _start_online(wandb, output_dir, init_kwargs) if mode == "online" else None
    if mode == "online" and run is None:
        mode = "offline"
    if run is None:
        # WANDB_MODE as set: wandb's settings also take "dryrun" and "run", which init's annotation leaves out.
        run = wandb.init(mode=mode, **init_kwargs)  # type: ignore[arg-type]
    log.info("W&B run %s (mode=%s)", getattr(run, "name", "?"), mode)
    return run


def _start_online(wandb: Any, output_dir: Path, kwargs: dict[str, Any]) -> Any:
    timeout = float(os.environ.get("WANDB_INIT_TIMEOUT") or WANDB_INIT_TIMEOUT_S)
    # Before init's own timeout even starts, its "logged in as" line asks the server who the key belongs to
    # (5 s a try, and it tries twice). Only that line needs the answer, so the question is not asked.
    with contextlib.suppress(Exception):
        wandb.setup(settings=wandb.Settings(x_disable_viewer=True))
    try:
        return wandb.init(mode="online", settings=wandb.Settings(init_timeout=timeout), **kwargs)
    except Exception as err:  # noqa: BLE001 - CommError on timeout, AuthenticationError, ...
        log.warning(
            "W&B online run did not start (%s; init timeout %g s): logging offline to %s, "
            "upload later with `wandb sync %s`",
            one_line(err, limit=200),
            timeout,
            output_dir / "wandb",
            output_dir / "wandb" / "offline-run-*",
        )
        return None


class SafeWandB(WandBTracker):
    """accelerate's W&B tracker, started by `start_wandb_run`; its files wait in output_dir/wandb for
    `wandb sync` when the run is offline."""

    main_process_only = True

    def __init__(self, project: str, output_dir: Path, **kwargs: Any) -> None:
        super().__init__(project, **kwargs)
        self.output_dir = output_dir
        self.run: Any = None  # the wandb Run once started

    @on_main_process
    def start(self) -> None:
        self.run = start_wandb_run(self.output_dir, project=self.run_name, **self.init_kwargs)
        # As Trainer lays its runs out: every key plotted against the optimizer step, not W&B's own record count.
        self.run.define_metric(GLOBAL_STEP)
        self.run.define_metric("*", step_metric=GLOBAL_STEP, step_sync=True)

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self.run.config.update(values, allow_val_change=True)  # this run's config, not wandb's global one

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        self.run.log({**values, GLOBAL_STEP: step} if step is not None else values, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


class TensorBoard(TensorBoardTracker):
    """accelerate's TensorBoard tracker, with the hyper-parameters in the run's own event file: accelerate's
    add_hparams writes them to a new timestamped folder (and hparams.yml to another), which TensorBoard lists as
    two more runs without a scalar."""

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        from torch.utils.tensorboard.summary import hparams

        writer = self.writer._get_file_writer()
        for summary in hparams(values, dict.fromkeys(HPARAM_METRICS, 0.0)):  # the metrics' names, not values
            writer.add_summary(summary)
        self.writer.flush()


class Guarded(GeneralTracker):
    """Any tracker, made harmless: the first failure warns once and turns it off; training goes on."""

    main_process_only = True
    requires_logging_directory = False

    def __init__(self, inner: GeneralTracker) -> None:
        self.name = inner.name
        super().__init__()
        self.inner = inner
        self.live = True

    @property
    def tracker(self) -> Any:
        """The tracker's own object (the wandb run, the SummaryWriter), or None once it failed."""
        return getattr(self.inner, "tracker", None) if self.live else None

    def call(self, what: str, fn: Callable[[], Any], fatal: bool = True) -> None:
        if not self.live:
            return
        try:
            fn()
        except Exception as err:  # noqa: BLE001 - no tracker failure may stop training
            warnings.warn(f"{self.name} {what} failed{', continuing without it' if fatal else ''}: {err}", stacklevel=3)
            self.live = not fatal

    @on_main_process
    def start(self) -> None:
        self.call("start", self.inner.start)

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        # W&B keeps nested values (the DeepSpeed config) browsable; the others take scalars only.
        shown = values if self.name == "wandb" else flat_config(values)
        self.call("config", lambda: self.inner.store_init_configuration(shown), fatal=False)

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        self.call("log", lambda: self.inner.log(values, step=step, **kwargs))

    @on_main_process
    def finish(self) -> None:
        self.call("finish", self.inner.finish)
        self.live = False


def build_trackers(
    names: list[str],
    output_dir: Path,
    project: str,
    wandb_kwargs: dict[str, Any],
    tensorboard_dir: Path | None = None,
) -> list[Guarded]:
    """Unstarted trackers for `Accelerator(log_with=...)`: cheap to build on every rank; `init_trackers` starts
    them on the main process only. TensorBoard writes to `tensorboard_dir` (--logging_dir; default
    output_dir/tensorboard), W&B to output_dir/wandb."""
    from accelerate.tracking import get_available_trackers

    available = {str(t) for t in get_available_trackers()}
    missing = [name for name in names if name not in available]
    if missing:
        raise ConfigError(
            f"--report_to: {', '.join(missing)} not installed here (installed: "
            f"{', '.join(sorted(available)) or 'none'}); pip install it or leave it out"
        )
    trackers = []
    for name in names:
        if name == "wandb":
            inner: GeneralTracker = SafeWandB(project, output_dir, dir=str(output_dir), **wandb_kwargs)
        elif name == "tensorboard":
            inner = TensorBoard("", str(tensorboard_dir or output_dir / "tensorboard"))
        else:
            cls = LOGGER_TYPE_TO_CLASS[name]
            inner = cls(project, str(output_dir / name)) if cls.requires_logging_directory else cls(project)
        trackers.append(Guarded(inner))
    return trackers


def flat_config(values: dict[str, Any]) -> dict[str, bool | int | float | str]:
    """Every tracker takes scalars (TensorBoard's hparams refuse None, lists and dicts): the rest as text."""
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in values.items()}
