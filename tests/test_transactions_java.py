"""Kafka transactions with the Java clients and tools of Apache Kafka 4.4 (jars from Maven
Central, unchanged) on one 3-broker StraitMQ cluster (3 controllers apart).

- Kafka Streams with `processing.guarantee=exactly_once_v2`: the word count of
  tools/java/kafka-4.4/apps/WordCountApp.java, with the leader of an input partition and
  then the transaction coordinator of the application's transactional id (found with
  ListTransactions and FindCoordinator key_type=1) killed with SIGKILL mid-run and
  restarted. Read with read_committed, each word's counts are 1, 2, ..., n exactly once:
  the last one is the plain count, nothing counted twice, nothing lost.
- The Java transactional producer and read_committed consumer
  (tools/java/kafka-4.4/apps/TxnClient.java, one command per stdin line): committed
  batches seen once (by the Java consumer and by librdkafka's; librdkafka's producer read
  by the Java consumer too), aborted ones never; a zombie fenced by a newer producer with
  the same transactional id; a transaction past its timeout aborted by the coordinator.
- `kafka-transactions` (list, describe, describe-producers, find-hanging, abort) on a
  transaction left open by a producer killed with SIGKILL: find-hanging does not list it
  (its coordinator still tracks it), `abort --start-offset` ends it on the partition and
  read_committed consumers get past it. A truly hanging transaction (a transactional
  batch no coordinator knows of) is listed by find-hanging (by partition, and by broker
  on a follower replica) and aborted the same way.
- DescribeTransactions from every broker: the coordinator describes, the others answer
  NOT_COORDINATOR (the Java admin's lookups go through such answers).

Every Java process writes its stdout and log next to the test's data; the failure
messages name them and the brokers' logs.
"""

from __future__ import annotations

import dataclasses
import queue
import random
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import suppress
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from cluster_support import Cluster, cluster_factory
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from crc32c import crc32c
from ecosystem_support import APP_JVM_ARGS, JavaApp, JavaApps, _pdeathsig
from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.list_transactions.v1.request import ListTransactionsRequest
from kio.schema.types import ProducerId, TransactionalId
from kio.static.primitive import i16
from straitmq.broker.record_codec import build_batch
from test_errors import Raw, produce, produce_partition
from test_transactions import TXN_ARGS, _producer, _read, _topic
from waiting import wait_for

from bench.javatools import KAFKA44_TOOLS, ensure_jars, java_cmd

pytestmark = pytest.mark.timeout(300)

WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliett".split()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    ensure_jars()  # fails loudly (no java, no jars) before a cluster is started
    gen = cluster_factory(tmp_path_factory.mktemp("txn-java"))
    make = next(gen)
    yield make(brokers=3, broker_args=TXN_ARGS)
    with suppress(StopIteration):
        next(gen)


@pytest.fixture
def apps() -> Iterator[JavaApps]:
    started = JavaApps()
    yield started
    started.close()


def logs_of(cluster: Cluster) -> str:
    return ", ".join(n.log_path for n in cluster.brokers.values())


# -- TxnClient: Java producers and consumers driven over stdin ------------------------------


class TxnClient:
    """tools/java/kafka-4.4/apps/TxnClient.java as a process: `call(command)` sends one
    command and returns its reply ("ok ..." or "error ...")."""

    def __init__(self, cluster: Cluster, name: str, logs: Path) -> None:
        self.name = name
        logs.mkdir(parents=True, exist_ok=True)
        self.err_path = logs / f"{name}.log"
        self._err = open(self.err_path, "ab")
        cmd = java_cmd(
            "TxnClient",
            ["--bootstrap", cluster.bootstrap],
            jvm_args=APP_JVM_ARGS,
            log_level="INFO",
            jars="4.4",
        )
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            preexec_fn=_pdeathsig
            if threading.current_thread() is threading.main_thread()
            else None,
        )
        self.replies: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self._next(60) == "ready", self.log_tail()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.replies.put(line.rstrip("\n"))

    def _next(self, timeout: float) -> str:
        try:
            return self.replies.get(timeout=timeout)
        except queue.Empty:
            code = self.proc.poll()
            raise AssertionError(
                f"{self.name}: no reply in {timeout}s (exit code {code})\n{self.log_tail()}"
            ) from None

    def log_tail(self) -> str:
        self._err.flush()
        text = self.err_path.read_text(errors="replace")
        errors = [line[:400] for line in text.splitlines() if " ERROR " in line][:10]
        return f"[{self.err_path}: its first errors]\n" + "\n".join(errors) + "\n" + text[-2000:]

    def call(self, command: str, timeout: float = 90) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self._next(timeout)

    def ok(self, command: str, timeout: float = 90) -> str:
        reply = self.call(command, timeout)
        assert reply.startswith("ok"), f"{self.name}: {command} -> {reply}\n{self.log_tail()}"
        return reply[3:]

    def read(self, topic: str, isolation: str) -> list[str]:
        return self.ok(f"read {topic} {isolation}").split()

    def kill9(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._err.close()


@pytest.fixture
def clients() -> Iterator[list[TxnClient]]:
    started: list[TxnClient] = []
    yield started
    for c in started:
        c.kill9()


def client(cluster: Cluster, clients: list[TxnClient], name: str, logs: Path) -> TxnClient:
    c = TxnClient(cluster, name, logs)
    clients.append(c)
    return c


def values(prefix: str, n: int) -> list[str]:
    return [f"{prefix}-{i}" for i in range(n)]


def test_java_producer_committed_once_aborted_never(
    cluster: Cluster, clients: list[TxnClient], tmp_path: Path
) -> None:
    topic = _topic(cluster, "jtxn-basic")
    c = client(cluster, clients, "txnclient", tmp_path)
    c.ok("new p jtxn-basic 60000")
    for batch, end in (("one", "commit"), ("two", "abort"), ("three", "commit")):
        c.ok("p begin")
        for partition in range(3):
            c.ok(f"p send {topic} {partition} {batch}{partition} 10")
        c.ok("p flush")  # the aborted batch is on the log before its abort marker
        c.ok(f"p {end}")
    committed = sorted(v for b in ("one", "three") for p in range(3) for v in values(f"{b}{p}", 10))
    assert sorted(c.read(topic, "read_committed")) == committed
    # librdkafka's read_committed consumer agrees; read_uncommitted sees the aborted batch
    assert sorted(v.decode() for v in _read(cluster, topic, "read_committed")) == committed
    everything = c.read(topic, "read_uncommitted")
    assert len(everything) == 90 and "two0-0" in everything, everything


def test_librdkafka_transactions_read_by_the_java_consumer(
    cluster: Cluster, clients: list[TxnClient], tmp_path: Path
) -> None:
    """The other way round: librdkafka's transactional producer, Java's read_committed."""
    topic = _topic(cluster, "jtxn-rdkafka")
    p = _producer(cluster, "jtxn-rdkafka")
    for batch, commit in (("one", True), ("two", False), ("three", True)):
        p.begin_transaction()
        for i in range(10):
            p.produce(topic, value=f"{batch}-{i}".encode(), partition=i % 3)
        if commit:
            p.commit_transaction(30)
        else:
            assert p.flush(30) == 0  # on the log before its abort marker
            p.abort_transaction(30)
    c = client(cluster, clients, "txnclient", tmp_path)
    assert sorted(c.read(topic, "read_committed")) == sorted(
        values("one", 10) + values("three", 10)
    )
    assert len(c.read(topic, "read_uncommitted")) == 30


def test_java_zombie_is_fenced(cluster: Cluster, clients: list[TxnClient], tmp_path: Path) -> None:
    topic = _topic(cluster, "jtxn-fence", partitions=1)
    c = client(cluster, clients, "txnclient", tmp_path)
    c.ok("new zombie jtxn-fenced 60000")
    c.ok("zombie begin")
    c.ok(f"zombie send {topic} 0 zombie 5")
    c.ok("zombie flush")
    # The same transactional id again: a new epoch, the zombie's open transaction aborted.
    c.ok("new current jtxn-fenced 60000")
    c.ok("current begin")
    c.ok(f"current send {topic} 0 current 5")
    c.ok("current commit")
    # EndTxn with the old epoch: PRODUCER_FENCED, as Kafka answers (fatal for the client)
    reply = c.call("zombie commit")
    assert reply.startswith("error ProducerFencedException"), reply
    # Fencing is fatal for the zombie: it cannot start over either.
    reply = c.call("zombie begin")
    assert reply.startswith("error "), reply
    assert c.read(topic, "read_committed") == values("current", 5)
    assert len(c.read(topic, "read_uncommitted")) == 10


def test_java_transaction_past_its_timeout_is_aborted(
    cluster: Cluster, clients: list[TxnClient], tmp_path: Path
) -> None:
    topic = _topic(cluster, "jtxn-timeout", partitions=1)
    c = client(cluster, clients, "txnclient", tmp_path)
    c.ok("new slow jtxn-slow 2000")
    c.ok("slow begin")
    c.ok(f"slow send {topic} 0 slow 5")
    c.ok("slow flush")
    c.ok("new after jtxn-after 60000")
    c.ok("after begin")
    c.ok(f"after send {topic} 0 after 5")
    c.ok("after commit")
    # The open transaction holds the last stable offset until the coordinator aborts it.
    wait_for(
        lambda: c.read(topic, "read_committed") == values("after", 5),
        30,
        "the timed-out transaction to be aborted",
        0.5,
        detail=lambda: f"brokers: {logs_of(cluster)}",
    )
    # The coordinator's abort bumped the epoch (KIP-360): the producer's EndTxn is fenced.
    reply = c.call("slow commit")
    assert reply.startswith("error ProducerFencedException"), reply


# -- the coordinators, as the brokers answer ----------------------------------------------


def transactions_of(cluster: Cluster, prefix: str) -> dict[str, tuple[int, str]]:
    """{transactional id: (coordinator, state)} for the ids starting with `prefix`, from
    ListTransactions on every live broker (each lists the ids it coordinates)."""
    found: dict[str, tuple[int, str]] = {}
    for bid, node in cluster.brokers.items():
        if not node.alive():
            continue
        raw = Raw(SimpleNamespace(port=node.kafka_port))
        try:
            r = raw.call(ListTransactionsRequest())
        finally:
            raw.close()
        assert r.error_code == ErrorCode.none, (bid, r)
        for t in r.transaction_states:
            if t.transactional_id.startswith(prefix):
                found[str(t.transactional_id)] = (bid, t.transaction_state)
    return found


def coordinator_of(cluster: Cluster, tid: str) -> int:
    """FindCoordinator key_type=1 (TRANSACTION), asked of a live broker."""
    node = cluster.any_broker()
    raw = Raw(SimpleNamespace(port=node.kafka_port))
    try:
        r = raw.call(FindCoordinatorRequest(key_type=1, coordinator_keys=(tid,)))
    finally:
        raw.close()
    (answer,) = r.coordinators
    assert answer.error_code == ErrorCode.none, answer
    return int(answer.node_id)


# -- kafka-transactions ------------------------------------------------------------------


def kafka_transactions(cluster: Cluster, *args: str) -> list[list[str]]:
    """Runs the tool; its table as rows of cells (the header first)."""
    r = subprocess.run(
        java_cmd(
            KAFKA44_TOOLS["kafka-transactions"],
            ["--bootstrap-server", cluster.bootstrap, *args],
            jars="4.4",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"kafka-transactions {' '.join(args)}: {r.returncode}\n{r.stderr}"
    return [line.split() for line in r.stdout.splitlines() if line.strip()]


HANGING_HEADER = [
    *"Topic Partition ProducerId ProducerEpoch CoordinatorEpoch StartOffset".split(),
    "LastTimestamp",
    "Duration(min)",
]


def table(rows: list[list[str]]) -> list[dict[str, str]]:
    header, *body = rows
    return [dict(zip(header, row, strict=True)) for row in body]


def test_kafka_transactions_cli_aborts_a_transaction_left_open(
    cluster: Cluster, clients: list[TxnClient], tmp_path: Path
) -> None:
    topic = _topic(cluster, "jtxn-cli", partitions=1)
    first = client(cluster, clients, "txnclient-before", tmp_path)
    first.ok("new p jtxn-cli-before 60000")
    first.ok("p begin")
    first.ok(f"p send {topic} 0 before 3")
    first.ok("p commit")
    start = 4  # 3 records and a commit marker before the open transaction
    # A producer with a long timeout opens a transaction and is killed with SIGKILL.
    hung = client(cluster, clients, "txnclient-hung", tmp_path)
    hung.ok("new p jtxn-cli-hung 600000")
    hung.ok("p begin")
    hung.ok(f"p send {topic} 0 hung 5")
    hung.ok("p flush")
    hung.kill9()
    first.ok("new q jtxn-cli-later 60000")
    first.ok("q begin")
    first.ok(f"q send {topic} 0 later 2")
    first.ok("q commit")
    # The open transaction holds read_committed consumers back.
    assert first.read(topic, "read_committed") == values("before", 3)

    listed = {row["TransactionalId"]: row for row in table(kafka_transactions(cluster, "list"))}
    coordinator = coordinator_of(cluster, "jtxn-cli-hung")
    assert listed["jtxn-cli-hung"]["TransactionState"] == "Ongoing", listed
    assert listed["jtxn-cli-hung"]["Coordinator"] == str(coordinator), listed
    assert listed["jtxn-cli-later"]["TransactionState"] == "CompleteCommit", listed

    (desc,) = table(kafka_transactions(cluster, "describe", "--transactional-id", "jtxn-cli-hung"))
    assert desc["CoordinatorId"] == str(coordinator), desc
    assert desc["TransactionState"] == "Ongoing", desc
    assert desc["TransactionTimeoutMs"] == "600000", desc
    assert desc["TopicPartitions"] == f"{topic}-0", desc
    assert desc["ProducerId"] == listed["jtxn-cli-hung"]["ProducerId"], (desc, listed)

    def producers() -> dict[str, dict[str, str]]:
        rows = kafka_transactions(
            cluster, "describe-producers", "--topic", topic, "--partition", "0"
        )
        return {row["ProducerId"]: row for row in table(rows)}

    open_one = producers()[desc["ProducerId"]]
    assert open_one["CurrentTransactionStartOffset"] == str(start), open_one
    assert open_one["ProducerEpoch"] == desc["ProducerEpoch"], (open_one, desc)

    # find-hanging: the coordinator still owns the transaction (it lists the partition and
    # will abort it when it times out), so it is not hanging, as Kafka's tool decides.
    rows = kafka_transactions(
        cluster,
        "find-hanging",
        "--topic",
        topic,
        "--partition",
        "0",
        "--max-transaction-timeout",
        "0",
    )
    assert rows == [HANGING_HEADER], rows
    # The same search by broker (DescribeProducers on every replica the broker holds,
    # followers included), on each of them.
    for bid in cluster.brokers:
        rows = kafka_transactions(
            cluster, "find-hanging", "--broker-id", str(bid), "--max-transaction-timeout", "0"
        )
        assert rows[0] == HANGING_HEADER, rows
        assert not [r for r in table(rows) if r["Topic"] == topic], (bid, rows)

    # An operator ends it on the partition: abort markers, written by the partition leader.
    kafka_transactions(
        cluster, "abort", "--topic", topic, "--partition", "0", "--start-offset", str(start)
    )
    wait_for(
        lambda: producers()[desc["ProducerId"]]["CurrentTransactionStartOffset"] == "None",
        30,
        "the aborted transaction to be closed on the partition",
    )
    expected = values("before", 3) + values("later", 2)
    assert first.read(topic, "read_committed") == expected
    assert [v.decode() for v in _read(cluster, topic, "read_committed", 1)] == expected
    assert len(first.read(topic, "read_uncommitted")) == 10


def first_sequence(batch: bytes) -> bytes:
    """build_batch's transactional batch (no sequence, as coordinators write theirs) as a
    producer sends its first one: base sequence 0, the CRC (attributes onwards) redone."""
    b = bytearray(batch)
    b[53:57] = (0).to_bytes(4, "big")  # baseSequence, after producerId and producerEpoch
    b[17:21] = crc32c(bytes(b[21:])).to_bytes(4, "big")
    return bytes(b)


def test_kafka_transactions_finds_and_aborts_a_hanging_transaction(
    cluster: Cluster, clients: list[TxnClient], tmp_path: Path
) -> None:
    """A transaction hanging as Kafka's tool means it: open on a partition while no
    coordinator knows of it (here a transactional batch produced without
    AddPartitionsToTxn, which brokers take only with KIP-890's produce verification
    turned off: transaction.partition.verification.enable=false, as Kafka before 3.6 had
    it; with it on the same write is refused). find-hanging lists it; abort ends it;
    read_committed moves on."""
    topic = _topic(cluster, "jtxn-hanging", partitions=1)
    leader_id = cluster.leader_of(topic, 0)
    raw = Raw(SimpleNamespace(port=cluster.brokers[leader_id].kafka_port))
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})

    def verification(value: str | None) -> None:
        op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
        entry = ConfigEntry(
            "transaction.partition.verification.enable", value or "", incremental_operation=op
        )
        for f in admin.incremental_alter_configs(
            [ConfigResource(ResourceType.BROKER, str(leader_id), incremental_configs=[entry])]
        ).values():
            f.result(30)

    try:
        init = raw.call(
            InitProducerIdRequest(
                transactional_id=None,
                transaction_timeout=timedelta(seconds=60),
                producer_id=ProducerId(-1),
                producer_epoch=i16(-1),
            )
        )
        assert init.error_code == ErrorCode.none, init
        pid = int(init.producer_id)
        batch = first_sequence(
            build_batch([(b"h", b"hanging-0", [])], int(time.time() * 1000), producer=(pid, 0))
        )
        req = dataclasses.replace(
            produce(9, topic, batch), transactional_id=TransactionalId("jtxn-ghost")
        )
        # Verified, refused: no coordinator knows the transactional id (or, with no
        # __transaction_state yet, none can be asked: a retriable refusal).
        refused = produce_partition(raw.call(req)).error_code
        assert refused in (ErrorCode.invalid_producer_id_mapping, ErrorCode.not_enough_replicas)
        verification("false")
        # Taken once the leader has the new setting (a refused write wrote nothing).
        wait_for(
            lambda: produce_partition(raw.call(req)).error_code == ErrorCode.none,
            30,
            "the unverified write taken with verification off",
            0.2,
        )
    finally:
        with suppress(Exception):
            verification(None)
        raw.close()
    c = client(cluster, clients, "txnclient", tmp_path)
    c.ok("new p jtxn-hanging-after 60000")
    c.ok("p begin")
    c.ok(f"p send {topic} 0 after 2")
    c.ok("p commit")
    assert c.read(topic, "read_committed") == []  # held at the hanging transaction

    rows = kafka_transactions(
        cluster,
        "find-hanging",
        "--topic",
        topic,
        "--partition",
        "0",
        "--max-transaction-timeout",
        "0",
    )
    assert rows[0] == HANGING_HEADER, rows
    (hanging,) = table(rows)
    assert hanging["ProducerId"] == str(pid) and hanging["StartOffset"] == "0", hanging
    assert hanging["Topic"] == topic and hanging["Partition"] == "0", hanging
    # Searched by broker: every replica has the producer state, a follower's included.
    follower = next(b for b in cluster.brokers if b != leader_id)
    rows = kafka_transactions(
        cluster, "find-hanging", "--broker-id", str(follower), "--max-transaction-timeout", "0"
    )
    found = [r for r in table(rows) if r["Topic"] == topic]
    assert [(r["ProducerId"], r["StartOffset"]) for r in found] == [(str(pid), "0")], rows

    kafka_transactions(
        cluster, "abort", "--topic", topic, "--partition", "0", "--start-offset", "0"
    )
    wait_for(
        lambda: c.read(topic, "read_committed") == values("after", 2),
        30,
        "read_committed past the aborted hanging transaction",
        0.5,
    )
    rows = kafka_transactions(
        cluster, "find-hanging", "--topic", topic, "--max-transaction-timeout", "0"
    )
    assert rows == [HANGING_HEADER], rows


def test_describe_transactions_answers_every_broker(
    cluster: Cluster, clients: list[TxnClient], tmp_path: Path
) -> None:
    """The coordinator describes the id; any other broker answers NOT_COORDINATOR (an entry
    with every field, not a closed connection); an unknown id is TRANSACTIONAL_ID_NOT_FOUND."""
    c = client(cluster, clients, "txnclient", tmp_path)
    c.ok("new p jtxn-described 60000")
    # Ongoing, so that its start time is a timestamp (kio reads no -1 there, Empty's)
    topic = _topic(cluster, "jtxn-described", partitions=1)
    c.ok("p begin")
    c.ok(f"p send {topic} 0 described 1")
    c.ok("p flush")
    coordinators = {tid: coordinator_of(cluster, tid) for tid in ("jtxn-described", "jtxn-unused")}
    for bid, node in cluster.brokers.items():
        raw = Raw(SimpleNamespace(port=node.kafka_port))
        try:
            r = raw.call(
                DescribeTransactionsRequest(
                    transactional_ids=tuple(map(TransactionalId, coordinators))
                )
            )
        finally:
            raw.close()
        for entry in r.transaction_states:
            if bid != coordinators[entry.transactional_id]:
                assert entry.error_code == ErrorCode.not_coordinator, (bid, entry)
                assert entry.transaction_state == "", entry
            elif entry.transactional_id == "jtxn-unused":
                assert entry.error_code == ErrorCode.transactional_id_not_found, entry
            else:
                assert entry.error_code == ErrorCode.none, entry
                assert entry.transaction_state == "Ongoing" and entry.producer_id >= 0, entry


# -- Kafka Streams, exactly_once_v2 (last: its broker kills move leaderships, which the
# preferred-leader rebalancing moves back some seconds later) -----------------------------


class CountsSeen:
    """Follows the output topic from its start with read_committed: every count per word,
    in order."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "wc-eos-check",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        self.consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        )
        self.seen: dict[str, list[int]] = {}

    def latest(self) -> dict[str, int]:
        while (m := self.consumer.poll(0.2)) is not None:
            assert not m.error(), m.error()
            count = int.from_bytes(m.value(), "big", signed=True)  # Serdes.Long
            self.seen.setdefault(m.key().decode(), []).append(count)
        return {w: counts[-1] for w, counts in self.seen.items()}

    def close(self) -> None:
        self.consumer.close()


def restart(cluster: Cluster, bid: int, topics: tuple[str, ...]) -> None:
    """The broker back, and back in the ISRs (so that the next kill leaves two replicas)."""
    cluster.brokers[bid].start()
    cluster.wait_ready(brokers=[bid])
    for topic in topics:
        cluster.wait_isr(topic, 3, timeout=60)


def test_streams_exactly_once_v2_word_count_survives_kill_9(
    cluster: Cluster, apps: JavaApps, tmp_path: Path
) -> None:
    b = cluster.bootstrap
    source, sink = _topic(cluster, "wc-eos-in"), _topic(cluster, "wc-eos-out")
    rng = random.Random(26)
    parts = [[" ".join(rng.choices(WORDS, k=rng.randint(1, 5))) for _ in range(60)] for _ in "abc"]
    producer = Producer({"bootstrap.servers": b, "acks": "all", "enable.idempotence": True})
    counts = CountsSeen(b, sink, 3)
    app: JavaApp | None = None

    def produce(lines: list[str]) -> None:
        for line in lines:
            producer.produce(source, key=line.encode(), value=line.encode())
        assert producer.flush(60) == 0, "input not acknowledged in 60 s"

    def counted(n_parts: int, what: str) -> None:
        expected = Counter(" ".join(line for part in parts[:n_parts] for line in part).split())
        assert app is not None
        wait_for(
            lambda: counts.latest() == expected,
            120,
            what,
            0.3,
            check=app.check_alive,
            detail=lambda: (
                f"got {counts.latest()}, want {dict(expected)}; brokers: {logs_of(cluster)}"
            ),
        )

    try:
        app = apps.start(
            "wordcount-eos",
            "WordCountApp",
            [
                "--bootstrap",
                b,
                "--application-id",
                "wc-eos",
                "--state-dir",
                tmp_path / "state",
                "--input",
                source,
                "--output",
                sink,
                "processing.guarantee=exactly_once_v2",
                "replication.factor=3",
            ],
            tmp_path,
        )
        app.wait_line(lambda line: line.endswith(" RUNNING"), 120, "state RUNNING")
        produce(parts[0])
        counted(1, "the counts of the first part")

        # Streams' EOS v2 producer: one transactional id per stream thread,
        # <application.id>-<process id>-<thread index>, coordinated by one broker.
        tids = transactions_of(cluster, "wc-eos-")
        assert len(tids) == 1, tids
        ((tid, (listed_by, _state)),) = tids.items()
        assert re.fullmatch(r"wc-eos-[0-9a-f-]{36}-1", tid), tid
        coordinator = coordinator_of(cluster, tid)
        assert coordinator == listed_by, (coordinator, listed_by)

        # The leader of an input partition (another broker than the coordinator when one
        # is), killed while the second part is being processed.
        leaders = {p: cluster.leader_of(source, p) for p in range(3)}
        victim = next((lb for lb in leaders.values() if lb != coordinator), leaders[0])
        produce(parts[1])
        cluster.brokers[victim].kill9()
        try:
            counted(2, f"the counts of two parts, broker {victim} (an input leader) killed")
        finally:
            restart(cluster, victim, (source, sink, "__transaction_state"))

        # The transaction coordinator, killed while the third part is being processed.
        coordinator = coordinator_of(cluster, tid)
        produce(parts[2])
        cluster.brokers[coordinator].kill9()
        try:
            counted(3, f"the counts of three parts, broker {coordinator} (the coordinator) killed")
        finally:
            restart(cluster, coordinator, (source, sink, "__transaction_state"))

        # Exactly once: every count of every word once, in order; none past the plain count.
        expected = Counter(" ".join(line for part in parts for line in part).split())
        for word, n in expected.items():
            assert counts.seen[word] == list(range(1, n + 1)), (word, counts.seen[word])
        assert set(counts.seen) == set(expected)
        # The id lives on through the kills (one per stream thread, whatever its epoch).
        wait_for(
            lambda: tid in transactions_of(cluster, "wc-eos-"),
            30,
            f"{tid} listed by its coordinator after the restarts",
            0.5,
        )
        assert app.stop() == 143, app.log_tail()
    finally:
        counts.close()
