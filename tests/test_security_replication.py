"""Replication between brokers over a secured inter-broker listener, on a real 3+3 cluster.

- SASL_SSL with SCRAM-SHA-512: the brokers' own user is written when the cluster is
  created (the controllers' `--add-scram`, Kafka's `kafka-storage format --add-scram`);
  every broker logs in to the others' REPLICATION listener with it, checks their
  certificate (CA and host name) and logs in again before its session runs out (KIP-368)
  on the same connection. acks=all writes survive a leader kill -9 and every replica is
  byte-identical up to the high watermark. A broker restarted with a wrong password is
  refused (one clear log line), stays out of the ISR while the others keep acknowledging,
  and joins again once its password is right.
- SSL with mTLS: client certificates required on the replication listener; the follower
  fetches come in as the brokers' certificate subject.

Where replication really goes is read from the leaders' own counters (follower fetches
by listener and principal, SASL logins, accepted connections): none over CLIENT.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cluster_support import BROKER_ARGS, CONTROLLER_ARGS, Cluster, Workload, cluster_factory, verify
from tls_support import make_certs
from waiting import wait_for

pytestmark = pytest.mark.timeout(420)

JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    'username="broker" password="{}";'
)
JAAS_KEY = "listener.name.replication.scram-sha-512.sasl.jaas.config"
TRUST_KEY = "listener.name.replication.ssl.truststore.location"
REFUSED_LINE = "replica fetcher cannot log in to the leader"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    yield from cluster_factory(tmp_path)


def _listeners(protocol: str, replication_principal: str) -> list[str]:
    """Named listeners, with ACLs on: follower fetches need CLUSTER_ACTION, which only
    super users have here (the brokers' principal, and the test's PLAINTEXT clients)."""
    return [
        *BROKER_ARGS,
        "--listeners",
        "REPLICATION://127.0.0.1:0,CLIENT://127.0.0.1:0",
        "--listener-security-protocol-map",
        f"REPLICATION:{protocol},CLIENT:PLAINTEXT",
        "--inter-broker-listener-name",
        "REPLICATION",
        "--override",
        "authorizer.class.name=" + AUTHORIZER,
        "--override",
        f"super.users={replication_principal};User:ANONYMOUS",
    ]


def _use_client_listener(c: Cluster) -> dict[int, dict]:
    """Point the cluster's clients at the CLIENT listeners; the brokers' endpoints."""
    first = next(iter(c.brokers.values()))
    endpoints = wait_for(
        lambda: (
            {
                b["id"]: b["endpoints"]
                for b in (first.get("/api/v1/cluster") or {}).get("brokers", [])
                if b.get("endpoints")
            }
            or None
        ),
        20,
        "registered endpoints",
    )
    assert sorted(endpoints) == sorted(c.brokers)  # type: ignore[arg-type]
    c.client_bootstrap = ",".join(f"127.0.0.1:{e['CLIENT'][1]}" for e in endpoints.values())  # type: ignore[union-attr]
    return endpoints  # type: ignore[return-value]


def _metrics(c: Cluster) -> dict[int, dict]:
    out = {}
    for bid, n in c.brokers.items():
        if n.alive():
            body = n.get("/api/v1/cluster")
            if body:
                out[bid] = body["metrics"]
    return out


def _sum(ms: dict[int, dict], key: str, listener: str, principal: str | None = None) -> int:
    total = 0
    for m in ms.values():
        by = m[key].get(listener, {})
        total += (
            by if isinstance(by, int) else (by.get(principal, 0) if principal else sum(by.values()))
        )
    return total


def _check_replication_listener(c: Cluster, principal: str) -> None:
    """Follower fetches arrive over REPLICATION as `principal`, none over CLIENT."""
    ms = wait_for(
        lambda: (
            (m := _metrics(c)) and _sum(m, "follower_fetches", "REPLICATION", principal) > 0 and m
        ),
        20,
        "follower fetches on the replication listener",
    )
    assert _sum(ms, "follower_fetches", "CLIENT") == 0  # type: ignore[arg-type]
    others = {p for m in ms.values() for p in m["follower_fetches"].get("REPLICATION", {})}  # type: ignore[union-attr]
    assert others == {principal}, others


def _wait_fenced(c: Cluster, bid: int) -> None:
    """Before restarting `bid` on a new port 0 listener: the controller refuses a second
    registration of a node id whose old session is alive at another address."""

    def fenced() -> bool:
        for n in c.live_brokers(exclude=(bid,)):
            body = n.get("/api/v1/cluster") or {}
            for b in body.get("brokers", []):
                if b["id"] == bid:
                    return bool(b.get("fenced"))
        return False

    wait_for(fenced, 30, f"broker {bid} fenced")


def _kill_leader_and_recover(c: Cluster, w: Workload, topic: str) -> int:
    w.wait_acked_growth(300, 60)
    victim = c.leader_of(topic, 0)
    c.brokers[victim].kill9()
    c.wait_new_leader(topic, 0, victim)
    w.wait_acked_growth(300, 60)  # acks=all goes on with the ISR that is left
    _wait_fenced(c, victim)
    c.brokers[victim].start()
    c.wait_ready(60, brokers=[victim])
    c.wait_isr(topic, 3, timeout=60)  # it caught up over the secure listener again
    return victim


def test_replication_over_sasl_ssl_scram(cluster: Any, tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    c: Cluster = cluster(
        controller_args=[
            *CONTROLLER_ARGS,
            "--add-scram",
            "SCRAM-SHA-512=[name=broker,password=broker-secret]",
        ],
        broker_args=[
            *_listeners("SASL_SSL", "User:broker"),
            "--override",
            f"ssl.keystore.location={certs.path('server.pem')}",
            "--override",
            f"{TRUST_KEY}={certs.path('ca.pem')}",
            "--override",
            "listener.name.replication.sasl.enabled.mechanisms=SCRAM-SHA-512",
            "--override",
            "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
            "--override",
            f"{JAAS_KEY}={JAAS.format('broker-secret')}",
            # short sessions, so re-authentication happens many times during the test
            "--override",
            "listener.name.replication.connections.max.reauth.ms=2000",
        ],
    )
    _use_client_listener(c)
    c.create_topic("secure", partitions=3, rf=3, min_isr=2)  # full ISR: replication works
    w = Workload(c.bootstrap, "secure", rate=300).start()
    w.wait_acked_growth(200, 60)
    _check_replication_listener(c, "User:broker")

    # KIP-368: the same replication connections log in again before their 2 s sessions
    # end; no new connection is needed and the broker never cuts one for expiry.
    before = _metrics(c)
    conns = _sum(before, "listener_connections", "REPLICATION")
    logins = _sum(before, "sasl_logins", "REPLICATION", "User:broker")
    wait_for(
        lambda: _sum(_metrics(c), "sasl_logins", "REPLICATION", "User:broker") >= logins + 12,
        30,
        "re-authentications on the replication connections",
    )
    assert _sum(_metrics(c), "listener_connections", "REPLICATION") == conns
    for bid in c.brokers:
        assert c.broker_log_count(bid, "SASL session expired") == 0

    _kill_leader_and_recover(c, w, "secure")

    # A broker with a wrong password: refused, said once per leader, out of the ISR,
    # while the other two keep acknowledging acks=all writes.
    bad = 3
    node = c.brokers[bad]
    node.stop()
    c.wait_isr("secure", 2, exclude=(bad,))
    _wait_fenced(c, bad)
    good_args = list(node.args)
    node.args = [*good_args, "--override", f"{JAAS_KEY}={JAAS.format('wrong')}"]
    node.start()
    c.wait_ready(60, brokers=[bad])
    wait_for(lambda: c.broker_log_count(bad, REFUSED_LINE) >= 1, 30, "the refusal logged")
    w.wait_acked_growth(300, 60)
    t = c.topic("secure", via=1)
    assert all(bad not in p["isr"] for p in t["partitions"]), t
    with open(node.log_path, errors="replace") as f:
        refused = [line for line in f if REFUSED_LINE in line]
    assert "Authentication failed" in refused[-1], refused[-1]
    # Once per leader it fetches from (retried with backoff, not logged again).
    assert len(refused) <= 3, refused
    assert any(c.broker_log_count(b, "SASL authentication failed") for b in (1, 2))

    node.stop()
    _wait_fenced(c, bad)
    node.args = good_args
    node.start()
    c.wait_ready(60, brokers=[bad])
    c.wait_isr("secure", 3, timeout=60)
    w.stop()
    f = verify(c, w, "sasl-ssl-replication")
    assert f.ok() and f.acked > 900, f.line()


def test_replication_over_ssl_with_client_certificates(cluster: Any, tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    c: Cluster = cluster(
        broker_args=[
            *_listeners("SSL", "User:CN=localhost"),
            "--override",
            f"ssl.keystore.location={certs.path('server.pem')}",
            "--override",
            f"{TRUST_KEY}={certs.path('ca.pem')}",
            "--override",
            "listener.name.replication.ssl.client.auth=required",
        ]
    )
    _use_client_listener(c)
    c.create_topic("mtls", partitions=3, rf=3, min_isr=2)
    w = Workload(c.bootstrap, "mtls", rate=300).start()
    w.wait_acked_growth(200, 60)
    # The brokers' certificate subject is who fetches (Kafka's default principal rule).
    _check_replication_listener(c, "User:CN=localhost")
    _kill_leader_and_recover(c, w, "mtls")
    w.stop()
    f = verify(c, w, "ssl-mtls-replication")
    assert f.ok() and f.acked > 600, f.line()
