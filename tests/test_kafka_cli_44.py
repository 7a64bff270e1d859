"""The newest Apache Kafka CLI tools (4.4, from Maven Central) against a StraitMQ broker.

Each tool runs as a user runs it, through its main class from the 4.4 jars
(`bench/javatools.py` KAFKA44_TOOLS), and its output is checked. These are the tools
a platform team reaches for first. Where a tool changes something (delete-records),
the effect is checked too, also after a restart and on a follower that becomes leader;
bad input is sent straight to the broker to check Kafka's error codes.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import time
import urllib.request
from datetime import timedelta
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
from cluster_support import cluster_factory
from confluent_kafka import Producer
from kio.schema.delete_records.v2 import request as dr
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64
from test_errors import Raw
from test_quorum_dynamic import leader_view, start_joining_controller
from waiting import wait_for

from bench.javatools import KAFKA44_TOOLS, ensure_jars, java_cmd
from straitmq.admin_client import request_sync

pytestmark = pytest.mark.timeout(300)
SIDES = ("leader", "follower")


@pytest.fixture(scope="module", autouse=True)
def _jars() -> None:
    ensure_jars()


def run_tool(name: str, *args: str) -> subprocess.CompletedProcess:
    """A tool run that may fail (bad input): its exit code is the caller's to check."""
    return subprocess.run(
        java_cmd(KAFKA44_TOOLS[name], args, jars="4.4"),
        capture_output=True,
        text=True,
        timeout=120,
    )


def tool(name: str, *args: str) -> subprocess.CompletedProcess:
    r = run_tool(name, *args)
    assert r.returncode == 0, f"{name} {' '.join(args)}: exit {r.returncode}\n{r.stderr[-3000:]}"
    return r


def produce(bootstrap: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(n):
        p.produce(topic, key=b"k%d" % (i % 2), value=b"v%06d" % i, partition=i % 2)
    assert p.flush(30) == 0


def test_topics_and_log_dirs(broker) -> None:
    b = broker.bootstrap
    tool(
        "kafka-topics",
        "--bootstrap-server",
        b,
        "--create",
        "--topic",
        "cli41",
        "--partitions",
        "2",
        "--replication-factor",
        "1",
    )
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


def test_offsets_groups_and_api_versions(broker) -> None:
    b = broker.bootstrap
    broker.create_topic("cli41o", partitions=2)
    produce(b, "cli41o", 40)
    r = tool("kafka-get-offsets", "--bootstrap-server", b, "--topic", "cli41o")
    assert sorted(r.stdout.split()) == ["cli41o:0:20", "cli41o:1:20"], r.stdout
    r = tool(
        "kafka-console-consumer",
        "--bootstrap-server",
        b,
        "--topic",
        "cli41o",
        "--group",
        "cli41g",
        "--from-beginning",
        "--max-messages",
        "40",
        "--timeout-ms",
        "30000",
    )
    assert len(r.stdout.split()) == 40
    r = tool("kafka-consumer-groups", "--bootstrap-server", b, "--describe", "--group", "cli41g")
    lines = [line.split() for line in r.stdout.splitlines() if "cli41o" in line]
    assert len(lines) == 2 and all(fields[3] == fields[4] == "20" for fields in lines), r.stdout
    r = tool("kafka-broker-api-versions", "--bootstrap-server", b)
    assert "DescribeLogDirs(35): 1 to 4 [usable: 4]" in r.stdout, r.stdout


def test_metadata_quorum(broker) -> None:
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


def test_broker_throttle_configs(broker) -> None:
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
    alter = ("--bootstrap-server", b, "--alter", "--entity-type", "brokers", "--entity-name", node)
    tool("kafka-configs", *alter, "--add-config", throttles)
    assert rate() == "1048576"
    deleted = ",".join(f"{side}.replication.throttled.rate" for side in SIDES)
    tool("kafka-configs", *alter, "--delete-config", deleted)
    assert rate() == "-1"
    r = run_tool("kafka-configs", *alter, "--add-config", "log.retention.ms=1000")
    assert r.returncode != 0 and "cannot be altered at runtime" in r.stdout + r.stderr, r
    assert rate() == "-1"


@pytest.fixture
def cluster(tmp_path):
    yield from cluster_factory(tmp_path)


def test_metadata_quorum_on_a_cluster(cluster) -> None:
    """3 controllers + 3 brokers: the leader and two followers vote, the brokers observe."""
    c = cluster()
    active = c.wait_active_controller()
    r = tool(
        "kafka-metadata-quorum", "--bootstrap-server", c.bootstrap, "describe", "--replication"
    )
    rows = {row[0]: row for row in (line.split() for line in r.stdout.splitlines()[1:]) if row}
    status = {row[0]: row[-1] for row in rows.values()}
    assert status[str(active.node_id)] == "Leader", r.stdout
    assert sorted(k for k, v in status.items() if v == "Follower") == sorted(
        str(n) for n in c.controllers if n != active.node_id
    ), r.stdout
    assert sorted(k for k, v in status.items() if v == "Observer") == sorted(
        str(b) for b in c.brokers
    ), r.stdout


def test_metadata_quorum_add_and_remove_controller(cluster, tmp_path) -> None:
    """KIP-853 with Kafka's own tool: a controller started outside the voters is added
    from its properties (its directory id read from its meta.properties), shown with its
    directory id, removed, and a second removal is refused. --bootstrap-controller takes
    a broker's address: the controllers serve HTTP, the brokers the controller APIs."""
    c = cluster(brokers=1)
    b = c.bootstrap
    joining = start_joining_controller(c, 1004)
    props = tmp_path / "controller-1004.properties"
    props.write_text(
        "process.roles=controller\nnode.id=1004\ncontroller.listener.names=CONTROLLER\n"
        f"listeners=CONTROLLER://127.0.0.1:{joining.http_port}\n"
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT\n"
        f"metadata.log.dir={c.data_dir}/controller-1004\n"
    )
    r = tool(
        "kafka-metadata-quorum",
        "--bootstrap-controller",
        b,
        "--command-config",
        str(props),
        "add-controller",
    )
    assert "Added controller 1004" in r.stdout, r.stdout
    (voter,) = [v for v in leader_view(c)["voter_set"] if v["id"] == 1004]
    directory = voter["directory_id"]
    r = tool("kafka-metadata-quorum", "--bootstrap-controller", b, "describe", "--replication")
    (row,) = [line.split() for line in r.stdout.splitlines() if line.startswith("1004")]
    assert row[1] == directory and row[-1] == "Follower", r.stdout
    remove = ("remove-controller", "--controller-id", "1004", "--controller-directory-id")
    r = tool("kafka-metadata-quorum", "--bootstrap-controller", b, *remove, directory)
    assert "Removed" in r.stdout, r.stdout
    r = tool("kafka-metadata-quorum", "--bootstrap-server", b, "describe", "--status")
    assert '"id": 1004' not in r.stdout.split("CurrentVoters:")[1].split("\n")[0], r.stdout
    r = run_tool("kafka-metadata-quorum", "--bootstrap-server", b, *remove, directory)
    assert r.returncode != 0 and "VOTER_NOT_FOUND" in r.stderr, r.stderr


def test_reassign_with_throttle_then_verify(cluster, tmp_path) -> None:
    """`kafka-reassign-partitions --execute --throttle`, then `--verify` until done: the
    verify step clears the throttles it set, replica.alter.log.dirs.io.max.bytes.per.second
    among them (accepted: nothing to move between log directories here), and exits 0."""
    c = cluster()
    spec = {"name": "cli41-move", "partitions": 1, "replication_factor": 1}
    node = c.any_broker()
    request_sync(f"http://{node.host}:{node.http_port}", "POST", "/api/v1/topics", spec)
    c.wait_isr("cli41-move", 1)
    produce(c.bootstrap, "cli41-move", 50)
    source = c.leader_of("cli41-move", 0)
    target = next(b for b in c.brokers if b != source)
    plan = tmp_path / "move.json"
    plan.write_text(
        json.dumps(
            {
                "version": 1,
                "partitions": [{"topic": "cli41-move", "partition": 0, "replicas": [target]}],
            }
        )
    )
    args = ["--bootstrap-server", c.bootstrap, "--reassignment-json-file", str(plan)]
    tool("kafka-reassign-partitions", *args, "--execute", "--throttle", "10000000")

    def verified() -> str | None:
        r = run_tool("kafka-reassign-partitions", *args, "--verify")
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout if "is completed" in r.stdout and "Clearing" in r.stdout else None

    out = wait_for(verified, 60, "the reassignment to complete and its throttles to clear")
    assert "Clearing broker-level throttles" in str(out), out
    assert c.topic("cli41-move")["partitions"][0]["replicas"] == [target]


# -- kafka-delete-records (DeleteRecords) ---------------------------------------------------


def delete_records(bootstrap: str, tmp_path: Path, offsets: dict[tuple[str, int], int]) -> dict:
    """Run kafka-delete-records; {"topic-partition": low watermark or "error: ..."}."""
    spec = tmp_path / f"delete-{len(list(tmp_path.glob('delete-*')))}.json"
    spec.write_text(
        json.dumps(
            {
                "version": 1,
                "partitions": [
                    {"topic": t, "partition": p, "offset": o} for (t, p), o in offsets.items()
                ],
            }
        )
    )
    r = tool(
        "kafka-delete-records", "--bootstrap-server", bootstrap, "--offset-json-file", str(spec)
    )
    assert "Records delete operation completed:" in r.stdout, r.stdout
    out = {}
    for line in r.stdout.splitlines():
        if line.startswith("partition: "):
            where, what = line[len("partition: ") :].split("\t", 1)
            key, _, value = what.partition(": ")
            out[where] = int(value) if key == "low_watermark" else f"{key}: {value}"
    return out


def earliest(bootstrap: str, topic: str) -> list[str]:
    r = tool("kafka-get-offsets", "--bootstrap-server", bootstrap, "--topic", topic, "--time", "-2")
    return sorted(r.stdout.split())


def first_offsets(bootstrap: str, topic: str, partition: int, n: int = 3) -> list[int]:
    """The offsets kafka-console-consumer reads first from the beginning of a partition."""
    r = tool(
        "kafka-console-consumer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--partition",
        str(partition),
        "--offset",
        "earliest",
        "--max-messages",
        str(n),
        "--property",
        "print.offset=true",
        "--timeout-ms",
        "30000",
    )
    return [
        int(line.split("Offset:")[1].split()[0])
        for line in r.stdout.splitlines()
        if line.startswith("Offset:")
    ]


def delete_request(*parts: tuple[str, int, int]) -> dr.DeleteRecordsRequest:
    by_topic: dict[str, list] = {}
    for t, p, o in parts:
        by_topic.setdefault(t, []).append(
            dr.DeleteRecordsPartition(partition_index=i32(p), offset=i64(o))
        )
    return dr.DeleteRecordsRequest(
        topics=tuple(
            dr.DeleteRecordsTopic(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()
        ),
        timeout=timedelta(seconds=10),
    )


def answers(resp: object) -> dict[tuple[str, int], tuple[int, int]]:
    """{(topic, partition): (error code, low watermark)}; a partition answered twice fails."""
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for t in resp.topics:  # type: ignore[attr-defined]
        for p in t.partitions:
            key = (t.name, int(p.partition_index))
            assert key not in out, f"{key} answered twice"
            out[key] = (int(p.error_code), int(p.low_watermark))
    return out


def test_delete_records(broker, tmp_path) -> None:
    b = broker.bootstrap
    # Small segments (below what kafka-topics accepts), so whole segments fall below the
    # new log start and are deleted.
    spec = {"name": "cli41d", "partitions": 2, "configs": {"segment.bytes": "300"}}
    request_sync(broker.http, "POST", "/api/v1/topics", spec)
    for _ in range(8):  # a batch of 10 records per partition each time, ~1 per segment
        produce(b, "cli41d", 20)
    assert earliest(b, "cli41d") == ["cli41d:0:0", "cli41d:1:0"]
    segments_before = len(list((broker.data_dir / "logs" / "cli41d-0").glob("*.log")))
    assert segments_before > 3

    # 37 lies inside a segment and inside a batch; -1 is the high watermark.
    got = delete_records(b, tmp_path, {("cli41d", 0): 37, ("cli41d", 1): -1})
    assert got == {"cli41d-0": 37, "cli41d-1": 80}, got
    assert earliest(b, "cli41d") == ["cli41d:0:37", "cli41d:1:80"]
    assert first_offsets(b, "cli41d", 0) == [37, 38, 39]
    assert len(list((broker.data_dir / "logs" / "cli41d-0").glob("*.log"))) < segments_before
    # Below the log start, ListOffsets by time finds nothing older than the start either.
    r = tool(
        "kafka-get-offsets",
        "--bootstrap-server",
        b,
        "--topic",
        "cli41d",
        "--partitions",
        "0",
        "--time",
        "0",
    )
    assert r.stdout.split() == ["cli41d:0:37"], r.stdout

    # An offset above the high watermark: OFFSET_OUT_OF_RANGE, nothing moves; a lower
    # offset than the start changes nothing and answers the start.
    got = delete_records(b, tmp_path, {("cli41d", 0): 10_000, ("cli41d", 1): 3})
    assert "OffsetOutOfRange" in str(got["cli41d-0"]), got
    assert got["cli41d-1"] == 80, got

    r = Raw(broker)
    try:
        resp = answers(
            r.call(
                delete_request(
                    ("cli41d", 0, 40),
                    ("nope", 0, 1),
                    ("cli41d", 5, 1),
                    ("cli41d", 0, 41),
                    ("__consumer_offsets", 0, 0),
                )
            )
        )
    finally:
        r.close()
    assert resp == {
        ("cli41d", 0): (0, 41),  # named twice: once, the last offset (Kafka's map)
        ("nope", 0): (ErrorCode.unknown_topic_or_partition, -1),
        ("cli41d", 5): (ErrorCode.unknown_topic_or_partition, -1),
        ("__consumer_offsets", 0): (ErrorCode.invalid_topic_exception, -1),
    }, resp

    # The log start survives a restart (its checkpoint), and so do the deleted segments'
    # absence and the consumers' view.
    broker.restart()
    assert earliest(b, "cli41d") == ["cli41d:0:41", "cli41d:1:80"]
    assert first_offsets(b, "cli41d", 0) == [41, 42, 43]
    produce(b, "cli41d", 2)
    assert first_offsets(b, "cli41d", 1, 1) == [80]


def test_delete_records_on_a_cluster(cluster, tmp_path) -> None:
    """RF 3: the followers copy the leader's new log start, so a follower that becomes
    leader (the leader killed) serves from it; a restarted replica learns a later one."""
    c = cluster()
    spec = {
        "name": "cli41r",
        "partitions": 2,
        "replication_factor": 3,
        "configs": {"segment.bytes": "300", "min.insync.replicas": "2"},
    }
    node = c.any_broker()
    request_sync(f"http://{node.host}:{node.http_port}", "POST", "/api/v1/topics", spec)
    c.wait_isr("cli41r", 3)
    for _ in range(8):
        produce(c.bootstrap, "cli41r", 20)
    leader = c.leader_of("cli41r", 0)

    def starts() -> dict[int, int]:
        return {
            b: c.topic("cli41r", via=b)["partitions"][0]["log_start_offset"]
            for b, n in c.brokers.items()
            if n.alive()
        }

    assert delete_records(c.bootstrap, tmp_path, {("cli41r", 0): 37}) == {"cli41r-0": 37}
    # The answer waited for every live replica to report the new log start (Kafka's low
    # watermark): no follower that could be elected still serves the deleted records.
    assert set(starts().values()) == {37}, starts()

    # A replica that does not lead refuses: NOT_LEADER_OR_FOLLOWER, nothing moves.
    follower = next(b for b in c.brokers if b != leader)
    r = Raw(SimpleNamespace(port=c.brokers[follower].kafka_port))
    try:
        resp = answers(r.call(delete_request(("cli41r", 0, 40))))
    finally:
        r.close()
    assert resp == {("cli41r", 0): (ErrorCode.not_leader_or_follower, -1)}, resp
    assert set(starts().values()) == {37}

    c.brokers[leader].kill9()
    new, _ = c.wait_new_leader("cli41r", 0, leader)
    alive = ",".join(f"{n.host}:{n.kafka_port}" for n in c.live_brokers())
    assert earliest(alive, "cli41r") == ["cli41r:0:37", "cli41r:1:0"]
    assert first_offsets(alive, "cli41r", 0) == [37, 38, 39]

    # The new leader deletes further; the old leader comes back as a follower with its
    # own checkpoint (37) and takes the leader's start (45) from its fetches.
    assert delete_records(alive, tmp_path, {("cli41r", 0): 45}) == {"cli41r-0": 45}
    c.brokers[leader].start()
    c.wait_isr("cli41r", 3)
    wait_for(
        lambda: starts() == {b: 45 for b in c.brokers},
        30,
        "the restarted replica at the leader's log start",
        ignore=(RuntimeError,),
    )
    assert first_offsets(c.bootstrap, "cli41r", 0) == [45, 46, 47]

    # A replica that lost its copy starts empty, at the leader's log start, which lies
    # inside a batch (40-49): it takes that whole batch and keeps the start.
    wiped = next(b for b in c.brokers if b not in (new, leader))
    c.brokers[wiped].stop()
    replica_dir = Path(c.data_dir) / f"broker-{wiped}" / "logs" / "cli41r-0"
    assert replica_dir.is_dir()
    shutil.rmtree(replica_dir)
    c.brokers[wiped].start()
    c.wait_isr("cli41r", 3)
    wait_for(
        lambda: starts() == {b: 45 for b in c.brokers},
        30,
        "the wiped replica at the leader's log start",
        ignore=(RuntimeError,),
    )
    c.converge("cli41r")


# -- kafka-get-offsets --time -3/-4/-5 (ListOffsets v7-v10) -----------------------------------


def list_offsets(version: int, *parts: tuple[str, int, int]) -> object:
    mod = importlib.import_module(f"kio.schema.list_offsets.v{version}.request")
    by_topic: dict[str, list] = {}
    for t, p, ts in parts:
        by_topic.setdefault(t, []).append(
            mod.ListOffsetsPartition(partition_index=i32(p), timestamp=i64(ts))
        )
    extra = {"timeout": timedelta(seconds=5)} if version >= 10 else {}
    return mod.ListOffsetsRequest(
        replica_id=i32(-1),
        isolation_level=0,
        **extra,
        topics=tuple(
            mod.ListOffsetsTopic(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()
        ),
    )


def offsets_answer(resp: object) -> list[tuple[str, int, int, int, int]]:
    """(topic, partition, error, offset, timestamp) in the order answered."""
    return [
        (t.name, int(p.partition_index), int(p.error_code), int(p.offset), int(p.timestamp))
        for t in resp.topics
        for p in t.partitions
    ]


def test_get_offsets_special_times(broker) -> None:
    b = broker.bootstrap
    broker.create_topic("cli41t", partitions=1)
    now = int(time.time() * 1000)
    stamps = [now + 1, now + 5000, now + 2, now + 5000, now + 3]  # largest: offset 1 first
    p = Producer({"bootstrap.servers": b, "acks": "all"})
    for i, ts in enumerate(stamps):
        p.produce("cli41t", value=b"t%d" % i, partition=0, timestamp=ts)
        assert p.flush(30) == 0  # a batch each, so the largest is not in the last batch
    # -5 (latest tiered) is offset -1 without tiered storage, which the tool leaves out,
    # as it does against Kafka.
    times = {
        "-1": ["cli41t:0:5"],
        "-2": ["cli41t:0:0"],
        "-3": ["cli41t:0:1"],
        "-4": ["cli41t:0:0"],
        "-5": [],
    }
    for when, want in times.items():
        r = tool("kafka-get-offsets", "--bootstrap-server", b, "--topic", "cli41t", "--time", when)
        assert r.stdout.split() == want and "rror" not in r.stderr, (when, r.stdout, r.stderr)
    r = tool(
        "kafka-get-offsets", "--bootstrap-server", b, "--topic", "cli41t", "--time", "max-timestamp"
    )
    assert r.stdout.split() == ["cli41t:0:1"], r.stdout

    raw = Raw(broker)
    try:
        for v in (7, 10):
            got = offsets_answer(raw.call(list_offsets(v, ("cli41t", 0, -3))))
            assert got == [("cli41t", 0, 0, 1, now + 5000)], (v, got)
        # Each special time from its own version on; a partition named twice is
        # INVALID_REQUEST, answered once; an unknown topic, UNKNOWN_TOPIC_OR_PARTITION.
        assert offsets_answer(raw.call(list_offsets(6, ("cli41t", 0, -3)))) == [
            ("cli41t", 0, ErrorCode.unsupported_version, -1, -1)
        ]
        assert offsets_answer(raw.call(list_offsets(8, ("cli41t", 0, -5)))) == [
            ("cli41t", 0, ErrorCode.unsupported_version, -1, -1)
        ]
        got = offsets_answer(
            raw.call(list_offsets(9, ("cli41t", 0, -4), ("cli41t", 0, -1), ("nope", 0, -3)))
        )
        assert got == [
            ("cli41t", 0, ErrorCode.invalid_request, -1, -1),
            ("nope", 0, ErrorCode.unknown_topic_or_partition, -1, -1),
        ], got
        # After DeleteRecords, earliest and earliest-local are the new log start and the
        # largest timestamp is looked for from there (offset 3 has it too).
        assert answers(raw.call(delete_request(("cli41t", 0, 2)))) == {("cli41t", 0): (0, 2)}
        got = [
            offsets_answer(raw.call(list_offsets(9, ("cli41t", 0, when))))[0][2:4]
            for when in (-2, -4, -3, -5)
        ]
    finally:
        raw.close()
    assert got == [(0, 2), (0, 2), (0, 3), (0, -1)], got
    r = tool("kafka-get-offsets", "--bootstrap-server", b, "--topic", "cli41t", "--time", "-3")
    assert r.stdout.split() == ["cli41t:0:3"], r.stdout


# -- kafka-topics --describe (DescribeTopicPartitions) ----------------------------------------


def describe_partitions(
    names: list[str], limit: int = 2000, cursor: tuple[str, int] | None = None
) -> object:
    from kio.schema.describe_topic_partitions.v0 import request as dtp

    return dtp.DescribeTopicPartitionsRequest(
        topics=tuple(dtp.TopicRequest(name=n) for n in names),
        response_partition_limit=i32(limit),
        cursor=None
        if cursor is None
        else dtp.Cursor(topic_name=cursor[0], partition_index=i32(cursor[1])),
    )


def pages(resp: object) -> tuple[list[tuple[str, int, list[int]]], tuple[str, int] | None]:
    """([(topic, error, [partition indexes])], next cursor)."""
    topics = [
        (t.name, int(t.error_code), [int(p.partition_index) for p in t.partitions])
        for t in resp.topics
    ]
    c = resp.next_cursor  # type: ignore[attr-defined]
    return topics, None if c is None else (c.topic_name, int(c.partition_index))


def paged(
    raw: Raw, names: list[str], limit: int = 2000, cursor: tuple[str, int] | None = None
) -> tuple[list[tuple[str, int, list[int]]], tuple[str, int] | None]:
    return pages(raw.call(describe_partitions(names, limit, cursor)))


def test_describe_topic_partitions(broker) -> None:
    b = broker.bootstrap
    broker.create_topic("cli41p-a", partitions=3)
    broker.create_topic("cli41p-b", partitions=2)
    # The tool pages with the API's cursor when the limit is below the partition count.
    r = tool(
        "kafka-topics",
        "--bootstrap-server",
        b,
        "--describe",
        "--topic",
        "cli41p-.*",
        "--partition-size-limit-per-response",
        "2",
    )
    lines = r.stdout.splitlines()
    rows = [line.lstrip("\t").split("\t") for line in lines if "Partition: " in line]
    assert [(row[0], row[1]) for row in rows] == [
        ("Topic: cli41p-a", "Partition: 0"),
        ("Topic: cli41p-a", "Partition: 1"),
        ("Topic: cli41p-a", "Partition: 2"),
        ("Topic: cli41p-b", "Partition: 0"),
        ("Topic: cli41p-b", "Partition: 1"),
    ], r.stdout
    node = rows[0][2].split(": ")[1]
    for row in rows:
        # No ELR, as Kafka with ELR off answers: empty lists, not N/A (Metadata's answer).
        assert row[2:] == [
            f"Leader: {node}",
            f"Replicas: {node}",
            f"Isr: {node}",
            "Elr: ",
            "LastKnownElr: ",
        ], row
    assert "PartitionCount: 3" in r.stdout and "PartitionCount: 2" in r.stdout, r.stdout

    raw = Raw(broker)
    try:
        call = partial(paged, raw)
        both = ["cli41p-b", "cli41p-a", "cli41p-b"]  # unsorted, one named twice
        assert call(both, 2) == ([("cli41p-a", 0, [0, 1])], ("cli41p-a", 2))
        assert call(both, 2, ("cli41p-a", 2)) == (
            [("cli41p-a", 0, [2]), ("cli41p-b", 0, [0])],
            ("cli41p-b", 1),
        )
        assert call(both, 3, ("cli41p-a", 2)) == (
            [("cli41p-a", 0, [2]), ("cli41p-b", 0, [0, 1])],
            None,
        )
        # A limit that ends exactly at a topic's end: the next topic starts the cursor.
        assert call(both, 3) == ([("cli41p-a", 0, [0, 1, 2])], ("cli41p-b", 0))
        assert call(both, 0) == ([("cli41p-a", 0, [0])], ("cli41p-a", 1)), "at least one"
        # Every topic when none is named (absent ones are simply not there).
        every, _ = call([])
        assert ("cli41p-b", 0, [0, 1]) in every and "nope" not in str(every)
        assert call(["cli41p-a", "nope", "bad/name"]) == (
            [
                ("bad/name", ErrorCode.invalid_topic_exception, []),
                ("cli41p-a", 0, [0, 1, 2]),
                ("nope", ErrorCode.unknown_topic_or_partition, []),
            ],
            None,
        )
        # The cursor's topic must be one of those named, its partition valid.
        for cursor in (("cli41p-c", 0), ("cli41p-a", -1)):
            assert call(["cli41p-a"], 10, cursor) == (
                [("cli41p-a", ErrorCode.invalid_request, [])],
                None,
            ), cursor
    finally:
        raw.close()


# -- kafka-features describe (ApiVersions v3+ feature flags) -----------------------------------


def api_versions(version: int) -> object:
    mod = importlib.import_module(f"kio.schema.api_versions.v{version}.request")
    extra = {"client_software_name": "test", "client_software_version": "1"} if version >= 3 else {}
    return mod.ApiVersionsRequest(**extra)


def test_features_describe(broker) -> None:
    r = tool("kafka-features", "--bootstrap-server", broker.bootstrap, "describe")
    # "Feature: NAME  SupportedMinVersion: V ...": fields are tab-separated up to 4.1 and
    # padded with spaces into columns since (values hold no spaces).
    rows = [
        dict(re.findall(r"(\w+): (\S+)", line))
        for line in r.stdout.splitlines()
        if line.startswith("Feature: ")
    ]
    by_name = {row.pop("Feature"): row for row in rows}
    assert list(by_name) == sorted(by_name), "the tool sorts them"
    assert by_name["metadata.version"] == {
        "SupportedMinVersion": "3.3-IV3",
        "SupportedMaxVersion": "4.1-IV1",
        "FinalizedVersionLevel": "4.1-IV1",
        "Epoch": by_name["metadata.version"]["Epoch"],
    }, r.stdout
    assert int(by_name["metadata.version"]["Epoch"]) > 0, r.stdout
    # A new cluster starts with every feature finalized at this release's newest level.
    expect = {
        "straitmq.metadata.version": ["1", "3", "3"],
        "kraft.version": ["0", "1", "1"],  # voters change at runtime (KIP-853)
        "group.version": ["0", "1", "1"],  # KIP-848 ConsumerGroupHeartbeat
        "transaction.version": ["0", "2", "2"],  # KIP-890 transactions v2
        "share.version": ["0", "1", "1"],  # KIP-932 share groups (v1 APIs)
        "eligible.leader.replicas.version": ["0", "0", "0"],
        "streams.version": ["0", "0", "0"],
    }
    assert set(by_name) == {"metadata.version", *expect}, r.stdout
    for name, levels in expect.items():
        assert [
            by_name[name][k]
            for k in ("SupportedMinVersion", "SupportedMaxVersion", "FinalizedVersionLevel")
        ] == levels, (name, r.stdout)

    raw = Raw(broker)
    try:
        replies = {v: raw.call(api_versions(v)) for v in (2, 3, 4)}
    finally:
        raw.close()
    assert not hasattr(replies[2], "supported_features")
    # Before v4, features whose supported minimum is 0 are left out (KAFKA-17492).
    assert [f.name for f in replies[3].supported_features] == [
        "straitmq.metadata.version",
        "metadata.version",
    ]
    assert len(replies[4].supported_features) == 8
    for v in (3, 4):
        assert [
            (f.name, f.min_version_level, f.max_version_level)
            for f in replies[v].finalized_features
        ] == [
            ("straitmq.metadata.version", 3, 3),
            ("metadata.version", 27, 27),
            ("kraft.version", 1, 1),
            ("group.version", 1, 1),
            ("transaction.version", 2, 2),
            ("share.version", 1, 1),
        ]
        assert replies[v].finalized_features_epoch > 0


def _finalized(bootstrap: str) -> dict[str, str]:
    r = tool("kafka-features", "--bootstrap-server", bootstrap, "describe")
    return {
        m["Feature"]: m["FinalizedVersionLevel"]
        for m in (dict(re.findall(r"(\w+): (\S+)", line)) for line in r.stdout.splitlines())
        if "Feature" in m
    }


def test_features_upgrade_and_downgrade_with_kafka_features(broker) -> None:
    """`kafka-features upgrade|downgrade` (UpdateFeatures) move a finalized level through
    the active controller; what cannot be done is refused with the reason, and nothing
    moves."""
    bs = ("--bootstrap-server", broker.bootstrap)
    # A safe downgrade of transaction.version: Java producers go back to transactions v1.
    r = tool("kafka-features", *bs, "downgrade", "--feature", "transaction.version=1")
    assert "transaction.version was downgraded to 1" in r.stdout, r.stdout
    assert _finalized(broker.bootstrap)["transaction.version"] == "1"
    r = tool("kafka-features", *bs, "upgrade", "--feature", "transaction.version=2")
    assert "transaction.version was upgraded to 2" in r.stdout, r.stdout
    # A dry run changes nothing.
    tool("kafka-features", *bs, "downgrade", "--feature", "group.version=0", "--dry-run")
    assert _finalized(broker.bootstrap)["group.version"] == "1"

    def refused(*args: str, why: str) -> None:
        r = run_tool("kafka-features", *bs, *args)
        out = r.stdout + r.stderr
        assert r.returncode != 0 and why in out, out

    # StraitMQ's own level never goes down: what it wrote, older releases cannot read.
    refused(
        "downgrade",
        "--feature",
        "straitmq.metadata.version=1",
        why="cannot be downgraded from 3 to 1",
    )
    refused("upgrade", "--feature", "straitmq.metadata.version=4", why="supported range 1..3")
    refused("upgrade", "--feature", "no.such.feature=1", why="unknown feature")
    refused("upgrade", "--feature", "transaction.version=1", why="is a downgrade")
    after = _finalized(broker.bootstrap)
    assert (after["straitmq.metadata.version"], after["transaction.version"]) == ("3", "2")
    # The same through strait's HTTP API.
    f = request_sync(broker.http, "GET", "/api/v1/features")
    assert {x["name"]: x["finalized"] for x in f["features"]}["group.version"] == 1


def test_client_metrics_are_listed_as_none_and_refused_clearly(broker) -> None:
    """`kafka-client-metrics` (ListConfigResources, KIP-1142): StraitMQ has no client
    metrics subscriptions (KIP-714), so the list is empty, and creating one fails at once
    saying why (not a hang, not an unknown-API error)."""
    b = broker.bootstrap
    listed = tool("kafka-client-metrics", "--bootstrap-server", b, "--list")
    assert listed.stdout.strip() == "", listed.stdout
    described = tool(
        "kafka-configs", "--bootstrap-server", b, "--describe", "--entity-type", "client-metrics"
    )
    assert described.stdout.strip() == "", described.stdout
    r = run_tool(
        "kafka-client-metrics",
        "--bootstrap-server",
        b,
        "--alter",
        "--name",
        "every-producer",
        "--metrics",
        "org.apache.kafka.producer.",
        "--interval",
        "1000",
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "(KIP-714) are not supported" in out, out[-2000:]
