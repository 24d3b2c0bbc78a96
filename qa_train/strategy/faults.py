"""A failed collective told apart: a rank that timed out, a peer that left, the ranks that failed."""

from __future__ import annotations

from qa_train.strategy.oom import is_out_of_memory


def failed_ranks(accelerator, failed: bool) -> list[int]:
    """The ranks for which `failed` is true, the same list on every rank (a collective): one sum over a flag per
    rank."""
    import torch

    flags = torch.zeros(accelerator.num_processes, device=accelerator.device)
    flags[accelerator.process_index] = float(failed)
    total = accelerator.reduce(flags, reduction="sum")
    return [rank for rank, flag in enumerate(total.tolist()) if flag > 0]


# torch raises a plain RuntimeError when a gloo collective fails (NCCL's watchdog aborts the process instead, after
# its own message): only the text tells a rank that stopped answering from one that went away.
_TIMED_OUT = (
    "Timed out waiting",
    "Application timeout caused pair closure",
    "Watchdog caught collective operation timeout",
)


_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "communicator was aborted")


def collective_fault(err: BaseException) -> str | None:
    """ "timeout" for a collective that waited past --ddp_timeout, "peer" for one whose peer went away (that rank's
    own lines say why), None for any other error."""
    text = str(err)
    if any(mark in text for mark in _TIMED_OUT):
        return "timeout"
    if any(mark in text for mark in _PEER_GONE):
        return "peer"
    return None


def run_fault(err: BaseException) -> bool:
    """Out of memory or a failed collective: the run's, not the fault of the file a save, load or export was at
    when it surfaced; __main__ tells it (exit 7 or 6) wherever it came from."""
    return is_out_of_memory(err) or collective_fault(err) is not None
