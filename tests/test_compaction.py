"""Log compaction on partition logs: the cleaner's rules, crashes, swaps, followers.

A seeded property test compares every cleaning with a model of Kafka's rules (the latest
record per key survives, offsets never change, tombstones go only after
delete.retention.ms from their first cleaning); crash tests stop a cleaning at each step
of its swap, and once with kill -9 in a real process; a fetch that took a range before
a swap still sends the old bytes; a follower copies a compacted log, gaps and all.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from straitmq.broker import log_cleaner
from straitmq.broker.log_cleaner import (
    CleanerLog,
    LogCleaner,
    clean_in_place,
    cleanable,
)
from straitmq.broker.record_codec import build_batch, decode_batch
from straitmq.broker.records import replicated_batches, validate_batches
from straitmq.broker.storage.compaction import CLEANED, CorruptSegment, clean
from straitmq.broker.storage.log import LogConfig, PartitionLog
from waiting import wait_for

T0 = 1_700_000_000_000
DAY = 24 * 3600 * 1000
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@dataclass
class Settings:
    threads: int = 1
    io_max_bytes_per_second: float = 0.0
    dedupe_buffer_size: int = 1 << 27
    backoff_ms: int = 50
    enabled: bool = True


Rec = tuple[bytes | None, bytes | None]  # key, value (None: tombstone)


def _config(**kw: int | float | bool) -> LogConfig:
    base: dict = dict(segment_bytes=1200, index_interval_bytes=100, compact=True, delete=False)
    base.update(kw)
    return LogConfig(**base)


def _append(plog: PartitionLog, recs: list[Rec], ts: int = T0, codec: int = 0) -> int:
    batch = build_batch([(k, v, [("h", b"x")] if k else []) for k, v in recs], ts, codec)
    view = memoryview(batch)
    return plog.append(view, validate_batches(view, 1 << 20), leader_epoch=0)


def _records(plog: PartitionLog) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    for raw in plog.batches(plog.log_start_offset, plog.log_end_offset):
        out += [(r.offset, r.key, r.value) for r in decode_batch(raw)]
    return out


def _write_stream(
    plog: PartitionLog, rng: random.Random, n: int, codec: int = 0, keys: int = 20
) -> dict:
    """Random keyed records and tombstones in batches of 1-5; returns offset -> record."""
    written: dict[int, Rec] = {}
    while len(written) < n:
        recs: list[Rec] = []
        for _ in range(rng.randint(1, 5)):
            key = b"k%d" % rng.randrange(keys)
            value = None if rng.random() < 0.15 else b"v%d" % rng.randrange(10**6)
            recs.append((key, value))
        base = _append(plog, recs, T0 + len(written), codec)
        for i, r in enumerate(recs):
            written[base + i] = r
    return written


def _check_cleaned(
    plog: PartitionLog,
    written: dict,
    map_end: int,
    horizon_passed: bool,
    only: range | None = None,
) -> None:
    """Kafka's rules, against the model of what was written (in `only`, if given)."""
    latest: dict[bytes, int] = {}
    for off, (k, _v) in sorted(written.items()):
        if off < map_end:
            latest[k] = off
    got = _records(plog)
    offsets = [o for o, _k, _v in got]
    assert offsets == sorted(set(offsets)), "offsets only grow, never repeat"
    for off, k, v in got:
        assert written[off] == (k, v), f"offset {off} holds another record than was written"
    seen = {o for o, _k, _v in got}
    for off, (k, v) in written.items():
        if only is not None and off not in only:
            continue
        if off >= map_end:
            assert off in seen, f"offset {off} above the cleaned range was lost"
        elif latest[k] != off:
            assert off not in seen, f"offset {off} superseded by {latest[k]} was kept"
        elif v is None and horizon_passed:
            assert off not in seen, f"tombstone at {off} outlived delete.retention.ms"
        else:
            assert off in seen, f"latest record of {k!r} at {off} was lost"
    assert plog.log_end_offset == max(written) + 1


@pytest.mark.parametrize("seed", range(10))
def test_property_latest_per_key_survives_and_offsets_stay(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    codec = list(CODECS.values())[seed % len(CODECS)]
    plog = PartitionLog(str(tmp_path / "p"), _config())
    written = _write_stream(plog, rng, 150, codec)
    plog.roll()  # everything written is closed: all of it may be cleaned
    hw = plog.log_end_offset
    r = clean_in_place(plog, hw, Settings(), T0 + 1000)
    assert r is not None and r.records_removed > 0
    _check_cleaned(plog, written, hw, horizon_passed=False)
    # More data, a second round over old and new: still the same rules.
    more = _write_stream(plog, rng, 80, codec)
    written.update(more)
    plog.roll()
    hw = plog.log_end_offset
    clean_in_place(plog, hw, Settings(), T0 + 2000)
    _check_cleaned(plog, written, hw, horizon_passed=False)
    # After delete.retention.ms from their first cleaning, tombstones go.
    clean_in_place(plog, hw, Settings(), T0 + 2000 + DAY + 1)
    _check_cleaned(plog, written, hw, horizon_passed=True)
    # What a restart sees is what was served before it.
    before = _records(plog)
    plog.close()
    again = PartitionLog(str(tmp_path / "p"), _config())
    assert _records(again) == before
    assert not [n for n in os.listdir(tmp_path / "p") if n.endswith((CLEANED, ".swap"))]


def test_small_offset_map_cleans_in_several_rounds(tmp_path: Path) -> None:
    """A dedupe buffer too small for the dirty part: each round maps what fits, and the
    rounds together end where one big round would."""
    rng = random.Random(7)
    plog = PartitionLog(str(tmp_path / "p"), _config())
    written = _write_stream(plog, rng, 400, keys=300)
    plog.roll()
    hw = plog.log_end_offset
    tiny = Settings(dedupe_buffer_size=30 * 128)
    ends = []
    for _ in range(50):
        r = clean_in_place(plog, hw, tiny, T0 + 1000)
        if r is None:
            break
        ends.append(r.map_end)
    assert len(ends) > 2 and ends == sorted(ends) and ends[-1] == hw
    # Rounds that each saw part of the keys may keep an older record of a key whose
    # newer one came in a later round's map; a final full round leaves Kafka's result.
    plog.write_cleaner_checkpoint(0)
    clean_in_place(plog, hw, Settings(), T0 + 1000)
    _check_cleaned(plog, written, hw, horizon_passed=False)


def test_active_segment_high_watermark_and_lag_bound_the_cleaning(tmp_path: Path) -> None:
    plog = PartitionLog(str(tmp_path / "p"), _config(min_compaction_lag_ms=60_000))
    for i in range(40):
        _append(plog, [(b"same", b"v%d" % i)], T0 + i * 1000)
    c = cleanable(plog, plog.log_end_offset, T0 + 40_000)
    # Segments younger than the lag (their newest record) are not cleanable.
    assert c.clean_end < plog.segments[-1].base_offset
    young = next(s for s in plog.segments if s.max_timestamp > T0 + 40_000 - 60_000)
    assert c.clean_end == young.base_offset
    # Above the high watermark nothing is cleaned, even when old enough.
    hw = plog.segments[1].base_offset + 1
    c = cleanable(plog, hw, T0 + 10**9)
    assert c.clean_end == plog.segments[1].base_offset
    r = clean_in_place(plog, hw, Settings(), T0 + 10**9)
    assert r is not None and r.map_end <= hw
    assert [v for _o, _k, v in _records(plog)][-1] == b"v39"


def test_keyless_records_go_and_control_batches_stay(tmp_path: Path) -> None:
    plog = PartitionLog(str(tmp_path / "p"), _config())
    _append(plog, [(None, b"no key"), (b"a", b"1")])
    _append(plog, [(b"a", b"2")])
    plog.roll()
    clean_in_place(plog, plog.log_end_offset, Settings(), T0)
    assert _records(plog) == [(2, b"a", b"2")]


def test_idempotent_producers_last_batch_stays_empty(tmp_path: Path) -> None:
    """A batch whose records all go but that holds a producer's last sequence is kept
    with no records (Kafka's cleaner does the same), so the producer's state and the
    offsets it was given survive."""
    from kafka.record.default_records import DefaultRecordBatchBuilder

    plog = PartitionLog(str(tmp_path / "p"), _config())
    b = DefaultRecordBatchBuilder(
        2, 0, False, producer_id=7, producer_epoch=0, base_sequence=0, batch_size=1 << 20
    )
    b.append(0, T0, b"k", b"old", [])
    data = bytes(b.build())
    view = memoryview(data)
    plog.append(view, validate_batches(view, 1 << 20), leader_epoch=0)
    _append(plog, [(b"k", b"new")])
    plog.roll()
    clean_in_place(plog, plog.log_end_offset, Settings(), T0)
    raws = list(plog.batches(0, plog.log_end_offset))
    assert len(raws) == 2
    first = raws[0]
    assert int.from_bytes(first[57:61], "big") == 0, "an empty batch"
    assert int.from_bytes(first[43:51], "big", signed=True) == 7, "of producer 7"
    assert _records(plog) == [(1, b"k", b"new")]


def test_reader_of_a_swapped_segment_gets_the_old_bytes(tmp_path: Path) -> None:
    plog = PartitionLog(str(tmp_path / "p"), _config())
    for i in range(30):
        _append(plog, [(b"k", b"value-%d" % i)])
    plog.roll()
    sl = plog.read(0, 1 << 20, plog.log_end_offset)
    assert sl is not None
    before = os.pread(sl.fd, sl.size, sl.position)
    c = cleanable(plog, plog.log_end_offset, T0)
    from straitmq.broker.log_cleaner import make_job

    job = make_job(plog, c, Settings(), T0)
    result = clean(job)
    retired = plog.swap_cleaned(job.segments, result.groups)
    assert retired
    # The fetch that took the range before the swap sends it after: same bytes.
    assert os.pread(sl.fd, sl.size, sl.position) == before
    # A read after the swap sees the cleaned log.
    assert _records(plog) == [(29, b"k", b"value-29")]
    plog.unpin_retired(retired)
    with pytest.raises(OSError):
        sl.fd  # noqa: B018 (the property opens the file)


def test_swap_is_abandoned_when_the_log_changed_meanwhile(tmp_path: Path) -> None:
    plog = PartitionLog(str(tmp_path / "p"), _config())
    for i in range(30):
        _append(plog, [(b"k%d" % (i % 3), b"v%d" % i)])
    plog.roll()
    from straitmq.broker.log_cleaner import make_job

    job = make_job(plog, cleanable(plog, plog.log_end_offset, T0), Settings(), T0)
    result = clean(job)
    plog.truncate_to(5)  # a follower's truncation deleted segments the job read
    assert plog.swap_cleaned(job.segments, result.groups) is None
    assert not [n for n in os.listdir(plog.directory) if n.endswith(CLEANED)]
    assert [o for o, _k, _v in _records(plog)] == list(range(5))


@pytest.mark.parametrize("crash_after", ["cleaned", "index_swap", "log_swap", "old_deleted"])
def test_crash_at_each_step_of_the_swap_loses_nothing(tmp_path: Path, crash_after: str) -> None:
    """The swap's file states one after the other, as a crash would leave them, then a
    restart: the log holds either the old or the cleaned records, and serves the latest
    value of every key either way."""
    d = tmp_path / "p"
    plog = PartitionLog(str(d), _config())
    rng = random.Random(3)
    written = _write_stream(plog, rng, 120)
    plog.roll()
    from straitmq.broker.log_cleaner import make_job

    hw = plog.log_end_offset
    job = make_job(plog, cleanable(plog, hw, T0 + 1000), Settings(), T0 + 1000)
    result = clean(job)
    plog.close()
    g = max(result.groups, key=lambda g: g.size)  # one with records (some are empty)
    name = f"{g.base_offset:020d}"
    steps = {
        "cleaned": [],
        "index_swap": [(".index", ".cleaned", ".swap"), (".timeindex", ".cleaned", ".swap")],
        "log_swap": [
            (".index", ".cleaned", ".swap"),
            (".timeindex", ".cleaned", ".swap"),
            (".log", ".cleaned", ".swap"),
        ],
    }
    for suffix, a, b in steps.get(crash_after, steps["log_swap"]):
        os.replace(d / f"{name}{suffix}{a}", d / f"{name}{suffix}{b}")
    if crash_after == "old_deleted":
        for base in g.replaces:
            for suffix in (".log", ".index", ".timeindex"):
                (d / f"{base:020d}{suffix}").unlink(missing_ok=True)
    again = PartitionLog(str(d), _config())
    latest: dict[bytes, bytes | None] = {}
    for _off, (k, v) in sorted(written.items()):
        latest[k] = v
    got: dict[bytes, bytes | None] = {}
    for _o, k, v in _records(again):
        assert k is not None
        got[k] = v
    assert got == latest
    assert not [n for n in os.listdir(d) if n.endswith((CLEANED, ".swap"))]
    if crash_after in ("log_swap", "old_deleted"):  # that group's range is cleaned
        end = next(f.next_offset for f in job.segments if f.base_offset == g.replaces[-1])
        span = range(g.base_offset, end)
        _check_cleaned(again, written, result.map_end, horizon_passed=False, only=span)


def test_kill_9_in_the_middle_of_cleaning(tmp_path: Path) -> None:
    """A real process cleaning a large log killed with SIGKILL once its `.cleaned` file
    exists: the reopened log serves every key's latest value, then cleans fine."""
    d = tmp_path / "p"
    cfg = dict(segment_bytes=200_000, index_interval_bytes=4096)
    plog = PartitionLog(str(d), _config(**cfg))
    latest: dict[bytes, bytes] = {}
    for i in range(4000):
        recs = [(b"key-%d" % ((i * 7 + j) % 500), b"%d-%d" % (i, j) * 20) for j in range(5)]
        _append(plog, recs)
        latest.update(dict(recs))  # type: ignore[arg-type]
    plog.roll()
    plog.close()
    script = textwrap.dedent(
        f"""
        from straitmq.broker.log_cleaner import clean_in_place
        from straitmq.broker.storage.log import LogConfig, PartitionLog
        from test_compaction import Settings
        cfg = LogConfig(
            segment_bytes=200_000, index_interval_bytes=4096, compact=True, delete=False
        )
        plog = PartitionLog({str(d)!r}, cfg)
        clean_in_place(plog, plog.log_end_offset, Settings(io_max_bytes_per_second=2e6), {T0})
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=str(Path(__file__).parent), env={**os.environ}
    )
    try:
        wait_for(
            lambda: any(n.endswith(CLEANED) for n in os.listdir(d)) or proc.poll() is not None,
            timeout=60,
            what="the cleaner process to write a .cleaned file",
        )
        assert proc.poll() is None, "the cleaning finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    again = PartitionLog(str(d), _config(**cfg))
    got = {k: v for _o, k, v in _records(again)}
    assert got == latest
    assert clean_in_place(again, again.log_end_offset, Settings(), T0) is not None
    assert {k: v for _o, k, v in _records(again)} == latest
    assert len(_records(again)) == len(latest)


def test_follower_copies_a_compacted_log_with_its_gaps(tmp_path: Path) -> None:
    """A follower fetching from the log start of a compacted leader, and restarting half
    way, ends with the leader's batches at the leader's offsets."""
    leader = PartitionLog(str(tmp_path / "leader"), _config())
    rng = random.Random(11)
    _write_stream(leader, rng, 200)
    leader.roll()
    clean_in_place(leader, leader.log_end_offset, Settings(), T0)
    _append(leader, [(b"tail", b"t")])
    hw = leader.log_end_offset
    fdir = str(tmp_path / "follower")
    follower = PartitionLog(fdir, _config(compact=False))
    steps = 0
    while follower.log_end_offset < hw:
        data = leader.read_bytes(follower.log_end_offset, 300, hw)
        assert data, f"nothing to fetch at {follower.log_end_offset}"
        view = memoryview(data)
        follower.append_replicated(view, replicated_batches(view))
        steps += 1
        if steps == 3:  # a restart half way
            follower.close()
            follower = PartitionLog(fdir, _config(compact=False))
    assert _records(follower) == _records(leader)
    assert follower.read_bytes(0, 1 << 30, hw) == leader.read_bytes(0, 1 << 30, hw) or [
        r for r in follower.batches(0, hw)
    ] == [r for r in leader.batches(0, hw)]


def test_corrupt_segment_stops_cleaning_that_partition_only(tmp_path: Path) -> None:
    plog = PartitionLog(str(tmp_path / "p"), _config())
    for i in range(30):
        _append(plog, [(b"k%d" % (i % 4), b"v%d" % i)])
    plog.roll()
    seg = plog.segments[0]
    with open(seg.path(".log"), "r+b") as f:  # a flipped byte inside a batch's records
        f.seek(70)
        b = f.read(1)
        f.seek(70)
        f.write(bytes([b[0] ^ 0xFF]))
    from straitmq.broker.log_cleaner import make_job

    job = make_job(plog, cleanable(plog, plog.log_end_offset, T0), Settings(), T0)
    with pytest.raises(CorruptSegment, match="batch at offset 0"):
        clean(job)
    assert not [n for n in os.listdir(plog.directory) if n.endswith(CLEANED)]


def test_log_cleaner_subsystem_cleans_and_reports(tmp_path: Path) -> None:
    asyncio.run(_cleaner_subsystem(tmp_path))


def test_a_cleaner_round_lets_the_event_loop_run_between_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round looks at every local log (100,000 on a large broker) in slices: other
    tasks run while it goes through them, and it still finds the dirty log."""
    monkeypatch.setattr(log_cleaner, "SCAN_SLICE_S", 0.0)  # a pause after every log
    monkeypatch.setattr(log_cleaner, "SCAN_CHECK", 1)
    logs = [
        CleanerLog("t", i, PartitionLog(str(tmp_path / f"t-{i}"), _config()), 0) for i in range(8)
    ]
    dirty = logs[-1].log
    for i in range(30):
        _append(dirty, [(b"k%d" % (i % 3), b"v%d" % i)])
    dirty.roll()
    logs[-1].high_watermark = dirty.log_end_offset
    turns = [0]
    seen: list[int] = []  # the other task's turns when each log was looked at

    def listing() -> Iterator[CleanerLog]:
        for cl in logs:
            seen.append(turns[0])
            yield cl

    async def spin() -> None:
        while True:
            turns[0] += 1
            await asyncio.sleep(0)

    async def round_() -> int:
        other = asyncio.get_running_loop().create_task(spin())
        cleaner = LogCleaner(listing, lambda: Settings(), executor="thread")
        try:
            await asyncio.sleep(0)
            return await cleaner.run_once()
        finally:
            other.cancel()
            await cleaner.stop()

    assert asyncio.run(round_()) == 1
    assert len(seen) >= len(logs) and seen[len(logs) - 1] > seen[0]


async def _cleaner_subsystem(tmp_path: Path) -> None:
    """The broker's LogCleaner over two logs, one with a corrupt segment, in a worker
    process: the good one is cleaned and counted, the bad one is marked uncleanable
    with the reason and keeps serving."""
    good = PartitionLog(str(tmp_path / "good"), _config())
    bad = PartitionLog(str(tmp_path / "bad"), _config())
    for plog in (good, bad):
        for i in range(30):
            _append(plog, [(b"k%d" % (i % 3), b"v%d" % i)])
        plog.roll()
    with open(bad.segments[0].path(".log"), "r+b") as f:
        f.seek(70)
        f.write(b"\xff\xff")
    logs = [
        CleanerLog("t", 0, good, good.log_end_offset),
        CleanerLog("t", 1, bad, bad.log_end_offset),
    ]
    cleaner = LogCleaner(lambda: logs, lambda: Settings(threads=2))
    cleaner.start()
    try:
        async with cleaner.finished:
            await cleaner.finished.wait_for(
                lambda: cleaner.stats.cleanings >= 1 and cleaner.stats.errors >= 1
            )
    finally:
        await cleaner.stop()
    assert [v for _o, _k, v in _records(good)] == [b"v27", b"v28", b"v29"]
    st = cleaner.stats.partitions[("t", 1)]
    assert st.uncleanable and "corrupt" in st.uncleanable
    assert bad.read(0, 1 << 20, bad.log_end_offset) is not None  # still serves
    assert cleaner.stats.partitions[("t", 0)].last_clean_ms > 0
