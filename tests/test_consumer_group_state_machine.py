"""KIP-848 consumer groups (ConsumerGroupHeartbeat) in the group state machine, driven
heartbeat by heartbeat with a fake clock. Expectations follow Kafka's
GroupMetadataManager.consumerGroupHeartbeat and CurrentAssignmentBuilder: epochs, the
revoke-before-assign handshake, fencing, static members, server-side assignors.

The core safety property, checked after every step of every test and by a seeded
simulation: no partition is held (assigned or still being revoked) by two members.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field

import pytest
from kio.schema.errors import ErrorCode as E
from straitmq.broker.groups.assignors import range_, uniform
from straitmq.broker.groups.consumer_group import STABLE_MEMBER, UNRELEASED, UNREVOKED
from straitmq.broker.groups.messages import (
    ConsumerHeartbeatRequest,
    ConsumerHeartbeatResponse,
    JoinRequest,
    TimerCancel,
    TimerSet,
)
from straitmq.broker.groups.state_machine import GroupSettings, GroupStateMachine

G = "cg"
T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
SESSION = 45_000
REBALANCE = 10_000
SETTINGS = GroupSettings(max_size=10)


@dataclass
class Topics:
    topics: dict[str, tuple[uuid.UUID, int]] = field(
        default_factory=lambda: {"t1": (T1, 4), "t2": (T2, 2)}
    )

    def topic(self, name: str) -> tuple[uuid.UUID, int] | None:
        return self.topics.get(name)


class NoOffsets:
    def has_group(self, group_id: str) -> bool:
        return False

    def group_ids(self) -> list[str]:
        return []


@dataclass
class Member:
    """What a client keeps: its id, epoch and the partitions it owns."""

    member_id: str
    epoch: int = 0
    owned: frozenset = frozenset()


class Harness:
    def __init__(self, settings: GroupSettings = SETTINGS) -> None:
        self.m = GroupStateMachine(settings, NoOffsets(), random.Random(3))
        self.topics = Topics()
        self.now = 0
        self.timers: dict = {}
        self.persisted: list = []  # what the machine asked to write, in order

    def hb(self, req: ConsumerHeartbeatRequest) -> ConsumerHeartbeatResponse:
        r = self.m.consumer_heartbeat(req, self.topics, self.now)
        self._collect()
        return r

    def join(
        self,
        member_id: str = "",
        topics: tuple[str, ...] = ("t1",),
        instance: str | None = None,
        assignor: str | None = None,
    ) -> tuple[Member, ConsumerHeartbeatResponse]:
        r = self.hb(
            ConsumerHeartbeatRequest(
                G, member_id, 0, instance, None, REBALANCE, topics, assignor, None, "c", "h"
            )
        )
        m = Member(r.member_id or "", r.member_epoch)
        if r.assignment is not None:
            m.owned = _flat(r.assignment)
        return m, r

    def beat(
        self, m: Member, owned: frozenset | None = None, instance: str | None = None, **kw
    ) -> ConsumerHeartbeatResponse:
        """A heartbeat reporting what it owns; the client then adopts the answer (a
        client revokes what the new assignment leaves out before its next heartbeat)."""
        report = m.owned if owned is None else owned
        req = ConsumerHeartbeatRequest(
            G, m.member_id, m.epoch, instance, owned=_grouped(report), **kw
        )
        r = self.hb(req)
        if r.error == E.none:
            m.epoch = r.member_epoch
            if r.assignment is not None:
                m.owned = _flat(r.assignment)
        return r

    def advance(self, ms: int) -> None:
        self.now += ms
        self.m.tick(self.now)
        self._collect()

    def member(self, mid: str):
        return self.m.consumer_groups[G].members[mid]

    def classic_join(self, req: JoinRequest) -> int:
        """A classic JoinGroup (answered at once here); its error code."""
        self.m.join(1, req, self.now)
        (reply,) = self._collect(replies=True)
        return reply.response.error

    def _collect(self, replies: bool = False) -> list:
        out = self.m.take_output()
        assert replies or not out.replies, "ConsumerGroupHeartbeat parks nothing"
        self.persisted.extend(out.persist)
        for t in out.timers:
            if isinstance(t, TimerSet):
                self.timers[t.key] = t.deadline_ms
            else:
                assert isinstance(t, TimerCancel)
                self.timers.pop(t.key, None)
        # tick() fires timers the shell never sees fire: compare only what is armed now.
        assert {k: d for k, d in self.timers.items() if d > self.now} == {
            k: d for k, d in self.m.timers().items() if d > self.now
        }
        check_no_partition_held_twice(self.m)
        return out.replies


def check_no_partition_held_twice(m: GroupStateMachine) -> None:
    for g in m.consumer_groups.values():
        seen: dict = {}
        for mem in g.members.values():
            for tp in mem.held():
                assert tp not in seen, f"{tp} held by {seen[tp]} and {mem.member_id}"
                seen[tp] = mem.member_id


def _flat(assignment: dict) -> frozenset:
    return frozenset((t, p) for t, ps in assignment.items() for p in ps)


def _grouped(tps: frozenset) -> tuple:
    by: dict = {}
    for t, p in tps:
        by.setdefault(t, []).append(p)
    return tuple((t, tuple(sorted(ps))) for t, ps in sorted(by.items(), key=lambda x: str(x[0])))


def all_of(topic: uuid.UUID, n: int) -> frozenset:
    return frozenset((topic, p) for p in range(n))


# -- joining and the revoke-before-assign handshake ----------------------------------------


def test_first_member_gets_an_id_epoch_and_every_partition() -> None:
    h = Harness()
    a, r = h.join()
    assert r.error == E.none and a.member_id and r.member_epoch == 1
    assert r.heartbeat_interval_ms == SETTINGS.consumer_heartbeat_interval_ms
    assert a.owned == all_of(T1, 4)
    assert h.m.consumer_groups[G].state == "Stable"
    assert h.m.list_groups() == [(G, "consumer", "Stable")]
    # Nothing changed: the next heartbeat carries no assignment.
    assert h.beat(a).assignment is None


def test_a_second_member_gets_partitions_only_once_the_first_has_revoked_them() -> None:
    h = Harness()
    a, _ = h.join()
    b, rb = h.join()
    assert rb.member_epoch == 2 and b.owned == frozenset()  # all still held by a
    assert h.member(b.member_id).state == UNRELEASED
    ra = h.beat(a)  # a learns what to give up, in its old epoch
    assert ra.member_epoch == 1 and h.member(a.member_id).state == UNREVOKED
    assert len(a.owned) == 2
    rb = h.beat(b)
    assert b.owned == frozenset()  # a has not confirmed yet
    ra = h.beat(a)  # reports owning only what it kept
    assert ra.member_epoch == 2 and h.member(a.member_id).state == STABLE_MEMBER
    h.beat(b)
    assert len(b.owned) == 2 and not (a.owned & b.owned)
    assert a.owned | b.owned == all_of(T1, 4)
    assert h.m.consumer_groups[G].state == "Stable"


def test_a_member_that_does_not_revoke_in_time_is_fenced() -> None:
    h = Harness()
    a, _ = h.join()
    b, _ = h.join()
    h.beat(a)
    assert h.member(a.member_id).state == UNREVOKED
    h.advance(REBALANCE - 1)
    h.beat(a, owned=all_of(T1, 4))  # still holding on to everything
    h.advance(1)
    assert a.member_id not in h.m.consumer_groups[G].members
    h.beat(b)
    assert b.owned == all_of(T1, 4)
    assert h.beat(a).error == E.unknown_member_id


def test_session_expiry_removes_a_silent_member() -> None:
    h = Harness()
    a, _ = h.join()
    b, _ = h.join()
    for _ in range(3):
        h.advance(SESSION // 3)
        h.beat(b)
    assert a.member_id not in h.m.consumer_groups[G].members
    h.beat(b)
    assert b.owned == all_of(T1, 4)


def test_leave_returns_the_partitions_to_the_others() -> None:
    h = Harness()
    a, _ = h.join()
    b, _ = h.join()
    h.beat(a), h.beat(a), h.beat(b)
    r = h.hb(ConsumerHeartbeatRequest(G, a.member_id, -1))
    assert r.error == E.none and r.member_epoch == -1
    h.beat(b)
    assert b.owned == all_of(T1, 4)
    assert h.hb(ConsumerHeartbeatRequest(G, "nobody", -1)).error == E.unknown_member_id


# -- fencing -----------------------------------------------------------------------------


def test_member_epoch_fencing() -> None:
    h = Harness()
    a, _ = h.join()
    h.join()  # b joins: the group moves to epoch 2
    h.beat(a), h.beat(a)  # a reaches epoch 2; its previous epoch is 1
    assert a.epoch == 2
    ahead = ConsumerHeartbeatRequest(G, a.member_id, 3, owned=_grouped(a.owned))
    assert h.hb(ahead).error == E.fenced_member_epoch
    # The answer with the new epoch was lost: the previous epoch with a subset of the
    # assignment is accepted...
    lost = ConsumerHeartbeatRequest(G, a.member_id, 1, owned=_grouped(a.owned))
    assert h.hb(lost).error == E.none
    # ...but not without saying what it owns, nor with an older epoch.
    assert h.hb(ConsumerHeartbeatRequest(G, a.member_id, 1)).error == E.fenced_member_epoch
    older = ConsumerHeartbeatRequest(G, a.member_id, 0, owned=())
    assert h.hb(older).error == E.invalid_request  # epoch 0 is a join: needs its fields
    assert h.hb(ConsumerHeartbeatRequest(G, "ghost", 5)).error == E.unknown_member_id


def test_commit_checks_the_member_epoch() -> None:
    h = Harness()
    a, _ = h.join()
    assert h.m.commit_check(G, a.member_id, None, a.epoch, h.now) == E.none
    assert h.m.commit_check(G, a.member_id, None, a.epoch - 1, h.now) == E.stale_member_epoch
    assert h.m.commit_check(G, "ghost", None, 1, h.now) == E.unknown_member_id
    assert h.m.commit_check(G, "", None, -1, h.now) == E.unknown_member_id  # not empty


# -- static members ----------------------------------------------------------------------


def test_static_member_leaves_for_a_while_and_its_successor_keeps_its_partitions() -> None:
    h = Harness()
    a, _ = h.join(instance="i1")
    b, _ = h.join()
    h.beat(a, instance="i1"), h.beat(a, instance="i1"), h.beat(b)
    kept = a.owned
    assert kept and b.owned and not (kept & b.owned)
    # Another process with the same instance id while a is active: refused.
    _, r = h.join(member_id="intruder", instance="i1")
    assert r.error == E.unreleased_instance_id
    r = h.hb(ConsumerHeartbeatRequest(G, a.member_id, -2, "i1"))
    assert r.error == E.none and r.member_epoch == -2
    epoch = h.m.consumer_groups[G].epoch
    h.beat(b)
    assert not (b.owned & kept)  # its partitions wait for it
    a2, r = h.join(member_id="a-restarted", instance="i1")
    assert r.error == E.none and a2.owned == kept
    assert h.m.consumer_groups[G].epoch == epoch  # nobody else moved
    assert a.member_id not in h.m.consumer_groups[G].members


def test_a_static_member_that_does_not_come_back_is_removed_after_its_session() -> None:
    h = Harness()
    a, _ = h.join(instance="i1")
    b, _ = h.join()
    h.hb(ConsumerHeartbeatRequest(G, a.member_id, -2, "i1"))
    for _ in range(3):
        h.advance(SESSION // 3)
        h.beat(b)
    assert list(h.m.consumer_groups[G].members) == [b.member_id]
    h.beat(b)
    assert b.owned == all_of(T1, 4)


# -- what triggers a new assignment ------------------------------------------------------


def test_subscription_and_metadata_changes_bump_the_group_epoch() -> None:
    h = Harness()
    a, _ = h.join()
    epoch = h.m.consumer_groups[G].epoch
    r = h.beat(a, subscribed_topic_names=("t1", "t2"))
    assert h.m.consumer_groups[G].epoch == epoch + 1
    assert _flat(r.assignment or {}) == all_of(T1, 4) | all_of(T2, 2)
    h.topics.topics["t2"] = (T2, 3)  # a partition added
    h.beat(a)
    assert a.owned == all_of(T1, 4) | all_of(T2, 3)


def test_requests_refused_before_anything_changes() -> None:
    h = Harness()
    bad = [
        (
            ConsumerHeartbeatRequest(
                "", "", 0, rebalance_timeout_ms=1, subscribed_topic_names=("t1",)
            ),
            E.invalid_request,
        ),
        (ConsumerHeartbeatRequest(G, "", 3), E.invalid_request),
        (ConsumerHeartbeatRequest(G, "", 0, subscribed_topic_names=("t1",)), E.invalid_request),
        (ConsumerHeartbeatRequest(G, "", 0, rebalance_timeout_ms=1), E.invalid_request),
        (
            ConsumerHeartbeatRequest(
                G,
                "",
                0,
                rebalance_timeout_ms=1,
                subscribed_topic_names=("t1",),
                server_assignor="sticky",
            ),
            E.unsupported_assignor,
        ),
    ]
    for req, code in bad:
        assert h.hb(req).error == code, req
    assert G not in h.m.consumer_groups


def test_max_size() -> None:
    h = Harness(GroupSettings(max_size=1))
    h.join()
    assert h.join()[1].error == E.group_max_size_reached


def test_classic_and_consumer_groups_do_not_mix() -> None:
    h = Harness()
    h.join()
    protocols = (("range", b""),)
    jr = JoinRequest(G, "", None, "c", "h", 10_000, 10_000, "consumer", protocols)
    assert h.classic_join(jr) == E.inconsistent_group_protocol
    classic = JoinRequest(
        "classic", "", None, "c", "h", 10_000, 10_000, "consumer", protocols, False
    )
    h.m.join(2, classic, h.now)
    assert h._collect(replies=True) == []  # parked in the initial rebalance delay
    req = ConsumerHeartbeatRequest(
        "classic", "", 0, rebalance_timeout_ms=1, subscribed_topic_names=("t1",)
    )
    assert h.hb(req).error == E.group_id_not_found


# -- assignors ---------------------------------------------------------------------------


def test_uniform_is_balanced_and_keeps_what_it_can() -> None:
    subs = {m: frozenset({T1}) for m in ("a", "b", "c")}
    first = uniform({"a": subs["a"], "b": subs["b"]}, {T1: 6}, {})
    assert sorted(len(v) for v in first.values()) == [3, 3]
    second = uniform(subs, {T1: 6}, first)
    assert sorted(len(v) for v in second.values()) == [2, 2, 2]
    for m in ("a", "b"):
        assert second[m] <= first[m]  # only what c needed moved
    mixed = uniform({"a": frozenset({T1}), "b": frozenset({T1, T2})}, {T1: 2, T2: 2}, {})
    assert mixed["a"] | mixed["b"] == all_of(T1, 2) | all_of(T2, 2)
    assert all((t, p) not in mixed["a"] for t, p in all_of(T2, 2))


def test_range_gives_each_member_a_consecutive_range_per_topic() -> None:
    out = range_({"a": frozenset({T1}), "b": frozenset({T1})}, {T1: 5}, {})
    assert out == {
        "a": frozenset((T1, p) for p in (0, 1, 2)),
        "b": frozenset((T1, p) for p in (3, 4)),
    }


# -- simulation --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_random_membership_never_holds_a_partition_twice_and_settles(seed: int) -> None:
    rng = random.Random(seed)
    h = Harness()
    live: list[Member] = []
    for step in range(400):
        h.advance(1_000)
        r = rng.random()
        if step < 300 and r < 0.05 and len(live) < 6:
            m, resp = h.join(topics=rng.choice([("t1",), ("t1", "t2")]))
            if resp.error == E.none:
                live.append(m)
        elif step < 300 and r < 0.08 and live:
            m = live.pop(rng.randrange(len(live)))
            h.hb(ConsumerHeartbeatRequest(G, m.member_id, -1))
        elif step < 300 and r < 0.09:
            t1 = h.topics.topics["t1"]
            h.topics.topics["t1"] = (t1[0], t1[1] + 1)
        for m in list(live):
            if rng.random() < 0.7 or step >= 300:  # some heartbeats come late
                resp = h.beat(m)
                if resp.error in (E.fenced_member_epoch, E.unknown_member_id):
                    live.remove(m)  # a real client would rejoin; this one stops
    g = h.m.consumer_groups.get(G)
    if live:
        assert g is not None and g.state == "Stable", (seed, g)
        held = [tp for m in live for tp in m.owned]
        assert len(held) == len(set(held))
        assert set(held) == set().union(*g.target.values())


# -- the handler (API 68), called directly: it is not registered in dispatch yet ------------


def test_handler_converts_kio_requests_and_answers_a_buildable_response() -> None:
    import asyncio
    import datetime
    import io
    from types import SimpleNamespace

    from kio.schema.consumer_group_heartbeat.v1 import request as v1
    from kio.schema.consumer_group_heartbeat.v1.response import ConsumerGroupHeartbeatResponse
    from kio.serial import entity_writer
    from straitmq.broker.api.groups import handle_consumer_group_heartbeat
    from straitmq.broker.groups.coordinator import GroupCoordinator

    from straitmq.protocol.build import build

    class Offsets(NoOffsets):
        def owns(self, group_id: str) -> bool:
            return group_id == G

        def write_group_records(self, group_id: str, records: list) -> int:
            return 0  # the group's records: no durability to wait for here (unbound)

    image = SimpleNamespace(topics={"t1": SimpleNamespace(topic_id=T1, partitions=[0, 1, 2])})
    deps = SimpleNamespace(
        offsets=Offsets(),
        metadata=SimpleNamespace(image=image),
        groups=GroupCoordinator(Offsets(), SETTINGS),  # type: ignore[arg-type]
        share=SimpleNamespace(is_share_group=lambda group_id: False),  # no share groups here
    )

    def ctx() -> SimpleNamespace:
        return SimpleNamespace(client_id="app", client_host="/10.0.0.9", allowed=lambda *_: True)

    def request(group: str, epoch: int, member: str, **kw) -> v1.ConsumerGroupHeartbeatRequest:
        fields = {
            "group_id": group,
            "member_id": member,
            "member_epoch": epoch,
            "instance_id": None,
            "rack_id": None,
            "rebalance_timeout": datetime.timedelta(milliseconds=-1),
            "subscribed_topic_names": None,
            "subscribed_topic_regex": None,
            "server_assignor": None,
            "topic_partitions": None,
        }
        return v1.ConsumerGroupHeartbeatRequest(**{**fields, **kw})

    async def run() -> None:
        member = str(uuid.uuid4())  # v1: the client makes up its member id
        join = request(
            G,
            0,
            member,
            rebalance_timeout=datetime.timedelta(seconds=30),
            subscribed_topic_names=("t1",),
            topic_partitions=(),
        )
        d = await handle_consumer_group_heartbeat(deps, ctx(), join)  # type: ignore[arg-type]
        resp = build(ConsumerGroupHeartbeatResponse, d)
        entity_writer(ConsumerGroupHeartbeatResponse)(io.BytesIO(), resp)  # encodes
        assert resp.error_code == E.none and resp.member_id == member and resp.member_epoch == 1
        assert resp.heartbeat_interval == datetime.timedelta(seconds=5)
        (tps,) = resp.assignment.topic_partitions
        assert tps.topic_id == T1 and tps.partitions == (0, 1, 2)
        owned = (v1.TopicPartitions(topic_id=T1, partitions=(0, 1, 2)),)
        beat = request(G, 1, member, topic_partitions=owned)
        d = await handle_consumer_group_heartbeat(deps, ctx(), beat)  # type: ignore[arg-type]
        assert build(ConsumerGroupHeartbeatResponse, d).assignment is None  # unchanged
        d = await handle_consumer_group_heartbeat(deps, ctx(), request("elsewhere", 1, member))  # type: ignore[arg-type]
        assert d["error_code"] == E.not_coordinator
        # v1 regular expressions (RE2): a bad one is refused and changes nothing...
        bad = request(G, 1, member, subscribed_topic_regex="t(", topic_partitions=owned)
        d = await handle_consumer_group_heartbeat(deps, ctx(), bad)  # type: ignore[arg-type]
        assert d["error_code"] == E.invalid_regular_expression
        assert "missing )" in d["error_message"]
        d = await handle_consumer_group_heartbeat(deps, ctx(), beat)  # type: ignore[arg-type]
        assert d["error_code"] == E.none and d["member_epoch"] == 1
        # ...a good one replaces the names (matching whole names: "t" alone matches none).
        only_t = request(
            G,
            1,
            member,
            subscribed_topic_names=(),
            subscribed_topic_regex="t",
            topic_partitions=owned,
        )
        d = await handle_consumer_group_heartbeat(deps, ctx(), only_t)  # type: ignore[arg-type]
        assert d["error_code"] == E.none and d["assignment"]["topic_partitions"] == []
        back = request(
            G, d["member_epoch"], member, subscribed_topic_regex="t[0-9]+", topic_partitions=()
        )  # it gave t1 up: now it gets it back through the expression
        d = await handle_consumer_group_heartbeat(deps, ctx(), back)  # type: ignore[arg-type]
        (tps,) = build(ConsumerGroupHeartbeatResponse, d).assignment.topic_partitions
        assert tps.topic_id == T1 and tps.partitions == (0, 1, 2)

    asyncio.run(run())


def test_uniform_gives_joining_members_a_share_when_the_old_ones_are_at_the_ceiling() -> None:
    # 6 partitions held 2 each by a, b, c; d and e join: 2, 1, 1, 1, 1 (found with the
    # Java client: keeping up to ceil(6 / 5) = 2 each left d and e with nothing).
    t = uuid.UUID(int=7)
    current = {m: frozenset((t, p) for p in range(2 * i, 2 * i + 2)) for i, m in enumerate("abc")}
    out = uniform({m: frozenset({t}) for m in "abcde"}, {t: 6}, current)
    assert sorted(len(v) for v in out.values()) == [1, 1, 1, 1, 2]
    assert all(out[m] <= current[m] for m in "abc")  # nothing moves between old members
    assert frozenset().union(*out.values()) == frozenset((t, p) for p in range(6))
