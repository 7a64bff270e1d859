"""Named listeners on a real 3+3 cluster: clients on a SASL_SSL listener, replication on a
PLAINTEXT one. Every broker registers both endpoints through the controller quorum;
Metadata tells each client the endpoints of its own listener; SCRAM users created on one
broker log in on another (the credentials travel in the metadata log); acks=all writes
reach every replica over the replication listener."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cluster_support import BROKER_ARGS, cluster_factory
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from tls_support import make_certs
from waiting import wait_for

from straitmq.admin_client import request_sync

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    yield from cluster_factory(tmp_path)


def test_sasl_ssl_clients_and_plaintext_replication(cluster: Any, tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    c = cluster(
        broker_args=[
            *BROKER_ARGS,
            "--listeners",
            "REPLICATION://127.0.0.1:0,CLIENT://127.0.0.1:0",
            "--listener-security-protocol-map",
            "REPLICATION:PLAINTEXT,CLIENT:SASL_SSL",
            "--inter-broker-listener-name",
            "REPLICATION",
            "--override",
            f"ssl.keystore.location={certs.path('server.pem')}",
            "--override",
            "listener.name.client.sasl.enabled.mechanisms=SCRAM-SHA-512",
        ]
    )
    first = next(iter(c.brokers.values()))
    described = request_sync(f"http://{first.host}:{first.http_port}", "GET", "/api/v1/cluster")
    endpoints = {b["id"]: b["endpoints"] for b in described["brokers"]}
    assert sorted(endpoints) == [1, 2, 3]
    client = {i: ("127.0.0.1", e["CLIENT"][1]) for i, e in endpoints.items()}
    replication = {i: ("127.0.0.1", e["REPLICATION"][1]) for i, e in endpoints.items()}
    assert set(client.values()).isdisjoint(replication.values())

    # A SCRAM user made through broker 1's replication listener ...
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{replication[1][1]}"})
    upsert = UserScramCredentialUpsertion(
        "app", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"app-pw"
    )
    admin.alter_user_scram_credentials([upsert])["app"].result(timeout=30)
    # ... logs in at broker 3's client listener, which learns it from the metadata log.
    conf = {
        "bootstrap.servers": f"127.0.0.1:{client[3][1]}",
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": certs.path("ca.pem"),
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "app",
        "sasl.password": "app-pw",
    }

    def seen(conf: dict) -> dict[int, tuple[str, int]] | None:
        try:
            md = AdminClient(conf).list_topics(timeout=5)
        except KafkaException:
            return None
        return {b.id: (b.host, b.port) for b in md.brokers.values()}

    assert wait_for(lambda: seen(conf), 30, "broker 3 knows the SCRAM user") == client
    assert seen({"bootstrap.servers": f"127.0.0.1:{replication[2][1]}"}) == replication

    sasl_admin = AdminClient(conf)
    sasl_admin.create_topics([NewTopic("secure", 3, 3)])["secure"].result(timeout=30)
    p = Producer({**conf, "acks": "all", "enable.idempotence": True})
    for i in range(300):
        p.produce("secure", value=b"m%d" % i, partition=i % 3)
    assert p.flush(60) == 0

    def full_isr() -> bool:
        md = sasl_admin.list_topics("secure", timeout=10)
        return all(len(pm.isrs) == 3 for pm in md.topics["secure"].partitions.values())

    wait_for(full_isr, 30, "every replica caught up over the replication listener")
    consumer = Consumer({**conf, "group.id": "secure-g", "auto.offset.reset": "earliest"})
    consumer.subscribe(["secure"])
    got: set[bytes] = set()

    def read() -> bool:
        m = consumer.poll(0.5)
        if m is not None:
            assert m.error() is None, m.error()
            got.add(m.value())
        return len(got) == 300

    wait_for(read, 60, "every record read back over SASL_SSL", every=0)
    consumer.close()
    assert got == {b"m%d" % i for i in range(300)}
