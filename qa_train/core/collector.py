"""Python's cycle collector over a rank's life: paused while the libraries import and the run is built, then told
that what exists by then lives to the end.

Importing torch, transformers and DeepSpeed and building a model leave hundreds of thousands of objects that live
until exit. The collector runs several full collections while they are made, each walking all of them, and any
full collection later, in a training step or an evaluation, walks them again. Frozen after the build
(`gc.freeze`), they are out of its sight: later collections walk only what the run makes from then on.
docs/benchmarks/2026-11-27-cpu-collector.md has the figures.

A process that calls qa_train's main() as a library (the tests, a notebook) keeps its own collector: only a
process that `pause`d it here (`python -m qa_train`, the launch agent) is settled.
"""

from __future__ import annotations

import gc

_paused = False


def pause() -> None:
    """No collection until `settle`: the process's start, where nearly everything made lives to the end."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def settle() -> None:
    """Collect once (start-up's cyclic garbage must not be frozen with the rest), freeze what is left, and collect
    from here on as usual. Again later (after the first steps: compiled graphs, optimizer state), it freezes what
    those made. Nothing where this process did not `pause` the collector."""
    if not _paused:
        return
    gc.collect()  # collects with the collector disabled too
    gc.freeze()
    gc.enable()


def thaw() -> None:
    """Hand every frozen object back to the collector: before a collection that must free the model's own reference
    cycles (FSDP2's modules hold the process group's pending work until they go)."""
    if _paused:
        gc.unfreeze()
