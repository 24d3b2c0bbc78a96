"""Run folders as finished runs leave them, without training: metrics.json written from the one schema run.py
writes it from, and the sweep_point.json of a bench sweep. What the report, the planner's check and the sweeps read."""

from __future__ import annotations

import json
from pathlib import Path

from qa_train.observe.schema import PerRank, RunMetrics
from qa_train.studies.sweep import Point


def fake_metrics(
    out: Path,
    strategy: str,
    world: int,
    samples_s: float,
    rss: float,
    em: float | None = None,
    f1: float | None = None,
    offload: str = "none",
    gpu: float | None = None,
    point: Point | None = None,
    batch: int = 8,
    compile_s: float | None = None,
) -> Path:
    """A metrics.json written from the one schema run.py writes it from, with the figures the report reads;
    with `point`, the sweep_point.json a bench sweep writes beside it."""
    out.mkdir(parents=True)
    if point is not None:
        point.write(out)
    mem = gpu if gpu is not None else rss

    def per_rank(v: float | None) -> PerRank:
        return PerRank(None if v is None else [v] * world, v, None if v is None else v * 0.9)

    metrics = RunMetrics(
        exact_match=em,
        f1=f1,
        train_samples_per_second=samples_s,
        train_tokens_per_second=samples_s * 150,
        train_padded_tokens_per_second=samples_s * 192,
        train_step_time_s_mean=0.5,
        tflops_per_device=0.01,
        mfu=0.412 if gpu is not None else None,
        peak_memory_source="cuda_max_allocated" if gpu is not None else "host_rss_during_training",
        peak_memory_gb=per_rank(mem),
        peak_memory_reserved_gb=per_rank(gpu),
        train_host_rss_gb=per_rank(rss),
        peak_host_rss_gb=per_rank(rss + 0.25),
        train_runtime_s=round(6 * 8 * world / samples_s, 3),
        train_steps=6,
        world_size=world,
        strategy=strategy,
        zero_stage=int(strategy[-1]) if strategy.startswith("zero") else None,
        offload=offload,
        mixed_precision="no",
        device="cpu",
        global_batch_size=batch * world,
        per_device_train_batch_size=batch,
        max_seq_length=192,
        num_parameters=1000,
        output_dir=str(out),
        args={"run_name": out.name},
        compile_time_s=compile_s,
        compiled_graphs=None if compile_s is None else 1,
    )
    (out / "metrics.json").write_text(json.dumps(metrics.to_json()))
    return out


def rewrite(run: Path, args: dict | None = None, **changes: object) -> Path:
    """Set keys of a fake run's metrics.json (None is written as null) and of its flags."""
    path = run / "metrics.json"
    payload = json.loads(path.read_text())
    payload.update(changes)
    payload["args"].update(args or {})
    path.write_text(json.dumps(payload))
    return run


def three_runs(root: Path) -> Path:
    """A single-process, a DDP and a ZeRO-2 run in `root`, the last without evaluation."""
    fake_metrics(root / "single", "single", 1, 40.0, 0.5, em=10.0, f1=20.5)
    fake_metrics(root / "ddp", "ddp", 2, 60.0, 0.6, em=11.0, f1=21.0)
    fake_metrics(root / "zero2", "zero2", 2, 50.0, 0.55, offload="optimizer")  # --no_eval: no EM/F1
    return root
