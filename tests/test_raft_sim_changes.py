"""The deterministic simulation's short seeds: 10,000 of them (100 ticks of faults each,
then healing and the liveness check), every one with its draw of crashes, partitions,
message faults, snapshots and voter changes (add, remove, the leader itself, replacing a
voter whose disk was lost), safety checked after every event. 4 chunks in 5 have three
voters and an observer, 1 in 5 five voters and two observers. Half the seeds start from
static voter flags: their leader pins the voters' directory ids, and a disk is lost there
once that is in every log (the simulation's invariant 7: a new storage is never counted
as, nor votes as, the voter it replaced; test_raft_sim.py runs never-changed static
quorums with lost disks, and the mutations).

STRAITMQ_RAFT_SIM_SEEDS=N runs N seeds instead (a longer run). A failure names its seed:
`python -m bench.raft_sim --seed N --steps 100` replays it.
"""

from __future__ import annotations

import os

import pytest
from straitmq.raft.simulation import Simulation

SHORT_STEPS = 100
SHORT_SEEDS = int(os.environ.get("STRAITMQ_RAFT_SIM_SEEDS", "10000"))
CHUNKS = 40
FIRST = 1_000_000  # numbered apart from test_raft_sim.py's long seeds


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_short_seeds_with_voter_changes(chunk: int) -> None:
    size = -(-SHORT_SEEDS // CHUNKS)
    first = FIRST + chunk * size
    five = chunk % 5 == 4
    for seed in range(first, min(first + size, FIRST + SHORT_SEEDS)):
        Simulation(
            seed, voters=5 if five else 3, observers=2 if five else 1, steps=SHORT_STEPS
        ).run()
