"""The points of a benchmark sweep: config x processes (or nodes) x repeat, and the batch each one trains with.

`qa_train.studies.bench` runs them locally, `qa_train.studies.slurm_sweep` submits them as SLURM jobs; both write each
point beside the run's metrics.json (`sweep_point.json`), which is how `qa_train.studies.report` groups the
repeats of a point and finds the smaller runs of the same config to compute speed-ups against.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

POINT_FILE = "sweep_point.json"
SCALINGS = ("weak", "strong")
DEFAULT_MICRO_BATCH = 12  # qa_train's own --per_device_train_batch_size default


class SweepError(ValueError):
    """A sweep that cannot be run as asked; the message names the flag."""


@dataclass(frozen=True)
class Point:
    """One run of a sweep. `label` is what the report groups repeats by (the config, or an ablation's name)."""

    label: str
    config: str
    processes: int  # in total over all nodes; 0 where the cluster decides (GPUs per node x nodes)
    nodes: int = 1
    repeat: int = 1
    slurm: bool = False
    extra: list[str] = field(default_factory=list)  # flags peculiar to this run (ablation flips, scaled batch)

    @property
    def name(self) -> str:
        """The run directory's name: <label>-p<processes>-r<repeat>, or -n<nodes> for SLURM points."""
        scale = f"n{self.nodes}" if self.slurm else f"p{self.processes}"
        return f"{self.label}-{scale}-r{self.repeat}"

    def write(self, run_dir: Path) -> None:
        (run_dir / POINT_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")


def read_point(run_dir: Path) -> Point | None:
    """The sweep point a run was made for, or None for a run made outside a sweep (or an unreadable file)."""
    path = run_dir / POINT_FILE
    try:
        raw = json.loads(path.read_text())
        return Point(**raw)
    except (OSError, ValueError, TypeError):
        return None


def with_repeats(points: list[Point], repeats: int) -> list[Point]:
    """Every point `repeats` times, interleaved (all points once, then all again): a slow spell of a shared
    machine then spreads over every config instead of landing on one."""
    return [replace(p, repeat=r) for r in range(1, repeats + 1) for p in points]


def flag_value(flags: list[str], name: str) -> str | None:
    """The value of --name as qa_train will read it: the last occurrence wins (--name v or --name=v)."""
    value = None
    for i, flag in enumerate(flags):
        if flag == f"--{name}" and i + 1 < len(flags):
            value = flags[i + 1]
        elif flag.startswith(f"--{name}="):
            value = flag.split("=", 1)[1]
    return value


def _int_flag(flags: list[str], name: str, default: int) -> int:
    raw = flag_value(flags, name)
    try:
        return default if raw is None else int(raw)
    except ValueError:
        raise SweepError(f"--{name} {raw!r}: not an integer") from None


def strong_scaling(points: list[Point], train_flags: list[str], global_batch: int | None) -> tuple[list[Point], int]:
    """Points with the per-device batch that keeps the global batch fixed, and that global batch.

    The per-device batch is divided (gradient accumulation is left as the flags set it): strong scaling
    asks how much faster the same optimizer steps run on more devices. The default global batch is the
    flags' per-device batch x accumulation at the smallest process count, so that run trains exactly as
    the flags say. Refused when a process count does not divide it.
    """
    micro = _int_flag(train_flags, "per_device_train_batch_size", DEFAULT_MICRO_BATCH)
    accum = _int_flag(train_flags, "gradient_accumulation_steps", 1)
    if any(p.processes <= 0 for p in points):
        raise SweepError("--scaling strong needs the process count of every point: give --procs_per_node")
    total = global_batch or micro * accum * min(p.processes for p in points)
    scaled = []
    for p in points:
        per_device, left = divmod(total, accum * p.processes)
        if left or per_device < 1:
            counts = sorted({q.processes for q in points})
            raise SweepError(
                f"--scaling strong: a global batch of {total} does not split evenly over {p.processes} "
                f"processes x {accum} accumulation step(s); give --global_batch_size as a multiple of "
                f"{accum} x each of {counts}"
            )
        scaled.append(replace(p, extra=[*p.extra, "--per_device_train_batch_size", str(per_device)]))
    return scaled, total
