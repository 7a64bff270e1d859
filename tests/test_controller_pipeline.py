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
from straitmq.controller.raft.core import RaftConfig

CFG = RaftConfig(election_timeout_ms=50, fetch_timeout_ms=100)
WRITE_S = 0.05  # each write of the metadata log (one batch, one fsync) takes this long


@pytest.fixture
def slow_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every batch the shell writes takes WRITE_S; returns the ops per batch."""
    batches: list[int] = []
    real = quorum_module.apply_ops

    def slow(storage, ops):  # type: ignore[no-untyped-def]
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
    reg = {"id": 1, "incarnation": "a", "host": "127.0.0.1", "port": 1, "http_port": 2,
           "cluster_id": "pipeline"}  # fmt: skip
    offset = (await c.register_broker(reg))["metadata_offset"]
    await c.heartbeat({"id": 1, "incarnation": "a", "metadata_offset": offset})
    assert not q.image.brokers[1].fenced
    return q, c


async def _stop(q: Quorum, c: ActiveController) -> None:
    # Whatever this leader appended is applied, and the speculative image matches it.
    assert c._spec is None or c._spec.to_dict() == q.image.to_dict()
    await c.stop()
    await q.stop(resign=False)


def test_concurrent_creates_commit_together(tmp_path, slow_writes) -> None:  # type: ignore[no-untyped-def]
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


def test_a_refusal_waits_for_the_change_it_was_judged_against(tmp_path, slow_writes) -> None:  # type: ignore[no-untyped-def]
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


def test_concurrent_producer_id_blocks_never_overlap(tmp_path, slow_writes) -> None:  # type: ignore[no-untyped-def]
    async def go() -> None:
        q, c = await _active(tmp_path)
        replies = await asyncio.gather(
            *(c.allocate_producer_ids({"broker": 1}) for _ in range(10))
        )
        starts = sorted(r["start"] for r in replies)
        count = replies[0]["count"]
        assert all(b - a >= count for a, b in itertools.pairwise(starts)), starts
        assert q.image.next_producer_id >= starts[-1] + count
        await _stop(q, c)

    asyncio.run(go())


def test_lost_leadership_drops_the_speculative_image(tmp_path, slow_writes) -> None:  # type: ignore[no-untyped-def]
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
