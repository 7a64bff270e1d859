"""bench/transactions.py's own parts that need no broker: the goal of issue 26 as
ratios, the report table, and the top functions of a cProfile dump."""

from __future__ import annotations

import cProfile
from pathlib import Path

from bench.transactions import CONSUME, PRODUCE, goal, parse_args, table, top_functions


def test_goal_needs_kafkas_speed_at_half_its_cpu() -> None:
    kafka = {"mb_s": 40.0, "cpu_s_per_gb": 20.0}
    assert goal({"mb_s": 40.0, "cpu_s_per_gb": 10.0}, kafka) == {
        "mb_s": 1.0,
        "cpu_s_per_gb": 0.5,
        "met": True,
    }
    assert not goal({"mb_s": 39.0, "cpu_s_per_gb": 5.0}, kafka)["met"]
    assert not goal({"mb_s": 80.0, "cpu_s_per_gb": 10.5}, kafka)["met"]
    net = goal(
        {"mb_s": 40.0, "cpu_s_per_gb": 10.0, "cpu_s_per_gb_net": 3.0},
        {**kafka, "cpu_s_per_gb_net": 12.0},
    )
    assert net["cpu_s_per_gb_net"] == 0.25


def test_table_has_every_phase_and_the_ratios() -> None:
    def result(mb_s: float, cpu: float) -> dict:
        median = {ph: {"mb_s": mb_s, "cpu_s_per_gb": cpu, "p99_ms": 9.0} for ph in PRODUCE}
        median |= {ph: {"mb_s": mb_s, "cpu_s_per_gb": cpu} for ph in CONSUME}
        return {"median": median, "idle_cpu_s_per_s": 0.02}

    out = table({"kafka": result(40.0, 20.0), "straitmq": result(60.0, 5.0)})
    rows = out.splitlines()
    for ph in PRODUCE + CONSUME:
        assert sum(r.startswith(f"| {ph} |") for r in rows) == 2  # values, then ratios
    assert f"| {PRODUCE[0]} | 1.50 | 0.25 | - | met |" in rows
    assert "| idle broker CPU s/s |  |  | 0.02 |  |  |  | 0.02 |  |" in rows


def test_top_functions_of_a_profile(tmp_path: Path) -> None:
    def busy_function_for_the_profile() -> int:
        return sum(i * i for i in range(200_000))

    prof = cProfile.Profile()
    prof.runcall(busy_function_for_the_profile)
    path = tmp_path / "p.prof"
    prof.dump_stats(str(path))
    out = top_functions(path, 5)
    assert "busy_function_for_the_profile" in out or "<genexpr>" in out
    assert "tottime" in out
    only = top_functions(path, 5, "busy_function_for_the_profile")
    assert "busy_function_for_the_profile" in only and "<genexpr>" not in only


def test_defaults_are_the_documented_ones() -> None:
    a = parse_args([])
    assert (a.per_txn, a.transaction_duration_ms, a.systems) == (100, 100, "kafka,straitmq")
