"""--profile's trace shows Python's garbage collections, which stall a host-bound step without any operator."""

from __future__ import annotations

import gc

import torch

from qa_train.observe.profiling import mark_collections


def test_a_collection_inside_a_profiled_step_is_a_range_of_the_trace() -> None:
    stop = mark_collections()
    try:
        gc.collect(0)  # before the profiler: nothing to mark, nothing left open
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            torch.ones(4).sum()
            gc.collect(2)
            torch.ones(4).sum()
    finally:
        stop()
    stop()  # twice is harmless
    names = [e.name for e in prof.events()]
    assert names.count("python gc, generation 2") == 1, names
    assert all(cb.__qualname__ != "mark_collections.<locals>.callback" for cb in gc.callbacks)
