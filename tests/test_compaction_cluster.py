"""Compacted topics on a running 3-broker cluster, through real Kafka clients.

A topic created with cleanup.policy=compact by confluent-kafka's AdminClient takes keyed
records, updates and tombstones; every replica's cleaner compacts its own log; a consumer
reading from the start sees the latest value of every key at the offsets it was written
at, from the leader and from a new leader after the old one is killed with SIGKILL; a
replica that was down copies the compacted log, gaps and all. The cleaner shows on
/metrics and in `strait topic describe`; keyless records are refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
from cluster_support import Cluster, cluster_factory, high_watermark
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from waiting import wait_for

pytestmark = pytest.mark.timeout(300)

TOPIC = "compacted"
KEYS = 40
ROUNDS = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Cluster:
    from cluster_support import BROKER_ARGS

    gen = cluster_factory(tmp_path_factory.mktemp("compaction"))
    make = next(gen)
    c = make(brokers=3, broker_args=[*BROKER_ARGS, "--log-cleaner-backoff-ms", "200"])
    yield c
    with pytest.raises(StopIteration):
        next(gen)


def _consume_all(bootstrap: str, topic: str, partitions: int) -> list[tuple]:
    """Every record from the log start to the high watermark, as (partition, offset,
    key, value)."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
        }
    )
    try:
        ends = {}
        for p in range(partitions):
            ends[p] = high_watermark(c, topic, p)
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[tuple] = []
        done: set[int] = {p for p, hi in ends.items() if hi == 0}
        deadline = time.monotonic() + 60
        while len(done) < partitions and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    if m.offset() >= ends[m.partition()]:
                        done.add(m.partition())
                    continue
                raise KafkaException(m.error())
            got.append((m.partition(), m.offset(), m.key(), m.value()))
        assert len(done) == partitions, f"did not reach the ends {ends}"
        return got
    finally:
        c.close()


def test_compacted_topic_end_to_end(cluster: Cluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    configs = {
        "cleanup.policy": "compact",
        "segment.bytes": "4096",
        "min.cleanable.dirty.ratio": "0.01",
        "min.insync.replicas": "2",
    }
    admin.create_topics([NewTopic(TOPIC, 2, 3, config=configs)])[TOPIC].result(30)
    res = ConfigResource(ConfigResource.Type.TOPIC, TOPIC)
    described = admin.describe_configs([res])[res].result(30)
    assert described["cleanup.policy"].value == "compact"
    cluster.wait_isr(TOPIC, 3)

    p = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
    written: dict[tuple[int, bytes], tuple[int, bytes | None]] = {}

    def on_delivery(err, msg) -> None:  # type: ignore[no-untyped-def]
        assert err is None, err
        written[(msg.partition(), msg.key())] = (msg.offset(), msg.value())

    for r in range(ROUNDS):
        for k in range(KEYS):
            key = b"key-%d" % k
            value = None if (r == ROUNDS - 1 and k % 5 == 0) else b"%d:%d" % (r, k) * 8
            p.produce(TOPIC, key=key, value=value, partition=k % 2, on_delivery=on_delivery)
        p.flush(30)
    # A few more records roll the last written segments into the cleanable part.
    for k in range(KEYS):
        p.produce(TOPIC, key=b"filler-%d" % k, value=b"x" * 200, partition=k % 2)
    p.flush(30)
    assert p.flush(30) == 0

    # Keyless records are refused with INVALID_RECORD, nothing written.
    errs: list[KafkaError] = []
    p.produce(TOPIC, value=b"no key", partition=0, on_delivery=lambda e, _m: errs.append(e))
    p.flush(30)
    assert errs and errs[0] is not None and errs[0].code() == KafkaError.INVALID_RECORD

    hws = cluster.converge(TOPIC)

    def cleaned_everywhere() -> bool:
        for b in cluster.brokers.values():
            t = b.get(f"/api/v1/topics/{TOPIC}")
            for part in t["partitions"]:
                c = part.get("cleaner")
                if not c or not c["last_cleaned_ms"]:
                    return False
        return True

    wait_for(cleaned_everywhere, 60, "every replica's cleaner to clean the topic")

    latest = {(part, key): v for (part, key), v in written.items()}
    records = _consume_all(cluster.bootstrap, TOPIC, 2)
    by_key: dict[tuple[int, bytes], list[tuple[int, bytes | None]]] = {}
    for part, off, key, value in records:
        by_key.setdefault((part, key), []).append((off, value))
    for (part, key), (off, value) in latest.items():
        seen = by_key.get((part, key), [])
        assert seen and seen[-1] == (off, value), f"{key!r}: latest {off} not read last"
    total_written = ROUNDS * KEYS + KEYS
    assert len(records) < total_written / 2, "the cleaner removed old versions"
    assert max(off for _p, off, _k, _v in records) < max(hws.values())

    # /metrics and `strait topic describe` show the cleaner.
    b = next(iter(cluster.brokers.values()))
    with urllib.request.urlopen(f"http://{b.host}:{b.http_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert "straitmq_broker_log_cleaner_cleanings_total" in text
    assert f'straitmq_broker_log_cleaner_dirty_ratio{{messaging_destination_name="{TOPIC}"' in text
    http = f"http://{b.host}:{b.http_port}"
    out = subprocess.run(
        [sys.executable, "-m", "straitmq.cli", "--http", http, "topic", "describe", TOPIC],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "cleanup compact" in out.stdout and "DIRTY" in out.stdout

    # A leader killed with SIGKILL: the new leader serves the same compacted view.
    leader = cluster.leader_of(TOPIC, 0)
    node = cluster.brokers[leader]
    node.kill9()
    cluster.wait_new_leader(TOPIC, 0, leader)
    again = _consume_all(cluster.bootstrap, TOPIC, 2)
    last = {(part, key): (off, v) for part, off, key, v in again}
    for (part, key), (off, value) in latest.items():
        assert last[(part, key)] == (off, value)

    # The killed broker comes back with partition 0's log gone: it copies the new
    # leader's compacted log from its start, gaps and all, and holds every latest
    # record at the offset it was written at.
    pdir = os.path.join(cluster.data_dir, f"broker-{leader}", "logs", f"{TOPIC}-0")
    shutil.rmtree(pdir)
    node.start()
    cluster.wait_ready(brokers=[leader])
    cluster.converge(TOPIC, timeout=60)
    on_disk = _read_partition_dir(pdir)
    for (part, key), (off, value) in latest.items():
        if part == 0:
            assert on_disk.get(off) == (key, value), f"{key!r} at {off} on the re-copied replica"


def _read_partition_dir(path: str) -> dict[int, tuple[bytes | None, bytes | None]]:
    """offset -> (key, value) of every record in a replica's segment files."""
    from straitmq.broker.record_codec import decode_batch

    out: dict[int, tuple[bytes | None, bytes | None]] = {}
    for name in sorted(n for n in os.listdir(path) if n.endswith(".log")):
        with open(os.path.join(path, name), "rb") as f:
            data = f.read()
        pos = 0
        while pos + 12 <= len(data):
            size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
            if pos + size > len(data):
                break
            for r in decode_batch(data[pos : pos + size]):
                out[r.offset] = (r.key, r.value)
            pos += size
    return out
