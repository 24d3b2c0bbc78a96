"""The heap trimmer gives freed, fragmented heap pages back to the OS, and only when RSS grew."""

from __future__ import annotations

import psutil
import pytest

from qa_train.hostmem import HeapTrimmer, _malloc_trim

pytestmark = pytest.mark.skipif(_malloc_trim() is None, reason="needs glibc's malloc_trim")


def _rss() -> int:
    return psutil.Process().memory_info().rss


def test_trim_returns_freed_heap_pages() -> None:
    # 64 KiB blocks sit below glibc's mmap threshold, so they live on the heap; the last one pins
    # the top of the heap, so freeing the others alone gives nothing back.
    blocks = [bytearray(b"x" * (64 * 1024)) for _ in range(3000)]
    pin = blocks[-1]
    del blocks[:-1]
    before = _rss()
    trimmer = HeapTrimmer(enabled=True)
    trimmer.now()
    assert before - _rss() > 100 * 2**20, "malloc_trim released less than 100 MiB of ~190 MiB freed"
    assert trimmer.trims == 1 and trimmer.floor == pytest.approx(_rss(), rel=0.05)
    del pin


def test_tick_trims_only_past_the_slack() -> None:
    lazy = HeapTrimmer(enabled=True, slack=2**50)
    lazy.now()
    lazy.tick()
    assert lazy.trims == 1  # only the explicit one
    eager = HeapTrimmer(enabled=True, slack=0)
    eager.floor = 0
    eager.tick()
    assert eager.trims == 1
    off = HeapTrimmer(enabled=False, slack=0)
    off.tick()
    off.now()
    assert off.trims == 0
