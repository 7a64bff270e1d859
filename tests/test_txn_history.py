"""A Jepsen-style history check of transactional writes under leader and coordinator kills.

Four transactional producers (one process each, librdkafka) write transactions of unique
values over three partitions, committing most and aborting some, and log every
transaction's outcome as they learn it: committed, aborted, or unknown (the commit call
failed: it may or may not have happened). Meanwhile partition leaders and transaction
coordinators are killed with SIGKILL and restarted, one at a time, and a read_committed
consumer polls all along. Then the history is checked:

- lost: a transaction acknowledged as committed is missing a record;
- duplicated: a value read twice;
- aborted read: a value of an aborted transaction read;
- fractured: a transaction with an unknown outcome read in part (all or nothing);
- non-monotonic poll: the consumer saw a partition's offsets go back.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from cluster_support import Cluster, cluster_factory
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from test_transactions import TXN_ARGS, _coordinator_of
from waiting import wait_for

pytestmark = pytest.mark.timeout(400)

TOPIC = "history"
PRODUCERS = 4
TXNS = 5000  # at most, per producer: they write until the faults are over

WRITER = textwrap.dedent(
    """
    import json, os, random, sys
    from confluent_kafka import KafkaException, Producer
    bootstrap, topic, tid, count, out, stop = sys.argv[1:7]
    rng = random.Random(tid)
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 2,
                  "transaction.timeout.ms": 20000, "message.timeout.ms": 20000})
    log = open(out, "a", buffering=1)
    p.init_transactions(60)
    for n in range(int(count)):
        if os.path.exists(stop):
            break
        values = [f"{tid}:{n}:{i}" for i in range(rng.randint(1, 6))]
        parts = [rng.randrange(3) for _ in values]
        abort = rng.random() < 0.25
        try:
            p.begin_transaction()
            for v, part in zip(values, parts):
                p.produce(topic, value=v.encode(), partition=part)
            if abort:
                p.flush(30)
                p.abort_transaction(30)
                log.write(json.dumps(["aborted", values, parts]) + "\\n")
            else:
                p.commit_transaction(30)
                log.write(json.dumps(["committed", values, parts]) + "\\n")
        except KafkaException as e:
            err = e.args[0]
            log.write(json.dumps(["unknown", values, parts, str(err)]) + "\\n")
            if err.txn_requires_abort():
                try:
                    p.abort_transaction(30)
                except KafkaException:
                    pass
            elif not err.retriable():
                # Fenced or fatal: a new producer (a new epoch) goes on.
                p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                              "linger.ms": 2, "transaction.timeout.ms": 20000})
                p.init_transactions(60)
    print("done", flush=True)
    """
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    gen = cluster_factory(tmp_path_factory.mktemp("history"))
    make = next(gen)
    c = make(brokers=3, broker_args=TXN_ARGS)
    yield c
    with pytest.raises(StopIteration):
        next(gen)


def test_transactional_history_under_kills(cluster: Cluster, tmp_path: Path) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(TOPIC, 3, 3, config={"min.insync.replicas": "2"})])[TOPIC].result(
        30
    )
    cluster.wait_isr(TOPIC, 3)
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    logs = [tmp_path / f"w{i}.log" for i in range(PRODUCERS)]
    tids = [f"hist-{i}" for i in range(PRODUCERS)]
    stop = tmp_path / "stop"
    writers = []
    for tid, log in zip(tids, logs, strict=True):
        args = [cluster.bootstrap, TOPIC, tid, str(TXNS), str(log), str(stop)]
        with open(f"{log}.stderr", "w") as err:  # librdkafka's logs; a pipe could fill
            writers.append(
                subprocess.Popen(
                    [sys.executable, str(script), *args],
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            )
    seen: list[tuple[int, int, str]] = []  # (partition, offset, value) in poll order
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"hist-{uuid.uuid4()}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(3)])

    def poll(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for m in consumer.consume(200, 0.2):
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(m.error())
                    continue
                seen.append((m.partition(), m.offset(), m.value().decode()))

    rng = random.Random(5)
    kills = 0
    try:
        # Faults while the writers run: a partition leader or a coordinator, one at a time.
        while any(w.poll() is None for w in writers) and kills < 6:
            poll(2.0)
            if rng.random() < 0.5:
                victim = cluster.leader_of(TOPIC, rng.randrange(3))
            else:
                victim = _coordinator_of(cluster, rng.choice(tids))
            if victim < 0:
                continue
            node = cluster.brokers[victim]
            node.kill9()
            kills += 1
            poll(1.5)
            node.start()
            cluster.wait_ready(brokers=[victim])
            cluster.wait_isr(TOPIC, 3, timeout=60)
        stop.write_text("")
        for w, log in zip(writers, logs, strict=True):
            w.wait(240)
            assert w.returncode == 0, Path(f"{log}.stderr").read_text()[-3000:]
        # Everything decided is readable now: poll until the end of every partition.
        ends = {}
        for p in range(3):
            ends[p] = consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]

        def caught_up() -> bool:
            poll(0.5)
            pos = {tp.partition: tp.offset for tp in consumer.position(consumer.assignment())}
            return all(pos.get(p, 0) >= ends[p] for p in range(3))

        wait_for(caught_up, 60, "the consumer to reach the last stable offsets")
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()
        consumer.close()

    history = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    committed = [h[1] for h in history if h[0] == "committed"]
    aborted = [h[1] for h in history if h[0] == "aborted"]
    unknown = [h[1] for h in history if h[0] == "unknown"]
    assert kills == 6 and len(committed) > 100, (kills, len(committed))

    values = [v for _p, _o, v in seen]
    assert len(values) == len(set(values)), "duplicated: a value was read twice"
    read = set(values)
    lost = [v for txn in committed for v in txn if v not in read]
    assert not lost, (
        f"lost: {len(lost)} committed values never read, e.g. {lost[:5]}; "
        f"{_where(cluster, lost, history, seen)}"
    )
    aborted_read = [v for txn in aborted for v in txn if v in read]
    assert not aborted_read, f"aborted read: {aborted_read[:5]}"
    fractured = [txn for txn in unknown if 0 < sum(v in read for v in txn) < len(txn)]
    assert not fractured, f"fractured: transactions read in part {fractured[:3]}"
    last: dict[int, int] = {}
    for p, o, _v in seen:
        assert o > last.get(p, -1), f"non-monotonic poll: partition {p} went to {o}"
        last[p] = o


def _where(cluster: Cluster, lost: list[str], history: list, seen: list) -> str:
    """For a failure message: where each lost value is in its partition's log (read
    uncommitted: there but skipped by read_committed readers, or not there at all),
    and the read_committed reader's offsets around it."""
    part_of = {v: p for h in history for v, p in zip(h[1], h[2], strict=True)}
    wanted = set(lost[:20])
    found: dict[str, tuple[int, int]] = {}
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"hist-where-{uuid.uuid4()}",
            "isolation.level": "read_uncommitted",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        c.assign([TopicPartition(TOPIC, p, 0) for p in range(3)])
        eof: set[int] = set()
        end = time.monotonic() + 30
        while len(eof) < 3 and time.monotonic() < end:
            for m in c.consume(500, 0.5):
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                    continue
                if (v := m.value().decode()) in wanted:
                    found[v] = (m.partition(), m.offset())
    finally:
        c.close()
    out = []
    for v in lost[:20]:
        p = part_of.get(v)
        if v not in found:
            out.append(f"{v} (partition {p}) not in the log")
            continue
        fp, fo = found[v]
        near = sorted(o for sp, o, _ in seen if sp == fp and abs(o - fo) <= 20)
        out.append(f"{v} in the log at {fp}@{fo}, read_committed read {fp}@{near}")
    return "; ".join(out)
