"""Deterministic simulation of broker fencing: the session timeout and the fast path.

The controller side is the real `BrokerSessions` state machine, the real metadata image
and the real election functions, driven the way `ActiveController` drives them; the
brokers, their session streams, heartbeats and the controller's connection probes are
simulated on a seeded schedule in 50 ms steps. Brokers are killed (their stream closes a
moment later, their port refuses), frozen (SIGSTOP: sockets and port stay), cut off (a
probe times out), lose their stream while alive (a proxy reset), and restart with a new
incarnation; the active controller fails over.

Checked after every step:
- no broker that is still running is fenced before its session timeout ran out since the
  last heartbeat the controller received from it (so a merely slow or cut-off broker keeps
  its leaderships exactly as long as without the fast path);
- hence no second leader while a running leader still holds a valid session: every stale
  leader (frozen or cut off, its view older than the image) was fenced by expiry;
- no partition is led by a fenced broker;
- a killed broker whose stream was open and armed is fenced within a few steps while the
  controller stays active, and every dead broker within the session timeout.
"""

from __future__ import annotations

import copy
import random
import uuid
from dataclasses import dataclass, field

from straitmq.controller.election import on_broker_leaving, on_broker_returning
from straitmq.controller.sessions import GRACE_S, BrokerSessions
from straitmq.metadata.image import NO_LEADER, MetadataImage

STEP = 0.05
TIMEOUT = 9.0  # broker.session.timeout.ms default
HEARTBEAT = 2.0  # broker.heartbeat.interval.ms default
BROKERS = (1, 2, 3)
PARTITIONS = 6
FAST_BOUND = 0.5  # stream close ≤ 0.1 s + probe ≤ 0.15 s, in steps of 50 ms


@dataclass
class SimBroker:
    id: int
    incarnation: str
    state: str = "up"  # up, frozen, cut, dead
    until: float = 0.0  # end of a freeze or cut; restart time when dead
    next_heartbeat: float = 0.0
    stream_open: bool = False  # as the controller sees it
    reopen_at: float = 0.0
    view: MetadataImage | None = None  # a frozen or cut broker's stale image
    killed_at: float | None = None
    stream_at_kill: bool = False


@dataclass
class Sim:
    seed: int
    rng: random.Random = field(init=False)
    now: float = 0.0
    image: MetadataImage = field(default_factory=MetadataImage)
    sessions: BrokerSessions = field(default_factory=lambda: BrokerSessions(TIMEOUT))
    brokers: dict[int, SimBroker] = field(default_factory=dict)
    active: bool = True
    active_again_at: float = 0.0
    active_since: float = 0.0
    last_heard: dict[str, float] = field(default_factory=dict)  # incarnation -> time
    inflight: list[tuple[float, str, int, str]] = field(default_factory=list)
    fenced_by: dict[str, str] = field(default_factory=dict)  # incarnation -> reason
    fast_fences: int = 0
    expiry_fences: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        for bid in BROKERS:
            b = SimBroker(bid, self._new_incarnation())
            self.brokers[bid] = b
            self._apply(
                [
                    {
                        "type": "register_broker",
                        "id": bid,
                        "incarnation": b.incarnation,
                        "host": "h",
                        "port": 9092,
                        "http_port": 8080,
                    },
                    {"type": "unfence_broker", "id": bid},
                ]
            )
            self.sessions.touch(bid, b.incarnation, 0.0)
            self.last_heard[b.incarnation] = 0.0
            b.next_heartbeat = self.rng.uniform(0, HEARTBEAT)
        self._apply([{"type": "topic", "name": "t", "topic_id": str(uuid.uuid4())}])
        for i in range(PARTITIONS):
            replicas = [BROKERS[(i + k) % 3] for k in range(3)]
            self._apply(
                [
                    {
                        "type": "partition",
                        "topic": "t",
                        "index": i,
                        "replicas": replicas,
                        "isr": list(replicas),
                        "leader": replicas[0],
                    }
                ]
            )

    def _new_incarnation(self) -> str:
        return f"inc-{self.rng.getrandbits(32):08x}"

    def _apply(self, records: list[dict]) -> None:
        for r in records:
            self.image.apply(r)

    # -- the controller, as ActiveController drives BrokerSessions ----------------------

    def fence(self, bid: int, incarnation: str, reason: str) -> None:
        b = self.image.brokers[bid]
        if b.fenced or b.incarnation != incarnation:
            return
        heard = self.last_heard[incarnation]
        sim_b = self.brokers[bid]
        running = sim_b.incarnation == incarnation and sim_b.state != "dead"
        assert not running or self.now - heard >= TIMEOUT - 1e-9, (
            f"seed {self.seed} t={self.now:.2f}: broker {bid} is running ({sim_b.state}) and "
            f"was heard {self.now - heard:.2f}s ago, but was fenced ({reason}) before its "
            f"session timeout of {TIMEOUT}s"
        )
        self._apply([{"type": "fence_broker", "id": bid}, *on_broker_leaving(self.image, bid)])
        self.fenced_by[incarnation] = reason
        if reason == "fast":
            self.fast_fences += 1
        else:
            self.expiry_fences += 1

    def heartbeat(self, bid: int, incarnation: str) -> None:
        b = self.image.brokers[bid]
        if b.incarnation != incarnation:
            return  # stale: it registers again (modelled by a restart)
        self.sessions.touch(bid, incarnation, self.now)
        self.last_heard[incarnation] = self.now
        if b.fenced:  # caught up by now: unfenced, leaderships and ISR come back
            self._apply(
                [{"type": "unfence_broker", "id": bid}, *on_broker_returning(self.image, bid)]
            )
            for i, p in enumerate(self.image.topics["t"].partitions):
                if bid in p.replicas and bid not in p.isr and p.leader != NO_LEADER:
                    self._apply(
                        [
                            {
                                "type": "partition_change",
                                "topic": "t",
                                "index": i,
                                "isr": [*p.isr, bid],
                            }
                        ]
                    )

    def probe(self, bid: int, incarnation: str) -> None:
        self.inflight.append(
            (self.now + self.rng.choice((0.0, 0.05, 0.1, 0.15)), "probe", bid, incarnation)
        )

    def stream_closed(self, bid: int, incarnation: str) -> None:
        if self.active and self.sessions.stream_closed(bid, incarnation):
            self.probe(bid, incarnation)

    def controller_step(self) -> None:
        if not self.active:
            if self.now < self.active_again_at:
                return
            self.active, self.active_since = True, self.now
            incs = {b.id: b.incarnation for b in self.image.brokers.values()}
            for bid in self.sessions.reset(incs, self.now):
                if not self.image.brokers[bid].fenced:
                    self.probe(bid, incs[bid])
        for bid in self.sessions.expired(self.now):
            self.fence(bid, self.image.brokers[bid].incarnation, "expired")

    # -- the world ----------------------------------------------------------------------

    def deliver(self) -> None:
        due = [m for m in self.inflight if m[0] <= self.now]
        self.inflight = [m for m in self.inflight if m[0] > self.now]
        for _, kind, bid, inc in due:
            b = self.brokers[bid]
            if kind == "heartbeat":
                if self.active:
                    self.heartbeat(bid, inc)
            elif kind == "stream_closed":
                self.stream_closed(bid, inc)
            elif kind == "probe" and self.active:
                # Refused only if nothing runs there: a frozen process's kernel still
                # accepts, a cut-off one times out, a restarted one listens again.
                if b.state in ("up", "frozen") or (b.state == "dead" and b.incarnation != inc):
                    self.sessions.probe_connected(bid, inc)
                elif b.state == "dead":
                    if self.sessions.needs_grace(bid):
                        self.inflight.append((self.now + GRACE_S, "recheck", bid, inc))
                    elif self.sessions.probe_refused(bid, inc):
                        self.fence(bid, inc, "fast")
            elif kind == "recheck" and self.active and self.sessions.probe_refused(bid, inc):
                self.fence(bid, inc, "fast")

    def broker_step(self, b: SimBroker) -> None:
        r = self.rng.random()
        if b.state == "dead":
            if self.now >= b.until:  # restart: a new incarnation registers
                b.state, b.incarnation, b.stream_open = "up", self._new_incarnation(), False
                b.killed_at, b.view = None, None
                old = self.image.brokers[b.id]
                self._apply(
                    [
                        {
                            "type": "register_broker",
                            "id": b.id,
                            "incarnation": b.incarnation,
                            "host": old.host,
                            "port": old.port,
                            "http_port": old.http_port,
                        },
                        *on_broker_leaving(self.image, b.id),
                    ]
                )
                self.sessions.touch(b.id, b.incarnation, self.now)
                self.last_heard[b.incarnation] = self.now
                b.next_heartbeat = self.now
                b.reopen_at = self.now + STEP
            return
        if r < 0.002:  # kill -9, whatever state it was in
            # The fast path is armed once its port was seen accepting (a probe when its
            # stream opened); killed before that, it waits for the session timeout.
            b.stream_at_kill = b.stream_open and self.active and not self.sessions.needs_grace(b.id)
            b.state, b.killed_at, b.until = "dead", self.now, self.now + self.rng.uniform(0.5, 12)
            if b.stream_open:  # the kernel closes its socket; the FIN arrives shortly
                b.stream_open = False
                self.inflight.append(
                    (
                        self.now + self.rng.choice((0.0, 0.05, 0.1)),
                        "stream_closed",
                        b.id,
                        b.incarnation,
                    )
                )
            return
        if b.state in ("frozen", "cut"):
            if self.now >= b.until:
                b.state, b.view = "up", None
            return
        if r < 0.003:
            b.state, b.until = "frozen", self.now + self.rng.uniform(0.3, 2.5) * TIMEOUT
            b.view = copy.deepcopy(self.image)
            return
        if r < 0.004:
            b.state, b.until = "cut", self.now + self.rng.uniform(0.3, 2.5) * TIMEOUT
            b.view = copy.deepcopy(self.image)
            return
        if r < 0.006 and b.stream_open:  # a middlebox resets the stream; the broker lives
            b.stream_open = False
            b.reopen_at = self.now + self.rng.uniform(0.1, 1.0)
            self.stream_closed(b.id, b.incarnation)
            return
        if self.now >= b.next_heartbeat:
            b.next_heartbeat = self.now + HEARTBEAT
            self.inflight.append(
                (self.now + self.rng.choice((0.0, 0.05, 0.1)), "heartbeat", b.id, b.incarnation)
            )
        if not b.stream_open and self.active and self.now >= b.reopen_at:
            arm = self.sessions.stream_opened(b.id, b.incarnation)
            if arm is None:
                b.reopen_at = self.now + 0.2
            else:
                b.stream_open = True
                if arm:
                    self.probe(b.id, b.incarnation)

    def world_step(self) -> None:
        if self.active and self.rng.random() < 0.0005:  # the active controller fails over
            self.active = False
            self.active_again_at = self.now + self.rng.uniform(0.5, 1.5)
            for b in self.brokers.values():
                b.stream_open, b.reopen_at = False, self.active_again_at + 0.1
        for bid in BROKERS:
            self.broker_step(self.brokers[bid])

    # -- invariants -----------------------------------------------------------------------

    def check(self) -> None:
        where = f"seed {self.seed} t={self.now:.2f}"
        for i, p in enumerate(self.image.topics["t"].partitions):
            if p.leader != NO_LEADER:
                assert not self.image.brokers[p.leader].fenced, (
                    f"{where}: partition {i} led by fenced broker {p.leader}"
                )
            for b in self.brokers.values():
                if b.view is None or b.state == "dead":
                    continue
                stale = b.view.topics["t"].partitions[i]
                if stale.leader == b.id and p.leader != b.id:
                    # A stale leader beside the real one: only after its session ran out.
                    assert self.fenced_by.get(b.incarnation) == "expired" or (
                        self.image.brokers[b.id].incarnation != b.incarnation
                    ), f"{where}: broker {b.id} still leads partition {i} in its own view"
        for b in self.brokers.values():
            if b.state != "dead" or b.killed_at is None:
                continue
            fenced = self.image.brokers[b.id].fenced
            waited = self.now - b.killed_at
            if b.stream_at_kill and self.active and self.active_since <= b.killed_at:
                assert fenced or waited < FAST_BOUND, (
                    f"{where}: broker {b.id} killed {waited:.2f}s ago with its stream open "
                    "and is not fenced yet"
                )
            since = max(b.killed_at, self.active_since)
            if self.active and self.now - since > TIMEOUT + FAST_BOUND:
                assert fenced, f"{where}: broker {b.id} dead since {b.killed_at:.2f}, unfenced"

    def run(self, seconds: float) -> None:
        for _ in range(int(seconds / STEP)):
            self.now += STEP
            self.world_step()
            self.deliver()
            self.controller_step()
            self.check()


def test_fencing_is_safe_and_fast() -> None:
    totals = {"fast": 0, "expired": 0}
    for seed in range(40):
        sim = Sim(seed)
        sim.run(150.0)
        totals["fast"] += sim.fast_fences
        totals["expired"] += sim.expiry_fences
    # The schedules exercised both ways of being fenced (else they prove little).
    assert totals["fast"] > 20 and totals["expired"] > 5, totals
