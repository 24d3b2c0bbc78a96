"""Out of memory on a rank: told apart from other errors, and said in one line with what to change."""

from __future__ import annotations

import re

# The CPU allocator's failure is a plain RuntimeError: only its text tells it (CUDA's is torch.OutOfMemoryError).
_CPU_ALLOCATOR = "DefaultCPUAllocator: can't allocate memory"
SHARDING = ("or shard the model states with a zero2, zero3 or fsdp config (zero2_offload and zero3_offload move "
            "them to host memory); python -m qa_train.plan estimates each config's peak for this model and batch")


class OutOfMemory(RuntimeError):
    """A phase of the run ran out of device or host memory; the message says where and what to change."""


def is_out_of_memory(err: BaseException) -> bool:
    return (isinstance(err, MemoryError) or type(err).__name__ == "OutOfMemoryError"
            or (isinstance(err, RuntimeError) and _CPU_ALLOCATOR in str(err)))


def what_failed(err: BaseException) -> str:
    """The allocation that failed, from the allocator's own message: "a 2.00 GiB allocation on a 79.11 GiB GPU"."""
    text = str(err)
    if (asked := re.search(r"Tried to allocate ([\d.]+ [KMGT]?i?B)", text)) is not None:
        total = re.search(r"total capacity of ([\d.]+ [KMGT]?i?B)", text)
        return f"a {asked[1]} allocation" + (f" on a {total[1]} GPU" if total else " on the GPU")
    if (asked := re.search(r"you tried to allocate (\d+) bytes", text)) is not None:
        return f"a {int(asked[1]) / 2**30:.2f} GiB allocation in host memory"
    return "an allocation"


def in_training_step(err: BaseException, step: int, samples: int, width: int, accumulation: int) -> OutOfMemory:
    return OutOfMemory(
        f"out of memory at training step {step} ({what_failed(err)}; a micro-batch of {samples} windows x {width} "
        "tokens): lower --per_device_train_batch_size and raise --gradient_accumulation_steps "
        f"({accumulation} now) to keep the global batch, add --gradient_checkpointing, {SHARDING}")


def in_evaluation(err: BaseException, samples: int, width: int) -> OutOfMemory:
    """In evaluation, --do_predict or qa_train.predict: all three take --per_device_eval_batch_size."""
    return OutOfMemory(
        f"out of memory in inference ({what_failed(err)}; a batch of {samples} windows x {width} tokens): "
        "lower --per_device_eval_batch_size")


def elsewhere(err: BaseException, where: str) -> str:
    """An out-of-memory error outside a step or an evaluation batch (building, moving or loading the model)."""
    return f"out of memory{where}: {what_failed(err)} failed; {SHARDING.removeprefix('or ')}"
