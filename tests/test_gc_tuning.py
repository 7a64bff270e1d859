"""The broker's and controller's collector policy (straitmq/gc_tuning.py): survivors of
a full collection are frozen, so later full collections skip them; garbage made after
is still collected; and a cycle among frozen objects is freed after the next full walk."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from straitmq import gc_tuning


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> Node:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a


@pytest.fixture
def policy() -> Iterator[gc_tuning._Policy]:
    gc.collect()
    p = gc_tuning.install(full_walk_every_s=3600)
    try:
        yield p
    finally:
        gc.callbacks.remove(p)
        gc.unfreeze()


def test_survivors_of_a_full_collection_are_frozen_and_new_garbage_still_goes(policy) -> None:
    assert gc_tuning.install() is policy  # once per process
    kept = [cycle() for _ in range(100)]
    gc.collect()
    frozen = gc.get_freeze_count()
    assert frozen >= 200  # the kept cycles (and everything else alive) are frozen
    # A full collection now walks only what is new: garbage cycles made after the
    # freeze are found and freed.
    dead = weakref.ref(cycle())
    assert dead() is not None
    assert gc.collect() >= 2 and dead() is None
    assert all(k.other is not None for k in kept)


def test_a_frozen_cycle_is_freed_after_the_next_full_walk(policy) -> None:
    held = [cycle()]
    gc.collect()  # frozen while still reachable
    ref = weakref.ref(held[0])
    held.clear()
    gc.collect()
    assert ref() is not None  # frozen: the collector does not look at it
    policy.full_walk_every_s = 0  # the period is over
    gc.collect()  # hands the frozen objects back
    assert ref() is not None and gc.get_freeze_count() == 0
    policy.full_walk_every_s = 3600
    gc.collect()  # walks everything
    assert ref() is None
    assert gc.get_freeze_count() > 0  # and freezes again
