"""The replication simulation over many seeds, and the bugs it must find when planted.

Seeds 0..REPLICATION_SIM_SEEDS-1 (10,000 unless the environment says more), checked after
every step (see straitmq.broker.replication.simulation). A failure names its seed;
replay it with `python -m bench.replication_sim --seed N`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from straitmq.broker.producer_state import DuplicateBatch, ProducerStateTable
from straitmq.broker.replication import simulation
from straitmq.broker.replication.core import LEADER, ReplicaCore
from straitmq.broker.replication.simulation import Simulation, SimulationFailure, run_seeds
from straitmq.metadata.image import PartitionImage

SEEDS = int(os.environ.get("REPLICATION_SIM_SEEDS", "10000"))
CHUNK = 500
# A planted bug must be found within the seeds CI runs.
BUDGET = range(SEEDS)


@pytest.mark.parametrize("start", range(0, SEEDS, CHUNK))
def test_seeds(start: int) -> None:
    run_seeds(range(start, min(start + CHUNK, SEEDS)))


def test_a_seed_replays_exactly() -> None:
    first = Simulation(7).run()
    assert Simulation(7).run() == first
    assert first["acked_all"] > 0


def test_the_faults_are_exercised() -> None:
    totals = run_seeds(range(300))
    for what in (
        "crashes",
        "pauses",
        "partitions",
        "elections",
        "isr_changes",
        "reassignments",
        "truncations",
        "acked_all",
    ):
        assert totals[what] > 20, (what, totals)
    assert totals["unclean"] > 0, totals


def _caught(what: str) -> None:
    with pytest.raises(SimulationFailure) as exc:
        run_seeds(BUDGET)
    message = str(exc.value)
    assert what in message
    assert "python -m bench.replication_sim --seed" in message


def test_planted_high_watermark_from_a_follower_outside_the_isr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The high watermark follows whichever follower is furthest, in the ISR or not: an
    acknowledged write can be missing from the in-sync replica elected next."""

    def advance_hw(self: ReplicaCore, leo: int) -> bool:
        if self.role != LEADER:
            return False
        furthest = max((f.log_end_offset for f in self.followers.values()), default=leo)
        hw = min(leo, furthest)
        if hw > self.high_watermark:
            self.high_watermark = hw
            return True
        return False

    monkeypatch.setattr(ReplicaCore, "advance_hw", advance_hw)
    _caught("the leader lost a committed record")


def test_planted_no_truncation_on_a_diverging_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower keeps the suffix an old leader wrote after their logs parted: it then
    holds other records than the leader below the high watermark."""
    monkeypatch.setattr(simulation, "truncation_offset", lambda epochs, leo, start, epoch, end: leo)
    _caught("replicas disagree below the high watermark")


def test_planted_fetch_ignores_a_diverging_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader answers a Fetch from a follower whose log parted from its own as if
    they agreed (no KIP-320 diverging epoch): a follower that relies on it (odd seeds)
    keeps an old leader's suffix below the high watermark."""
    monkeypatch.setattr(simulation, "diverging_epoch", lambda epochs, leo, offset, last: None)
    _caught("replicas disagree below the high watermark")


def test_planted_isr_change_to_a_lagging_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ISR change takes in a follower that is behind the high watermark (elected
    next, it would lack acknowledged writes): caught as it joins."""

    def isr_change(
        self: ReplicaCore,
        now: float,
        leo: int,
        lag_s: float,
        alive: Callable[[int], bool],
        incarnation: Callable[[int], str | None] | None = None,
    ) -> list[int] | None:
        if self.role != LEADER or self.pending_isr is not None:
            return None
        isr = [
            r
            for r in self.isr
            if r == self.node_id
            or (
                (f := self.followers.get(r)) is not None
                and now - self.caught_up_at(f, leo) <= lag_s
            )
        ]
        for r in self.replicas:
            f = self.followers.get(r)
            # The planted bug: no check that the follower reached the high watermark.
            if r not in isr and f is not None and f.log_end_offset >= 0 and alive(r):
                if now - self.caught_up_at(f, leo) <= lag_s:
                    isr.append(r)
        if self.node_id not in isr:
            isr.insert(0, self.node_id)
        return isr if sorted(isr) != sorted(self.isr) else None

    monkeypatch.setattr(ReplicaCore, "isr_change", isr_change)
    _caught("a replica joined the ISR short of the high watermark")


def test_planted_pending_shrink_counted_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The high watermark counts a proposed shrink before the controller commits it
    (what KIP-497 forbids): the controller may elect the replica it left out."""
    monkeypatch.setattr(
        ReplicaCore,
        "maximal_isr",
        lambda self: self.isr if self.pending_isr is None else self.pending_isr,
    )
    _caught("the leader lost a committed record")


def test_planted_duplicate_check_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """A retried idempotent batch is appended again instead of answered with its first
    offset: one producer sequence twice in the log."""
    check = ProducerStateTable.check

    def no_duplicates(self: ProducerStateTable, batches: list) -> None:
        try:
            check(self, batches)
        except DuplicateBatch:
            pass

    monkeypatch.setattr(ProducerStateTable, "check", no_duplicates)
    _caught("a producer sequence was written twice")


def test_planted_isr_join_on_a_restarted_followers_old_fetches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No broker incarnations (KIP-903's broker epochs): a follower that restarted and
    lost its unflushed tail joins the ISR on what its previous process fetched."""
    fetched = ReplicaCore.on_follower_fetch
    change = ReplicaCore.isr_change

    def on_follower_fetch(self: ReplicaCore, *args: object) -> tuple[bool, bool]:
        return fetched(self, *args[:6])  # type: ignore[arg-type]

    def isr_change(self: ReplicaCore, *args: object) -> list[int] | None:
        return change(self, *args[:4])  # type: ignore[arg-type]

    monkeypatch.setattr(ReplicaCore, "on_follower_fetch", on_follower_fetch)
    monkeypatch.setattr(ReplicaCore, "isr_change", isr_change)
    monkeypatch.setattr(ReplicaCore, "isr_incarnations", lambda self, isr: None)
    _caught("a replica joined the ISR short of the high watermark")


def test_a_restarted_follower_rejoins_only_on_its_new_process_fetches() -> None:
    """A follower out of the ISR, caught up as incarnation "a", restarts as "b" with
    less: the leader does not add it on "a"'s fetches, and tells the controller which
    process its caught-up fetches came from."""
    leader = ReplicaCore("t", 0, 1)
    leader.update(PartitionImage([1, 2, 3], [1, 3], 1, 0, 0), 2, 10, 0.0)
    leader.on_follower_fetch(3, 10, 10, 0.01, None, 0, "c")
    leader.on_follower_fetch(2, 10, 10, 0.01, None, 0, "a")  # caught up, not added yet
    now = {2: "a", 3: "c"}
    assert leader.isr_change(0.02, 10, 0.15, lambda _: True, now.get) == [1, 3, 2]
    assert leader.isr_incarnations([1, 3, 2]) == {2: "a"}
    now[2] = "b"  # restarted: registered again
    assert leader.isr_change(0.03, 10, 0.15, lambda _: True, now.get) is None
    leader.on_follower_fetch(2, 6, 10, 0.04, None, 0, "b")  # its first fetch: it kept 6
    assert leader.isr_change(0.05, 10, 0.15, lambda _: True, now.get) is None
    leader.on_follower_fetch(2, 10, 10, 0.06, None, 0, "a")  # the old process's, late
    assert leader.isr_change(0.07, 10, 0.15, lambda _: True, now.get) is None
    leader.on_follower_fetch(2, 10, 10, 0.08, None, 0, "b")
    assert leader.isr_change(0.09, 10, 0.15, lambda _: True, now.get) == [1, 3, 2]
    assert leader.isr_incarnations([1, 3, 2]) == {2: "b"}


def test_a_replica_moved_away_and_back_starts_over_at_the_leader() -> None:
    """Seed 4534's bug: a leader kept what it knew of a replica reassigned away; moved
    back with an empty log, the replica looked caught up and joined the ISR."""
    leader = ReplicaCore("t", 0, 1)
    p = PartitionImage([1, 2, 3], [1, 2, 3], 1, 0, 0)
    leader.update(p, 2, 10, 0.0)
    for r in (2, 3):
        leader.on_follower_fetch(r, 10, 10, 0.01, None, 0)
    assert leader.advance_hw(10) and leader.high_watermark == 10
    leader.update(PartitionImage([1, 2], [1, 2], 1, 0, 1), 2, 10, 0.02)
    leader.update(PartitionImage([1, 2, 3], [1, 2], 1, 0, 2), 2, 10, 0.03)
    assert leader.isr_change(0.04, 10, 0.15, lambda _: True) is None
    leader.on_follower_fetch(3, 0, 10, 0.05, None, 0)  # its first fetch: an empty log
    assert leader.isr_change(0.06, 10, 0.15, lambda _: True) is None
    leader.on_follower_fetch(3, 10, 10, 0.07, None, 0)
    assert leader.isr_change(0.08, 10, 0.15, lambda _: True) == [1, 2, 3]


def test_a_replica_out_of_the_isr_must_fetch_again_to_rejoin() -> None:
    """Seed 1338's bug: a follower fenced (its broker crashed and lost unflushed
    records) and back within the lag time rejoined the ISR on the log end it had
    fetched before the crash, and was elected without those records."""
    leader = ReplicaCore("t", 0, 1)
    leader.update(PartitionImage([1, 2, 3], [1, 2, 3], 1, 0, 0), 2, 10, 0.0)
    for r in (2, 3):
        leader.on_follower_fetch(r, 10, 10, 0.01, None, 0)
    leader.update(PartitionImage([1, 2, 3], [1, 3], 1, 0, 1), 2, 10, 0.02)  # 2 fenced
    assert leader.isr_change(0.03, 10, 0.15, lambda _: True) is None
    leader.on_follower_fetch(2, 4, 10, 0.04, None, 0)  # back, with what it kept
    assert leader.isr_change(0.05, 10, 0.15, lambda _: True) is None
    leader.on_follower_fetch(2, 10, 10, 0.06, None, 0)
    assert leader.isr_change(0.07, 10, 0.15, lambda _: True) == [1, 3, 2]


def test_a_caught_up_follower_of_an_idle_partition_rejoins_through_its_fetch_session() -> None:
    """bench/fault_runs.py's find: a follower out of the ISR (its log end forgotten, as
    above) of an idle partition never named it again in its incremental fetch session
    (KIP-227 leaves out what did not change), so it never rejoined: an ISR of one, under
    min.insync.replicas, for good. Its live session, fetching since, says where it is;
    a session that has not fetched since (the process before a restart) does not."""
    from straitmq.broker.fetch_sessions import FetchSession, SessionPartition

    leader = ReplicaCore("t", 0, 1)
    leader.update(PartitionImage([1, 2, 3], [1, 2, 3], 1, 0, 0), 2, 10, 0.0)
    sessions = {}
    for r in (2, 3):
        s = sessions[r] = FetchSession(r, r)
        s.parts[("t", 0)] = SessionPartition(10, 1 << 20, 1, 0)
        s.last_fetch = 0.01
        leader.on_follower_fetch(r, 10, 10, 0.01, s, 0)
    leader.update(PartitionImage([1, 2, 3], [1, 3], 1, 0, 1), 2, 10, 0.02)  # 2 out
    assert leader.isr_change(0.03, 10, 0.15, lambda _: True) is None  # not fetched since
    sessions[2].last_fetch = 0.04  # an incremental fetch that does not name t-0
    assert leader.isr_change(0.05, 10, 0.15, lambda _: True) == [1, 3, 2]
    # A session behind the log end does not vouch for it.
    leader.update(PartitionImage([1, 2, 3], [1, 3], 1, 0, 2), 2, 10, 0.06)
    sessions[2].parts[("t", 0)].fetch_offset = 7
    sessions[2].last_fetch = 0.07
    assert leader.isr_change(0.08, 10, 0.15, lambda _: True) is None


def test_planted_acks_all_wait_outside_its_leader_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    """An acks=all wait that starts after its write's leadership ended (the answer runs
    in a task of its own) and trusts whatever high watermark the broker has then: once
    the broker leads again, it vouches for an offset another leader's record holds."""

    def start_wait(
        self: Simulation, b: Any, end: int, client: int, req: int, epoch: int, written: Any
    ) -> None:
        core = b.core
        if core is not None and core.high_watermark >= end:
            self._answer(b, client, req, 0, end - 1, written)
        elif core is not None and core.role == LEADER:
            b.waiters.append((end, client, req, self.now + 5.0, written))

    monkeypatch.setattr(Simulation, "_start_wait", start_wait)
    _caught("acknowledged acks=all write")
