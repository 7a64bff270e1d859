"""Partition reassignment and cluster membership on a real cluster: 3 controller
processes and 3 brokers, then a 4th broker joins.

Through real clients: kafka-python's admin client (AlterPartitionReassignments,
ListPartitionReassignments, ElectLeaders), confluent-kafka (produce, consume, CreateTopics),
kio-built requests where the error message matters, the broker HTTP API and the `strait`
CLI. Checks: a throttled move onto the new broker completes while consumers keep reading,
the new replica's log is byte-identical and the old replica's directory is gone; bad
requests are refused with errors that name the problem; misconfigured brokers exit
saying why.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_support import BROKER_ARGS, PYTHON, SESSION_TIMEOUT_MS, wait_for
from cluster_support import CONTROLLER_ARGS as FAULT_CONTROLLER_ARGS
from waiting import holds

from straitmq.admin_client import exchange_sync

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from straitmq.cli.local_cluster import LocalCluster, Node, free_port  # noqa: E402

# The fault tests' settings, but the ElectLeaders test moves leaders itself.
CONTROLLER_ARGS = [*FAULT_CONTROLLER_ARGS, "--no-auto-leader-rebalance"]
THROTTLE = 256 * 1024  # bytes/s while copying to the new replica
PAYLOAD = 1000  # bytes per message
PRELOAD = 2000  # messages before the move: ~2 MB, ~8 s at the throttle


def http(node: Node, method: str, path: str, body: object = None) -> tuple[int, dict]:
    return exchange_sync(f"http://127.0.0.1:{node.http_port}", method, path, body)


def strait(node: Node, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "straitmq.cli.main", "--http", f"http://127.0.0.1:{node.http_port}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def topic_view(node: Node, name: str) -> dict:
    status, body = http(node, "GET", f"/api/v1/topics/{name}")
    assert status == 200, body
    return body


def create_topic(node: Node, name: str, partitions: int, rf: int) -> dict:
    body = {"name": name, "partitions": partitions, "replication_factor": rf}
    status, created = http(node, "POST", "/api/v1/topics", body)
    assert status == 201, created
    return created


def admin(cluster: LocalCluster):
    from kafka import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30_000)


def kio_request(node: Node, api_key: int, version: int, body: object) -> object:
    from straitmq.protocol.client import KafkaConnection

    async def go() -> object:
        conn = KafkaConnection("127.0.0.1", node.kafka_port, "test-reassignment")
        try:
            return await conn.request(api_key, version, body, 30.0)
        finally:
            conn.close()

    return asyncio.run(go())


def segment_bytes(cluster: LocalCluster, bid: int, topic: str, index: int) -> bytes | None:
    """The partition's log on broker `bid`: its segment files in offset order."""
    d = os.path.join(cluster.data_dir, f"broker-{bid}", "logs", f"{topic}-{index}")
    if not os.path.isdir(d):
        return None
    names = sorted((n for n in os.listdir(d) if n.endswith(".log")), key=lambda n: int(n[:-4]))
    out = b""
    for n in names:
        with open(os.path.join(d, n), "rb") as f:
            out += f.read()
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(
        str(tmp_path_factory.mktemp("reassign") / "cluster"),
        brokers=3,
        kafka_base=None,
        http_base=None,
        controller_base=None,
        broker_args=BROKER_ARGS,
        controller_args=CONTROLLER_ARGS,
        log_level="info",
        python=PYTHON,
    )
    try:
        c.start(wait_s=60)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def four(cluster: LocalCluster) -> LocalCluster:
    """The same cluster after broker 4 joined."""
    if 4 not in cluster.brokers:
        cluster.add_broker(4, free_port(), free_port()).start()
        cluster.wait_ready(60, brokers=[4])
    return cluster


# -- membership and validation (3 brokers) -------------------------------------------------


def test_replication_factor_above_live_brokers_is_refused_by_a_kafka_admin_client(
    cluster: LocalCluster,
) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    ac = AdminClient({"bootstrap.servers": cluster.bootstrap})
    fut = ac.create_topics([NewTopic("rf-four", num_partitions=1, replication_factor=4)])["rf-four"]
    with pytest.raises(KafkaException) as info:
        fut.result(30)
    err = info.value.args[0]
    assert err.code() == 38, err  # INVALID_REPLICATION_FACTOR
    assert "replication factor 4" in err.str() and "3 available" in err.str(), err.str()


def _run_broker(cluster: LocalCluster, tmp: Path, node_id: int, cluster_id: str) -> tuple:
    """Start a broker that must be refused: (exit status or None if it hung, stderr, s)."""
    args = [
        PYTHON,
        "-m",
        "straitmq.broker",
        "--node-id",
        str(node_id),
        "--cluster-id",
        cluster_id,
        "--controllers",
        cluster.voters,
        "--data-dir",
        str(tmp / f"stray-{node_id}-{cluster_id}"),
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--http",
        f"127.0.0.1:{free_port()}",
        "--heartbeat-interval-ms",
        "300",
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        _, err = proc.communicate(timeout=15)
        return proc.returncode, err.decode(errors="replace"), time.monotonic() - t0
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return None, err.decode(errors="replace"), time.monotonic() - t0


def test_broker_with_the_wrong_cluster_id_exits_saying_why(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    code, err, _ = _run_broker(cluster, tmp_path, 7, "not-this-cluster")
    assert code is not None, f"the broker did not exit: {err[-2000:]}"
    assert code != 0
    assert "cluster" in err and "not-this-cluster" in err, err[-2000:]
    assert cluster.cluster_id in err


def test_second_broker_with_a_taken_node_id_exits_saying_why(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    observer = cluster.brokers[1]

    def registration() -> dict:
        """Broker 2's registration as broker 1's metadata image has it."""
        b2 = next(b for b in http(observer, "GET", "/api/v1/cluster")[1]["brokers"] if b["id"] == 2)
        return {k: b2[k] for k in ("incarnation", "port", "fenced", "shutting_down")}

    before = registration()
    assert not before["fenced"] and before["port"] == cluster.brokers[2].kafka_port, before
    code, err, _ = _run_broker(cluster, tmp_path, 2, cluster.cluster_id)
    assert "node id 2" in err and "already registered" in err, err[-2000:]
    assert code is not None, f"the refused broker did not exit: {err[-2000:]}"
    assert code != 0
    # The real broker 2 kept its registration and stays alive and unfenced: once broker 1
    # has applied everything the quorum committed up to the refusal, its view of broker 2
    # must not change for longer than a session timeout (a lost session would fence it).
    quorum = cluster.quorum()
    assert quorum is not None
    hw = quorum["high_watermark"]
    wait_for(
        lambda: http(observer, "GET", "/api/v1/cluster")[1]["quorum"]["applied_offset"] + 1 >= hw,
        10,
        f"broker 1 to apply the metadata log up to offset {hw}",
    )
    holds(registration, SESSION_TIMEOUT_MS / 1000 * 1.5, "broker 2's registration", expect=before)


# -- reassignment (4 brokers) --------------------------------------------------------------


def test_throttled_reassignment_onto_a_new_broker_while_consumers_read(four: LocalCluster) -> None:
    from confluent_kafka import Consumer, Producer
    from kafka import TopicPartition

    c = four
    b1 = c.brokers[1]
    status, body = http(
        b1,
        "POST",
        "/api/v1/topics",
        {
            "name": "moving",
            "partitions": 1,
            "replication_factor": 3,
            "configs": {"min.insync.replicas": "2"},
        },
    )
    assert status == 201, body
    before = body["partitions"][0]["replicas"]
    assert 4 not in before
    leaving = body["partitions"][0]["leader"]  # move the leader's copy away, too
    target = [r for r in before if r != leaving] + [4]

    acked: list[bytes] = []
    errors: list[str] = []

    def on_delivery(err, msg) -> None:
        (errors.append(str(err)) if err else acked.append(msg.value()))

    producer = Producer(
        {
            "bootstrap.servers": c.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "batch.size": 64 * 1024,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    pad = b"x" * (PAYLOAD - 12)
    for i in range(PRELOAD):
        producer.produce("moving", value=b"%08d" % i + pad, on_delivery=on_delivery)
        if i % 200 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors
    assert len(acked) == PRELOAD

    # A consumer group reads all along; a producer keeps writing during the move.
    received: list[tuple[float, bytes]] = []
    stop = threading.Event()

    def consume() -> None:
        cons = Consumer(
            {
                "bootstrap.servers": c.bootstrap,
                "group.id": "reassign-readers",
                "auto.offset.reset": "earliest",
                "topic.metadata.refresh.interval.ms": 1000,
                "max.partition.fetch.bytes": 16 * 1024,  # read slowly: still reading mid-move
            }
        )
        cons.subscribe(["moving"])
        try:
            while not stop.is_set():
                m = cons.poll(0.2)
                if m is not None and not m.error():
                    received.append((time.monotonic(), m.value()))
                    time.sleep(0.001)
        finally:
            cons.close()

    def produce() -> None:
        i = PRELOAD
        while not stop.is_set():
            producer.produce("moving", value=b"%08d" % i + pad, on_delivery=on_delivery)
            producer.poll(0)
            time.sleep(0.05)  # ~20 KB/s: well under the throttle
            i += 1

    threads = [threading.Thread(target=consume), threading.Thread(target=produce)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(received) > 100, 30, "the consumer to start reading")
        ac = admin(c)
        try:
            tp = TopicPartition("moving", 0)
            st, cfg = http(
                b1,
                "PUT",
                "/api/v1/cluster/configs",
                {"configs": {"replication.throttled.rate": THROTTLE}},
            )
            assert st == 200 and cfg["configs"]["replication.throttled.rate"] == str(THROTTLE)
            t_start = time.monotonic()
            assert ac.alter_partition_reassignments({tp: target}) == {tp: None}
            ongoing = ac.list_partition_reassignments()
            assert ongoing[tp]["adding_replicas"] == [4], ongoing
            assert ongoing[tp]["removing_replicas"] == [leaving], ongoing
            assert sorted(ongoing[tp]["replicas"]) == sorted([*before, 4])

            # Progress as the HTTP API and the CLI show it.
            def progress() -> dict | None:
                # The leader reports its followers' log ends once its own metadata shows
                # the move (a moment later on a loaded machine).
                st, listing = http(c.brokers[2], "GET", "/api/v1/reassignments")
                assert st == 200 and listing["throttle_bytes_per_sec"] == THROTTLE
                (mine,) = [r for r in listing["reassignments"] if r["topic"] == "moving"]
                return mine if mine["leader_log_end_offset"] is not None else None

            mine = wait_for(progress, 15, "the leader to report the move's progress")
            assert mine["target"] == target and mine["adding"] == [4]
            assert mine["leader_log_end_offset"] >= PRELOAD
            out = strait(c.brokers[3], "reassign", "--list")
            assert out.returncode == 0 and "moving-0" in out.stdout, out.stderr
            during = len(received)
            done = wait_for(
                lambda: not ac.list_partition_reassignments(), 120, "the move to complete", 0.25
            )
            took = time.monotonic() - t_start
            assert done
        finally:
            ac.close()
        # ~2 MB through a 256 KiB/s throttle takes several seconds. Allowed to pass
        # early: a full bucket (1 s of rate) and one fetch of up to 1 MiB, which the
        # leader does not throttle when the new replica's metadata is ahead of its own.
        size = topic_view(c.brokers[target[0]], "moving")["partitions"][0]["size_bytes"]
        print(f"moved {size} bytes at {THROTTLE} B/s in {took:.1f}s")
        assert took > (size - (1 << 20) - THROTTLE) / THROTTLE, (took, size)
        assert len(received) > during, "the consumer stopped reading during the move"
        t = wait_for(
            lambda: (v := topic_view(b1, "moving"))["partitions"][0]["replicas"] == target and v,
            20,
            "the image to show the new replicas",
        )
        p = t["partitions"][0]  # type: ignore[index]
        assert p["adding"] == [] and p["removing"] == [] and sorted(p["isr"]) == sorted(target)
        assert p["leader"] == target[0]
        n = len(acked)
        wait_for(lambda: len(acked) > n + 20, 30, "produces to succeed after the move")
    finally:
        stop.set()
        for th in threads:
            th.join(30)
    assert producer.flush(60) == 0
    assert not errors, errors[:5]

    # Every acknowledged message was read (the group went on through the leader change).
    seen = {v for _, v in received}
    missing = [v[:8] for v in acked if v not in seen]
    if missing:  # the reader stopped with the producer; finish reading with a fresh group
        cons = Consumer(
            {
                "bootstrap.servers": c.bootstrap,
                "group.id": "reassign-check",
                "auto.offset.reset": "earliest",
            }
        )
        cons.subscribe(["moving"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(v not in seen for v in acked):
            m = cons.poll(0.5)
            if m is not None and not m.error():
                seen.add(m.value())
        cons.close()
        missing = [v[:8] for v in acked if v not in seen]
    assert not missing, f"{len(missing)} acknowledged messages never read: {missing[:5]}"

    # The new replica holds exactly the leader's bytes; the old one deleted its copy.
    def same_logs() -> bool:
        logs = {b: segment_bytes(c, b, "moving", 0) for b in target}
        return len({x for x in logs.values()}) == 1 and all(logs.values())

    wait_for(same_logs, 30, "the replicas' segment files to match")
    wait_for(
        lambda: segment_bytes(c, leaving, "moving", 0) is None, 20, "the old replica's removal"
    )
    assert len(segment_bytes(c, 4, "moving", 0) or b"") > PRELOAD * PAYLOAD
    http(b1, "PUT", "/api/v1/cluster/configs", {"configs": {"replication.throttled.rate": None}})


def test_reassignment_errors_name_the_problem(four: LocalCluster) -> None:
    from kafka import TopicPartition
    from kafka.errors import (
        InvalidReplicationAssignmentError,
        NoReassignmentInProgressError,
        UnknownTopicOrPartitionError,
    )
    from kio.index import load_request_schema

    c = four
    b = c.brokers[2]
    body = create_topic(b, "fixed", partitions=2, rf=3)
    replicas = body["partitions"][0]["replicas"]
    ac = admin(c)
    try:
        tp0, tp1 = TopicPartition("fixed", 0), TopicPartition("fixed", 1)
        res = ac.alter_partition_reassignments(
            {tp0: [*replicas[:2], 99], tp1: None, TopicPartition("nope", 0): [1, 2, 3]}
        )
        assert res[tp0] is InvalidReplicationAssignmentError
        assert res[tp1] is NoReassignmentInProgressError
        assert res[TopicPartition("nope", 0)] is UnknownTopicOrPartitionError
        assert ac.list_partition_reassignments() == {}
    finally:
        ac.close()
    # The messages, as a Kafka client receives them.
    req_t = load_request_schema(45, 0)
    topic_cls = typing.get_args(typing.get_type_hints(req_t)["topics"])[0]
    part_cls = typing.get_args(typing.get_type_hints(topic_cls)["partitions"])[0]
    parts = (
        part_cls(partition_index=0, replicas=(replicas[0], replicas[1], 99)),
        part_cls(partition_index=1, replicas=None),
        part_cls(partition_index=7, replicas=(1, 2, 3)),
    )
    resp = kio_request(b, 45, 0, req_t(topics=(topic_cls(name="fixed", partitions=parts),)))
    (topic,) = resp.responses  # type: ignore[attr-defined]
    by_index = {p.partition_index: p for p in topic.partitions}
    assert by_index[0].error_code == 39 and "broker 99" in by_index[0].error_message
    assert by_index[1].error_code == 85 and "not being reassigned" in by_index[1].error_message
    assert by_index[7].error_code == 3 and "no partition 7" in by_index[7].error_message
    # The HTTP API and the CLI say the same, and nothing was changed.
    st, err = http(
        b,
        "POST",
        "/api/v1/reassignments",
        {"partitions": [{"topic": "fixed", "partition": 0, "replicas": [1, 2, 99]}]},
    )
    assert st == 400 and "broker 99 does not exist" in err["error"], err
    st, err = http(b, "POST", "/api/v1/reassignments", {"partitions": [{"topic": "fixed"}]})
    assert st == 400 and "'partition'" in err["error"], err
    st, err = http(
        b, "POST", "/api/v1/reassignments", {"partitions": [{"topic": "fixed", "partition": 0}]}
    )
    assert st == 400 and "null to cancel" in err["error"], err
    st, err = http(
        b, "PUT", "/api/v1/cluster/configs", {"configs": {"replication.throttled.rate": "fast"}}
    )
    assert st == 400 and "replication.throttled.rate" in err["error"], err
    out = strait(b, "reassign", "--topic", "fixed", "--partition", "0", "--replicas", "1,2,99")
    assert out.returncode == 1 and "broker 99 does not exist" in out.stderr, out
    out = strait(b, "reassign", "--topic", "fixed", "--partition", "0", "--cancel")
    assert out.returncode == 1 and "not being reassigned" in out.stderr, out
    assert topic_view(b, "fixed")["partitions"][0]["replicas"] == replicas


def test_cli_reassign_wait_and_cluster_status(four: LocalCluster) -> None:
    c = four
    b = c.brokers[4]
    body = create_topic(b, "viacli", partitions=1, rf=2)
    old = body["partitions"][0]["replicas"]
    new = [x for x in (1, 2, 3, 4) if x not in old][:2]
    rec = {"records": [{"value": "v" * 500} for _ in range(200)]}
    assert http(b, "POST", "/api/v1/topics/viacli/records", rec)[0] == 200
    out = strait(
        b,
        "reassign",
        "--topic",
        "viacli",
        "--partition",
        "0",
        "--replicas",
        ",".join(map(str, new)),
        "--throttle",
        "1000000",
        "--wait",
    )
    assert out.returncode == 0, out.stderr
    assert "reassignment complete" in out.stdout and "throttle removed" in out.stdout, out.stdout
    p = topic_view(b, "viacli")["partitions"][0]
    assert p["replicas"] == new and sorted(p["isr"]) == sorted(new)
    assert http(b, "GET", "/api/v1/cluster/configs")[1]["configs"] == {
        "replication.throttled.rate": "-1"
    }

    status = strait(b, "cluster", "status")
    assert status.returncode == 0, status.stderr
    text = status.stdout
    assert f"cluster {c.cluster_id}" in text
    for bid in (1, 2, 3, 4):
        assert any(line.split()[:1] == [str(bid)] and "alive" in line for line in text.splitlines())
    assert "quorum leader 10" in text and "epoch" in text and "high watermark" in text
    for cid in c.controllers:
        assert any(line.startswith(str(cid)) for line in text.splitlines()), text
    assert "under-replicated partitions 0" in text and "offline partitions 0" in text

    q = http(b, "GET", "/api/v1/quorum")[1]
    assert q["leader_id"] in c.controllers and q["active_controller"] is True
    assert {v["node_id"] for v in q["voters"]} == set(c.controllers)
    assert all(v["reachable"] and v["lag"] is not None for v in q["voters"])
    assert {o["node_id"] for o in q["observers"]} >= {1, 2, 3, 4}


def test_preferred_leader_election_through_kafka_and_http(four: LocalCluster) -> None:
    from kafka import KafkaAdminClient

    c = four
    b = c.brokers[1]
    body = create_topic(b, "elect", partitions=1, rf=3)
    replicas = body["partitions"][0]["replicas"]
    leader = body["partitions"][0]["leader"]
    assert leader == replicas[0]
    # Reordering the replicas makes another broker preferred; the leader stays.
    reordered = [replicas[1], replicas[0], replicas[2]]
    move = {"partitions": [{"topic": "elect", "partition": 0, "replicas": reordered}]}
    st, res = http(b, "POST", "/api/v1/reassignments", move)
    assert st == 202 and res["partitions"][0]["done"], res
    assert topic_view(b, "elect")["partitions"][0]["leader"] == leader
    ac = KafkaAdminClient(bootstrap_servers=c.bootstrap, request_timeout_ms=30_000)
    try:
        resp = ac.elect_leaders(0, {"elect": [0]})
        (r,) = resp.replica_election_results
        assert [(p.partition_id, p.error_code) for p in r.partition_result] == [(0, 0)]
        # The election is committed when ElectLeaders answers; broker b may be served its
        # metadata a moment later, as in Kafka, so its view is awaited, not assumed.
        p = wait_for(
            lambda: (q := topic_view(b, "elect")["partitions"][0])["leader"] == reordered[0] and q,
            10,
            "broker b to see the preferred leader",
        )
        assert p["leader_epoch"] >= 1
        # Already there: ELECTION_NOT_NEEDED (84), which the client does not raise.
        resp = ac.elect_leaders(0, {"elect": [0]})
        assert resp.replica_election_results[0].partition_result[0].error_code == 84
        resp = ac.elect_leaders(0, {"elect": [5]}, raise_errors=False)
        assert resp.replica_election_results[0].partition_result[0].error_code == 3
    finally:
        ac.close()
    st, res = http(b, "POST", "/api/v1/elect-preferred", {})
    assert st == 200 and res["elected"] == [], res
