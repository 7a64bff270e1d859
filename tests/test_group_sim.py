"""Seeded simulation of a classic consumer group: the real GroupStateMachine, driven by
simulated clients that follow the classic consumer protocol the way the Kafka clients do
(MEMBER_ID_REQUIRED round trip, JoinGroup, the leader's range assignment in SyncGroup,
heartbeats, rejoin on REBALANCE_IN_PROGRESS, reset on UNKNOWN_MEMBER_ID /
ILLEGAL_GENERATION, stop on FENCED_INSTANCE_ID), in 100 ms steps. Chaos first: clients
arrive, leave, crash, freeze past their session, change subscription, and static members
restart under the same group.instance.id; then a quiet period.

Checked after every step:
- every parked request is answered at most once, and the shell's timers equal the
  machine's (as in test_group_state_machine.py);
- group.instance.id -> member id is one to one and only names members;
- members the coordinator holds, synced into the current generation, own disjoint
  partitions;
- a client fenced by another incarnation of its instance id is no member any more.
After the quiet period (every client well-behaved for longer than the rebalance and
session timeouts): the group is Stable, its members are exactly the running clients,
each holds the current generation, and together they own every partition once.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from kio.schema.errors import ErrorCode as E
from straitmq.broker.groups.classic_group import STABLE
from straitmq.broker.groups.messages import (
    JoinRequest,
    JoinResponse,
    SyncRequest,
    SyncResponse,
    TimerCancel,
    TimerKey,
    TimerSet,
)
from straitmq.broker.groups.state_machine import GroupSettings, GroupStateMachine

STEP = 100
SESSION = 3_000
REBALANCE = 5_000
HEARTBEAT = 1_000
PARTITIONS = 12
G = "sim"
SETTINGS = GroupSettings(
    min_session_timeout_ms=1_000,
    max_session_timeout_ms=60_000,
    initial_rebalance_delay_ms=300,
    max_size=50,
    new_member_join_timeout_ms=20_000,
)


class NoOffsets:
    def has_group(self, group_id: str) -> bool:
        return False

    def group_ids(self) -> list[str]:
        return []


@dataclass
class Client:
    name: str
    instance: str | None
    topics: bytes = b"t"  # its subscription, carried as protocol metadata
    member_id: str = ""
    generation: int = -1
    phase: str = "join"  # join | joining | syncing | stable | stopped
    handle: int | None = None  # the request it waits on
    sent_at: int = 0
    next_heartbeat: int = 0
    frozen_until: int = 0  # a paused process: sends nothing until then
    owned: frozenset[int] = frozenset()
    # A JoinGroup/SyncGroup gets no answer within this long: the client gives up on it.
    request_timeout: int = REBALANCE + 5_000

    @property
    def running(self) -> bool:
        return self.phase != "stopped"


@dataclass
class Sim:
    rng: random.Random
    m: GroupStateMachine = field(init=False)
    now: int = 0
    clients: list[Client] = field(default_factory=list)
    answers: dict[int, JoinResponse | SyncResponse] = field(default_factory=dict)
    shell_timers: dict[TimerKey, int] = field(default_factory=dict)
    issued: int = 0
    fenced_ids: set[str] = field(default_factory=set)
    names: int = 0

    def __post_init__(self) -> None:
        self.m = GroupStateMachine(SETTINGS, NoOffsets(), random.Random(self.rng.random()))

    # -- the shell -----------------------------------------------------------------------

    def collect(self) -> None:
        out = self.m.take_output()
        for r in out.replies:
            assert 0 < r.handle <= self.issued, f"answer to a handle never issued: {r}"
            assert r.handle not in self.answers, f"handle {r.handle} answered twice"
            self.answers[r.handle] = r.response
        for t in out.timers:
            if isinstance(t, TimerSet):
                self.shell_timers[t.key] = t.deadline_ms
            else:
                assert isinstance(t, TimerCancel)
                self.shell_timers.pop(t.key, None)
        assert self.shell_timers == self.m.timers()

    def fire_timers(self, until: int) -> None:
        while True:
            due = [(d, i, k) for i, (k, d) in enumerate(self.shell_timers.items()) if d <= until]
            if not due:
                return
            d, _, key = min(due, key=lambda x: (x[0], x[1]))
            del self.shell_timers[key]
            self.m.expire(key, max(d, self.now))
            self.collect()

    def handle(self) -> int:
        self.issued += 1
        return self.issued

    # -- a client ------------------------------------------------------------------------

    def add_client(self, instance: str | None = None) -> Client:
        self.names += 1
        c = Client(f"c{self.names}", instance)
        self.clients.append(c)
        return c

    def send_join(self, c: Client) -> None:
        h = self.handle()
        req = JoinRequest(
            G,
            c.member_id,
            c.instance,
            c.name,
            "sim",
            SESSION,
            REBALANCE,
            "consumer",
            (("range", c.topics),),
            True,
            self.rng.random() < 0.5,
        )
        c.handle, c.sent_at, c.phase = h, self.now, "joining"
        self.m.join(h, req, self.now)
        self.collect()

    def send_sync(self, c: Client, resp: JoinResponse) -> None:
        assignments: dict[str, bytes] = {}
        if resp.leader == c.member_id and not resp.skip_assignment:
            ids = sorted(m["member_id"] for m in resp.members)
            for i, mid in enumerate(ids):  # round robin over the sorted member ids
                assignments[mid] = bytes(p for p in range(PARTITIONS) if p % len(ids) == i)
        h = self.handle()
        c.handle, c.sent_at, c.phase = h, self.now, "syncing"
        req = SyncRequest(G, c.member_id, c.instance, c.generation, assignments)
        self.m.sync(h, req, self.now)
        self.collect()

    def reset(self, c: Client) -> None:
        c.member_id, c.generation, c.owned, c.phase = "", -1, frozenset(), "join"

    def stop(self, c: Client) -> None:
        if c.member_id:
            self.fenced_ids.add(c.member_id)
        c.phase, c.owned, c.handle = "stopped", frozenset(), None

    def react(self, c: Client, code: int) -> None:
        """What a Kafka consumer does with an error from any group request."""
        if code == E.fenced_instance_id:
            self.stop(c)
        elif code in (E.unknown_member_id, E.illegal_generation):
            self.reset(c)
        else:
            assert code == E.rebalance_in_progress, f"{c.name}: unexpected error {code!r}"
            c.owned, c.phase = frozenset(), "join"

    def step_client(self, c: Client) -> None:
        if not c.running or self.now < c.frozen_until:
            return
        if c.phase == "join":
            return self.send_join(c)
        if c.phase in ("joining", "syncing"):
            assert c.handle is not None
            resp = self.answers.get(c.handle)
            if resp is None:
                if self.now - c.sent_at > c.request_timeout:
                    c.phase = "join"  # give up on it, ask again
                return
            if isinstance(resp, JoinResponse):
                if resp.error == E.member_id_required:
                    c.member_id = resp.member_id
                    return self.send_join(c)
                if resp.error:
                    return self.react(c, resp.error)
                c.member_id, c.generation = resp.member_id, resp.generation
                return self.send_sync(c, resp)
            if resp.error:
                return self.react(c, resp.error)
            c.owned, c.phase = frozenset(resp.assignment), "stable"
            c.next_heartbeat = self.now + HEARTBEAT
            return
        if c.phase == "stable" and self.now >= c.next_heartbeat:
            code = self.m.heartbeat(G, c.member_id, c.instance, c.generation, self.now)
            self.collect()
            c.next_heartbeat = self.now + HEARTBEAT
            if code:
                self.react(c, code)

    # -- chaos ---------------------------------------------------------------------------

    def chaos(self) -> None:
        r = self.rng.random()
        live = [c for c in self.clients if c.running]
        if r < 0.01 and len(live) < 8:
            self.add_client(self.rng.choice([None, None, f"i{self.rng.randrange(4)}"]))
        elif r < 0.015 and live:  # a clean leave
            c = self.rng.choice(live)
            if c.member_id:
                self.m.leave(G, [(c.member_id, c.instance)], self.now)
                self.collect()
            c.phase, c.owned = "stopped", frozenset()
        elif r < 0.02 and live:  # a crash; a static member comes back with a new process
            c = self.rng.choice(live)
            c.phase, c.owned = "stopped", frozenset()
            if c.instance is not None:
                self.clients.append(Client(c.name + "'", c.instance))
        elif r < 0.025 and live:  # a pause longer than the session
            self.rng.choice(live).frozen_until = self.now + SESSION + 1_000
        elif r < 0.03 and live:  # a new subscription: rejoin with new metadata
            c = self.rng.choice(live)
            if c.phase == "stable":
                c.topics = bytes([self.rng.randrange(256)])
                c.phase = "join"

    # -- invariants ----------------------------------------------------------------------

    def check(self) -> None:
        group = self.m.groups.get(G)
        if group is None:
            return
        assert sorted(group.static.values()) == sorted(
            m.member_id for m in group.members.values() if m.instance_id is not None
        ), "instance ids and static members disagree"
        for inst, mid in group.static.items():
            assert group.members[mid].instance_id == inst
        owners: dict[int, str] = {}
        for c in self.clients:
            if (
                c.phase == "stable"
                and c.member_id in group.members
                and c.generation == group.generation
            ):
                for p in c.owned:
                    assert p not in owners, f"p{p} owned by {owners[p]} and {c.name}"
                    owners[p] = c.name
        # A client is fenced because another took its instance id: its id is gone.
        assert not self.fenced_ids & set(group.members), "a fenced member id is still in"

    # -- running -------------------------------------------------------------------------

    def run(self, chaos_ms: int, quiet_ms: int) -> None:
        for _ in range(3):
            self.add_client(self.rng.choice([None, "i0"]))
        end = chaos_ms + quiet_ms
        while self.now < end:
            self.now += STEP
            self.fire_timers(self.now)
            if self.now < chaos_ms:
                self.chaos()
            for c in self.rng.sample(self.clients, len(self.clients)):
                self.step_client(c)
            self.check()


@pytest.mark.parametrize("seed", range(60))
def test_group_converges_and_never_double_assigns(seed: int) -> None:
    sim = Sim(random.Random(seed))
    chaos = 60_000
    quiet = 4 * (REBALANCE + SESSION)
    sim.run(chaos, quiet)
    running = [c for c in sim.clients if c.running]
    group = sim.m.groups[G]
    detail = f"seed {seed}: {group.state} members={list(group.members)} clients={running}"
    assert group.state == STABLE or not running, detail
    assert sorted(group.members) == sorted(c.member_id for c in running), detail
    assert all(c.phase == "stable" and c.generation == group.generation for c in running), detail
    owned = sorted(p for c in running for p in c.owned)
    assert owned == (list(range(PARTITIONS)) if running else []), detail
