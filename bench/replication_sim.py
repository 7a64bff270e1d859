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
import time
import traceback

from straitmq.broker.replication.simulation import Simulation, SimulationFailure


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
    failures: list[tuple[int, str]] = []
    totals: dict[str, int] = {}
    started = time.perf_counter()
    for seed in seeds:
        sim = Simulation(seed, steps=args.steps)
        try:
            stats = sim.run()
        except SimulationFailure as exc:
            failures.append((seed, str(exc)))
            print(f"FAIL {exc}", flush=True)
            if args.seed is not None:
                traceback.print_exc()
            continue
        except Exception as exc:  # an assertion inside the core, or a crash: also a failure
            failures.append((seed, repr(exc)))
            print(f"FAIL seed {seed}: {exc!r} [replay: {sim.replay}]", flush=True)
            if args.seed is not None:
                traceback.print_exc()
            continue
        for k, v in stats.items():
            totals[k] = totals.get(k, 0) + v
        if args.seed is not None:
            print(f"seed {seed}: {stats}")
    elapsed = time.perf_counter() - started
    n = len(seeds)
    print(
        f"{n} seeds in {elapsed:.1f} s: {n / elapsed:.1f} seeds/s, {len(failures)} failed; "
        f"totals {totals}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
