"""The newest Apache Kafka CLI tools (4.1, from Maven Central) against a StraitMQ broker.

Each tool runs as a user runs it, through its main class from the 4.1 jars
(`bench/javatools.py` KAFKA41_TOOLS), and its output is checked. These are the tools
a platform team reaches for first; tools that need APIs StraitMQ does not have yet
(DescribeQuorum, DeleteRecords, ListOffsets v7+, features) are not here.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from cluster_support import cluster_factory
from confluent_kafka import Producer

from bench.javatools import KAFKA41_TOOLS, ensure_jars, java_cmd

pytestmark = pytest.mark.timeout(300)
SIDES = ("leader", "follower")


@pytest.fixture(scope="module", autouse=True)
def _jars() -> None:
    ensure_jars()


def tool(name: str, *args: str) -> subprocess.CompletedProcess:
    r = subprocess.run(
        java_cmd(KAFKA41_TOOLS[name], args, jars="4.1"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, f"{name} {' '.join(args)}: exit {r.returncode}\n{r.stderr[-3000:]}"
    return r


def produce(bootstrap: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(n):
        p.produce(topic, key=b"k%d" % (i % 2), value=b"v%06d" % i, partition=i % 2)
    assert p.flush(30) == 0


def test_topics_and_log_dirs(broker) -> None:  # type: ignore[no-untyped-def]
    b = broker.bootstrap
    tool("kafka-topics", "--bootstrap-server", b, "--create", "--topic", "cli41",
         "--partitions", "2", "--replication-factor", "1")  # fmt: skip
    listed = tool("kafka-topics", "--bootstrap-server", b, "--list").stdout.split()
    assert "cli41" in listed
    described = tool("kafka-topics", "--bootstrap-server", b, "--describe", "--topic", "cli41")
    assert "PartitionCount: 2" in described.stdout, described.stdout
    produce(b, "cli41", 100)

    r = tool("kafka-log-dirs", "--bootstrap-server", b, "--describe", "--topic-list", "cli41")
    answer = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("{")))
    (node,) = answer["brokers"]
    (d,) = node["logDirs"]
    assert d["error"] is None and Path(d["logDir"]).is_absolute(), d
    parts = {p["partition"]: p for p in d["partitions"]}
    assert set(parts) == {"cli41-0", "cli41-1"}, parts
    for p in parts.values():
        assert p["size"] > 50 * 5 and p["offsetLag"] == 0 and p["isFuture"] is False, p

    # Every topic when none is named; an unknown one is simply absent, as in Kafka.
    r = tool("kafka-log-dirs", "--bootstrap-server", b, "--describe")
    assert "cli41-0" in r.stdout
    r = tool("kafka-log-dirs", "--bootstrap-server", b, "--describe", "--topic-list", "nope")
    answer = json.loads(next(line for line in r.stdout.splitlines() if line.startswith("{")))
    assert answer["brokers"][0]["logDirs"][0]["partitions"] == []


def test_offsets_groups_and_api_versions(broker) -> None:  # type: ignore[no-untyped-def]
    b = broker.bootstrap
    broker.create_topic("cli41o", partitions=2)
    produce(b, "cli41o", 40)
    r = tool("kafka-get-offsets", "--bootstrap-server", b, "--topic", "cli41o")
    assert sorted(r.stdout.split()) == ["cli41o:0:20", "cli41o:1:20"], r.stdout
    r = tool("kafka-console-consumer", "--bootstrap-server", b, "--topic", "cli41o",
             "--group", "cli41g", "--from-beginning", "--max-messages", "40",
             "--timeout-ms", "30000")  # fmt: skip
    assert len(r.stdout.split()) == 40
    r = tool("kafka-consumer-groups", "--bootstrap-server", b, "--describe", "--group", "cli41g")
    lines = [line.split() for line in r.stdout.splitlines() if "cli41o" in line]
    assert len(lines) == 2 and all(fields[3] == fields[4] == "20" for fields in lines), r.stdout
    r = tool("kafka-broker-api-versions", "--bootstrap-server", b)
    assert "DescribeLogDirs(35): 1 to 4 [usable: 4]" in r.stdout, r.stdout


def test_metadata_quorum(broker) -> None:  # type: ignore[no-untyped-def]
    """A combined node: one voter, which leads; it answers through any broker."""
    b = broker.bootstrap
    r = tool("kafka-metadata-quorum", "--bootstrap-server", b, "describe", "--status")
    status = {
        k.strip(): v.strip() for k, v in (line.split(":", 1) for line in r.stdout.splitlines())
    }
    voters = json.loads(status["CurrentVoters"])
    assert [v["id"] for v in voters] == [int(status["LeaderId"])], status
    assert voters[0]["endpoints"][0].startswith("CONTROLLER://127.0.0.1:"), voters
    assert int(status["HighWatermark"]) > 0 and int(status["LeaderEpoch"]) >= 1, status
    assert status["MaxFollowerLag"] == "0", status
    r = tool("kafka-metadata-quorum", "--bootstrap-server", b, "describe", "--replication")
    (row,) = [line.split() for line in r.stdout.splitlines()[1:] if line.strip()]
    assert row[0] == status["LeaderId"] and row[-1] == "Leader", r.stdout
    # LastFetchTimestamp is wall-clock milliseconds, as Kafka's tools expect.
    assert abs(int(row[4]) / 1000 - time.time()) < 300, row


def test_broker_throttle_configs(broker) -> None:  # type: ignore[no-untyped-def]
    """What `kafka-reassign-partitions --throttle` sets and `--verify` clears, per broker,
    is StraitMQ's one cluster-wide replication throttle; other broker configs are static
    and say so."""
    b = broker.bootstrap

    def rate() -> str:
        with urllib.request.urlopen(f"{broker.http}/api/v1/cluster/configs", timeout=5) as r:
            return json.loads(r.read())["configs"]["replication.throttled.rate"]

    with urllib.request.urlopen(f"{broker.http}/api/v1/cluster", timeout=5) as r:
        node = str(json.loads(r.read())["node_id"])
    throttles = (
        "leader.replication.throttled.rate=1048576,follower.replication.throttled.rate=1048576"
    )
    tool("kafka-configs", "--bootstrap-server", b, "--alter", "--entity-type", "brokers",
         "--entity-name", node, "--add-config", throttles)  # fmt: skip
    assert rate() == "1048576"
    tool("kafka-configs", "--bootstrap-server", b, "--alter", "--entity-type", "brokers",
         "--entity-name", node, "--delete-config",
         ",".join(f"{side}.replication.throttled.rate" for side in SIDES))  # fmt: skip
    assert rate() == "-1"
    r = subprocess.run(
        java_cmd(KAFKA41_TOOLS["kafka-configs"],
                 ["--bootstrap-server", b, "--alter", "--entity-type", "brokers",
                  "--entity-name", node, "--add-config", "log.retention.ms=1000"], jars="4.1"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode != 0 and "cannot be altered at runtime" in r.stdout + r.stderr, r
    assert rate() == "-1"


@pytest.fixture
def cluster(tmp_path):  # type: ignore[no-untyped-def]
    yield from cluster_factory(tmp_path)


def test_metadata_quorum_on_a_cluster(cluster) -> None:  # type: ignore[no-untyped-def]
    """3 controllers + 3 brokers: the leader and two followers vote, the brokers observe."""
    c = cluster()
    active = c.wait_active_controller()
    r = tool("kafka-metadata-quorum", "--bootstrap-server", c.bootstrap, "describe",
             "--replication")  # fmt: skip
    rows = {row[0]: row for row in (line.split() for line in r.stdout.splitlines()[1:]) if row}
    status = {row[0]: row[-1] for row in rows.values()}
    assert status[str(active.node_id)] == "Leader", r.stdout
    assert sorted(k for k, v in status.items() if v == "Follower") == sorted(
        str(n) for n in c.controllers if n != active.node_id
    ), r.stdout
    assert sorted(k for k, v in status.items() if v == "Observer") == sorted(
        str(b) for b in c.brokers
    ), r.stdout
