"""Kafka transactions end to end, with librdkafka (confluent-kafka) on a 3-broker cluster.

Committed batches are seen once by a read_committed consumer, aborted ones never (a
read_uncommitted one sees both); a second producer with the same transactional id
fences the first (whose open transaction is aborted); a transaction past its timeout is
aborted by the coordinator; a consume-transform-produce loop killed and restarted with
SIGKILL moves every input record to the output exactly once; the coordinator killed
with SIGKILL hands every transaction's outcome to the next one. Bad requests get Kafka's
error codes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from cluster_support import BROKER_ARGS, Cluster, cluster_factory
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.end_txn.v3.request import EndTxnRequest
from kio.schema.errors import ErrorCode
from kio.schema.types import ProducerId, TopicName, TransactionalId
from kio.static.primitive import i16, i32
from test_errors import Raw
from waiting import wait_for

pytestmark = pytest.mark.timeout(300)

TXN_ARGS = [
    *BROKER_ARGS,
    "--transaction-state-log-replication-factor",
    "3",
    "--transaction-abort-check-interval-ms",
    "300",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    gen = cluster_factory(tmp_path_factory.mktemp("txn"))
    make = next(gen)
    c = make(brokers=3, broker_args=TXN_ARGS)
    yield c
    with pytest.raises(StopIteration):
        next(gen)


def _topic(cluster: Cluster, name: str, partitions: int = 3) -> str:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    config = {"min.insync.replicas": "2"}
    admin.create_topics([NewTopic(name, partitions, 3, config=config)])[name].result(30)
    cluster.wait_isr(name, 3)
    return name


def _producer(cluster: Cluster, tid: str, **extra: object) -> Producer:
    conf = {"bootstrap.servers": cluster.bootstrap, "transactional.id": tid, "linger.ms": 5}
    conf.update(extra)
    p = Producer(conf)
    p.init_transactions(30)
    return p


def _read(cluster: Cluster, topic: str, isolation: str, partitions: int = 3) -> list:
    """Every record a consumer of `isolation` gets from the start to the end it sees."""
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"r-{uuid.uuid4()}",
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: list = []
        eof: set[int] = set()
        deadline = time.monotonic() + 30
        while len(eof) < partitions and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                    continue
                raise KafkaException(m.error())
            eof.discard(m.partition())
            out.append(m.value())
        assert len(eof) == partitions, "did not reach the end of every partition"
        return out
    finally:
        c.close()


def test_committed_seen_once_aborted_never(cluster: Cluster) -> None:
    topic = _topic(cluster, "txn-basic")
    p = _producer(cluster, "basic")
    for batch, commit in (("one", True), ("two", False), ("three", True)):
        p.begin_transaction()
        for i in range(30):
            p.produce(topic, key=b"%d" % i, value=f"{batch}-{i}".encode())
        if commit:
            p.commit_transaction(30)
        else:
            assert p.flush(30) == 0  # sent (librdkafka purges unsent records on abort)
            p.abort_transaction(30)
    committed = _read(cluster, topic, "read_committed")
    assert sorted(committed) == sorted(
        f"{b}-{i}".encode() for b in ("one", "three") for i in range(30)
    )
    everything = _read(cluster, topic, "read_uncommitted")
    assert len(everything) == 90, "read_uncommitted sees the aborted batch too"


def test_a_second_producer_fences_the_first(cluster: Cluster) -> None:
    topic = _topic(cluster, "txn-fence")
    zombie = _producer(cluster, "fenced-id")
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie")
    zombie.flush(10)
    current = _producer(cluster, "fenced-id")  # aborts the zombie's open transaction
    current.begin_transaction()
    current.produce(topic, value=b"current")
    current.commit_transaction(30)
    with pytest.raises(KafkaException) as e:
        zombie.commit_transaction(30)
    err = e.value.args[0]
    assert err.fatal() or err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED), err
    assert _read(cluster, topic, "read_committed") == [b"current"]


def test_a_transaction_past_its_timeout_is_aborted(cluster: Cluster) -> None:
    topic = _topic(cluster, "txn-timeout", partitions=1)
    slow = _producer(cluster, "slow", **{"transaction.timeout.ms": 1500})
    slow.begin_transaction()
    slow.produce(topic, value=b"never committed")
    slow.flush(10)
    after = _producer(cluster, "after")
    after.begin_transaction()
    after.produce(topic, value=b"after")
    after.commit_transaction(30)
    # The open transaction holds the last stable offset until the coordinator aborts it;
    # then read_committed gets to `after`.
    wait_for(
        lambda: _read(cluster, topic, "read_committed", 1) == [b"after"],
        30,
        "the timed-out transaction to be aborted",
    )
    with pytest.raises(KafkaException):
        slow.commit_transaction(10)


CTP = textwrap.dedent(
    """
    import sys, time
    from confluent_kafka import Consumer, Producer, TopicPartition
    bootstrap, source, sink, tid = sys.argv[1:5]
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "ctp", "isolation.level":
                  "read_committed", "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "session.timeout.ms": 6000})
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 2})
    p.init_transactions(30)
    c.subscribe([source])
    parts = [TopicPartition(source, i) for i in range(3)]

    def all_done():
        # Done once the group's committed offsets are at the end of every partition; a
        # pause alone proves nothing (a rebalance after a kill takes seconds).
        done = c.committed(parts, timeout=10)
        ends = [c.get_watermark_offsets(tp, timeout=10)[1] for tp in parts]
        return all(tp.offset >= end for tp, end in zip(done, ends))

    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        msgs = [m for m in c.consume(50, 0.25) if not m.error()]
        if not msgs:
            if all_done():
                print("done", flush=True)
                sys.exit(0)
            continue
        p.begin_transaction()
        for m in msgs:
            p.produce(sink, key=m.key(), value=m.value().upper())
        p.send_offsets_to_transaction(c.position(c.assignment()),
                                      c.consumer_group_metadata(), 30)
        p.commit_transaction(30)
    sys.exit("not done in 150 s")
    """
)


def test_consume_transform_produce_exactly_once_across_kill_9(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The loop is killed with SIGKILL once it has committed more than before, 20 times,
    then runs to the end: every input record is in the output exactly once."""
    source = _topic(cluster, "ctp-in")
    sink = _topic(cluster, "ctp-out")
    p = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True})
    n = 2000
    for i in range(n):
        p.produce(source, key=b"%d" % i, value=b"v%d" % i)
    assert p.flush(30) == 0
    script = tmp_path / "ctp.py"
    script.write_text(CTP)
    cmd = [sys.executable, str(script), cluster.bootstrap, source, sink, "ctp-1"]
    done = 0
    for _round in range(20):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            before = done

            def progressed(before: int = before, proc: subprocess.Popen = proc) -> bool:
                nonlocal done
                done = len(_read(cluster, sink, "read_committed"))
                return done > before or proc.poll() is not None

            wait_for(progressed, 60, "the loop to commit more")
        finally:
            proc.kill()
            proc.wait(10)
        if done >= n:
            break
    final = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert final.returncode == 0, final.stderr[-2000:]
    out = _read(cluster, sink, "read_committed")
    assert sorted(out) == sorted(b"V%d" % i for i in range(n)), (
        f"{len(out)} records out for {n} in; duplicates: {len(out) - len(set(out))}"
    )


def test_coordinator_killed_keeps_every_outcome(cluster: Cluster) -> None:
    topic = _topic(cluster, "txn-failover")
    p = _producer(cluster, "failover-id")
    p.begin_transaction()
    p.produce(topic, value=b"before")
    p.commit_transaction(30)
    coordinator = _coordinator_of(cluster, "failover-id")
    cluster.brokers[coordinator].kill9()
    try:
        p.begin_transaction()
        p.produce(topic, value=b"after")
        p.commit_transaction(60)
    finally:
        cluster.brokers[coordinator].start()
        cluster.wait_ready(brokers=[coordinator])
    assert sorted(_read(cluster, topic, "read_committed")) == [b"after", b"before"]


def _coordinator_of(cluster: Cluster, tid: str) -> int:
    """The coordinator of `tid` (the first FindCoordinator makes __transaction_state)."""
    from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest

    def found() -> int | None:
        raw = Raw(SimpleNamespace(port=cluster.any_broker().kafka_port))
        try:
            r = raw.call(FindCoordinatorRequest(key_type=1, coordinator_keys=(tid,)))
        finally:
            raw.close()
        node = r.coordinators[0]
        if node.error_code == ErrorCode.coordinator_not_available:
            return None
        assert node.error_code == ErrorCode.none, node
        return int(node.node_id)

    return wait_for(found, 30, f"the coordinator of {tid}", 0.2)


def _add_partition(raw: Raw, tid: str, pid: int, epoch: int, topic: str) -> set[ErrorCode]:
    """AddPartitionsToTxn v3 of `topic`'s partition 0: the codes it answers."""
    from kio.schema.add_partitions_to_txn.v3 import request as apt

    r = raw.call(
        apt.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=TransactionalId(tid),
            v3_and_below_producer_id=ProducerId(pid),
            v3_and_below_producer_epoch=i16(epoch),
            v3_and_below_topics=(
                apt.AddPartitionsToTxnTopic(name=TopicName(topic), partitions=(i32(0),)),
            ),
        )
    )
    return {
        p.partition_error_code
        for t in r.results_by_topic_v3_and_below
        for p in t.results_by_partition
    }


def _end_txn(raw: Raw, tid: str, pid: int, epoch: int, commit: bool = True) -> ErrorCode:
    """EndTxn v3: its error code."""
    r = raw.call(
        EndTxnRequest(
            transactional_id=TransactionalId(tid),
            producer_id=ProducerId(pid),
            producer_epoch=i16(epoch),
            committed=commit,
        )
    )
    return r.error_code


def test_bad_transactional_requests_get_kafkas_errors(cluster: Cluster) -> None:
    from kio.schema.init_producer_id.v4.request import InitProducerIdRequest

    tid = "raw-tid"
    coordinator = _coordinator_of(cluster, tid)
    raw = Raw(SimpleNamespace(port=cluster.brokers[coordinator].kafka_port))
    try:
        init = raw.call(
            InitProducerIdRequest(
                transactional_id=TransactionalId(tid),
                transaction_timeout=timedelta(seconds=30),
                producer_id=ProducerId(-1),
                producer_epoch=i16(-1),
            )
        )
        assert init.error_code == ErrorCode.none
        pid, epoch = init.producer_id, init.producer_epoch

        def end(p: int, e: int) -> ErrorCode:
            return _end_txn(raw, tid, p, e)

        assert end(pid, epoch) == ErrorCode.invalid_txn_state  # nothing open
        assert end(pid + 1_000_000, 0) == ErrorCode.invalid_producer_id_mapping
        assert end(pid, epoch - 1 if epoch else epoch + 7) == ErrorCode.producer_fenced

        def add(topic: str) -> set[ErrorCode]:
            return _add_partition(raw, tid, pid, epoch, topic)

        assert add("no-such-topic") == {ErrorCode.unknown_topic_or_partition}
        assert add(_topic(cluster, "txn-raw", 1)) == {ErrorCode.none}
        huge = raw.call(
            InitProducerIdRequest(
                transactional_id=TransactionalId("too-long"),
                transaction_timeout=timedelta(days=1),
                producer_id=ProducerId(-1),
                producer_epoch=i16(-1),
            )
        )
        assert huge.error_code in (ErrorCode.invalid_transaction_timeout, ErrorCode.not_coordinator)
    finally:
        raw.close()


def test_init_producer_id_retried_after_a_lost_answer_is_not_fenced(cluster: Cluster) -> None:
    """KIP-360 (InitProducerId v3+): a client whose InitProducerId answer was lost sends
    it again with the (producer id, epoch) it still holds; Kafka answers the epoch it
    handed out, not PRODUCER_FENCED (TransactionMetadata.prepareIncrementProducerEpoch)."""
    from kio.schema.init_producer_id.v4.request import InitProducerIdRequest

    tid = "raw-retry"
    coordinator = _coordinator_of(cluster, tid)
    raw = Raw(SimpleNamespace(port=cluster.brokers[coordinator].kafka_port))

    def init(pid: int, epoch: int) -> tuple[ErrorCode, int, int]:
        r = raw.call(
            InitProducerIdRequest(
                transactional_id=TransactionalId(tid),
                transaction_timeout=timedelta(seconds=30),
                producer_id=ProducerId(pid),
                producer_epoch=i16(epoch),
            )
        )
        return r.error_code, r.producer_id, r.producer_epoch

    try:
        loading = (ErrorCode.coordinator_load_in_progress, ErrorCode.not_coordinator)
        first = wait_for(lambda: (r := init(-1, -1))[0] not in loading and r, 30, "loaded", 0.2)
        code, pid, epoch = first
        assert code == ErrorCode.none
        bumped = init(pid, epoch)
        assert bumped == (ErrorCode.none, pid, epoch + 1)
        # The answer was lost: the client retries with what it had.
        assert init(pid, epoch) == bumped
        assert init(pid, epoch) == bumped
        assert init(pid, epoch + 1) == (ErrorCode.none, pid, epoch + 2)
        assert init(pid, epoch)[0] == ErrorCode.producer_fenced
        # An id without an epoch: KafkaApis refuses it.
        assert init(pid, -1)[0] == ErrorCode.invalid_request
    finally:
        raw.close()


def test_transactional_offsets_count_only_once_committed(cluster: Cluster) -> None:
    """sendOffsetsToTransaction: while the transaction is open the group's offset is
    unstable (OffsetFetch require_stable: UNSTABLE_OFFSET_COMMIT), an abort drops it, a
    commit makes it the group's committed offset."""
    from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
    from kio.schema.offset_fetch.v7.request import OffsetFetchRequest, OffsetFetchRequestTopic

    topic = _topic(cluster, "txn-offsets", 1)
    group = "txn-offsets-g"
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    meta = c.consumer_group_metadata()
    p = _producer(cluster, "offsets-id")
    b = cluster.any_broker()
    raw = Raw(SimpleNamespace(port=b.kafka_port))
    found = raw.call(FindCoordinatorRequest(key_type=0, coordinator_keys=(group,)))
    raw.close()
    node = found.coordinators[0]
    raw = Raw(SimpleNamespace(port=node.port))

    def fetched() -> tuple[int, int]:
        r = raw.call(
            OffsetFetchRequest(
                group_id=group,
                require_stable=True,
                topics=(OffsetFetchRequestTopic(name=topic, partition_indexes=(0,)),),
            )
        )
        part = r.topics[0].partitions[0]
        return int(part.error_code), int(part.committed_offset)

    try:
        for commit, offset in ((False, 5), (True, 7)):
            p.begin_transaction()
            p.produce(topic, value=b"x")
            p.send_offsets_to_transaction([TopicPartition(topic, 0, offset)], meta, 30)
            assert fetched() == (ErrorCode.unstable_offset_commit, -1)
            if commit:
                p.commit_transaction(30)
            else:
                p.abort_transaction(30)
            wait_for(lambda: fetched()[0] == 0, 15, "the offset to be stable again")
            assert fetched() == (0, offset if commit else -1)
    finally:
        raw.close()
        c.close()


def test_describe_producers_answers_on_every_replica(cluster: Cluster) -> None:
    """DescribeProducers is answered by the leader and the followers (each from its own
    log), as Kafka does: kafka-transactions find-hanging --broker-id asks every replica
    a broker holds."""
    from kio.schema.describe_producers.v0.request import DescribeProducersRequest, TopicRequest

    topic = _topic(cluster, "txn-describe", 1)
    p = _producer(cluster, "describe-id")
    p.begin_transaction()
    p.produce(topic, value=b"open")
    assert p.flush(10) == 0
    cluster.converge(topic)
    try:
        for b in cluster.brokers.values():
            raw = Raw(SimpleNamespace(port=b.kafka_port))
            try:
                req = DescribeProducersRequest(
                    topics=(TopicRequest(name=TopicName(topic), partition_indexes=(i32(0),)),)
                )
                part = raw.call(req).topics[0].partitions[0]
            finally:
                raw.close()
            assert part.error_code == ErrorCode.none, (b.node_id, part)
            [producer] = part.active_producers
            assert producer.current_txn_start_offset == 0, producer
    finally:
        p.abort_transaction(30)


def _txn_batch(pid: int, epoch: int, seq: int, value: bytes) -> bytes:
    """A producer's transactional batch of one record at base sequence `seq`."""
    from crc32c import crc32c
    from straitmq.broker.record_codec import build_batch

    b = bytearray(build_batch([(b"k", value, [])], int(time.time() * 1000), producer=(pid, epoch)))
    b[53:57] = seq.to_bytes(4, "big")  # baseSequence, after producerId and producerEpoch
    b[17:21] = crc32c(bytes(b[21:])).to_bytes(4, "big")  # the CRC covers attributes on
    return bytes(b)


def test_partition_leaders_verify_v1_writes_and_add_partitions_for_v2(cluster: Cluster) -> None:
    """KIP-890 on the wire. Transactions v1 (Produce <= v11): a write to a partition
    the producer never added is refused (INVALID_TXN_STATE), and so is a late write
    after its transaction ended, which would otherwise open a transaction no marker
    ever closes. Transactions v2 (Produce v12, EndTxn v5): the leader adds the partition
    itself, every EndTxn bumps the epoch and answers the next one (a retry gets the same
    answer), the old epoch is fenced, and an abort with nothing added is allowed."""
    import dataclasses

    from kio.schema.describe_transactions.v0.request import DescribeTransactionsRequest
    from kio.schema.end_txn.v5.request import EndTxnRequest as EndTxnV5
    from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
    from kio.schema.list_transactions.v1.request import ListTransactionsRequest
    from test_errors import produce, produce_partition

    topic = _topic(cluster, "txn-kip890", 1)
    tid = "kip890"
    coord = Raw(SimpleNamespace(port=cluster.brokers[_coordinator_of(cluster, tid)].kafka_port))
    lead = Raw(SimpleNamespace(port=cluster.brokers[cluster.leader_of(topic, 0)].kafka_port))
    try:

        def initialized() -> object:
            r = coord.call(
                InitProducerIdRequest(
                    transactional_id=TransactionalId(tid),
                    transaction_timeout=timedelta(seconds=60),
                    producer_id=ProducerId(-1),
                    producer_epoch=i16(-1),
                )
            )
            if r.error_code == ErrorCode.coordinator_load_in_progress:
                return None  # the coordinator is loading its partition: clients retry
            assert r.error_code == ErrorCode.none, r
            return r

        init = wait_for(initialized, 30, "InitProducerId")
        pid, epoch = int(init.producer_id), int(init.producer_epoch)

        def send(version: int, seq: int, value: bytes, e: int) -> ErrorCode:
            req = dataclasses.replace(
                produce(version, topic, _txn_batch(pid, e, seq, value)),
                transactional_id=TransactionalId(tid),
            )
            return produce_partition(lead.call(req)).error_code

        def state() -> str:
            r = coord.call(ListTransactionsRequest(state_filters=(), producer_id_filters=()))
            return next(
                t.transaction_state for t in r.transaction_states if t.transactional_id == tid
            )

        def partitions() -> list:
            # (Described only while open: kio reads no negative start time, which
            # Kafka's answer for a finished transaction carries.)
            r = coord.call(DescribeTransactionsRequest(transactional_ids=(TransactionalId(tid),)))
            return [(t.topic, list(t.partitions)) for t in r.transaction_states[0].topics]

        def end_v5(e: int, commit: bool) -> tuple[ErrorCode, int, int]:
            r = coord.call(
                EndTxnV5(
                    transactional_id=TransactionalId(tid),
                    producer_id=ProducerId(pid),
                    producer_epoch=i16(e),
                    committed=commit,
                )
            )
            return r.error_code, int(r.producer_id), int(r.producer_epoch)

        # v1: not added, refused; added, taken; committed, a late write refused.
        assert send(9, 0, b"unadded", epoch) == ErrorCode.invalid_txn_state
        assert _add_partition(coord, tid, pid, epoch, topic) == {ErrorCode.none}
        assert send(9, 0, b"one", epoch) == ErrorCode.none
        assert _end_txn(coord, tid, pid, epoch) == ErrorCode.none
        wait_for(lambda: state() == "CompleteCommit", 30, "the v1 commit's markers written")
        assert send(9, 1, b"late", epoch) == ErrorCode.invalid_txn_state

        # v2: the leader adds the partition for Produce v12.
        assert send(12, 1, b"two", epoch) == ErrorCode.none
        assert (state(), partitions()) == ("Ongoing", [(topic, [0])])
        assert end_v5(epoch, True) == (ErrorCode.none, pid, epoch + 1)
        # The same EndTxn again while its markers are written, then after.
        assert end_v5(epoch, True)[0] in (ErrorCode.concurrent_transactions, ErrorCode.none)
        wait_for(lambda: state() == "CompleteCommit", 30, "the v2 commit's markers written")
        assert end_v5(epoch, True) == (ErrorCode.none, pid, epoch + 1), "a retry: same answer"
        assert send(12, 2, b"zombie", epoch) == ErrorCode.invalid_producer_epoch
        assert end_v5(epoch + 1, False) == (ErrorCode.none, pid, epoch + 2), "empty abort"
        wait_for(lambda: state() == "CompleteAbort", 30, "the empty abort completed")
        assert end_v5(epoch + 2, True)[0] == ErrorCode.invalid_txn_state, "nothing to commit"
    finally:
        coord.close()
        lead.close()
    assert _read(cluster, topic, "read_committed", partitions=1) == [b"one", b"two"]
