"""MirrorMaker 2 (connect-mirror 4.4 from Maven Central, unchanged: the dedicated
`org.apache.kafka.connect.mirror.MirrorMaker` with an mm2.properties) moving a topic and its
consumer groups (a) from Apache Kafka 4.4 (bench/kafka_ref.py) to StraitMQ, the migration
path, and (b) between two StraitMQ clusters.

Each flow: a topic of two partitions with keys, headers and a topic config on the source,
and a compacted topic with a tombstone. The target gets `<source alias>.<topic>` with the
same records (keys, values, headers, timestamps, in order) and config (the compacted one
compacted), and MirrorMaker's compacted internal topics (checkpoints on the target,
offset syncs on the source), and two consumer groups move.

What MM2 guarantees for offsets (OffsetSyncStore, KAFKA-14666): a translated offset is
never past the group's position on the source (no record is skipped); it is exact for a
group at the end of a quiet partition (MM2 writes the offset sync of the last record it
copied at each offset flush, and a group past that sync is put one record after it); a
group further behind may be put back to an older sync (it re-reads records), or not be
translated at all when its syncs were compacted or read at start-up. So each group here
has its offsets translated while it is at the end: "lagging" read the first records, then
stops while more arrive; "current" reads everything. On the target both go on exactly
where they were on the source (the target offsets never move back nor past), and read
the records produced on the source after the move, which MirrorMaker keeps copying.

One Apache Kafka broker and two single-broker StraitMQ clusters serve both tests
(different topics, groups and MirrorMaker processes). ECOSYSTEM_BROKERS=kafka runs the
StraitMQ side on Apache Kafka 4.4 instead, to check the harness itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from ecosystem_support import (
    Backend,
    JavaApp,
    JavaApps,
    Rec,
    clusters,
    committed,
    create_topics,
    end_offsets,
    read_topic,
    start_kafka_ref,
    topic_config,
    topic_names,
)
from waiting import wait_for

pytestmark = pytest.mark.timeout(300)

MM2_MAIN = "org.apache.kafka.connect.mirror.MirrorMaker"
# records per partition: before MirrorMaker starts, while it runs, after the groups moved
FIRST, SECOND, AFTER = 30, 30, 10
COMPACTED = 21  # records in the compacted topic, the last a tombstone
RETENTION = "86400000"  # a topic config MirrorMaker copies


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    b = start_kafka_ref("kafka", tmp_path_factory.mktemp("kafka-ref"))
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="module")
def straits(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Backend, Backend]]:
    with clusters(tmp_path_factory.mktemp("mm2-clusters")) as start:
        yield start("strait1", 1), start("strait2", 1)


@pytest.fixture
def apps() -> Iterator[JavaApps]:
    started = JavaApps()
    yield started
    started.close()


def produce(bootstrap: str, topic: str, first: int, per_partition: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(first, first + 2 * per_partition):
        p.produce(
            topic,
            key=b"k%d" % i,
            value=b"v%d" % i,
            partition=i % 2,
            headers=[("seq", str(i).encode())],
        )
    assert p.flush(30) == 0, "records not acknowledged in 30 s"


def commit_group(bootstrap: str, topic: str, group: str, offset: int) -> None:
    """A member of `group` reads the topic up to `offset` in both partitions, commits there
    and leaves the group."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    seen: set[tuple[int, int]] = set()

    def read() -> bool:
        seen.update((m.partition(), m.offset()) for m in c.consume(100, 0.5) if not m.error())
        return all((p, offset - 1) in seen for p in (0, 1))

    try:
        c.subscribe([topic])
        wait_for(read, 30, f"{group} reading {topic} up to {offset}", 0)
        c.commit(offsets=[TopicPartition(topic, p, offset) for p in (0, 1)], asynchronous=False)
    finally:
        c.close()


def mm2_properties(src: Backend, dst: Backend, topic: str, groups: list[str]) -> dict[str, object]:
    a, b = src.name, dst.name
    rf = min(src.rf, dst.rf)
    return {
        "clusters": f"{a}, {b}",
        f"{a}.bootstrap.servers": src.bootstrap,
        f"{b}.bootstrap.servers": dst.bootstrap,
        f"{a}->{b}.enabled": "true",
        f"{a}->{b}.topics": f"{topic}, {topic}-compacted",
        f"{a}->{b}.groups": "|".join(groups),
        f"{b}->{a}.enabled": "false",
        f"{b}->{a}.emit.heartbeats.enabled": "false",
        "tasks.max": 1,
        # the remote topic and MirrorMaker's own topics, on clusters of one broker
        "replication.factor": rf,
        "checkpoints.topic.replication.factor": rf,
        "heartbeats.topic.replication.factor": rf,
        "offset-syncs.topic.replication.factor": rf,
        "config.storage.replication.factor": rf,
        "offset.storage.replication.factor": rf,
        "status.storage.replication.factor": rf,
        # every period in seconds, not minutes: the test waits on their effects
        "refresh.topics.interval.seconds": 1,
        "refresh.groups.interval.seconds": 1,
        "emit.checkpoints.interval.seconds": 1,
        "emit.heartbeats.interval.seconds": 1,
        "sync.group.offsets.enabled": "true",
        "sync.group.offsets.interval.seconds": 1,
        # The offset sync of the last copied record is written at each offset flush. A worker
        # setting: MirrorMaker reads those from the target cluster's prefix.
        f"{b}.offset.flush.interval.ms": 500,
    }


def mirror(apps: JavaApps, src: Backend, dst: Backend, topic: str, logs: Path, name: str) -> None:
    """The whole check for one source -> target flow."""
    lagging, current = f"{topic}-lagging", f"{topic}-current"
    remote = f"{src.name}.{topic}"
    create_topics(src.bootstrap, {topic: 2}, src.rf, {"retention.ms": RETENTION})
    produce(src.bootstrap, topic, 0, FIRST)
    commit_group(src.bootstrap, topic, lagging, FIRST)
    # A compacted topic too: keys written several times, and a tombstone.
    compacted = f"{topic}-compacted"
    create_topics(src.bootstrap, {compacted: 1}, src.rf, {"cleanup.policy": "compact"})
    p = Producer({"bootstrap.servers": src.bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(COMPACTED - 1):
        p.produce(compacted, key=b"key-%d" % (i % 5), value=b"state %d" % i)
    p.produce(compacted, key=b"key-0", value=None)
    assert p.flush(30) == 0

    cfg = logs / f"{name}.properties"
    props = mm2_properties(src, dst, topic, [lagging, current])
    cfg.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    mm2: JavaApp = apps.start(name, MM2_MAIN, [cfg], logs, log_level="INFO")

    t0 = time.monotonic()

    def phase(what: str) -> None:
        print(f"{name}: {what} after {time.monotonic() - t0:.1f}s", flush=True)

    def detail() -> str:
        return f"MirrorMaker log {mm2.err_path}; {src.name}: {src.logs}; {dst.name}: {dst.logs}"

    def copied(per_partition: int) -> None:
        wait_for(
            lambda: (
                remote in topic_names(dst.bootstrap)
                and end_offsets(dst.bootstrap, remote) == {0: per_partition, 1: per_partition}
            ),
            120,
            f"{remote} on {dst.name} with {per_partition} records in each partition",
            0.5,
            check=mm2.check_alive,
            detail=detail,
        )

    def translated(group: str, offset: int) -> None:
        wait_for(
            lambda: committed(dst.bootstrap, group, remote, 2) == {0: offset, 1: offset},
            90,
            f"{group}'s offsets on {dst.name} at {offset}, as on {src.name}",
            0.5,
            check=mm2.check_alive,
            detail=lambda: f"{committed(dst.bootstrap, group, remote, 2)}; {detail()}",
        )

    # 1. The first records, and the group that read them all, whose offsets are translated
    # while it is at the end of the topic.
    copied(FIRST)
    phase("first records copied")
    wait_for(
        lambda: (
            f"{src.name}.{compacted}" in topic_names(dst.bootstrap)
            and end_offsets(dst.bootstrap, f"{src.name}.{compacted}") == {0: COMPACTED}
        ),
        60,
        f"{src.name}.{compacted} on {dst.name} with {COMPACTED} records",
        0.5,
        check=mm2.check_alive,
        detail=detail,
    )
    got = read_topic(dst.bootstrap, f"{src.name}.{compacted}")
    assert got == read_topic(src.bootstrap, compacted), "the compacted topic's records differ"
    assert got[0][-1].key == b"key-0" and got[0][-1].value is None, "the tombstone"
    assert topic_config(dst.bootstrap, f"{src.name}.{compacted}")["cleanup.policy"] == "compact"
    translated(lagging, FIRST)
    phase(f"{lagging} translated")
    # 2. More records, which that group does not read; a second group reads everything.
    produce(src.bootstrap, topic, 2 * FIRST, SECOND)
    copied(FIRST + SECOND)
    commit_group(src.bootstrap, topic, current, FIRST + SECOND)
    translated(current, FIRST + SECOND)
    phase(f"{current} translated")
    # MM2 never moves a group's target offsets back, nor past its source position.
    assert committed(dst.bootstrap, lagging, remote, 2) == {0: FIRST, 1: FIRST}

    # Same records (keys, values, headers, timestamps, offsets), the topic's config, and
    # MirrorMaker's own state in compacted topics on both sides.
    source_recs = read_topic(src.bootstrap, topic)
    assert read_topic(dst.bootstrap, remote) == source_recs, "the copied records differ"
    assert topic_config(dst.bootstrap, remote)["retention.ms"] == RETENTION
    checkpoints = f"{src.name}.checkpoints.internal"
    offset_syncs = f"mm2-offset-syncs.{dst.name}.internal"
    assert topic_config(dst.bootstrap, checkpoints)["cleanup.policy"] == "compact"
    assert topic_config(src.bootstrap, offset_syncs)["cleanup.policy"] == "compact"

    # 3. Both groups move to the target and go on where they were; records produced on the
    # source after the move reach them through MirrorMaker.
    movers = {g: Mover(dst.bootstrap, remote, g) for g in (lagging, current)}
    try:
        for m in movers.values():
            m.wait_assigned()
        produce(src.bootstrap, topic, 2 * (FIRST + SECOND), AFTER)
        total = FIRST + SECOND + AFTER
        copied(total)
        source_recs = read_topic(src.bootstrap, topic)
        for g, start in ((lagging, FIRST), (current, FIRST + SECOND)):
            movers[g].read_to(total, mm2.check_alive)
            want = {p: [r.value for r in source_recs[p][start:]] for p in (0, 1)}
            assert movers[g].values() == want, f"{g} did not go on at {start}"
        phase("groups moved")
    finally:
        for m in movers.values():
            m.close()


class Mover:
    """A consumer of a moved group on the target (subscribed: it starts at the group's
    committed offsets)."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.group = group
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                # no committed offset would mean the start: the test would see it
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self.assigned: list[TopicPartition] = []
        self.consumer.subscribe([topic], on_assign=lambda _c, tps: self.assigned.extend(tps))
        self.records: dict[int, list[Rec]] = {0: [], 1: []}

    def poll(self) -> None:
        for m in self.consumer.consume(100, 0.2):
            assert not m.error(), m.error()
            self.records[m.partition()].append(
                Rec(m.offset(), m.key(), m.value(), m.timestamp()[1])
            )

    def wait_assigned(self) -> None:
        def assigned() -> bool:
            self.poll()
            return len(self.assigned) == 2

        wait_for(assigned, 30, f"{self.group}: both partitions assigned on the target", 0)

    def read_to(self, end: int, check: Callable[[], object]) -> None:
        def done() -> bool:
            self.poll()
            return all(recs and recs[-1].offset >= end - 1 for recs in self.records.values())

        wait_for(done, 60, f"{self.group}: reading the target up to {end}", 0, check=check)

    def values(self) -> dict[int, list[bytes | None]]:
        return {p: [r.value for r in recs] for p, recs in self.records.items()}

    def close(self) -> None:
        self.consumer.close()


def test_mirror_from_apache_kafka_to_straitmq(
    kafka: Backend, straits: tuple[Backend, Backend], apps: JavaApps, tmp_path: Path
) -> None:
    mirror(apps, kafka, straits[0], "orders", tmp_path, "mm2-kafka-strait1")


def test_mirror_between_straitmq_clusters(
    straits: tuple[Backend, Backend], apps: JavaApps, tmp_path: Path
) -> None:
    mirror(apps, straits[0], straits[1], "payments", tmp_path, "mm2-strait1-strait2")
