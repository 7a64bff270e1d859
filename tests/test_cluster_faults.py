"""Fault tests: a real 3-controller + 3-broker cluster of separate processes, real
confluent-kafka clients, topic RF 3 with min.insync.replicas 2, idempotent acks=all
producers; faults are kill -9, SIGSTOP/SIGCONT and a network partition (network
namespaces). After healing, each test checks and prints the reliability figures:

    acked     messages whose delivery report had no error
    consumed  what a fresh group reads back from the earliest offsets
    lost      acknowledged but not read back            (must be 0)
    duplicates  a produced value read back twice        (must be 0: idempotence)
    acked_offset_changed  read back at another offset than acknowledged (must be 0)
    divergent_offsets     an offset holding different records on different replicas
    replicas_identical_to_hw  every replica's batches byte-identical up to the HW

Run with `-s` to see the figures (they are also in any assertion message).
"""

from __future__ import annotations

import signal
import time
import zlib

import pytest
from cluster_support import SESSION_TIMEOUT_MS, Workload, cluster_factory, verify, wait_for
from confluent_kafka import TopicPartition

TOPIC = "faults"
pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def cluster(tmp_path):
    yield from cluster_factory(tmp_path)


def _assert_ok(fig) -> None:
    assert fig.ok(), fig.line()


def _wait_rejoined(c, victim: int, epoch_before: int) -> None:
    """The old leader's own view of partition 0 moved past the epoch it led at, and its
    replica's role matches it (right after SIGCONT or healing it may still be stale)."""

    def ok() -> bool:
        view = (c.brokers[victim].get(f"/api/v1/topics/{TOPIC}") or {}).get("partitions")
        if not view or view[0]["leader_epoch"] <= epoch_before:
            return False
        return view[0]["local"] == ("leader" if view[0]["leader"] == victim else "follower")

    wait_for(ok, 20, f"broker {victim} past leader epoch {epoch_before}, in its new role")


def test_kill9_partition_leader(cluster) -> None:
    c = cluster()
    c.create_topic(TOPIC, partitions=3, rf=3, min_isr=2)
    w = Workload(c.bootstrap, TOPIC, prefix="k9").start()
    w.wait_acked_growth(600, 20)
    victim = c.leader_of(TOPIC, 0)
    c.brokers[victim].kill9()
    new, failover_s = c.wait_new_leader(TOPIC, 0, victim)
    resume_s = w.wait_acked_growth(300, 30)
    c.wait_isr(TOPIC, 2, timeout=15, exclude=(victim,))
    c.brokers[victim].start()
    t0 = time.monotonic()
    c.wait_ready(60, brokers=[victim])
    c.wait_isr(TOPIC, 3, timeout=40, exclude=(victim,))
    rejoin_s = time.monotonic() - t0
    w.wait_acked_growth(300, 20)
    w.stop()
    fig = verify(
        c,
        w,
        "kill9-leader",
        {
            "victim": victim,
            "new_leader": new,
            "failover_s": round(failover_s, 2),
            "acks_resumed_s": round(resume_s, 2),
            "isr_back_to_3_s": round(rejoin_s, 2),
        },
    )
    _assert_ok(fig)


def _cut_off_leader(c, prefix: str, scenario: str, cut, heal, cut_key: str) -> None:
    """Partition 0's leader is cut off (`cut(victim)`) for well beyond the session timeout
    under an acks=all workload, then restored (`heal(victim)`): a new leader takes over,
    the old one comes back as a follower, and nothing acknowledged is lost."""
    c.create_topic(TOPIC, partitions=3, rf=3, min_isr=2)
    w = Workload(c.bootstrap, TOPIC, prefix=prefix).start()
    w.wait_acked_growth(600, 20)
    victim = c.leader_of(TOPIC, 0)
    epoch_before = c.topic(TOPIC)["partitions"][0]["leader_epoch"]
    cut(victim)
    cut_at = time.monotonic()
    try:
        new, failover_s = c.wait_new_leader(TOPIC, 0, victim)
        w.wait_acked_growth(300, 30)
        # Cut off for well beyond the session timeout: fenced, its partitions moved.
        time.sleep(max(0.0, SESSION_TIMEOUT_MS / 1000 * 2.5 - (time.monotonic() - cut_at)))
    finally:
        heal(victim)
    cut_s = time.monotonic() - cut_at
    t0 = time.monotonic()
    c.wait_isr(TOPIC, 3, timeout=40, exclude=(victim,))
    rejoin_s = time.monotonic() - t0
    # It came back as a follower of the new leader, not as a second leader.
    _wait_rejoined(c, victim, epoch_before)
    w.wait_acked_growth(300, 20)
    w.stop()
    fig = verify(
        c,
        w,
        scenario,
        {
            "victim": victim,
            "new_leader": new,
            cut_key: round(cut_s, 1),
            "failover_s": round(failover_s, 2),
            "isr_back_to_3_s": round(rejoin_s, 2),
            "truncations": c.broker_log_count(victim, "truncating follower log"),
        },
    )
    _assert_ok(fig)


def test_sigstop_partition_leader(cluster) -> None:
    c = cluster()
    _cut_off_leader(
        c,
        "stop",
        "sigstop-leader",
        cut=lambda v: c.brokers[v].signal(signal.SIGSTOP),
        heal=lambda v: c.brokers[v].signal(signal.SIGCONT),
        cut_key="paused_s",
    )


def test_kill9_active_controller(cluster) -> None:
    c = cluster()
    c.create_topic(TOPIC, partitions=3, rf=3, min_isr=2)
    w = Workload(c.bootstrap, TOPIC, prefix="ctl").start()
    w.wait_acked_growth(600, 20)
    active = c.wait_active_controller()
    active.kill9()
    t0 = time.monotonic()
    new = c.wait_active_controller(exclude=active.node_id)
    elect_s = time.monotonic() - t0
    # Produce goes on, and the new active controller does its job: it fences a broker
    # and moves leadership, then takes the broker back.
    w.wait_acked_growth(300, 20)
    victim = c.leader_of(TOPIC, 1)
    c.brokers[victim].kill9()
    _, failover_s = c.wait_new_leader(TOPIC, 1, victim)
    w.wait_acked_growth(300, 30)
    c.brokers[victim].start()
    active.start()
    c.wait_ready(60, brokers=[victim])
    c.wait_isr(TOPIC, 3, timeout=40, exclude=(victim,))
    wait_for(
        lambda: (active.get("/api/v1/quorum") or {}).get("leader_id") == new.node_id,
        20,
        "the old controller back in the quorum, following the new one",
    )
    w.wait_acked_growth(300, 20)
    w.stop()
    fig = verify(
        c,
        w,
        "kill9-active-controller",
        {
            "old_active": active.node_id,
            "new_active": new.node_id,
            "new_active_s": round(elect_s, 2),
            "then_broker_failover_s": round(failover_s, 2),
        },
    )
    _assert_ok(fig)


def test_sigstop_active_controller(cluster) -> None:
    c = cluster()
    c.create_topic(TOPIC, partitions=3, rf=3, min_isr=2)
    w = Workload(c.bootstrap, TOPIC, prefix="ctlstop").start()
    w.wait_acked_growth(600, 20)
    active = c.wait_active_controller()
    active.signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        new = c.wait_active_controller(exclude=active.node_id)
        elect_s = time.monotonic() - t0
        w.wait_acked_growth(300, 20)
        # Paused past the brokers' session timeout: the old leader's view is stale now.
        time.sleep(max(0.0, SESSION_TIMEOUT_MS / 1000 * 2 - (time.monotonic() - t0)))
    finally:
        active.signal(signal.SIGCONT)
    paused_s = time.monotonic() - t0
    # The resumed controller steps down and follows; one active controller, and it did
    # not fence the brokers whose heartbeats it missed while paused.
    wait_for(
        lambda: (active.get("/api/v1/quorum") or {}).get("leader_id") == new.node_id,
        20,
        "the paused controller following the new one",
    )
    actives = [
        n.node_id
        for n in c.controllers.values()
        if (n.get("/api/v1/quorum") or {}).get("active_controller")
    ]
    assert actives == [new.node_id], actives
    w.wait_acked_growth(300, 20)
    c.wait_isr(TOPIC, 3, timeout=20)
    w.stop()
    fig = verify(
        c,
        w,
        "sigstop-active-controller",
        {
            "old_active": active.node_id,
            "new_active": new.node_id,
            "new_active_s": round(elect_s, 2),
            "paused_s": round(paused_s, 1),
        },
    )
    _assert_ok(fig)


def test_network_partition_isolates_leader(cluster) -> None:
    c = cluster(netns=True)
    assert c.net is not None
    _cut_off_leader(
        c,
        "net",
        "netns-partition-leader",
        cut=c.net.isolate,
        heal=c.net.heal,
        cut_key="cut_s",
    )


class GroupMember:
    """A confluent-kafka consumer that commits synchronously every `every` records and
    remembers the highest offset per partition whose commit the coordinator confirmed."""

    def __init__(self, conf: dict, topic: str, confirmed: dict[int, int], every: int = 100):
        from confluent_kafka import Consumer

        self.consumer = Consumer(conf)
        self.assigned = 0  # rebalances that handed it partitions
        self.consumer.subscribe([topic], on_assign=self._on_assign)
        self.confirmed = confirmed  # shared between members of the group
        self.every = every
        self.records: list[tuple[int, int, bytes]] = []
        self.reread_committed = 0  # records below a confirmed commit: must never happen
        self.commit_failures = 0
        self.failure_reasons: list[str] = []

    def _on_assign(self, consumer: object, partitions: list) -> None:
        self.assigned += 1

    def poll(self) -> bool:
        m = self.consumer.poll(0.5)
        if m is None or m.error():
            return False
        p, o = m.partition(), m.offset()
        if o < self.confirmed.get(p, 0):
            self.reread_committed += 1
        self.records.append((p, o, m.value()))
        if len(self.records) % self.every == 0 and not self.commit():
            self.commit_failures += 1
        return True

    def commit(self) -> bool:
        """Commit the positions; True if the coordinator confirmed every partition."""
        positions = [
            tp for tp in self.consumer.position(self.consumer.assignment()) if tp.offset >= 0
        ]
        if not positions:
            return True
        try:
            done = self.consumer.commit(offsets=positions, asynchronous=False)
        except Exception as e:
            self.failure_reasons.append(str(e.args[0].name() if e.args else e))
            return False
        # A synchronous commit raises only when the whole request failed; per-partition
        # errors (NOT_COORDINATOR, ...) come back in the list.
        ok = True
        for tp in done:
            if tp.error is None:
                self.confirmed[tp.partition] = max(self.confirmed.get(tp.partition, 0), tp.offset)
            else:
                self.failure_reasons.append(tp.error.name())
                ok = False
        return ok

    def close(self) -> None:
        self.consumer.close()


def test_consumer_group_resumes_after_coordinator_kill(cluster) -> None:
    c = cluster()
    c.create_topic(TOPIC, partitions=3, rf=3, min_isr=2)
    w = Workload(c.bootstrap, TOPIC, prefix="grp", rate=3000, limit=3000).start()
    w.thread.join(30)
    w.stop()
    assert len(w.acked) == 3000, w.errors
    group = "resume-group"
    offsets = c.topic("__consumer_offsets")["partitions"]
    offsets_partition = zlib.crc32(group.encode()) % len(offsets)
    coordinator = offsets[offsets_partition]["leader"]
    conf = {
        "bootstrap.servers": c.bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
        "topic.metadata.refresh.interval.ms": 1000,
        "max.partition.fetch.bytes": 4096,  # small fetches: progress on every partition
    }
    confirmed: dict[int, int] = {}
    first = GroupMember(conf, TOPIC, confirmed)
    deadline = time.monotonic() + 30
    while len(first.records) < 1000 and time.monotonic() < deadline:
        first.poll()
    assert len(first.records) >= 1000 and first.commit_failures == 0, first.commit_failures
    assigned_before = first.assigned
    # The coordinator dies with the consumer in the group: it goes on consuming and
    # committing through the new coordinator (the leader of the group's offsets partition),
    # which loaded the group (Stable, its generation and member) from its records: no
    # rebalance.
    c.brokers[coordinator].kill9()
    new_coordinator, failover_s = c.wait_new_leader(
        "__consumer_offsets", offsets_partition, coordinator
    )
    deadline = time.monotonic() + 40
    while len(first.records) < 2000 and time.monotonic() < deadline:
        first.poll()
    assert len(first.records) >= 2000, f"consumer stalled at {len(first.records)} records"
    wait_for(first.commit, 20, "a commit confirmed by the new coordinator", 0.5)
    assert first.assigned == assigned_before == 1, (assigned_before, first.assigned)
    committed = {
        tp.partition: tp.offset
        for tp in first.consumer.committed([TopicPartition(TOPIC, p) for p in range(3)], 10)
    }
    first.close()
    confirmed_by_first = dict(confirmed)

    # A new member starts exactly where the group committed.
    second = GroupMember(conf, TOPIC, confirmed)
    deadline = time.monotonic() + 40
    quiet_since = time.monotonic()
    while time.monotonic() < deadline:
        if second.poll():
            quiet_since = time.monotonic()
        elif len(second.records) and time.monotonic() - quiet_since > 3:
            break
    second.close()
    resumed_at: dict[int, int] = {}
    for p, o, _ in second.records:
        resumed_at.setdefault(p, o)
    everything = [v for _, _, v in first.records + second.records]
    redelivered = len(everything) - len(set(everything))
    lost = sum(1 for v in w.acked if v not in set(everything))
    line = (
        f"[group-resume] acked={len(w.acked)} consumed_before_resume={len(first.records)} "
        f"consumed_after_resume={len(second.records)} lost={lost} "
        f"redelivered={redelivered} reread_below_confirmed_commit="
        f"{first.reread_committed + second.reread_committed} "
        f"commit_failures_during_failover={first.commit_failures} "
        f"{sorted(set(first.failure_reasons))} "
        f"coordinator={coordinator}->{new_coordinator} failover_s={failover_s:.2f} "
        f"committed={committed} confirmed={confirmed_by_first} resumed_at={resumed_at}"
    )
    print(line, flush=True)
    assert lost == 0, line
    assert first.reread_committed + second.reread_committed == 0, line
    # The group's commits are where the new member started (-1001: none, so from 0).
    assert all(resumed_at.get(p, o) == max(o, 0) for p, o in committed.items()), line
    # Exactly the confirmed commits: nothing the coordinator confirmed went missing.
    assert all(committed[p] >= o for p, o in confirmed_by_first.items()), line
