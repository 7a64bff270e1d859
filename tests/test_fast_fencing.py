"""Fast fencing on a real 3+3 cluster with the default timeouts (session 9 s, heartbeat
2 s): a killed broker is fenced the moment its death is visible, a frozen one only after
its session timeout, and a new active controller finds brokers that died with the old
one. The way each broker was fenced is read from the controllers' own fencing counter
(`straitmq_controller_broker_fencings_total` by reason), not from timings; the only time
checked is a lower bound (no fencing before the session timeout), which load can only
make longer.

The deterministic simulation of the same rules is tests/test_fast_fencing_sim.py.
"""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request

import pytest
from cluster_support import Cluster, Workload, cluster_factory, verify, wait_for
from kio.schema.errors import ErrorCode

TOPIC = "fencing"
SESSION_S = 9.0  # the controller's default broker.session.timeout.ms
HEARTBEAT_S = 2.0  # the broker's default broker.heartbeat.interval.ms
BROKER_ARGS = [
    "--default-replication-factor",
    "3",
    "--offsets-topic-replication-factor",
    "3",
    "--group-initial-rebalance-delay-ms",
    "0",
]
pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def cluster(tmp_path):
    yield from cluster_factory(tmp_path)


def _defaults(make) -> Cluster:
    return make(controller_args=[], broker_args=BROKER_ARGS)


def fencings(c: Cluster) -> dict[str, int]:
    """Fencings by reason, summed over the controllers that are up."""
    out = {"session_expired": 0, "process_gone": 0}
    for n in c.controllers.values():
        if not n.alive():
            continue
        with urllib.request.urlopen(f"http://{n.host}:{n.http_port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("straitmq_controller_broker_fencings_total{"):
                    reason = line.split('straitmq_fence_reason="')[1].split('"')[0]
                    out[reason] += int(float(line.rsplit(" ", 1)[1]))
    return out


def fenced(c: Cluster, bid: int) -> bool:
    for n in c.live_brokers(exclude=(bid,)):
        view = n.get("/api/v1/cluster")
        if view:
            return any(b["id"] == bid and b["fenced"] for b in view["brokers"])
    return False


def test_killed_leader_is_fenced_at_once_and_nothing_is_lost(cluster) -> None:
    c = _defaults(cluster)
    c.create_topic(TOPIC, partitions=3, rf=3, min_isr=2)
    w = Workload(c.bootstrap, TOPIC, prefix="ff").start()
    w.wait_acked_growth(400, 30)
    victim = c.leader_of(TOPIC, 0)
    before = fencings(c)
    c.brokers[victim].kill9()
    new, failover_s = c.wait_new_leader(TOPIC, 0, victim, timeout=30)
    assert fenced(c, victim)
    after = fencings(c)
    assert after["process_gone"] == before["process_gone"] + 1, (before, after)
    assert after["session_expired"] == before["session_expired"], (before, after)
    w.wait_acked_growth(300, 30)
    c.brokers[victim].start()
    c.wait_ready(60, brokers=[victim])
    c.wait_isr(TOPIC, 3, timeout=40, exclude=(victim,))
    w.wait_acked_growth(200, 20)
    w.stop()
    fig = verify(
        c,
        w,
        "kill9-leader-fast-fence",
        {"victim": victim, "new_leader": new, "failover_s": round(failover_s, 2)},
    )
    assert fig.ok(), fig.line()


def test_frozen_broker_is_fenced_only_after_its_session_timeout(cluster) -> None:
    c = _defaults(cluster)
    victim = max(c.brokers)
    before = fencings(c)
    node = c.brokers[victim]
    node.signal(signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        wait_for(lambda: fenced(c, victim), SESSION_S + 20, f"broker {victim} fenced")
        waited = time.monotonic() - stopped
    finally:
        node.signal(signal.SIGCONT)
    # Its last heartbeat was at most one interval before the stop: never fenced earlier
    # than the timeout allows, however fast its death would have been seen.
    assert waited >= SESSION_S - HEARTBEAT_S, f"fenced {waited:.1f}s after SIGSTOP"
    after = fencings(c)
    assert after["session_expired"] == before["session_expired"] + 1, (before, after)
    assert after["process_gone"] == before["process_gone"], (before, after)
    wait_for(lambda: not fenced(c, victim), 30, f"broker {victim} back after SIGCONT")


def test_new_active_controller_fences_a_broker_that_died_with_the_old_one(cluster) -> None:
    c = _defaults(cluster)
    old = c.wait_active_controller()
    victim = max(c.brokers)
    c.brokers[victim].kill9()
    old.kill9()
    new = c.wait_active_controller(exclude=old.node_id, timeout=30)
    wait_for(lambda: fenced(c, victim), SESSION_S + 20, f"broker {victim} fenced")
    # Either the old controller fenced it in its last moment (it then lost the record
    # with its leadership or committed it) or the new one probed it at activation; the
    # session timeout played no part.
    counts = fencings(c)
    assert counts["session_expired"] == 0, counts
    # The brokers' streams follow the new controller: once `second`'s stream is open
    # there and its port was seen answering, its kill is seen at once.
    second = min(c.brokers)
    wait_for(
        lambda: second in (new.get("/api/v1/quorum") or {}).get("fast_fencing_armed", []),
        10,
        f"broker {second}'s session stream at the new controller",
    )
    c.brokers[second].kill9()
    wait_for(lambda: fenced(c, second), SESSION_S + 20, f"broker {second} fenced")
    counts = fencings(c)
    assert counts["session_expired"] == 0 and counts["process_gone"] >= 1, counts
    assert new.alive()


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_session_stream_refuses_bad_requests(cluster) -> None:
    c = cluster()
    active = c.wait_active_controller()
    base = f"http://{active.host}:{active.http_port}/controller/session"
    status, body = _get(base)
    assert status == 400 and "id=" in body["message"], body
    status, body = _get(f"{base}?id=1&incarnation=not-registered")
    assert status == 400 and body["error_code"] == ErrorCode.stale_broker_epoch, body
    other = next(n for n in c.controllers.values() if n.node_id != active.node_id)
    status, body = _get(
        f"http://{other.host}:{other.http_port}/controller/session?id=1&incarnation=x"
    )
    assert status == 409 and body["error_code"] == ErrorCode.not_controller, body
    assert body["leader_id"] == active.node_id, body
    # None of it touched a broker.
    assert not any(fenced(c, b) for b in c.brokers)
