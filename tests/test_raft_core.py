"""The Raft core driven message by message: one test per rule of the protocol."""

from __future__ import annotations

import dataclasses
import random

import orjson
import pytest
from straitmq.raft.core import NotLeader, RaftConfig, RaftNode, VoterChangeRefused
from straitmq.raft.messages import (
    FENCED_LEADER_EPOCH,
    NOT_LEADER,
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
    from_dict,
    to_dict,
)
from straitmq.raft.storage import MemoryStorage, Snapshot
from straitmq.raft.storage import apply as apply_ops
from straitmq.raft.voters import Voter, VoterSet

from straitmq import invariants
from straitmq.invariants import InvariantBroken

CFG = RaftConfig(
    election_timeout_ms=100,
    fetch_timeout_ms=200,
    fetch_max_wait_ms=50,
    max_fetch_entries=4,
    request_timeout_ms=100,
    retry_backoff_ms=10,
    end_quorum_backoff_ms=10,
    begin_quorum_resend_ms=50,
)
VOTERS = frozenset({0, 1, 2})


def is_voters(data: object) -> bool:
    return VoterSet.from_entry(data) is not None


def disk(
    epoch: int = 0, epochs: tuple[int, ...] = (), voted_for: int | None = None
) -> MemoryStorage:
    s = MemoryStorage()
    s.epoch, s.voted_for = epoch, voted_for
    s.entries = [Entry(e, f"d{i}") for i, e in enumerate(epochs)]
    return s


def node(
    nid: int = 0, storage: MemoryStorage | None = None, voters=VOTERS, now: int = 0
) -> RaftNode:
    return RaftNode(nid, voters, storage or MemoryStorage(), CFG, random.Random(nid), now)


def of(msgs: list[Message], kind: type) -> list:
    return [m for m in msgs if isinstance(m, kind)]


def elect(n: RaftNode, now: int = 300, grant_from: int = 1) -> list[Message]:
    """Drive n through pre-vote and vote to leadership; the messages it sent as leader."""
    n.tick(now)
    assert n.role == "prospective"
    n.take_messages()
    n.step(VoteResponse(grant_from, n.node_id, n.epoch, True, pre_vote=True), now)
    assert n.role == "candidate"
    n.take_messages()
    n.step(VoteResponse(grant_from, n.node_id, n.epoch, True, pre_vote=False), now)
    assert n.is_leader
    return n.take_messages()


class Net:
    """Instant, lossless delivery between real nodes, with some nodes cut off."""

    def __init__(self, nodes: list[RaftNode]) -> None:
        self.nodes = {n.node_id: n for n in nodes}
        self.down: set[int] = set()
        self.now = 0
        self.sent: list[Message] = []

    def pump(self) -> None:
        for _ in range(10_000):
            msgs = [m for n in self.nodes.values() for m in n.take_messages()]
            if not msgs:
                return
            for m in msgs:
                self.sent.append(m)
                if m.src not in self.down and m.dst not in self.down and m.dst in self.nodes:
                    self.nodes[m.dst].step(m, self.now)
        raise AssertionError("message storm")

    def run(self, ms: int, step: int = 10) -> None:
        end = self.now + ms
        while self.now < end:
            self.now += step
            for i, n in self.nodes.items():
                if i not in self.down:
                    n.tick(self.now)
            self.pump()

    def leader(self) -> RaftNode | None:
        leaders = [n for i, n in self.nodes.items() if n.is_leader and i not in self.down]
        assert len(leaders) <= 1
        return leaders[0] if leaders else None


# -- voting ------------------------------------------------------------------------------


def test_vote_is_persisted_before_the_response_is_sent() -> None:
    events: list[str] = []

    class Recording(MemoryStorage):
        def save_state(self, epoch: int, voted_for: int | None) -> None:
            pending = of(n._outbox, VoteResponse)  # what the shell could already send
            events.append(f"save {epoch} {voted_for} with {len(pending)} responses queued")
            super().save_state(epoch, voted_for)

    storage = Recording()
    n = node(0, storage)
    n.step(VoteRequest(1, 0, 1, 1, 0, 0, pre_vote=False), 5)
    (resp,) = n.take_messages()
    assert resp == VoteResponse(0, 1, 1, True, False, None)
    assert events[-1] == "save 1 1 with 0 responses queued"
    assert (storage.epoch, storage.voted_for) == (1, 1)


def test_one_vote_per_epoch_survives_a_restart() -> None:
    storage = MemoryStorage()
    n = node(0, storage)
    n.step(VoteRequest(1, 0, 1, 1, 0, 0), 5)
    assert n.take_messages()[0].granted
    n = node(0, storage)  # crash and restart
    n.step(VoteRequest(2, 0, 1, 2, 0, 0), 5)
    assert not n.take_messages()[0].granted
    n.step(VoteRequest(1, 0, 1, 1, 0, 0), 5)  # the same candidate again: yes
    assert n.take_messages()[0].granted


@pytest.mark.parametrize(
    ("last_epoch", "last_offset", "granted"),
    [(1, 10, False), (2, 2, False), (2, 3, True), (3, 1, True)],
)
def test_vote_needs_a_log_at_least_as_up_to_date(last_epoch, last_offset, granted) -> None:
    n = node(0, disk(2, (1, 2, 2)))  # last epoch 2, log end offset 3
    n.step(VoteRequest(1, 0, 3, 1, last_epoch, last_offset), 5)
    (resp,) = n.take_messages()
    assert resp.granted is granted and resp.epoch == 3


def test_higher_epoch_moves_the_node_durably() -> None:
    storage = disk(1)
    n = node(0, storage)
    n.step(BeginQuorumEpoch(2, 0, 5, leader_id=2), 5)
    assert (n.role, n.epoch, n.leader_id) == ("follower", 5, 2)
    assert (storage.epoch, storage.voted_for) == (5, None)
    assert of(n.take_messages(), FetchRequest)[0].dst == 2


def test_prevote_does_not_bump_the_epoch() -> None:
    storage = disk(3)
    n = node(0, storage)
    n.tick(250)
    assert n.role == "prospective"
    reqs = of(n.take_messages(), VoteRequest)
    assert {r.dst for r in reqs} == {1, 2}
    assert all(r.pre_vote and r.epoch == 4 for r in reqs)
    assert (n.epoch, storage.epoch, storage.voted_for) == (3, 3, None)
    # The receiver does not move either.
    other_disk = disk(3)
    other = node(1, other_disk)
    other.step(reqs[0], 250)
    assert other.take_messages()[0].granted
    assert (other.epoch, other_disk.epoch, other_disk.voted_for) == (3, 3, None)


def test_prevote_refused_while_a_leader_is_heard() -> None:
    f = node(1, disk(1))
    f.step(BeginQuorumEpoch(0, 1, 1, leader_id=0), 10)
    fetch = of(f.take_messages(), FetchRequest)[0]
    f.step(FetchResponse(0, 1, 1, 0, None, fetch.fetch_offset, last_fetched_epoch=0), 20)
    f.take_messages()
    prevote = VoteRequest(2, 1, 2, 2, 5, 100, pre_vote=True)  # a better log, even
    f.step(prevote, 100)
    assert of(f.take_messages(), VoteResponse) == [VoteResponse(1, 2, 1, False, True, 0)]
    f.step(prevote, 20 + CFG.fetch_timeout_ms)  # the leader went quiet: now yes
    assert of(f.take_messages(), VoteResponse)[0].granted


def test_prevote_majority_then_vote_majority_makes_a_leader() -> None:
    storage = disk(1, (1,))
    n = node(0, storage)
    msgs = elect(n)
    assert (n.epoch, storage.epoch, storage.voted_for) == (2, 2, 0)
    assert {m.dst for m in of(msgs, BeginQuorumEpoch)} == {1, 2}
    # The leader's first entry is a control entry of its epoch.
    assert storage.entries[-1] == Entry(2, None)


def test_failed_prevote_retries_with_a_new_timeout() -> None:
    n = node(0, disk(1))
    n.tick(250)
    n.take_messages()
    n.step(VoteResponse(1, 0, 1, False, True), 251)
    n.step(VoteResponse(2, 0, 1, False, True), 251)
    assert n.role == "prospective" and n.epoch == 1
    n.tick(250 + 2 * CFG.election_timeout_ms)
    assert len(of(n.take_messages(), VoteRequest)) == 2  # a new round


def test_prevote_rejection_naming_a_leader_makes_a_follower() -> None:
    n = node(0, disk(1))
    n.tick(250)
    n.take_messages()
    n.step(VoteResponse(1, 0, 1, False, True, leader_id=2), 251)
    assert (n.role, n.leader_id) == ("follower", 2)


def test_candidate_stuck_in_a_newer_epoch_pulls_the_leader_up() -> None:
    # Node 1 lost a candidacy in epoch 5 while the others moved on under leader 0 in
    # epoch 4; its pre-vote (epoch 6) must move them to epoch 5 or it could never rejoin.
    leader = node(0, disk(3, (1, 2, 3)))
    elect(leader, grant_from=2)
    assert leader.epoch == 4
    leader.step(VoteRequest(1, 0, 6, 1, 2, 2, pre_vote=True), 301)
    assert (leader.role, leader.epoch) == ("unattached", 5)
    assert not leader.take_messages()[-1].granted  # node 1's log is behind


# -- replication -------------------------------------------------------------------------


def test_new_leader_commits_nothing_before_an_entry_of_its_epoch() -> None:
    leader = node(0, disk(1, (1, 1)))
    elect(leader)  # epoch 2; log: [1, 1, 2(control)]
    leader.step(FetchRequest(1, 0, 2, fetch_offset=2, last_fetched_epoch=1), 310)
    (resp,) = leader.take_messages()
    assert resp.entries == (Entry(2, None),) and resp.high_watermark == 0
    assert leader.high_watermark == 0  # a majority has offsets 0-1, but they are epoch 1
    leader.step(FetchRequest(1, 0, 2, fetch_offset=3, last_fetched_epoch=2), 320)
    assert leader.high_watermark == 3
    assert of(leader.take_messages(), FetchResponse)[0].high_watermark == 3
    assert [o for o, _ in leader.take_committed()] == [0, 1, 2]


def test_follower_high_watermark_is_capped_by_its_log_end() -> None:
    f = node(1, disk(1))
    f.step(BeginQuorumEpoch(0, 1, 1, leader_id=0), 10)
    f.take_messages()
    entries = (Entry(1, None), Entry(1, "a"))
    f.step(FetchResponse(0, 1, 1, 0, None, 0, entries, high_watermark=5), 20)
    assert f.high_watermark == 2
    assert [e.data for _, e in f.take_committed()] == [None, "a"]


def test_diverging_epoch_truncates_the_follower() -> None:
    leader = node(0, disk(3, (1, 1, 3, 3)))
    elect(leader, grant_from=2)  # epoch 4, log [1, 1, 3, 3, 4]
    f = node(1, disk(2, (1, 1, 2, 2, 2)))
    f.step(BeginQuorumEpoch(0, 1, 4, 0), 300)
    (fetch,) = of(f.take_messages(), FetchRequest)
    assert (fetch.fetch_offset, fetch.last_fetched_epoch) == (5, 2)
    leader.step(fetch, 301)
    (resp,) = leader.take_messages()
    # Largest leader epoch <= 2 is 1, which ends at offset 2.
    assert (resp.diverging_epoch, resp.diverging_end_offset, resp.entries) == (1, 2, ())
    f.step(resp, 302)
    assert f.log_end_offset == 2 and f._storage.entries == [Entry(1, "d0"), Entry(1, "d1")]
    (fetch,) = of(f.take_messages(), FetchRequest)
    assert (fetch.fetch_offset, fetch.last_fetched_epoch) == (2, 1)
    leader.step(fetch, 303)
    resp = leader.take_messages()[0]
    assert [e.epoch for e in resp.entries] == [3, 3, 4] and resp.diverging_epoch is None
    f.step(resp, 304)
    assert [f.entry(o).epoch for o in range(5)] == [1, 1, 3, 3, 4]


def test_truncation_below_the_high_watermark_is_refused() -> None:
    f = node(1, disk(1))
    f.step(BeginQuorumEpoch(0, 1, 1, 0), 10)
    f.take_messages()
    f.step(
        FetchResponse(0, 1, 1, 0, None, 0, (Entry(1, None), Entry(1, "a")), high_watermark=2), 20
    )
    (fetch,) = f.take_messages()
    bogus = FetchResponse(
        0,
        1,
        1,
        0,
        None,
        fetch.fetch_offset,
        diverging_epoch=0,
        diverging_end_offset=0,
        last_fetched_epoch=fetch.last_fetched_epoch,
    )
    with invariants.raising() as seen, pytest.raises(InvariantBroken):
        f.step(bogus, 30)
    assert [e.invariant for e in seen] == ["a committed entry is never truncated"]


def test_duplicate_or_stale_fetch_responses_are_ignored() -> None:
    f = node(1, disk(1))
    f.step(BeginQuorumEpoch(0, 1, 1, 0), 10)
    f.take_messages()
    resp = FetchResponse(0, 1, 1, 0, None, 0, (Entry(1, None),), high_watermark=0)
    f.step(resp, 20)
    f.step(resp, 21)  # a duplicate: would append at offset 1 otherwise
    assert f.log_end_offset == 1
    # An answer to a request we no longer wait for (other last_fetched_epoch).
    f.step(
        FetchResponse(
            0, 1, 1, 0, None, 1, diverging_epoch=0, diverging_end_offset=0, last_fetched_epoch=7
        ),
        22,
    )
    assert f.log_end_offset == 1


def test_snapshot_transfer_to_a_lagging_follower() -> None:
    nodes = [node(i) for i in range(3)]
    net = Net(nodes)
    net.down = {2}
    net.run(400)
    leader = net.leader()
    assert leader is not None
    for i in range(10):
        leader.propose(f"v{i}")
    net.pump()
    applied = leader.take_committed()
    end = leader.high_watermark
    assert len(applied) == end == 11
    leader.create_snapshot(end, {"state": [e.data for _, e in applied]})
    assert leader.log_start_offset == 11 and leader._storage.entries == []

    lagging = nodes[2]
    net.down = set()
    net.run(300)
    kinds = [type(m) for m in net.sent if 2 in (m.src, m.dst)]
    assert FetchSnapshotRequest in kinds and FetchSnapshotResponse in kinds
    got = lagging.take_committed()
    assert got[0] == Snapshot(11, leader.epoch, {"state": [None, *(f"v{i}" for i in range(10))]})
    assert lagging.log_start_offset == 11 and lagging.high_watermark == leader.high_watermark
    assert lagging._storage.snapshot == got[0]


def test_first_take_committed_returns_the_stored_snapshot() -> None:
    storage = disk(2, (2, 2))
    storage.snapshot, storage.log_start = Snapshot(5, 2, ["x"]), 5
    n = node(0, storage)
    assert n.take_committed() == [Snapshot(5, 2, ["x"])]
    assert n.take_committed() == []
    assert (n.high_watermark, n.log_end_offset, n.last_epoch) == (5, 7, 2)


def test_long_poll_parks_an_empty_fetch_until_new_entries_or_max_wait() -> None:
    leader = node(0)
    elect(leader)  # log: [control] at offset 0
    leader.step(FetchRequest(1, 0, 1, 0, 0), 300)
    assert leader.take_messages()[0].entries == (Entry(1, None),)
    leader.step(FetchRequest(1, 0, 1, 1, 1), 301)
    (resp,) = leader.take_messages()  # the HW moved to 1: answered at once
    assert resp.high_watermark == 1 and resp.entries == ()
    leader.step(FetchRequest(1, 0, 1, 1, 1), 302)
    assert leader.take_messages() == []  # parked
    leader.propose("a")
    (resp,) = leader.take_messages()
    assert resp.entries == (Entry(1, "a"),)
    leader.step(FetchRequest(1, 0, 1, 2, 1), 310)  # HW -> 2, answered
    leader.take_messages()
    leader.step(FetchRequest(1, 0, 1, 2, 1), 311)
    leader.tick(311 + CFG.fetch_max_wait_ms - 1)
    assert of(leader.take_messages(), FetchResponse) == []
    leader.tick(311 + CFG.fetch_max_wait_ms)
    (resp,) = of(leader.take_messages(), FetchResponse)
    assert resp.entries == () and resp.error is None and resp.high_watermark == 2


def test_a_fetcher_behind_the_high_watermark_is_answered_not_parked() -> None:
    """KIP-1166: an observer that re-fetches after the HW moved without it (the voters'
    fetches moved it) would otherwise wait out the whole long poll to learn the commit."""
    leader = node(0)
    elect(leader)
    leader.step(FetchRequest(1, 0, 1, 0, 0), 300)
    leader.take_messages()
    leader.step(FetchRequest(1, 0, 1, 1, 1), 301)  # voter 1 caught up: HW -> 1
    leader.take_messages()
    observer = 7
    leader.step(FetchRequest(observer, 0, 1, 1, 1, observer=True, high_watermark=0), 302)
    (resp,) = leader.take_messages()  # nothing new to send but the HW: at once
    assert resp.entries == () and resp.high_watermark == 1
    leader.step(FetchRequest(observer, 0, 1, 1, 1, observer=True, high_watermark=1), 303)
    assert leader.take_messages() == []  # up to date: parked
    leader.step(FetchRequest(2, 0, 1, 1, 1, high_watermark=-1), 304)  # an older sender
    assert leader.take_messages() == []  # parked, as before the field existed


def test_fetch_responses_are_bounded() -> None:
    leader = node(0)
    elect(leader)
    for i in range(10):
        leader.propose(i)
    leader.step(FetchRequest(1, 0, 1, 0, 0), 300)
    assert len(leader.take_messages()[0].entries) == CFG.max_fetch_entries


def test_fetch_responses_are_bounded_in_records() -> None:
    """An answer stops after the entry that spends the record budget (a list's items
    count each), and always carries one entry, however large."""
    cfg = dataclasses.replace(CFG, max_fetch_entries=100, max_fetch_records=2000)
    leader = RaftNode(0, VOTERS, MemoryStorage(), cfg, random.Random(0), 0)
    elect(leader)  # offset 0: the epoch's control entry
    for size in (1500, 600, 10, 3000, 1):
        leader.propose(list(range(size)))
    sizes = []
    offset = 0
    for t in range(4):
        leader.step(FetchRequest(1, 0, 1, offset, 1 if offset else 0), 300 + t)
        (resp,) = leader.take_messages()
        sizes.append([len(e.data) if isinstance(e.data, list) else None for e in resp.entries])
        offset += len(resp.entries)
    assert sizes == [[None, 1500, 600], [10, 3000], [1], []]


def test_stale_epoch_is_fenced() -> None:
    leader = node(0, disk(4))
    elect(leader)  # epoch 5
    leader.step(FetchRequest(1, 0, 3, 0, 0), 301)
    (resp,) = leader.take_messages()
    assert (resp.error, resp.epoch, resp.leader_id) == (FENCED_LEADER_EPOCH, 5, 0)
    old = node(1, disk(3))
    old.step(resp, 302)  # the fenced node catches up with the epoch and the leader
    assert (old.epoch, old.leader_id, old.role) == (5, 0, "follower")


def test_non_leader_answers_fetch_with_a_leader_hint() -> None:
    f = node(1, disk(1))
    f.step(BeginQuorumEpoch(0, 1, 1, 0), 10)
    f.take_messages()
    f.step(FetchRequest(100, 1, 1, 0, 0, observer=True), 11)
    (resp,) = f.take_messages()
    assert (resp.error, resp.leader_id, resp.epoch) == (NOT_LEADER, 0, 1)


# -- leadership changes ------------------------------------------------------------------


def test_check_quorum_resigns_a_leader_that_hears_from_no_majority() -> None:
    leader = node(0)
    elect(leader, now=300)
    leader.tick(300 + CFG.check_quorum_ms - 1)
    assert leader.is_leader
    leader.step(FetchRequest(1, 0, 1, 0, 0), 400)  # one follower keeps it alive
    leader.tick(300 + CFG.check_quorum_ms)
    assert leader.is_leader
    leader.tick(400 + CFG.check_quorum_ms)
    assert (leader.role, leader.epoch, leader.leader_id) == ("unattached", 1, None)
    with pytest.raises(NotLeader) as exc:
        leader.propose("x")
    assert (exc.value.leader_id, exc.value.epoch) == (None, 1)


def test_leader_counts_the_voters_it_hears_from() -> None:
    """straitmq_controller_quorum_voters: the check-quorum test, voter by voter."""
    follower = node(1)
    assert follower.voters_reachable() is None  # only the leader knows
    leader = node(0)
    elect(leader, now=300)
    assert leader.voters_reachable() == (3, 0)  # a new leader gives everyone a window
    leader.step(FetchRequest(1, 0, 1, 0, 0), 400)
    leader.tick(300 + CFG.check_quorum_ms)
    assert leader.is_leader and leader.voters_reachable() == (2, 1)  # voter 2 is silent
    leader.step(FetchRequest(2, 0, 1, 0, 0), 300 + CFG.check_quorum_ms + 1)
    assert leader.voters_reachable() == (3, 0)


def test_resign_hands_over_to_the_most_caught_up_voter() -> None:
    nodes = [node(i) for i in range(3)]
    net = Net(nodes)
    net.run(400)
    old = net.leader()
    assert old is not None
    old.propose("x")
    net.pump()
    epoch = old.epoch
    old.resign(net.now)
    ends = of(old.take_messages(), EndQuorumEpoch)
    assert {m.dst for m in ends} == VOTERS - {old.node_id}
    successors = ends[0].preferred_successors
    assert successors == tuple(sorted(VOTERS - {old.node_id}))  # equal offsets: by id
    assert old.role == "unattached" and old.epoch == ends[0].epoch
    for m in ends:
        net.nodes[m.dst].step(m, net.now)
    net.pump()
    started = net.now
    net.run(60)
    new = net.leader()
    assert new is not None and new.node_id == successors[0] and new.epoch == epoch + 1
    assert net.now - started < CFG.election_timeout_ms  # no need to wait for a timeout
    assert of(net.sent, EndQuorumEpochResponse)


def test_resign_orders_successors_by_fetched_offset() -> None:
    leader = node(0)
    elect(leader)
    leader.propose("a")
    leader.step(FetchRequest(2, 0, 1, 2, 1), 301)
    leader.step(FetchRequest(1, 0, 1, 1, 1), 301)
    leader.take_messages()
    leader.resign(302)
    assert of(leader.take_messages(), EndQuorumEpoch)[0].preferred_successors == (2, 1)


def test_leader_resends_begin_quorum_epoch_until_voters_fetch() -> None:
    leader = node(0)
    elect(leader)
    leader.step(BeginQuorumEpochResponse(1, 0, 1), 301)
    leader.tick(300 + CFG.begin_quorum_resend_ms)
    assert [m.dst for m in of(leader.take_messages(), BeginQuorumEpoch)] == [2]


def test_end_quorum_epoch_from_an_old_epoch_is_answered_not_obeyed() -> None:
    f = node(1, disk(3))
    f.step(BeginQuorumEpoch(0, 1, 3, 0), 10)
    f.take_messages()
    f.step(EndQuorumEpoch(2, 1, 2, 2, (1,)), 11)
    assert f.take_messages() == [EndQuorumEpochResponse(1, 2, 3)]
    assert (f.role, f.leader_id) == ("follower", 0)


def test_single_voter_elects_itself_and_commits_alone() -> None:
    n = node(0, voters=frozenset({0}))
    n.tick(250)
    assert n.is_leader
    assert n.propose("a") == 1
    assert [e.data for _, e in n.take_committed()] == [None, "a"]


# -- observers ---------------------------------------------------------------------------


def test_observer_never_votes_nor_campaigns_and_finds_the_leader() -> None:
    obs = node(100)
    assert obs.role == "observer"
    (first,) = obs.take_messages()
    assert isinstance(first, FetchRequest) and first.observer and first.dst in VOTERS
    obs.step(VoteRequest(1, 100, 1, 1, 5, 5), 5)
    assert of(obs.take_messages(), VoteResponse) == [VoteResponse(100, 1, 1, False, False, None)]
    obs.step(FetchResponse(first.dst, 100, 1, 2, NOT_LEADER, 0), 6)
    (fetch,) = obs.take_messages()
    assert fetch.dst == 2 and obs.leader_id == 2
    for t in range(10, 3000, 10):
        obs.tick(t)
        assert obs.role == "observer"
    assert not of(obs.take_messages(), VoteRequest)


def test_observer_rotates_over_voters_when_the_fetch_times_out() -> None:
    obs = node(100)
    targets = set()
    now = 0
    for _ in range(6):
        targets |= {m.dst for m in of(obs.take_messages(), FetchRequest)}
        now += CFG.fetch_timeout_ms
        obs.tick(now)
    assert targets == VOTERS


def test_leader_reports_voters_and_observers_in_status() -> None:
    leader = node(0)
    elect(leader)
    leader.propose("a")
    leader.step(FetchRequest(1, 0, 1, 2, 1), 310)
    leader.step(FetchRequest(100, 0, 1, 1, 1, observer=True), 320)
    s = leader.status()
    assert (s["role"], s["epoch"], s["leader_id"], s["high_watermark"]) == ("leader", 1, 0, 2)
    assert [(v["node_id"], v["lag"]) for v in s["voters"]] == [(0, 0), (1, 0), (2, 2)]
    assert s["observers"] == [
        {
            "node_id": 100,
            "directory_id": None,
            "log_end_offset": 1,
            "lag": 1,
            "last_fetch_ms": 320,
            "last_caught_up_ms": None,
        }
    ]


# -- messages ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "msg",
    [
        FetchRequest(1, 0, 3, 10, 2, observer=True),
        FetchResponse(
            0,
            1,
            3,
            0,
            None,
            10,
            (Entry(3, {"a": [1, 2]}), Entry(3, None)),
            9,
            0,
            last_fetched_epoch=2,
        ),
        FetchResponse(0, 1, 3, 0, None, 10, diverging_epoch=1, diverging_end_offset=4),
        FetchSnapshotRequest(1, 0, 3, 100, 2),
        FetchSnapshotResponse(0, 1, 3, 0, None, 100, 2, {"brokers": [1]}),
        VoteRequest(1, 0, 4, 1, 3, 10, pre_vote=True),
        VoteResponse(0, 1, 4, True, False, None),
        BeginQuorumEpoch(0, 1, 4, 0),
        BeginQuorumEpochResponse(1, 0, 4),
        EndQuorumEpoch(0, 1, 4, 0, (2, 1)),
        EndQuorumEpochResponse(1, 0, 4),
    ],
)
def test_messages_survive_json(msg: Message) -> None:
    d = orjson.loads(orjson.dumps(to_dict(msg)))
    assert d["kind"] == type(msg).__name__
    assert from_dict(d) == msg


def test_from_dict_rejects_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="unknown raft message kind"):
        from_dict({"kind": "Nope"})
    with pytest.raises(ValueError, match="malformed"):
        from_dict({"kind": "FetchRequest", "src": 1})


# -- deferred persistence (the shell's mode: etcd-raft's Ready) ------------------------------


def deferred(nid: int = 0, storage: MemoryStorage | None = None, voters=VOTERS) -> RaftNode:
    return RaftNode(
        nid, voters, storage or MemoryStorage(), CFG, random.Random(nid), 0, persist_inline=False
    )


def test_deferred_vote_is_answered_only_once_it_is_durable() -> None:
    storage = MemoryStorage()
    n = deferred(0, storage)
    n.step(VoteRequest(1, 0, 1, 1, 0, 0), 10)
    assert n.take_messages() == []  # the grant waits for the disk
    assert (storage.epoch, storage.voted_for) == (0, None)
    ops, seq = n.take_storage()
    assert ops == [("state", 1, None), ("state", 1, 1)]
    apply_ops(storage, ops)
    n.persisted(seq)
    (resp,) = n.take_messages()
    assert isinstance(resp, VoteResponse) and resp.granted
    assert (storage.epoch, storage.voted_for) == (1, 1)


def test_deferred_candidate_asks_for_votes_only_after_voting_for_itself_durably() -> None:
    n = deferred(0)
    n.tick(300)
    n.take_messages()  # pre-votes need nothing durable
    n.step(VoteResponse(1, 0, 0, True, pre_vote=True), 300)
    assert n.role == "candidate" and n.take_messages() == []
    ops, seq = n.take_storage()
    assert ops == [("state", 1, 0)]
    n.persisted(seq)
    assert {m.dst for m in of(n.take_messages(), VoteRequest)} == {1, 2}


def test_deferred_leader_counts_its_own_log_only_as_far_as_it_is_durable() -> None:
    storage = MemoryStorage()
    n = deferred(0, storage, voters=frozenset({0}))  # one voter: its own disk decides
    n.tick(300)
    # A lone candidate leads only once its vote for itself is durable.
    assert n.role == "candidate"
    ops, seq = n.take_storage()
    apply_ops(storage, ops)
    n.persisted(seq)
    assert n.is_leader
    offset = n.propose("a")
    assert n.high_watermark == 0 and n.take_committed() == []
    ops, seq = n.take_storage()
    apply_ops(storage, ops)
    assert n.high_watermark == 0  # written, but not yet reported durable
    n.persisted(seq)
    assert n.high_watermark == offset + 1
    assert [e for _, e in n.take_committed()][-1] == Entry(1, "a")
    assert storage.entries == [Entry(1, None), Entry(1, "a")]


# -- dynamic voters (KIP-853) ------------------------------------------------------------


def dnode(nid: int, voters: VoterSet, storage: MemoryStorage | None = None) -> RaftNode:
    """A node with a directory id ("d<id>") under a voter set with directory ids."""
    return RaftNode(
        nid, voters, storage or MemoryStorage(), CFG, random.Random(nid), 0, directory_id=f"d{nid}"
    )


def dset(*ids: int) -> VoterSet:
    return VoterSet.of(Voter(i, f"d{i}") for i in ids)


def settled(nodes: list[RaftNode], ms: int = 400) -> tuple[Net, RaftNode]:
    net = Net(nodes)
    net.run(ms)
    leader = net.leader()
    assert leader is not None
    leader.propose("first")
    net.run(100)
    assert leader.high_watermark > leader._epoch_start
    return net, leader


def test_a_log_without_a_voter_set_uses_the_static_one_and_a_logged_set_wins() -> None:
    n = node(0)
    assert n.voter_set == VoterSet.static(VOTERS) and n.voters == VOTERS
    storage = disk(1, (1,))
    storage.entries.append(Entry(1, VoterSet.static([0, 1, 2, 3]).to_entry()))
    n = node(0, storage)
    assert n.voters == frozenset({0, 1, 2, 3}) and n._majority == 3
    with pytest.raises(ValueError):
        n.propose({"kraft": "voters", "voters": []})  # control entries are the core's


def test_add_voter_needs_a_caught_up_observer_and_takes_effect_when_appended() -> None:
    nodes = [dnode(i, dset(0, 1, 2)) for i in (0, 1, 2, 3)]
    assert nodes[3].role == "observer"
    net, leader = settled(nodes)
    new = Voter(3, "d3", (("CONTROLLER", "host3:9093"),))
    with pytest.raises(VoterChangeRefused) as exc:
        leader.add_voter(Voter(7, "d7"))
    assert exc.value.code == VoterChangeRefused.NOT_CAUGHT_UP  # unknown: never fetched
    with pytest.raises(VoterChangeRefused) as exc:
        leader.add_voter(Voter(3, "other-dir"))
    assert exc.value.code == VoterChangeRefused.NOT_CAUGHT_UP
    with pytest.raises(VoterChangeRefused) as exc:
        leader.add_voter(Voter(1, "d1"))
    assert exc.value.code == VoterChangeRefused.DUPLICATE
    net.down = {0, 1, 2} - {leader.node_id}  # no voter acknowledges: it stays uncommitted
    offset = leader.add_voter(new)
    assert leader.voters == frozenset({0, 1, 2, 3}) and leader._majority == 3  # at once
    assert leader.voter_change_pending
    with pytest.raises(VoterChangeRefused) as exc:
        leader.remove_voter(2, "d2")
    assert exc.value.code == VoterChangeRefused.PENDING  # one change at a time
    # Kafka's words (RemoveVoterHandler.handleRemoveVoterRequest, isOperationPending).
    assert str(exc.value) == (
        "Request timed out waiting for leader to handle previous voter change request"
    )
    net.run(100)
    # The leader and 3 hold it: two of four is no majority of the new set.
    assert nodes[3].voters == leader.voters and nodes[3].role == "follower"
    assert leader.high_watermark <= offset
    net.down = set()
    net.run(100)
    assert leader.high_watermark > offset and not leader.voter_change_pending
    assert leader.voter_set.get(3) == new
    assert {v["node_id"] for v in leader.status()["voters"]} == {0, 1, 2, 3}


def test_a_new_leader_changes_no_voters_before_its_epoch_commits() -> None:
    leader = dnode(0, dset(0, 1, 2))
    elect(leader)
    with pytest.raises(VoterChangeRefused) as exc:
        leader.remove_voter(2, "d2")
    assert exc.value.code == VoterChangeRefused.NOT_READY
    assert str(exc.value) == (
        "Request timed out waiting for leader to establish HWM and fence previous voter changes"
    )
    assert leader.voters == frozenset({0, 1, 2})


def test_remove_refuses_the_last_voter_an_unknown_one_and_a_lost_majority() -> None:
    net, leader = settled([dnode(0, dset(0))])
    with pytest.raises(VoterChangeRefused) as exc:
        leader.remove_voter(0, "d0")
    assert exc.value.code == VoterChangeRefused.LAST_VOTER
    with pytest.raises(VoterChangeRefused) as exc:
        leader.remove_voter(5)
    assert exc.value.code == VoterChangeRefused.NOT_FOUND

    nodes = [dnode(i, dset(0, 1, 2)) for i in range(3)]
    net, leader = settled(nodes)
    other = next(i for i in (1, 2) if i != leader.node_id)
    dead = 3 - leader.node_id - other
    net.down = {dead}
    net.run(CFG.check_quorum_ms + 10)
    # {leader, dead} would need both; only the leader is in contact.
    with pytest.raises(VoterChangeRefused) as exc:
        leader.remove_voter(other, f"d{other}")
    assert exc.value.code == VoterChangeRefused.LOSES_MAJORITY
    assert leader.voters == frozenset({0, 1, 2})
    leader.remove_voter(dead, f"d{dead}")  # removing the dead one keeps a majority
    net.run(50)
    assert leader.voters == frozenset({leader.node_id, other}) and not leader.voter_change_pending


def test_a_leader_removing_itself_leads_until_committed_then_hands_over() -> None:
    nodes = [dnode(i, dset(0, 1, 2)) for i in range(3)]
    net, leader = settled(nodes)
    epoch = leader.epoch
    offset = leader.remove_voter(leader.node_id, f"d{leader.node_id}")
    assert leader.is_leader and not leader.is_voter
    # Its own log no longer counts: the two others must hold the entry.
    others = [n for n in nodes if n is not leader]
    net.down = {others[0].node_id}
    net.pump()
    assert leader.high_watermark <= offset
    net.down = set()
    net.run(500)
    assert leader.role == "observer"
    new = net.leader()
    assert new is not None and new.node_id != leader.node_id and new.epoch > epoch
    assert new.voters == frozenset(n.node_id for n in others)
    assert any(isinstance(m, EndQuorumEpoch) and m.src == leader.node_id for m in net.sent)
    new.propose("after")
    net.run(50)
    assert leader.high_watermark == new.high_watermark  # it still follows the log


def test_truncation_reverts_an_uncommitted_voter_set() -> None:
    f = dnode(1, dset(0, 1, 2), disk(1, (1,)))
    f.step(BeginQuorumEpoch(0, 1, 1, 0), 10)
    f.take_messages()
    added = dset(0, 1, 2, 3).to_entry()
    f.step(FetchResponse(0, 1, 1, 0, None, 1, (Entry(1, added),), 1, last_fetched_epoch=1), 20)
    assert f.voters == frozenset({0, 1, 2, 3})
    f.step(BeginQuorumEpoch(2, 1, 2, 2), 30)
    f.take_messages()
    f.step(FetchResponse(2, 1, 2, 2, None, 2, (), 1, 0, 1, 1, last_fetched_epoch=1), 40)
    assert f.log_end_offset == 1 and f.voters == frozenset({0, 1, 2})


def test_snapshots_carry_the_voter_set_to_a_restart_and_to_a_lagging_node() -> None:
    nodes = [dnode(i, dset(0, 1, 2)) for i in (0, 1, 2, 3)]
    net, leader = settled(nodes)
    leader.add_voter(Voter(3, "d3"))
    net.run(50)
    leader.propose("x")
    net.run(50)
    end = leader.high_watermark
    leader.take_committed()
    leader.create_snapshot(end, {"n": end})
    assert leader._storage.snapshot.voters == dset(0, 1, 2, 3).to_list()
    restarted = dnode(leader.node_id, dset(0, 1, 2), leader._storage)
    assert restarted.voters == frozenset({0, 1, 2, 3})
    fresh = dnode(2, dset(0, 1, 2)) if leader.node_id != 2 else dnode(1, dset(0, 1, 2))
    net.nodes[fresh.node_id] = fresh  # its disk was lost... with the same directory id
    net.run(200)
    assert fresh.log_start_offset == end and fresh.voters == frozenset({0, 1, 2, 3})


def test_a_voter_on_new_storage_neither_votes_nor_counts_as_the_old_one() -> None:
    old = dset(0, 1, 2)
    replaced = RaftNode(2, old, MemoryStorage(), CFG, random.Random(2), 0, directory_id="d2-new")
    assert replaced.role == "observer" and not replaced.is_voter
    replaced.step(VoteRequest(0, 2, 1, 0, 5, 9, voter_directory_id="d2"), 500)
    (resp,) = of(replaced.take_messages(), VoteResponse)
    assert not resp.granted  # it lost the old storage's votes: never counts as it
    leader = dnode(0, old)
    elect(leader)
    leader.step(FetchRequest(2, 0, 1, 1, 1, directory_id="d2-new"), 310)
    assert leader.high_watermark == 0  # an observer's fetch moves nothing
    leader.step(FetchRequest(1, 0, 1, 1, 1, directory_id="d1"), 320)
    assert leader.high_watermark == 1
    assert [o["directory_id"] for o in leader.status()["observers"]] == ["d2-new"]


def test_a_replaced_voter_is_removed_then_added_with_its_new_directory() -> None:
    nodes = [dnode(i, dset(0, 1, 2)) for i in range(3)]
    net, leader = settled(nodes)
    lost = next(i for i in range(3) if i != leader.node_id)
    fresh = RaftNode(
        lost,
        dset(0, 1, 2),
        MemoryStorage(),
        CFG,
        random.Random(9),
        net.now,
        directory_id=f"d{lost}-new",
    )
    net.nodes[lost] = fresh
    net.run(100)
    with pytest.raises(VoterChangeRefused) as exc:
        leader.add_voter(Voter(lost, f"d{lost}-new"))
    assert exc.value.code == VoterChangeRefused.DUPLICATE  # remove the old identity first

    def observed() -> dict:
        o = {o["node_id"]: o for o in leader.status()["observers"]}[lost]
        return {k: v for k, v in o.items() if k != "lag"}  # the removal is one entry more

    seen = observed()
    assert seen["directory_id"] == f"d{lost}-new"
    leader.remove_voter(lost, f"d{lost}")
    # The removed voter's state does not overwrite what the leader knows of the new
    # storage, fetching as an observer all along (its add would be refused as not
    # caught up until it fetched again).
    assert observed() == seen
    net.run(100)
    leader.add_voter(Voter(lost, f"d{lost}-new"))
    net.run(100)
    assert leader.voter_set.get(lost) == Voter(lost, f"d{lost}-new")
    assert fresh.is_voter and fresh.role == "follower"
    assert not leader.voter_change_pending


def test_static_voters_get_their_directory_ids_pinned_by_the_first_change() -> None:
    nodes = [
        RaftNode(i, VOTERS, MemoryStorage(), CFG, random.Random(i), 0, directory_id=f"d{i}")
        for i in (0, 1, 2, 3)
    ]
    net, leader = settled(nodes)
    leader.add_voter(Voter(3, "d3"))
    net.run(100)
    assert [v.directory_id for v in leader.voter_set.voters] == ["d0", "d1", "d2", "d3"]


# -- a static quorum learns its directory ids (KIP-853's kraft.version 0 -> 1) -----------


def static_nodes(ids: tuple[int, ...] = (0, 1, 2), voters=VOTERS) -> list[RaftNode]:
    """Nodes started from static voter flags, each with a directory id ("d<id>")."""
    return [
        RaftNode(i, voters, MemoryStorage(), CFG, random.Random(i), 0, directory_id=f"d{i}")
        for i in ids
    ]


def test_a_static_quorum_pins_its_directory_ids_in_one_entry_without_any_change() -> None:
    nodes = static_nodes()
    net, leader = settled(nodes)
    net.run(CFG.check_quorum_ms)
    assert leader.voter_set == dset(0, 1, 2)
    sets = [o for o in range(leader.log_end_offset) if is_voters(leader.entry(o).data)]
    assert len(sets) == 1 and not leader.voter_change_pending  # one entry, committed
    assert all(n.voter_set == dset(0, 1, 2) for n in nodes)
    net.run(CFG.check_quorum_ms)
    assert [o for o in range(leader.log_end_offset) if is_voters(leader.entry(o).data)] == sets


def test_a_silent_voter_is_pinned_later_and_the_others_without_waiting_for_it() -> None:
    nodes = static_nodes()
    net = Net(nodes)
    net.down = {2}
    net.run(400)
    leader = net.leader()
    assert leader is not None and leader.node_id != 2
    other = 1 - leader.node_id
    net.run(CFG.check_quorum_ms + 50)
    # The silent voter stays static (any storage of node 2), the others are pinned.
    assert leader.voter_set == VoterSet.of([Voter(0, "d0"), Voter(1, "d1"), Voter(2)])
    assert nodes[other].voter_set == leader.voter_set
    net.down = set()
    net.run(200)
    assert leader.voter_set == dset(0, 1, 2) and not leader.voter_change_pending


def test_a_static_voter_back_on_empty_storage_is_an_observer_once_pinned() -> None:
    nodes = static_nodes()
    net, leader = settled(nodes)
    net.run(CFG.check_quorum_ms)
    assert leader.voter_set == dset(0, 1, 2)
    lost = next(i for i in range(3) if i != leader.node_id)
    fresh = RaftNode(
        lost, VOTERS, MemoryStorage(), CFG, random.Random(9), net.now, directory_id="new"
    )
    # Its own static flags make it a voter until its log says otherwise...
    assert fresh.role == "unattached"
    net.nodes[lost] = fresh
    net.run(200)
    # ... and the pinned set it fetched says it is not: an observer, not counted.
    assert fresh.role == "observer" and not fresh.is_voter
    st = leader.status()
    assert {(o["node_id"], o["directory_id"]) for o in st["observers"]} == {(lost, "new")}
    voter = next(v for v in st["voters"] if v["node_id"] == lost)
    assert voter["directory_id"] == f"d{lost}"
    # Every candidacy names the old storage, which the new one is not: it grants nothing
    # (test_a_voter_on_new_storage_neither_votes_nor_counts_as_the_old_one); and its
    # fetches move no high watermark.
    assert all(n.voter_set.get(lost) == Voter(lost, f"d{lost}") for n in net.nodes.values())
    third = 3 - lost - leader.node_id
    net.down = {third}
    hw = leader.high_watermark
    leader.propose("needs the third")
    net.run(50)
    assert leader.high_watermark == hw  # the leader and an empty observer: no majority
    net.down = set()
    net.run(200)  # the third's lost fetch is resent after its request timeout
    assert leader.is_leader and leader.high_watermark > hw
    # Replaced as any pinned voter: remove the old storage, add the new.
    leader.remove_voter(lost, f"d{lost}")
    net.run(100)
    leader.add_voter(Voter(lost, "new"))
    net.run(100)
    assert leader.voter_set.get(lost) == Voter(lost, "new") and fresh.role == "follower"


def test_nodes_without_directory_ids_are_never_pinned() -> None:
    nodes = [node(i) for i in range(3)]
    net, leader = settled(nodes)
    net.run(CFG.check_quorum_ms * 2)
    assert leader.voter_set == VoterSet.static(VOTERS)
    assert not any(is_voters(leader.entry(o).data) for o in range(leader.log_end_offset))
