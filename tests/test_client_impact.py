"""The client-impact report: which clients a broker has seen, with which software and API
versions, and which of them a change of feature levels would affect.

Real clients against a real broker process (librdkafka through confluent-kafka: a
producer, a classic group consumer, a KIP-848 consumer and a transactional producer;
kafka-python; aiokafka) checked in GET /api/v1/clients, /metrics, `strait clients` and
`strait upgrade plan`; the registry's limit and expiry and the impact rules as unit tests
with a fake clock and made-up clients.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import BrokerProcess
from straitmq.broker.client_registry import ClientRegistry
from straitmq.metadata import client_impact as impact
from straitmq.metadata.features import LATEST
from waiting import wait_for

from straitmq.admin_client import request_sync

WAIT = 30.0
TOP = LATEST["straitmq.metadata.version"]  # this code's level

# -- the registry (sans-IO, a fake clock) ----------------------------------------------


def _client(
    reg: ClientRegistry,
    now: float,
    client_id: str,
    uses: list[tuple[int, int]],
    *,
    software: tuple[str, str] | None = ("librdkafka", "2.0.2"),
    principal: str = "User:ANONYMOUS",
    host: str = "/10.0.0.1",
):
    conn = reg.connection(host, "PLAINTEXT")
    reg.used(conn, 18, 3 if software else 0, client_id, principal, now, software=software)
    for key, version in uses:
        reg.used(conn, key, version, client_id, principal, now, transactional=key == 0)
    return conn


def test_a_client_is_one_entry_with_its_connections_versions_and_last_seen() -> None:
    reg = ClientRegistry(max_entries=10, expiry_s=900)
    a = _client(reg, 100.0, "app", [(0, 9), (24, 3), (26, 3)])
    b = _client(reg, 101.0, "app", [(0, 10), (3, 12)])
    [entry] = reg.snapshot(105.0)
    assert entry["software"] == "librdkafka 2.0.2"
    assert (entry["client_id"], entry["host"], entry["principal"]) == (
        "app",
        "10.0.0.1",
        "User:ANONYMOUS",
    )
    assert (entry["connections"], entry["connections_seen"]) == (2, 2)
    assert {x["name"]: x["versions"] for x in entry["apis"]} == {
        "Produce": [9, 10],
        "Metadata": [12],
        "ApiVersions": [3],
        "AddPartitionsToTxn": [3],
        "EndTxn": [3],
    }
    assert entry["transaction_versions"] == [1]
    assert entry["last_seen_ms"] == 105_000  # connected: seen now
    reg.closed(a, 110.0)
    reg.closed(b, 120.0)
    [entry] = reg.snapshot(130.0)
    assert (entry["connections"], entry["last_seen_ms"]) == (0, 120_000)


def test_clients_expire_after_their_last_connection_not_while_connected() -> None:
    reg = ClientRegistry(max_entries=10, expiry_s=900)
    gone = _client(reg, 0.0, "gone", [(0, 9)])
    _client(reg, 0.0, "connected", [(1, 12)])
    reg.closed(gone, 100.0)
    assert {c["client_id"] for c in reg.snapshot(999.0)} == {"gone", "connected"}
    assert {c["client_id"] for c in reg.snapshot(1000.5)} == {"connected"}
    assert reg.expired == 1
    assert {c["client_id"] for c in reg.snapshot(100_000.0)} == {"connected"}


def test_the_limit_drops_the_least_recently_seen_client_without_a_connection() -> None:
    reg = ClientRegistry(max_entries=3, expiry_s=900)
    old = _client(reg, 1.0, "old", [])
    _client(reg, 2.0, "busy", [])  # stays connected
    newer = _client(reg, 3.0, "newer", [])
    reg.closed(old, 4.0)
    reg.closed(newer, 5.0)
    _client(reg, 6.0, "fourth", [])
    assert [c["client_id"] for c in reg.snapshot(7.0)] == ["fourth", "newer", "busy"]
    assert reg.dropped == 1
    # All connected: the least recently seen goes anyway, and is counted.
    _client(reg, 8.0, "fifth", [])
    _client(reg, 9.0, "sixth", [])
    assert len(reg) == 3 and reg.dropped == 3
    assert reg.by_software(10.0) == {("librdkafka", "2.0.2"): 3}


def test_a_login_moves_the_connection_to_its_principal_with_what_it_used() -> None:
    reg = ClientRegistry()
    conn = reg.connection("/10.0.0.2", "SASL")
    reg.used(conn, 18, 3, "app", "User:ANONYMOUS", 1.0, software=("kafka-python", "3.0.12"))
    reg.used(conn, 17, 1, "app", "User:ANONYMOUS", 1.0)
    reg.used(conn, 36, 2, "app", "User:ANONYMOUS", 1.0)
    reg.used(conn, 3, 12, "app", "User:alice", 2.0)  # the first request after the login
    [entry] = reg.snapshot(3.0)  # the anonymous one, only ever this connection, is gone
    assert entry["principal"] == "User:alice" and entry["connections"] == 1
    assert [x["api_key"] for x in entry["apis"]] == [3, 17, 18, 36]
    assert entry["software"] == "kafka-python 3.0.12"
    reg.closed(conn, 4.0)
    assert reg.snapshot(5.0)[0]["connections"] == 0


def test_software_is_unknown_below_api_versions_v3() -> None:
    reg = ClientRegistry()
    _client(reg, 1.0, "aio", [(0, 7)], software=None)
    reg.used(reg.connection("/h", "L"), 3, 1, "bare", "User:ANONYMOUS", 1.0)
    found = {c["client_id"]: c["software"] for c in reg.snapshot(2.0)}
    assert found == {"aio": "unknown (ApiVersions < v3)", "bare": "unknown (no ApiVersions)"}
    assert reg.by_software(2.0) == {("unknown", ""): 2}


# -- the rules ---------------------------------------------------------------------------


def test_a_brokers_replica_fetchers_are_brokers_not_consumers() -> None:
    from straitmq.broker.replication.follower_id import fetcher_client_id

    assert impact.roles({1: [12]}, fetcher_client_id(2, "abc")) == ["broker"]
    assert impact.roles({1: [12]}, "app") == ["consumer"]


def test_group_protocol_and_transaction_version_from_the_api_versions() -> None:
    assert impact.group_protocols({11: [5], 14: [3]}) == ["classic"]
    assert impact.group_protocols({68: [1]}) == ["consumer"]
    assert impact.group_protocols({76: [1], 78: [1]}) == ["share"]
    assert impact.group_protocols({88: [0]}) == ["streams"]
    assert impact.transaction_versions({24: [3], 26: [3]}) == [1]
    assert impact.transaction_versions({26: [5]}, [12]) == [2]
    assert impact.transaction_versions({0: [12]}, [12]) == [2]  # a partition leader's view
    assert impact.transaction_versions({0: [12]}) == []  # idempotent only
    assert impact.transaction_versions({24: [4]}) == []  # a broker's verification
    assert impact.transaction_versions({26: [4, 5]}) == [1, 2]  # fell back, or moved up


def _seen(
    name: str | None,
    version: str | None,
    client_id: str,
    apis: dict[int, list[int]],
    txn_produce: tuple[int, ...] = (),
    connections: int = 1,
) -> dict:
    return {
        "software_name": name,
        "software_version": version,
        "api_versions_version": 3 if name else 0,
        "software": impact.software_label(name, version, 3 if name else 0),
        "client_id": client_id,
        "principal": "User:ANONYMOUS",
        "host": "10.0.0.9",
        "connections": connections,
        "apis": [{"api_key": k, "versions": v} for k, v in apis.items()],
        "transactional_produce": list(txn_produce),
    }


def _joined(*clients: dict) -> list[dict]:
    return impact.merge({1: list(clients)})


JAVA_TV2 = _seen("apache-kafka-java", "4.1.0", "java-txn", {0: [12], 26: [5]}, (12,))
RDKAFKA_TV1 = _seen("librdkafka", "2.0.2", "rd-txn", {0: [9], 24: [3], 26: [3]}, (9,), 2)
CLASSIC = _seen("librdkafka", "2.0.2", "rd-cons", {1: [12], 11: [5], 14: [3]})
KIP848 = _seen("apache-kafka-java", "4.1.0", "j-848", {1: [17], 68: [1]})
SHARE = [_seen("apache-kafka-java", "4.1.0", f"share-{i}", {76: [1], 78: [1]}) for i in range(3)]


def test_downgrading_transactions_names_the_v2_producers_and_not_the_v1_ones() -> None:
    plan = impact.plan(_joined(JAVA_TV2, RDKAFKA_TV1, CLASSIC), LATEST, {"transaction.version": 1})
    assert plan.changes == {"transaction.version": (2, 1)}
    sentences = [f.sentence for f in plan.findings]
    assert sentences[0].startswith(
        "apache-kafka-java 4.1.0 producers (1 connection) use transactions v2: they fall "
        "back to v1 if transaction.version is downgraded to 1"
    )
    assert sentences[1] == (
        "librdkafka 2.0.2 producers (2 connections) use transactions v1: unaffected by "
        "transaction.version=1"
    )
    [affected] = plan.affected
    assert [c["client_id"] for c in affected.clients] == ["java-txn"]


def test_upgrading_transactions_moves_kafka_4_java_producers_only() -> None:
    java_v1 = _seen("apache-kafka-java", "4.0.0", "j4", {0: [11], 24: [3], 26: [4]}, (11,))
    java3 = _seen("apache-kafka-java", "3.9.1", "j3", {0: [11], 24: [3], 26: [3]}, (11,))
    plan = impact.plan(
        _joined(java_v1, java3, RDKAFKA_TV1),
        {**LATEST, "transaction.version": 1},
        {"transaction.version": 2},
    )
    [moved] = plan.affected
    assert "switch to v2 (EndTxn v5, Produce v12)" in moved.sentence
    assert [c["client_id"] for c in moved.clients] == ["j4"]
    unaffected = [f.sentence for f in plan.findings if not f.affected]
    assert any(s.startswith("apache-kafka-java 3.9.1 producers") for s in unaffected)
    assert any(
        "librdkafka 2.0.2 producers (2 connections) use transactions v1" in s for s in unaffected
    )


def test_group_version_affects_kip_848_consumers_only() -> None:
    plan = impact.plan(_joined(CLASSIC, KIP848), LATEST, {"group.version": 0})
    [affected] = plan.affected
    assert affected.sentence.startswith(
        "apache-kafka-java 4.1.0 consumers (1 connection) use the consumer group protocol "
        "(KIP-848, ConsumerGroupHeartbeat v1): it needs group.version>=1"
    )
    assert any(
        f.sentence.startswith(
            "clients using the classic group protocol are unaffected by group.version"
        )
        for f in plan.findings
    )
    none = impact.plan(_joined(CLASSIC), LATEST, {"group.version": 0})
    assert not none.affected


def test_share_version_counts_the_share_clients() -> None:
    plan = impact.plan(_joined(*SHARE, CLASSIC), LATEST, {"share.version": 0})
    [affected] = plan.affected
    assert affected.sentence.startswith(
        "3 clients still on ShareFetch v1, ShareGroupHeartbeat v1 (apache-kafka-java 4.1.0 "
        "share consumers: 3 clients, 3 connections)"
    )
    plan = impact.plan(_joined(CLASSIC), LATEST, {"share.version": 0})
    assert [f.sentence for f in plan.findings] == [
        "no share clients seen (ShareFetch, ShareGroupHeartbeat, ShareAcknowledge): "
        "share.version=0 affects none"
    ]


def test_refusals_and_features_clients_do_not_see() -> None:
    plan = impact.plan(
        [],
        {**LATEST, "metadata.version": 26},
        {
            "streams.version": 1,
            "straitmq.metadata.version": 1,
            "nope": 1,
            "metadata.version": 27,
            "share.version": 1,
        },
    )
    assert plan.refusals == [
        "streams.version=1 is outside the supported range 0..0: the change would be refused",
        f"straitmq.metadata.version cannot go from {TOP} down to 1: what was written at {TOP} "
        "cannot be read at a lower level",
        "unknown feature 'nope'; known: eligible.leader.replicas.version, group.version, "
        "kraft.version, metadata.version, share.version, straitmq.metadata.version, "
        "streams.version, transaction.version",
    ]
    assert [f.sentence for f in plan.findings] == [
        "metadata.version 26 -> 27 changes no API or version a client uses: no client is "
        "affected (0 clients seen)",
        "share.version is already 1: nothing changes",
    ]


def test_merge_joins_one_client_seen_by_several_brokers() -> None:
    on1 = _seen("apache-kafka-java", "4.1.0", "java-txn", {26: [5]})
    on2 = _seen("apache-kafka-java", "4.1.0", "java-txn", {0: [12]}, (12,), connections=2)
    [c] = impact.merge({2: [on2], 1: [on1]})
    assert c["brokers"] == [1, 2] and c["connections"] == 3
    assert c["transaction_versions"] == [2] and c["roles"] == ["producer"]
    assert [(a["name"], a["versions"]) for a in c["apis"]] == [("Produce", [12]), ("EndTxn", [5])]


# -- real clients, a real broker ----------------------------------------------------------


class Seen:
    def __init__(self, broker: BrokerProcess, suffix: str) -> None:
        self.broker = broker
        self.suffix = suffix

    def id(self, name: str) -> str:
        return f"{name}-{self.suffix}"

    def clients(self) -> dict[str, dict]:
        body = request_sync(self.broker.http, "GET", "/api/v1/clients")
        return {c["client_id"]: c for c in body["clients"]}


def _consume_one(conf: dict, topic: str) -> object:
    from confluent_kafka import Consumer

    c = Consumer({**conf, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            return c
    c.close()
    raise AssertionError(f"{conf['client.id']} read nothing in {WAIT}s")


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seen]:
    import aiokafka
    import kafka
    from confluent_kafka import Producer

    broker = BrokerProcess(
        tmp_path_factory.mktemp("client-impact") / "data",
        extra_args=["--client-registry-max-entries", "100"],
    ).start()
    s = Seen(broker, uuid.uuid4().hex[:6])
    topic = "impact"
    broker.create_topic(topic, 2)
    open_clients: list = []
    try:
        p = Producer({"bootstrap.servers": broker.bootstrap, "client.id": s.id("ck-producer")})
        p.produce(topic, b"plain")
        assert p.flush(WAIT) == 0
        open_clients.append(p)
        txn = Producer(
            {
                "bootstrap.servers": broker.bootstrap,
                "client.id": s.id("ck-txn"),
                "transactional.id": s.id("tid"),
            }
        )
        txn.init_transactions(WAIT)
        txn.begin_transaction()
        txn.produce(topic, b"in a transaction")
        txn.commit_transaction(WAIT)
        open_clients.append(txn)
        common = {"bootstrap.servers": broker.bootstrap}
        conf = {**common, "group.id": s.id("classic"), "client.id": s.id("ck-consumer")}
        open_clients.append(_consume_one(conf, topic))
        conf = {
            **common,
            "group.id": s.id("kip848"),
            "client.id": s.id("ck-848"),
            "group.protocol": "consumer",
        }
        open_clients.append(_consume_one(conf, topic))
        kp = kafka.KafkaProducer(bootstrap_servers=broker.bootstrap, client_id=s.id("kp-producer"))
        kp.send(topic, b"kafka-python").get(WAIT)
        kp.close()

        async def aio() -> None:
            ap = aiokafka.AIOKafkaProducer(
                bootstrap_servers=broker.bootstrap, client_id=s.id("aio-producer")
            )
            await ap.start()
            try:
                await ap.send_and_wait(topic, b"aiokafka")
            finally:
                await ap.stop()

        asyncio.run(aio())
        yield s
    finally:
        for c in open_clients:
            if hasattr(c, "close"):
                c.close()
        broker.stop()


def _apis(c: dict) -> dict[str, list[int]]:
    return {a["name"]: a["versions"] for a in c["apis"]}


def test_librdkafka_clients_are_listed_with_their_software_and_protocols(seen: Seen) -> None:
    import confluent_kafka

    software = f"{confluent_kafka.__version__}-rdkafka-{confluent_kafka.libversion()[0]}"
    clients = seen.clients()
    for name in ("ck-producer", "ck-txn", "ck-consumer", "ck-848"):
        c = clients[seen.id(name)]
        # confluent-kafka-python names itself, with librdkafka's version in its own.
        assert (c["software_name"], c["software_version"]) == ("confluent-kafka-python", software)
        assert c["api_versions_version"] == 3
        assert c["connections"] >= 1 and c["host"] == "127.0.0.1"
        assert c["principal"] == "User:ANONYMOUS" and c["listener"] == "PLAINTEXT"
    producer = clients[seen.id("ck-producer")]
    assert producer["roles"] == ["producer"] and "Produce" in _apis(producer)
    assert producer["group_protocols"] == [] and producer["transaction_versions"] == []
    assert producer["transactional_produce"] == []
    classic = clients[seen.id("ck-consumer")]
    assert classic["group_protocols"] == ["classic"] and classic["roles"] == ["consumer"]
    assert {"JoinGroup", "SyncGroup", "Heartbeat", "Fetch"} <= set(_apis(classic))
    kip848 = clients[seen.id("ck-848")]
    assert kip848["group_protocols"] == ["consumer"] and "JoinGroup" not in _apis(kip848)
    assert _apis(kip848)["ConsumerGroupHeartbeat"] == [1]
    # librdkafka's transactions are v1: AddPartitionsToTxn from the client, EndTxn < v5.
    txn = clients[seen.id("ck-txn")]
    assert txn["transaction_versions"] == [1]
    assert max(_apis(txn)["AddPartitionsToTxn"]) < 4 and max(_apis(txn)["EndTxn"]) < 5
    assert txn["transactional_produce"] == _apis(txn)["Produce"]


def test_python_clients_say_what_their_api_versions_say(seen: Seen) -> None:
    import kafka

    clients = seen.clients()
    kp = clients[seen.id("kp-producer")]  # kafka-python sends ApiVersions v3+
    assert (kp["software_name"], kp["software_version"]) == ("kafka-python", kafka.__version__)
    assert kp["api_versions_version"] >= 3 and kp["connections"] == 0  # closed, still listed
    aio = clients[seen.id("aio-producer")]  # aiokafka asks ApiVersions v0
    assert aio["software"] == "unknown (ApiVersions < v3)" and aio["software_name"] is None
    assert aio["api_versions_version"] < 3 and "Produce" in _apis(aio)


def test_metrics_count_clients_by_software(seen: Seen) -> None:
    import kafka

    def line() -> str | None:
        with urllib.request.urlopen(f"{seen.broker.http}/metrics", timeout=10) as r:
            text = r.read().decode()
        return next(
            (
                x
                for x in text.splitlines()
                if x.startswith("straitmq_broker_clients{")
                and 'straitmq_client_software_name="kafka-python"' in x
                and f'straitmq_client_software_version="{kafka.__version__}"' in x
            ),
            None,
        )

    found = wait_for(line, WAIT, "the clients gauge")
    assert float(found.rsplit(" ", 1)[1]) >= 1


def strait(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "straitmq.cli", "--http", broker.http, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parent.parent,
    )


def test_strait_clients_lists_them_from_every_broker(seen: Seen) -> None:
    r = strait(seen.broker, "clients", "--apis")
    assert r.returncode == 0, r.stderr
    rows = {
        next(t for t in line.split() if seen.suffix in t): line
        for line in r.stdout.splitlines()
        if seen.suffix in line
    }
    assert "classic" in rows[seen.id("ck-consumer")]
    assert " v1 " in rows[seen.id("ck-txn")]
    assert rows[seen.id("aio-producer")].startswith("unknown (ApiVersions < v3)")
    assert "ConsumerGroupHeartbeat v1" in r.stdout


def test_upgrade_plan_names_the_clients_a_change_affects(seen: Seen) -> None:
    r = strait(seen.broker, "upgrade", "plan", "--to", "transaction.version=1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("transaction.version: 2 -> 1 (downgrade)\n")
    assert "producers (1 client, " not in r.stdout  # one client: connections only
    assert "use transactions v1: unaffected by transaction.version=1" in r.stdout
    assert f"client.id={seen.id('ck-txn')} " in r.stdout
    assert r.stdout.rstrip().splitlines()[-1].startswith("no client affected")

    r = strait(seen.broker, "upgrade", "plan", "--to", "share.version=0")
    assert r.returncode == 0, r.stderr
    assert "no share clients seen" in r.stdout and "share.version=0 affects none" in r.stdout

    r = strait(seen.broker, "upgrade", "plan", "--to", "group.version=0,share.version=0")
    assert r.returncode == 0, r.stderr
    assert "use the consumer group protocol (KIP-848, ConsumerGroupHeartbeat v1)" in r.stdout
    assert f"client.id={seen.id('ck-848')} " in r.stdout
    assert "clients using the classic group protocol are unaffected by group.version" in r.stdout
    assert "1 of " in r.stdout.rstrip().splitlines()[-1]

    r = strait(seen.broker, "upgrade", "plan", "--to", "streams.version=1")
    assert r.returncode == 1
    assert "streams.version=1 is outside the supported range 0..0" in r.stdout
    r = strait(seen.broker, "upgrade", "plan", "--to-release", "0.1.0")
    assert r.returncode == 1  # this cluster finalized this code's straitmq.metadata.version
    assert f"straitmq.metadata.version cannot go from {TOP} down to 1" in r.stdout
    # A release below this code's level, then: the levels it can run at, named.
    r = strait(seen.broker, "upgrade", "plan", "--to-release", "0.2.0")
    assert r.returncode == 1
    assert f"straitmq.metadata.version cannot go from {TOP} down to 2" in r.stdout
    r = strait(seen.broker, "upgrade", "plan", "--to-release", "9.9.9")
    assert r.returncode != 0 and "known releases: 0.1.0, 0.2.0" in r.stderr
