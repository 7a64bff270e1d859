"""KIP-848 group state persisted in `__consumer_offsets` and rebuilt on failover, and
empty groups removed once their offsets expire (offsets.retention.minutes). In-process:
the state machine writes through a real OffsetStore into an in-memory log; a "failover"
replays that log into a fresh store and state machine, as a new coordinator does."""

from __future__ import annotations

import asyncio
import errno
import itertools
import random

from kio.schema.errors import ErrorCode as E
from straitmq.broker.groups.consumer_group import STABLE_MEMBER, UNREVOKED
from straitmq.broker.groups.coordinator import GroupCoordinator
from straitmq.broker.groups.messages import (
    CONSUMER_SESSION,
    REVOCATION,
    ConsumerHeartbeatRequest,
    DeleteGroupOffsets,
    GroupRecords,
    TimerKey,
)
from straitmq.broker.groups.offsets import OffsetStore
from straitmq.broker.groups.state_machine import GroupStateMachine
from straitmq.broker.record_codec import build_batch, decode_batch
from test_consumer_group_state_machine import (
    REBALANCE,
    SESSION,
    SETTINGS,
    T1,
    G,
    Harness,
    all_of,
)


class Log:
    """One offsets partition's batches, appended as the leader would."""

    def __init__(self) -> None:
        self.batches: list[bytes] = []

    def append(self, index: int, data: memoryview, infos: list) -> int:
        assert index == 0
        self.batches.append(bytes(data))
        return len(self.batches)


SEEDS = itertools.count(5)  # each coordinator its own member ids


def store_on(log: Log) -> OffsetStore:
    s = OffsetStore(1)
    s.bind(log.append)
    s.load_partition(0, list(log.batches))
    return s


class Coordinator(Harness):
    """The harness of the consumer-group state machine tests, writing what the machine
    persists to `log` through an OffsetStore, as the shell does."""

    def __init__(self, log: Log, now: int = 0) -> None:
        super().__init__()
        self.log = log
        self.store = store_on(log)
        self.m = GroupStateMachine(SETTINGS, self.store, random.Random(next(SEEDS)))
        self.now = now
        self.written: list[GroupRecords] = []
        take = self.m.take_output

        def take_and_write():
            out = take()
            for rec in out.persist:
                if isinstance(rec, GroupRecords):
                    self.written.append(rec)
                    self.store.write_group_records(rec.group_id, list(rec.records))
                else:
                    assert isinstance(rec, DeleteGroupOffsets)
                    self.store.delete_group(rec.group_id)
            return out

        self.m.take_output = take_and_write  # type: ignore[method-assign]

    def failover(self, after_ms: int = 0) -> Coordinator:
        """A new coordinator replays the log and rebuilds the groups."""
        new = Coordinator(self.log, self.now + after_ms)
        new.m.load_consumer_groups(dict(new.store.group_records), new.now)
        new._collect()
        return new

    def records(self) -> int:
        """How many group records were written since the last call."""
        n = sum(len(r.records) for r in self.written)
        self.written.clear()
        return n


def describe(h: Harness) -> dict:
    code, _, d = h.m.consumer_describe(G)
    assert code == E.none and d is not None
    return {
        "epoch": d["group_epoch"],
        "assignment_epoch": d["assignment_epoch"],
        "state": d["group_state"],
        "members": {
            m["member_id"]: (
                m["member_epoch"],
                m["assignment"],
                m["target_assignment"],
                m["subscribed_topic_names"],
                m["instance_id"],
            )
            for m in d["members"]
        },
    }


def test_a_heartbeat_that_changes_the_group_writes_its_records_and_a_steady_one_none() -> None:
    h = Coordinator(Log())
    a, _ = h.join()
    kinds = {k[0] for r in h.written for k, _ in r.records}
    assert kinds == {"cg", "cgp", "cgta", "cgm", "cgtm", "cgc"}
    assert h.records() == 6
    h.beat(a)
    assert h.records() == 0  # nothing changed: nothing written (answered at once)
    h.join()
    # b's three records, the group and target epochs, a's new target.
    assert h.records() == 6
    h.beat(a)  # a starts revoking: its current assignment record
    assert h.records() == 1
    assert h.member(a.member_id).state == UNREVOKED


def test_members_keep_epochs_and_assignments_across_a_failover() -> None:
    h = Coordinator(Log())
    a, _ = h.join()
    b, _ = h.join(topics=("t1", "t2"), instance="i-b")
    for _ in range(3):
        h.beat(a), h.beat(b)
    before = describe(h)
    assert before["state"] == "Stable" and len(before["members"]) == 2
    h.now += 1000
    n = h.failover(after_ms=20_000)
    assert describe(n) == before
    # Sessions restart from the failover: a full session timeout for every member.
    for m in (a, b):
        assert n.m.timers()[TimerKey(CONSUMER_SESSION, G, m.member_id)] == n.now + SESSION
    # Each member heartbeats the new coordinator with its epoch and goes on, keeping
    # its partitions (the first answer carries its whole assignment again).
    owned_a, owned_b = a.owned, b.owned
    ra, rb = n.beat(a), n.beat(b)
    assert ra.error == rb.error == E.none
    assert (ra.member_epoch, rb.member_epoch) == (
        before["members"][a.member_id][0],
        before["members"][b.member_id][0],
    )
    assert (a.owned, b.owned) == (owned_a, owned_b)
    assert n.beat(a).assignment is None
    assert describe(n) == before
    # The static member still holds its instance id.
    assert n.m.consumer_groups[G].static == {"i-b": b.member_id}
    # A new member gets its share only as the others give it up, as before the move.
    c, rc = n.join()
    assert rc.error == E.none and c.owned == frozenset()
    for _ in range(4):
        n.beat(a), n.beat(b), n.beat(c)
    assert c.owned and not (c.owned & (a.owned | b.owned))


def test_a_revocation_under_way_survives_a_failover() -> None:
    h = Coordinator(Log())
    a, _ = h.join()
    b, _ = h.join()
    h.beat(a)  # told to give up two partitions
    assert h.member(a.member_id).state == UNREVOKED
    n = h.failover(after_ms=5000)
    ma = n.member(a.member_id)
    assert ma.state == UNREVOKED and len(ma.pending_revocation) == 2
    assert n.m.timers()[TimerKey(REVOCATION, G, a.member_id)] == n.now + REBALANCE
    # b gets nothing a still holds; once a confirms, b gets the rest.
    n.beat(b)
    assert b.owned == frozenset()
    assert n.beat(a).error == E.none
    assert n.member(a.member_id).state == STABLE_MEMBER
    n.beat(b)
    assert a.owned | b.owned == all_of(T1, 4) and not (a.owned & b.owned)


def test_a_member_that_left_or_expired_is_gone_after_a_failover() -> None:
    h = Coordinator(Log())
    a, _ = h.join()
    b, _ = h.join()
    c, _ = h.join()
    assert h.hb(ConsumerHeartbeatRequest(G, a.member_id, -1)).error == E.none
    for _ in range(3):
        h.advance(SESSION // 3)
        h.beat(c)
    # a left, b's session expired: tombstones for their records.
    tombstoned = {k[2] for r in h.written for k, v in r.records if v is None}
    assert tombstoned == {a.member_id, b.member_id}
    n = h.failover()
    assert set(n.m.consumer_groups[G].members) == {c.member_id}
    assert not any(k[2] in (a.member_id, b.member_id) for k in n.store.records_of(G))
    r = n.beat(a)
    assert r.error == E.unknown_member_id
    n.beat(c), n.beat(c)
    assert c.owned == all_of(T1, 4)


def test_a_fenced_member_after_a_failover_is_still_fenced() -> None:
    h = Coordinator(Log())
    a, _ = h.join()
    h.join()
    h.beat(a), h.beat(a)
    n = h.failover()
    stale = ConsumerHeartbeatRequest(G, a.member_id, a.epoch + 1, owned=())
    assert n.hb(stale).error == E.fenced_member_epoch


def test_a_deleted_group_leaves_no_records() -> None:
    h = Coordinator(Log())
    a, _ = h.join()
    h.hb(ConsumerHeartbeatRequest(G, a.member_id, -1))
    assert h.m.delete(G) == E.none
    h._collect()
    assert h.store.records_of(G) == {}
    n = h.failover()
    assert G not in n.m.consumer_groups and n.m.list_groups() == []


def test_an_empty_group_is_rebuilt_empty_and_a_member_rejoins_it() -> None:
    h = Coordinator(Log())
    a, _ = h.join()
    epoch = h.m.consumer_groups[G].epoch
    h.hb(ConsumerHeartbeatRequest(G, a.member_id, -1))
    n = h.failover()
    assert n.m.consumer_groups[G].members == {}
    assert n.m.list_groups() == [(G, "consumer", "Empty")]
    b, r = n.join()
    assert r.error == E.none and r.member_epoch > epoch  # epochs never go back
    assert b.owned == all_of(T1, 4)


def test_a_compacted_log_of_group_records_replays_the_same() -> None:
    """What the log cleaner leaves (the latest record of every key, at its offset)
    rebuilds the same groups as the whole log."""
    h = Coordinator(Log())
    a, _ = h.join()
    b, _ = h.join()
    for _ in range(3):
        h.beat(a), h.beat(b)
    before = describe(h)
    latest: dict[bytes | None, tuple[int, int]] = {}  # key -> (batch, record)
    decoded = [decode_batch(raw) for raw in h.log.batches]
    for i, recs in enumerate(decoded):
        for j, rec in enumerate(recs):
            latest[rec.key] = (i, j)
    kept = set(latest.values())
    compacted = Log()
    for i, recs in enumerate(decoded):
        left = [(r.key, r.value, r.headers) for j, r in enumerate(recs) if (i, j) in kept]
        if left:
            compacted.batches.append(build_batch(left, recs[0].timestamp))
    assert sum(map(len, decoded)) > len(kept), "nothing was superseded"
    n = Coordinator(compacted)
    n.m.load_consumer_groups(dict(n.store.group_records), 0)
    assert describe(n) == before


# -- offsets.retention.minutes: empty groups whose offsets expired are removed -----------


def test_empty_groups_lose_expired_offsets_and_are_removed() -> None:
    async def run() -> None:
        log = Log()
        store = store_on(log)
        coord = GroupCoordinator(store, SETTINGS)
        topics = Coordinator(Log()).topics
        # "busy": a KIP-848 member, never expires; "idle": its member left;
        # "old": only offsets (a classic or simple group, no member in memory).
        join = ConsumerHeartbeatRequest(G, "", 0, None, None, REBALANCE, ("t1",), None, None)
        busy = await coord.consumer_heartbeat(join, topics)
        r = await coord.consumer_heartbeat(
            ConsumerHeartbeatRequest("idle", "", 0, None, None, REBALANCE, ("t1",)), topics
        )
        await coord.consumer_heartbeat(ConsumerHeartbeatRequest("idle", r.member_id, -1), topics)
        for g in (G, "idle", "old", "__share_group_state.sg"):
            store.commit(g, [("t1", 0, 5, 0, "")])
        assert [g for g, *_ in coord.list_groups()] == ["__share_group_state.sg", G, "idle", "old"]
        assert coord.expire_groups(retention_ms=200) == []  # nothing old enough yet
        await asyncio.sleep(0.3)
        store.commit("idle", [("t1", 1, 7, 0, "")])  # a newer commit restarts its clock
        assert coord.expire_groups(retention_ms=200) == ["old"]
        assert set(store.fetch("idle")) == {("t1", 1)}  # the older commit expired
        await asyncio.sleep(0.3)
        assert coord.expire_groups(retention_ms=200) == ["idle"]
        # A share group's saved start offsets are state, not positions: never expired.
        assert [g for g, *_ in coord.list_groups()] == ["__share_group_state.sg", G]
        assert busy.error == E.none and store.fetch(G)  # a group with members keeps all
        # Replayed, the removed groups stay gone (offsets and records tombstoned).
        again = store_on(log)
        assert set(again.offsets) == {"__share_group_state.sg", G}
        assert set(again.group_records) == {G}
        coord2 = GroupCoordinator(again, SETTINGS)
        coord2.loaded(lambda g: True)
        assert [g for g, *_ in coord2.list_groups()] == ["__share_group_state.sg", G]

    asyncio.run(run())


def test_offsets_expire_from_the_commit_or_a_classic_groups_emptying_as_kafka() -> None:
    """Kafka 4: a KIP-848 group's offsets expire by their commit time once it has no
    member; an Empty classic group's from when it became empty (its state timestamp)."""
    from straitmq.broker.groups.state_machine import GroupSettings

    async def run() -> None:
        store = store_on(Log())
        coord = GroupCoordinator(store, GroupSettings(initial_rebalance_delay_ms=0))
        topics = Coordinator(Log()).topics
        for g in (G, "classic"):
            store.commit(g, [("t1", 0, 5, 0, "")])
        await asyncio.sleep(0.3)  # the commits are old...
        r = await coord.consumer_heartbeat(
            ConsumerHeartbeatRequest(G, "", 0, None, None, REBALANCE, ("t1",)), topics
        )
        j = await coord.join(
            "classic", "", None, "c", "h", 10_000, 10_000, "consumer", [("range", b"m")], False
        )
        await coord.sync("classic", j["member_id"], None, j["generation_id"], {})
        # ...but both groups have a member: nothing expires.
        assert coord.expire_groups(retention_ms=200) == []
        await coord.consumer_heartbeat(ConsumerHeartbeatRequest(G, r.member_id, -1), topics)
        coord.leave("classic", [(j["member_id"], None)])
        # Both empty now: the KIP-848 group's old commit expires at once, the classic
        # group keeps its offsets a retention from now.
        assert coord.expire_groups(retention_ms=200) == [G]
        assert store.fetch("classic")
        await asyncio.sleep(0.3)
        assert coord.expire_groups(retention_ms=200) == ["classic"]
        assert coord.list_groups() == []

    asyncio.run(run())


def test_the_heartbeat_waits_for_its_records_and_fails_over_when_they_are_not_durable() -> None:
    async def run() -> None:
        store = store_on(Log())
        coord = GroupCoordinator(store, SETTINGS)
        topics = Coordinator(Log()).topics
        waited: list[int] = []
        durable = True

        async def wait(group: str, end: int) -> bool:
            waited.append(end)
            return durable

        coord.bind(wait)
        join = ConsumerHeartbeatRequest(G, "", 0, None, None, REBALANCE, ("t1",))
        r = await coord.consumer_heartbeat(join, topics)
        assert r.error == E.none and waited == [1]
        mid, epoch = r.member_id, r.member_epoch
        owned = ((T1, (0, 1, 2, 3)),)
        r = await coord.consumer_heartbeat(
            ConsumerHeartbeatRequest(G, mid, epoch, owned=owned), topics
        )
        # Nothing written: it still waits for the group's last records (durable already).
        assert r.error == E.none and waited == [1, 1]
        durable = False
        join2 = ConsumerHeartbeatRequest(G, "", 0, None, None, REBALANCE, ("t1",))
        r = await coord.consumer_heartbeat(join2, topics)
        assert r.error == E.coordinator_not_available and waited == [1, 1, 2]
        # The first member is told to give up half: that answer is lost too...
        beat = ConsumerHeartbeatRequest(G, mid, epoch, owned=owned)
        r = await coord.consumer_heartbeat(beat, topics)
        assert r.error == E.coordinator_not_available
        # ...so the next one carries its whole (new) assignment.
        durable = True
        r = await coord.consumer_heartbeat(beat, topics)
        assert r.error == E.none and r.assignment is not None
        assert len(r.assignment[T1]) == 2

    asyncio.run(run())


# -- classic groups: Kafka's GroupMetadata record ------------------------------------------


def test_a_classic_group_is_rebuilt_stable_with_its_generation_members_and_assignments() -> None:
    import test_group_state_machine as classic
    from straitmq.broker.groups.classic_group import EMPTY, STABLE
    from straitmq.broker.groups.messages import HEARTBEAT, SyncRequest

    h = classic.Harness()
    f = classic.form_group(h, 3, instances=[None, "i-1", None])
    log = Log()
    store = store_on(log)
    for rec in h.persisted:
        if isinstance(rec, GroupRecords):
            store.write_group_records(rec.group_id, list(rec.records))
    new = GroupStateMachine(classic.SETTINGS, store_on(log), random.Random(1))
    new.load_consumer_groups(dict(new._offsets.group_records), 50_000)  # type: ignore[attr-defined]
    new.take_output()
    g = new.groups[classic.G]
    assert (g.state, g.generation, g.leader_id, g.protocol_name) == (
        STABLE,
        f.generation,
        f.leader,
        "range",
    )
    assert list(g.members) == f.ids and g.static == {"i-1": f.ids[1]}
    assert all(m.assignment == f"assign-{m.member_id}".encode() for m in g.members.values())
    for mid in f.ids:  # a full session from the load
        assert new.timers()[TimerKey(HEARTBEAT, classic.G, mid)] == 50_000 + classic.SESSION
    # The members go on in their generation: heartbeats, commits, a SyncGroup again.
    assert new.heartbeat(classic.G, f.ids[1], "i-1", f.generation, 50_000) == E.none
    assert new.commit_check(classic.G, f.ids[0], None, f.generation, 50_000) == E.none
    new.sync(9, SyncRequest(classic.G, f.ids[2], None, f.generation, {}), 50_000)
    (reply,) = new.take_output().replies
    assert reply.response.error == E.none
    assert reply.response.assignment == f"assign-{f.ids[2]}".encode()
    assert new.heartbeat(classic.G, f.ids[0], None, f.generation - 1, 50_000) == (
        E.illegal_generation
    )
    # All leave: Empty, written with the next generation, rebuilt so.
    for mid, inst in zip(f.ids, [None, "i-1", None], strict=True):
        h.leave((mid, inst))
    assert h.state() == EMPTY
    for rec in h.persisted:
        if isinstance(rec, GroupRecords):
            store.write_group_records(rec.group_id, list(rec.records))
    again = GroupStateMachine(classic.SETTINGS, store_on(log), random.Random(2))
    again.load_consumer_groups(dict(again._offsets.group_records), 0)  # type: ignore[attr-defined]
    e = again.groups[classic.G]
    assert e.state == EMPTY and e.members == {} and e.generation == f.generation + 1
    assert again.list_groups() == [(classic.G, "consumer", EMPTY)]


def test_a_classic_sync_group_is_answered_once_the_generation_is_replicated() -> None:
    from straitmq.broker.groups.coordinator import JoinError
    from straitmq.broker.groups.state_machine import GroupSettings

    async def run(durable: bool) -> int:
        store = store_on(Log())
        coord = GroupCoordinator(store, GroupSettings(initial_rebalance_delay_ms=0))
        waited: list[int] = []

        async def wait(group: str, end: int) -> bool:
            waited.append(end)
            return durable

        coord.bind(wait)
        j = await coord.join(
            G, "", None, "c", "h", 10_000, 10_000, "consumer", [("range", b"m")], False
        )
        try:
            s = await coord.sync(
                G, j["member_id"], None, j["generation_id"], {j["member_id"]: b"a"}
            )
        except JoinError as err:
            return err.code
        assert s["assignment"] == b"a" and waited == [1]
        assert store.records_of(G)  # the Stable generation is in the log
        return E.none

    assert asyncio.run(run(True)) == E.none
    assert asyncio.run(run(False)) == E.coordinator_not_available


def test_a_sync_group_whose_records_cannot_be_written_is_not_answered_as_stored() -> None:
    """A full disk under the offsets partition: the Stable generation's records are not
    written, so SyncGroup must not hand out the assignment as if they were (it used to,
    at once for a new group, or after waiting on an older write): NOT_COORDINATOR, as
    Kafka answers a group store that failed with KAFKA_STORAGE_ERROR."""
    from straitmq.broker.groups.coordinator import JoinError
    from straitmq.broker.groups.state_machine import GroupSettings

    async def run(full: bool) -> int:
        log = Log()
        store = store_on(log)
        coord = GroupCoordinator(store, GroupSettings(initial_rebalance_delay_ms=0))

        async def wait(group: str, end: int) -> bool:
            return True

        coord.bind(wait)
        j = await coord.join(
            G, "", None, "c", "h", 10_000, 10_000, "consumer", [("range", b"m")], False
        )

        def no_space(index: int, data: memoryview, infos: list) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        if full:
            store.bind(no_space)
        try:
            s = await coord.sync(
                G, j["member_id"], None, j["generation_id"], {j["member_id"]: b"a"}
            )
        except JoinError as err:
            return err.code
        assert s["assignment"] == b"a"
        return E.none

    assert asyncio.run(run(False)) == E.none
    assert asyncio.run(run(True)) == E.not_coordinator


def test_a_group_with_members_loses_only_old_offsets_of_topics_it_no_longer_reads() -> None:
    async def run() -> None:
        store = store_on(Log())
        coord = GroupCoordinator(store, SETTINGS)
        topics = Coordinator(Log()).topics
        store.commit(G, [("t1", 0, 5, 0, ""), ("t2", 0, 3, 0, "")])
        await asyncio.sleep(0.3)
        r = await coord.consumer_heartbeat(
            ConsumerHeartbeatRequest(G, "", 0, None, None, REBALANCE, ("t1",)), topics
        )
        assert r.error == E.none
        assert coord.expire_groups(retention_ms=200) == []
        assert set(store.fetch(G)) == {("t1", 0)}  # t2: not subscribed, old: expired

    asyncio.run(run())


def test_a_broker_reopened_after_compaction_rebuilds_its_groups(tmp_path, monkeypatch) -> None:
    """In-process broker: a KIP-848 group and a stream of commits roll the offsets topic,
    the log cleaner compacts them, and the reopened broker (leading the offsets
    partitions again) describes the same group."""
    from straitmq.broker import broker as broker_module
    from straitmq.broker.api.groups import _ImageTopics
    from straitmq.broker.config import BrokerConfig
    from straitmq.node import build_broker

    monkeypatch.setattr(broker_module, "OFFSETS_SEGMENT_BYTES", 4096)
    config = {"data_dir": str(tmp_path), "offsets_topic_partitions": 2, "port": 0, "http_port": 0}

    async def first() -> tuple:
        b = build_broker(BrokerConfig(**config))
        await b.start()
        await b.control("create_topic", {"name": "t1", "partitions": 4, "replication_factor": 1})
        join = ConsumerHeartbeatRequest(G, "", 0, None, None, REBALANCE, ("t1",))
        r = await b.groups.consumer_heartbeat(join, _ImageTopics(b.image))
        assert r.error == E.none and r.member_epoch == 1
        for i in range(300):
            b.offsets.commit(G, [("t1", p, i, 0, "m") for p in range(4)])
        assert await b.cleaner.run_once() > 0
        described = b.groups.consumer_describe(G)
        await b.stop()
        return r, described

    async def again() -> tuple:
        b = build_broker(BrokerConfig(**config))
        await b.start()
        described = b.groups.consumer_describe(G)
        committed = {k: c.offset for k, c in b.offsets.fetch(G).items()}
        await b.stop()
        return described, committed

    r, before = asyncio.run(first())
    after, committed = asyncio.run(again())
    assert after == before and before[2]["members"][0]["member_id"] == r.member_id
    assert committed == {("t1", p): 299 for p in range(4)}


def test_an_empty_classic_groups_retention_counts_from_its_emptying_across_a_move() -> None:
    """The shell stamps the wall-clock time an Empty classic group's record was written
    (Kafka's currentStateTimestamp): a new coordinator counts the retention from then,
    not from the move."""
    from straitmq.broker.groups.coordinator import EMPTY_SINCE
    from straitmq.broker.groups.state_machine import GroupSettings

    settings = GroupSettings(initial_rebalance_delay_ms=0)

    async def run() -> None:
        log = Log()
        store = store_on(log)
        coord = GroupCoordinator(store, settings)
        j = await coord.join(
            "classic", "", None, "c", "h", 10_000, 10_000, "consumer", [("range", b"m")], False
        )
        await coord.sync("classic", j["member_id"], None, j["generation_id"], {})
        store.commit("classic", [("t1", 0, 5, 0, "")])
        coord.leave("classic", [(j["member_id"], None)])
        assert store.records_of("classic")[("grp", "classic", "")][EMPTY_SINCE] > 0
        await asyncio.sleep(0.35)
        moved = GroupCoordinator(store_on(log), settings)
        moved.loaded(lambda g: True)
        assert moved.list_groups() == [("classic", "consumer", "Empty")]
        assert moved.expire_groups(retention_ms=300) == ["classic"]

    asyncio.run(run())
