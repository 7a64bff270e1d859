"""Online upgrade of a classic group to the KIP-848 consumer protocol, in the sans-IO
group state machine with a fake clock, as Kafka 4's GroupMetadataManager does it: the
first ConsumerGroupHeartbeat turns a classic group into a consumer group whose classic
members go on with JoinGroup/SyncGroup/Heartbeat, their assignment computed by the
coordinator. After every step: no partition is held by two members.
"""

from __future__ import annotations

import io
import struct
import uuid

from kio.schema.consumer_protocol_subscription.v1.data import (
    ConsumerProtocolSubscription,
    TopicPartition,
)
from kio.schema.errors import ErrorCode as E
from kio.serial import entity_writer
from straitmq.broker.groups.consumer_protocol import decode_assignment, encode_assignment
from straitmq.broker.groups.messages import (
    ConsumerHeartbeatRequest,
    JoinRequest,
    JoinResponse,
    SyncRequest,
    SyncResponse,
)
from straitmq.broker.groups.records import rebuild
from test_consumer_group_state_machine import Harness as ConsumerHarness

G = "mig"
T1 = uuid.UUID(int=1)
SESSION = 10_000
REBALANCE = 20_000


def subscription(topics: tuple[str, ...], owned: dict[str, list[int]] | None = None) -> bytes:
    value = ConsumerProtocolSubscription(
        topics=topics,
        user_data=None,
        owned_partitions=tuple(
            TopicPartition(topic=t, partitions=tuple(ps)) for t, ps in (owned or {}).items()
        ),
    )
    buf = io.BytesIO()
    buf.write(struct.pack(">h", 1))
    entity_writer(ConsumerProtocolSubscription)(buf, value)
    return buf.getvalue()


class Harness(ConsumerHarness):
    """The KIP-848 harness (its timer and one-owner checks after every step) with
    classic requests, whose answers it keeps by handle, and the records written."""

    def __init__(self) -> None:
        super().__init__()
        self.handles = iter(range(1, 10_000))
        self.answers: dict[int, JoinResponse | SyncResponse] = {}

    def collect(self) -> None:
        for r in self._collect(replies=True):
            assert r.handle not in self.answers, "answered twice"
            self.answers[r.handle] = r.response

    def join(
        self, member_id: str, owned: dict[str, list[int]] | None = None, client: str = "c"
    ) -> JoinResponse | None:
        h = next(self.handles)
        protocols = (("range", subscription(("t1",), owned)),)
        req = JoinRequest(
            G, member_id, None, client, "h", SESSION, REBALANCE, "consumer", protocols
        )
        self.m.join(h, req, self.now, self.topics)
        self.collect()
        r = self.answers.get(h)
        assert r is None or isinstance(r, JoinResponse)
        return r

    def sync(
        self, member_id: str, generation: int, assignments: dict | None = None
    ) -> SyncResponse | None:
        h = next(self.handles)
        req = SyncRequest(G, member_id, None, generation, assignments or {}, "consumer", "range")
        self.m.sync(h, req, self.now)
        self.collect()
        r = self.answers.get(h)
        assert r is None or isinstance(r, SyncResponse)
        return r

    def heartbeat(self, member_id: str, generation: int) -> int:
        code = self.m.heartbeat(G, member_id, None, generation, self.now)
        self.collect()
        return code

    def consumer_hb(self, member_id: str, epoch: int, owned: tuple | None = None):
        req = ConsumerHeartbeatRequest(
            G,
            member_id,
            epoch,
            None,
            None,
            REBALANCE,
            ("t1",) if epoch == 0 else None,
            None,
            owned if epoch else None,
            "new",
            "h",
        )
        # Not hb(): an upgrade answers the classic members' parked requests.
        r = self.m.consumer_heartbeat(req, self.topics, self.now)
        self.collect()
        return r

    def advance(self, ms: int) -> None:
        self.now += ms
        self.m.tick(self.now)
        self.collect()


def classic_pair(h: Harness) -> tuple[str, str, int]:
    """A Stable classic group of two members, partitions 0-1 and 2-3 of t1."""
    r = h.join("")
    assert r is not None and r.error == E.member_id_required
    a = r.member_id
    h.join(a)  # parked in the initial rebalance delay
    r = h.join("", client="d")
    assert r is not None and r.error == E.member_id_required
    b = r.member_id
    h.join(b, client="d")
    group = h.m.groups[G]
    while group.state != "CompletingRebalance":  # the initial rebalance delay
        h.advance(500)
    gen = group.generation
    leader = group.leader_id
    assignments = {
        a: encode_assignment({"t1": [0, 1]}, 1),
        b: encode_assignment({"t1": [2, 3]}, 1),
    }
    other = b if leader == a else a
    h.sync(other, gen)
    assert h.sync(leader, gen, assignments) is not None
    assert group.state == "Stable"
    return a, b, gen


def test_a_consumer_heartbeat_upgrades_a_classic_group_and_its_members_rejoin_eagerly() -> None:
    h = Harness()
    a, b, gen = classic_pair(h)
    r = h.consumer_hb("", 0)
    assert r.error == E.none and G in h.m.consumer_groups and G not in h.m.groups
    group = h.m.consumer_groups[G]
    new = r.member_id
    # The classic members keep their generation as member epoch, and their partitions:
    # the newcomer gets nothing they still hold.
    assert h.m.consumer_groups[G].members[a].epoch == gen
    assert group.members[a].assigned == {(T1, 0), (T1, 1)}
    assert group.members[new].assigned == frozenset() and group.epoch == gen + 1
    assert h.m.consumer_describe(G)[2]["members"][0]["member_type"] == 0
    # Heartbeats tell the classic members to rejoin; an eager member gives up
    # everything before it rejoins (its subscription owns nothing).
    assert h.heartbeat(a, gen) == E.rebalance_in_progress
    assert h.heartbeat(b, gen) == E.rebalance_in_progress
    ja = h.join(a)
    assert ja is not None and ja.error == E.none and ja.leader == "" and ja.members == ()
    assert ja.generation == gen + 1 and ja.protocol_type == "consumer"
    sa = h.sync(a, ja.generation)
    assert sa is not None and sa.error == E.none
    got_a = decode_assignment(sa.assignment)
    jb = h.join(b)
    assert jb is not None
    sb = h.sync(b, jb.generation)
    assert sb is not None and sb.error == E.none
    got_b = decode_assignment(sb.assignment)
    assert not set(got_a.get("t1", ())) & set(got_b.get("t1", ()))
    # The newcomer gets the rest once it is released.
    r = h.consumer_hb(new, r.member_epoch)
    held = {p for _, p in group.members[new].assigned}
    assert held and not held & (set(got_a.get("t1", ())) | set(got_b.get("t1", ())))
    assert held | set(got_a.get("t1", ())) | set(got_b.get("t1", ())) == {0, 1, 2, 3}
    assert h.heartbeat(a, ja.generation) == E.none
    assert h.heartbeat(a, gen) == E.illegal_generation
    # A classic member commits with its generation, any version of OffsetCommit.
    assert h.m.commit_check(G, a, None, ja.generation, h.now, version=7) == E.none
    assert h.m.commit_check(G, a, None, gen, h.now, version=7) == E.illegal_generation
    assert h.m.consumer_groups[G].state == "Stable"


def test_a_cooperative_member_gives_up_what_it_lost_before_the_newcomer_gets_it() -> None:
    h = Harness()
    a, b, gen = classic_pair(h)
    new = h.consumer_hb("", 0).member_id
    group = h.m.consumer_groups[G]
    # Of two members with two partitions each, one gives a partition to the newcomer.
    loser = next(m for m in (a, b) if group.target[m] < group.members[m].assigned)
    other = b if loser == a else a
    had = sorted(p for _, p in group.members[loser].assigned)
    # It rejoins still owning them: what it loses stays with it until it says so.
    j = h.join(loser, owned={"t1": had})
    assert j is not None and j.generation == gen  # still revoking, in its old epoch
    s = h.sync(loser, gen)
    assert s is not None and s.error == E.none
    kept = set(decode_assignment(s.assignment).get("t1", ()))
    lost = set(had) - kept
    assert kept and lost
    assert not {p for _, p in group.members[new].assigned} & lost
    assert h.heartbeat(loser, gen) == E.rebalance_in_progress
    j = h.join(loser, owned={"t1": sorted(kept)})
    assert j is not None and j.generation == gen + 1
    h.consumer_hb(new, group.members[new].epoch)
    assert {p for _, p in group.members[new].assigned} == lost
    # The other classic member, told to rejoin, never does: after its rebalance timeout
    # it is removed and what it held goes to the others.
    assert h.heartbeat(other, gen) == E.rebalance_in_progress
    h.advance(SESSION - 1)
    assert h.heartbeat(other, gen) == E.rebalance_in_progress  # alive, not rejoining
    h.advance(REBALANCE)
    assert other not in group.members


def test_classic_members_leave_expire_and_are_persisted_with_their_protocol() -> None:
    h = Harness()
    a, b, gen = classic_pair(h)
    h.consumer_hb("", 0)
    group = h.m.consumer_groups[G]
    # The records of the group rebuild the classic members with what they joined with.
    latest: dict = {}
    for rec in h.persisted:
        if getattr(rec, "group_id", None) == G and hasattr(rec, "records"):
            for k, v in rec.records:
                latest[k] = v
    rebuilt = rebuild(G, {k: v for k, v in latest.items() if v is not None})
    assert rebuilt is not None and rebuilt.members[a].classic == group.members[a].classic
    assert rebuilt.members[a].epoch == gen
    assert h.m.leave(G, [(a, None), ("nobody", None)], h.now) == [
        (a, None, E.none),
        ("nobody", None, E.unknown_member_id),
    ]
    h.collect()
    assert a not in group.members
    h.advance(SESSION + 1)  # b's classic session timeout, not the consumer one
    assert b not in group.members


def test_a_new_classic_member_joins_a_consumer_group_with_a_member_id_round_trip() -> None:
    h = Harness()
    r = h.consumer_hb("", 0)
    first = h.join("")
    assert first is not None and first.error == E.member_id_required
    j = h.join(first.member_id)
    assert j is not None and j.error == E.none and j.generation >= 1
    s = h.sync(first.member_id, j.generation)
    assert s is not None and s.error == E.none and decode_assignment(s.assignment) == {}
    h.consumer_hb(r.member_id, r.member_epoch, owned=((T1, (0, 1, 2, 3)),))
    h.consumer_hb(
        r.member_id,
        h.m.consumer_groups[G].members[r.member_id].epoch,
        owned=((T1, tuple(p for _, p in h.m.consumer_groups[G].members[r.member_id].assigned)),),
    )
    assert h.heartbeat(first.member_id, j.generation) == E.rebalance_in_progress
    j = h.join(first.member_id)
    assert j is not None
    s = h.sync(first.member_id, j.generation)
    assert s is not None and len(decode_assignment(s.assignment).get("t1", ())) == 2
    # A JoinGroup of another protocol type, or with metadata that is not a consumer
    # subscription, is refused; the group is unharmed.
    bad = JoinRequest(G, "", None, "x", "h", SESSION, REBALANCE, "connect", (("v1", b"x"),))
    h.m.join(999, bad, h.now, h.topics)
    h.collect()
    assert h.answers[999].error == E.inconsistent_group_protocol
    assert len(h.m.consumer_groups[G].members) == 2


def test_a_group_that_cannot_be_upgraded_is_left_alone() -> None:
    h = Harness()
    bad = JoinRequest(
        G, "", None, "x", "h", SESSION, REBALANCE, "consumer", (("range", b"\x00"),), False
    )
    h.m.join(1, bad, h.now, h.topics)
    while h.m.groups[G].state != "CompletingRebalance":
        h.advance(500)
    r = h.consumer_hb("", 0)
    assert r.error == E.group_id_not_found and G in h.m.groups and G not in h.m.consumer_groups
