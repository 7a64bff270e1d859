"""The Raft core of the metadata quorum (KRaft: KIP-595, KIP-630 snapshots, KIP-996
pre-vote) as a sans-IO state machine.

No clock, sockets, threads or asyncio in here: the shell feeds messages (`step`) and
the time (`tick`), sends what `take_messages` returns and applies what
`take_committed` returns. The simulation in `simulation.py` drives this very class.

    node = RaftNode(0, frozenset({0, 1, 2}), FileStorage(path), RaftConfig(), random.Random(),
                    now_ms)
    every 10-50 ms:   node.tick(now_ms)
    on a message:     node.step(from_dict(body), now_ms)
    after either:     persist node.take_storage() (then node.persisted(seq)),
                      send node.take_messages(), apply node.take_committed()
    on the leader:    offset = node.propose({"type": ...})

Persistence follows etcd-raft's Ready: the core does not write; it queues what must be
durable (`take_storage`) and holds back every message produced after such a write until
the shell reports it durable (`persisted`), so a vote is never granted, a candidacy never
announced and a fetch offset (a follower's acknowledgement) never reported before the
disk has it; the leader counts its own log toward the high watermark only up to what is
durable. The shell may persist off its event loop and batch whatever piles up meanwhile.
With `persist_inline=True` (the default) every op is written at once instead, which is
always correct and what a test reading the storage after each step wants; the shell and
the simulation use deferred persistence.

Replication is pull-based: followers and observers Fetch from the leader with their
log end offset and last epoch; the leader answers with entries, a diverging epoch
(truncate and retry) or a snapshot id (FetchSnapshot, install, retry). A node whose
id is not among the voters is an observer: it follows the log but never votes.

Internal invariants go through `straitmq.invariants` (never stripped by -O): a broken
one names itself and its facts and stops the process (raises, in the simulation).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any

from straitmq.invariants import broken

from ..config import DEFAULTS
from .epochs import EpochCache
from .messages import (
    FENCED_LEADER_EPOCH,
    NOT_LEADER,
    SNAPSHOT_NOT_FOUND,
    BeginQuorumEpoch,
    BeginQuorumEpochResponse,
    EndQuorumEpoch,
    EndQuorumEpochResponse,
    Entry,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Message,
    VoteRequest,
    VoteResponse,
)
from .storage import RaftStorage, Snapshot, StorageOp
from .storage import apply as apply_ops

LEADER = "leader"
CANDIDATE = "candidate"
PROSPECTIVE = "prospective"  # running a pre-vote
FOLLOWER = "follower"
UNATTACHED = "unattached"  # a voter that knows no leader for its epoch
OBSERVER = "observer"

_NEVER = -(1 << 62)  # a time long before any now_ms


@dataclass(frozen=True, slots=True)
class RaftConfig:
    # Declared with their flags in ControllerConfig (controller/config.py).
    election_timeout_ms: int = DEFAULTS.election_timeout_ms  # randomized in [T, 2T)
    fetch_timeout_ms: int = DEFAULTS.fetch_timeout_ms  # without a good fetch: campaign
    fetch_max_wait_ms: int = 500  # long-poll: how long the leader parks an empty fetch
    max_fetch_entries: int = 512  # per FetchResponse
    # ... and records (an entry whose data is a list counts its items): an observer that
    # parses a catch-up answer of many multi-thousand-record entries at once stalls its
    # event loop. An answer always carries at least one entry.
    max_fetch_records: int = 2000
    request_timeout_ms: int = 1000  # beyond max wait: resend an unanswered fetch
    retry_backoff_ms: int = 100  # before refetching after an error response
    end_quorum_backoff_ms: int = 100  # per position in EndQuorumEpoch's preferred successors
    begin_quorum_resend_ms: int = 500  # resend BeginQuorumEpoch to voters not fetching yet
    max_observers: int = 1024  # observers the leader tracks for status()

    @property
    def check_quorum_ms(self) -> int:
        return self.fetch_timeout_ms * 3 // 2


class NotLeader(Exception):
    """propose() on a node that is not the leader; retry on `leader_id` (if known)."""

    def __init__(self, leader_id: int | None, epoch: int) -> None:
        super().__init__(f"not the leader of epoch {epoch}; leader is {leader_id}")
        self.leader_id = leader_id
        self.epoch = epoch


@dataclass(slots=True)
class ReplicaState:
    """What the leader knows of one fetcher."""

    node_id: int
    end_offset: int = 0
    last_fetch_ms: int = _NEVER
    last_caught_up_ms: int = _NEVER

    def describe(self, leader_end: int) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "log_end_offset": self.end_offset,
            "lag": leader_end - self.end_offset,
            "last_fetch_ms": self.last_fetch_ms if self.last_fetch_ms != _NEVER else None,
            "last_caught_up_ms": (
                self.last_caught_up_ms if self.last_caught_up_ms != _NEVER else None
            ),
        }


@dataclass(frozen=True, slots=True)
class _Inflight:
    """The one outstanding fetch (or snapshot fetch) of a follower/observer."""

    snapshot: bool
    dst: int
    offset: int
    epoch: int  # last_fetched_epoch, or the snapshot's epoch
    deadline_ms: int


class RaftNode:
    def __init__(
        self,
        node_id: int,
        voters: frozenset[int],
        storage: RaftStorage,
        config: RaftConfig | None = None,
        rng: random.Random | None = None,
        now_ms: int = 0,
        persist_inline: bool = True,
    ) -> None:
        if not voters:
            raise ValueError("a quorum needs at least one voter")
        self.node_id = node_id
        self.voters = frozenset(voters)
        self._is_voter = node_id in self.voters
        self._majority = len(self.voters) // 2 + 1
        self._storage = storage
        self._cfg = config or RaftConfig()
        self._rng = rng or random.Random()
        self._now = now_ms

        epoch, voted_for, snapshot, log_start, entries = storage.load()
        if (snapshot.end_offset if snapshot else 0) != log_start:
            broken(
                "the log starts where the snapshot ends",
                snapshot_end=snapshot.end_offset if snapshot else 0,
                log_start=log_start,
            )
        self._epoch = epoch
        self._voted_for = voted_for
        self._snapshot = snapshot  # the snapshot the log starts after
        self._log_start = log_start
        self._log: list[Entry] = []
        self._cache = EpochCache(snapshot.epoch if snapshot else 0, log_start)
        self._append_to_memory(entries)
        self._hw = log_start  # what a snapshot holds is committed; the rest we learn
        self._next_apply = log_start
        self._pending_snapshot = snapshot  # for the first take_committed()
        self._truncations = 0  # bumped whenever the log tail is replaced (for the simulation)
        # Storage ops not yet handed out / not yet durable, counted from 1.
        self._inline = persist_inline
        self._ops: list[StorageOp] = []
        self._op_ends: list[int] = []  # the log end offset after each op in _ops
        self._ops_taken = 0  # ops handed out by take_storage (sequence number)
        self._seq = 0  # ops recorded
        self._durable = 0  # ops the shell reported durable
        self._durable_end = self.log_end_offset  # the log end that is on disk
        self._ends_taken: list[tuple[int, int]] = []  # (seq, log end) handed out, not durable

        self._outbox: list[tuple[int, Message]] = []  # (ops it waits for, message)
        self._role = UNATTACHED if self._is_voter else OBSERVER
        self._leader_id: int | None = None
        self._election_deadline = _NEVER
        self._last_leader_contact = _NEVER
        # follower / observer
        self._fetch_deadline = _NEVER
        self._next_fetch_ms = _NEVER
        self._inflight: _Inflight | None = None
        self._observer_rr = self._rng.randrange(len(self.voters))
        # prospective / candidate
        self._grants: set[int] = set()
        self._rejects: set[int] = set()
        # leader
        self._replicas: dict[int, ReplicaState] = {}
        self._observers: dict[int, ReplicaState] = {}
        self._parked: dict[int, tuple[FetchRequest, int]] = {}
        self._begin_pending: set[int] = set()
        self._begin_resend_ms = _NEVER

        if self._is_voter:
            self._become_unattached(epoch)
        else:
            self._become_observer_without_leader()

    # -- read-only view -----------------------------------------------------------------

    @property
    def role(self) -> str:
        return self._role

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def leader_id(self) -> int | None:
        return self._leader_id

    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def is_leader(self) -> bool:
        return self._role == LEADER

    @property
    def log_start_offset(self) -> int:
        return self._log_start

    @property
    def log_end_offset(self) -> int:
        return self._log_start + len(self._log)

    @property
    def last_epoch(self) -> int:
        """Epoch of the last entry, or of the snapshot, or 0."""
        return self._cache.last_epoch

    def entry(self, offset: int) -> Entry:
        """The entry at `offset` (log_start_offset <= offset < log_end_offset)."""
        if not self._log_start <= offset < self.log_end_offset:
            raise IndexError(f"offset {offset} outside [{self._log_start}, {self.log_end_offset})")
        return self._log[offset - self._log_start]

    def status(self) -> dict[str, Any]:
        s: dict[str, Any] = {
            "node_id": self.node_id,
            "role": self._role,
            "epoch": self._epoch,
            "leader_id": self._leader_id,
            "voted_for": self._voted_for,
            "high_watermark": self._hw,
            "log_start_offset": self._log_start,
            "log_end_offset": self.log_end_offset,
            "last_fetched_epoch": self.last_epoch,
        }
        if self._role == LEADER:
            end = self.log_end_offset
            me = ReplicaState(self.node_id, end, self._now, self._now)
            voters = [me, *self._replicas.values()]
            s["voters"] = [r.describe(end) for r in sorted(voters, key=lambda r: r.node_id)]
            s["observers"] = [
                r.describe(end) for r in sorted(self._observers.values(), key=lambda r: r.node_id)
            ]
        return s

    def voters_reachable(self) -> tuple[int, int] | None:
        """On the leader: (voters that fetched within the check-quorum window, counting
        itself; voters that did not), the same test check-quorum applies. None elsewhere."""
        if self._role != LEADER:
            return None
        window = self._cfg.check_quorum_ms
        ok = sum(1 for r in self._replicas.values() if self._now - r.last_fetch_ms < window)
        return 1 + ok, len(self._replicas) - ok

    # -- the shell's calls --------------------------------------------------------------

    @property
    def unsent(self) -> int:
        """Messages made but not handed out yet (waiting for their storage ops)."""
        return len(self._outbox)

    def take_messages(self) -> list[Message]:
        """Messages to send: those whose storage ops are durable (in order of making)."""
        durable = self._durable
        if not self._outbox or self._outbox[-1][0] <= durable:
            out = [m for _, m in self._outbox]
            self._outbox = []
            return out
        out = [m for need, m in self._outbox if need <= durable]
        self._outbox = [(need, m) for need, m in self._outbox if need > durable]
        return out

    def take_storage(self) -> tuple[list[StorageOp], int]:
        """What to persist, in order, and the sequence number to report to `persisted`
        once it is durable. ([], n) when nothing is pending."""
        ops, self._ops = self._ops, []
        ends, self._op_ends = self._op_ends, []
        if ops:
            self._ops_taken += len(ops)
            self._ends_taken.append((self._ops_taken, ends[-1]))
        return ops, self._ops_taken

    def persisted(self, seq: int) -> None:
        """The ops up to `seq` (from take_storage) are durable: release the messages that
        waited for them; the leader's own durable log may move the high watermark."""
        if seq <= self._durable:
            return
        if seq > self._ops_taken:
            broken(
                "persisted never runs beyond the storage ops handed out",
                node=self.node_id,
                persisted=seq,
                handed_out=self._ops_taken,
            )
        self._durable = seq
        while self._ends_taken and self._ends_taken[0][0] <= seq:
            self._durable_end = self._ends_taken.pop(0)[1]
        if self._role == LEADER and self._maybe_advance_hw():
            self._answer_parked()

    def _persist(self, op: StorageOp) -> None:
        """Record a storage op made after the in-memory change it describes."""
        self._seq += 1
        if self._inline:
            apply_ops(self._storage, [op])
            self._ops_taken = self._durable = self._seq
            self._durable_end = self.log_end_offset
            return
        self._ops.append(op)
        self._op_ends.append(self.log_end_offset)

    def take_committed(self) -> list[tuple[int, Entry] | Snapshot]:
        """Newly committed entries in order, each once; a Snapshot first means "reset
        the state machine to this snapshot". Control entries (data None) included."""
        out: list[tuple[int, Entry] | Snapshot] = []
        if self._pending_snapshot is not None:
            out.append(self._pending_snapshot)
            self._pending_snapshot = None
        while self._next_apply < self._hw:
            out.append((self._next_apply, self._log[self._next_apply - self._log_start]))
            self._next_apply += 1
        return out

    def propose(self, data: Any) -> int:
        """Append `data` (JSON-able, not None) durably; its offset. It takes effect once
        committed, i.e. when take_committed() returns it."""
        if self._role != LEADER:
            raise NotLeader(self._leader_id, self._epoch)
        if data is None:
            raise ValueError("None is reserved for control entries")
        offset = self.log_end_offset
        self._append_local([Entry(self._epoch, data)])
        self._maybe_advance_hw()
        self._answer_parked()  # new entries for every parked fetch
        return offset

    def create_snapshot(self, end_offset: int, data: Any) -> None:
        """Keep `data` as the state after offsets [0, end_offset) and drop those entries.
        end_offset must not pass what take_committed() has returned."""
        if end_offset > self._next_apply or end_offset > self._hw:
            raise ValueError(
                f"snapshot end {end_offset} is beyond what was applied ({self._next_apply}) "
                f"or committed ({self._hw})"
            )
        if end_offset <= self._log_start:
            return  # the current snapshot already covers it
        snapshot = Snapshot(end_offset, self._entry_epoch(end_offset - 1), data)
        self._cache.truncate_start(end_offset, snapshot.epoch, self.log_end_offset)
        del self._log[: end_offset - self._log_start]
        self._log_start = end_offset
        self._snapshot = snapshot
        self._persist(("snapshot", snapshot))

    def resign(self, now_ms: int) -> None:
        """Graceful shutdown of a leader: hand over to the most caught-up voters."""
        self._now = now_ms
        if self._role != LEADER:
            return
        successors = tuple(sorted(self._replicas, key=lambda v: (-self._replicas[v].end_offset, v)))
        for v in successors:
            self._send(EndQuorumEpoch(self.node_id, v, self._epoch, self.node_id, successors))
        self._become_unattached(self._epoch, delay_ms=2 * self._cfg.election_timeout_ms)
        self._last_leader_contact = _NEVER

    def tick(self, now_ms: int) -> None:
        self._now = now_ms
        role = self._role
        if role == LEADER:
            self._tick_leader()
        elif role in (FOLLOWER, OBSERVER):
            self._tick_fetcher()
        elif now_ms >= self._election_deadline:  # unattached, prospective, candidate
            self._become_prospective()

    def step(self, msg: Message, now_ms: int) -> None:
        if msg.dst != self.node_id:
            raise ValueError(f"message for node {msg.dst} stepped into node {self.node_id}")
        self._now = now_ms
        self._observe_epoch(msg)
        handler = _HANDLERS.get(type(msg))
        if handler is None:
            raise TypeError(f"not a raft message: {type(msg).__name__}")
        handler(self, msg)

    # -- transitions --------------------------------------------------------------------

    def _random_election_timeout(self) -> int:
        t = self._cfg.election_timeout_ms
        return self._rng.randrange(t, 2 * t)

    def _set_epoch(self, epoch: int) -> None:
        """Move to a newer epoch (forgetting the vote), durably."""
        if epoch < self._epoch:
            broken("epochs never go back", node=self.node_id, epoch=self._epoch, new=epoch)
        if epoch > self._epoch:
            self._epoch, self._voted_for = epoch, None
            self._persist(("state", epoch, None))

    def _leave_role(self) -> None:
        if self._role == LEADER:
            parked, self._parked = self._parked, {}
            self._role = UNATTACHED  # so the answers below say NOT_LEADER
            self._leader_id = None
            for req, _ in parked.values():
                self._send(self._fetch_error(req, NOT_LEADER))
            self._replicas.clear()
            self._observers.clear()
            self._begin_pending.clear()
        self._inflight = None
        self._grants.clear()
        self._rejects.clear()

    def _become_unattached(self, epoch: int, delay_ms: int | None = None) -> None:
        self._leave_role()
        self._set_epoch(epoch)
        self._leader_id = None
        if not self._is_voter:
            self._become_observer_without_leader()
            return
        self._role = UNATTACHED
        delay = self._random_election_timeout() if delay_ms is None else delay_ms
        self._election_deadline = self._now + delay

    def _become_observer_without_leader(self) -> None:
        self._inflight = None
        self._role = OBSERVER
        self._leader_id = None
        self._fetch_deadline = self._now + self._cfg.fetch_timeout_ms
        self._next_fetch_ms = self._now
        self._send_fetch()

    def _become_follower(self, epoch: int, leader: int) -> None:
        if leader == self.node_id:
            broken("a node is never told that it leads", node=leader, epoch=epoch)
        if epoch == self._epoch and self._leader_id not in (None, leader):
            broken(
                "election safety: one leader per epoch",
                node=self.node_id,
                epoch=epoch,
                leader=self._leader_id,
                other=leader,
            )
        following = self._role in (FOLLOWER, OBSERVER) and self._leader_id == leader
        if following and epoch == self._epoch:
            return
        self._leave_role()
        self._set_epoch(epoch)
        self._role = FOLLOWER if self._is_voter else OBSERVER
        self._leader_id = leader
        self._fetch_deadline = self._now + self._cfg.fetch_timeout_ms
        self._next_fetch_ms = self._now
        self._send_fetch()

    def _become_prospective(self) -> None:
        self._leave_role()
        self._role = PROSPECTIVE
        self._leader_id = None
        self._grants.add(self.node_id)
        self._election_deadline = self._now + self._random_election_timeout()
        for v in self.voters - {self.node_id}:
            self._send(
                VoteRequest(
                    self.node_id,
                    v,
                    self._epoch + 1,
                    self.node_id,
                    self.last_epoch,
                    self.log_end_offset,
                    pre_vote=True,
                )
            )
        self._count_votes()

    def _become_candidate(self) -> None:
        self._leave_role()
        self._epoch += 1
        self._voted_for = self.node_id
        self._persist(("state", self._epoch, self.node_id))  # the requests wait for it
        self._role = CANDIDATE
        self._leader_id = None
        self._grants.add(self.node_id)
        self._election_deadline = self._now + self._random_election_timeout()
        for v in self.voters - {self.node_id}:
            self._send(
                VoteRequest(
                    self.node_id,
                    v,
                    self._epoch,
                    self.node_id,
                    self.last_epoch,
                    self.log_end_offset,
                    pre_vote=False,
                )
            )
        self._count_votes()

    def _become_leader(self) -> None:
        self._leave_role()
        self._role = LEADER
        self._leader_id = self.node_id
        others = self.voters - {self.node_id}
        # Every voter gets a full check-quorum period from the election on.
        self._replicas = {v: ReplicaState(v, 0, self._now) for v in others}
        self._begin_pending = set(others)
        self._begin_resend_ms = self._now + self._cfg.begin_quorum_resend_ms
        for v in others:
            self._send(BeginQuorumEpoch(self.node_id, v, self._epoch, self.node_id))
        # The HW may only move past entries of this epoch: commit one at once.
        self._append_local([Entry(self._epoch, None)])
        self._maybe_advance_hw()

    def _count_votes(self) -> None:
        if len(self._grants) >= self._majority:
            if self._role == PROSPECTIVE:
                self._become_candidate()
            elif self._role == CANDIDATE:
                self._become_leader()

    def _observe_epoch(self, msg: Message) -> None:
        """Any message from a newer epoch moves this node into it (durably)."""
        epoch = msg.epoch
        if isinstance(msg, VoteRequest) and msg.pre_vote:
            # A pre-vote is hypothetical, but its sender really is in epoch - 1: a node
            # stuck in a newer epoch (a lost candidacy) must pull the others up, or it
            # could never rejoin their older leader.
            epoch -= 1
        if epoch <= self._epoch:
            return
        leader = None
        if isinstance(msg, BeginQuorumEpoch | FetchResponse | FetchSnapshotResponse | VoteResponse):
            leader = msg.leader_id
        if leader is not None and leader != self.node_id:
            self._become_follower(epoch, leader)
        else:
            self._become_unattached(epoch)

    # -- log ----------------------------------------------------------------------------

    def _entry_epoch(self, offset: int) -> int:
        if offset == self._log_start - 1 and self._snapshot is not None:
            return self._snapshot.epoch
        return self._log[offset - self._log_start].epoch

    def _append_to_memory(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        end = self.log_end_offset
        for i, e in enumerate(entries):
            if e.epoch > self._epoch:
                broken(
                    "no entry of a later epoch than the node's",
                    node=self.node_id,
                    entry_epoch=e.epoch,
                    epoch=self._epoch,
                )
            self._cache.append(e.epoch, end + i)
        self._log.extend(entries)

    def _append_local(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        self._append_to_memory(entries)
        self._persist(("append", list(entries)))

    def _truncate(self, end_offset: int) -> None:
        if end_offset < self._hw:
            broken(
                "a committed entry is never truncated",
                node=self.node_id,
                truncate_to=end_offset,
                high_watermark=self._hw,
            )
        if end_offset >= self.log_end_offset:
            return
        del self._log[end_offset - self._log_start :]
        self._cache.truncate_end(end_offset)
        self._truncations += 1
        self._persist(("truncate", end_offset))

    def _install_snapshot(self, snapshot: Snapshot) -> None:
        if snapshot.end_offset <= self._log_start:
            return  # we already hold it (a duplicate)
        if snapshot.end_offset < self._hw:
            broken(
                "a snapshot never drops committed entries",
                node=self.node_id,
                snapshot_end=snapshot.end_offset,
                high_watermark=self._hw,
            )
        self._snapshot = snapshot
        self._log_start = snapshot.end_offset
        self._log = []
        self._cache.reset(snapshot.epoch, snapshot.end_offset)
        self._persist(("install", snapshot))
        self._set_hw(snapshot.end_offset)
        self._pending_snapshot = snapshot
        self._next_apply = snapshot.end_offset
        self._truncations += 1

    def _set_hw(self, hw: int) -> None:
        if hw < self._hw:
            broken("the high watermark never decreases", node=self.node_id, old=self._hw, new=hw)
        if hw > self.log_end_offset:
            broken(
                "the high watermark never passes the log end",
                node=self.node_id,
                high_watermark=hw,
                log_end=self.log_end_offset,
            )
        self._hw = hw

    # -- leader -------------------------------------------------------------------------

    def _maybe_advance_hw(self) -> bool:
        """The largest offset a majority of voters reached, once it covers an entry of
        this epoch. True when it moved."""
        # Our own log counts only as far as it is durable (etcd-raft's rule as well).
        own = min(self._durable_end, self.log_end_offset)
        ends = sorted([own, *(r.end_offset for r in self._replicas.values())], reverse=True)
        reached = ends[self._majority - 1]
        if reached > self._hw and self._entry_epoch(reached - 1) == self._epoch:
            self._set_hw(reached)
            return True
        return False

    def _tick_leader(self) -> None:
        now = self._now
        alive = 1 + sum(
            1 for r in self._replicas.values() if now - r.last_fetch_ms < self._cfg.check_quorum_ms
        )
        if alive < self._majority:
            # Check-quorum: a leader cut off from a majority stops taking proposals.
            self._become_unattached(self._epoch)
            return
        expired = [src for src, (_, deadline) in self._parked.items() if now >= deadline]
        for src in expired:
            req, _ = self._parked.pop(src)
            self._send(self._answer_fetch(req)[0])
        if self._begin_pending and now >= self._begin_resend_ms:
            self._begin_resend_ms = now + self._cfg.begin_quorum_resend_ms
            for v in sorted(self._begin_pending):
                self._send(BeginQuorumEpoch(self.node_id, v, self._epoch, self.node_id))

    def _replica(self, node_id: int) -> ReplicaState | None:
        if node_id in self.voters:
            return self._replicas.get(node_id)
        r = self._observers.get(node_id)
        if r is None and len(self._observers) < self._cfg.max_observers:
            r = self._observers[node_id] = ReplicaState(node_id)
        return r

    def _answer_fetch(self, m: FetchRequest) -> tuple[FetchResponse, bool]:
        """The response to `m` from the leader's log, and whether the fetch was valid
        (the fetcher's log is a prefix of ours up to m.fetch_offset)."""
        fo, last = m.fetch_offset, m.last_fetched_epoch
        answer = functools.partial(
            FetchResponse,
            src=self.node_id,
            dst=m.src,
            epoch=self._epoch,
            leader_id=self.node_id,
            error=None,
            base_offset=fo,
            high_watermark=self._hw,
            log_start_offset=self._log_start,
            last_fetched_epoch=last,
        )
        snap = self._snapshot
        if snap is not None and (
            fo < self._log_start
            or (fo == self._log_start and last != snap.epoch)
            or last < snap.epoch
        ):
            return answer(snapshot_offset=snap.end_offset, snapshot_epoch=snap.epoch), False
        end = self.log_end_offset
        if not (fo == 0 and self._log_start == 0):
            found = self._cache.end_offset_for(last, end)
            assert found is not None  # last >= snapshot epoch was checked above
            epoch, epoch_end = found
            if epoch != last or epoch_end < fo:
                return answer(diverging_epoch=epoch, diverging_end_offset=epoch_end), False
        i = fo - self._log_start
        entries = self._log[i : i + self._cfg.max_fetch_entries]
        budget = self._cfg.max_fetch_records
        for n, entry in enumerate(entries):
            budget -= len(entry.data) if isinstance(entry.data, list) else 1
            if budget <= 0:
                entries = entries[: n + 1]
                break
        return answer(entries=tuple(entries)), True

    def _leader_fetch(self, m: FetchRequest) -> None:
        now = self._now
        replica = self._replica(m.src)
        self._begin_pending.discard(m.src)
        resp, valid = self._answer_fetch(m)
        moved = False
        if replica is not None:
            replica.last_fetch_ms = now
            if valid:
                # max(): a reordered older fetch must not move a replica back.
                replica.end_offset = max(replica.end_offset, m.fetch_offset)
                if m.fetch_offset >= self.log_end_offset:
                    replica.last_caught_up_ms = now
                if m.src in self.voters:
                    moved = self._maybe_advance_hw()
        if moved:
            self._parked.pop(m.src, None)
            self._send(self._answer_fetch(m)[0])  # carries the new HW
            self._answer_parked()
        elif valid and not resp.entries and not 0 <= m.high_watermark < self._hw:
            # Long poll: answer when there is something new (entries or a high watermark
            # the fetcher has not seen), or at max wait. A fetcher that does not say which
            # high watermark it knows (-1) is parked too, as before.
            self._parked[m.src] = (m, now + self._cfg.fetch_max_wait_ms)
        else:
            self._parked.pop(m.src, None)
            self._send(resp)

    def _answer_parked(self) -> None:
        parked, self._parked = self._parked, {}
        for req, _ in parked.values():
            self._send(self._answer_fetch(req)[0])

    # -- follower / observer ------------------------------------------------------------

    def _fetch_target(self) -> int | None:
        if self._leader_id is not None:
            return self._leader_id
        if self._role == OBSERVER:
            ordered = sorted(self.voters)
            return ordered[self._observer_rr % len(ordered)]
        return None

    def _send_fetch(self) -> None:
        target = self._fetch_target()
        if target is None:
            return
        offset, epoch = self.log_end_offset, self.last_epoch
        deadline = self._now + self._cfg.fetch_max_wait_ms + self._cfg.request_timeout_ms
        self._inflight = _Inflight(False, target, offset, epoch, deadline)
        self._send(
            FetchRequest(
                self.node_id,
                target,
                self._epoch,
                offset,
                epoch,
                observer=not self._is_voter,
                high_watermark=self._hw,
            )
        )

    def _tick_fetcher(self) -> None:
        now = self._now
        if now >= self._fetch_deadline:
            if self._role == FOLLOWER:
                self._become_prospective()  # the leader went quiet: pre-vote
                return
            # An observer moves on to the next voter.
            self._leader_id = None
            self._observer_rr += 1
            self._fetch_deadline = now + self._cfg.fetch_timeout_ms
            self._inflight = None
            self._next_fetch_ms = now
        if self._inflight is not None and now >= self._inflight.deadline_ms:
            self._inflight = None  # lost: ask again
            self._next_fetch_ms = now
        if self._inflight is None and now >= self._next_fetch_ms:
            self._send_fetch()

    def _on_fetch_response(self, m: FetchResponse) -> None:
        # Every epoch change clears the inflight fetch, and an answer to it carries its
        # epoch; a FENCED_LEADER_EPOCH answer already moved us on in _observe_epoch.
        inflight = self._inflight
        if (
            m.epoch != self._epoch
            or self._role not in (FOLLOWER, OBSERVER)
            or inflight is None
            or inflight.snapshot
            or (inflight.dst, inflight.offset, inflight.epoch)
            != (m.src, m.base_offset, m.last_fetched_epoch)
        ):
            return  # stale, duplicated or not ours
        self._inflight = None
        now = self._now
        if m.error is not None:
            if self._role == OBSERVER:
                hint = m.leader_id if m.leader_id != m.src else None
                if hint is None:
                    self._observer_rr += 1
                elif hint != self._leader_id:
                    self._fetch_deadline = now + self._cfg.fetch_timeout_ms
                self._leader_id = hint
                self._next_fetch_ms = now if hint is not None else now + self._cfg.retry_backoff_ms
            else:
                self._next_fetch_ms = now + self._cfg.retry_backoff_ms
            if self._next_fetch_ms <= now:
                self._send_fetch()  # straight to the leader we were pointed at
            return
        if self._role == FOLLOWER and m.src != self._leader_id:
            broken(
                "a follower's fetch is answered by its leader",
                node=self.node_id,
                answered_by=m.src,
                epoch=m.epoch,
                leader=self._leader_id,
            )
        self._leader_id = m.src  # an observer learns the leader here
        self._last_leader_contact = now
        self._fetch_deadline = now + self._cfg.fetch_timeout_ms
        if m.diverging_epoch is not None and m.diverging_end_offset is not None:
            self._truncate_diverging(m.diverging_epoch, m.diverging_end_offset)
        elif m.snapshot_offset is not None and m.snapshot_epoch is not None:
            deadline = now + self._cfg.request_timeout_ms
            self._inflight = _Inflight(True, m.src, m.snapshot_offset, m.snapshot_epoch, deadline)
            self._send(
                FetchSnapshotRequest(
                    self.node_id, m.src, self._epoch, m.snapshot_offset, m.snapshot_epoch
                )
            )
            return
        else:
            if m.entries:
                self._append_local(m.entries)
            hw = min(m.high_watermark, self.log_end_offset)
            if hw > self._hw:
                self._set_hw(hw)
        self._next_fetch_ms = now
        self._send_fetch()

    def _truncate_diverging(self, epoch: int, end_offset: int) -> None:
        """Cut our log back to where it may still agree with the leader's (Kafka's
        truncateToEndOffset): the leader's epoch `epoch` ends at `end_offset`."""
        end = self.log_end_offset
        local = self._cache.end_offset_for(epoch, end)
        if local is None:
            target = self._log_start
        elif local[0] == epoch:
            target = min(local[1], end_offset)
        else:
            target = local[1]
        self._truncate(min(target, end))

    def _on_fetch_snapshot_response(self, m: FetchSnapshotResponse) -> None:
        inflight = self._inflight
        if (
            m.epoch != self._epoch
            or self._role not in (FOLLOWER, OBSERVER)
            or inflight is None
            or not inflight.snapshot
            or (inflight.dst, inflight.offset, inflight.epoch)
            != (m.src, m.snapshot_offset, m.snapshot_epoch)
        ):
            return
        self._inflight = None
        if m.error is not None:
            self._next_fetch_ms = self._now + self._cfg.retry_backoff_ms
            return
        self._last_leader_contact = self._now
        self._fetch_deadline = self._now + self._cfg.fetch_timeout_ms
        self._install_snapshot(Snapshot(m.snapshot_offset, m.snapshot_epoch, m.data))
        self._next_fetch_ms = self._now
        self._send_fetch()

    # -- request handlers ---------------------------------------------------------------

    def _fetch_error(self, m: FetchRequest, error: str) -> FetchResponse:
        return FetchResponse(
            self.node_id,
            m.src,
            self._epoch,
            self._leader_id,
            error,
            m.fetch_offset,
            high_watermark=self._hw,
            log_start_offset=self._log_start,
            last_fetched_epoch=m.last_fetched_epoch,
        )

    def _on_fetch_request(self, m: FetchRequest) -> None:
        if m.epoch < self._epoch:
            self._send(self._fetch_error(m, FENCED_LEADER_EPOCH))
        elif self._role != LEADER:
            self._send(self._fetch_error(m, NOT_LEADER))
        else:
            self._leader_fetch(m)

    def _on_fetch_snapshot_request(self, m: FetchSnapshotRequest) -> None:
        error, data = None, None
        snap = self._snapshot
        if m.epoch < self._epoch:
            error = FENCED_LEADER_EPOCH
        elif self._role != LEADER:
            error = NOT_LEADER
        elif snap is None or (snap.end_offset, snap.epoch) != (m.snapshot_offset, m.snapshot_epoch):
            error = SNAPSHOT_NOT_FOUND
        else:
            data = snap.data
            replica = self._replica(m.src)
            if replica is not None:
                replica.last_fetch_ms = self._now
        self._send(
            FetchSnapshotResponse(
                self.node_id,
                m.src,
                self._epoch,
                self._leader_id,
                error,
                m.snapshot_offset,
                m.snapshot_epoch,
                data,
            )
        )

    def _log_up_to_date(self, m: VoteRequest) -> bool:
        return (m.last_epoch, m.last_offset) >= (self.last_epoch, self.log_end_offset)

    def _on_vote_request(self, m: VoteRequest) -> None:
        if m.pre_vote:
            granted = (
                self._is_voter
                and m.epoch > self._epoch
                and self._role != LEADER
                # Someone who still hears from a leader refuses: no disruption by a node
                # that is merely cut off.
                and self._now - self._last_leader_contact >= self._cfg.fetch_timeout_ms
                and self._log_up_to_date(m)
            )
        else:
            granted = (
                self._is_voter
                and m.epoch == self._epoch  # a newer epoch was adopted by _observe_epoch
                and self._role not in (LEADER, CANDIDATE)
                and self._leader_id is None
                and self._voted_for in (None, m.candidate_id)
                and self._log_up_to_date(m)
            )
            if granted:
                if self._voted_for is None:
                    self._voted_for = m.candidate_id
                    self._persist(("state", self._epoch, m.candidate_id))  # answer waits
                if self._role == PROSPECTIVE:
                    self._leave_role()
                    self._role = UNATTACHED
                self._election_deadline = self._now + self._random_election_timeout()
        self._send(
            VoteResponse(self.node_id, m.src, self._epoch, granted, m.pre_vote, self._leader_id)
        )

    def _on_vote_response(self, m: VoteResponse) -> None:
        if m.pre_vote:
            if self._role != PROSPECTIVE or m.epoch > self._epoch:
                return
        elif self._role != CANDIDATE or m.epoch != self._epoch:
            return
        (self._grants if m.granted else self._rejects).add(m.src)
        if (
            m.pre_vote
            and not m.granted
            and m.epoch == self._epoch
            and m.leader_id is not None
            and m.leader_id != self.node_id
        ):
            self._become_follower(self._epoch, m.leader_id)  # there is a leader after all
            return
        self._count_votes()

    def _on_begin_quorum_epoch(self, m: BeginQuorumEpoch) -> None:
        if m.epoch == self._epoch and self._is_voter:
            if self._role == LEADER:
                if m.leader_id != self.node_id:
                    broken(
                        "election safety: one leader per epoch",
                        node=self.node_id,
                        epoch=m.epoch,
                        leader=self.node_id,
                        other=m.leader_id,
                    )
            else:
                self._become_follower(m.epoch, m.leader_id)
                self._last_leader_contact = self._now
        self._send(BeginQuorumEpochResponse(self.node_id, m.src, self._epoch))

    def _on_end_quorum_epoch(self, m: EndQuorumEpoch) -> None:
        if (
            self._is_voter
            and m.epoch == self._epoch
            and self._role in (FOLLOWER, UNATTACHED)
            and self._leader_id in (None, m.leader_id)
        ):
            succ = m.preferred_successors
            if self.node_id in succ:
                delay = succ.index(self.node_id) * self._cfg.end_quorum_backoff_ms
            else:
                delay = self._random_election_timeout()
            self._become_unattached(self._epoch, delay_ms=delay)
            self._last_leader_contact = _NEVER  # the leader is gone: grant pre-votes
        self._send(EndQuorumEpochResponse(self.node_id, m.src, self._epoch))

    def _on_begin_quorum_epoch_response(self, m: BeginQuorumEpochResponse) -> None:
        if self._role == LEADER and m.epoch == self._epoch:
            self._begin_pending.discard(m.src)

    def _on_ignored(self, m: Message) -> None:
        """An ack whose only content, the epoch, was handled by _observe_epoch."""

    def _send(self, msg: Message) -> None:
        # Sent once everything recorded so far is durable (a vote, a candidacy, the
        # entries a fetch offset acknowledges).
        self._outbox.append((self._seq, msg))


_HANDLERS: dict[type, Any] = {
    FetchRequest: RaftNode._on_fetch_request,
    FetchResponse: RaftNode._on_fetch_response,
    FetchSnapshotRequest: RaftNode._on_fetch_snapshot_request,
    FetchSnapshotResponse: RaftNode._on_fetch_snapshot_response,
    VoteRequest: RaftNode._on_vote_request,
    VoteResponse: RaftNode._on_vote_response,
    BeginQuorumEpoch: RaftNode._on_begin_quorum_epoch,
    BeginQuorumEpochResponse: RaftNode._on_begin_quorum_epoch_response,
    EndQuorumEpoch: RaftNode._on_end_quorum_epoch,
    EndQuorumEpochResponse: RaftNode._on_ignored,
}
