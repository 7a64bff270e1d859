"""The active controller pipelines metadata changes: each request is judged against the
image as it will be once everything already appended commits (a speculative image), is
appended at once, and waits for its commit outside the lock. These run the real
ActiveController on a real one-voter Quorum whose log writes are made slow, so requests
really overlap."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from straitmq.controller import quorum as quorum_module
from straitmq.controller.active import ActiveController, ControllerSettings
from straitmq.controller.errors import ControllerError
from straitmq.controller.quorum import Quorum
from straitmq.metadata.features import supported_ranges
from straitmq.raft.core import RaftConfig

CFG = RaftConfig(election_timeout_ms=50, fetch_timeout_ms=100)
WRITE_S = 0.05  # each write of the metadata log (one batch, one fsync) takes this long


@pytest.fixture
def slow_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every batch the shell writes takes WRITE_S; returns the ops per batch."""
    batches: list[int] = []
    real = quorum_module.apply_ops

    def slow(storage, ops):
        assert threading.current_thread() is not threading.main_thread()
        time.sleep(WRITE_S)
        batches.append(len(ops))
        return real(storage, ops)

    monkeypatch.setattr(quorum_module, "apply_ops", slow)
    return batches


async def _active(tmp_path: Path) -> tuple[Quorum, ActiveController]:
    q = Quorum(1, {1: "http://127.0.0.1:9"}, str(tmp_path), CFG)
    c = ActiveController(q, ControllerSettings(cluster_id="pipeline"))
    await q.start()
    await c.start()
    for _ in range(500):
        if c.active:
            break
        await asyncio.sleep(0.01)
    assert c.active
    reg = {
        "id": 1,
        "incarnation": "a",
        "host": "127.0.0.1",
        "port": 1,
        "http_port": 2,
        "cluster_id": "pipeline",
        "features": supported_ranges(),  # as this release's brokers register
    }
    offset = (await c.register_broker(reg))["metadata_offset"]
    await c.heartbeat({"id": 1, "incarnation": "a", "metadata_offset": offset})
    assert not q.image.brokers[1].fenced
    return q, c


async def _stop(q: Quorum, c: ActiveController) -> None:
    # Whatever this leader appended is applied, and the speculative image matches it.
    assert c._spec is None or c._spec.to_dict() == q.image.to_dict()
    await c.stop()
    await q.stop(resign=False)


def test_concurrent_creates_commit_together(tmp_path, slow_writes) -> None:
    async def go() -> None:
        q, c = await _active(tmp_path)
        slow_writes.clear()
        body = {"partitions": 3, "replication_factor": 1}
        replies = await asyncio.gather(
            *(c.create_topic({**body, "name": f"t{i}"}) for i in range(40))
        )
        offsets = [r["offset"] for r in replies]
        assert len(set(offsets)) == 40 and all(o <= q.image.offset for o in offsets)
        assert all(len(q.image.topics[f"t{i}"].partitions) == 3 for i in range(40))
        # One at a time would be 40 writes of WRITE_S each; pipelined, they pile up.
        assert len(slow_writes) < 20, slow_writes
        await _stop(q, c)

    asyncio.run(go())


def test_a_refusal_waits_for_the_change_it_was_judged_against(tmp_path, slow_writes) -> None:
    async def go() -> None:
        q, c = await _active(tmp_path)
        body = {"name": "same", "partitions": 1, "replication_factor": 1}
        first = asyncio.ensure_future(c.create_topic(body))
        await asyncio.sleep(0)  # the first is appended, not yet committed
        with pytest.raises(ControllerError) as e:
            await c.create_topic(body)
        assert e.value.code == ErrorCode.topic_already_exists
        # The refusal came no earlier than the commit of the topic it names.
        assert "same" in q.image.topics
        await first
        # A change with nothing to write (validate only) also answers after it.
        second = asyncio.ensure_future(c.create_topic({**body, "name": "other"}))
        await asyncio.sleep(0)
        reply = await c.create_topic({**body, "name": "third", "validate_only": True})
        assert "other" in q.image.topics and reply["offset"] <= q.image.offset
        await second
        await _stop(q, c)

    asyncio.run(go())


def test_concurrent_producer_id_blocks_never_overlap(tmp_path, slow_writes) -> None:
    async def go() -> None:
        q, c = await _active(tmp_path)
        replies = await asyncio.gather(*(c.allocate_producer_ids({"broker": 1}) for _ in range(10)))
        starts = sorted(r["start"] for r in replies)
        count = replies[0]["count"]
        assert all(b - a >= count for a, b in itertools.pairwise(starts)), starts
        assert q.image.next_producer_id >= starts[-1] + count
        await _stop(q, c)

    asyncio.run(go())


def test_lost_leadership_drops_the_speculative_image(tmp_path, slow_writes) -> None:
    async def go() -> None:
        q, c = await _active(tmp_path)
        await c.create_topic({"name": "kept", "partitions": 1, "replication_factor": 1})
        assert c._spec is not None
        q._advance(lambda: q.node.resign(quorum_module.now_ms()))
        for _ in range(500):
            if not q.is_leader:
                break
            await asyncio.sleep(0.01)
        assert c._spec is None and not c.active
        # A one-voter quorum elects itself again; the new term starts from what committed.
        for _ in range(500):
            if c.active:
                break
            await asyncio.sleep(0.01)
        assert c.active
        await c.create_topic({"name": "after", "partitions": 1, "replication_factor": 1})
        assert {"kept", "after"} <= set(q.image.topics)
        await _stop(q, c)

    asyncio.run(go())


async def _broker(c: ActiveController, bid: int) -> None:
    reg = {
        "id": bid,
        "incarnation": f"i{bid}",
        "host": "127.0.0.1",
        "port": bid,
        "http_port": 100 + bid,
        "cluster_id": "pipeline",
        "features": supported_ranges(),  # as this release's brokers register
    }
    offset = (await c.register_broker(reg))["metadata_offset"]
    await c.heartbeat({"id": bid, "incarnation": f"i{bid}", "metadata_offset": offset})


async def _reactivate(q: Quorum, c: ActiveController) -> None:
    """Resign and lead again (a one-voter quorum): what a controller failover does."""
    q._advance(lambda: q.node.resign(quorum_module.now_ms()))
    for _ in range(500):
        if not c.active:
            break
        await asyncio.sleep(0.01)
    for _ in range(500):
        if c.active:
            break
        await asyncio.sleep(0.01)
    assert c.active


def _leaders(q: Quorum, name: str) -> list[int]:
    return [p.leader for p in q.image.topics[name].partitions]


def test_a_fencing_is_written_in_bounded_entries(tmp_path, monkeypatch) -> None:
    """Leadership moves are split into entries of at most NON_ATOMIC_ENTRY_RECORDS (every
    process applies an entry in one piece); the fencing itself is in the first."""
    from straitmq.controller import active as active_module

    monkeypatch.setattr(active_module, "NON_ATOMIC_ENTRY_RECORDS", 7)

    async def go() -> None:
        q, c = await _active(tmp_path)
        await _broker(c, 2)
        await c.create_topic({"name": "t", "partitions": 40, "replication_factor": 2})
        led = sum(1 for leader in _leaders(q, "t") if leader == 2)
        assert led >= 10
        entries: list[list[dict]] = []
        q.listeners.append(lambda _o, records, _r: entries.append(records))
        assert await c._fence(2, "i2", "test")
        assert entries[0][0] == {"type": "fence_broker", "id": 2}
        assert len(entries) >= 40 // 7 and all(len(e) <= 7 for e in entries)
        # Every partition moved: 2 leads none and is in no ISR.
        assert all(p.leader == 1 and p.isr == [1] for p in q.image.topics["t"].partitions)
        await _stop(q, c)

    asyncio.run(go())


def test_a_new_active_controller_finishes_moves_cut_short(tmp_path) -> None:
    """A failover between the entries of a split change leaves its first entries
    committed and the rest lost. The next active controller finishes the moves: off a
    fenced broker, and onto a live replica of an offline partition."""

    async def go() -> None:
        q, c = await _active(tmp_path)
        # The brokers here are ids with nothing listening: the new active controller's
        # probe (tested with real processes in test_fast_fencing) would fence them all.
        c._spawn_probe = lambda bid, incarnation: None  # type: ignore[method-assign]
        await _broker(c, 2)
        await _broker(c, 3)
        await c.create_topic(
            {
                "name": "t",
                "partitions": 12,
                "replication_factor": 2,
                "assignments": [[2, 1]] * 6 + [[1, 2]] * 6,
            }
        )
        await c.create_topic(
            {"name": "solo", "partitions": 3, "replication_factor": 1, "assignments": [[3]] * 3}
        )
        assert _leaders(q, "t") == [2] * 6 + [1] * 6
        # Broker 3 leaves for real: its partitions go offline (it was their only ISR).
        assert await c._fence(3, "i3", "test")
        assert _leaders(q, "solo") == [-1] * 3
        # Cut short: broker 2's fencing committed with only one of its moves...
        part = q.image.topics["t"].partitions[0]
        await q.propose(
            [
                {"type": "fence_broker", "id": 2},
                {"type": "partition_change", "topic": "t", "index": 0, "leader": 1, "isr": [1]},
            ]
        )
        assert part.leader == 1 and _leaders(q, "t")[1] == 2
        # ...and broker 3's return with none of its elections.
        await q.propose([{"type": "unfence_broker", "id": 3}])
        assert _leaders(q, "solo") == [-1] * 3
        await _reactivate(q, c)
        for _ in range(500):
            if _leaders(q, "t") == [1] * 12 and _leaders(q, "solo") == [3] * 3:
                break
            await asyncio.sleep(0.01)
        assert _leaders(q, "t") == [1] * 12 and _leaders(q, "solo") == [3] * 3
        assert all(p.isr == [1] for p in q.image.topics["t"].partitions)
        # With nothing cut short, another failover writes nothing: the next records
        # are the next request's.
        seen: list[list[dict]] = []
        q.listeners.append(lambda _o, records, _r: seen.append(records))
        await _reactivate(q, c)
        await c.create_topic({"name": "after", "partitions": 1, "replication_factor": 1})
        assert [r["type"] for e in seen for r in e] == ["topic", "partition"], seen
        await _stop(q, c)

    asyncio.run(go())
