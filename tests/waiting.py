"""Waiting in tests, one way: `wait_for` polls until a condition holds (`wait_progressing`
too, for as long as a measure of progress keeps changing), `holds` polls over a window
and fails as soon as what it observes changes ("nothing changed" checks that can fail,
instead of a fixed sleep followed by one look).

Imported by the test modules and the support modules (`cluster_support`, `kube_support`)
directly: pytest puts tests/ on sys.path.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    pred: Callable[[], T],
    timeout: float,
    what: str,
    every: float = 0.1,
    *,
    check: Callable[[], object] | None = None,
    detail: Callable[[], str] | None = None,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call `pred` every `every` seconds until it returns something truthy, and return that.

    `check` runs before each try and may raise to fail at once (a process died, a consumer
    reported an error) rather than after the timeout. Exceptions of the `ignore` types
    count as "not yet"; the last one is reported on timeout. `detail` adds the state worth
    seeing to the timeout message. Raises TimeoutError after `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        if check is not None:
            check()
        try:
            value = pred()
            if value:
                return value
        except ignore as e:
            last = e
        if time.monotonic() >= deadline:
            msg = f"timed out after {timeout:.1f}s waiting for {what}"
            if detail is not None:
                msg += f" ({detail()})"
            if last is not None:
                msg += f" (last error: {last!r})"
            raise TimeoutError(msg) from last
        time.sleep(every)


def wait_progressing(
    pred: Callable[[], T],
    progress: Callable[[], object],
    stall: float,
    what: str,
    every: float = 0.1,
    *,
    detail: Callable[[], str] | None = None,
) -> T:
    """`wait_for` with a time allowed that follows the progress instead of a fixed one:
    fail (TimeoutError) only once `progress()` (a measure that changes as the system
    moves toward `pred`: offsets, a count of partitions done) has stayed the same for
    `stall` seconds. A loaded machine gets as long as it keeps moving; a stuck system
    fails after `stall` whatever the load. (The test's own timeout bounds the whole.)"""
    last = progress()
    moved = time.monotonic()
    while True:
        value = pred()
        if value:
            return value
        now = progress()
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved >= stall:
            msg = f"no progress for {stall:.1f}s waiting for {what} (stuck at {last!r})"
            if detail is not None:
                msg += f" ({detail()})"
            raise TimeoutError(msg)
        time.sleep(every)


def holds(
    observe: Callable[[], T],
    seconds: float,
    what: str,
    every: float = 0.2,
    *,
    expect: object = ...,
    check: Callable[[], object] | None = None,
) -> T:
    """Observe `observe()` repeatedly for `seconds` and fail (AssertionError) the moment
    its value differs from the first one, or from `expect` when given. Returns the value.

    Use it after a positive signal that the system has processed the event in question
    (a metadata offset, an observedGeneration, an Event), to check that the state stays
    as it is, not merely that it is so at one instant."""
    first = observe()
    if expect is not ... and first != expect:
        raise AssertionError(f"{what}: expected {expect!r}, got {first!r}")
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        time.sleep(every)
        if check is not None:
            check()
        now = observe()
        if now != first:
            took = time.monotonic() - start
            raise AssertionError(
                f"{what} changed after {took:.1f}s of {seconds:g}s: {first!r} -> {now!r}"
            )
    return first
