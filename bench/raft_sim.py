"""Run the deterministic Raft simulation over many seeds (not a pytest test).

    python -m bench.raft_sim --seeds 5000              # seeds 0..4999, 3 voters
    python -m bench.raft_sim --seeds 2000 --start 10000 --voters 5
    python -m bench.raft_sim --seed 1234               # replay one seed, with its stats

Prints seeds per second and every failing seed with the command that replays it.
Exit code 1 when any seed failed. See straitmq.raft.simulation.
"""

from __future__ import annotations

import argparse
import sys

from straitmq.raft.simulation import Simulation, SimulationFailure

from bench.seed_runs import run_seeds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.raft_sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    p.add_argument("--start", type=int, default=0, help="first seed")
    p.add_argument("--seed", type=int, help="run this one seed only, verbosely")
    p.add_argument("--voters", type=int, default=3)
    p.add_argument("--observers", type=int, default=1)
    p.add_argument("--steps", type=int, default=600, help="ticks of simulated faults per seed")
    args = p.parse_args(argv)

    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    return run_seeds(
        seeds,
        lambda seed: Simulation(
            seed, voters=args.voters, observers=args.observers, steps=args.steps
        ),
        SimulationFailure,
        one=args.seed is not None,
        detail=lambda sim: f" faults={sim.faults}",
    )


if __name__ == "__main__":
    sys.exit(main())
