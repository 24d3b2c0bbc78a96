"""Live progress on the main process: a tqdm bar on a terminal, a plain log line every few seconds where
stderr is a file (SLURM logs, CI), where a carriage-return bar would leave one unreadable line per redraw."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import IO, Any

log = logging.getLogger("qa_train")


def _columns(stream: IO[str]) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 0


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=int(seconds)))


@dataclass(frozen=True)
class ProgressOutput:
    """Whether and where progress shows."""

    enabled: bool
    """On the main process, unless --disable_tqdm."""
    interval_s: float
    """Seconds between log lines where the stream is not a terminal (--progress_interval_s)."""
    stream: IO[str] | None = None
    """stderr unless given."""


class Progress:
    """`update()` once per step (or batch); `note()` whenever a fresh loss or learning rate is known."""

    def __init__(
        self, label: str, total: int, done: int, unit: str, samples_per_unit: int, *, output: ProgressOutput
    ) -> None:
        self.interval_s = output.interval_s
        self.label, self.total, self.unit, self.samples_per_unit = label, total, unit, samples_per_unit
        self.start_done = self.done = done
        self.fields: dict[str, str] = {}
        self.t0 = self.last_line = time.monotonic()
        stream = output.stream or sys.stderr
        self.bar = None
        self.enabled = output.enabled and total > done
        if self.enabled and stream.isatty():
            from tqdm.auto import tqdm

            # A pseudo-terminal that was never given a size (docker -t, some job shells) reports 0 columns,
            # and tqdm then draws an empty bar: a fixed width there.
            sized = _columns(stream) > 0
            self.bar = tqdm(
                total=total,
                initial=done,
                desc=label,
                unit=unit,
                file=stream,
                dynamic_ncols=sized,
                ncols=None if sized else 100,
            )

    def note(self, **fields: float) -> None:
        self.fields.update({k: f"{v:.4g}" for k, v in fields.items()})
        if self.bar is not None:
            self.bar.set_postfix(self._postfix(), refresh=False)

    def _rate(self) -> float:
        return (self.done - self.start_done) * self.samples_per_unit / max(time.monotonic() - self.t0, 1e-9)

    def _postfix(self) -> dict[str, Any]:
        return {"samples/s": f"{self._rate():.1f}", **self.fields}

    def update(self, n: int = 1) -> None:
        if not self.enabled:
            return
        self.done += n
        if self.bar is not None:
            self.bar.set_postfix(self._postfix(), refresh=False)
            self.bar.update(n)
        elif time.monotonic() - self.last_line >= self.interval_s or self.done >= self.total:
            self.last_line = time.monotonic()
            log.info("%s", self.line())

    def line(self) -> str:
        elapsed = time.monotonic() - self.t0
        left = (self.total - self.done) * elapsed / max(self.done - self.start_done, 1)
        extra = "".join(f", {k} {v}" for k, v in self.fields.items())
        units = f"{self.unit}es" if self.unit.endswith(("ch", "sh", "s", "x")) else f"{self.unit}s"
        return (
            f"{self.label} {self.done}/{self.total} {units} ({100 * self.done / self.total:.0f}%), "
            f"{self._rate():.1f} samples/s{extra}, elapsed {_clock(elapsed)}, ETA {_clock(left)}"
        )

    def over(self, items: Iterable[Any]) -> Iterator[Any]:
        for item in items:
            yield item
            self.update()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
