"""The loop the simulation CLIs share (bench/raft_sim.py, bench/replication_sim.py): run
a simulation per seed, print each failure with how to replay it, sum the stats, and
say how many seeds per second."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any


def run_seeds(
    seeds: Iterable[int],
    make: Callable[[int], Any],
    failure: type[Exception],
    one: bool,
    detail: Callable[[Any], str] = lambda sim: "",
) -> int:
    """`make(seed)` gives a simulation with `run()` -> stats and `replay`; `failure` is
    its invariant failure; `one`: a single seed replayed verbosely. Exit code: 1 if any
    seed failed."""
    seeds = list(seeds)
    failures: list[tuple[int, str]] = []
    totals: dict[str, int] = {}
    started = time.perf_counter()
    for seed in seeds:
        sim = make(seed)
        try:
            stats = sim.run()
        except failure as exc:
            failures.append((seed, str(exc)))
            print(f"FAIL seed {seed}: {exc}", flush=True)
            if one:
                traceback.print_exc()
            continue
        except Exception as exc:  # an assertion inside the core, or a crash: also a failure
            failures.append((seed, repr(exc)))
            print(f"FAIL seed {seed}: {exc!r} [replay: {sim.replay}]", flush=True)
            if one:
                traceback.print_exc()
            continue
        for k, v in stats.items():
            totals[k] = totals.get(k, 0) + v
        if one:
            print(f"seed {seed}: {stats}{detail(sim)}")
    elapsed = time.perf_counter() - started
    n = len(seeds)
    print(
        f"{n} seeds in {elapsed:.1f} s: {n / elapsed:.1f} seeds/s, {len(failures)} failed; "
        f"totals {totals}"
    )
    return 1 if failures else 0
