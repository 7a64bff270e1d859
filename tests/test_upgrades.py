"""Upgrades across releases, as RocksDB's check_format_compatible.sh and CockroachDB's
mixed-version tests do it: the previous release (releases.toml) is built from git with
its own virtualenv (scripts/build-releases.sh, cached by commit id), writes data, and the
checked-out code opens it, rolled in node by node under load; then the cluster is rolled
back to the previous release before finalizing, which reads what this code wrote; then
upgraded again and finalized, after which the previous release is refused.

A checkout without the release's commit fails here (never skips): compatibility cannot be
checked without the old code.

What is written by the old release and checked at every stage: records at their offsets
(an idempotent acks=all producer runs through every roll: every acknowledged record read
back once, at the offset it was acknowledged at, replicas byte-identical), a compacted
topic's latest value per key, a committed and an aborted transaction (read_committed), a
group's committed offsets, a share group's saved start offset, a changed controller voter
set, topic configs, SCRAM users, ACLs and client quotas. Through
the rolls a KIP-848 group member consumes and commits (its commits never go back), and
Kafka 4.4's Java transactional producer (transactions v2) keeps a transaction open across
every node's restart: read_committed sees exactly the committed ones.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from cluster_support import ROOT, Cluster, Workload, cluster_factory, verify, wait_for
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from kio.schema.describe_share_group_offsets.v0 import request as dsgo
from straitmq.cli.local_cluster import Node, free_port
from straitmq.metadata.features import LATEST
from test_errors import Raw
from test_share_groups import _ack, _acquired, _fetch, _hb
from test_transactions_java import TxnClient

from bench.releases import metadata_level, previous_release, release_python, releases
from straitmq.admin_client import AdminError, request_sync

pytestmark = pytest.mark.timeout(900)

PREVIOUS = previous_release()  # what this code upgrades from
STRAITMQ = "straitmq.metadata.version"
OLD_LEVEL = metadata_level(PREVIOUS)
LATEST_LEVEL = LATEST[STRAITMQ]
OLDER = releases()[:-1]  # upgraded from directly too, without the load


@pytest.fixture(scope="module")
def old_python() -> str:
    return release_python(PREVIOUS)


@pytest.fixture
def cluster(tmp_path):
    yield from cluster_factory(tmp_path)


def release_of(node) -> str:
    return "old" if "releases" in node.args[0] else "new"


def http(cluster: Cluster) -> str:
    b = cluster.any_broker()
    return f"http://{b.host}:{b.http_port}"


class GroupMember:
    """A KIP-848 consumer (group.protocol=consumer) reading `topic` through every roll and
    committing as it goes, one commit at a time (asynchronous commits may be acknowledged
    out of order when librdkafka retries one across a coordinator move: Kafka takes each
    as it comes, so that would test the client); each partition's committed offsets, in
    the order the commits were acknowledged, must never go back: after a coordinator
    moves or the member rejoins, it resumes from what the cluster kept."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.commits: dict[int, list[int]] = {}
        self.consumed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "upgrade-848",
                "group.protocol": "consumer",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.consumer.subscribe([topic])
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _commit(self) -> None:
        try:
            partitions = self.consumer.commit(asynchronous=False)
        except KafkaException:
            return  # refused during a coordinator move or a rejoin: the next one counts
        for tp in partitions or ():
            if tp.error is None and tp.offset >= 0:
                self.commits.setdefault(tp.partition, []).append(tp.offset)

    def _run(self) -> None:
        since = 0
        while not self._stop.is_set():
            m = self.consumer.poll(0.2)
            if m is None or m.error():
                continue
            self.consumed += 1
            since += 1
            if since >= 50:
                since = 0
                self._commit()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)
        self.consumer.close()

    def check(self) -> None:
        assert self.consumed > 0 and self.commits, "the KIP-848 member never consumed"
        for p, offsets in self.commits.items():
            assert offsets == sorted(offsets), f"partition {p}: a commit went back {offsets}"


class JavaTransactions:
    """Kafka 4.4's Java transactional producer (transactions v2: the cluster finalizes
    transaction.version 2) with a transaction open across each roll: begun and written
    before a node restarts, committed (or every third one aborted) after."""

    def __init__(self, cluster: Cluster, logs: Path) -> None:
        self.java = TxnClient(cluster, "upgrade-java", logs)
        self.java.ok("new p upgrade-java 60000")
        self.committed: list[str] = []
        self.n = 0

    def begin(self) -> str:
        tag = f"t{self.n}"
        self.n += 1
        self.java.ok("p begin")
        for partition in range(3):
            self.java.ok(f"p send jtx {partition} {tag}p{partition} 5")
        self.java.ok("p flush")
        return tag

    def end(self, tag: str) -> None:
        if int(tag[1:]) % 3 == 2:
            self.java.ok("p abort")
        else:
            self.java.ok("p commit")
            self.committed += [f"{tag}p{p}-{i}" for p in range(3) for i in range(5)]

    def check(self, stage: str) -> None:
        got = sorted(self.java.read("jtx", "read_committed"))
        assert got == sorted(self.committed), (stage, len(got), len(self.committed))


def roll_with(
    cluster: Cluster, nodes: list, python: str, txns: JavaTransactions | None = None
) -> None:
    for node in nodes:
        tag = txns.begin() if txns else ""
        cluster.roll(node, python)
        if txns:
            txns.end(tag)


def roll_all(
    cluster: Cluster, python: str, txns: JavaTransactions | None = None, backwards: bool = False
) -> None:
    roll_with(cluster, cluster.roll_order(backwards), python, txns)


# -- the data the old release writes, and the checks -------------------------------------------


KEYS = 40


def write_data(cluster: Cluster) -> None:
    base = http(cluster)
    cluster.create_topic("compacted", 2, configs={"cleanup.policy": "compact"})
    cluster.create_topic("txn", 1)
    p = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True})
    for rnd in range(3):
        for k in range(KEYS):
            p.produce("compacted", key=b"k%d" % k, value=b"v%d-%d" % (k, rnd))
    assert p.flush(30) == 0
    t = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "upgrade-txn"})
    t.init_transactions(30)
    for commit in (True, False, True):
        t.begin_transaction()
        for i in range(5):
            t.produce("txn", value=b"%s-%d" % (b"c" if commit else b"a", i))
        (t.commit_transaction if commit else t.abort_transaction)(30)
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "upgrade-g"})
    c.commit(
        offsets=[TopicPartition("compacted", 0, 7), TopicPartition("txn", 0, 3)], asynchronous=False
    )
    c.close()
    request_sync(
        base,
        "PUT",
        "/api/v1/users/alice",
        {"mechanism": "SCRAM-SHA-512", "password": "alice-secret", "iterations": 8192},
    )
    acl = {
        "resource_type": "TOPIC",
        "resource_name": "orders",
        "pattern_type": "LITERAL",
        "principal": "User:alice",
        "host": "*",
        "operation": "WRITE",
        "permission": "ALLOW",
    }
    request_sync(base, "POST", "/api/v1/acls", {"create": [acl]})
    request_sync(
        base,
        "POST",
        "/api/v1/quotas",
        {"entries": [{"entity": {"user": "alice"}, "quotas": {"producer_byte_rate": 1048576}}]},
    )


SHARE_GROUP = "upgrade-share"


def write_share_state(cluster: Cluster) -> None:
    """A share group (KIP-932) that acquired offsets 0-4 and accepted 0-2: its saved share
    partition start offset is 3."""
    cluster.create_topic("shr", 1)
    tid = uuid.UUID(request_sync(http(cluster), "GET", "/api/v1/topics/shr")["topic_id"])
    member = str(uuid.uuid4())

    def joined() -> bool:  # the heartbeat goes to the group's coordinator, whichever it is
        for b in cluster.brokers.values():
            hb = Raw(SimpleNamespace(port=b.kafka_port))
            try:
                if hb.call(_hb(SHARE_GROUP, member, 0, ("shr",))).error_code == 0:
                    return True
            finally:
                hb.close()
        return False

    wait_for(joined, 30, "a share group heartbeat answered by its coordinator", 0.3)
    leader = cluster.brokers[cluster.leader_of("shr", 0)]  # ShareFetch goes to the leader
    r = Raw(SimpleNamespace(port=leader.kafka_port))
    try:
        # The share partition starts at the log end (share.auto.offset.reset latest): the
        # first fetch initializes it, then the records come.
        assert _acquired(r.call(_fetch(SHARE_GROUP, member, 0, tid, {0: []}, 100))) == {}
        p = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 10_000})
        for i in range(5):
            p.produce("shr", b"s%d" % i, partition=0)
        assert p.flush(30) == 0
        epoch, got = 1, {}
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = _acquired(r.call(_fetch(SHARE_GROUP, member, epoch, tid, {}, 1000)))
            epoch += 1
        assert got == {0: [(0, 4, 1)]}, got
        assert r.call(_ack(SHARE_GROUP, member, epoch, tid, {0: [(0, 2, [1])]})).error_code == 0
    finally:
        r.close()
    wait_for(lambda: share_start(cluster) == 3, 30, "the share start offset 3 saved")


def share_start(cluster: Cluster) -> int | None:
    """The share partition's saved start offset, as DescribeShareGroupOffsets (what
    `kafka-share-groups --describe` shows) reads it: members are not kept across restarts,
    the share-partition state is."""
    req = dsgo.DescribeShareGroupOffsetsRequest(
        groups=(
            dsgo.DescribeShareGroupOffsetsRequestGroup(
                group_id=SHARE_GROUP,
                # All saved topics: release 0.1.0 fails a request naming topics (fixed since).
                topics=None,
            ),
        )
    )
    for b in cluster.brokers.values():
        if not b.alive():
            continue
        r = Raw(SimpleNamespace(port=b.kafka_port))
        try:
            g = r.call(req).groups[0]
        finally:
            r.close()
        for t in g.topics if g.error_code == 0 else ():
            for p in t.partitions if t.topic_name == "shr" else ():
                if p.partition_index == 0:
                    return int(p.start_offset)
    return None


def change_voters(cluster: Cluster) -> None:
    """The voter set 1001-1003 becomes 1001, 1002, 1004: a controller added, one removed."""
    port = free_port()
    args = [*cluster._controller_cmd(1004), "--listen", f"127.0.0.1:{port}"]
    node = Node("controller", 1004, args, f"{cluster.data_dir}/controller-1004.log", port)
    cluster.run_as(node, cluster.controllers[1001].args[0])  # the cluster's release
    cluster.controllers[1004] = node
    node.start()
    wait_for(lambda: (node.get("/api/v1/quorum") or {}).get("leader_id"), 30, "1004 following")
    base = http(cluster)
    url = f"http://{node.host}:{node.http_port}"

    def add() -> bool:  # refused (NOT_CAUGHT_UP) until the new controller has the log
        request_sync(base, "POST", "/api/v1/quorum/voters", {"controller_url": url}, timeout_s=60)
        return True

    wait_for(add, 60, "1004 added as a voter", 0.5, ignore=(AdminError,))

    def remove() -> bool:  # refused while the four voters elect a leader; done only once
        try:
            request_sync(base, "DELETE", "/api/v1/quorum/voters/1003", timeout_s=60)
        except AdminError:
            return 1003 not in voters(cluster)
        return True

    wait_for(remove, 60, "1003 removed from the voters", 0.5, ignore=(AdminError,))
    cluster.controllers.pop(1003).stop()
    check_voters(cluster, "the voter change")


def voters(cluster: Cluster) -> set[int]:
    q = request_sync(http(cluster), "GET", "/api/v1/quorum")
    return {v["node_id"] for v in q["voters"]}


def check_voters(cluster: Cluster, stage: str) -> None:
    """The voter set is 1001, 1002, 1004, once the quorum has a leader (right after the
    removal or a restart, the quorum API may answer that it has none yet)."""
    wait_for(
        lambda: voters(cluster) == {1001, 1002, 1004},
        30,
        f"{stage}: the voters 1001, 1002, 1004",
        0.3,
        ignore=(AdminError,),
    )


def check_data(cluster: Cluster, stage: str) -> None:
    base = http(cluster)
    check_voters(cluster, stage)
    wait_for(lambda: share_start(cluster) == 3, 30, f"{stage}: the share start offset 3", 0.3)
    # The compacted topic: the latest value of every key, whatever the cleaner did.
    latest = {}
    for _, _, k, v in read_all(cluster, "compacted", "read_uncommitted"):
        latest[k] = v
    assert latest == {b"k%d" % k: b"v%d-2" % k for k in range(KEYS)}, stage
    # Transactions: the committed ones only, in order, for read_committed.
    values = [v for *_, v in read_all(cluster, "txn", "read_committed")]
    assert values == [b"c-%d" % i for i in range(5)] * 2, (stage, values)
    c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "upgrade-g"})
    try:
        got = c.committed([TopicPartition("compacted", 0), TopicPartition("txn", 0)], 30)
    finally:
        c.close()
    assert [tp.offset for tp in got] == [7, 3], (stage, got)
    topic = request_sync(base, "GET", "/api/v1/topics/compacted")
    assert topic["configs"]["cleanup.policy"] == "compact", (stage, topic)
    user = request_sync(base, "GET", "/api/v1/users/alice")
    assert "SCRAM-SHA-512" in str(user) and "8192" in str(user), (stage, user)
    acls = request_sync(base, "GET", "/api/v1/acls")
    assert any(
        a.get("principal") == "User:alice" and a.get("resource_name") == "orders"
        for a in acls["acls"]
    ), (stage, acls)
    quotas = request_sync(base, "GET", "/api/v1/quotas")
    assert "1048576" in str(quotas), (stage, quotas)


def read_all(cluster: Cluster, topic: str, isolation: str) -> list[tuple]:
    c = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"read-{topic}-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
        }
    )
    meta = c.list_topics(topic, 30).topics[topic].partitions
    c.assign([TopicPartition(topic, p, 0) for p in meta])
    out: list[tuple] = []
    eof: set[int] = set()
    deadline = time.monotonic() + 30
    try:
        while len(eof) < len(meta) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == -191:  # _PARTITION_EOF
                    eof.add(m.partition())
                continue
            out.append((m.partition(), m.offset(), m.key(), m.value()))
    finally:
        c.close()
    assert len(eof) == len(meta), f"{topic}: did not reach the end of every partition"
    return sorted(out)


def features(cluster: Cluster) -> dict[str, int]:
    f = request_sync(http(cluster), "GET", "/api/v1/features")
    return {x["name"]: x["finalized"] for x in f["features"]}


def finalize(cluster: Cluster) -> dict:
    return request_sync(
        http(cluster), "POST", "/api/v1/features", {"updates": {STRAITMQ: LATEST_LEVEL}}
    )


def finalize_and_refuse(cluster: Cluster, release: str, old_python: str, new_python: str) -> None:
    """Finalize this code's level; then a node of `release` (a lower level) cannot come
    back: it stops saying why, and this code takes its place again."""
    finalize(cluster)
    assert features(cluster)[STRAITMQ] == LATEST_LEVEL
    check_data(cluster, "finalized")
    victim = cluster.brokers[3]
    victim.stop()
    cluster.run_as(victim, old_python)
    victim.start()

    def refused() -> bool:
        text = cluster.tail(victim, 20_000)
        return (
            "unknown metadata record type 'feature_level'" in text  # 0.1.0
            or "cannot join: the cluster has finalized" in text
            or f"finalized {STRAITMQ}={LATEST_LEVEL}, which this StraitMQ does not support"
            in text  # 0.2.0 on.
        )

    wait_for(refused, 60, f"release {release} refused on a finalized cluster", 0.5)
    assert victim.get("/readyz", 1.0) is None
    cluster.roll(victim, new_python)


def write_everything(cluster: Cluster, release: str) -> None:
    write_data(cluster)
    write_share_state(cluster)
    change_voters(cluster)
    check_data(cluster, f"written by {release}")


# -- the test ----------------------------------------------------------------------------------


def test_rolling_upgrade_rollback_and_finalize_under_load(cluster, old_python, tmp_path) -> None:
    new_python = str(ROOT / ".venv" / "bin" / "python")
    c: Cluster = cluster(brokers=3, python=old_python)
    assert all(release_of(n) == "old" for n in c.nodes())

    c.create_topic("orders", 3)
    c.create_topic("jtx", 3)
    write_everything(c, PREVIOUS)
    w = Workload(c.bootstrap, "orders", rate=200).start()
    member = GroupMember(c.bootstrap, "orders")
    txns = JavaTransactions(c, tmp_path / "java")
    try:
        w.wait_acked_growth(100, 30)

        # Upgrade, controllers first. Midway (new controllers, old brokers) nothing can be
        # finalized: the refusal names a broker still on the previous release.
        roll_with(c, c.roll_order()[:3], new_python, txns)
        # The old brokers do not serve UpdateFeatures: ask the active controller itself.
        ac = c.wait_active_controller()
        reply = request_sync(
            f"http://{ac.host}:{ac.http_port}",
            "POST",
            "/controller/update_features",
            {"updates": {STRAITMQ: [LATEST_LEVEL, 1]}},
        )
        if OLD_LEVEL < LATEST_LEVEL:
            assert f"broker 1 does not support {STRAITMQ}={LATEST_LEVEL}" in str(reply), reply
        roll_with(c, list(c.brokers.values()), new_python, txns)
        w.wait_acked_growth(50, 30)
        assert features(c)[STRAITMQ] == OLD_LEVEL, "nothing is finalized by a roll"
        check_data(c, "upgraded, not finalized")
        txns.check("upgraded, not finalized")

        # Roll back to the previous release: it reads everything this code wrote.
        roll_all(c, old_python, txns, backwards=True)
        w.wait_acked_growth(50, 30)
        check_data(c, f"rolled back to {PREVIOUS}")
        txns.check(f"rolled back to {PREVIOUS}")

        # Upgrade again and finalize: after that the previous release cannot come back
        # (when this code has a level it lacks; else there is nothing to finalize).
        roll_all(c, new_python, txns)
        w.wait_acked_growth(50, 30)
        if OLD_LEVEL < LATEST_LEVEL:
            finalize_and_refuse(c, PREVIOUS, old_python, new_python)
        else:
            assert features(c)[STRAITMQ] == LATEST_LEVEL
        w.wait_acked_growth(50, 30)
        txns.end(txns.begin())
        txns.check("finalized")
    finally:
        w.stop()
        member.stop()
        txns.java.kill9()
    member.check()
    figures = verify(c, w, "upgrade")
    assert figures.ok() and figures.failed == 0, figures.line()


@pytest.mark.parametrize("release", OLDER or [None])
def test_an_older_release_s_data_is_read_upgraded_and_finalized(cluster, release) -> None:
    """Data of every release before the previous one is read by this code, and what
    this code writes before finalizing by that release: written by the release, the
    nodes replaced one by one, rolled back and in again, then finalized and the release
    refused (the load is the previous release's test above)."""
    if release is None:
        assert OLDER == [], "no release older than the previous one yet"
        return
    old_python = release_python(release)
    new_python = str(ROOT / ".venv" / "bin" / "python")
    c: Cluster = cluster(brokers=3, python=old_python)
    write_everything(c, release)
    roll_all(c, new_python)
    assert all(release_of(n) == "new" for n in c.nodes())
    assert features(c)[STRAITMQ] == metadata_level(release), "nothing is finalized by a roll"
    check_data(c, f"{release} upgraded, not finalized")
    roll_all(c, old_python, backwards=True)
    check_data(c, f"rolled back to {release}")
    roll_all(c, new_python)
    finalize_and_refuse(c, release, old_python, new_python)
