"""The official Java client (kafka-clients 3.9 from Maven Central) against StraitMQ.

Driven through tools/java/StraitClient.java (see bench/javatools.py). The producer runs
with the Java client's defaults, which are idempotent with acks=all.
"""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict

import pytest

from bench.javatools import STRAIT_CLIENT, ensure_jars, java_cmd, straitclient

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", autouse=True)
def _jars() -> None:
    ensure_jars()


def admin(broker, *args: object) -> dict:
    res = straitclient(["admin", "--bootstrap", broker.bootstrap, *args], timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.json


def produce(broker, topic: str, count: int, *extra: object) -> dict:
    res = straitclient(
        [
            "produce",
            "--bootstrap",
            broker.bootstrap,
            "--topic",
            topic,
            "--count",
            count,
            "--headers",
            *extra,
        ],
        timeout=180,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.json["acked"] == count and res.json["errors"] == 0
    return res.json


def test_admin_apis(broker):
    created = admin(broker, "create-topic", "jadmin", 3, 1, "--config", "retention.ms=120000")
    assert created["partitions"] == 3 and created["rf"] == 1
    described = admin(broker, "describe-topic", "jadmin")
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    assert all(p["leader"] == 1 and p["isr"] == [1] for p in described["partitions"])
    assert described["topic_id"] == created["topic_id"]
    admin(broker, "create-partitions", "jadmin", 5)
    assert len(admin(broker, "describe-topic", "jadmin")["partitions"]) == 5
    configs = admin(broker, "describe-configs", "jadmin")["configs"]
    assert configs["retention.ms"] == "120000" and configs["cleanup.policy"] == "delete"
    cluster = admin(broker, "describe-cluster")
    assert cluster["controller"] == 1 and cluster["cluster_id"]
    assert cluster["nodes"] == [{"id": 1, "host": "127.0.0.1", "port": broker.port, "rack": None}]
    assert "jadmin" in admin(broker, "list-topics")["topics"]
    acked = produce(broker, "jadmin", 50)
    offsets = admin(broker, "list-offsets", "jadmin")
    assert sum(offsets["latest"].values()) == 50 and set(offsets["earliest"].values()) == {0}
    assert {p: last + 1 for p, (_first, last) in acked["offsets"].items()} == {
        p: n for p, n in offsets["latest"].items() if n
    }
    admin(broker, "delete-topic", "jadmin")
    assert "jadmin" not in admin(broker, "list-topics")["topics"]
    bad = straitclient(["admin", "--bootstrap", broker.bootstrap, "create-topic", "jbad", 1, 3])
    assert bad.returncode == 1 and "InvalidReplicationFactor" in bad.stdout


def consume_args(broker, topic: str, *options: object) -> list[object]:
    return ["consume", "--bootstrap", broker.bootstrap, "--topic", topic, *options]


def consume(broker, topic: str, *options: object) -> list[dict]:
    """Run the Java consumer to completion; its records."""
    res = straitclient(consume_args(broker, topic, *options), timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.records


def _consumer(broker, topic: str, group: str, assignor: str, timeout_ms: int) -> subprocess.Popen:
    options = ["--group", group, "--assignor", assignor, "--timeout-ms", timeout_ms]
    cmd = java_cmd(
        STRAIT_CLIENT, consume_args(broker, topic, *options, "--offset-reset", "earliest")
    )
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_every_codec_and_read_back(broker, compression):
    topic = f"jc-{compression}"
    admin(broker, "create-topic", topic, 2, 1)
    produce(broker, topic, 300, "--compression", compression)
    records = consume(broker, topic, "--count", 300, "--timeout-ms", 30000)
    got = sorted((r["k"], r["v"], r["h"]["h"]) for r in records)
    assert got == sorted((f"k{i}", f"v{i}", str(i)) for i in range(300))


@pytest.mark.parametrize("assignor", ["range", "roundrobin", "sticky", "cooperative-sticky"])
def test_group_of_two_with_each_assignor_then_restart_and_resume(broker, assignor):
    topic = f"jg-{assignor}"
    group = f"group-{assignor}"
    admin(broker, "create-topic", topic, 6, 1)
    produce(broker, topic, 600)
    consumers = [_consumer(broker, topic, group, assignor, 12000) for _ in range(2)]
    outputs = [c.communicate(timeout=120) for c in consumers]
    seen: dict[int, list[int]] = defaultdict(list)
    values = set()
    assignments = []
    for out, err in outputs:
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert lines, f"a consumer printed nothing; its stderr: {err[-3000:]}"
        summary = lines[-1]
        assert "done" in summary, err[-3000:]
        assignments.append(summary["assignment"])
        per_partition: dict[int, list[int]] = defaultdict(list)
        for r in lines[:-1]:
            per_partition[r["p"]].append(r["o"])
            values.add(r["v"])
        for p, offs in per_partition.items():
            assert offs == sorted(offs), f"partition {p} out of order"
            seen[p] += offs
    assert values == {f"v{i}" for i in range(600)}, "every record consumed"
    assert all(assignments), f"both members hold partitions at the end: {assignments}"
    # Between them they hold all six. (Not always a split of six: the member whose idle
    # wait ends first leaves, and the other may take its partitions before it prints.)
    assert {int(p) for a in assignments for p in a} == set(range(6)), (
        "the two members hold the six partitions"
    )

    produce(broker, topic, 120, "--key-prefix", "late", "--value-prefix", "late")
    broker.restart()
    records = consume(
        broker,
        topic,
        "--group",
        group,
        "--assignor",
        assignor,
        "--count",
        120,
        "--timeout-ms",
        30000,
    )
    assert sorted(r["v"] for r in records) == sorted(f"late{i}" for i in range(120)), (
        "after a restart the group resumes exactly at its committed offsets"
    )
