"""bench/fault_runs.py's history check, on histories with the anomalies put in (the
harness itself runs for an hour over real processes: bench/RESULTS.md has its table)."""

from __future__ import annotations

from cluster_support import Workload

from bench.fault_runs import Run, history, summarize, table


class _Acked:
    """What the check reads of a Workload: its acknowledgements and errors."""

    def __init__(self, acked: dict[bytes, tuple[int, int]]) -> None:
        self.acked = acked
        self.errors: dict = {}


def _run() -> Run:
    return Run("kill9", 0, 1, 1, 1.0)


def check(acked: dict[bytes, tuple[int, int]], got: list[tuple[int, int, bytes]]) -> Run:
    r = _run()
    w: Workload = _Acked(acked)  # type: ignore[assignment]
    history(w, got, r)
    return r


def test_a_clean_history_passes() -> None:
    acked = {b"t-0": (0, 0), b"t-1": (1, 0), b"t-2": (0, 1)}
    r = check(acked, [(0, 0, b"t-0"), (0, 1, b"t-2"), (1, 0, b"t-1")])
    assert r.ok() and (r.acked, r.consumed) == (3, 3)


def test_each_anomaly_is_caught() -> None:
    acked = {b"t-0": (0, 0), b"t-2": (0, 1), b"t-4": (0, 2)}
    lost = check(acked, [(0, 0, b"t-0"), (0, 1, b"t-2")])
    assert (lost.lost, lost.ok()) == (1, False)
    dup = check(acked, [(0, 0, b"t-0"), (0, 1, b"t-2"), (0, 2, b"t-4"), (0, 3, b"t-4")])
    assert (dup.duplicates, dup.ok()) == (1, False)
    moved = check(acked, [(0, 0, b"t-0"), (0, 1, b"t-2"), (0, 3, b"t-4")])
    assert (moved.moved, moved.ok()) == (1, False)
    swapped = check(acked, [(0, 0, b"t-0"), (0, 1, b"t-4"), (0, 2, b"t-2")])
    assert swapped.out_of_order == 1 and not swapped.ok()


def test_the_summary_names_the_bad_runs() -> None:
    good, bad = _run(), _run()
    bad.run, bad.lost = 7, 2
    bad.replicas_identical = False
    [row] = summarize([good, bad])
    assert row["bad_runs"] == [7] and row["lost"] == 2 and row["replicas_not_identical"] == 1
    assert "| kill9 | 2 |" in table([row])
