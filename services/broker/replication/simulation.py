"""A deterministic simulation of one partition's replicas and the controller's decisions.

The replicas are the broker's own replication core (`core.ReplicaCore`,
`core.truncation_offset`), its leader epoch cache (`storage.epochs.LeaderEpochCache`,
kept in memory) and its producer state (`producer_state.ProducerStateTable`) over an
in-memory log; the controller is a real `MetadataImage` changed by the controller's own
decisions (`election.on_broker_leaving` / `on_broker_returning`, `operations.
alter_partition` and `reassign`). What the asyncio shells do around the core (the
Produce and Fetch handlers, the replica fetcher, ISR upkeep, applying the metadata) is
modelled here in a few lines each, in the same order.

Faults, all drawn from the seed: crashes that lose what was not fsynced (fsync is off, as
by default: each broker flushes now and then, a slow disk rarely), restarts, paused
processes (SIGSTOP: fenced after the session timeout, then back with their memory),
network partitions between any pair of processes (the controller included), lost
messages, reassignment, clean and (where the topic allows it) unclean elections.
Producers: an idempotent one (acks=all or 1) retrying its batch until answered, and a
plain one with acks 0, 1 and all.

Invariants, checked after every step (a failure names the seed and the command that
replays it, `python -m bench.replication_sim --seed N`):
- what any replica holds below its high watermark is what every other one holds there
  (a consumer never reads an offset twice with different data);
- the current leader holds every record ever seen below a high watermark, and so every
  acknowledged acks=all write, unless an unclean election happened or every in-sync
  replica lost the record in crashes (fsync off: the loss the settings accept);
- a leader's high watermark never moves back within its leader epoch;
- a replica joins the ISR only holding everything below the leader's high watermark;
- no producer sequence is written twice below the high watermark.
"""

from __future__ import annotations

import heapq
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode
from straitmq.controller.election import on_broker_leaving, on_broker_returning
from straitmq.controller.operations import alter_partition, reassign
from straitmq.metadata.image import NO_LEADER, MetadataImage, PartitionImage, Record

from straitmq.errors import KafkaError

from ..producer_state import DuplicateBatch, ProducerStateTable, SequenceError
from ..records import BatchInfo
from ..storage.epochs import LeaderEpochCache
from .core import FOLLOWER, LEADER, UNDEFINED, ReplicaCore, diverging_epoch, truncation_offset

TOPIC = "t"
CONTROLLER = -1  # the controller's address on the simulated network
TICK = 0.005  # seconds of simulated time per step
LAG_S = 0.15  # replica.lag.time.max.ms
ISR_CHECK_S = 0.03
SESSION_S = 0.3  # broker session timeout at the controller
HEARTBEAT_S = 0.05
SESSION_CHECK_S = 0.025
METADATA_RESEND_S = 0.1
REQUEST_TIMEOUT_S = 0.25
ACKS_ALL_TIMEOUT_S = 0.5
FETCH_MAX = 4  # records per fetch answer


class SimulationFailure(AssertionError):
    pass


class MemoryEpochs(LeaderEpochCache):
    """The broker's leader epoch cache without its checkpoint file (the simulated log is
    rebuilt from its records after a crash, as PartitionLog rebuilds a lost checkpoint)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("")

    def _write(self) -> None:
        self.dirty = False


# A record: (leader epoch, value); a value is (producer id, epoch, sequence, payload) for
# an idempotent write, (-1, -1, -1, payload) otherwise.
Value = tuple[int, int, int, str]
Entry = tuple[int, Value]


class MemoryLog:
    """A partition log in memory: records, how many of them are fsynced, the epoch cache
    and the producer state, as PartitionLog keeps them."""

    __slots__ = ("entries", "epochs", "producers", "synced", "values")

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self.values: list[Value] = []  # the entries' values: what the checks compare
        self.synced = 0
        self.epochs = MemoryEpochs()
        self.producers = ProducerStateTable()

    @property
    def log_end_offset(self) -> int:
        return len(self.entries)

    def append(self, entry: Entry) -> int:
        offset = len(self.entries)
        epoch = entry[0]
        if epoch > self.epochs.latest_epoch:
            self.epochs.assign(epoch, offset)
        self.entries.append(entry)
        self.values.append(entry[1])
        self.producers.record(_batch(offset, entry))
        return offset

    def truncate_to(self, offset: int) -> None:
        del self.entries[offset:]
        del self.values[offset:]
        self.synced = min(self.synced, offset)
        self.epochs.truncate_from_end(offset)
        self._rebuild_producers()

    def crash(self) -> None:
        """Lose what was not fsynced; epochs and producer state come back from the log."""
        del self.entries[self.synced :]
        del self.values[self.synced :]
        entries: list[tuple[int, int]] = []
        for offset, (epoch, _) in enumerate(self.entries):
            if not entries or entries[-1][0] != epoch:
                entries.append((epoch, offset))
        self.epochs.replace(entries)
        self._rebuild_producers()

    def _rebuild_producers(self) -> None:
        self.producers = ProducerStateTable()
        for offset, entry in enumerate(self.entries):
            self.producers.record(_batch(offset, entry))


def _batch(offset: int, entry: Entry) -> BatchInfo:
    pid, pepoch, seq, _ = entry[1]
    return BatchInfo(0, 0, offset, 0, 0, pid, pepoch, seq, 1, 0)


@dataclass(slots=True)
class Broker:
    id: int
    up: bool = True
    paused_until: float = 0.0
    slow_disk: bool = False
    log: MemoryLog | None = None  # None: holds no replica
    core: ReplicaCore | None = None
    # follower side
    truncating: bool = False
    inflight_until: float = 0.0  # a fetch or OffsetForLeaderEpoch is out until then
    fetch_from: float = 0.0  # its replica fetchers run from then on
    metadata_epoch: int = -1  # the partition epoch of the metadata it applied last
    # Its high watermark may cover records an unclean election or a crash of every
    # in-sync replica lost: not checked until it truncated to, or leads, a history of at
    # least this leader epoch (-1: not stale).
    stale_epoch: int = -1
    checked: tuple[int, int, int, int] = (-1, -1, -1, -1)  # what the last check saw
    # leader side
    # end, client, req, deadline, the value written (what its answer vouches for)
    waiters: list[tuple[int, int, int, float, Any]] = field(default_factory=list)
    # acks=all answers whose wait has not started yet (the Produce handler's Deferred
    # runs later): due, end, client, req, the leader epoch of the write, the value
    deferred: list[tuple[float, int, int, int, int, Any]] = field(default_factory=list)
    alter_until: float = 0.0
    next_isr_check: float = 0.0
    next_heartbeat: float = 0.0
    incarnation: int = 0  # its process: each restart registers anew


@dataclass(slots=True)
class Client:
    id: int
    idempotent: bool
    producer_id: int
    acks_choices: tuple[int, ...]
    producer_epoch: int = 0
    seq: int = 0
    inflight: tuple[int, int, str, float] | None = None  # req id, acks, payload, deadline
    sent: int = 0


class Simulation:
    """One seeded run. `run()` returns counts of what happened; a broken invariant raises
    SimulationFailure naming the seed."""

    def __init__(self, seed: int, steps: int = 160, brokers: int = 4) -> None:
        self.seed = seed
        self.steps = steps
        self.rng = rng = random.Random(seed)
        self.now = 0.0
        self.replay = f"python -m bench.replication_sim --seed {seed}"
        self.stats = dict.fromkeys(
            (
                "crashes",
                "pauses",
                "partitions",
                "elections",
                "unclean",
                "isr_changes",
                "reassignments",
                "truncations",
                "acked_all",
                "produced",
                "excused",
            ),
            0,
        )
        # Odd seeds: followers truncate on the leader's Fetch answer alone (KIP-320, as
        # Kafka's do with a Fetch v12+ leader); even seeds: OffsetForLeaderEpoch first,
        # as the broker's replica fetcher does. Not drawn: the other draws stay as they were.
        self.truncate_on_fetch = seed % 2 == 1
        # Seeds 2-3 of every 4: an acks=all wait starts a little after its append, as the
        # listener runs a Produce's answer in a task of its own; meanwhile the leadership
        # may move (and come back). Drawn from a generator of its own, so the other draws
        # stay as they were.
        self.defer_waits = (seed // 2) % 2 == 1
        self.defer_rng = random.Random(seed * 7919 + 1)
        self.min_isr = rng.choice((1, 2, 2))
        self.unclean_allowed = rng.random() < 0.25
        self.p_crash = rng.choice((0.0, 0.006, 0.015))
        self.p_pause = rng.choice((0.0, 0.006))
        self.p_restart = rng.choice((0.02, 0.1))  # per step: fast restarts too
        self.p_rejoin_crash = rng.choice((0.0, 0.05))
        self.p_cut = rng.choice((0.0, 0.01, 0.02))
        self.p_loss = rng.choice((0.0, 0.02))
        self.p_reassign = rng.choice((0.0, 0.0, 0.006))
        self.p_produce = rng.choice((0.2, 0.5))
        self.brokers = {b: Broker(b, slow_disk=rng.random() < 0.3) for b in range(brokers)}
        self.cut: set[frozenset[int]] = set()
        self.queue: list[tuple[float, int, int, int, str, Any]] = []
        self._seq = 0
        self.req_ids = 0
        self.clients = [
            Client(0, True, 1000, rng.choice(((-1,), (-1, 1)))),
            Client(1, False, -1, (0, 1, -1)),
        ]
        self.last_heartbeat = dict.fromkeys(self.brokers, 0.0)
        self.next_metadata = 0.0
        self.next_session_check = 0.0
        # What the invariants remember.
        self.committed: list[tuple[int, int, int, str]] = []  # values below some HW
        self.acked: dict[int, tuple[int, int, int, str]] = {}  # offset -> acks=all value
        self.leader_hw: dict[tuple[int, int], int] = {}  # (broker, leader epoch) -> HW
        self._sequences: set[tuple[int, int, int]] = set()  # idempotent writes committed
        self.loss_possible = False  # a crash or an ISR change since the last check
        # The controller.
        self.image = img = MetadataImage()
        for b in self.brokers:
            img.apply(
                {"type": "register_broker", "id": b, "incarnation": "0", "host": "h"}
                | {"port": 9092 + b, "http_port": 0}
            )
            img.apply({"type": "unfence_broker", "id": b})
        configs = {"unclean.leader.election.enable": "true"} if self.unclean_allowed else {}
        img.apply(
            {
                "type": "topic",
                "name": TOPIC,
                "topic_id": str(uuid.UUID(int=seed)),
                "configs": configs,
            }
        )
        first = [0, 1, 2]
        img.apply(
            {"type": "partition", "topic": TOPIC, "index": 0, "replicas": first}
            | {"isr": first, "leader": 0}
        )

    # -- the run ---------------------------------------------------------------------

    def run(self) -> dict[str, int]:
        self._publish()
        for _ in range(self.steps):
            self.step(faults=True)
        # Heal everything and let it settle: the checks go on meanwhile.
        self.cut.clear()
        for b in self.brokers.values():
            b.paused_until = 0.0
            if not b.up:
                self._restart(b)
        for _ in range(60):
            self.step(faults=False)
        return self.stats

    def step(self, faults: bool) -> None:
        self.now += TICK
        if faults:
            self._faults()
        self._deliver()
        for b in self.brokers.values():
            if b.up and b.paused_until <= self.now:
                self._tick_broker(b)
        self._tick_controller()
        for c in self.clients:
            self._tick_client(c, faults)
        self._check()

    def fail(self, what: str, **facts: object) -> None:
        shown = ", ".join(f"{k}={v!r}" for k, v in facts.items())
        raise SimulationFailure(
            f"seed {self.seed} at t={self.now:.3f}s: {what} ({shown}) [replay: {self.replay}]"
        )

    # -- the network -----------------------------------------------------------------

    def send(self, src: int, dst: int, kind: str, body: Any) -> None:
        if self.p_loss and self.rng.random() < self.p_loss:
            return
        self._seq += 1
        delay = 0.001 + self.rng.random() * 0.004
        heapq.heappush(self.queue, (self.now + delay, self._seq, src, dst, kind, body))

    def _deliver(self) -> None:
        q = self.queue
        later = []
        while q and q[0][0] <= self.now:
            item = heapq.heappop(q)
            _, _, src, dst, kind, body = item
            if frozenset((src, dst)) in self.cut:
                continue
            if dst == CONTROLLER:
                self._controller_receive(src, kind, body)
                continue
            if dst < 0:  # a client
                self._client_receive(-dst - 2, kind, body)
                continue
            b = self.brokers[dst]
            if not b.up:
                continue
            if b.paused_until > self.now:
                later.append(item)  # read once the process runs again
                continue
            self._broker_receive(b, src, kind, body)
        for _, _, src, dst, kind, body in later:
            self._seq += 1
            at = self.brokers[dst].paused_until
            heapq.heappush(q, (at, self._seq, src, dst, kind, body))

    # -- faults ----------------------------------------------------------------------

    def _faults(self) -> None:
        rng = self.rng
        if rng.random() < self.p_crash:
            b = self.brokers[rng.randrange(len(self.brokers))]
            if b.up:
                self._crash(b)
        if rng.random() < self.p_rejoin_crash:
            # Aimed: a follower just caught up and not back in the ISR yet, which the
            # leader is about to add on what it fetched (KIP-903's case: restarted, it
            # lost its unflushed tail; the leader must not add it on the old fetches).
            aimed = self._rejoining()
            if aimed is not None:
                self._crash(aimed)
        for b in self.brokers.values():
            if not b.up and rng.random() < self.p_restart:
                self._restart(b)
        if rng.random() < self.p_pause:
            b = self.brokers[rng.randrange(len(self.brokers))]
            if b.up and b.paused_until <= self.now:
                b.paused_until = self.now + rng.choice((0.1, 0.4, 0.8))
                self.stats["pauses"] += 1
        if rng.random() < self.p_cut:
            ends = [CONTROLLER, *self.brokers]
            a, z = rng.sample(ends, 2)
            self.cut.add(frozenset((a, z)))
            self.stats["partitions"] += 1
        if self.cut and rng.random() < 0.03:
            self.cut.discard(rng.choice(sorted(self.cut, key=sorted)))
        if rng.random() < self.p_reassign:
            target = rng.sample(sorted(self.brokers), 3)
            try:
                recs = reassign(self.image, TOPIC, 0, target)
            except KafkaError:
                recs = []
            if recs:
                self.stats["reassignments"] += 1
                self._commit(recs)

    def _rejoining(self) -> Broker | None:
        leader = self.brokers.get(self._partition().leader)
        core = leader.core if leader is not None and leader.up else None
        if core is None or core.role != LEADER:
            return None
        for r, f in core.followers.items():
            b = self.brokers[r]
            if r not in core.isr and b.up and f.log_end_offset >= core.high_watermark > 0:
                return b
        return None

    def _crash(self, b: Broker) -> None:
        self.stats["crashes"] += 1
        b.up = False
        b.paused_until = 0.0
        if b.log is not None:
            b.log.crash()
        b.core = None
        b.stale_epoch = -1  # a restarted replica's high watermark starts at 0
        b.checked = (-1, -1, -1, -1)
        self.loss_possible = True
        b.waiters = []
        b.deferred = []
        b.truncating = False
        b.inflight_until = 0.0
        b.alter_until = 0.0
        # The process is gone: its session stream closes and the controller fences it
        # (after reading what the stream held: nothing still on its way counts).
        self.queue = [m for m in self.queue if not (m[2] == b.id and m[3] == CONTROLLER)]
        heapq.heapify(self.queue)
        if self.image.broker_alive(b.id):
            self._commit(
                [{"type": "fence_broker", "id": b.id}, *on_broker_leaving(self.image, b.id)]
            )

    def _restart(self, b: Broker) -> None:
        b.up = True
        b.incarnation += 1  # a new process: its first heartbeat registers it (fenced)
        b.next_heartbeat = self.now
        # A restarted broker catches up with the metadata log before it serves: nothing
        # older than what the controller holds now is applied. Its replica fetchers start
        # a while after it is back (sync_all takes up its replicas a slice at a time).
        b.metadata_epoch = self._partition().partition_epoch
        b.fetch_from = self.now + self.rng.random() * 0.1

    # -- the controller --------------------------------------------------------------

    def _partition(self) -> PartitionImage:
        p = self.image.partition(TOPIC, 0)
        assert p is not None
        return p

    def _commit(self, records: list[Record]) -> None:
        for r in records:
            if r["type"] == "partition_change" and "leader" in r:
                old = self._partition()
                if r["leader"] != old.leader and r["leader"] != NO_LEADER:
                    self.stats["elections"] += 1
                    # elect() gives an unclean leader an ISR of itself alone (a clean
                    # one may come from a proposed ISR: a finished reassignment).
                    if r["leader"] not in old.isr and r.get("isr") == [r["leader"]]:
                        self._unclean(r["leader"], old.leader_epoch + 1)
            self.image.apply(r)
        self.loss_possible = True
        self._publish()

    def _unclean(self, leader: int, epoch: int) -> None:
        """What an unclean election may lose is excused: only the new leader's history
        counts from here, and the other replicas' high watermarks (from the history it
        ended) count again once they truncated to the new leader's log."""
        self.stats["unclean"] += 1
        log = self.brokers[leader].log
        self._excuse(_agreed(log.values if log is not None else [], self.committed), epoch)
        for b in self.brokers.values():
            if b.id != leader:
                b.stale_epoch = epoch

    def _publish(self) -> None:
        p = self._partition()
        snap = PartitionImage(
            list(p.replicas), list(p.isr), p.leader, p.leader_epoch, p.partition_epoch
        )
        for b in self.brokers:
            self.send(CONTROLLER, b, "metadata", snap)
        self.next_metadata = self.now + METADATA_RESEND_S

    def _tick_controller(self) -> None:
        if self.now < self.next_session_check:
            return
        self.next_session_check = self.now + SESSION_CHECK_S
        if self.now >= self.next_metadata:
            self._publish()
        for b, last in self.last_heartbeat.items():
            if self.image.broker_alive(b) and self.now - last > SESSION_S:
                self._commit([{"type": "fence_broker", "id": b}, *on_broker_leaving(self.image, b)])

    def _controller_receive(self, src: int, kind: str, body: Any) -> None:
        if kind == "heartbeat":
            registered = int(self.image.brokers[src].incarnation)
            if body < registered:
                return  # an old process's (STALE_BROKER_EPOCH)
            if body > registered:
                # A restarted broker registers: fenced, its leaderships and ISR places
                # go (active.register_broker); unfenced by a later heartbeat, once caught
                # up with the metadata.
                old = self.image.brokers[src]
                rec = {"type": "register_broker", "id": src, "incarnation": str(body)}
                rec |= {"host": old.host, "port": old.port, "http_port": 0}
                self._commit([rec, *on_broker_leaving(self.image, src)])
                return
            self.last_heartbeat[src] = self.now
            if not self.image.broker_alive(src):
                self._commit(
                    [{"type": "unfence_broker", "id": src}, *on_broker_returning(self.image, src)]
                )
        elif kind == "alter":
            leader_epoch, partition_epoch, isr, incarnations = body
            try:
                recs = alter_partition(
                    self.image, src, TOPIC, 0, leader_epoch, partition_epoch, isr, incarnations
                )
            except KafkaError as e:
                self.send(CONTROLLER, src, "alter_answer", (isr, int(e.code)))
                return
            self.stats["isr_changes"] += 1
            self._check_joining(src, isr)
            self._commit(recs)
            self.send(CONTROLLER, src, "alter_answer", (isr, 0))

    def _check_joining(self, leader: int, isr: list[int]) -> None:
        """A replica joins the ISR only holding every record below the leader's high
        watermark: else, elected, it loses acknowledged writes (KIP-903's case, a
        follower that restarted without its unflushed tail, added on its old fetches)."""
        core = self.brokers[leader].core
        hw = core.high_watermark if core is not None else 0
        for r in isr:
            if r in self._partition().isr:
                continue
            plog = self.brokers[r].log
            held = plog.log_end_offset if plog is not None else 0
            if held < hw:
                self.fail(
                    "a replica joined the ISR short of the high watermark",
                    replica=r,
                    log_end=held,
                    high_watermark=hw,
                )

    # -- a broker --------------------------------------------------------------------

    def _tick_broker(self, b: Broker) -> None:
        now = self.now
        if now >= b.next_heartbeat:
            b.next_heartbeat = now + HEARTBEAT_S
            self.send(b.id, CONTROLLER, "heartbeat", b.incarnation)
        if b.deferred and b.deferred[0][0] <= now:
            due = [d for d in b.deferred if d[0] <= now]
            b.deferred = [d for d in b.deferred if d[0] > now]
            for _, end, client, req, epoch, written in due:
                self._start_wait(b, end, client, req, epoch, written)
        plog = b.log
        if plog is None:
            return
        if self.rng.random() < (0.02 if b.slow_disk else 0.3):
            plog.synced = plog.log_end_offset  # the page cache reached the disk
        core = b.core
        if core is None:
            return
        if (
            core.role == FOLLOWER
            and core.leader >= 0
            and now >= b.inflight_until
            and now >= b.fetch_from
        ):
            b.inflight_until = now + REQUEST_TIMEOUT_S
            if b.truncating:
                self.send(
                    b.id, core.leader, "epoch_end", (core.leader_epoch, plog.epochs.latest_epoch)
                )
            else:
                # Its process named, as the fetcher's client id names it (KIP-903).
                body = (
                    core.leader_epoch,
                    plog.log_end_offset,
                    plog.epochs.latest_epoch,
                    str(b.incarnation),
                )
                self.send(b.id, core.leader, "fetch", body)
        elif core.role == LEADER:
            if b.waiters and b.waiters[0][3] <= now:
                keep = []
                for w in b.waiters:
                    if w[3] <= now:
                        self._answer(b, w[1], w[2], ErrorCode.request_timed_out, -1)
                    else:
                        keep.append(w)
                b.waiters = keep
            if b.alter_until and now >= b.alter_until and core.pending_isr is not None:
                core.isr_refused(core.pending_isr)  # the call failed: propose anew
                b.alter_until = 0.0
            if now >= b.next_isr_check:
                b.next_isr_check = now + ISR_CHECK_S
                new = core.isr_change(
                    now, plog.log_end_offset, LAG_S, self._alive_view, self.image.broker_incarnation
                )
                if new is not None:
                    core.propose_isr(new)
                    b.alter_until = now + REQUEST_TIMEOUT_S
                    joining = core.isr_incarnations(new)
                    alter = (core.leader_epoch, core.partition_epoch, new, joining)
                    self.send(b.id, CONTROLLER, "alter", alter)

    def _alive_view(self, broker: int) -> bool:
        # The leader reads the controller's view from its metadata; close enough here.
        return self.image.broker_alive(broker)

    def _broker_receive(self, b: Broker, src: int, kind: str, body: Any) -> None:
        if kind == "metadata":
            self._apply_metadata(b, body)
            return
        core, plog = b.core, b.log
        if kind == "alter_answer":
            isr, code = body
            if core is not None and code:
                core.isr_refused(isr)
            b.alter_until = 0.0
            return
        if kind == "produce":
            self._produce(b, src, body)
            return
        if core is None or plog is None:
            if kind == "fetch":
                self.send(b.id, src, "fetch_answer", (ErrorCode.not_leader_or_follower, -1, -1))
            elif kind == "epoch_end":
                self.send(
                    b.id, src, "epoch_end_answer", (ErrorCode.not_leader_or_follower, -1, -1, -1)
                )
            return
        if kind == "fetch":
            epoch, fetch_offset, last_epoch, incarnation = body
            error = self._leader_error(core, epoch)
            if error:
                self.send(b.id, src, "fetch_answer", (error, epoch, fetch_offset))
                return
            leo = plog.log_end_offset
            # KIP-320: checked before the fetch counts (Kafka records a follower's fetch
            # only when its log does not diverge: a parted log is not caught up).
            parted = diverging_epoch(plog.epochs, leo, fetch_offset, last_epoch)
            if parted is not None:
                answer: tuple[Any, ...] = (0, epoch, fetch_offset, [], core.high_watermark, parted)
                if parted[0] == UNDEFINED:
                    answer = (ErrorCode.offset_out_of_range, epoch, fetch_offset)
                self.send(b.id, src, "fetch_answer", answer)
                return
            known, _ = core.on_follower_fetch(
                src, fetch_offset, leo, self.now, None, 0, incarnation
            )
            if known:
                self._advance_hw(b)
            if fetch_offset > leo:
                self.send(
                    b.id, src, "fetch_answer", (ErrorCode.offset_out_of_range, epoch, fetch_offset)
                )
                return
            chunk = plog.entries[fetch_offset : fetch_offset + FETCH_MAX]
            self.send(
                b.id, src, "fetch_answer", (0, epoch, fetch_offset, chunk, core.high_watermark)
            )
        elif kind == "epoch_end":
            current, wanted = body
            error = self._leader_error(core, current)
            answer = (-1, -1) if error else plog.epochs.end_offset_for(wanted, plog.log_end_offset)
            self.send(b.id, src, "epoch_end_answer", (error, current, *answer))
        elif kind == "fetch_answer":
            self._on_fetch_answer(b, core, plog, body)
        elif kind == "epoch_end_answer":
            self._on_epoch_end_answer(b, core, plog, body)

    @staticmethod
    def _leader_error(core: ReplicaCore, epoch: int) -> int:
        """As views.leader_error."""
        if core.role != LEADER:
            return ErrorCode.not_leader_or_follower
        if epoch >= 0 and epoch != core.leader_epoch:
            if epoch < core.leader_epoch:
                return ErrorCode.fenced_leader_epoch
            return ErrorCode.unknown_leader_epoch
        return 0

    def _apply_metadata(self, b: Broker, p: PartitionImage) -> None:
        """PartitionManager.sync for the one partition. A broker applies the metadata log
        in order: a copy overtaken on the way (or sent before a crash) is ignored."""
        if p.partition_epoch < b.metadata_epoch:
            return
        b.metadata_epoch = p.partition_epoch
        if b.id not in p.replicas:
            if b.log is not None:  # moved away: the replica and its files go
                self._fail_waiters(b)
                b.log = None
                b.core = None
            return
        if b.log is None:
            b.log = MemoryLog()
        if b.core is None:
            b.core = ReplicaCore(TOPIC, 0, b.id)
        core, plog = b.core, b.log
        outcome = core.update(p, self.min_isr, plog.log_end_offset, self.now)
        if outcome == LEADER:
            # Partition.update: the waits of an earlier leadership end (the broker may
            # lead again without having seen itself follow).
            self._fail_waiters(b)
            plog.epochs.assign(core.leader_epoch, core.epoch_start_offset)
            b.truncating = False
            if core.leader_epoch >= b.stale_epoch:
                b.stale_epoch = -1  # its log is the history from here on
            self._advance_hw(b)
        elif outcome == FOLLOWER:
            self._fail_waiters(b)
            # First agree with the new leader on where logs part (or let its Fetch
            # answers tell, KIP-320).
            b.truncating = not self.truncate_on_fetch
            b.inflight_until = 0.0
        elif core.role == LEADER:
            self._advance_hw(b)

    def _advance_hw(self, b: Broker) -> None:
        core, plog = b.core, b.log
        assert core is not None and plog is not None
        if core.advance_hw(plog.log_end_offset):
            hw = core.high_watermark
            plog.producers.high_watermark_moved(hw)
            self._observe(b)
            keep = []
            for w in b.waiters:
                if w[0] <= hw:
                    # PartitionWrite.replicated: written, but the ISR may have shrunk.
                    code = ErrorCode.not_enough_replicas_after_append if core.under_min_isr() else 0
                    self._answer(b, w[1], w[2], code, w[0] - 1, w[4])
                else:
                    keep.append(w)
            b.waiters = keep

    def _fail_waiters(self, b: Broker) -> None:
        for w in b.waiters:
            self._answer(b, w[1], w[2], ErrorCode.not_leader_or_follower, -1)
        b.waiters = []

    def _on_fetch_answer(self, b: Broker, core: ReplicaCore, plog: MemoryLog, body: Any) -> None:
        error, epoch, fetch_offset = body[:3]
        b.inflight_until = 0.0
        if (
            core.role != FOLLOWER
            or epoch != core.leader_epoch
            or b.truncating
            or plog.log_end_offset != fetch_offset
        ):
            return  # answers a question this replica no longer asks
        if error == ErrorCode.offset_out_of_range:
            b.truncating = True
            return
        if error:
            b.inflight_until = self.now + 0.02  # back off
            return
        chunk, leader_hw = body[3], body[4]
        if len(body) > 5:  # the leader's log parts from this one (KIP-320)
            self._truncate(b, core, plog, *body[5])
            # An epoch that starts at the log end holds nothing (this replica took it as
            # a leader and wrote nothing in it): named again, it would part again.
            plog.epochs.truncate_from_end(plog.log_end_offset)
            return
        if core.leader_epoch >= b.stale_epoch:
            b.stale_epoch = -1  # an answer without divergence: its log is the leader's
        for entry in chunk:
            plog.append(entry)
        hw = core.follower_hw(leader_hw, plog.log_end_offset)
        plog.producers.high_watermark_moved(hw)
        self._observe(b)

    def _on_epoch_end_answer(
        self, b: Broker, core: ReplicaCore, plog: MemoryLog, body: Any
    ) -> None:
        error, epoch, leader_epoch, leader_end = body
        b.inflight_until = 0.0
        if core.role != FOLLOWER or epoch != core.leader_epoch or not b.truncating:
            return
        if error:
            b.inflight_until = self.now + 0.02
            return
        self._truncate(b, core, plog, leader_epoch, leader_end)
        b.truncating = False
        if core.leader_epoch >= b.stale_epoch:
            b.stale_epoch = -1

    def _truncate(
        self, b: Broker, core: ReplicaCore, plog: MemoryLog, leader_epoch: int, leader_end: int
    ) -> None:
        """Cut the log where the leader's says they part (OffsetForLeaderEpoch's answer,
        or a Fetch answer's diverging epoch)."""
        leo = plog.log_end_offset
        target = truncation_offset(plog.epochs, leo, 0, leader_epoch, leader_end)
        if target < leo:
            self.stats["truncations"] += 1
            plog.truncate_to(target)
            core.follower_hw(core.high_watermark, plog.log_end_offset)
            self.loss_possible = True

    # -- producers -------------------------------------------------------------------

    def _tick_client(self, c: Client, faults: bool) -> None:
        if c.inflight is not None:
            if c.inflight[3] > self.now:
                return
            if c.inflight[1] == 0:
                self._client_done(c, ok=True)  # acks=0: nothing comes back
            else:
                self._send_produce(c, retry=True)  # no answer: try again
            return
        if faults and self.rng.random() < self.p_produce:
            c.sent += 1
            acks = self.rng.choice(c.acks_choices)
            c.inflight = (0, acks, f"c{c.id}-{c.sent}", 0.0)
            self._send_produce(c, retry=False)

    def _send_produce(self, c: Client, retry: bool) -> None:
        assert c.inflight is not None
        _, acks, payload, _ = c.inflight
        if retry and not c.idempotent:
            payload = f"{payload}r"  # a plain retry writes again: its own value
        self.req_ids += 1
        c.inflight = (
            self.req_ids,
            acks,
            payload,
            self.now + REQUEST_TIMEOUT_S + ACKS_ALL_TIMEOUT_S,
        )
        leader = self._partition().leader  # the client's metadata: current, here
        if leader == NO_LEADER:
            c.inflight = (self.req_ids, acks, payload, self.now + 0.05)
            return
        value = (
            (c.producer_id, c.producer_epoch, c.seq, payload)
            if c.idempotent
            else (-1, -1, -1, payload)
        )
        self.send(-c.id - 2, leader, "produce", (self.req_ids, acks, value))

    def _produce(self, b: Broker, src: int, body: Any) -> None:
        """PartitionWriter.begin, then PartitionWrite.replicated for acks=all."""
        req, acks, value = body
        client = -src - 2
        core, plog = b.core, b.log
        if core is None or plog is None or core.role != LEADER:
            self._reply(b, client, req, acks, ErrorCode.not_leader_or_follower, -1)
            return
        if acks == -1 and core.under_min_isr():
            self._reply(b, client, req, acks, ErrorCode.not_enough_replicas, -1)
            return
        batch = _batch(plog.log_end_offset, (core.leader_epoch, value))
        try:
            plog.producers.check([batch])
        except DuplicateBatch as dup:
            end = dup.cached.last_offset + 1
        except SequenceError as e:
            self._reply(b, client, req, acks, e.code, -1)
            return
        else:
            if core.followers:
                core.before_append(plog.log_end_offset)
            plog.append((core.leader_epoch, value))
            self.stats["produced"] += 1
            end = plog.log_end_offset
            self._advance_hw(b)
        if acks == -1:
            written = plog.values[end - 1]
            if self.defer_waits and self.defer_rng.random() < 0.5:
                due = self.now + self.defer_rng.uniform(0.001, 0.3)
                b.deferred.append((due, end, client, req, core.leader_epoch, written))
                b.deferred.sort(key=lambda d: d[0])
            else:
                self._start_wait(b, end, client, req, core.leader_epoch, written)
        else:
            self._reply(b, client, req, acks, 0, end - 1)

    def _start_wait(
        self, b: Broker, end: int, client: int, req: int, epoch: int, written: Any
    ) -> None:
        """PartitionWrite.replicated: a wait in the leader epoch of its write (the
        partition's wait_for_hw): over at once if that leadership ended meanwhile."""
        core = b.core
        if core is None or core.role != LEADER or core.leader_epoch != epoch:
            self._answer(b, client, req, ErrorCode.not_leader_or_follower, -1)
        elif core.high_watermark >= end:
            code = ErrorCode.not_enough_replicas_after_append if core.under_min_isr() else 0
            self._answer(b, client, req, code, end - 1, written)
        else:
            b.waiters.append((end, client, req, self.now + ACKS_ALL_TIMEOUT_S, written))

    def _reply(self, b: Broker, client: int, req: int, acks: int, code: int, offset: int) -> None:
        if acks != 0:
            self.send(b.id, -client - 2, "produce_answer", (req, code, offset))

    def _answer(
        self, b: Broker, client: int, req: int, code: int, offset: int, written: Any = None
    ) -> None:
        """An acks=all answer: a success is an acknowledged write from here on."""
        if code == 0 and b.stale_epoch < 0:
            # (A stale leader acknowledges what an unclean election, or the crash of
            # every in-sync replica, already gave up: not counted.)
            log = b.log
            assert log is not None
            value = log.values[offset]
            if written is not None and value != written:
                self.fail(
                    "an acknowledged acks=all write is not the record its client wrote",
                    offset=offset,
                )
            self._observe(b)
            if offset >= len(self.committed) or self.committed[offset] != value:
                self.fail("an acknowledged acks=all write is not committed", offset=offset)
            self.acked[offset] = value
            self.stats["acked_all"] += 1
        self.send(b.id, -client - 2, "produce_answer", (req, code, offset))

    def _client_receive(self, client: int, kind: str, body: Any) -> None:
        c = self.clients[client]
        req, code, _ = body
        if c.inflight is None or c.inflight[0] != req:
            return
        if code == 0:
            self._client_done(c, ok=True)
        elif code == ErrorCode.out_of_order_sequence_number and c.idempotent:
            c.producer_epoch += 1  # KIP-360: bump the epoch and start the sequence over
            c.seq = 0
            self._send_produce(c, retry=True)
        elif code in (ErrorCode.invalid_producer_epoch,):
            self._client_done(c, ok=False)
        else:
            c.inflight = (req, c.inflight[1], c.inflight[2], self.now + 0.02)  # retry soon

    def _client_done(self, c: Client, ok: bool) -> None:
        c.inflight = None
        if c.idempotent:
            c.seq += 1

    # -- the invariants --------------------------------------------------------------

    def _excuse(self, upto: int, epoch: int) -> None:
        """Records from `upto` on may be lost: forget them. A replica whose high watermark
        covers them is not checked again until it truncated to a leader's log (or leads,
        or restarts)."""
        if upto < len(self.committed):
            self.stats["excused"] += 1
            del self.committed[upto:]
            self._sequences = {v[:3] for v in self.committed if v[0] >= 0}
            for b in self.brokers.values():
                if b.core is not None and b.core.high_watermark > upto:
                    b.stale_epoch = epoch
        for offset in [o for o in self.acked if o >= upto]:
            del self.acked[offset]

    def _observe(self, b: Broker) -> None:
        """Whatever `b` holds below its high watermark agrees with what every replica
        held there before, and is committed from now on."""
        core, log = b.core, b.log
        if core is None or log is None or b.stale_epoch >= 0:
            return
        hw = core.high_watermark
        values = log.values
        if hw > len(values):
            self.fail("a high watermark past the log end", broker=b.id, hw=hw)
        committed = self.committed
        n = min(hw, len(committed))
        if values[:n] != committed[:n]:
            at = _agreed(values, committed)
            self.fail(
                "replicas disagree below the high watermark",
                broker=b.id,
                offset=at,
                has=values[at],
                committed=committed[at],
                hw=hw,
            )
        if hw > n:
            seen = self._sequences
            for v in values[n:hw]:
                if v[0] >= 0:
                    if v[:3] in seen:
                        self.fail("a producer sequence was written twice", sequence=v[:3])
                    seen.add(v[:3])
            committed.extend(values[n:hw])
        if core.role == LEADER:
            key = (b.id, core.leader_epoch)
            if hw < self.leader_hw.get(key, 0):
                self.fail("a leader's high watermark moved back", broker=b.id, hw=hw)
            self.leader_hw[key] = hw

    def _check(self) -> None:
        p = self._partition()
        committed = self.committed
        if self.loss_possible:
            # Every in-sync replica lost these in crashes (fsync off): the accepted loss.
            self.loss_possible = False
            held = 0
            for r in p.isr:
                log = self.brokers[r].log
                if log is not None:
                    held = max(held, _agreed(log.values, committed))
            if held < len(committed):
                self._excuse(held, p.leader_epoch)
        for b in self.brokers.values():
            core, log = b.core, b.log
            if core is None or log is None or not b.up:
                continue
            seen = (len(log.values), core.high_watermark, core.leader_epoch, len(committed))
            if seen != b.checked:
                b.checked = seen
                self._observe(b)
        # The current leader holds everything committed (so every acknowledged write).
        leader = self.brokers.get(p.leader)
        if (
            leader is not None
            and leader.up
            and leader.core is not None
            and leader.log is not None
            and leader.core.role == LEADER
            and leader.core.leader_epoch == p.leader_epoch
        ):
            values = leader.log.values
            n = len(committed)
            if len(values) < n or values[:n] != committed:
                have = _agreed(values, committed)
                self.fail(
                    "the leader lost a committed record",
                    leader=leader.id,
                    offset=have,
                    acknowledged=[o for o in sorted(self.acked) if o >= have][:5],
                    isr=p.isr,
                )


def _agreed(values: list[Value], committed: list[Value]) -> int:
    """How many of the committed records the log holds, from the start."""
    n = min(len(values), len(committed))
    if values[:n] == committed[:n]:
        return n
    i = 0
    while values[i] == committed[i]:
        i += 1
    return i


def run_seeds(seeds: range, make: Callable[[int], Simulation] = Simulation) -> dict[str, int]:
    """Run many seeds; the first failure raises with its replay command."""
    totals: dict[str, int] = {}
    for seed in seeds:
        for k, v in make(seed).run().items():
            totals[k] = totals.get(k, 0) + v
    return totals
