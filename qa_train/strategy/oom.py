"""Out of memory on a rank: told apart from other errors, and said in one line with what to change."""

from __future__ import annotations

import os
import re
import shlex

from qa_train.config.settings import TrainArgs

# The CPU allocator's failure is a plain RuntimeError: only its text tells it (CUDA's is torch.OutOfMemoryError).
_CPU_ALLOCATOR = "DefaultCPUAllocator: can't allocate memory"
SHARDING = (
    "or shard the model states with a zero2, zero3 or fsdp config (zero2_offload and zero3_offload move "
    "them to host memory); `{plan}` estimates each config's peak for this run"
)


class OutOfMemory(RuntimeError):
    """A phase of the run ran out of device or host memory; the message says where and what to change."""


def is_out_of_memory(err: BaseException) -> bool:
    return (
        isinstance(err, MemoryError)
        or type(err).__name__ == "OutOfMemoryError"
        or (isinstance(err, RuntimeError) and _CPU_ALLOCATOR in str(err))
    )


def what_failed(err: BaseException) -> str:
    """The allocation that failed, from the allocator's own message: "a 2.00 GiB allocation on a 79.11 GiB GPU"."""
    text = str(err)
    if (asked := re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", text)) is not None:
        total = re.search(r"total capacity of ([\d.]+ [KMGT]?i?B)", text)
        return f"a {asked[1]} allocation" + (f" on a {total[1]} GPU" if total else " on the GPU")
    if (asked := re.search(r"you tried to allocate (\d+) bytes", text)) is not None:
        return f"a {int(asked[1]) / 2**30:.2f} GiB allocation in host memory"
    return "an allocation"


def plan_command(args: TrainArgs, mixed_precision: str | None = None) -> str:
    """The qa_train.studies.planner command for this run's model, processes, device memory, batch and length: its estimate of
    every config's peak, copied from the error line. Said while handling an error, it must not raise another: the
    bare command stands in if anything here fails."""
    try:
        return _plan_command(args, mixed_precision)
    except Exception:  # noqa: BLE001
        return "qa-train plan"


def _plan_command(args: TrainArgs, mixed_precision: str | None) -> str:
    import psutil
    import torch

    model = args.model
    command = [
        "qa-train",
        "plan",
        *(
            ["--model_name_or_path", model.model_name_or_path]
            if model.model_name_or_path
            else ["--config_name", model.config_source]
        ),
    ]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    nodes = max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))
    command += ["--num_gpus", str(world), *(["--num_nodes", str(nodes)] if nodes > 1 else [])]
    if torch.cuda.is_available():
        memory = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        command += ["--gpu_memory_gib", f"{memory / 2**30:.0f}"]
        precision = mixed_precision or args.system.mixed_precision  # the flag where the run had not resolved it yet
        command += ["--mixed_precision", precision] if precision in ("bf16", "fp16", "no") else []
    else:  # CPU processes share the host's memory; the planner counts them in fp32
        command += [
            "--gpu_memory_gib",
            f"{psutil.virtual_memory().total / 2**30 / (world // nodes):.0f}",
            "--device",
            "cpu",
        ]
    command += [
        "--per_device_train_batch_size",
        str(args.data.per_device_train_batch_size),
        "--max_seq_length",
        str(args.data.max_seq_length),
    ]
    if args.system.gradient_checkpointing:
        command.append("--gradient_checkpointing")
    return shlex.join(command)


def in_training_step(
    err: BaseException, step: int, samples: int, width: int, accumulation: int, plan: str
) -> OutOfMemory:
    return OutOfMemory(
        f"out of memory at training step {step} ({what_failed(err)}; a micro-batch of {samples} windows x {width} "
        "tokens): lower --per_device_train_batch_size and raise --gradient_accumulation_steps "
        f"({accumulation} now) to keep the global batch, add --gradient_checkpointing, {SHARDING.format(plan=plan)}"
    )


def in_evaluation(err: BaseException, samples: int, width: int) -> OutOfMemory:
    """In evaluation, --do_predict or qa_train.predict: all three take --per_device_eval_batch_size."""
    return OutOfMemory(
        f"out of memory in inference ({what_failed(err)}; a batch of {samples} windows x {width} tokens): "
        "lower --per_device_eval_batch_size"
    )


def elsewhere(err: BaseException, where: str, plan: str) -> str:
    """An out-of-memory error outside a step or an evaluation batch (building, moving or loading the model)."""
    return f"out of memory{where}: {what_failed(err)} failed; {SHARDING.removeprefix('or ').format(plan=plan)}"
