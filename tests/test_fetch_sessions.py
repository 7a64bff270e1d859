"""Incremental fetch sessions (KIP-227), on the leader and in the replica fetcher.

- The leader's rules, on the wire against a real broker: a full fetch opens a session;
  an incremental fetch names only partitions whose position changed and is answered
  only with partitions that have records, a new high watermark or an error; a wrong
  epoch or an unknown session gets INVALID_FETCH_SESSION_EPOCH / FETCH_SESSION_ID_NOT_FOUND
  and leaves the session as it was; a long poll wakes for any partition of its session;
  forgotten partitions are no longer answered; epoch -1 closes the session.
- The ISR rule for a partition that sits unchanged in a follower's session (no fetch
  names it): the follower stays caught up while its session fetches, and falls behind
  once the session stops.
- On a 3+3 cluster: followers replicate through sessions (seen in the leaders' metrics),
  idle partitions keep their ISR, and a leader killed with SIGKILL moves the sessions to
  the new leaders with every acknowledged record kept.
"""

from __future__ import annotations

import asyncio
import io
import random
import struct
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from cluster_support import Workload, cluster_factory, verify, wait_for
from conftest import record_batch
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic, ForgottenTopic
from prometheus_client.parser import text_string_to_metric_families
from straitmq.broker.fetch_sessions import FetchSession, FetchSessions
from straitmq.broker.metadata_view import MetadataView
from straitmq.broker.partitions import FollowerState, Partition
from straitmq.broker.records import validate_batches
from straitmq.broker.storage.log import LogConfig, PartitionLog
from straitmq.broker.views import LocalReplicas
from straitmq.metadata.image import MetadataImage, PartitionImage
from waiting import holds

from straitmq.protocol.client import KafkaConnection
from straitmq.protocol.codec import _writer, request_schema
from straitmq.protocol.fetch_request import encode_fetch_v12

pytestmark = pytest.mark.timeout(180)

NOT_FOUND = 70  # FETCH_SESSION_ID_NOT_FOUND
INVALID_EPOCH = 71  # INVALID_FETCH_SESSION_EPOCH


def _request(
    topic: str,
    session_id: int,
    epoch: int,
    parts: dict[int, int],
    forgotten: tuple[int, ...] = (),
    max_wait_ms: int = 100,
) -> object:
    return FetchRequest(
        cluster_id=None,
        replica_id=-1,
        max_wait=timedelta(milliseconds=max_wait_ms),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=session_id,
        session_epoch=epoch,
        topics=(
            FetchTopic(
                topic=topic,
                partitions=tuple(
                    FetchPartition(
                        partition=p,
                        current_leader_epoch=-1,
                        fetch_offset=off,
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                    )
                    for p, off in parts.items()
                ),
            ),
        )
        if parts
        else (),
        forgotten_topics_data=(ForgottenTopic(topic=topic, partitions=forgotten),)
        if forgotten
        else (),
        rack_id="",
    )


def _answered(resp: object) -> dict[int, tuple[int, int, bool]]:
    """partition -> (error, high watermark, has records)."""
    return {
        p.partition_index: (int(p.error_code), p.high_watermark, bool(p.records))
        for t in resp.responses  # type: ignore[attr-defined]
        for p in t.partitions
    }


def _produce(bootstrap: str, topic: str, partition: int, n: int = 1) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode(), partition=partition)
    assert p.flush(30) == 0


def test_leader_session_rules_on_the_wire(broker) -> None:
    topic = "fs"
    broker.create_topic(topic, partitions=3)
    for p in range(3):
        _produce(broker.bootstrap, topic, p)
    host, port = broker.bootstrap.split(":")

    async def scenario() -> None:
        conn = KafkaConnection(host, int(port), "test-fetch-sessions")
        try:

            async def fetch(*args: object, **kw: object) -> object:
                return await conn.request(1, 12, _request(topic, *args, **kw), 40.0)  # type: ignore[arg-type]

            # A full fetch opens a session and answers every partition it names.
            r = await fetch(0, 0, {0: 0, 1: 0, 2: 0})
            assert int(r.error_code) == 0 and r.session_id != 0
            sid = r.session_id
            assert _answered(r) == {0: (0, 1, True), 1: (0, 1, True), 2: (0, 1, True)}
            # Positions moved, nothing new: an empty answer.
            r = await fetch(sid, 1, {0: 1, 1: 1, 2: 1})
            assert int(r.error_code) == 0 and r.session_id == sid
            assert _answered(r) == {}
            r = await fetch(sid, 2, {})
            assert _answered(r) == {}
            # A record on partition 1 only: the answer lists partition 1 only, though the
            # fetch named no partition.
            await asyncio.to_thread(_produce, broker.bootstrap, topic, 1)
            r = await fetch(sid, 3, {})
            assert _answered(r) == {1: (0, 2, True)}
            # A replayed epoch and an unknown session: errors, and the session is intact.
            r = await fetch(sid, 3, {1: 2})
            assert int(r.error_code) == INVALID_EPOCH and _answered(r) == {}
            r = await fetch(sid + 1 if sid < 2**31 - 1 else 1, 1, {})
            assert int(r.error_code) == NOT_FOUND
            r = await fetch(sid, 4, {1: 2})
            assert int(r.error_code) == 0 and _answered(r) == {}
            # A long poll wakes for a partition of the session that the fetch does not
            # name. Parked for up to 30 s; the record arrives well before that.
            t0 = time.monotonic()
            poll = asyncio.create_task(fetch(sid, 5, {}, max_wait_ms=30_000))
            await asyncio.sleep(0)  # the request is on the wire before the record
            await asyncio.to_thread(_produce, broker.bootstrap, topic, 2)
            r = await asyncio.wait_for(poll, 25)
            assert _answered(r) == {2: (0, 2, True)}, time.monotonic() - t0
            # Forgotten partitions are no longer answered.
            r = await fetch(sid, 6, {2: 2}, forgotten=(0,))
            assert _answered(r) == {}
            await asyncio.to_thread(_produce, broker.bootstrap, topic, 0)
            await asyncio.to_thread(_produce, broker.bootstrap, topic, 2)
            r = await fetch(sid, 7, {})
            assert _answered(r) == {2: (0, 3, True)}
            # Epoch -1 closes the session and fetches without one.
            r = await fetch(sid, -1, {0: 1})
            assert int(r.error_code) == 0 and r.session_id == 0
            assert _answered(r) == {0: (0, 2, True)}
            r = await fetch(sid, 8, {})
            assert int(r.error_code) == NOT_FOUND
        finally:
            conn.close()

    asyncio.run(scenario())


def test_session_cache_is_bounded_and_keeps_followers() -> None:
    cache = FetchSessions(max_slots=2, evict_after_s=120)
    a = cache.open(-1)
    b = cache.open(-1)
    assert a is not None and b is not None
    assert cache.open(-1) is None  # full of sessions in use: the consumer goes sessionless
    f = cache.open(3)  # a follower evicts the least recently used consumer session
    assert f is not None and not a.alive and b.alive
    assert cache.open(4) is not None and not b.alive
    assert cache.open(5) is None  # only followers left, all in use
    f.last_fetch -= 121  # idle past the eviction age: anyone may take its place
    assert cache.open(-1) is not None and not f.alive
    assert cache.evictions == 3
    # A follower's new session replaces its old one (one fetcher per leader).
    again = cache.open(4)
    assert again is not None and again.alive
    assert sum(s.replica == 4 for s in cache.sessions.values()) == 1


def _leader_with_follower(tmp_path: Path) -> tuple[Partition, FollowerState]:
    plog = PartitionLog(str(tmp_path / "t-0"), LogConfig())
    part = Partition("t", 0, plog, node_id=1)
    image = PartitionImage(replicas=[1, 2], isr=[1, 2], leader=1, leader_epoch=1)
    assert part.update(image, min_isr=1) == "leader"
    return part, part.followers[2]


def test_unchanged_partition_in_a_live_session_stays_in_the_isr(tmp_path: Path) -> None:
    part, follower = _leader_with_follower(tmp_path)
    cache = FetchSessions()
    session = cache.open(2)
    assert session is not None
    cache.put(session, "t", (0, 0, 1 << 20, 1, 0, -1))
    part.on_follower_fetch(2, 0, session)  # caught up: the log is empty
    lag = 1.0
    # Long after the last fetch that named the partition, the session keeps fetching.
    follower.last_caught_up -= 10
    follower.last_fetch -= 10
    session.last_fetch = time.monotonic()
    assert part.isr_change(lag, lambda _: True) is None
    # An append after that idle time: the follower was caught up until it.
    part.on_change = cache.changed
    data = memoryview(bytearray(record_batch([b"x"])))
    part.append(data, validate_batches(data, 1 << 20))
    assert ("t", 0) in session.dirty
    assert part.isr_change(lag, lambda _: True) is None
    # The session stops fetching: the follower falls out once the lag time passes.
    session.last_fetch -= 10
    follower.last_caught_up -= 10
    assert part.isr_change(lag, lambda _: True) == [1]
    # A session that was closed no longer vouches for anything.
    session.last_fetch = time.monotonic()
    cache.close(session.id)
    assert part.isr_change(lag, lambda _: True) == [1]


def _no_metadata() -> MetadataView:
    """An image that knows no partition: the leader a fetch finds is all it reads."""

    class NoController:
        async def call(self, op: str, body: dict, within_s: float = 15.0) -> dict:
            raise AssertionError("a fetch does not catch up with the metadata log")

    quorum = SimpleNamespace(image=MetadataImage())
    return MetadataView(quorum, NoController(), SimpleNamespace())  # type: ignore[arg-type]


def _reassigning_to_3(tmp_path: Path) -> tuple[Partition, FetchSession]:
    """A leader of replicas [1, 2] and broker 3's fetch session naming the partition, as a
    reassignment adding broker 3 makes them before the leader applies it (ADDING_3)."""
    part, _ = _leader_with_follower(tmp_path)
    cache = FetchSessions()
    part.on_change = cache.changed
    session = cache.open(3)
    assert session is not None
    cache.put(session, "t", (0, 0, 1 << 20, 1, 0, -1))
    return part, session


ADDING_3 = PartitionImage(
    replicas=[1, 2, 3], isr=[1, 2], leader=1, leader_epoch=1, partition_epoch=1, adding=[3]
)


def test_a_follower_added_after_it_named_the_partition_is_visited_again(tmp_path: Path) -> None:
    """A reassignment adds broker 3. Its fetcher can learn that first and name the idle
    partition in its session before this leader knows broker 3 is a replica: that
    position goes unrecorded, and the fetcher never names an unchanged partition again.
    Once the leader applies the new replicas the partition is dirty in the session, so
    the next fetch counts the stored position and broker 3 can join the ISR (an idle
    partition would otherwise keep the reassignment from ever finishing)."""

    part, session = _reassigning_to_3(tmp_path)
    part.on_follower_fetch(3, 0, session)  # not a replica yet: nothing recorded
    assert 3 not in part.followers
    session.dirty.clear()  # the fetch that named it was answered
    assert part.update(ADDING_3, min_isr=1) is None  # same leader and epoch: no role change
    assert ("t", 0) in session.dirty
    sp = session.parts[("t", 0)]
    part.on_follower_fetch(3, sp.fetch_offset, session, sp.fetcher_log_start)
    part.followers[2].last_caught_up = time.monotonic()
    assert part.isr_change(1.0, lambda _: True) == [1, 2, 3]


def test_a_look_before_the_leader_knew_the_follower_is_taken_again_in_the_same_fetch(
    tmp_path: Path,
) -> None:
    """The same race within one fetch: its first look at the partition comes before the
    leader knows broker 3 (nothing recorded), the leader applies the reassignment while
    the fetch waits, and the look after the wake-up must record the position; a fetch
    that counted the first look as done left broker 3 out of the ISR for good (CI: a
    throttled reassignment that never finished, its new replica at 'copied -1')."""

    from straitmq.broker.api.fetch import _FetchPlan

    part, session = _reassigning_to_3(tmp_path)
    throttle = SimpleNamespace(allowance=lambda t, i, r, limit: limit, spent=lambda *a: None)
    replicas = LocalReplicas(_no_metadata(), SimpleNamespace(get=lambda t, i: part))
    deps = SimpleNamespace(replicas=replicas, throttle=throttle, incarnation=lambda b: "b3")
    ctx = SimpleNamespace(
        version=12, cluster_allowed=lambda op: True, client_id="replica-fetcher-3@b3"
    )
    req = SimpleNamespace(replica_id=3, max_bytes=1 << 20)
    plan = _FetchPlan(
        deps, ctx, req, [("t", [(0, 0, 1 << 20, 1, 0, -1)])], session, incremental=True
    )
    asyncio.run(plan.collect(plan.wanted()))  # the first look: broker 3 is no replica here yet
    assert 3 not in part.followers
    part.update(ADDING_3, min_isr=1)  # applied while the fetch waits: the partition is dirty
    asyncio.run(plan.collect(plan.wanted()))  # the look after the wake-up
    assert part.followers[3].log_end_offset == 0 and part.followers[3].session is session
    assert part.followers[3].incarnation == "b3"


def test_a_large_fetch_yields_while_collecting_and_keeps_marks_made_meanwhile(
    tmp_path: Path, monkeypatch
) -> None:
    """A restarted follower's first fetch names thousands of partitions: the leader
    collects it a slice of the event loop at a time. A partition that changes while it
    does stays marked in the session for the next fetch (answering the fetch must not
    wipe it, or the follower would not hear of that change until the next one)."""

    from straitmq.broker.api import fetch as fetch_module

    monkeypatch.setattr(fetch_module, "COLLECT_SLICE_S", 0.0)
    monkeypatch.setattr(fetch_module, "COLLECT_CHECK", 1)
    part, session = _reassigning_to_3(tmp_path)
    throttle = SimpleNamespace(allowance=lambda t, i, r, limit: limit, spent=lambda *a: None)
    replicas = LocalReplicas(_no_metadata(), SimpleNamespace(get=lambda t, i: part))
    deps = SimpleNamespace(replicas=replicas, throttle=throttle, incarnation=lambda b: "b3")
    ctx = SimpleNamespace(
        version=12, cluster_allowed=lambda op: True, client_id="replica-fetcher-3@b3"
    )
    req = SimpleNamespace(replica_id=3, max_bytes=1 << 20)
    named = [("t", [(i, 0, 1 << 20, 1, 0, -1) for i in range(50)])]
    plan = fetch_module._FetchPlan(deps, ctx, req, named, session, incremental=False)

    async def go() -> None:
        task = asyncio.get_running_loop().create_task(plan.collect(plan.wanted()))
        for _ in range(10):
            await asyncio.sleep(0)
        assert not task.done()  # it yielded part way
        session.dirty.add(("t", 0))  # already looked at: a change the answer misses
        topics, _, unsent = await task
        assert len(topics[0][1]) == 50
        plan.answered(topics, unsent)
        assert ("t", 0) in session.dirty

    asyncio.run(go())


# -- a 3+3 cluster ------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path):
    yield from cluster_factory(tmp_path)


def _sessions(node) -> dict[str, float]:
    """The broker's follower-session gauges and how many partitions it leads."""
    with urllib.request.urlopen(f"http://{node.host}:{node.http_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "straitmq_broker_leaders" or (
                s.name.startswith("straitmq_broker_fetch_sessions")
                and s.labels.get("straitmq_fetch_session_fetcher") == "follower"
            ):
                out[s.name] = s.value
    return out


def test_followers_replicate_through_sessions_and_survive_a_leader_kill(cluster) -> None:
    c = cluster()
    c.create_topic("fss", partitions=30, rf=3, min_isr=2)
    c.wait_isr("fss", 3, timeout=60)

    # Each leader holds one session per follower broker, with every partition it leads
    # (these and __consumer_offsets, all RF 3) for that follower.
    def held() -> list[dict[str, float]]:
        return [_sessions(n) for n in c.brokers.values()]

    def complete(h: dict[str, float]) -> bool:
        return (
            h.get("straitmq_broker_fetch_sessions") == 2
            and h.get("straitmq_broker_fetch_sessions_partitions")
            == 2 * h["straitmq_broker_leaders"]
        )

    wait_for(
        lambda: all(complete(h) for h in held()),
        30,
        "two follower sessions per leader holding each partition it leads",
        detail=lambda: str(held()),
    )
    # Idle partitions keep their ISR for several lag times (3 s in these tests): their
    # followers' sessions keep them caught up without naming them.
    holds(
        lambda: all(len(p["isr"]) == 3 for p in c.topic("fss")["partitions"]),
        8,
        "every ISR stays full while the topic is idle",
    )
    w = Workload(c.bootstrap, "fss", partitions=30, prefix="fs").start()
    w.wait_acked_growth(300, 30)
    # Still no ISR change after writes to partitions idle for longer than the lag time.
    assert all(len(p["isr"]) == 3 for p in c.topic("fss")["partitions"])
    victim = c.topic("fss")["partitions"][0]["leader"]
    c.brokers[victim].kill9()
    w.wait_acked_growth(300, 40)
    c.brokers[victim].start()
    c.wait_ready(60, brokers=[victim])
    c.wait_isr("fss", 3, timeout=60, exclude=(victim,))
    w.stop()
    fig = verify(c, w, "fetch-sessions-leader-kill", {"victim": victim})
    assert fig.ok(), fig.line()


def test_a_fetchers_client_id_names_its_process_and_only_for_its_own_broker() -> None:
    from straitmq.broker.replication.follower_id import fetcher_client_id, fetcher_incarnation

    cid = fetcher_client_id(3, "9f1c")
    assert fetcher_incarnation(cid, 3) == "9f1c"
    assert fetcher_incarnation(cid, 2) is None  # another broker's id claimed: not believed
    assert fetcher_incarnation("replica-fetcher-3", 3) is None  # an older broker's fetcher
    assert fetcher_incarnation("rdkafka@x", 3) is None and fetcher_incarnation(None, 3) is None


@pytest.mark.parametrize("seed", range(6))
def test_a_followers_fetch_request_encoded_directly_is_kios(seed: int) -> None:
    """The replica fetcher writes its Fetch v12 body with struct
    (protocol/fetch_request.py): the same bytes kio's writer makes of the entity, for
    any topics, partitions, forgotten partitions, session and rack."""
    rng = random.Random(seed)
    topics = [
        (
            rng.choice(["t", "topic-é", "x" * 150]) + str(i),
            [
                (
                    rng.randrange(2**31),
                    rng.randrange(-1, 2**31),
                    rng.randrange(-1, 2**62),
                    rng.randrange(-1, 2**31),
                    rng.randrange(-1, 2**62),
                    rng.randrange(2**31),
                )
                for _ in range(rng.randrange(4))
            ],
        )
        for i in range(rng.choice([0, 1, 1, 3]))
    ]
    forgotten = [
        (f"gone-{i}", [rng.randrange(2**31) for _ in range(rng.randrange(1, 200))])
        for i in range(rng.choice([0, 0, 2]))
    ]
    head = (
        rng.randrange(2**31),
        rng.randrange(2**31),
        rng.randrange(2**31),
        rng.randrange(2**31),
        rng.choice([0, 1]),
        rng.randrange(2**31),
        rng.randrange(-1, 2**31),
    )
    rack = rng.choice(["", "rack-a", "é" * 70])
    entity = FetchRequest(
        cluster_id=None,
        replica_id=head[0],
        max_wait=timedelta(milliseconds=head[1]),
        min_bytes=head[2],
        max_bytes=head[3],
        isolation_level=head[4],
        session_id=head[5],
        session_epoch=head[6],
        topics=tuple(
            FetchTopic(
                topic=name,
                partitions=tuple(
                    FetchPartition(
                        partition=p[0],
                        current_leader_epoch=p[1],
                        fetch_offset=p[2],
                        last_fetched_epoch=p[3],
                        log_start_offset=p[4],
                        partition_max_bytes=p[5],
                    )
                    for p in parts
                ),
            )
            for name, parts in topics
        ),
        forgotten_topics_data=tuple(
            ForgottenTopic(topic=name, partitions=tuple(ps)) for name, ps in forgotten
        ),
        rack_id=rack,
    )
    buf = io.BytesIO()
    _writer(request_schema(1, 12))(buf, entity)
    assert encode_fetch_v12(*head, topics, forgotten, rack) == buf.getvalue()


def test_request_headers_written_directly_are_kios() -> None:
    """KafkaConnection writes the request header (v1, or v2 without tagged fields) with
    struct: the same bytes as kio's writer, flexible APIs or not, any client id."""
    for client_id in ("replica-1", "", "é-x"):
        conn = KafkaConnection("127.0.0.1", 9, client_id)
        for api, version in ((1, 12), (1, 4), (23, 4), (18, 3), (17, 1), (36, 2), (22, 4)):
            header = request_schema(api, version).__header_schema__
            buf = io.BytesIO()
            _writer(header)(
                buf,
                header(
                    request_api_key=api,
                    request_api_version=version,
                    correlation_id=77,
                    client_id=client_id,
                ),
            )
            mine = struct.pack(">hhi", api, version, 77) + conn._client_id_bytes
            assert buf.getvalue() == mine + (b"\x00" if header.__flexible__ else b"")
