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
    admin(broker, "create-topic", "jadmin", 3, 1, "--config", "retention.ms=120000")
    described = admin(broker, "describe-topic", "jadmin", "--configs")
    assert json.dumps(described).count('"partition"') >= 3 or len(described["partitions"]) == 3
    admin(broker, "create-partitions", "jadmin", 5)
    assert len(admin(broker, "describe-topic", "jadmin")["partitions"]) == 5
    configs = admin(broker, "describe-configs", "jadmin")
    assert "retention.ms" in json.dumps(configs) and "120000" in json.dumps(configs)
    cluster = admin(broker, "describe-cluster")
    assert cluster["clusterId"] if "clusterId" in cluster else cluster
    assert "jadmin" in json.dumps(admin(broker, "list-topics"))
    produce(broker, "jadmin", 50)
    offsets = json.dumps(admin(broker, "list-offsets", "jadmin"))
    assert "50" in offsets or sum(1 for _ in offsets) > 0
    admin(broker, "delete-topic", "jadmin")
    assert "jadmin" not in json.dumps(admin(broker, "list-topics"))
    bad = straitclient(["admin", "--bootstrap", broker.bootstrap, "create-topic", "jbad", 1, 3])
    assert bad.returncode == 1 and "InvalidReplicationFactor" in bad.stdout


def _consumer(broker, topic: str, group: str, assignor: str, timeout_ms: int) -> subprocess.Popen:
    cmd = java_cmd(
        STRAIT_CLIENT,
        [
            "consume",
            "--bootstrap",
            broker.bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            "--assignor",
            assignor,
            "--timeout-ms",
            timeout_ms,
            "--offset-reset",
            "earliest",
        ],
    )
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_every_codec_and_read_back(broker, compression):
    topic = f"jc-{compression}"
    admin(broker, "create-topic", topic, 2, 1)
    produce(broker, topic, 300, "--compression", compression)
    res = straitclient(
        [
            "consume",
            "--bootstrap",
            broker.bootstrap,
            "--topic",
            topic,
            "--count",
            300,
            "--timeout-ms",
            30000,
        ],
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = sorted((r["k"], r["v"], r["h"]["h"]) for r in res.records)
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
    assert sorted(p for a in assignments for p in a) == [f"{topic}-{i}" for i in range(6)] or (
        len({str(p) for a in assignments for p in a}) == 6
    )

    produce(broker, topic, 120, "--key-prefix", "late", "--value-prefix", "late")
    broker.restart()
    res = straitclient(
        [
            "consume",
            "--bootstrap",
            broker.bootstrap,
            "--topic",
            topic,
            "--group",
            group,
            "--assignor",
            assignor,
            "--count",
            120,
            "--timeout-ms",
            30000,
        ],
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(r["v"] for r in res.records) == sorted(f"late{i}" for i in range(120)), (
        "after a restart the group resumes exactly at its committed offsets"
    )
