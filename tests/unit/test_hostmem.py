"""Host memory: the trim gives freed heap pages back, and the rule trims creep, never a step's own working set."""

from __future__ import annotations

import psutil
import pytest

from qa_train.observe.hostmem import LEARN_STEPS, MIN_SLACK_BYTES, SPARE, HostMemory, _malloc_trim

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


def scripted(readings: list[float]) -> HostMemory:
    """A HostMemory reading RSS (in GiB) from a script: one reading at start, per reset, step and trim.
    Running out of readings raises StopIteration: a test that reads more than it scripted fails."""
    values = iter(readings)
    return HostMemory(trim=True, read_rss=lambda: int(next(values) * GIB))


def test_a_steps_own_working_set_is_never_trimmed() -> None:
    """BERT-base-like: weights, gradients and Adam state stay near 1.7 GiB and each step's activations come and
    go by 2-3 GiB on top. The first LEARN_STEPS batches only teach the allowance; the swings after them are
    never trimmed, where a fixed 256 MiB allowance trimmed on every step. A real rise beyond them is."""
    learning = [2.9, 4.1, 4.6, 3.9, 4.4, 4.9, 4.0, 4.5]
    swings = [4.6, 4.1, 4.8, 4.3, 4.7, 5.0, 4.2, 4.4]
    memory = scripted([0.5, 1.0, *learning, *swings, 6.2, 1.7, 4.8])
    memory.reset()  # 1.0
    assert len(learning) == LEARN_STEPS
    for _ in learning:
        memory.step()
    assert memory.trims == 0 and memory.slack == pytest.approx(SPARE * (4.9 - 1.0) * GIB, abs=2)
    for _ in swings:  # all within 1.0 + 4.875
        memory.step()
    assert memory.trims == 0 and memory.peak == int(5.0 * GIB)
    memory.step()  # 6.2: creep beyond the working set: trimmed to 1.7
    memory.step()  # 4.8 came straight back: it counts as working set, the allowance already covers it
    assert memory.trims == 1 and memory.floor == int(1.7 * GIB)
    assert memory.slack == pytest.approx(SPARE * 3.9 * GIB, abs=2)


def test_after_a_trim_what_comes_straight_back_widens_the_allowance() -> None:
    memory = scripted([0.5, 0.5, *[0.55] * LEARN_STEPS, 0.9, 0.5, 1.0, 1.1, 1.3, 0.5])
    memory.reset()
    for _ in range(LEARN_STEPS):
        memory.step()
    assert memory.slack == MIN_SLACK_BYTES  # 1.25 x 50 MiB is below the minimum
    memory.step()  # 0.9 > 0.5 + 0.25: trimmed to 0.5
    memory.step()  # 1.0: taken straight back: allowance 1.25 x 0.5 GiB
    assert memory.trims == 1 and memory.slack == pytest.approx(SPARE * 0.5 * GIB, abs=2)
    memory.step()  # 1.1: within 0.5 + 0.625
    memory.step()  # 1.3: beyond, trimmed to 0.5
    assert memory.trims == 2


def test_creep_beyond_the_working_set_is_trimmed() -> None:
    """Tiny-model-like: a small working set keeps the 256 MiB minimum; fragmentation creep past it is trimmed."""
    memory = scripted([0.5, 0.5, *[0.6] * LEARN_STEPS, 0.7, 0.8, 0.52, 0.55, 0.6, 0.79, 0.53, 0.56])
    memory.reset()  # 0.5
    for _ in range(LEARN_STEPS):
        memory.step()  # 0.6
    assert memory.slack == MIN_SLACK_BYTES
    memory.step()  # 0.7: within 0.5 + 0.25
    assert memory.trims == 0
    memory.step()  # 0.8 > 0.75: trimmed to 0.52
    assert memory.trims == 1 and memory.floor == int(0.52 * GIB)
    memory.step()  # 0.55: the next batch took back 30 MiB, less than the minimum allowance
    memory.step()  # 0.6: within 0.52 + 0.25
    memory.step()  # 0.79 > 0.77: trimmed again to 0.53
    memory.step()  # 0.56
    assert memory.trims == 2 and memory.floor == int(0.53 * GIB) and memory.peak == int(0.8 * GIB)
    assert memory.slack == MIN_SLACK_BYTES


def test_reset_starts_a_new_phase_and_off_never_trims() -> None:
    memory = scripted([2.0, 1.0, *[1.1] * LEARN_STEPS, 3.0, 1.2])
    memory.reset()  # 1.0: the peak of 2.0 before it is not this phase's
    for _ in range(LEARN_STEPS):
        memory.step()  # 1.1
    memory.step()  # 3.0 > 1.0 + 0.25: trimmed, reading once more
    assert memory.peak == 3 * GIB and memory.trims == 1
    off = HostMemory(trim=False, min_slack=0)
    off.step()
    off.step()
    off.trim()
    assert off.trims == 0


def _touch_and_free(mib: int) -> None:
    block = bytearray(b"\x01") * (mib * MIB)  # above glibc's mmap threshold: unmapped again on free
    del block


def test_training_peak_counts_what_a_step_frees_before_the_sample_and_the_lifetime_peak_survives() -> None:
    from qa_train.observe.hostmem import kernel_peak_bytes, lifetime_peak_bytes

    if kernel_peak_bytes() is None:
        pytest.skip("no /proc/self/status VmHWM on this system")
    _touch_and_free(300)  # an earlier phase's peak (loading, evaluation)
    lifetime_before = lifetime_peak_bytes()
    memory = HostMemory(trim=True)
    memory.reset()
    assert memory._kernel_restarted, "the kernel refused to restart its high-water mark (/proc/self/clear_refs)"
    _touch_and_free(200)  # a step's activations, gone before the step's sample
    memory.step()
    assert memory.peak - memory.floor < 50 * MIB  # the per-step sample alone sees nothing of it
    assert memory.peak_gib * GIB - memory.floor > 190 * MIB
    assert memory.peak_gib * GIB < lifetime_before  # the training peak is the training phase's alone
    assert lifetime_peak_bytes() >= lifetime_before  # ... while the lifetime peak is kept across the restart


def test_evaluation_inside_training_leaves_the_training_peak_alone() -> None:
    """The kernel's high-water mark sees everything: an evaluation's transient memory must not become
    training's peak (the mark is kept before, and restarted after, the excluded work)."""
    import numpy as np

    from qa_train.observe.hostmem import GIB, HostMemory

    memory = HostMemory(trim=True)
    memory.reset()
    before = memory.peak_gib
    with memory.excluded():
        block = np.ones(384 * 2**20 // 8)  # 384 MiB, touched
        memory.step()
        del block
    memory.trim()
    assert memory.peak_gib < before + 0.2, (before, memory.peak_gib)
    assert memory.peak_gib * GIB >= memory.floor * 0.5
