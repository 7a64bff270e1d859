"""Run the deterministic replication simulation over many seeds (not a pytest test).

    python -m bench.replication_sim --seeds 100000             # seeds 0..99999
    python -m bench.replication_sim --seeds 20000 --start 50000
    python -m bench.replication_sim --seed 1234                # replay one seed, with its stats

Prints seeds per second and every failing seed with the command that replays it.
Exit code 1 when any seed failed. See straitmq.broker.replication.simulation.
"""

from __future__ import annotations

import argparse
import sys

from straitmq.broker.replication.simulation import Simulation, SimulationFailure

from bench.seed_runs import run_seeds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.replication_sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--seeds", type=int, default=10_000, help="how many seeds to run")
    p.add_argument("--start", type=int, default=0, help="first seed")
    p.add_argument("--seed", type=int, help="run this one seed only, verbosely")
    p.add_argument("--steps", type=int, default=160, help="steps of simulated faults per seed")
    args = p.parse_args(argv)

    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    return run_seeds(
        seeds,
        lambda seed: Simulation(seed, steps=args.steps),
        SimulationFailure,
        one=args.seed is not None,
    )


if __name__ == "__main__":
    sys.exit(main())
