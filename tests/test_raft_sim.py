"""The deterministic simulation over many seeds: safety after every event, liveness at the
end. A failure names its seed; replay it with `python -m bench.raft_sim --seed N`."""

from __future__ import annotations

import pytest
from straitmq.controller.raft import core
from straitmq.controller.raft.simulation import Simulation, SimulationFailure

from straitmq import invariants

CHUNK = 25
THREE_VOTERS = 800  # seeds 0..799
FIVE_VOTERS = 200  # seeds 0..199, with two observers


def _run(seeds: range, voters: int, observers: int) -> None:
    for seed in seeds:
        Simulation(seed, voters=voters, observers=observers).run()


@pytest.mark.parametrize("start", range(0, THREE_VOTERS, CHUNK))
def test_three_voters(start: int) -> None:
    _run(range(start, start + CHUNK), voters=3, observers=1)


@pytest.mark.parametrize("start", range(0, FIVE_VOTERS, CHUNK))
def test_five_voters(start: int) -> None:
    _run(range(start, start + CHUNK), voters=5, observers=2)


def test_a_seed_replays_exactly() -> None:
    first = Simulation(7).run()
    assert Simulation(7).run() == first
    assert first["elections"] > 0 and first["committed"] > 0


def test_the_faults_are_exercised() -> None:
    totals: dict[str, int] = {}
    for seed in range(40):
        for k, v in Simulation(seed).run().items():
            totals[k] = totals.get(k, 0) + v
    for what in ("elections", "snapshots", "crashes", "proposals", "committed"):
        assert totals[what] > 40, (what, totals)


def test_a_planted_bug_is_caught_with_a_replay_command(monkeypatch) -> None:
    # Votes granted without the log up-to-date check: a leader can miss committed entries.
    monkeypatch.setattr(core.RaftNode, "_log_up_to_date", lambda self, m: True)
    with pytest.raises(SimulationFailure) as exc:
        _run(range(50), voters=3, observers=1)
    assert "python -m bench.raft_sim --seed" in str(exc.value)


def test_a_broken_invariant_of_the_core_fails_the_run_with_its_seed(monkeypatch) -> None:
    """In the simulation the core's invariants raise instead of stopping the process, and
    the failure names the invariant and the seed that replays it."""
    tick = core.RaftNode.tick

    def broken_after_a_while(self: core.RaftNode, now_ms: int) -> None:
        if now_ms >= 500:
            invariants.broken("planted by the test", node=self.node_id)
        tick(self, now_ms)

    monkeypatch.setattr(core.RaftNode, "tick", broken_after_a_while)
    with pytest.raises(SimulationFailure) as exc:
        Simulation(3).run()
    message = str(exc.value)
    assert "invariant broken: planted by the test" in message
    assert "python -m bench.raft_sim --seed 3" in message
