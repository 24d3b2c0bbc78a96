"""metrics.json: one typed definition, written by the run and read by the report, tracker and tests.

Every key a run writes is a field here; `RunMetrics.from_json` is the one reader, so a field
renamed here breaks every reader at once instead of leaving one silently reading `None`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Kept for reading runs written before a field existed; everything else may be None but must be present.
REQUIRED = ("strategy", "world_size", "train_samples_per_second")


class MetricsFileError(ValueError):
    """A metrics.json that cannot be read as a qa_train run; the message names the file."""


@dataclass
class PerRank:
    """One figure on every rank (gathered before reporting), with its max and mean over ranks."""

    per_rank: list[float] | None = None
    max: float | None = None
    mean: float | None = None

    @classmethod
    def of(cls, values: list[float]) -> PerRank:
        """NaN marks a figure a rank cannot measure (CUDA memory on CPU): left out of max and mean."""
        clean = [v for v in values if v == v]
        if not clean:
            return cls()
        return cls([round(v, 4) for v in values], round(max(clean), 4), round(sum(clean) / len(clean), 4))


@dataclass
class TrainFigures:
    """Throughput and memory of the training phase, summarised over ranks (`metrics.summarize`)."""

    train_samples_per_second: float | None = None
    """Training windows per second, all ranks together, over the timed steps."""
    train_tokens_per_second: float | None = None
    """Non-padding tokens per second, all ranks together."""
    train_padded_tokens_per_second: float | None = None
    """Tokens per second including padding: what the device computed."""
    train_step_time_s_mean: float | None = None
    """Mean seconds per optimizer step of the slowest rank."""
    timed_steps: int | None = None
    """Optimizer steps timed (all after --throughput_warmup_steps)."""
    tflops_per_device: float | None = None
    """Achieved training TFLOP/s per device: each batch's FLOPs at its padded width, per second."""
    mfu: float | None = None
    """Model FLOPs utilisation against the GPU's dense 16-bit peak; None on CPU, fp32 or unknown GPUs."""
    peak_memory_source: str | None = None
    """What peak_memory_gb measures: cuda_max_allocated or host_rss_during_training."""
    peak_memory_gb: PerRank = field(default_factory=PerRank)
    """Peak memory of the training phase per rank, GiB (CUDA max allocated, else host RSS)."""
    peak_memory_reserved_gb: PerRank = field(default_factory=PerRank)
    """CUDA max reserved by the caching allocator per rank, GiB; empty on CPU."""
    train_host_rss_gb: PerRank = field(default_factory=PerRank)
    """Host RSS peak of the training phase per rank, GiB: the kernel's high-water mark (VmHWM) since the first
    step where Linux lets it be restarted, else RSS sampled once per step."""
    host_rss_baseline_gb: PerRank = field(default_factory=PerRank)
    """Host RSS per rank right before the model's parameters were created (libraries, model code, data and
    process group already in memory), GiB: the idle baseline. train_host_rss_gb minus this is what model
    states and activations took on CPU, the figure `qa_train.studies.planner` estimates."""
    peak_host_rss_gb: PerRank = field(default_factory=PerRank)
    """Lifetime host RSS peak per rank (loading and evaluation included), GiB."""
    compile_time_s: float | None = None
    """With --torch_compile: wall seconds torch.compile spent compiling in the training loop (the slowest rank;
    in-training evaluations' graphs included), part of train_runtime_s; None without compiling."""
    compiled_graphs: int | None = None
    """With --torch_compile: distinct graphs compiled in the training loop. More than the first step's mean
    recompiles (a new batch shape, a guard that failed) or graph breaks."""
    compile_cache_hits: int | None = None
    """With --torch_compile: inductor graphs (each compiled graph's forward and backward) that the slowest-compiling
    rank loaded from inductor's on-disk cache (TORCHINDUCTOR_CACHE_DIR) in the training loop."""
    compile_cache_misses: int | None = None
    """With --torch_compile: inductor graphs that rank built anew. A warm run has none; a slow compile without
    misses is tracing, autotuning or CUDA graph recording, not kernel builds."""
    load_average_1m: float | None = None
    """The 1-minute load average at the end of training (the busiest node): runnable processes, this run's own
    included. Beside cpu_count it says whether the machine was shared."""
    other_processes_cpu_cores: float | None = None
    """CPU cores that processes outside this run kept busy during training, on average (the node where they kept
    the most): speed measured beside them is the machine's as much as the strategy's (the report warns)."""
    cpu_count: int | None = None
    """Logical CPUs of the (main) node."""


@dataclass
class Scores:
    """SQuAD scores of the run, first in metrics.json because they are what a reader looks for first."""

    exact_match: float | None = None
    """SQuAD exact match (0-100) after training; None with --no_eval."""
    f1: float | None = None
    """SQuAD token F1 (0-100) after training; None with --no_eval."""
    initial_exact_match: float | None = None
    """Exact match before this run trained (--eval_on_start): of the untrained model, or of the
    resumed one when initial_eval_step > 0."""
    initial_f1: float | None = None
    """F1 before this run trained (--eval_on_start); see initial_eval_step."""
    initial_eval_step: int | None = None
    """Optimizer step of the model the initial_* scores are for: 0 untrained, N resumed from step N."""
    best_eval_step: int | None = None
    """Step of the best F1 among the evaluations during training (--eval_strategy) and the final one."""
    best_exact_match: float | None = None
    """Exact match at best_eval_step."""
    best_f1: float | None = None
    """F1 at best_eval_step."""
    exported_step: int | None = None
    """Step of the model in output_dir/final: the last step, or best_eval_step with --save_best."""
    squad_v2: dict[str, Any] | None = None
    """With --version_2_with_negative: the official SQuAD v2.0 metrics of the final evaluation (exact, f1,
    total, HasAns_*, NoAns_*, best_exact, best_exact_thresh, best_f1, best_f1_thresh); exact_match and f1
    above are its exact and f1. None for SQuAD v1.1."""


@dataclass
class RunMetrics(TrainFigures, Scores):
    """Everything a finished run reports; metrics.json's keys in order (Scores, TrainFigures, then these)."""

    train_runtime_s: float | None = None
    """Wall seconds of the training loop (first step to last, checkpoints included)."""
    checkpoint_runtime_s: float | None = None
    """Wall seconds of this run's checkpoint saves (main process), part of train_runtime_s but left out of the
    throughput figures, as evaluation is."""
    eval_runtime_s: float | None = None
    """Wall seconds of the final evaluation; None without one."""
    total_runtime_s: float | None = None
    """Wall seconds from the run's start (its build included; the process's imports before it are
    startup_process_s) to metrics.json (written after the export and the final evaluation; after a failed
    export too)."""
    startup_s: float | None = None
    """Wall seconds until the run was built, ready to train or evaluate, on its slowest rank: from the launch's
    start where `qa-train launch` or slurm/train.sbatch stamped it, else from the process's start, else (main()
    called in a process of the caller's) from the call; the sum of the startup_*_s parts that are known."""
    startup_launch_s: float | None = None
    """Of startup_s: from the launch's stamp until this rank's process began (`qa-train launch`'s launcher and
    accelerate's or torchrun's agent; under slurm/train.sbatch the batch script and srun too); None without a
    stamp (another launcher)."""
    startup_process_s: float | None = None
    """Of startup_s: the rank's process until the run began (Python, imports, flags, reading the data files);
    None where main() was called in a process of the caller's."""
    startup_build_s: float | None = None
    """Of startup_s: building the run (accelerator, windows, model, optimizer, prepare, resume)."""
    train_steps: int | None = None
    """Optimizer steps completed (a resumed run counts the steps before its checkpoint)."""
    train_loss: float | None = None
    """Mean training loss over all ranks in the last logging interval."""
    train_loss_per_rank: list[float | None] = field(default_factory=list)
    """The same loss as each rank saw it after the all-reduce (equal when ranks agree); null where no step was
    logged."""
    world_size: int | None = None
    """Processes in the data-parallel world."""
    strategy: str | None = None
    """single, ddp, fsdp, zero1, zero2 or zero3, read from the live accelerator."""
    zero_stage: int | None = None
    """DeepSpeed ZeRO stage; None outside DeepSpeed."""
    offload: str | None = None
    """none, optimizer, params or optimizer+params."""
    distributed_type: str | None = None
    """accelerate's distributed type as it names it (MULTI_GPU, MULTI_CPU, DEEPSPEED, FSDP, NO)."""
    mixed_precision: str | None = None
    """no, fp16 or bf16, as resolved for this run."""
    device: str | None = None
    """GPU name, or cpu."""
    num_parameters: int | None = None
    """Trainable parameters of the model (the real size under ZeRO-3 partitioning)."""
    num_train_examples: int | None = None
    """Training questions."""
    num_train_features: int | None = None
    """Training windows."""
    num_eval_examples: int | None = None
    """Evaluation questions."""
    num_eval_features: int | None = None
    """Evaluation windows."""
    global_batch_size: int | None = None
    """Windows per optimizer step: micro-batch x accumulation x world size."""
    per_device_train_batch_size: int | None = None
    """Micro-batch per process."""
    max_seq_length: int | None = None
    """Tokens per window."""
    output_dir: str | None = None
    """The run directory."""
    qa_train_version: str | None = None
    """qa_train's version that wrote the file."""
    args: dict[str, Any] = field(default_factory=dict)
    """Every flag of the run, flat: {flag: value}."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, payload: dict[str, Any], where: str = "metrics.json") -> RunMetrics:
        """Read what to_json wrote; keys unknown to this version are ignored, REQUIRED ones must be there."""
        missing = [k for k in REQUIRED if k not in payload]
        if missing:
            raise MetricsFileError(f"{where}: metrics.json lacks {', '.join(missing)}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        values = {k: v for k, v in payload.items() if k in known}
        for name, f in known.items():
            if f.type == "PerRank" and isinstance(values.get(name), dict):
                values[name] = PerRank(**values[name])
        return cls(**values)

    @classmethod
    def read(cls, run_dir: Path) -> RunMetrics:
        path = run_dir / "metrics.json"
        if not path.is_file():
            raise MetricsFileError(f"{run_dir}: no metrics.json (did the run finish?)")
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise MetricsFileError(f"{run_dir}: metrics.json cannot be read: {err.strerror or err}") from None
        except (ValueError, RecursionError) as err:  # not UTF-8, not JSON, or JSON no parser can hold
            raise MetricsFileError(f"{run_dir}: metrics.json is not valid JSON: {err}") from None
        return cls.from_json(payload, str(run_dir))
