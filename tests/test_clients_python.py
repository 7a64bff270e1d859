"""Real-client conformance: confluent-kafka (librdkafka), aiokafka and kafka-python.

For each client: create a topic through its admin API, produce keyed messages with
headers in every compression codec (idempotent, acks=all), consume them with a group
of several members under each assignor the client offers, committing synchronously
after processing; then restart the broker and check that the group resumes exactly at
its committed offsets.

Every check compares exact data: what the producers' delivery reports say was written
(partition, offset, key, value, headers) must equal, per partition and in order, what
the group consumed, and the committed offsets must equal the log-end offsets.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest
from waiting import wait_for

PARTITIONS = 6
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PER_CODEC = 40  # 200 messages per group run
SESSION_MS = 10_000
HEARTBEAT_MS = 300
WAIT = 45.0  # upper bound for any single wait; normal runs take a few seconds


# -- data -------------------------------------------------------------------------------


Headers = tuple[tuple[str, bytes], ...]


@dataclass(frozen=True)
class Msg:
    key: bytes | None
    value: bytes
    headers: Headers


@dataclass(frozen=True, order=True)
class Rec:
    """A message at its place in the log: from a delivery report or a consumer."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: Headers


def make_messages(tag: str, codec: str, n: int) -> list[Msg]:
    """Keyed (some null keys), repeated keys, several headers incl. duplicates and empty."""
    out = []
    for i in range(n):
        key = None if i % 10 == 9 else f"key-{i % 23}".encode()
        value = b"" if i == 7 else (f"{tag}|{codec}|{i}|".encode() + bytes(range(i % 50)) * 3)
        headers: Headers = (
            ("seq", str(i).encode()),
            ("codec", codec.encode()),
            ("dup", b"a"),
            ("dup", b"b"),
            ("empty", b""),
        )
        if i % 5 == 0:
            headers = ()
        out.append(Msg(key, value, headers))
    return out


def norm_headers(h: object) -> Headers:
    if not h:
        return ()
    return tuple((k, bytes(v) if v is not None else None) for k, v in h)


def by_partition(recs: Sequence[Rec]) -> dict[int, list[Rec]]:
    out: dict[int, list[Rec]] = {}
    for r in recs:
        out.setdefault(r.partition, []).append(r)
    return out


def end_offsets(delivered: Sequence[Rec]) -> dict[int, int]:
    return {p: rs[-1].offset + 1 for p, rs in by_partition(sorted(delivered)).items()}


def check_delivered(msgs: Sequence[Msg], delivered: Sequence[Rec]) -> None:
    """Every message acknowledged once, at distinct offsets, in send order per partition."""
    assert len(delivered) == len(msgs)
    index = {m: i for i, m in enumerate(msgs)}
    assert len(index) == len(msgs), "test messages must be distinct"
    assert sorted(index[Msg(r.key, r.value, r.headers)] for r in delivered) == list(
        range(len(msgs))
    )
    assert len({(r.partition, r.offset) for r in delivered}) == len(delivered)
    for p, recs in by_partition(sorted(delivered)).items():
        sent = [index[Msg(r.key, r.value, r.headers)] for r in recs]
        assert sent == sorted(sent), f"partition {p}: log order differs from send order"


# -- a group run, shared by all clients ------------------------------------------------------


@dataclass
class GroupRun:
    """State shared between the consumer members (threads or tasks) and the test."""

    members: int
    received: list[list[Rec]] = field(default_factory=list)
    assignments: list[frozenset[int]] = field(default_factory=list)
    # The assignments once the group settled, before anything was produced: the ones that
    # held while the records were read (members leaving at the end reassign the rest).
    settled: list[frozenset[int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    commits: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.received = [[] for _ in range(self.members)]
        self.assignments = [frozenset() for _ in range(self.members)]

    def got(self, idx: int, recs: list[Rec]) -> None:
        with self.lock:
            self.received[idx].extend(recs)

    def assigned(self, idx: int, parts: frozenset[int]) -> None:
        with self.lock:
            self.assignments[idx] = parts

    def error(self, msg: str) -> None:
        with self.lock:
            self.errors.append(msg)

    def total(self) -> int:
        with self.lock:
            return sum(len(r) for r in self.received)

    def check(self) -> None:
        """Fail at once when a member reported an error."""
        if self.errors:
            raise AssertionError(f"consumer errors: {self.errors}")

    def describe(self) -> str:
        return f"assignments={self.assignments}, received={self.total()}"

    def balanced(self, partitions: int) -> bool:
        """Every member holds partitions, none twice, all covered."""
        with self.lock:
            a = list(self.assignments)
        union = frozenset().union(*a)
        return (
            all(a)
            and sum(len(x) for x in a) == len(union)
            and union == frozenset(range(partitions))
        )


def wait_stable(run: GroupRun, partitions: int) -> None:
    """The group has settled: a balanced assignment that holds for a moment."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        wait_for(
            lambda: run.balanced(partitions),
            max(0.1, deadline - time.monotonic()),
            "a balanced assignment",
            0.05,
            check=run.check,
            detail=run.describe,
        )
        snapshot = list(run.assignments)
        time.sleep(0.5)
        if run.balanced(partitions) and list(run.assignments) == snapshot:
            run.settled = snapshot
            return
    raise AssertionError(f"group never settled: {run.assignments}")


# -- client adapters --------------------------------------------------------------------------


class Client:
    """What each client library must provide for these tests."""

    name: str
    assignors: tuple[str, ...]

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None: ...

    def produce(self, bootstrap: str, topic: str, msgs: list[Msg], codec: str) -> list[Rec]: ...

    def start_group(
        self, bootstrap: str, topic: str, group: str, assignor: str, run: GroupRun
    ) -> list[threading.Thread]: ...

    def committed(self, bootstrap: str, group: str, topic: str) -> dict[int, int]: ...


def member_loop(
    run: GroupRun,
    idx: int,
    poll: Callable[[], list[Rec]],
    assignment: Callable[[], frozenset[int]],
    commit: Callable[[dict[int, int]], None],
) -> None:
    """Poll, record (process), then commit synchronously what was processed."""
    while not run.stop.is_set():
        recs = poll()
        run.assigned(idx, assignment())
        if not recs:
            continue
        run.got(idx, recs)
        nxt: dict[int, int] = {}
        for r in recs:
            nxt[r.partition] = r.offset + 1
        try:
            commit(nxt)
            with run.lock:
                run.commits += 1
        except Exception as e:
            run.error(f"member {idx} commit {nxt}: {e!r}")


# confluent-kafka ----------------------------------------------------------------------


class Confluent(Client):
    name = "confluent"
    assignors = ("range", "roundrobin", "cooperative-sticky")

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        futs = admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
        )
        futs[topic].result(timeout=WAIT)
        md = admin.list_topics(topic, timeout=WAIT)
        assert sorted(md.topics[topic].partitions) == list(range(partitions))

    def produce(self, bootstrap: str, topic: str, msgs: list[Msg], codec: str) -> list[Rec]:
        from confluent_kafka import Producer

        p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "compression.type": codec,
                "linger.ms": 5,
            }
        )
        delivered: list[Rec] = []
        errors: list[str] = []

        def report(sent: Msg) -> Callable:
            def on_delivery(err, m) -> None:
                # The report carries no headers; record what was sent at its place.
                if err is not None:
                    errors.append(str(err))
                else:
                    assert (m.key(), m.value() or b"") == (sent.key, sent.value)
                    delivered.append(
                        Rec(m.partition(), m.offset(), sent.key, sent.value, sent.headers)
                    )

            return on_delivery

        for m in msgs:
            p.produce(
                topic, key=m.key, value=m.value, headers=list(m.headers), on_delivery=report(m)
            )
            p.poll(0)
        assert p.flush(WAIT) == 0, "messages left undelivered"
        assert not errors, errors
        return delivered

    def start_group(
        self, bootstrap: str, topic: str, group: str, assignor: str, run: GroupRun
    ) -> list[threading.Thread]:
        from confluent_kafka import Consumer, TopicPartition

        def member(idx: int) -> None:
            c = Consumer(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": group,
                    "client.id": f"m{idx}",
                    "partition.assignment.strategy": assignor,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "session.timeout.ms": SESSION_MS,
                    "heartbeat.interval.ms": HEARTBEAT_MS,
                }
            )
            c.subscribe([topic])

            def poll() -> list[Rec]:
                out = []
                for m in c.consume(num_messages=100, timeout=0.1):
                    if m.error():
                        run.error(f"member {idx}: {m.error()}")
                        continue
                    out.append(
                        Rec(
                            m.partition(),
                            m.offset(),
                            m.key(),
                            m.value() or b"",
                            norm_headers(m.headers()),
                        )
                    )
                return out

            def commit(nxt: dict[int, int]) -> None:
                res = c.commit(
                    offsets=[TopicPartition(topic, p, o) for p, o in nxt.items()],
                    asynchronous=False,
                )
                bad = [tp for tp in res or [] if tp.error]
                if bad:
                    raise RuntimeError(bad)

            try:
                member_loop(
                    run, idx, poll, lambda: frozenset(tp.partition for tp in c.assignment()), commit
                )
            finally:
                c.close()

        return [
            threading.Thread(target=_guard(run, member), args=(i,), daemon=True)
            for i in range(run.members)
        ]

    def committed(self, bootstrap: str, group: str, topic: str) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        try:
            tps = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=WAIT)
        finally:
            c.close()
        return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}


# kafka-python -------------------------------------------------------------------------


class KafkaPython(Client):
    name = "kafka-python"
    assignors = ("range", "roundrobin", "sticky", "cooperative-sticky")

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None:
        """kafka-python negotiates CreateTopics v7 (the others use v4 or lower)."""
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            admin.create_topics(
                {topic: {"num_partitions": partitions, "replication_factor": 1}},
                wait_for_metadata=True,
            )
            (desc,) = admin.describe_topics([topic])
            assert sorted(p["partition_index"] for p in desc["partitions"]) == list(
                range(partitions)
            )
        finally:
            admin.close()

    def produce(self, bootstrap: str, topic: str, msgs: list[Msg], codec: str) -> list[Rec]:
        from kafka import KafkaProducer

        p = KafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=True,
            compression_type=None if codec == "none" else codec,
            linger_ms=5,
        )
        try:
            futs = [
                (m, p.send(topic, key=m.key, value=m.value, headers=list(m.headers))) for m in msgs
            ]
            p.flush(WAIT)
            out = []
            for m, f in futs:
                md = f.get(timeout=WAIT)
                out.append(Rec(md.partition, md.offset, m.key, m.value, m.headers))
            return out
        finally:
            p.close(timeout=5)

    def _assignor(self, name: str) -> type:
        from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
        from kafka.coordinator.assignors.range import RangePartitionAssignor
        from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
        from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

        return {
            "range": RangePartitionAssignor,
            "roundrobin": RoundRobinPartitionAssignor,
            "sticky": StickyPartitionAssignor,
            "cooperative-sticky": CooperativeStickyAssignor,
        }[name]

    def start_group(
        self, bootstrap: str, topic: str, group: str, assignor: str, run: GroupRun
    ) -> list[threading.Thread]:
        from kafka import KafkaConsumer, TopicPartition
        from kafka.structs import OffsetAndMetadata

        strategy = self._assignor(assignor)

        def member(idx: int) -> None:
            c = KafkaConsumer(
                bootstrap_servers=bootstrap,
                group_id=group,
                client_id=f"m{idx}",
                partition_assignment_strategy=[strategy],
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=HEARTBEAT_MS,
            )
            # Subscribing by pattern works around a kafka-python 3.0.12 bug. With a
            # plain subscription the first JoinGroup goes out before the subscription's
            # metadata is known; when it arrives the leader sees its assignment
            # snapshot differ from the metadata and rejoins. If poll() times out while
            # that JoinGroup is in flight, the leader's own assignment becomes current,
            # need_rejoin() turns False and the finished join task is never awaited:
            # the member never applies its partitions, stops heartbeating, fails every
            # commit with RebalanceInProgressError and is finally expired. A pattern
            # subscription makes the client refresh metadata before each join.
            c.subscribe(pattern=f"^{topic}$")

            def poll() -> list[Rec]:
                out = []
                for tp, msgs in c.poll(timeout_ms=100, max_records=100).items():
                    out += [
                        Rec(tp.partition, m.offset, m.key, m.value or b"", norm_headers(m.headers))
                        for m in msgs
                    ]
                return out

            def commit(nxt: dict[int, int]) -> None:
                c.commit(
                    {TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in nxt.items()}
                )

            try:
                member_loop(
                    run, idx, poll, lambda: frozenset(tp.partition for tp in c.assignment()), commit
                )
            finally:
                c.close(autocommit=False)

        return [
            threading.Thread(target=_guard(run, member), args=(i,), daemon=True)
            for i in range(run.members)
        ]

    def committed(self, bootstrap: str, group: str, topic: str) -> dict[int, int]:
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            offsets = admin.list_group_offsets(group)[group]
        finally:
            admin.close()
        return {
            tp.partition: om.offset
            for tp, om in offsets.items()
            if tp.topic == topic and om.offset >= 0
        }


# aiokafka -------------------------------------------------------------------------------


class AioKafka(Client):
    """All members run as tasks of one event loop, in one thread."""

    name = "aiokafka"
    assignors = ("range", "roundrobin", "sticky")

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None:
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic

        async def go() -> None:
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await admin.start()
            try:
                await admin.create_topics(
                    [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
                )
                (desc,) = await admin.describe_topics([topic])
                assert desc["error_code"] == 0, desc
                assert sorted(p["partition"] for p in desc["partitions"]) == list(range(partitions))
            finally:
                await admin.close()

        asyncio.run(go())

    def produce(self, bootstrap: str, topic: str, msgs: list[Msg], codec: str) -> list[Rec]:
        from aiokafka import AIOKafkaProducer

        async def go() -> list[Rec]:
            p = AIOKafkaProducer(
                bootstrap_servers=bootstrap,
                acks="all",
                enable_idempotence=True,
                linger_ms=5,
                compression_type=None if codec == "none" else codec,
            )
            await p.start()
            try:
                futs = [
                    await p.send(topic, key=m.key, value=m.value, headers=list(m.headers))
                    for m in msgs
                ]
                mds = await asyncio.wait_for(asyncio.gather(*futs), WAIT)
            finally:
                await p.stop()
            return [
                Rec(md.partition, md.offset, m.key, m.value, m.headers)
                for m, md in zip(msgs, mds, strict=True)
            ]

        return asyncio.run(go())

    def _assignor(self, name: str) -> type:
        from aiokafka.coordinator.assignors.range import RangePartitionAssignor
        from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
        from aiokafka.coordinator.assignors.sticky.sticky_assignor import (
            StickyPartitionAssignor,
        )

        return {
            "range": RangePartitionAssignor,
            "roundrobin": RoundRobinPartitionAssignor,
            "sticky": StickyPartitionAssignor,
        }[name]

    def start_group(
        self, bootstrap: str, topic: str, group: str, assignor: str, run: GroupRun
    ) -> list[threading.Thread]:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        strategy = self._assignor(assignor)

        async def member(idx: int) -> None:
            c = AIOKafkaConsumer(
                bootstrap_servers=bootstrap,
                group_id=group,
                client_id=f"m{idx}",
                partition_assignment_strategy=(strategy,),
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                session_timeout_ms=SESSION_MS,
                heartbeat_interval_ms=HEARTBEAT_MS,
            )
            await c.start()
            c.subscribe([topic])
            try:
                while not run.stop.is_set():
                    batches = await c.getmany(timeout_ms=100, max_records=100)
                    run.assigned(idx, frozenset(tp.partition for tp in c.assignment()))
                    recs = [
                        Rec(tp.partition, m.offset, m.key, m.value or b"", norm_headers(m.headers))
                        for tp, ms in batches.items()
                        for m in ms
                    ]
                    if not recs:
                        continue
                    run.got(idx, recs)
                    nxt = {TopicPartition(topic, r.partition): r.offset + 1 for r in recs}
                    try:
                        await c.commit(nxt)
                        with run.lock:
                            run.commits += 1
                    except Exception as e:
                        run.error(f"member {idx} commit {nxt}: {e!r}")
            finally:
                await c.stop()

        async def all_members() -> None:
            await asyncio.gather(*(_aguard(run, member(i)) for i in range(run.members)))

        return [threading.Thread(target=lambda: asyncio.run(all_members()), daemon=True)]

    def committed(self, bootstrap: str, group: str, topic: str) -> dict[int, int]:
        from aiokafka.admin import AIOKafkaAdminClient

        async def go() -> dict[int, int]:
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await admin.start()
            try:
                offsets = await admin.list_consumer_group_offsets(group)
            finally:
                await admin.close()
            return {
                tp.partition: om.offset
                for tp, om in offsets.items()
                if tp.topic == topic and om.offset >= 0
            }

        return asyncio.run(go())


def _guard(run: GroupRun, fn: Callable[[int], None]) -> Callable[[int], None]:
    def wrapped(idx: int) -> None:
        try:
            fn(idx)
        except Exception as e:
            run.error(f"member {idx} crashed: {e!r}")

    return wrapped


async def _aguard(run: GroupRun, coro: object) -> None:
    try:
        await coro  # type: ignore[misc]
    except Exception as e:
        run.error(f"member crashed: {e!r}")


CLIENTS: dict[str, Client] = {c.name: c for c in (Confluent(), KafkaPython(), AioKafka())}


# -- scenario helpers --------------------------------------------------------------------


def produce_all_codecs(
    client: Client, bootstrap: str, topic: str, tag: str, per_codec: int = PER_CODEC
) -> list[Rec]:
    delivered: list[Rec] = []
    for codec in CODECS:
        msgs = make_messages(tag, codec, per_codec)
        got = client.produce(bootstrap, topic, msgs, codec)
        check_delivered(msgs, got)
        delivered += got
    return delivered


def consume_in_group(
    client: Client,
    bootstrap: str,
    topic: str,
    group: str,
    assignor: str,
    members: int,
    produce: Callable[[], list[Rec]] | None = None,
    expected: list[Rec] | None = None,
) -> tuple[GroupRun, list[Rec]]:
    """Start the members; once the group is settled run `produce` (if any); consume until
    everything expected arrived and is committed (so anything extra would be in too)."""
    run = GroupRun(members)
    threads = client.start_group(bootstrap, topic, group, assignor, run)
    for t in threads:
        t.start()
    try:
        wait_stable(run, PARTITIONS)
        if produce is not None:
            expected = produce()
        assert expected is not None
        wait_for(
            lambda: run.total() >= len(expected),
            WAIT,
            f"{len(expected)} messages",
            0.05,
            check=run.check,
            detail=run.describe,
        )
        # Members record what they poll, then commit it: once every partition's commit
        # is at its end, everything delivered is recorded, and a member that takes a
        # partition over starts at its end, so no duplicate can come any more.
        ends = end_offsets(expected)

        def all_committed() -> bool:
            committed = client.committed(bootstrap, group, topic)
            return all(committed.get(p) == end for p, end in ends.items())

        wait_for(all_committed, WAIT, "every record committed", 0.2, check=run.check)
    finally:
        run.stop.set()
        for t in threads:
            t.join(WAIT)
    assert not any(t.is_alive() for t in threads), "a consumer did not shut down"
    assert not run.errors, run.errors
    assert run.commits >= sum(1 for r in run.received if r), "members did not commit"
    return run, expected


def check_consumed(run: GroupRun, delivered: list[Rec]) -> None:
    """Exactly the delivered records, each partition read by one member, in log order."""
    expected = by_partition(sorted(delivered))
    consumed: dict[int, list[Rec]] = {}
    owner: dict[int, set[int]] = {}
    for idx, recs in enumerate(run.received):
        for p, rs in by_partition(recs).items():
            consumed.setdefault(p, []).extend(rs)
            owner.setdefault(p, set()).add(idx)
    assert sorted(consumed) == sorted(expected)
    for p in expected:
        assert consumed[p] == expected[p], f"partition {p} differs"
        # Offsets are dense and the producer's send order holds within the partition.
        offs = [r.offset for r in consumed[p]]
        assert offs == list(range(offs[0], offs[0] + len(offs))), f"gap in partition {p}"
    assert all(len(o) == 1 for o in owner.values()), f"partition read by several: {owner}"


def check_split(run: GroupRun) -> None:
    sizes = sorted(len(a) for a in run.settled)
    assert sizes[0] >= 1 and sizes[-1] - sizes[0] <= 1, run.settled
    assert all(run.received), "a member received nothing"


def new_names() -> tuple[str, str]:
    u = uuid.uuid4().hex[:8]
    return f"conf-{u}", f"group-{u}"


# -- tests --------------------------------------------------------------------------------


GROUP_CASES = [(c.name, a) for c in CLIENTS.values() for a in c.assignors]


@pytest.mark.parametrize(
    ("client_name", "assignor"), GROUP_CASES, ids=[f"{c}-{a}" for c, a in GROUP_CASES]
)
def test_group_consumes_every_codec(broker, client_name: str, assignor: str) -> None:
    """Admin-created topic; 3 members settle, then 5 codecs x 40 messages are produced;
    the group reads each exactly once, in order, split across members, all committed."""
    client = CLIENTS[client_name]
    topic, group = new_names()
    client.create_topic(broker.bootstrap, topic, PARTITIONS)

    run, delivered = consume_in_group(
        client,
        broker.bootstrap,
        topic,
        group,
        assignor,
        members=3,
        produce=lambda: produce_all_codecs(client, broker.bootstrap, topic, "a"),
    )
    assert set(end_offsets(delivered)) == set(range(PARTITIONS)), "a partition got nothing"
    check_consumed(run, delivered)
    check_split(run)
    assert client.committed(broker.bootstrap, group, topic) == end_offsets(delivered)


@pytest.mark.parametrize("client_name", list(CLIENTS))
@pytest.mark.parametrize("how", ["restart", "kill9"])
def test_group_resumes_after_restart(broker, client_name: str, how: str) -> None:
    """Offsets committed synchronously after processing survive a restart (clean or
    SIGKILL): a new member of the group reads exactly what was produced afterwards."""
    client = CLIENTS[client_name]
    topic, group = new_names()
    client.create_topic(broker.bootstrap, topic, PARTITIONS)
    assignor = client.assignors[0]

    run, first = consume_in_group(
        client,
        broker.bootstrap,
        topic,
        group,
        assignor,
        members=2,
        produce=lambda: produce_all_codecs(client, broker.bootstrap, topic, "before", 20),
    )
    check_consumed(run, first)
    committed = client.committed(broker.bootstrap, group, topic)
    assert committed == end_offsets(first)

    if how == "restart":
        broker.restart()
    else:
        broker.kill9()
        broker.start()

    assert client.committed(broker.bootstrap, group, topic) == committed
    second = produce_all_codecs(client, broker.bootstrap, topic, "after", 20)
    # The log continues where it ended before the restart: nothing lost, nothing doubled.
    assert {p: rs[0].offset for p, rs in by_partition(sorted(second)).items()} == {
        p: committed.get(p, 0) for p in by_partition(second)
    }

    # A fresh consumer in the same group (auto.offset.reset=earliest, so lost commits
    # would show up as re-read messages) must see exactly the new messages.
    run, _ = consume_in_group(
        client, broker.bootstrap, topic, group, assignor, members=1, expected=second
    )
    check_consumed(run, second)
    assert client.committed(broker.bootstrap, group, topic) == end_offsets(first + second)
