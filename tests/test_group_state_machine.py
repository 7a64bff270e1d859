"""The classic consumer-group state machine driven request by request with a fake clock.

Expectations come from Kafka's group coordinator (GroupMetadataManager / ClassicGroup,
3.7+), one test per rule. After every step the harness checks the output protocol: each
parked request is answered exactly once, and the timers the shell would hold (replaying
every TimerSet/TimerCancel) are exactly those the machine has armed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
from dataclasses import dataclass, field

import pytest
from kio.schema.errors import ErrorCode as E
from straitmq.broker.config import BrokerConfig
from straitmq.broker.groups.classic_group import COMPLETING, DEAD, EMPTY, PREPARING, STABLE
from straitmq.broker.groups.coordinator import GroupCoordinator, JoinError
from straitmq.broker.groups.messages import (
    HEARTBEAT,
    JOIN,
    SYNC,
    DeleteGroupOffsets,
    GroupRecords,
    JoinRequest,
    JoinResponse,
    SyncRequest,
    SyncResponse,
    TimerCancel,
    TimerKey,
    TimerSet,
)
from straitmq.broker.groups.share_group import ShareSettings
from straitmq.broker.groups.state_machine import GroupSettings, GroupStateMachine

SESSION = 10_000
REBALANCE = 30_000
DELAY = 100
SETTINGS = GroupSettings(
    min_session_timeout_ms=1_000,
    max_session_timeout_ms=60_000,
    initial_rebalance_delay_ms=DELAY,
    max_size=5,
    new_member_join_timeout_ms=300_000,
)
RANGE = (("range", b"range-meta"),)
BOTH = (("range", b"r"), ("roundrobin", b"rr"))
G = "g"


@dataclass
class FakeOffsets:
    groups: set[str] = field(default_factory=set)

    def has_group(self, group_id: str) -> bool:
        return group_id in self.groups

    def group_ids(self) -> list[str]:
        return sorted(self.groups)


class Harness:
    def __init__(self, settings: GroupSettings = SETTINGS) -> None:
        self.offsets = FakeOffsets()
        self.m = GroupStateMachine(settings, self.offsets, random.Random(7))
        self.now = 0
        self._handles = itertools.count(1)
        self.issued: set[int] = set()
        self.answers: dict[int, JoinResponse | SyncResponse] = {}
        self.shell_timers: dict[TimerKey, int] = {}
        self.persisted: list[DeleteGroupOffsets | GroupRecords] = []
        self.events: list[tuple[str, str]] = []  # (member id, what), for the operator's log

    # -- driving -------------------------------------------------------------------------

    def join(
        self,
        member_id: str = "",
        instance: str | None = None,
        protocols: tuple = RANGE,
        session: int = SESSION,
        rebalance: int = REBALANCE,
        known_id_required: bool = True,
        skip_assignment: bool = False,
        client: str = "client",
        group: str = G,
        protocol_type: str = "consumer",
    ) -> int:
        h = self._handle()
        req = JoinRequest(
            group,
            member_id,
            instance,
            client,
            "/10.0.0.1",
            session,
            rebalance,
            protocol_type,
            protocols,
            known_id_required,
            skip_assignment,
        )
        self.m.join(h, req, self.now)
        self._collect()
        return h

    def sync(
        self,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        instance: str | None = None,
        protocol_name: str | None = None,
        group: str = G,
    ) -> int:
        h = self._handle()
        req = SyncRequest(
            group, member_id, instance, generation, assignments or {}, None, protocol_name
        )
        self.m.sync(h, req, self.now)
        self._collect()
        return h

    def heartbeat(
        self, member_id: str, generation: int, instance: str | None = None, group: str = G
    ) -> int:
        code = self.m.heartbeat(group, member_id, instance, generation, self.now)
        self._collect()
        return code

    def commit(
        self, member_id: str, generation: int, instance: str | None = None, group: str = G
    ) -> int:
        code = self.m.commit_check(group, member_id, instance, generation, self.now)
        self._collect()
        return code

    def leave(self, *members: tuple[str, str | None], group: str = G) -> list:
        results = self.m.leave(group, list(members), self.now)
        self._collect()
        return results

    def advance(self, ms: int) -> None:
        """Move the clock, firing due timers as the asyncio shell does: one key at a
        time, earliest first, each through expire(key, its deadline)."""
        until = self.now + ms
        while True:
            due = [(d, i, k) for i, (k, d) in enumerate(self.shell_timers.items()) if d <= until]
            if not due:
                break
            d, _, key = min(due, key=lambda x: (x[0], x[1]))
            self.now = max(self.now, d)
            del self.shell_timers[key]
            self.m.expire(key, self.now)
            self._collect()
        self.now = until
        nxt = self.m.next_deadline()
        assert nxt is None or nxt > self.now, "a timer the shell never heard of is due"

    # -- reading -------------------------------------------------------------------------

    def answer(self, h: int) -> JoinResponse | SyncResponse | None:
        return self.answers.get(h)

    def join_answer(self, h: int) -> JoinResponse:
        r = self.answers.get(h)
        assert isinstance(r, JoinResponse), f"join {h} not answered (or not a join): {r}"
        return r

    def sync_answer(self, h: int) -> SyncResponse:
        r = self.answers.get(h)
        assert isinstance(r, SyncResponse), f"sync {h} not answered (or not a sync): {r}"
        return r

    @property
    def group(self):
        return self.m.groups[G]

    def state(self, group: str = G) -> str:
        return self.m.describe(group)["group_state"]

    # -- plumbing ------------------------------------------------------------------------

    def _handle(self) -> int:
        h = next(self._handles)
        self.issued.add(h)
        return h

    def _collect(self) -> None:
        out = self.m.take_output()
        for r in out.replies:
            assert r.handle in self.issued, f"answer for a handle never issued: {r}"
            assert r.handle not in self.answers, f"handle {r.handle} answered twice: {r}"
            self.answers[r.handle] = r.response
        for t in out.timers:
            if isinstance(t, TimerSet):
                self.shell_timers[t.key] = t.deadline_ms
            else:
                assert isinstance(t, TimerCancel)
                self.shell_timers.pop(t.key, None)
        self.persisted.extend(out.persist)
        self.events.extend((e.member_id, e.what) for e in out.events)
        assert self.shell_timers == self.m.timers(), "the shell's timers drifted from the machine's"


def new_dynamic(h: Harness, client: str = "client", **kw) -> tuple[str, int]:
    """MEMBER_ID_REQUIRED round trip, then the real JoinGroup: (member id, join handle)."""
    first = h.join(client=client, **kw)
    r = h.join_answer(first)
    assert r.error == E.member_id_required
    return r.member_id, h.join(member_id=r.member_id, client=client, **kw)


@dataclass
class Formed:
    ids: list[str]
    generation: int
    leader: str


def form_group(
    h: Harness, n: int, instances: list[str | None] | None = None, protocols: tuple = RANGE
) -> Formed:
    """n members join in the initial delay, the leader assigns, everyone syncs: Stable."""
    joins: list[int] = []
    for i in range(n):
        inst = instances[i] if instances else None
        if inst is None:
            _, jh = new_dynamic(h, client=f"c{i}", protocols=protocols)
        else:
            jh = h.join(instance=inst, client=f"c{i}", protocols=protocols)
        joins.append(jh)
    for _ in range(n):  # each member that came during a delay extends it once
        if h.answer(joins[0]) is None:
            h.advance(DELAY)
    answers = [h.join_answer(j) for j in joins]
    assert all(a.error == E.none for a in answers), answers
    gen = answers[0].generation
    leader = answers[0].leader
    ids = [a.member_id for a in answers]
    syncs = [
        h.sync(mid, gen, {m: f"assign-{m}".encode() for m in ids} if mid == leader else None)
        for mid in ids
    ]
    assert all(h.sync_answer(s).error == E.none for s in syncs)
    assert h.state() == STABLE
    return Formed(ids, gen, leader)


# -- Empty -> PreparingRebalance -> CompletingRebalance -> Stable ---------------------------


def test_group_walks_through_every_state_to_stable() -> None:
    h = Harness()
    assert h.state() == DEAD  # nothing known about it yet
    a, ja = new_dynamic(h, client="a")
    assert h.state() == PREPARING
    assert h.answer(ja) is None  # parked for the initial delay
    b, jb = new_dynamic(h, client="b")
    h.advance(DELAY)  # b arrived during the delay: one more delay
    assert h.answer(ja) is None and h.state() == PREPARING
    h.advance(DELAY)
    assert h.state() == COMPLETING
    ra, rb = h.join_answer(ja), h.join_answer(jb)
    assert ra.error == rb.error == E.none
    assert ra.generation == rb.generation == 1
    assert ra.leader == rb.leader == a  # the first member to join leads
    assert ra.protocol_type == "consumer" and ra.protocol_name == "range"
    assert [m["member_id"] for m in ra.members] == [a, b]  # only the leader gets members
    assert ra.members[1]["metadata"] == b"range-meta"
    assert rb.members == ()

    sb = h.sync(b, 1)  # a follower's SyncGroup waits for the leader's
    assert h.answer(sb) is None
    assert h.commit(b, 1) == E.rebalance_in_progress  # no commits before the assignment
    sa = h.sync(a, 1, {a: b"pa", b: b"pb"})
    assert h.state() == STABLE
    assert h.sync_answer(sa).assignment == b"pa"
    assert h.sync_answer(sb).assignment == b"pb"
    assert h.sync_answer(sb).protocol_name == "range"
    assert h.heartbeat(a, 1) == E.none and h.heartbeat(b, 1) == E.none
    assert h.commit(a, 1) == E.none
    # A member syncing again in Stable gets its assignment at once.
    assert h.sync_answer(h.sync(b, 1)).assignment == b"pb"


def test_member_id_required_on_v4_and_its_pending_id_is_kept_for_the_rejoin() -> None:
    h = Harness()
    first = h.join(client="app")
    r = h.join_answer(first)
    assert r.error == E.member_id_required
    assert r.member_id.startswith("app-")
    assert h.state() == EMPTY  # nothing joined yet
    assert h.m.timers()[TimerKey(HEARTBEAT, G, r.member_id)] == SESSION
    j = h.join(member_id=r.member_id, client="app")
    assert h.state() == PREPARING
    h.advance(DELAY)
    assert h.join_answer(j).member_id == r.member_id
    assert h.join_answer(j).generation == 1


def test_join_before_v4_is_admitted_without_the_round_trip() -> None:
    h = Harness()
    j = h.join(client="old", known_id_required=False)
    h.advance(DELAY)
    r = h.join_answer(j)
    assert r.error == E.none and r.member_id.startswith("old-") and r.leader == r.member_id


def test_pending_member_id_expires_after_its_session_timeout() -> None:
    h = Harness()
    first = h.join(client="app")
    pending = h.join_answer(first).member_id
    h.advance(SESSION - 1)
    assert pending in h.m.groups[G].pending_join
    h.advance(1)
    assert pending not in h.m.groups[G].pending_join
    assert h.join_answer(h.join(member_id=pending)).error == E.unknown_member_id


def test_pending_member_holds_the_join_phase_until_it_rejoins() -> None:
    h = Harness()
    f = form_group(h, 2, protocols=BOTH)
    a, b = f.ids
    jb = h.join(member_id=b, protocols=(("roundrobin", b"x"), ("range", b"y")))
    assert h.state() == PREPARING
    c_first = h.join(client="c", protocols=BOTH)
    c = h.join_answer(c_first).member_id  # MEMBER_ID_REQUIRED, now pending
    ja = h.join(member_id=a, protocols=BOTH)
    assert h.answer(ja) is None and h.answer(jb) is None  # c is still expected
    jc = h.join(member_id=c, protocols=BOTH)
    for j in (ja, jb, jc):
        assert h.join_answer(j).generation == 2
    assert len(h.join_answer(ja).members) == 3


def test_unknown_member_id_on_join_sync_heartbeat_commit() -> None:
    h = Harness()
    assert h.join_answer(h.join(member_id="ghost")).error == E.unknown_member_id  # no group
    assert h.heartbeat("ghost", 0) == E.unknown_member_id
    assert h.sync_answer(h.sync("ghost", 0)).error == E.unknown_member_id
    f = form_group(h, 1)
    assert h.join_answer(h.join(member_id="ghost")).error == E.unknown_member_id
    assert h.heartbeat("ghost", f.generation) == E.unknown_member_id
    assert h.sync_answer(h.sync("ghost", f.generation)).error == E.unknown_member_id
    assert h.commit("ghost", f.generation) == E.unknown_member_id
    assert h.state() == STABLE  # none of it disturbed the group


def test_illegal_generation_on_sync_heartbeat_commit() -> None:
    h = Harness()
    f = form_group(h, 1)
    (a,) = f.ids
    assert h.heartbeat(a, f.generation + 1) == E.illegal_generation
    assert h.heartbeat(a, f.generation - 1) == E.illegal_generation
    assert h.sync_answer(h.sync(a, f.generation - 1)).error == E.illegal_generation
    assert h.commit(a, f.generation - 1) == E.illegal_generation


def test_commit_rules_for_groups_without_members() -> None:
    h = Harness()
    # Manual assignment (generation -1, no member id) into a group nobody joined.
    assert h.commit("", -1, group="simple") == E.none
    # A generation for a group that does not exist here: ILLEGAL_GENERATION (OffsetCommit < v9).
    assert h.commit("m", 3, group="nowhere") == E.illegal_generation
    # A group known only by its committed offsets is an Empty group: no such member.
    h.offsets.groups.add("committed")
    assert h.commit("m", 3, group="committed") == E.unknown_member_id
    # An in-memory Empty group takes commits with generation -1, member id or not.
    pending = h.join_answer(h.join(group="empty")).member_id
    assert h.state("empty") == EMPTY
    assert h.commit(pending, -1, group="empty") == E.none
    assert h.commit("", -1, group="empty") == E.none
    # An anonymous commit into a group with members is refused.
    form_group(h, 1)
    assert h.commit("", -1) == E.unknown_member_id


def test_rebalance_in_progress_on_heartbeat_and_sync_while_preparing() -> None:
    h = Harness()
    f = form_group(h, 2, protocols=BOTH)
    a, b = f.ids
    jb = h.join(member_id=b, protocols=(("roundrobin", b"new"), ("range", b"new")))
    assert h.state() == PREPARING and h.answer(jb) is None
    assert h.heartbeat(a, f.generation) == E.rebalance_in_progress
    assert h.sync_answer(h.sync(a, f.generation)).error == E.rebalance_in_progress
    assert h.commit(a, f.generation) == E.none  # commits are allowed before rejoining
    ja = h.join(member_id=a, protocols=BOTH)
    assert h.join_answer(ja).generation == h.join_answer(jb).generation == f.generation + 1


def test_parked_sync_is_answered_rebalance_in_progress_when_a_member_joins() -> None:
    h = Harness()
    a, _ja = new_dynamic(h, client="a")
    b, _jb = new_dynamic(h, client="b")
    h.advance(2 * DELAY)
    sb = h.sync(b, 1)
    assert h.answer(sb) is None and h.state() == COMPLETING
    _c, _jc = new_dynamic(h, client="c")  # a new member during CompletingRebalance
    assert h.sync_answer(sb).error == E.rebalance_in_progress
    assert h.state() == PREPARING
    assert h.heartbeat(a, 1) == E.rebalance_in_progress


def test_inconsistent_group_protocol() -> None:
    h = Harness()
    # An empty group needs a protocol type and at least one protocol.
    assert h.join_answer(h.join(protocols=())).error == E.inconsistent_group_protocol
    assert h.join_answer(h.join(protocol_type="")).error == E.inconsistent_group_protocol
    form_group(h, 1)
    # Another protocol type, or no protocol in common with every member.
    assert h.join_answer(h.join(protocol_type="connect")).error == E.inconsistent_group_protocol
    rr = (("roundrobin", b""),)
    assert h.join_answer(h.join(protocols=rr)).error == E.inconsistent_group_protocol
    # A SyncGroup v5 naming another protocol than the group's.
    f = h.group
    a = next(iter(f.members))
    r = h.sync_answer(h.sync(a, f.generation, protocol_name="roundrobin"))
    assert r.error == E.inconsistent_group_protocol


def test_selected_protocol_is_the_one_most_members_prefer_among_common_ones() -> None:
    h = Harness()
    prefs = [
        (("range", b""), ("roundrobin", b""), ("sticky", b"")),
        (("roundrobin", b""), ("range", b"")),
        (("sticky", b""), ("roundrobin", b""), ("range", b"")),
    ]
    joins = []
    for i, p in enumerate(prefs):
        joins.append(new_dynamic(h, client=f"c{i}", protocols=p)[1])
    h.advance(DELAY)
    h.advance(DELAY)
    h.advance(DELAY)
    # sticky is not supported by everyone; range gets 1 vote, roundrobin 2.
    assert h.join_answer(joins[0]).protocol_name == "roundrobin"


def test_group_max_size_reached() -> None:
    h = Harness(dataclasses.replace(SETTINGS, max_size=2))
    f = form_group(h, 2)
    r = h.join_answer(h.join(client="third"))
    assert r.error == E.group_max_size_reached and r.member_id == ""
    # The members of a full group still rejoin.
    ja = h.join(member_id=f.ids[0])
    jb = h.join(member_id=f.ids[1])
    assert h.join_answer(ja).error == h.join_answer(jb).error == E.none


def test_group_max_size_while_preparing_turns_away_the_last_to_rejoin() -> None:
    h = Harness(dataclasses.replace(SETTINGS, max_size=2))
    f = form_group(h, 2)
    a, b = f.ids
    ja = h.join(member_id=a)  # a rebalance: a is awaiting its join
    c, jc = new_dynamic(h, client="c")  # 1 awaiting < 2: c gets in
    assert h.answer(jc) is None and c in h.group.members
    # b rejoins last, when as many members as the group may hold await their join:
    # refused and removed, so the group can complete with a and c.
    r = h.join_answer(h.join(member_id=b))
    assert r.error == E.group_max_size_reached
    assert b not in h.group.members
    assert h.join_answer(ja).generation == h.join_answer(jc).generation == f.generation + 1


def test_leader_sync_gives_members_it_left_out_an_empty_assignment() -> None:
    h = Harness()
    a, _ = new_dynamic(h, client="a")
    b, _ = new_dynamic(h, client="b")
    h.advance(2 * DELAY)
    sb = h.sync(b, 1)
    h.sync(a, 1, {a: b"everything"})
    assert h.sync_answer(sb).error == E.none and h.sync_answer(sb).assignment == b""


def test_a_retried_join_replaces_the_parked_one() -> None:
    h = Harness()
    f = form_group(h, 2)
    a, b = f.ids
    first = h.join(member_id=a)
    second = h.join(member_id=a)  # the client timed out and asked again
    assert h.join_answer(first).error == E.rebalance_in_progress
    assert h.answer(second) is None
    jb = h.join(member_id=b)
    assert h.join_answer(second).generation == h.join_answer(jb).generation == f.generation + 1


def test_heartbeat_and_commit_keep_the_session_between_join_and_sync() -> None:
    h = Harness()
    a, _ = new_dynamic(h, client="a")
    h.advance(DELAY)
    assert h.state() == COMPLETING
    h.advance(SESSION - 1)
    assert h.heartbeat(a, 1) == E.none  # heartbeats before SyncGroup are fine
    h.advance(SESSION - 1)
    h.sync(a, 1, {a: b"x"})
    h.advance(SESSION - 1)
    assert h.commit(a, 1) == E.none  # a commit shows it is alive too
    h.advance(SESSION - 1)
    assert a in h.group.members
    h.advance(1)
    assert a not in h.group.members


def test_invalid_session_timeout_and_group_id() -> None:
    h = Harness()
    assert h.join_answer(h.join(session=999)).error == E.invalid_session_timeout
    assert h.join_answer(h.join(session=60_001)).error == E.invalid_session_timeout
    assert h.join_answer(h.join(group="")).error == E.invalid_group_id


# -- timeouts ---------------------------------------------------------------------------------


def test_session_expiry_removes_a_silent_member_and_rebalances() -> None:
    h = Harness()
    f = form_group(h, 2)
    a, b = f.ids
    # Both sessions started when the leader's SyncGroup answered them; only b heartbeats.
    h.advance(SESSION - 1)
    assert h.heartbeat(b, f.generation) == E.none
    assert a in h.group.members
    h.advance(1)
    assert a not in h.group.members
    assert h.heartbeat(b, f.generation) == E.rebalance_in_progress
    jb = h.join(member_id=b)
    r = h.join_answer(jb)
    assert r.generation == f.generation + 1 and r.leader == b and len(r.members) == 1
    assert h.heartbeat(a, f.generation) == E.unknown_member_id
    # The operator's log says who went and why, and which generation formed.
    assert (a, "member removed: session expired") in h.events
    assert (b, "generation 2: 1 members, protocol range") in h.events


def test_session_runs_from_the_last_heartbeat() -> None:
    h = Harness()
    f = form_group(h, 1)
    (a,) = f.ids
    h.advance(SESSION - 1)
    assert h.heartbeat(a, f.generation) == E.none
    h.advance(SESSION - 1)
    assert a in h.group.members
    h.advance(1)
    assert a not in h.group.members
    assert h.state() == EMPTY and h.group.generation == f.generation + 1


def test_rebalance_timeout_removes_dynamic_members_that_do_not_rejoin() -> None:
    h = Harness()
    f = form_group(h, 3)
    a, b, c = f.ids
    ja = h.join(member_id=a)  # the leader rejoins: a rebalance
    h.join(member_id=c)
    for _ in range(REBALANCE // (SESSION // 2) - 1):
        h.advance(SESSION // 2)
        # b stays alive (heartbeats are answered) but does not rejoin.
        assert h.heartbeat(b, f.generation) == E.rebalance_in_progress
    h.advance(SESSION // 2 - 1)
    assert h.answer(ja) is None
    h.advance(1)
    ra = h.join_answer(ja)
    assert ra.generation == f.generation + 1
    assert [m["member_id"] for m in ra.members] == [a, c]
    assert h.heartbeat(b, f.generation) == E.unknown_member_id


def test_a_leader_that_does_not_rejoin_is_replaced_by_one_that_did() -> None:
    h = Harness()
    f = form_group(h, 2, protocols=BOTH)
    a, b = f.ids
    assert f.leader == a
    jb = h.join(member_id=b, protocols=(("roundrobin", b""), ("range", b"")))
    h.advance(REBALANCE)
    rb = h.join_answer(jb)
    assert rb.leader == b and [m["member_id"] for m in rb.members] == [b]


def test_members_that_do_not_sync_in_time_are_removed_and_the_group_rebalances() -> None:
    h = Harness()
    a, _ja = new_dynamic(h, client="a")
    b, _jb = new_dynamic(h, client="b")
    h.advance(2 * DELAY)
    assert h.m.timers()[TimerKey(SYNC, G)] == h.now + REBALANCE
    sa = h.sync(a, 1, {a: b"pa", b: b"pb"})
    assert h.sync_answer(sa).error == E.none
    assert h.state() == STABLE
    for _ in range(REBALANCE // (SESSION // 2) - 1):
        h.advance(SESSION // 2)  # both heartbeat, but b never sends SyncGroup
        assert h.heartbeat(a, 1) == h.heartbeat(b, 1) == E.none
    h.advance(SESSION // 2 - 1)
    assert b in h.group.members
    h.advance(1)
    assert b not in h.group.members and a in h.group.members
    assert h.state() == PREPARING
    assert h.heartbeat(a, 1) == E.rebalance_in_progress


def test_initial_rebalance_delay_waits_for_more_members() -> None:
    h = Harness()
    _a, ja = new_dynamic(h, client="a")
    h.advance(DELAY // 2)
    _b, jb = new_dynamic(h, client="b")
    h.advance(DELAY // 2)  # the first delay ends: b came meanwhile, so it is extended
    assert h.answer(ja) is None
    h.advance(DELAY - 1)
    assert h.answer(ja) is None
    h.advance(1)
    assert h.join_answer(ja).generation == h.join_answer(jb).generation == 1
    assert len(h.join_answer(ja).members) == 2


def test_initial_rebalance_delay_is_bounded_by_the_rebalance_timeout() -> None:
    h = Harness()
    rebalance = 250  # with DELAY 100: 100, then 100 more, then the 50 left
    joins = []
    for i in range(5):  # a member arrives every 50 ms until 200
        joins.append(new_dynamic(h, client=f"c{i}", rebalance=rebalance)[1])
        if i < 4:
            h.advance(50)
    h.advance(49)
    assert h.answer(joins[0]) is None
    h.advance(1)
    assert h.now == rebalance
    assert all(h.join_answer(j).generation == 1 for j in joins)


def test_zero_initial_delay_completes_a_lone_first_member_at_once() -> None:
    h = Harness(dataclasses.replace(SETTINGS, initial_rebalance_delay_ms=0))
    _, j = new_dynamic(h)
    assert h.join_answer(j).generation == 1


def test_a_new_member_whose_join_never_completes_is_dropped_after_the_join_timeout() -> None:
    h = Harness(dataclasses.replace(SETTINGS, new_member_join_timeout_ms=500))
    f = form_group(h, 1, instances=["i1"])  # static: the rebalance timeout keeps it
    (_a,) = f.ids
    b, jb = new_dynamic(h, client="b")
    assert h.state() == PREPARING  # waiting for a to rejoin
    h.advance(499)
    assert h.answer(jb) is None
    h.advance(1)
    assert h.join_answer(jb).error == E.unknown_member_id
    assert b not in h.group.members


# -- static membership ----------------------------------------------------------------------


def test_static_member_takeover_fences_the_old_member_id_without_a_rebalance() -> None:
    h = Harness()
    f = form_group(h, 2, instances=["i1", None])
    old, b = f.ids
    j = h.join(instance="i1", client="restarted")  # same instance, no member id
    r = h.join_answer(j)
    new = r.member_id
    assert r.error == E.none and new != old and new.startswith("i1-")
    assert r.generation == f.generation  # no new generation
    assert h.state() == STABLE
    assert h.heartbeat(b, f.generation) == E.none  # the others notice nothing
    # The old incarnation is fenced everywhere it shows up with its instance id.
    assert h.heartbeat(old, f.generation, instance="i1") == E.fenced_instance_id
    assert h.sync_answer(h.sync(old, f.generation, instance="i1")).error == E.fenced_instance_id
    assert h.commit(old, f.generation, instance="i1") == E.fenced_instance_id
    assert h.leave((old, "i1")) == [(old, "i1", E.fenced_instance_id)]
    assert h.join_answer(h.join(member_id=old, instance="i1")).error == E.fenced_instance_id
    # The new one carries on with the old one's assignment.
    assert h.heartbeat(new, f.generation, instance="i1") == E.none
    s = h.sync_answer(h.sync(new, f.generation, instance="i1"))
    assert s.assignment == f"assign-{old}".encode()
    assert list(h.group.members) == [b, new] and h.group.static == {"i1": new}


def test_static_takeover_fences_requests_the_old_incarnation_has_parked() -> None:
    h = Harness()
    b, _jb = new_dynamic(h, client="b")  # b joins first and leads
    ja = h.join(instance="i1", client="a")
    h.advance(2 * DELAY)
    old = h.join_answer(ja).member_id
    assert h.group.leader_id == b
    sb = h.sync(old, 1, instance="i1")
    assert h.answer(sb) is None and h.state() == COMPLETING
    j_new = h.join(instance="i1", client="a2")
    # Its parked SyncGroup is fenced, not just told to rejoin.
    assert h.sync_answer(sb).error == E.fenced_instance_id
    # In CompletingRebalance the takeover rebalances: the leader may have assigned to the
    # old id, and the new one must get an assignment.
    assert h.state() == PREPARING
    assert h.heartbeat(b, 1) == E.rebalance_in_progress
    jb2 = h.join(member_id=b)
    assert h.join_answer(j_new).generation == h.join_answer(jb2).generation == 2


def test_static_takeover_fences_a_parked_join_of_the_old_member_id() -> None:
    h = Harness()
    f = form_group(h, 2, instances=["i1", None], protocols=BOTH)
    old, b = f.ids
    j_old = h.join(member_id=old, instance="i1", protocols=BOTH)  # leader: rebalance
    assert h.answer(j_old) is None and h.state() == PREPARING
    j_new = h.join(instance="i1", protocols=BOTH)
    assert h.join_answer(j_old).error == E.fenced_instance_id
    assert h.answer(j_new) is None  # still waiting for b
    jb = h.join(member_id=b, protocols=BOTH)
    assert h.join_answer(j_new).generation == h.join_answer(jb).generation == f.generation + 1
    assert h.join_answer(j_new).leader == h.join_answer(j_new).member_id  # took the lead over


def test_static_rejoin_that_changes_the_selected_protocol_rebalances() -> None:
    h = Harness()
    f = form_group(h, 2, instances=["i1", None], protocols=BOTH)
    assert h.group.protocol_name == "range"
    j = h.join(instance="i1", protocols=(("roundrobin", b""),))
    assert h.answer(j) is None
    assert h.state() == PREPARING
    jb = h.join(member_id=f.ids[1], protocols=BOTH)
    assert h.join_answer(j).protocol_name == "roundrobin"
    assert h.join_answer(jb).generation == f.generation + 1


def test_static_leader_rejoin_v9_skips_assignment_and_older_versions_see_the_old_leader() -> None:
    for v9 in (True, False):
        h = Harness()
        f = form_group(h, 2, instances=["i1", None])
        old_leader, b = f.ids
        assert f.leader == old_leader
        r = h.join_answer(h.join(instance="i1", skip_assignment=v9))
        assert r.error == E.none and h.state() == STABLE
        assert h.group.leader_id == r.member_id
        if v9:
            assert r.skip_assignment and r.leader == r.member_id
            assert {m["member_id"] for m in r.members} == {r.member_id, b}
        else:
            # Told the old leader id, the client acts as a follower and keeps its
            # assignment instead of reassigning the group.
            assert not r.skip_assignment and r.leader == old_leader and r.members == ()


def test_static_members_stay_through_the_rebalance_timeout_but_must_sync() -> None:
    h = Harness()
    f = form_group(h, 2, instances=["i1", None], protocols=BOTH)
    s, b = f.ids
    jb = h.join(member_id=b, protocols=(("roundrobin", b""), ("range", b"")))
    for _ in range(REBALANCE // (SESSION // 2)):
        h.advance(SESSION // 2)  # the static member is alive but does not rejoin
        if h.answer(jb) is None:
            assert h.heartbeat(s, f.generation, instance="i1") == E.rebalance_in_progress
    rb = h.join_answer(jb)
    assert rb.generation == f.generation + 1
    assert rb.leader == b  # the joined member leads
    assert {m["member_id"] for m in rb.members} == {s, b}  # s is still in the group
    assert h.heartbeat(s, f.generation, instance="i1") == E.illegal_generation
    h.sync(b, rb.generation, {b: b"x", s: b"y"})
    h.advance(SESSION)  # without a heartbeat of this generation its session ends
    assert s not in h.group.members and h.group.static == {}


def test_static_member_session_expiry_removes_it() -> None:
    h = Harness()
    f = form_group(h, 2, instances=["i1", None])
    s, b = f.ids
    h.advance(SESSION // 2)
    assert h.heartbeat(b, f.generation) == E.none
    h.advance(SESSION // 2)
    assert s not in h.group.members and "i1" not in h.group.static
    assert h.state() == PREPARING


def test_static_leave_by_instance_id() -> None:
    h = Harness()
    f = form_group(h, 3, instances=["i1", "i2", None])
    s1, s2, d = f.ids
    # LeaveGroup v3+: an admin removes static members by instance id alone.
    results = h.leave(("", "i1"), ("", "nope"))
    assert results == [("", "i1", E.none), ("", "nope", E.unknown_member_id)]
    assert s1 not in h.group.members and "i1" not in h.group.static
    assert h.state() == PREPARING
    assert h.heartbeat(s1, f.generation, instance="i1") == E.unknown_member_id
    # By member id and instance id, as a consumer leaving on close does.
    assert h.leave((s2, "i2")) == [(s2, "i2", E.none)]
    assert list(h.group.members) == [d]


def test_leave_of_unknown_members_is_answered_per_member() -> None:
    h = Harness()
    assert h.leave(("x", None), ("", "i9"), group="none") == [
        ("x", None, E.unknown_member_id),
        ("", "i9", E.unknown_member_id),
    ]
    f = form_group(h, 2)
    a, b = f.ids
    results = h.leave(("ghost", None), (b, None))
    assert results == [("ghost", None, E.unknown_member_id), (b, None, E.none)]
    assert list(h.group.members) == [a]
    assert h.heartbeat(a, f.generation) == E.rebalance_in_progress


def test_leave_of_a_pending_member() -> None:
    h = Harness()
    pending = h.join_answer(h.join()).member_id
    assert h.leave((pending, None)) == [(pending, None, E.none)]
    assert h.group.pending_join == set()
    assert TimerKey(HEARTBEAT, G, pending) not in h.m.timers()


def test_last_member_leaving_empties_the_group_which_can_then_be_deleted() -> None:
    h = Harness()
    f = form_group(h, 1)
    assert h.m.delete(G) == E.non_empty_group
    h.leave((f.ids[0], None))
    assert h.state() == EMPTY and h.group.generation == f.generation + 1
    assert h.group.protocol_name is None
    assert ("g", "consumer", EMPTY) in h.m.list_groups()
    # Written as Kafka writes GroupMetadata: Stable (after the leader's SyncGroup), then
    # Empty; deleting the group deletes its record and offsets.
    records = [r for r in h.persisted if not isinstance(r, DeleteGroupOffsets)]
    assert [[v and v["generation"] for _, v in r.records] for r in records] == [
        [f.generation],
        [f.generation + 1],
    ]
    h.persisted.clear()
    assert h.m.delete(G) == E.none
    h._collect()
    assert h.persisted == [GroupRecords(G, ((("grp", G, ""), None),)), DeleteGroupOffsets(G)]
    assert h.state() == DEAD and h.m.timers() == {}
    assert h.m.delete(G) == E.group_id_not_found


def test_leave_during_the_join_phase_completes_it_when_everyone_else_has_joined() -> None:
    h = Harness()
    f = form_group(h, 2)
    a, b = f.ids
    ja = h.join(member_id=a)
    assert h.answer(ja) is None
    h.leave((b, None))
    r = h.join_answer(ja)
    assert r.generation == f.generation + 1 and len(r.members) == 1


# -- rejoins that do not rebalance ---------------------------------------------------------


def test_follower_rejoin_with_unchanged_metadata_in_stable_gets_the_current_generation() -> None:
    h = Harness()
    f = form_group(h, 2)
    a, b = f.ids
    r = h.join_answer(h.join(member_id=b))
    assert r.error == E.none and r.generation == f.generation and r.leader == a
    assert r.members == ()
    assert h.state() == STABLE


def test_rejoin_in_completing_with_unchanged_metadata_repeats_the_answer() -> None:
    h = Harness()
    a, _ja = new_dynamic(h, client="a")
    _b, _jb = new_dynamic(h, client="b")
    h.advance(2 * DELAY)
    assert h.state() == COMPLETING
    again = h.join_answer(h.join(member_id=a, client="a"))  # lost its answer; asks again
    assert again.generation == 1 and len(again.members) == 2
    assert h.state() == COMPLETING


# -- describe, list, unload ---------------------------------------------------------------


def test_describe_shows_metadata_and_assignments_only_when_stable() -> None:
    h = Harness()
    f = form_group(h, 2, instances=["i1", None])
    d = h.m.describe(G)
    assert d["group_state"] == STABLE and d["protocol_data"] == "range"
    assert [m["member_assignment"] for m in d["members"]] == [f"assign-{m}".encode() for m in f.ids]
    assert d["members"][0]["group_instance_id"] == "i1"
    h.join(member_id=f.ids[0], instance="i1")  # the leader rejoins
    d = h.m.describe(G)
    assert d["group_state"] == PREPARING and d["protocol_data"] == ""
    assert all(m["member_assignment"] == b"" for m in d["members"])
    h.offsets.groups.add("offsets-only")
    assert h.m.describe("offsets-only")["group_state"] == EMPTY
    assert [g for g, _, _ in h.m.list_groups()] == [G, "offsets-only"]


def test_unload_answers_parked_requests_not_coordinator_and_drops_timers() -> None:
    h = Harness()
    _a, ja = new_dynamic(h, client="a")
    h.join(client="other", group="other")  # another group stays
    h.m.unload(lambda gid: gid == G)
    h._collect()
    assert h.join_answer(ja).error == E.not_coordinator
    assert G not in h.m.groups and "other" in h.m.groups
    assert all(k.group_id != G for k in h.m.timers())


def test_tick_fires_what_is_due_like_the_shell_does_key_by_key() -> None:
    """tick(now) (every due timer, earliest first) ends where the shell's key-by-key
    expire() calls end: same answers, same timers left."""
    runs = []
    for use_tick in (True, False):
        h = Harness()
        f = form_group(h, 3)
        a, _b, _c = f.ids
        ja = h.join(member_id=a)
        assert TimerKey(JOIN, G) in h.m.timers()
        if use_tick:
            h.now += REBALANCE + SESSION
            h.m.tick(h.now)
            out = h.m.take_output()
            answers = {r.handle: r.response for r in out.replies}
        else:
            h.advance(REBALANCE + SESSION)
            answers = {k: v for k, v in h.answers.items() if k >= ja}
        runs.append((answers, h.m.timers(), h.group.generation, list(h.group.members)))
        assert answers[ja].generation == f.generation + 1  # type: ignore[union-attr]
    assert runs[0] == runs[1]


# -- the asyncio shell ----------------------------------------------------------------------


class _Offsets(FakeOffsets):
    """The shell's store: group records written (a SyncGroup whose records were not
    written is answered NOT_COORDINATOR), a deleted group gone."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[tuple[str, int]] = []

    def write_group_records(self, group_id: str, records: list) -> int:
        self.groups.add(group_id)
        self.written.append((group_id, len(records)))
        return len(self.written)

    def delete_group(self, group_id: str) -> None:
        self.groups.discard(group_id)


def test_asyncio_shell_maps_parked_requests_to_futures_and_timers_to_the_loop() -> None:
    async def run() -> None:
        settings = GroupSettings(
            min_session_timeout_ms=10, initial_rebalance_delay_ms=20, max_size=10
        )
        gc = GroupCoordinator(_Offsets(), settings)  # type: ignore[arg-type]

        async def join(member_id: str, client: str, rebalance: int = 100) -> dict:
            return await gc.join(
                G,
                member_id,
                None,
                client,
                "h",
                5_000,
                rebalance,
                "consumer",
                [("range", b"")],
                require_known_member_id=True,
            )

        with pytest.raises(JoinError) as e:
            await join("", "a")
        assert e.value.code == E.member_id_required
        a = e.value.member_id
        ra = await join(a, "a")  # answered by the initial-delay timer on the loop
        assert ra["generation_id"] == 1 and ra["leader"] == a
        sync = await gc.sync(G, a, None, 1, {a: b"pa"})
        assert sync["assignment"] == b"pa"
        # A second member: a must rejoin; it does not, so the rebalance timeout (a loop
        # timer) removes it and answers b alone.
        with pytest.raises(JoinError) as e:
            await join("", "b")
        b = e.value.member_id
        rb = await asyncio.wait_for(join(b, "b"), 5)
        assert rb["generation_id"] == 2 and rb["leader"] == b and len(rb["members"]) == 1
        assert gc.heartbeat(G, a, None, 1) == E.unknown_member_id
        # A client that gives up on its parked JoinGroup leaves nothing behind.
        with pytest.raises(JoinError) as e:
            await join("", "c")
        task = asyncio.ensure_future(join(e.value.member_id, "c"))  # waits for b
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert gc._parked == {}
        gc.unload(lambda _: True)
        assert gc._timers == {} and gc.groups == {}

    asyncio.run(run())


def test_group_settings_are_declared_once_in_broker_config() -> None:
    """BrokerConfig declares the group settings (Kafka name, flag, default): the state
    machines' defaults are those, and a broker's values reach them."""
    declared = BrokerConfig()
    assert GroupSettings.from_config(declared) == GroupSettings()
    assert (GroupSettings().min_session_timeout_ms, GroupSettings().max_session_timeout_ms) == (
        declared.group_min_session_timeout_ms,
        declared.group_max_session_timeout_ms,
    )
    assert ShareSettings() == ShareSettings(
        session_timeout_ms=declared.group_share_session_timeout_ms,
        heartbeat_interval_ms=declared.group_share_heartbeat_interval_ms,
    )
    given = BrokerConfig(
        group_min_session_timeout_ms=11,
        group_max_session_timeout_ms=22,
        group_initial_rebalance_delay_ms=33,
        group_consumer_session_timeout_ms=44,
        group_consumer_heartbeat_interval_ms=55,
    )
    assert GroupSettings.from_config(given) == dataclasses.replace(
        GroupSettings(),
        min_session_timeout_ms=11,
        max_session_timeout_ms=22,
        initial_rebalance_delay_ms=33,
        consumer_session_timeout_ms=44,
        consumer_heartbeat_interval_ms=55,
    )
