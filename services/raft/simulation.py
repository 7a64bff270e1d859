"""Deterministic simulation of a metadata quorum: one seed, one exact history.

The simulation owns time, the network and the disks. Nodes are real `RaftNode`s with
`MemoryStorage` as their disk; the network is a priority queue of messages with
per-message delivery times and seeded loss, delay, duplication and reordering,
plus partitions; nodes crash (the object is dropped, its storage kept) and restart.
Every message goes through `to_dict`/`from_dict` and orjson, as in the real shell.

After every event the safety properties are checked (see `_check`); at the end the
network is healed, every node restarted, and a proposal must commit on every voter
in bounded simulated time. Any failure, a broken invariant of the core included (it
raises here instead of stopping the process), raises `SimulationFailure` whose message
says how to replay it:

    python -m bench.raft_sim --seed 1234

The simulation reaches into the nodes' private log fields (`_log`, `_log_start`,
`_snapshot`, `_truncations`) to check them: it is the core's test harness, not a user.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from straitmq import invariants
from straitmq.invariants import InvariantBroken

from .core import NotLeader, RaftConfig, RaftNode, VoterChangeRefused
from .messages import Message, VoteRequest, VoteResponse, from_dict, to_dict
from .storage import MemoryStorage, RaftStorage, Snapshot, StorageOp
from .storage import apply as apply_ops
from .voters import Voter, VoterSet

# Time runs ten times faster than in production (same ratios as the defaults), so a
# few simulated seconds hold dozens of elections.
SIM_CONFIG = RaftConfig(
    election_timeout_ms=100,
    fetch_timeout_ms=200,
    fetch_max_wait_ms=50,
    max_fetch_entries=8,  # small, so catching up takes several fetches
    request_timeout_ms=100,
    retry_backoff_ms=10,
    end_quorum_backoff_ms=10,
    begin_quorum_resend_ms=50,
)
TICK_MS = 5


class SimulationFailure(AssertionError):
    pass


@dataclass
class Faults:
    """Per-tick / per-message probabilities; drawn from the seed so runs differ."""

    loss: float
    duplicate: float
    slow: float  # a message delayed by up to max_slow_ms: reordering
    max_delay_ms: int
    max_slow_ms: int
    partition: float
    heal: float
    crash: float
    restart: float
    propose: float
    snapshot: float
    resign: float
    crash_after_vote: float  # crash-and-restart a voter right after it grants a vote
    crash_new_leader: float  # crash a leader right after its election
    crash_after_commit: float  # crash a leader right after its high watermark moved
    defer_persist: float  # a node's new storage ops stay in flight (not yet durable)...
    persist: float  # ...until this per-tick chance writes them; a crash loses them
    change: float  # the leader is asked to add, remove or replace a voter (KIP-853)
    disk_loss: float  # a node's storage is lost: it restarts empty, with a new directory id

    @classmethod
    def draw(cls, rng: random.Random) -> Faults:
        return cls(
            loss=rng.choice([0.0, 0.01, 0.05, 0.2]),
            duplicate=rng.choice([0.0, 0.02, 0.1]),
            slow=rng.choice([0.0, 0.02, 0.1]),
            max_delay_ms=rng.choice([1, 5, 20]),
            max_slow_ms=rng.choice([50, 300]),
            partition=rng.choice([0.0, 0.002, 0.01]),
            heal=rng.choice([0.005, 0.02]),
            crash=rng.choice([0.0, 0.002, 0.01, 0.05]),  # 0.05: a crash storm
            restart=rng.choice([0.01, 0.05, 0.3]),
            propose=rng.choice([0.05, 0.2, 0.5]),
            snapshot=rng.choice([0.0, 0.01, 0.05]),
            resign=rng.choice([0.0, 0.002]),
            crash_after_vote=rng.choice([0.0, 0.0, 0.3]),
            crash_new_leader=rng.choice([0.0, 0.0, 0.1]),
            crash_after_commit=rng.choice([0.0, 0.0, 0.02]),
            defer_persist=rng.choice([0.0, 0.5, 0.9]),
            persist=rng.choice([0.1, 0.5]),
            change=rng.choice([0.0, 0.01, 0.03, 0.1]),
            disk_loss=rng.choice([0.0, 0.002, 0.01]),
        )


class Simulation:
    def __init__(
        self,
        seed: int,
        voters: int = 3,
        observers: int = 1,
        steps: int = 600,
        config: RaftConfig | None = None,
        storage_factory: Callable[[int], RaftStorage] | None = None,
        dynamic: bool | None = None,
    ) -> None:
        self.seed = seed
        self.steps = steps  # ticks of TICK_MS before the liveness phase
        self.rng = random.Random(seed)
        # Two fetched entries per response sometimes: followers lag for longer, which opens
        # the windows where an uncommitted tail outlives a leader.
        self.config = config or dataclasses.replace(
            SIM_CONFIG, max_fetch_entries=self.rng.choice([2, 8, 64])
        )
        self.voter_ids = frozenset(range(voters))
        self.ids = [*range(voters), *range(100, 100 + observers)]
        self.faults = Faults.draw(self.rng)
        # Each node's storage identity; a lost disk gives it a new one.
        self.dirs = {i: f"dir-{i}-0" for i in self.ids}
        # Half the seeds start from static flags (no directory ids: the old way; the
        # leader pins them, and a disk is lost only once that is past its residual
        # window, see _past_residual_window), half from a bootstrapped voter set.
        drawn = self.rng.random() < 0.5  # drawn always: a seed replays the same way
        self.dynamic = drawn if dynamic is None else dynamic
        self.bootstrap = (
            VoterSet.of(Voter(i, self.dirs[i]) for i in sorted(self.voter_ids))
            if self.dynamic
            else VoterSet.static(self.voter_ids)
        )
        self.max_voters = max(voters, 5)
        self.replay = (
            f"python -m bench.raft_sim --seed {seed}"
            + (f" --voters {voters}" if voters != 3 else "")
            + (f" --observers {observers}" if observers != 1 else "")
            + (f" --steps {steps}" if steps != 600 else "")
        )
        self.now = 0
        # A restarted node reloads its storage object, as a process reloads its directory.
        make = storage_factory or (lambda _: MemoryStorage())
        self.disks: dict[int, RaftStorage] = {i: make(i) for i in self.ids}
        self._disks_lost = storage_factory is None  # a factory's disks are its own
        # Storage ops a node handed out that are not on its disk yet: (ops, seq) batches.
        self.in_flight: dict[int, list[tuple[list[StorageOp], int]]] = {i: [] for i in self.ids}
        self.nodes: dict[int, RaftNode | None] = {i: None for i in self.ids}
        self.group = {i: 0 for i in self.ids}  # partition: same group = connected
        self.queue: list[tuple[int, int, Message]] = []
        self.seq = 0
        self.next_value = 0
        self.stats = {
            "messages": 0,
            "elections": 0,
            "snapshots": 0,
            "crashes": 0,
            "proposals": 0,
            "committed": 0,
            "voter_changes": 0,
            "changes_refused": 0,
            "disks_lost": 0,
            "static_disks_lost": 0,  # ... in a quorum started from static flags
        }
        # What the checks remember across the whole history.
        self.leaders: dict[int, int] = {}  # epoch -> the node that led it
        self.committed: list[tuple[int, Any]] = []  # offset -> (epoch, data)
        self.seen: dict[tuple[int, int], tuple[Any, int]] = {}  # (offset, epoch) -> (data, prev)
        self.applied: dict[int, list[tuple[int, Any]]] = {}
        self._was_leader: dict[int, int | None] = {}
        self._matched: dict[int, tuple[int, int]] = {}  # node -> (checked upto, truncations)
        self._hw_checked: dict[int, int] = {}
        self._sig: dict[int, tuple[Any, ...]] = {}
        for i in self.ids:
            self._start(i)

    # -- the world ----------------------------------------------------------------------

    def fail(self, what: str) -> SimulationFailure:
        return SimulationFailure(
            f"{what} [seed {self.seed} at {self.now} ms; replay: {self.replay}]"
        )

    def _start(self, i: int) -> None:
        node_rng = random.Random(self.rng.getrandbits(64))
        self.nodes[i] = RaftNode(
            i,
            self.bootstrap,
            self.disks[i],
            self.config,
            node_rng,
            self.now,
            persist_inline=False,
            directory_id=self.dirs[i],
        )
        self.applied[i] = []
        self._was_leader[i] = None
        self._matched[i] = (-1, -1)
        self._hw_checked[i] = 0
        self._sig.pop(i, None)
        self._after(i)

    def _crash(self, i: int) -> None:
        self.nodes[i] = None
        self.in_flight[i] = []  # never reached the disk
        self.stats["crashes"] += 1

    def _send(self, msg: Message) -> None:
        f, rng = self.faults, self.rng
        if rng.random() < f.loss:
            return
        copies = 2 if rng.random() < f.duplicate else 1
        for _ in range(copies):
            delay = rng.randint(1, f.max_delay_ms)
            if rng.random() < f.slow:
                delay += rng.randint(0, f.max_slow_ms)
            self.seq += 1
            heapq.heappush(self.queue, (self.now + delay, self.seq, msg))

    def _deliver(self, msg: Message) -> None:
        node = self.nodes.get(msg.dst)
        if node is None or self.group[msg.src] != self.group[msg.dst]:
            return
        self.stats["messages"] += 1
        wire = from_dict(orjson.loads(orjson.dumps(to_dict(msg))))
        if wire != msg:
            raise self.fail(f"message changed in transit: {msg} -> {wire}")
        node.step(wire, self.now)
        self._check_vote(wire, node)
        self._after(msg.dst)

    def _after(self, i: int) -> None:
        """Collect a node's output, apply what it committed, and check everything."""
        node = self.nodes[i]
        assert node is not None
        ops, seq = node.take_storage()
        if ops:
            self.in_flight[i].append((ops, seq))
        if self.in_flight[i] and self.rng.random() >= self.faults.defer_persist:
            self._write(i)
        out = node.take_messages()
        for msg in out:
            self._send(msg)
        # Most ticks change nothing: the checks below only look at what changed, so a
        # node whose log, role and high watermark are as at its last check is skipped.
        sig = (
            node._role,
            node._epoch,
            node._hw,
            node._log_start + len(node._log),
            node._log_start,
            node._truncations,
            len(node._voter_history),
        )
        if not ops and not out and self._sig.get(i) == sig:
            return
        self._sig[i] = sig
        hw_before = self._hw_checked[i]
        elected = self._check(i, node)
        # Crashes at the moments that test durability the hardest.
        f = self.faults
        voted = any(isinstance(m, VoteResponse) and m.granted and not m.pre_vote for m in out)
        if voted and self.rng.random() < f.crash_after_vote:
            self._crash(i)
            self._start(i)
        elif elected and self.rng.random() < f.crash_new_leader:
            self._crash(i)
        elif (
            node.is_leader
            and node.high_watermark > hw_before
            and self.rng.random() < f.crash_after_commit
        ):
            self._crash(i)

    def _partition(self) -> None:
        rng = self.rng
        live_leaders = [i for i, n in self.nodes.items() if n is not None and n.is_leader]
        if live_leaders and rng.random() < 0.5:
            isolated = rng.choice(live_leaders)  # cut the leader off
            for i in self.ids:
                self.group[i] = 1 if i == isolated else 0
        else:
            for i in self.ids:
                self.group[i] = rng.randrange(2)

    def _heal(self) -> None:
        for i in self.ids:
            self.group[i] = 0

    def _propose(self) -> None:
        live = [n for n in self.nodes.values() if n is not None]
        leaders = [n for n in live if n.is_leader]
        node = (
            self.rng.choice(leaders)
            if leaders and self.rng.random() < 0.9
            else (self.rng.choice(live) if live else None)
        )
        if node is None:
            return
        self.next_value += 1
        try:
            node.propose({"v": self.next_value, "by": node.node_id})
        except NotLeader as e:
            if node.is_leader or e.epoch != node.epoch:
                raise self.fail(f"NotLeader from node {node.node_id} is wrong: {e}") from e
            return
        self.stats["proposals"] += 1
        self._after(node.node_id)

    def _snapshot(self) -> None:
        live = [i for i, n in self.nodes.items() if n is not None]
        if not live:
            return
        i = self.rng.choice(live)
        node = self.nodes[i]
        assert node is not None
        state = self.applied[i]
        end = len(state) - self.rng.randrange(3)
        if end - node.log_start_offset < 3:
            return
        node.create_snapshot(end, [list(x) for x in state[:end]])
        self.stats["snapshots"] += 1
        self._after(i)

    def _random_faults(self) -> None:
        f, rng = self.faults, self.rng
        if rng.random() < f.partition:
            self._partition()
        if rng.random() < f.heal:
            self._heal()
        if rng.random() < f.crash:
            live = [i for i, n in self.nodes.items() if n is not None]
            if live:
                self._crash(rng.choice(live))
        if rng.random() < f.restart:
            dead = [i for i, n in self.nodes.items() if n is None]
            if dead:
                self._start(rng.choice(dead))
        if rng.random() < f.propose:
            self._propose()
        if rng.random() < f.snapshot:
            self._snapshot()
        if rng.random() < f.resign:
            for i, n in self.nodes.items():
                if n is not None and n.is_leader:
                    n.resign(self.now)
                    self._after(i)
        if rng.random() < f.change:
            self._change_voters()
        if rng.random() < f.disk_loss:
            self._lose_disk()

    def _leader(self) -> RaftNode | None:
        leaders = [n for n in self.nodes.values() if n is not None and n.is_leader]
        return self.rng.choice(leaders) if leaders else None

    def _stale(self, vs: VoterSet) -> list[Voter]:
        """Voters of `vs` whose storage is gone (their node has another directory id)."""
        return [v for v in vs.voters if v.directory_id not in (None, self.dirs[v.node_id])]

    def _change_voters(self) -> None:
        """Ask a leader for one voter change: replace a voter whose disk was lost (remove
        it, then add its new storage), add a node, or remove one (the leader too)."""
        leader = self._leader()
        if leader is None:
            return
        rng = self.rng
        vs = leader.voter_set
        stale = self._stale(vs)
        outside = [i for i in self.ids if not vs.matches(i, self.dirs[i]) and i not in vs.ids]
        try:
            if stale:
                # First the replacement of a lost voter, as an operator would: removing a
                # live voter while a lost one is still counted can leave no majority.
                v = rng.choice(stale)
                leader.remove_voter(v.node_id, v.directory_id)
            elif outside and len(vs) < self.max_voters and rng.random() < 0.5:
                i = rng.choice(outside)
                leader.add_voter(Voter(i, self.dirs[i], (("raft", f"node-{i}:9093"),)))
            else:
                v = rng.choice(vs.voters)
                leader.remove_voter(v.node_id, v.directory_id)
        except VoterChangeRefused:
            self.stats["changes_refused"] += 1
            return
        self.stats["voter_changes"] += 1
        self._after(leader.node_id)

    def _lose_disk(self) -> None:
        """A node's storage is gone: it restarts empty, with a new directory id. One
        lost voter at a time in a set of three or more, as a leader with no change
        pending sees it: beyond that the quorum can lose its majority for good, which no
        protocol survives. In a quorum started from static flags, only once the node's
        directory id is pinned everywhere (the residual window is no fault to survive)."""
        if not self._disks_lost:
            return
        leader = self._leader()
        if leader is None or leader.voter_change_pending:
            return
        vs = leader.voter_set
        i = self.rng.choice(self.ids)
        if i in vs.ids and (self._stale(vs) or len(vs) < 3):
            return
        if not self.dynamic:
            if not self._past_residual_window(i):
                return
            self.stats["static_disks_lost"] += 1
        if self.nodes[i] is not None:
            self._crash(i)
        self.disks[i] = MemoryStorage()
        gen = int(self.dirs[i].rsplit("-", 1)[1]) + 1
        self.dirs[i] = f"dir-{i}-{gen}"
        self.stats["disks_lost"] += 1
        self._start(i)

    def _past_residual_window(self, i: int) -> bool:
        """Whether node i's storage may be lost in a quorum started from static flags
        (voters.py names the window): the newest committed voter set names i with its
        directory id (or not at all), and every other node's disk holds that entry (or a
        snapshot past it), so no candidacy asks i's new storage without a directory id."""
        sets = [
            (o, vs)
            for o, (_, data) in enumerate(self.committed)
            if (vs := VoterSet.from_entry(data)) is not None
        ]
        if not sets:
            return False
        p, vs = sets[-1]
        v = vs.get(i)
        if v is not None and v.directory_id != self.dirs[i]:
            return False
        for j in self.ids:
            if j == i:
                continue
            _, _, snap, start, entries = self.disks[j].load()
            if snap is not None and snap.end_offset > p:
                continue
            if not start <= p < start + len(entries):
                return False
            e = entries[p - start]
            if (e.epoch, e.data) != self.committed[p]:
                return False
        return True

    def _write(self, i: int) -> None:
        """Everything node i handed out reaches its disk, in order; it is told so."""
        node = self.nodes[i]
        assert node is not None
        batches, self.in_flight[i] = self.in_flight[i], []
        for ops, _ in batches:
            apply_ops(self.disks[i], ops)
        node.persisted(batches[-1][1])

    def _advance(self, until: int) -> None:
        """Deliver messages and tick nodes up to simulated time `until`."""
        while True:
            next_tick = self.now - self.now % TICK_MS + TICK_MS
            if self.queue and self.queue[0][0] <= min(next_tick, until):
                when, _, msg = heapq.heappop(self.queue)
                self.now = max(self.now, when)
                self._deliver(msg)
                continue
            if next_tick > until:
                self.now = until
                return
            self.now = next_tick
            for i in self.ids:
                node = self.nodes[i]
                if node is not None:
                    if self.in_flight[i] and self.rng.random() < self.faults.persist:
                        self._write(i)
                    node.tick(self.now)
                    self._after(i)

    # -- running ------------------------------------------------------------------------

    def run(self) -> dict[str, int]:
        # A broken invariant of the core raises here instead of stopping the process,
        # and fails the run with the seed that replays it.
        with invariants.raising():
            try:
                for _ in range(self.steps):
                    self._random_faults()
                    self._advance(self.now + TICK_MS)
                self._check_liveness()
            except InvariantBroken as e:
                raise self.fail(str(e)) from e
        self.stats["committed"] = len(self.committed)
        return self.stats

    def _check_liveness(self) -> None:
        """Heal everything; a proposal must then commit on every voter in bounded time."""
        f = self.faults
        f.loss = f.duplicate = f.slow = 0.0
        f.crash_after_vote = f.crash_new_leader = f.crash_after_commit = 0.0
        f.defer_persist = 0.0
        f.change = f.disk_loss = 0.0
        self._heal()
        for i in self.ids:
            if self.nodes[i] is None:
                self._start(i)
        self._live_voters = sorted(self.voter_ids)
        start = self.now
        # Elections settle within a few timeouts; then the slowest voter catches up one
        # fetch round trip per max_fetch_entries.
        longest = max(n.log_end_offset for n in self.nodes.values() if n is not None)
        catch_up = (longest // self.config.max_fetch_entries + 1) * 2 * f.max_delay_ms
        deadline = start + 40 * self.config.election_timeout_ms + catch_up
        target: tuple[int, int, Any] | None = None  # (offset, epoch, value)
        proposed_at = 0
        while self.now < deadline:
            self._advance(self.now + 10 * TICK_MS)
            if target is not None and self._applied_everywhere(target):
                return
            stale = target is None or self.now - proposed_at > 4 * self.config.fetch_timeout_ms
            leader = next((n for n in self.nodes.values() if n is not None and n.is_leader), None)
            if leader is not None:
                self._live_voters = [
                    v.node_id
                    for v in leader.voter_set.voters
                    if v.node_id in self.dirs and v.matches(v.node_id, self.dirs[v.node_id])
                ]
            if stale and leader is not None:
                self.next_value += 1
                value = {"v": self.next_value, "liveness": True}
                target = (leader.propose(value), leader.epoch, value)
                proposed_at = self.now
                self._after(leader.node_id)
        roles = {
            i: (n.role, n.epoch, n.high_watermark, n.log_end_offset)
            for i, n in self.nodes.items()
            if n is not None
        }
        raise self.fail(
            f"liveness: no proposal committed on every voter within "
            f"{deadline - start} ms of healing; target {target}; nodes {roles}"
        )

    def _applied_everywhere(self, target: tuple[int, int, Any]) -> bool:
        offset, epoch, value = target
        for i in self._live_voters:
            state = self.applied[i]
            if len(state) <= offset or state[offset] != (epoch, value):
                return False
        return True

    # -- safety -------------------------------------------------------------------------

    def _check(self, i: int, node: RaftNode) -> bool:
        """Check the safety properties after node i acted; True if it was just elected."""
        # (1) Election safety: one leader per epoch, over the whole history.
        elected = False
        if node.is_leader:
            first = self.leaders.setdefault(node.epoch, i)
            if first != i:
                raise self.fail(f"election safety: epoch {node.epoch} led by {first} and {i}")
            if self._was_leader[i] != node.epoch:
                self._was_leader[i] = node.epoch
                self.stats["elections"] += 1
                if not node.may_campaign:
                    raise self.fail(
                        f"node {i} ({self.dirs[i]}) was elected in epoch {node.epoch} but is "
                        f"no voter of its set {node.voter_set.to_list()}"
                    )
                self._check_leader_complete(i, node)
                elected = True
        self._check_log_matching(i, node)
        self._check_committed(i, node)
        if node.is_leader:
            self._check_one_change(i, node)
            self._check_counted(i, node)
        self._apply(i, node)
        return elected

    def _check_one_change(self, i: int, node: RaftNode) -> None:
        """(6) A leader's log holds at most one voter set beyond what is committed."""
        uncommitted = [o for o, _ in node._voter_history if o >= len(self.committed)]
        if len(uncommitted) > 1:
            raise self.fail(
                f"leader {i} of epoch {node.epoch} holds {len(uncommitted)} uncommitted voter "
                f"sets (offsets {uncommitted}; {len(self.committed)} entries committed)"
            )

    def _check_vote(self, m: Message, node: RaftNode) -> None:
        """(7) A new storage never votes as the voter it replaced: it grants a vote only
        to a candidacy that names its own directory id."""
        if (
            isinstance(m, VoteRequest)
            and not m.pre_vote
            and m.voter_directory_id != self.dirs[m.dst]
            and self._replaced(m.dst)
            and (node.epoch, node._voted_for) == (m.epoch, m.candidate_id)
        ):
            raise self.fail(
                f"node {m.dst} on new storage {self.dirs[m.dst]} voted for "
                f"{m.candidate_id} in epoch {m.epoch}, asked as voter {m.voter_directory_id}"
            )

    def _replaced(self, i: int) -> bool:
        """Whether node i's storage is not its first (it was lost at least once)."""
        return not self.dirs[i].endswith("-0")

    def _check_counted(self, i: int, node: RaftNode) -> None:
        """(7) A leader counts a fetch toward the high watermark only from the storage its
        voter set names, or, for a static voter, from the node's first storage: a
        storage that replaced a lost one is never counted as the voter it replaced."""
        vs = node.voter_set
        for r in node._replicas.values():
            v = vs.get(r.node_id)
            if v is None or r.last_fetch_ms != self.now or r.directory_id is None:
                continue
            named = v.directory_id == r.directory_id
            first = v.directory_id is None and not self._replaced(r.node_id)
            if not (named or first) and r.directory_id == self.dirs[r.node_id]:
                raise self.fail(
                    f"leader {i} of epoch {node.epoch} counts node {r.node_id}'s storage "
                    f"{r.directory_id} as its voter {v}"
                )

    def _check_leader_complete(self, i: int, node: RaftNode) -> None:
        """(3) A new leader holds every entry committed so far."""
        if node.log_end_offset < len(self.committed):
            raise self.fail(
                f"leader completeness: leader {i} of epoch {node.epoch} ends at "
                f"{node.log_end_offset}, {len(self.committed)} entries committed"
            )
        for o in range(node.log_start_offset, len(self.committed)):
            e = node.entry(o)
            if (e.epoch, e.data) != self.committed[o]:
                raise self.fail(
                    f"leader completeness: leader {i} has {e} at {o}, "
                    f"committed was {self.committed[o]}"
                )

    def _check_log_matching(self, i: int, node: RaftNode) -> None:
        """(2) Log matching, checked in its inductive form over the whole history: an
        (offset, epoch) pair always names the same data, preceded by the same epoch."""
        upto, truncations = self._matched[i]
        log_start, log = node._log_start, node._log
        if truncations != node._truncations:
            upto = log_start  # the tail was replaced: look at all of it again
        upto = max(upto, log_start)
        end = log_start + len(log)
        for o in range(upto, end):
            e = log[o - log_start]
            if o == log_start:
                prev = node._snapshot.epoch if node._snapshot is not None else 0
            else:
                prev = log[o - log_start - 1].epoch
            known = self.seen.setdefault((o, e.epoch), (e.data, prev))
            if known != (e.data, prev):
                raise self.fail(
                    f"log matching: node {i} has (data, previous epoch) "
                    f"{(e.data, prev)} at offset {o} epoch {e.epoch}; elsewhere "
                    f"it was {known}"
                )
        self._matched[i] = (end, node._truncations)

    def _check_committed(self, i: int, node: RaftNode) -> None:
        """(4) Committed entries never change: what a node holds below its HW extends or
        matches the global committed sequence."""
        hw = node.high_watermark
        committed = self.committed
        start = max(self._hw_checked[i], node.log_start_offset)
        if start > len(committed) and start < hw:
            raise self.fail(
                f"node {i} committed offset {start} but only {len(committed)} "
                f"entries were known committed"
            )
        for o in range(start, hw):
            e = node.entry(o)
            if o < len(committed):
                if committed[o] != (e.epoch, e.data):
                    raise self.fail(
                        f"committed entry changed at offset {o}: {committed[o]} "
                        f"-> {(e.epoch, e.data)} on node {i}"
                    )
            else:
                committed.append((e.epoch, e.data))
        self._hw_checked[i] = max(self._hw_checked[i], hw)

    def _apply(self, i: int, node: RaftNode) -> None:
        """(5) What a node applies is a prefix of the committed sequence."""
        state = self.applied[i]
        for item in node.take_committed():
            if isinstance(item, Snapshot):
                state[:] = [(epoch, data) for epoch, data in item.data]
                if len(state) != item.end_offset or state != self.committed[: item.end_offset]:
                    raise self.fail(
                        f"node {i} got a snapshot at {item.end_offset} that is not "
                        "the committed prefix"
                    )
                continue
            offset, entry = item
            if offset != len(state):
                raise self.fail(f"node {i} applied offset {offset} after {len(state)} entries")
            if offset >= len(self.committed) or self.committed[offset] != (entry.epoch, entry.data):
                raise self.fail(f"node {i} applied {entry} at {offset}, not committed")
            state.append((entry.epoch, entry.data))
