"""bench/fault_runs.py's transactional history check (`--workload txn`), on synthetic
histories with each anomaly put in: the harness runs for an hour over real processes
(bench/RESULTS.md has its table), so here the checker alone shows it can fail."""

from __future__ import annotations

from bench.fault_runs import Rec, Run, Txn, eos_history, summarize, table, txn_history

T = "kill9-0"


def _txn(n: int, outcome: str, parts: list[int], seq0: int) -> Txn:
    """A transaction of values on partitions `parts` of T, seq from `seq0`, delivered at
    offsets seq0, seq0+1, ... (one partition per value keeps offsets simple)."""
    t = Txn(n, [(T, p, f"{T}-{n}-{seq0 + k}".encode()) for k, p in enumerate(parts)])
    t.outcome = outcome
    t.offsets = {v: (T, p, seq0 + k) for k, (_, p, v) in enumerate(t.values)}
    return t


def _history() -> list[Txn]:
    return [
        _txn(0, "committed", [0, 1], 0),
        _txn(1, "aborted", [0, 2], 2),
        _txn(2, "committed", [1, 2, 0], 4),
        _txn(3, "unknown", [2], 7),
    ]


def _reads(txns: list[Txn], outcomes: tuple[str, ...]) -> list[Rec]:
    return [(*t.offsets[v], v) for t in txns if t.outcome in outcomes for *_, v in t.values]


def check(txns: list[Txn], committed: list[Rec], uncommitted: list[Rec] | None = None) -> Run:
    r = Run("kill9", 0, 1, 1, 1.0, workload="txn")
    txn_history(txns, committed, uncommitted, r)
    return r


def test_a_clean_history_passes() -> None:
    txns = _history()
    r = check(txns, _reads(txns, ("committed",)), _reads(txns, ("committed", "aborted")))
    assert r.ok(), r
    assert (r.txns, r.committed_txns, r.aborted_txns, r.unknown_txns) == (4, 2, 1, 1)
    assert (r.acked, r.consumed, r.aborted_written, r.unknown_committed) == (5, 5, 2, 0)
    # An unknown outcome read whole was committed after all: fine, and counted.
    whole = check(txns, _reads(txns, ("committed", "unknown")))
    assert whole.ok() and whole.unknown_committed == 1


def test_an_aborted_value_read_is_caught() -> None:
    txns = _history()
    aborted = _reads([txns[1]], ("aborted",))
    r = check(txns, _reads(txns, ("committed",)) + aborted)
    assert (r.aborted_reads, r.partial, r.ok()) == (2, 0, False)
    r = check(txns, _reads(txns, ("committed",)) + aborted[:1])  # one of its two
    assert (r.aborted_reads, r.partial, r.ok()) == (1, 1, False)


def test_a_committed_value_missing_is_lost_and_partial() -> None:
    txns = _history()
    reads = _reads(txns, ("committed",))
    r = check(txns, reads[:-1])
    assert (r.lost, r.partial, r.ok()) == (1, 1, False)
    r = check(txns, reads[2:])  # all of transaction 0: lost, not partial
    assert (r.lost, r.partial, r.ok()) == (2, 0, False)


def test_an_unknown_outcome_must_be_all_or_nothing() -> None:
    txns = _history()
    txns[3] = _txn(3, "unknown", [2, 0], 7)
    half = _reads([txns[3]], ("unknown",))[:1]
    r = check(txns, _reads(txns, ("committed",)) + half)
    assert (r.partial, r.lost, r.aborted_reads, r.ok()) == (1, 0, 0, False)


def test_duplicates_moves_order_and_strays_are_caught() -> None:
    txns = _history()
    reads = _reads(txns, ("committed",))
    dup = check(txns, reads + reads[:1])
    assert (dup.duplicates, dup.ok()) == (1, False)
    topic, p, o, v = reads[0]
    moved = check(txns, [(topic, p, o + 10, v), *reads[1:]])
    assert (moved.moved, moved.ok()) == (1, False)
    # partition 0 holds seq 0 (offset 0) then seq 6 (offset 6): swap their offsets
    p0 = sorted(x for x in reads if x[1] == 0)
    assert [x[3] for x in p0] == [f"{T}-0-0".encode(), f"{T}-2-6".encode()]
    swapped = [x for x in reads if x[1] != 0] + [
        (T, 0, p0[1][2], p0[0][3]),
        (T, 0, p0[0][2], p0[1][3]),
    ]
    ooo = check(txns, swapped)
    assert ooo.out_of_order == 1 and not ooo.ok()
    stray = check(txns, [*reads, (T, 1, 99, b"nobody-sent-this")])
    assert (stray.strays, stray.ok()) == (1, False)


def test_hanging_and_the_summary() -> None:
    txns = _history()
    good = check(txns, _reads(txns, ("committed",)))
    bad = check(txns, _reads(txns, ("committed",)))
    bad.run, bad.hanging = 3, 2
    assert good.ok() and not bad.ok()
    [row] = summarize([good, bad])
    assert row["bad_runs"] == [3] and row["hanging"] == 2 and row["txns"] == 8
    assert row["workload"] == "txn" and "| kill9 | 2 | 8 | 4 / 2 / 2 (0) |" in table([row])


def test_the_exactly_once_leg_check() -> None:
    inputs: list[Rec] = [(T, 0, 0, b"a"), (T, 1, 0, b"b"), (T, 1, 1, b"c")]
    out = [(f"{T}-out", p, o, b"out:" + v) for _t, p, o, v in inputs]

    def eos(outputs: list[Rec]) -> Run:
        r = Run("kill9", 0, 1, 1, 1.0, workload="txn")
        eos_history(inputs, outputs, r)
        return r

    r = eos(out)
    assert r.ok() and (r.eos_in, r.eos_out) == (3, 3)
    assert (eos(out[1:]).eos_lost, eos(out[1:]).ok()) == (1, False)
    assert (eos([*out, out[0]]).eos_duplicated, eos([*out, out[0]]).ok()) == (1, False)
    aborted_input = (f"{T}-out", 0, 9, b"out:aborted")
    assert (eos([*out, aborted_input]).eos_strays, eos([*out, aborted_input]).ok()) == (1, False)
