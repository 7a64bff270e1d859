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
from .voters import Voter, VoterSet, is_control

LEADER = "leader"
CANDIDATE = "candidate"
PROSPECTIVE = "prospective"  # running a pre-vote
FOLLOWER = "follower"
UNATTACHED = "unattached"  # a voter that knows no leader for its epoch
OBSERVER = "observer"

_NEVER = -(1 << 62)  # a time long before any now_ms


@dataclass(frozen=True, slots=True)
class RaftConfig:
    # Declared as settings (flags, Kafka names) by ControllerConfig (controller/config.py),
    # which takes these values as their defaults.
    election_timeout_ms: int = 1000  # randomized in [T, 2T)
    fetch_timeout_ms: int = 2000  # without a good fetch: campaign
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


class VoterChangeRefused(Exception):
    """A voter change the leader will not make; `code` names why (VoterChangeRefused.*),
    the message says it to a person. Nothing was changed."""

    NOT_READY = "NOT_READY"  # the leader has not committed an entry of its epoch yet
    PENDING = "CHANGE_PENDING"  # a voter change is appended but not committed
    DUPLICATE = "DUPLICATE_VOTER"
    NOT_FOUND = "VOTER_NOT_FOUND"
    NOT_CAUGHT_UP = "NOT_CAUGHT_UP"  # the new voter is not an observer in step with us
    LAST_VOTER = "LAST_VOTER"
    LOSES_MAJORITY = "LOSES_MAJORITY"  # the new set's live voters would be no majority

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


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
    directory_id: str | None = None
    # The leader's log end when this replica last fetched, and when: a fetch that
    # reaches it proves the replica was caught up then (Kafka's lastCaughtUpTimestamp).
    prev_leader_end: int = 0
    prev_fetch_ms: int = _NEVER

    def describe(self, leader_end: int) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "directory_id": self.directory_id,
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
        voters: frozenset[int] | VoterSet,
        storage: RaftStorage,
        config: RaftConfig | None = None,
        rng: random.Random | None = None,
        now_ms: int = 0,
        persist_inline: bool = True,
        directory_id: str | None = None,
    ) -> None:
        if not voters:
            raise ValueError("a quorum needs at least one voter")
        self.node_id = node_id
        self.directory_id = directory_id
        # The set the node was started with (static flags): in force until the log or a
        # snapshot holds one, and the voters an observer asks for the leader.
        self._static = voters if isinstance(voters, VoterSet) else VoterSet.static(voters)
        self._base_voters = self._static  # the set at the log start (snapshot or static)
        self._voter_history: list[tuple[int, VoterSet]] = []  # (offset, set) in the log
        self._is_voter = False  # a voter of the set in force
        # ... or one that an uncommitted change removes: it still campaigns (counting
        # only the new set's votes), or nobody might: the new set's voters may all lack
        # the entry that made them the set (Raft thesis 4.2.2).
        self._eligible = False
        self._majority = 1
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
        if snapshot is not None and snapshot.voters is not None:
            self._base_voters = VoterSet.from_list(snapshot.voters)
        self._role = UNATTACHED  # settled below, once the voter set is known
        self._append_to_memory(entries)
        self._hw = log_start  # what a snapshot holds is committed; the rest we learn
        self._compute_membership()
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
        self._role = UNATTACHED if self._eligible else OBSERVER
        self._leader_id: int | None = None
        self._election_deadline = _NEVER
        self._last_leader_contact = _NEVER
        # follower / observer
        self._fetch_deadline = _NEVER
        self._next_fetch_ms = _NEVER
        self._inflight: _Inflight | None = None
        self._observer_rr = self._rng.randrange(len(self._static))
        # prospective / candidate
        self._grants: set[int] = set()
        self._rejects: set[int] = set()
        # leader
        self._replicas: dict[int, ReplicaState] = {}
        self._observers: dict[int, ReplicaState] = {}
        self._parked: dict[int, tuple[FetchRequest, int]] = {}
        self._begin_pending: set[int] = set()
        self._begin_resend_ms = _NEVER
        self._epoch_start = 0  # offset of the leader's first entry of its epoch
        # (epoch, offset) of the last voter change asked of this node as leader.
        self._requested_change: tuple[int, int] = (-1, -1)
        self._lead_start_ms = _NEVER  # when this node became leader
        self._self_vote_seq = 0  # the storage op of a candidate's vote for itself

        if self._eligible:
            self._become_unattached(epoch)
        else:
            self._become_observer_without_leader()

    # -- read-only view -----------------------------------------------------------------

    @property
    def role(self) -> str:
        return self._role

    @property
    def voter_set(self) -> VoterSet:
        """The set in force: the latest in the log (committed or not), else the
        snapshot's, else the static one."""
        return self._voter_history[-1][1] if self._voter_history else self._base_voters

    @property
    def voters(self) -> frozenset[int]:
        return self.voter_set.ids

    @property
    def is_voter(self) -> bool:
        return self._is_voter

    @property
    def may_campaign(self) -> bool:
        """A voter, or one an uncommitted change removes (see _eligible)."""
        return self._eligible

    @property
    def voter_change_pending(self) -> bool:
        """A voter set is in the log above the high watermark."""
        return bool(self._voter_history) and self._voter_history[-1][0] >= self._hw

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
            "directory_id": self.directory_id,
            "voter_set": self.voter_set.to_list(),
            "voter_change_pending": self.voter_change_pending,
        }
        if self._role == LEADER:
            end = self.log_end_offset
            me = ReplicaState(self.node_id, end, self._now, self._now, self.directory_id)
            voters = [*self._replicas.values()]
            observers = [*self._observers.values()]
            (voters if self._is_voter else observers).append(me)
            s["voters"] = [r.describe(end) for r in sorted(voters, key=lambda r: r.node_id)]
            s["observers"] = [r.describe(end) for r in sorted(observers, key=lambda r: r.node_id)]
        return s

    def voters_reachable(self) -> tuple[int, int] | None:
        """On the leader: (voters that fetched within the check-quorum window, counting
        itself; voters that did not), the same test check-quorum applies. None elsewhere."""
        if self._role != LEADER:
            return None
        window = self._cfg.check_quorum_ms
        ok = sum(1 for r in self._replicas.values() if self._now - r.last_fetch_ms < window)
        own = int(self._is_voter)  # a leader removing itself is no voter of the new set
        return own + ok, len(self._replicas) - ok

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
        if self._role == CANDIDATE and self.node_id not in self._grants:
            self._self_grant()
            self._count_votes()
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
        if is_control(data):
            raise ValueError("None and dicts with a 'kraft' key are reserved for control entries")
        if self._role != LEADER:
            raise NotLeader(self._leader_id, self._epoch)
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
        base = self._voters_at(end_offset)
        history = [(o, v) for o, v in self._voter_history if o >= end_offset]
        written = self._base_voters is not self._static or len(history) < len(self._voter_history)
        # A log that never held a voter set keeps snapshots without one (still static).
        voters = base.to_list() if written else None
        snapshot = Snapshot(end_offset, self._entry_epoch(end_offset - 1), data, voters)
        self._base_voters, self._voter_history = base, history
        self._cache.truncate_start(end_offset, snapshot.epoch, self.log_end_offset)
        del self._log[: end_offset - self._log_start]
        self._log_start = end_offset
        self._snapshot = snapshot
        self._persist(("snapshot", snapshot))

    # -- voter changes (KIP-853), on the leader ------------------------------------------

    def add_voter(self, voter: Voter) -> int:
        """Append a voter set with `voter` added; the offset of that entry. The set is in
        force at once; the change is done once the high watermark passes the offset.
        `voter` must be an observer fetching from this leader, with that directory id,
        and caught up. Raises NotLeader or VoterChangeRefused (nothing changed)."""
        vs = self._check_change()
        if voter.node_id in vs.ids:
            raise VoterChangeRefused(
                VoterChangeRefused.DUPLICATE,
                f"node {voter.node_id} is already a voter ({vs.get(voter.node_id)}); "
                "remove it first to replace it",
            )
        r = self._observers.get(voter.node_id)
        if r is None or self._now - r.last_fetch_ms >= self._cfg.check_quorum_ms:
            raise VoterChangeRefused(
                VoterChangeRefused.NOT_CAUGHT_UP,
                f"node {voter.node_id} is not fetching from the leader (node {self.node_id}): "
                "start it as an observer first (unknown or unreachable node)",
            )
        if r.directory_id != voter.directory_id:
            raise VoterChangeRefused(
                VoterChangeRefused.NOT_CAUGHT_UP,
                f"node {voter.node_id} fetches with directory id {r.directory_id}, "
                f"not {voter.directory_id}",
            )
        if self._now - r.last_caught_up_ms >= self._cfg.fetch_timeout_ms:
            raise VoterChangeRefused(
                VoterChangeRefused.NOT_CAUGHT_UP,
                f"node {voter.node_id} is behind the leader's log "
                f"({r.end_offset} of {self.log_end_offset}); retry once it has caught up",
            )
        new = self._pinned(vs).added(voter)
        self._check_majority(new, {voter.node_id})
        return self._append_voters(new)

    def remove_voter(self, node_id: int, directory_id: str | None = None) -> int:
        """Append a voter set without `node_id` (whose directory id must match, when
        given); the offset of that entry. A leader removing itself leads until that
        entry commits, then resigns. Raises NotLeader or VoterChangeRefused."""
        vs = self._check_change()
        v = vs.get(node_id)
        if v is None or (directory_id is not None and v.directory_id not in (None, directory_id)):
            raise VoterChangeRefused(
                VoterChangeRefused.NOT_FOUND,
                f"no voter ({node_id}, {directory_id}) in the voter set {vs.to_list()}",
            )
        if len(vs) == 1:
            raise VoterChangeRefused(
                VoterChangeRefused.LAST_VOTER,
                f"node {node_id} is the last voter: a quorum needs one",
            )
        new = self._pinned(vs).removed(node_id)
        self._check_majority(new, set())
        return self._append_voters(new)

    def update_voter(self, voter: Voter) -> int:
        """Append a voter set where `voter` (same id, matching directory id) has new
        endpoints (and a static voter gets its directory id). Raises as the others."""
        vs = self._check_change()
        v = vs.get(voter.node_id)
        if v is None or not v.matches(voter.node_id, voter.directory_id):
            raise VoterChangeRefused(
                VoterChangeRefused.NOT_FOUND,
                f"no voter ({voter.node_id}, {voter.directory_id}) in {vs.to_list()}",
            )
        return self._append_voters(self._pinned(vs).replaced(voter))

    def _check_change(self) -> VoterSet:
        """The refusals before any voter change, in Kafka's words (AddVoterHandler /
        RemoveVoterHandler.handle*VoterRequest, Kafka 4.x): REQUEST_TIMED_OUT with these
        messages, so a client retries."""
        if self._role != LEADER:
            raise NotLeader(self._leader_id, self._epoch)
        requested = self._requested_change
        if self.voter_change_pending and requested == (self._epoch, self._voter_history[-1][0]):
            # Kafka's isOperationPending: a change asked for on this leader is not
            # committed yet.
            raise VoterChangeRefused(
                VoterChangeRefused.PENDING,
                "Request timed out waiting for leader to handle previous voter change request",
            )
        if self._hw <= self._epoch_start:
            # Until an entry of its epoch commits, a new leader may hold an uncommitted
            # change of an earlier leader that it does not know about yet (Raft's
            # single-server change bug): no change before that.
            raise VoterChangeRefused(
                VoterChangeRefused.NOT_READY,
                "Request timed out waiting for leader to establish HWM and fence previous "
                "voter changes",
            )
        if self.voter_change_pending:
            # An uncommitted voter set nobody asked this leader for (an earlier leader's,
            # or this one's own pinning of the static voters' directory ids). Kafka
            # formats the offset as a Java Optional.
            offset = self._voter_history[-1][0]
            raise VoterChangeRefused(
                VoterChangeRefused.PENDING,
                "Request timed out waiting for voters to commit the latest voter change at "
                f"Optional[{offset}] with HWM {self._hw}",
            )
        return self.voter_set

    def _pinned(self, vs: VoterSet) -> VoterSet:
        """`vs` with the directory id of each static voter we know it for: a written set
        names each voter's storage, so a voter whose storage is lost never counts again."""
        if self.directory_id is not None:
            vs = vs.with_directory(self.node_id, self.directory_id)
        for r in self._replicas.values():
            if r.directory_id is not None:
                vs = vs.with_directory(r.node_id, r.directory_id)
        return vs

    def _check_majority(self, new: VoterSet, joining: set[int]) -> None:
        live = set(joining)
        if new.matches(self.node_id, self.directory_id):
            live.add(self.node_id)
        for r in self._replicas.values():
            # prev_fetch_ms: a fetch really made (last_fetch_ms starts at the election).
            if r.node_id in new.ids and self._now - r.prev_fetch_ms < self._cfg.check_quorum_ms:
                live.add(r.node_id)
        if len(live) < new.majority:
            raise VoterChangeRefused(
                VoterChangeRefused.LOSES_MAJORITY,
                f"the new voter set {sorted(new.ids)} needs {new.majority} live voters; "
                f"only {sorted(live)} are in contact with the leader",
            )

    def _append_voters(self, new: VoterSet, requested: bool = True) -> int:
        """`requested`: asked for by add/remove/update_voter (not the leader's own)."""
        offset = self.log_end_offset
        if requested:
            self._requested_change = (self._epoch, offset)
        self._append_local([Entry(self._epoch, new.to_entry())])  # in force from here
        self._maybe_advance_hw()
        self._answer_parked()
        return offset

    def resign(self, now_ms: int) -> None:
        """Graceful shutdown of a leader: hand over to the most caught-up voters."""
        self._now = now_ms
        if self._role != LEADER:
            return
        self._resign()

    def _resign(self) -> None:
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
        if not self._eligible:
            self._become_observer_without_leader()
            return
        self._role = UNATTACHED
        delay = self._random_election_timeout() if delay_ms is None else delay_ms
        self._election_deadline = self._now + delay

    def _voters_at(self, end_offset: int) -> VoterSet:
        """The set in force for the entries below end_offset."""
        vs = self._base_voters
        for o, v in self._voter_history:
            if o >= end_offset:
                break
            vs = v
        return vs

    def _compute_membership(self) -> None:
        vs = self.voter_set
        self._is_voter = vs.matches(self.node_id, self.directory_id)
        self._majority = vs.majority
        self._eligible = self._is_voter
        if not self._is_voter and self.voter_change_pending:
            previous = self._voters_at(self._voter_history[-1][0])
            self._eligible = previous.matches(self.node_id, self.directory_id)

    def _set_membership(self) -> None:
        """The voter set in force changed (appended, truncated, a snapshot installed):
        what this node is in it, and what the leader tracks."""
        was = self._eligible
        self._compute_membership()
        if self._role == LEADER:
            self._reconcile_replicas()
            return
        if was == self._eligible:
            return
        if self._eligible:
            if self._role == OBSERVER and self._leader_id is not None:
                self._role = FOLLOWER  # keeps fetching from the same leader
            elif self._role == OBSERVER:
                self._become_unattached(self._epoch)
        elif self._role == FOLLOWER:
            self._role = OBSERVER
        elif self._role in (UNATTACHED, PROSPECTIVE, CANDIDATE):
            self._leave_role()
            self._become_observer_without_leader()

    def _reconcile_replicas(self) -> None:
        vs = self.voter_set
        others = vs.ids - {self.node_id}
        for nid in [n for n in self._replicas if n not in others]:
            r = self._replicas.pop(nid)
            # An observer under that id already (a voter's new storage, fetching as one)
            # is the live one: the removed voter's state must not overwrite it.
            if nid not in self._observers and len(self._observers) < self._cfg.max_observers:
                self._observers[nid] = r
        for nid in others - self._replicas.keys():
            seen = self._observers.get(nid)
            if seen is not None and vs.matches(nid, seen.directory_id):
                self._replicas[nid] = self._observers.pop(nid)
            else:
                # A full check-quorum period from now, as voters get at an election.
                self._replicas[nid] = ReplicaState(nid, 0, self._now)
        self._begin_pending &= others

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
        self._role = FOLLOWER if self._eligible else OBSERVER
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
        for v in self.voter_set.voters:
            if v.node_id == self.node_id:
                continue
            self._send(
                VoteRequest(
                    self.node_id,
                    v.node_id,
                    self._epoch + 1,
                    self.node_id,
                    self.last_epoch,
                    self.log_end_offset,
                    pre_vote=True,
                    voter_directory_id=v.directory_id,
                )
            )
        self._count_votes()

    def _become_candidate(self) -> None:
        self._leave_role()
        self._epoch += 1
        self._voted_for = self.node_id
        self._persist(("state", self._epoch, self.node_id))  # the requests wait for it
        self._self_vote_seq = self._seq
        self._role = CANDIDATE
        self._leader_id = None
        self._self_grant()
        self._election_deadline = self._now + self._random_election_timeout()
        for v in self.voter_set.voters:
            if v.node_id == self.node_id:
                continue
            self._send(
                VoteRequest(
                    self.node_id,
                    v.node_id,
                    self._epoch,
                    self.node_id,
                    self.last_epoch,
                    self.log_end_offset,
                    pre_vote=False,
                    voter_directory_id=v.directory_id,
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
        self._epoch_start = self.log_end_offset
        self._lead_start_ms = self._now
        self._append_local([Entry(self._epoch, None)])
        self._maybe_advance_hw()

    def _self_grant(self) -> None:
        """A candidate's own vote counts once it is durable: a lone voter would lead
        at once, and lead the same epoch as another after a crash lost its vote."""
        if self._role == CANDIDATE and self._durable >= self._self_vote_seq:
            self._grants.add(self.node_id)

    def _count_votes(self) -> None:
        # Only the grants of voters of the set in force count (a vote from a node the
        # set does not hold would make no majority of it).
        if len(self._grants & self.voters) >= self._majority:
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

    def _append_to_memory(self, entries: list[Entry] | tuple[Entry, ...]) -> bool:
        """Entries into the in-memory log; True if a voter set was among them."""
        end = self.log_end_offset
        changed = False
        for i, e in enumerate(entries):
            if e.data is not None:
                vs = VoterSet.from_entry(e.data)
                if vs is not None:
                    self._voter_history.append((end + i, vs))
                    changed = True
            if e.epoch > self._epoch:
                broken(
                    "no entry of a later epoch than the node's",
                    node=self.node_id,
                    entry_epoch=e.epoch,
                    epoch=self._epoch,
                )
            self._cache.append(e.epoch, end + i)
        self._log.extend(entries)
        return changed

    def _append_local(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        changed = self._append_to_memory(entries)
        self._persist(("append", list(entries)))
        if changed:
            self._set_membership()

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
        kept = [(o, v) for o, v in self._voter_history if o < end_offset]
        if len(kept) < len(self._voter_history):
            self._voter_history = kept  # the set in force reverts with the log
            self._set_membership()

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
        voters = snapshot.voters
        self._base_voters = VoterSet.from_list(voters) if voters is not None else self._static
        self._voter_history = []
        self._set_hw(snapshot.end_offset)
        self._pending_snapshot = snapshot
        self._next_apply = snapshot.end_offset
        self._truncations += 1
        self._set_membership()

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
        pending = self.voter_change_pending
        self._hw = hw
        if pending and not self.voter_change_pending:
            # A node the change removed is no candidate any more (a leader resigns at
            # its next tick).
            if self._role == LEADER:
                self._compute_membership()
            else:
                self._set_membership()

    # -- leader -------------------------------------------------------------------------

    def _maybe_advance_hw(self) -> bool:
        """The largest offset a majority of voters reached, once it covers an entry of
        this epoch. True when it moved."""
        # Our own log counts only as far as it is durable (etcd-raft's rule as well).
        own = min(self._durable_end, self.log_end_offset)
        ends = [r.end_offset for r in self._replicas.values()]
        if self._is_voter:  # a leader removing itself counts only the new set
            ends.append(own)
        ends.sort(reverse=True)
        reached = ends[self._majority - 1]
        if reached > self._hw and self._entry_epoch(reached - 1) == self._epoch:
            self._set_hw(reached)
            return True
        return False

    def _tick_leader(self) -> None:
        now = self._now
        if not self._is_voter and not self.voter_change_pending:
            # The set that removed this leader is committed: hand over (KIP-853).
            self._resign()
            return
        alive = int(self._is_voter) + sum(
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
        self._maybe_pin_static()

    def _maybe_pin_static(self) -> None:
        """Record the directory ids of static voters (KIP-853's kraft.version 0 -> 1,
        made automatic): a static voter matches any storage of its node id, so until its
        id is in the log a controller back on empty storage would vote and count toward
        the high watermark as the voter it was. The leader learns each voter's id from
        its fetches and appends the pinned set as an ordinary change (one uncommitted
        change at a time); from then on a new storage under that id is an observer.

        It waits up to a check-quorum period from its election for every voter's id, so
        that one entry pins them all; a voter silent longer is left static and pinned by
        a later entry once it fetches. The residual window (a disk lost before the pinned
        set is in every voter's log) is in voters.py's docstring."""
        if not self._is_voter or self._hw <= self._epoch_start or self.voter_change_pending:
            return
        vs = self.voter_set
        pinned = self._pinned(vs)
        if pinned == vs:
            return
        waiting = self._now - self._lead_start_ms < self._cfg.check_quorum_ms
        if waiting and any(v.directory_id is None for v in pinned.voters):
            return
        self._append_voters(pinned, requested=False)

    def _replica(self, node_id: int, directory_id: str | None) -> tuple[ReplicaState | None, bool]:
        """The state of a fetcher, and whether it is a voter: one of the set in force
        with that directory id (another storage under a voter's id is an observer)."""
        if self.voter_set.matches(node_id, directory_id):
            r = self._replicas.get(node_id)
            if r is not None:
                r.directory_id = directory_id
                return r, True
        r = self._observers.get(node_id)
        if r is None and len(self._observers) < self._cfg.max_observers:
            r = self._observers[node_id] = ReplicaState(node_id)
        if r is not None and r.directory_id != directory_id:
            # Another storage under this id: what we knew of the old one is void.
            r.directory_id, r.end_offset = directory_id, 0
            r.last_caught_up_ms = r.prev_fetch_ms = _NEVER
        return r, False

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
        replica, is_voter = self._replica(m.src, m.directory_id)
        self._begin_pending.discard(m.src)
        resp, valid = self._answer_fetch(m)
        moved = False
        if replica is not None:
            replica.last_fetch_ms = now
            if valid:
                # max(): a reordered older fetch must not move a replica back.
                replica.end_offset = max(replica.end_offset, m.fetch_offset)
                end = self.log_end_offset
                if m.fetch_offset >= end:
                    replica.last_caught_up_ms = now
                elif m.fetch_offset >= replica.prev_leader_end:
                    # It holds all we had at its previous fetch: caught up as of then.
                    replica.last_caught_up_ms = max(
                        replica.last_caught_up_ms, replica.prev_fetch_ms
                    )
                replica.prev_leader_end, replica.prev_fetch_ms = end, now
                if is_voter:
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
            ordered = sorted((self.voters | self._static.ids) - {self.node_id})
            return ordered[self._observer_rr % len(ordered)] if ordered else None
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
                directory_id=self.directory_id,
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
        self._install_snapshot(Snapshot(m.snapshot_offset, m.snapshot_epoch, m.data, m.voters))
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
        error, data, voters = None, None, None
        snap = self._snapshot
        if m.epoch < self._epoch:
            error = FENCED_LEADER_EPOCH
        elif self._role != LEADER:
            error = NOT_LEADER
        elif snap is None or (snap.end_offset, snap.epoch) != (m.snapshot_offset, m.snapshot_epoch):
            error = SNAPSHOT_NOT_FOUND
        else:
            data, voters = snap.data, snap.voters
            replica = self._replicas.get(m.src) or self._observers.get(m.src)
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
                voters,
            )
        )

    def _log_up_to_date(self, m: VoteRequest) -> bool:
        return (m.last_epoch, m.last_offset) >= (self.last_epoch, self.log_end_offset)

    def _on_vote_request(self, m: VoteRequest) -> None:
        # Whether we are the voter the candidate asks: by directory id when its set names
        # one (so a node on new storage never votes as the voter it replaced, and a voter
        # whose own log does not hold the newest set yet still votes), else by our set.
        if m.voter_directory_id is not None:
            member = m.voter_directory_id == self.directory_id
        else:
            member = self._is_voter
        if m.pre_vote:
            granted = (
                member
                and m.epoch > self._epoch
                and self._role != LEADER
                # Someone who still hears from a leader refuses: no disruption by a node
                # that is merely cut off.
                and self._now - self._last_leader_contact >= self._cfg.fetch_timeout_ms
                and self._log_up_to_date(m)
            )
        else:
            granted = (
                member
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
        if m.epoch == self._epoch and self._eligible:
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
            self._eligible
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
