"""Host memory: the trim gives freed heap pages back, and the rule trims creep, never a step's own working set."""

from __future__ import annotations

from collections.abc import Iterator

import psutil
import pytest

from qa_train.hostmem import MIN_SLACK_BYTES, HostMemory, _malloc_trim

pytestmark = pytest.mark.skipif(_malloc_trim() is None, reason="needs glibc's malloc_trim")
MIB, GIB = 2**20, 2**30


def _rss() -> int:
    return psutil.Process().memory_info().rss


def test_trim_returns_freed_heap_pages() -> None:
    # 64 KiB blocks sit below glibc's mmap threshold, so they live on the heap; the last one pins
    # the top of the heap, so freeing the others alone gives nothing back.
    blocks = [bytearray(b"x" * (64 * 1024)) for _ in range(3000)]
    pin = blocks[-1]
    del blocks[:-1]
    before = _rss()
    memory = HostMemory(trim=True)
    memory.trim()
    assert before - _rss() > 100 * MIB, "malloc_trim released less than 100 MiB of ~190 MiB freed"
    assert memory.trims == 1 and memory.floor == pytest.approx(_rss(), rel=0.05)
    del pin


def scripted(readings: list[float]) -> tuple[HostMemory, Iterator[float]]:
    """A HostMemory reading RSS (in GiB) from a script: one reading per reset, step and trim."""
    values = iter(readings)
    return HostMemory(trim=True, read_rss=lambda: int(next(values) * GIB)), values


def test_a_steps_own_working_set_is_never_trimmed() -> None:
    """BERT-base-like: the first step grows RSS by 4 GiB (activations, gradients, Adam state) and later steps
    swing by GBs within that. Only the first overshoot of the pre-training floor trims (down to the state that
    persists, 2.5 GiB); the swings after it never do, where a fixed 256 MiB allowance trimmed on every step."""
    swings = [3.1, 5.0, 2.9, 5.1, 3.3, 4.9, 6.0]
    memory, _ = scripted([1.0, 1.0, 5.0, 4.0, 5.2, 2.5, *swings])  # __init__, reset, steps (a trim reads once more)
    memory.reset()
    memory.step()
    assert memory.step_growth == 4 * GIB and memory.slack == 4 * GIB
    memory.step()  # 4.0: within 1.0 + 4.0
    memory.step()  # 5.2: beyond it, trimmed to 2.5
    assert memory.trims == 1 and memory.floor == int(2.5 * GIB)
    for _ in swings:  # all within 2.5 + 4.0
        memory.step()
    assert memory.trims == 1 and memory.peak == int(6.0 * GIB)


def test_creep_beyond_the_allowance_is_trimmed() -> None:
    """Tiny-model-like: a first step of 50 MiB leaves the 256 MiB minimum; fragmentation creep past it trims."""
    memory, _ = scripted([0.5, 0.5, 0.55, 0.6, 0.7, 0.8, 0.52, 0.6, 0.79, 0.53])
    memory.reset()
    memory.step()  # 0.55: the first step only measures its growth
    assert memory.slack == MIN_SLACK_BYTES
    memory.step()  # 0.6: within 0.5 + 0.25
    memory.step()  # 0.7: within
    assert memory.trims == 0
    memory.step()  # 0.8 > 0.75: trim, after which RSS reads 0.52
    assert memory.trims == 1 and memory.floor == int(0.52 * GIB)
    memory.step()  # 0.6: within 0.52 + 0.25
    memory.step()  # 0.79 > 0.77: trim again -> 0.53
    assert memory.trims == 2 and memory.floor == int(0.53 * GIB) and memory.peak == int(0.8 * GIB)


def test_reset_starts_a_new_phase_and_off_never_trims() -> None:
    memory, _ = scripted([2.0, 1.0, 1.1, 3.0, 1.2])
    memory.reset()  # 1.0: the peak of 2.0 before it is not this phase's
    memory.step()  # 1.1
    memory.step()  # 3.0 > 1.0 + 0.25: would trim, and reads once more
    assert memory.peak == 3 * GIB and memory.trims == 1
    off = HostMemory(trim=False, min_slack=0)
    off.step()
    off.step()
    off.trim()
    assert off.trims == 0
