"""qa_train/core/collector.py: the collector paused through a rank's start, what the start made frozen once the run is
built, the start's cyclic garbage freed rather than frozen; a process that did not pause it keeps its own."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from conftest import freeze_what_lives

from qa_train.core import collector


class Node:
    """An object in a reference cycle: only the collector frees it."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def own_collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This pytest process's collector as it was, whatever the test did to it: enabled or not, and what lives frozen
    (the session's start froze it, tests/conftest.py)."""
    monkeypatch.setattr(collector, "_paused", False)
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    freeze_what_lives()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def in_sight(obj: object) -> bool:
    """Whether the collector walks `obj` (a frozen object is in no generation). Not gc.get_freeze_count(): frozen
    objects that die by reference counting leave it at any moment."""
    return any(o is obj for o in gc.get_objects())


def test_a_paused_start_is_frozen_once_settled_and_its_cyclic_garbage_is_freed(own_collector: None) -> None:
    collector.pause()
    assert not gc.isenabled()
    kept, dropped = Node(), Node()
    gone = weakref.ref(dropped)
    del dropped
    collector.settle()
    assert gc.isenabled()
    assert gone() is None, "the start's cyclic garbage was frozen instead of freed"
    assert not in_sight(kept)
    collector.thaw()
    assert gc.get_freeze_count() == 0 and in_sight(kept)


def test_settling_again_freezes_what_was_made_since(own_collector: None) -> None:
    collector.pause()
    collector.settle()
    later = Node()
    assert in_sight(later)
    collector.settle()
    assert not in_sight(later)


def test_a_process_that_did_not_pause_keeps_its_collector(own_collector: None) -> None:
    """qa_train's main() run as a library (the tests' in-process runs, a notebook): nothing of its caller's is frozen,
    and what the caller froze stays frozen."""
    mine, theirs = Node(), Node()
    gc.freeze()  # the caller's own: `theirs` with it
    collector.settle()
    collector.thaw()
    later = Node()
    collector.settle()
    assert not in_sight(mine) and not in_sight(theirs)  # still frozen: thaw left them
    assert in_sight(later)  # not frozen: settle left it


def test_a_collector_disabled_by_its_process_is_left_disabled(own_collector: None) -> None:
    gc.disable()
    collector.pause()  # not this module's pause: the process had its own reason
    mine = Node()
    collector.settle()
    assert not gc.isenabled() and in_sight(mine)
