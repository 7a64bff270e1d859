"""The replication decisions of one partition replica, as a sans-IO state machine.

No clock, sockets, files or asyncio in here: the caller passes the time (`now`, seconds
of a monotonic clock) and its log end offset, and gets back what changed or what to do.
`Partition` (partitions.py) is this class plus the log, the futures that wait on the
high watermark and the wake-ups of fetch sessions; the replica fetcher, the Fetch and
OffsetForLeaderEpoch handlers and ISR upkeep (replication/isr.py) ask it. The
replication simulation (replication/simulation.py) drives this very class with an
in-memory log, so what the simulation checks is what the broker runs.

Leader (Kafka's Partition + Replica):
- `update` applies the controller's view (leader, epochs, replicas, ISR); a new
  leadership starts its epoch at the log end (`epoch_start_offset`, the epoch cache
  entry the caller persists).
- `on_follower_fetch` records a follower's log end and when it was last caught up, for
  the incarnation of the follower's broker it came from (KIP-903: what a process that
  restarted since fetched says nothing of the log it restarted with).
- `advance_hw`: the high watermark is the lowest log end over the maximal ISR (a pending
  expansion counts at once, a pending shrink only once the controller committed it,
  KIP-497), and never moves back on a leader.
- `isr_change` proposes a shrink (a follower not caught up for `lag_s`) or an expansion
  (a live follower caught up to max(high watermark, epoch start), as fetched by its
  broker's current incarnation); one change in flight (`pending_isr`) until the
  controller's answer or a new partition epoch settles it. `isr_incarnations` is what
  the proposal tells the controller, which refuses a member that registered again since.
- `under_min_isr` refuses acks=all writes.

- `diverging_epoch` checks a fetch's last fetched epoch against the leader's epoch
  cache (KIP-320, Fetch v12+): a follower whose log parted from the leader's is told
  where (its fetch then records nothing: it is not caught up).

Follower:
- `truncation_offset` is where a follower cuts its log after a leader change, from the
  leader's OffsetForLeaderEpoch answer (KIP-101/KIP-279) or a Fetch answer's diverging
  epoch (KIP-320), and its own epoch cache.
- `follower_hw` takes the leader's high watermark, bounded by its own log end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

LEADER, FOLLOWER = "leader", "follower"
UNDEFINED = -1


class PartitionView(Protocol):
    """What the controller says of the partition (metadata's PartitionImage)."""

    replicas: list[int]
    isr: list[int]
    leader: int
    leader_epoch: int
    partition_epoch: int


class EpochView(Protocol):
    """A replica's leader epoch cache (storage's LeaderEpochCache)."""

    latest_epoch: int

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]: ...


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one follower, from its fetches (Kafka's Replica)."""

    log_end_offset: int = -1
    last_fetch: float = 0.0
    last_caught_up: float = 0.0
    leo_at_last_fetch: int = -1  # the leader's LEO when this follower last fetched
    log_start_offset: int = -1  # the follower's own log start, from its fetches
    reset_at: float = -1.0  # when it left the ISR and its log end was forgotten
    # The follower's fetch session (KIP-227): while this partition sits in it unchanged,
    # each fetch in the session keeps the follower caught up without naming it. Any
    # object with `alive`, `last_fetch` and `parts` (fetch_sessions.FetchSession).
    session: Any = None
    # The registration (broker incarnation) of the process these fetches came from, as
    # this leader's metadata named it then; None: not known (no fetch yet).
    incarnation: str | None = None


# What `update` reports besides a role change.
UNCHANGED, GREW = 0, 1


class ReplicaCore:
    """One replica's replication state and decisions (see the module docstring)."""

    __slots__ = (
        "epoch_start_offset",
        "followers",
        "high_watermark",
        "index",
        "isr",
        "leader",
        "leader_epoch",
        "min_isr",
        "node_id",
        "partition_epoch",
        "pending_isr",
        "replicas",
        "role",
        "topic",
    )

    def __init__(self, topic: str, index: int, node_id: int) -> None:
        self.topic = topic
        self.index = index
        self.node_id = node_id
        self.role = ""
        self.leader = -1
        self.leader_epoch = -1
        self.partition_epoch = -1
        self.replicas: list[int] = []
        self.isr: list[int] = []
        self.pending_isr: list[int] | None = None  # an AlterPartition in flight
        self.min_isr = 1
        self.high_watermark = 0
        self.epoch_start_offset = 0
        self.followers: dict[int, FollowerState] = {}

    @property
    def is_leader(self) -> bool:
        return self.role == LEADER

    # -- the controller's view ---------------------------------------------------------

    def update(self, p: PartitionView, min_isr: int, leo: int, now: float) -> str | int:
        """Apply the controller's view. Returns LEADER or FOLLOWER when the role or the
        leader epoch changed (the caller assigns the epoch at `epoch_start_offset` as a
        leader, fails its acks=all waiters as a follower, and moves its fetcher), GREW
        when a leader learnt of a new follower (a reassignment), else UNCHANGED."""
        self.min_isr = min_isr
        self.replicas = list(p.replicas)
        changed = p.leader_epoch != self.leader_epoch or p.leader != self.leader
        if self.role == LEADER and not changed:
            for r in self.isr:
                if r not in p.isr and (f := self.followers.get(r)) is not None:
                    # Out of the ISR (fenced, or a lagging one this leader shrank): only
                    # fetches from now on may bring it back. What it fetched before may
                    # be gone (a restart that lost unflushed records), and a stale log
                    # end would let it rejoin at once (found by the simulation).
                    _forget(f, now)
        self.isr = list(p.isr)
        if p.partition_epoch != self.partition_epoch:
            self.pending_isr = None  # the controller answered (or overruled) it
        self.partition_epoch = p.partition_epoch
        if not changed and self.role:
            added = UNCHANGED
            if self.role == LEADER:
                # A replica moved away is forgotten: moved back later, it starts with an
                # empty log, and what this leader knew of it then (its log end, when it
                # was caught up) would put it in the ISR without a record (found by the
                # replication simulation: then elected, it lost acknowledged writes).
                for r in [r for r in self.followers if r not in self.replicas]:
                    del self.followers[r]
                for r in self.replicas:
                    if r != self.node_id and r not in self.followers:
                        self.followers[r] = FollowerState()
                        added = GREW
            return added
        self.leader = p.leader
        self.leader_epoch = p.leader_epoch
        self.pending_isr = None
        if p.leader == self.node_id:
            self.role = LEADER
            self.epoch_start_offset = leo
            # Followers start "caught up now" so the lag clock starts at the election.
            self.followers = {
                r: FollowerState(last_fetch=now, last_caught_up=now)
                for r in self.replicas
                if r != self.node_id
            }
        else:
            self.role = FOLLOWER
            self.followers = {}
        return self.role

    # -- leader side -------------------------------------------------------------------

    def maximal_isr(self) -> list[int]:
        """The ISR used for the high watermark: a pending expansion counts at once, a
        pending shrink only after it commits (KIP-497's safety rule)."""
        if self.pending_isr is None:
            return self.isr
        return self.isr + [r for r in self.pending_isr if r not in self.isr]

    def advance_hw(self, leo: int) -> bool:
        """Move the leader's high watermark to the lowest log end over the maximal ISR
        (a member not heard from yet counts as -1); True if it moved. Never backwards."""
        if self.role != LEADER:
            return False
        hw = leo
        followers = self.followers
        me = self.node_id
        for r in self.maximal_isr():
            if r != me:
                f = followers.get(r)
                hw = min(hw, self.known_end(f) if f is not None else -1)
        if hw > self.high_watermark:
            self.high_watermark = hw
            return True
        return False

    def before_append(self, leo: int) -> None:
        """Followers in fetch sessions were caught up until this append, though no fetch
        named this partition since: record it before the log end moves."""
        for f in self.followers.values():
            if f.session is not None:
                f.last_caught_up = self.caught_up_at(f, leo)

    def on_follower_fetch(
        self,
        replica: int,
        fetch_offset: int,
        leo: int,
        now: float,
        session: Any,
        log_start: int,
        incarnation: str | None = None,
    ) -> tuple[bool, bool]:
        """A follower fetched from `fetch_offset`: (known, its log start changed). Kafka's
        rule: a follower is caught up if it asks for the leader's LEO, or for what the
        LEO was at its previous fetch (then it was caught up back then). Unknown
        (a replica this leader does not know yet): nothing is recorded. `incarnation`:
        the follower's broker registration as this leader's metadata names it; a new one
        (the broker restarted, and may have lost what it had not flushed) starts over."""
        f = self.followers.get(replica)
        if f is None:
            return False, False
        if incarnation is not None and incarnation != f.incarnation:
            if f.incarnation is not None:
                _forget(f, now)
                f.session = None
                f.log_start_offset = -1
            f.incarnation = incarnation
        if fetch_offset >= leo:
            f.last_caught_up = now
        elif fetch_offset >= f.leo_at_last_fetch >= 0:
            f.last_caught_up = max(f.last_caught_up, f.last_fetch)
        f.log_end_offset = fetch_offset
        f.last_fetch = now
        f.leo_at_last_fetch = leo
        f.session = session
        if log_start != f.log_start_offset and log_start >= 0:
            f.log_start_offset = log_start
            return True, True
        return True, False

    def known_end(self, f: FollowerState) -> int:
        """The follower's log end as this leader knows it. Forgotten when it left the
        ISR, it is learnt again from a fetch naming the partition, or from its fetch
        session if that fetched since: an idle partition stays in the session at the
        offset last named, and is not named again until it changes (KIP-227), so
        without this a caught-up follower of an idle partition never rejoined (found
        by bench/fault_runs.py: an ISR of one, under min.insync, for good). A restarted
        follower opens a new session, so the old one never vouches for a lost log."""
        if f.log_end_offset >= 0:
            return f.log_end_offset
        s = f.session
        if s is None or not s.alive or s.last_fetch <= f.reset_at:
            return -1
        sp = s.parts.get((self.topic, self.index))
        return -1 if sp is None else sp.fetch_offset

    def caught_up_at(self, f: FollowerState, leo: int) -> float:
        """When the follower was last known caught up. A follower that holds the log
        end and keeps this partition in a live fetch session is caught up as of its
        session's last fetch: an append would have put the partition in that fetch."""
        t = f.last_caught_up
        s = f.session
        if (
            s is not None
            and s.alive
            and self.known_end(f) >= leo
            and (self.topic, self.index) in s.parts
        ):
            t = max(t, s.last_fetch)
        return t

    def isr_change(
        self,
        now: float,
        leo: int,
        lag_s: float,
        alive: Callable[[int], bool],
        incarnation: Callable[[int], str | None] | None = None,
    ) -> list[int] | None:
        """The ISR this leader should propose now, or None. `alive(broker)` says whether
        the controller counts that broker as alive (a fenced one cannot join);
        `incarnation(broker)` its registration as this leader's metadata names it: a
        follower joins only on fetches of that incarnation (None: not checked)."""
        if self.role != LEADER or self.pending_isr is not None:
            return None
        if len(self.replicas) == 1 and self.isr == self.replicas:
            return None  # a sole replica is its own ISR
        me = self.node_id
        followers = self.followers
        isr = [
            r
            for r in self.isr
            if r == me
            or ((f := followers.get(r)) is not None and now - self.caught_up_at(f, leo) <= lag_s)
        ]
        floor = max(self.high_watermark, self.epoch_start_offset)
        for r in self.replicas:
            f = followers.get(r)
            if (
                r not in isr
                and f is not None
                and self.known_end(f) >= floor
                and now - self.caught_up_at(f, leo) <= lag_s
                and alive(r)
                and (incarnation is None or f.incarnation == incarnation(r))
            ):
                isr.append(r)
        if me not in isr:
            isr.insert(0, me)
        return isr if sorted(isr) != sorted(self.isr) else None

    def isr_incarnations(self, new_isr: list[int]) -> dict[int, str]:
        """For the proposal: the incarnation each joining member's fetches came from
        (the controller refuses one that registered again since: KIP-903)."""
        out = {}
        for r in new_isr:
            f = self.followers.get(r)
            if r not in self.isr and f is not None and f.incarnation is not None:
                out[r] = f.incarnation
        return out

    def propose_isr(self, new_isr: list[int]) -> None:
        """`new_isr` goes to the controller (AlterPartition): in flight until settled."""
        self.pending_isr = new_isr

    def isr_refused(self, new_isr: list[int]) -> None:
        """The controller refused `new_isr` (or the call failed): take it out of flight,
        so that the next check proposes anew."""
        if self.pending_isr == new_isr:
            self.pending_isr = None

    def under_min_isr(self) -> bool:
        """An acks=all write is refused (NOT_ENOUGH_REPLICAS) while this holds."""
        return len(self.isr) < self.min_isr

    # -- follower side -----------------------------------------------------------------

    def follower_hw(self, leader_hw: int, leo: int) -> int:
        """Take the leader's high watermark, never past this replica's own log end."""
        self.high_watermark = hw = max(0, min(leader_hw, leo))
        return hw


def _forget(f: FollowerState, now: float) -> None:
    """What the leader knew of a follower's log no longer holds: learnt again from its
    next fetch."""
    f.log_end_offset = f.leo_at_last_fetch = -1
    f.last_caught_up = 0.0
    f.reset_at = now


def truncation_offset(
    epochs: EpochView, leo: int, log_start: int, leader_epoch: int, leader_end: int
) -> int:
    """Where a follower cuts its log, given the leader's OffsetForLeaderEpoch answer
    (`leader_epoch`, `leader_end`) for the follower's latest epoch: the end of the
    largest epoch both logs hold, never past either log's end. A log with no epochs or
    no records keeps its end; an answer that proves nothing in common cuts to the log
    start. The result is `leo` when nothing is to be cut."""
    ours = epochs.latest_epoch
    if ours == UNDEFINED or leo == log_start:
        return leo
    if leader_epoch == UNDEFINED or leader_end == UNDEFINED:
        return log_start  # nothing in common that we can prove
    if leader_epoch == ours:
        target = min(leader_end, leo)
    else:
        target = min(leader_end, epochs.end_offset_for(leader_epoch, leo)[1])
    return max(min(target, leo), log_start)


def diverging_epoch(
    epochs: EpochView, leo: int, fetch_offset: int, last_fetched_epoch: int
) -> tuple[int, int] | None:
    """The leader's check of a fetch that names the epoch of the fetcher's last record
    (KIP-320; Kafka's Partition.validateFetchOffsetAndMaybeGetDivergingEpoch). None:
    the fetcher's log agrees with this one up to `fetch_offset` (or it named no epoch).
    Else (epoch, end offset) of the largest epoch of this log not above the named one,
    the fetcher truncates from (`truncation_offset`); (UNDEFINED, UNDEFINED) when this
    log cannot tell (no such epoch): the caller answers OFFSET_OUT_OF_RANGE, as Kafka
    does, and the fetcher finds the point by OffsetForLeaderEpoch."""
    if last_fetched_epoch < 0:
        return None
    epoch, end = epochs.end_offset_for(last_fetched_epoch, leo)
    if epoch == UNDEFINED or end == UNDEFINED:
        return UNDEFINED, UNDEFINED
    if epoch < last_fetched_epoch or end < fetch_offset:
        return epoch, end
    return None
