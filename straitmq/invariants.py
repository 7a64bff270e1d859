"""One check for the invariants of every process: a broken invariant stops the process.

A state machine whose state is known to be wrong (a Raft node, a consumer group, a
share-partition, a log) must not go on voting, coordinating or answering: `check` and
`broken` log which invariant broke, with its facts, and end the process at once with
`EXIT_INVARIANT`. They are plain functions, so `python -O` keeps them (it strips
`assert`), and they end the process with `os._exit`, so no `except` clause, task or
`finally` on the way can swallow the failure. A supervisor (Kubernetes, systemd)
restarts the process from its durable state.

    check(hw >= self._hw, "the high watermark never decreases", old=self._hw, new=hw)
    if not isinstance(resp, JoinResponse):  # narrows the type, as `broken` never returns
        broken("a JoinGroup gets a JoinGroup answer", got=type(resp).__name__)

Deterministic simulations and in-process tests need the failure as an exception (to
name the seed that broke it, or to check that it breaks): within `raising()` a broken
invariant raises `InvariantBroken` instead, and is also recorded, so that one an
`except` clause swallowed is still seen.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

# EX_SOFTWARE (sysexits.h): the process stopped itself on a broken invariant. The one
# exit code for it in every StraitMQ process.
EXIT_INVARIANT = 70

log = logging.getLogger("straitmq.invariants")

_SCALARS = (str, int, float, bool, type(None))


class InvariantBroken(AssertionError):
    """Raised instead of stopping the process, within `raising()` only. An
    AssertionError, as a failed `assert` would be in a test."""

    def __init__(self, invariant: str, facts: dict[str, object]) -> None:
        super().__init__(describe(invariant, facts))
        self.invariant = invariant
        self.facts = facts


def describe(invariant: str, facts: dict[str, object]) -> str:
    """One line naming the invariant and its facts (also where logging is plain text)."""
    shown = ", ".join(f"{k}={v!r}" for k, v in facts.items())
    return f"invariant broken: {invariant}" + (f" ({shown})" if shown else "")


def _stop(invariant: str, facts: dict[str, object]) -> NoReturn:
    """The default action: log, flush, and end the process without unwinding."""
    try:
        current = sys.exc_info()  # an exception being handled led here: show it too
        log.critical(
            describe(invariant, facts),
            extra={"invariant": invariant, "facts": facts, "exit_code": EXIT_INVARIANT},
            exc_info=current if current[0] is not None else None,
            stack_info=True,
        )
        logging.shutdown()  # flushes every handler: the line must be out before we go
        sys.stderr.flush()
        sys.stdout.flush()
    finally:
        os._exit(EXIT_INVARIANT)


# Innermost `raising()` first: where broken invariants are recorded. Empty: stop.
_recorders: list[list[InvariantBroken]] = []


def broken(invariant: str, **facts: object) -> NoReturn:
    """The invariant named `invariant` does not hold; `facts` say what was seen (plain
    values as they are, anything else as its repr)."""
    plain: dict[str, object] = {
        k: v if isinstance(v, _SCALARS) else repr(v) for k, v in facts.items()
    }
    if not _recorders:
        _stop(invariant, plain)
    error = InvariantBroken(invariant, plain)
    _recorders[-1].append(error)
    raise error


def check(condition: bool, invariant: str, **facts: object) -> None:
    """Stop the process (see `broken`) unless `condition` holds. The facts are built
    before the call: on a hot path write `if not ...: broken(...)` instead."""
    if not condition:
        broken(invariant, **facts)


@contextmanager
def raising() -> Iterator[list[InvariantBroken]]:
    """Within: a broken invariant raises InvariantBroken instead of stopping the
    process, and is appended to the list this yields (the innermost `raising()` only).
    For simulations and tests in one process; never in a product process."""
    seen: list[InvariantBroken] = []
    _recorders.append(seen)
    try:
        yield seen
    finally:
        # By identity: list.remove compares by value, and empty records are all equal.
        del _recorders[next(i for i, r in enumerate(_recorders) if r is seen)]
