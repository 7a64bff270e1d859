"""Kafka Streams and Kafka Connect (Apache Kafka 4.4 jars from Maven Central, unchanged)
against a 3-broker StraitMQ cluster: the stateful half of the ecosystem, which keeps its
state in compacted topics, here cleaned by the log cleaner while the programs run.

- Streams: a word count (tools/java/kafka-4.4/apps/WordCountApp.java: groupBy, so a
  repartition topic, and count() into a RocksDB store, so a compacted changelog topic),
  at-least-once and exactly-once (transactions). The last count per word in the output
  topic equals a plain Python count of the input; the changelog is
  `cleanup.policy=compact` (DescribeConfigs), and the cleaner compacts it (Streams'
  `topic.` settings roll its segments at every append).
  Then the application stops, its local state directory is wiped, and it starts again:
  it rebuilds the store from the compacted changelog (its restore listener says how many
  records it read) and the counts go on from there as more input arrives.
- Connect in distributed mode (org.apache.kafka.connect.cli.ConnectDistributed, JSON
  converters, connect-file on the classpath): a FileStreamSource and a FileStreamSink
  created through Connect's REST API copy a file through a topic into another file, in
  parts. The worker creates its config and status topics (compacted); the offsets topic,
  made by the test with short segments, is compacted by the cleaner. The worker is killed
  with SIGKILL once both connectors' offsets are committed; lines are appended; a new
  worker reads its connectors back from the config topic and its offsets from the
  offsets topic: the connectors run again without being created again, the new lines
  arrive, and no line reaches the sink file twice. Twice: with Connect's defaults, and
  with exactly-once source support (KIP-618: the source task's records and offsets in
  one transaction, zombie fencing, transactional config writes, read_committed reads).

One cluster serves both tests (their topics and groups differ). Set ECOSYSTEM_BROKERS=kafka
to run the same tests against Apache Kafka 4.4 (bench/kafka_ref.py), which tells a fault of
this harness from one of StraitMQ's. Each Java program writes its stdout and its log
(INFO) next to the test's data; a failure message names them and the brokers' logs.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from ecosystem_support import (
    Backend,
    JavaApp,
    JavaApps,
    clusters,
    create_topics,
    end_offsets,
    read_topic,
    topic_config,
    topic_names,
)
from straitmq.cli.local_cluster import free_port
from waiting import wait_for

pytestmark = pytest.mark.timeout(300)

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima".split()
CONNECT_MAIN = "org.apache.kafka.connect.cli.ConnectDistributed"
FILE_SOURCE = "org.apache.kafka.connect.file.FileStreamSourceConnector"
FILE_SINK = "org.apache.kafka.connect.file.FileStreamSinkConnector"


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    with clusters(tmp_path_factory.mktemp("streams-connect")) as start:
        yield start("strait", 3)


@pytest.fixture
def apps() -> Iterator[JavaApps]:
    started = JavaApps()
    yield started
    started.close()


# -- Kafka Streams -------------------------------------------------------------------------


def produce_lines(bootstrap: str, topic: str, lines: list[str], first: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i, line in enumerate(lines, first):
        p.produce(topic, key=str(i).encode(), value=line.encode())
    assert p.flush(30) == 0, "input not acknowledged in 30 s"


class LatestCounts:
    """Follows the output topic from its start: the last count seen per word."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "wc-check", "enable.auto.commit": False}
        )
        self.consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        )
        self.latest: dict[str, int] = {}
        self.records = 0

    def poll(self) -> dict[str, int]:
        while (m := self.consumer.poll(0.2)) is not None:
            assert not m.error(), m.error()
            (count,) = struct.unpack(">q", m.value())  # Serdes.Long: 8 bytes, big-endian
            self.latest[m.key().decode()] = count
            self.records += 1
        return self.latest

    def close(self) -> None:
        self.consumer.close()


def word_count(
    apps: JavaApps, backend: Backend, name: str, state_dir: Path, logs: Path, guarantee: str
) -> JavaApp:
    app_id = f"wc-{guarantee}"
    app = apps.start(
        name,
        "WordCountApp",
        [
            "--bootstrap",
            backend.bootstrap,
            "--application-id",
            app_id,
            "--state-dir",
            state_dir,
            "--input",
            f"{app_id}-input",
            "--output",
            f"{app_id}-output",
            f"processing.guarantee={guarantee}",
            f"replication.factor={backend.rf}",
            # Streams' internal topics (the changelog among them) roll a segment at every
            # append (1 ms) and are worth cleaning at once: the cleaner compacts the changelog
            # while the application runs, and the restart restores from what is left.
            "topic.segment.ms=1",
            "topic.min.cleanable.dirty.ratio=0.01",
        ],
        logs,
        log_level="INFO",
    )
    app.wait_line(lambda line: line.endswith(" RUNNING"), 120, "state RUNNING")
    return app


# processing.guarantee: at-least-once, and exactly-once (v2: one transactional producer
# per thread), where the changelog holds transactional batches and commit markers, which
# the cleaner compacts by Kafka's rules for transactions.
GUARANTEES = ["at_least_once", "exactly_once_v2"]


@pytest.mark.parametrize("guarantee", GUARANTEES)
def test_streams_word_count_rebuilds_state_from_changelog(
    backend: Backend, apps: JavaApps, tmp_path: Path, guarantee: str
) -> None:
    b = backend.bootstrap
    app_id = f"wc-{guarantee}"
    source, output = f"{app_id}-input", f"{app_id}-output"
    create_topics(b, {source: 3, output: 3}, backend.rf)
    rng = random.Random(25)
    batch1 = [" ".join(rng.choices(WORDS, k=rng.randint(1, 6))) for _ in range(150)]
    batch2 = [" ".join(rng.choices(WORDS, k=rng.randint(1, 6))) for _ in range(100)]
    state_dir = tmp_path / "wc-state"
    counts = LatestCounts(b, output, 3)
    try:
        app = word_count(apps, backend, "wordcount-1", state_dir, tmp_path, guarantee)
        # The first batch in three parts, each counted before the next is sent: the
        # changelog gets appends at different times, so it has closed segments to clean.
        for part in range(3):
            lines = batch1[50 * part : 50 * (part + 1)]
            produce_lines(b, source, lines, 50 * part)
            expected = Counter(" ".join(batch1[: 50 * (part + 1)]).split())
            wait_for(
                lambda expected=expected: counts.poll() == expected,
                90,
                f"the word counts of the first batch's part {part + 1}",
                0.2,
                check=app.check_alive,
                detail=lambda expected=expected: (
                    f"got {counts.latest}, want {dict(expected)}; brokers: {backend.logs}"
                ),
            )

        # The state lives in a compacted changelog; groupBy went through a repartition topic.
        changelog = f"{app_id}-word-counts-changelog"
        repartition = f"{app_id}-words-repartition"
        assert {changelog, repartition} <= topic_names(b), topic_names(b)
        assert topic_config(b, changelog)["cleanup.policy"] == "compact"
        assert topic_config(b, repartition)["cleanup.policy"] == "delete"

        # With the cache off, every count update went to the changelog; the cleaner then
        # keeps the latest per word (and the active segment).
        updates = sum(expected.values())
        ends = sum(end_offsets(b, changelog).values())
        # (exactly once: the transactions' commit markers take offsets too)
        assert ends == updates if guarantee == "at_least_once" else ends > updates

        def changelog_records() -> int:
            return sum(len(recs) for recs in read_topic(b, changelog).values())

        left = wait_for(
            lambda: (n := changelog_records()) < updates and n,
            60,
            f"the cleaner compacting {changelog} ({updates} records)",
            0.5,
            check=app.check_alive,
            detail=lambda: f"brokers: {backend.logs}",
        )

        # Stop (a clean close commits the offsets), lose the local state, start again.
        assert app.stop() == 143, app.log_tail()  # SIGTERM, after the shutdown hook
        assert "closed" in app.lines, app.log_tail()
        assert (state_dir / app_id).is_dir(), "the store was not where the test wipes it"
        shutil.rmtree(state_dir)
        app = word_count(apps, backend, "wordcount-2", state_dir, tmp_path, guarantee)
        restored = [line.split() for line in app.lines if line.startswith("restored ")]
        # restored <store> <topic> <partition> <records>
        assert {r[2] for r in restored} == {changelog}, app.lines
        read_back = sum(int(r[4]) for r in restored)
        # The compacted changelog: at least the latest record of every word, at most what
        # was left when the test looked (the cleaner may have gone on since).
        assert len(expected) <= read_back <= left, (read_back, left, app.lines)

        produce_lines(b, source, batch2, len(batch1))
        expected = Counter(" ".join(batch1 + batch2).split())
        wait_for(
            lambda: counts.poll() == expected,
            90,
            "the word counts of both batches (continuing from the restored state)",
            0.2,
            check=app.check_alive,
            detail=lambda: f"got {counts.latest}, want {dict(expected)}; brokers: {backend.logs}",
        )
        assert app.stop() == 143, app.log_tail()
    finally:
        counts.close()


# -- Kafka Connect (distributed) -----------------------------------------------------------


def rest(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
    """One call to a Connect worker's REST API: (status, parsed JSON or None)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            data = r.read()
            return r.status, json.loads(data) if data else None
    except urllib.error.HTTPError as e:
        data = e.read()
        try:
            return e.code, json.loads(data) if data else None
        except ValueError:
            return e.code, data.decode(errors="replace")


def connect_worker(
    apps: JavaApps, backend: Backend, name: str, logs: Path, group: str, eos: bool
) -> tuple[JavaApp, int]:
    """A worker of the Connect cluster `group` (its topics are named after it); with `eos`,
    exactly-once source support (KIP-618: transactional source tasks and config writes,
    read_committed reads) and read_committed sink consumers."""
    port = free_port()
    props = {
        "bootstrap.servers": backend.bootstrap,
        "group.id": group,
        "config.storage.topic": f"{group}-configs",
        "offset.storage.topic": f"{group}-offsets",
        "status.storage.topic": f"{group}-status",
        "config.storage.replication.factor": backend.rf,
        "offset.storage.replication.factor": backend.rf,
        "status.storage.replication.factor": backend.rf,
        "offset.storage.partitions": 3,
        "status.storage.partitions": 1,
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "listeners": f"http://127.0.0.1:{port}",
        "rest.advertised.host.name": "127.0.0.1",
        "rest.advertised.port": port,
        # Commit source offsets and sink consumer offsets twice a second.
        "offset.flush.interval.ms": 500,
        # A worker killed with SIGKILL leaves the groups within seconds, not Kafka's
        # defaults (10 s for the workers, 45 s for the sink's consumer group), and its
        # work is given out again at once rather than after 5 minutes.
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 1000,
        "rebalance.timeout.ms": 20000,
        "scheduled.rebalance.max.delay.ms": 0,
        "consumer.session.timeout.ms": 6000,
        "consumer.heartbeat.interval.ms": 1000,
        "task.shutdown.graceful.timeout.ms": 5000,
    }
    if eos:
        props["exactly.once.source.support"] = "enabled"
        props["consumer.isolation.level"] = "read_committed"
    cfg = logs / f"{name}.properties"
    cfg.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    worker = apps.start(name, CONNECT_MAIN, [cfg], logs, log_level="INFO")

    def herder_up() -> bool:
        return rest(port, "GET", "/connectors")[0] == 200

    wait_for(
        herder_up, 120, f"{name}: its REST API", 0.5, check=worker.check_alive, ignore=(OSError,)
    )
    return worker, port


def connector_offsets(port: int, name: str) -> list[dict]:
    status, body = rest(port, "GET", f"/connectors/{name}/offsets")
    return body["offsets"] if status == 200 and isinstance(body, dict) else []


def running(port: int, name: str) -> bool:
    status, body = rest(port, "GET", f"/connectors/{name}/status")
    if status != 200 or not isinstance(body, dict):
        return False
    tasks = body.get("tasks", [])
    return (
        body["connector"]["state"] == "RUNNING"
        and len(tasks) == 1
        and tasks[0]["state"] == "RUNNING"
    )


def numbered(first: int, end: int, text: str) -> str:
    return "".join(f"line {i:04d} {text}\n" for i in range(first, end))


@pytest.mark.parametrize("eos", [False, True], ids=["at_least_once", "exactly_once_source"])
def test_connect_distributed_file_connectors_survive_worker_kill(
    backend: Backend, apps: JavaApps, tmp_path: Path, eos: bool
) -> None:
    b = backend.bootstrap
    group = "connect-eos" if eos else "connect"
    lines_topic, offsets_topic = f"{group}-lines", f"{group}-offsets"
    # One partition: the sink writes the lines in the order the source read them.
    create_topics(b, {lines_topic: 1}, backend.rf)
    # The worker creates its config and status topics itself; the offsets topic is made
    # here, as an operator may, compacted and rolling a segment at every append, so that
    # the cleaner has cleaned it before the restarted worker reads its offsets back.
    create_topics(
        b,
        {offsets_topic: 1},
        backend.rf,
        {"cleanup.policy": "compact", "segment.ms": "1", "min.cleanable.dirty.ratio": "0.01"},
    )
    source, sink = tmp_path / "source.txt", tmp_path / "sink.txt"
    source.write_text(numbered(0, 40, "of the source file"))
    worker, port = connect_worker(apps, backend, "connect-1", tmp_path, group, eos)

    connectors = {
        f"{group}-file-source": {
            "connector.class": FILE_SOURCE,
            "tasks.max": "1",
            "file": str(source),
            "topic": lines_topic,
        },
        f"{group}-file-sink": {
            "connector.class": FILE_SINK,
            "tasks.max": "1",
            "file": str(sink),
            "topics": lines_topic,
        },
    }
    for name, config in connectors.items():
        # 409 while the worker's group rebalances; created is 201.
        wait_for(
            lambda name=name, config=config: (
                rest(port, "POST", "/connectors", {"name": name, "config": config})[0] == 201
            ),
            60,
            f"POST /connectors {name}",
            0.5,
            check=worker.check_alive,
        )

    def copied() -> bool:
        return sink.exists() and sink.read_text() == source.read_text()

    def detail() -> str:
        got = sink.read_text() if sink.exists() else ""
        return (
            f"sink has {got.count(chr(10))} lines, source {source.read_text().count(chr(10))}; "
            f"worker log {worker.err_path}; brokers: {backend.logs}"
        )

    wait_for(
        copied,
        90,
        "the sink file to equal the source file",
        0.2,
        check=worker.check_alive,
        detail=detail,
    )

    def source_position() -> int | None:
        """The source's committed position in its file (from the offsets topic)."""
        offsets = connector_offsets(port, f"{group}-file-source")
        return offsets[0]["offset"].get("position") if len(offsets) == 1 else None

    # Three more parts, each copied and its position committed before the next: four
    # records of the one key (the file) in the offsets topic, in four segments.
    for first in (40, 60, 80):
        wait_for(
            lambda: source_position() == source.stat().st_size,
            60,
            f"the source's position committed at line {first}",
            0.5,
            check=worker.check_alive,
        )
        with source.open("a") as f:
            f.write(numbered(first, first + 20, "of the source file"))
        wait_for(
            copied,
            60,
            f"the sink file to equal the source file up to line {first + 19}",
            0.2,
            check=worker.check_alive,
            detail=detail,
        )
    for topic in (f"{group}-configs", offsets_topic, f"{group}-status"):
        assert topic_config(b, topic)["cleanup.policy"] == "compact", topic

    def committed() -> bool:
        """Both connectors' offsets are committed up to the end: the source's file position
        (in the offsets topic) and the sink's consumer group offset, one past the last
        line's record (a transaction's commit marker may follow it)."""
        sink_offsets = [
            o["offset"].get("kafka_offset") for o in connector_offsets(port, f"{group}-file-sink")
        ]
        last = read_topic(b, lines_topic)[0][-1].offset
        return source_position() == source.stat().st_size and sink_offsets == [last + 1]

    wait_for(committed, 60, "both connectors' offsets committed", 0.5, check=worker.check_alive)

    def offsets_records() -> int:
        return len(read_topic(b, offsets_topic)[0])

    # Four positions or more were committed; once cleaned, the one key keeps its latest
    # record in the cleaned segments and the one in the active segment.
    wait_for(
        lambda: offsets_records() <= 2,
        60,
        f"the cleaner compacting {offsets_topic}",
        0.5,
        check=worker.check_alive,
        detail=lambda: f"{offsets_records()} records; brokers: {backend.logs}",
    )
    worker.kill9()

    with source.open("a") as f:
        f.write(numbered(100, 150, "appended while no worker ran"))
    worker, port = connect_worker(apps, backend, "connect-2", tmp_path, group, eos)
    # The connectors come back from the config topic: nothing is created again.
    wait_for(
        lambda: sorted(rest(port, "GET", "/connectors")[1] or []) == sorted(connectors),
        60,
        f"the connectors read back from {group}-configs",
        0.5,
        check=worker.check_alive,
    )
    wait_for(
        lambda: running(port, f"{group}-file-source") and running(port, f"{group}-file-sink"),
        60,
        "both connectors RUNNING on the new worker",
        0.5,
        check=worker.check_alive,
    )
    # The new lines arrive, and nothing before them twice (the source resumes at its
    # committed position, the sink at its committed offset: a re-delivery would come before
    # the new lines, so the files could never be equal).
    wait_for(
        copied,
        90,
        "the appended lines in the sink file",
        0.2,
        check=worker.check_alive,
        detail=detail,
    )
    lines = sink.read_text().splitlines()
    assert len(lines) == 150 and len(set(lines)) == 150
    assert len(read_topic(b, lines_topic)[0]) == 150, "a line was produced twice"
