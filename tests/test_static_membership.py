"""Static membership (KIP-345) with a real client against a real broker.

librdkafka's consumer with `group.instance.id` does not send LeaveGroup on close, and
when it comes back it joins with no member id: the broker must hand its place (and
partitions) to the new incarnation without a rebalance, so the other member keeps
consuming undisturbed. The rules themselves are unit-tested in
test_group_state_machine.py; this checks the wire and a real client's reading of it.
"""

from __future__ import annotations

import uuid

from waiting import holds, wait_for

from straitmq.admin_client import request_sync

PARTITIONS = 4
SESSION_MS = 10_000  # long enough that a restart fits in it


def _consumer(bootstrap: str, group: str, topic: str, instance: str, events: list):
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.instance.id": instance,
            "client.id": instance,
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": 300,
            "partition.assignment.strategy": "range",  # eager: a rebalance revokes all
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )

    def on_assign(_c, parts) -> None:
        events.append(("assign", sorted(p.partition for p in parts)))

    def on_revoke(_c, parts) -> None:
        events.append(("revoke", sorted(p.partition for p in parts)))

    c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    return c


def _members(broker, group: str) -> dict[str, str]:
    """instance id -> member id, from the broker's group API."""
    d = request_sync(broker.http, "GET", f"/api/v1/groups/{group}")
    assert d["state"] == "Stable", d
    return {m["instance_id"]: m["member_id"] for m in d["members"]}


def test_static_member_restart_keeps_its_partitions_without_a_rebalance(broker) -> None:
    topic, group = f"static-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, PARTITIONS)
    ev_a: list = []
    ev_b: list = []
    a = _consumer(broker.bootstrap, group, topic, "inst-a", ev_a)
    b = _consumer(broker.bootstrap, group, topic, "inst-b", ev_b)
    live = [a, b]

    def poll() -> None:
        for c in live:
            c.poll(0.05)

    def split() -> bool:
        poll()
        return bool(ev_a and ev_b and ev_a[-1][0] == ev_b[-1][0] == "assign") and (
            len(ev_a[-1][1]) == len(ev_b[-1][1]) == PARTITIONS // 2
        )

    try:
        wait_for(
            split,
            60,
            "both static members assigned half of the partitions",
            every=0.0,
            detail=lambda: f"a={ev_a} b={ev_b}",
        )
        before = _members(broker, group)
        a_parts = ev_a[-1][1]
        b_events = list(ev_b)

        a.close()  # a static member leaves no LeaveGroup behind: its place is kept
        live.remove(a)
        assert _members(broker, group) == before

        ev_a2: list = []
        a2 = _consumer(broker.bootstrap, group, topic, "inst-a", ev_a2)
        live.append(a2)
        wait_for(
            lambda: (poll(), ev_a2)[1],
            30,
            "the restarted member's assignment",
            every=0.0,
            detail=lambda: f"a2={ev_a2} b={ev_b}",
        )
        # The new incarnation takes over the old one's partitions...
        assert ev_a2 == [("assign", a_parts)]
        after = _members(broker, group)
        assert after["inst-b"] == before["inst-b"]
        assert after["inst-a"] != before["inst-a"]
        # ...and the other member sees no rebalance: no revoke, no new assignment, while
        # both keep heartbeating for longer than a few heartbeat intervals.
        holds(
            lambda: (poll(), list(ev_b), list(ev_a2))[1:],
            3,
            "the members' assignments",
            every=0.0,
            expect=(b_events, [("assign", a_parts)]),
        )
        assert _members(broker, group) == after
    finally:
        for c in live:
            c.close()
