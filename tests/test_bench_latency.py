"""bench/latency.py's own parts that need no broker: its arguments, E2eLatency's
summary, and the table of medians over the rounds."""

from __future__ import annotations

import sys

import pytest

from bench.latency import bucket_quantile, medians, parse_args, parse_e2e, parse_steady, report

# As tools/java/kafka-4.4/apps/E2eLatency.java prints its summary: EndToEndLatency's two
# lines (whole ms), then the same percentiles in µs, which are what counts.
E2E_OUT = """\
Avg latency: 1.2345 ms
Percentiles: 50th = 1, 99th = 4, 99.9th = 11
Percentiles us: 50th = 1180, 99th = 4920, 99.9th = 11050, max = 13001
"""


def test_arguments() -> None:
    a = parse_args(["--rates", "5000,20000", "--rf", "3", "--strait", "before=/x/python"])
    assert a.rates == [5000, 20000] and a.rf == 3 and a.kafka
    assert a.pythons == {"before": "/x/python"}
    a = parse_args(["--systems", "straitmq"])
    assert a.pythons == {"straitmq": sys.executable} and not a.kafka
    for bad in (["--rates", "5k"], ["--strait", "nopython"], ["--systems", "redpanda"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_end_to_end_summary_is_parsed() -> None:
    assert parse_e2e(E2E_OUT) == {
        "e2e_avg_ms": 1.2345,
        "e2e_p50_ms": 1.18,
        "e2e_p99_ms": 4.92,
        "e2e_p999_ms": 11.05,
    }
    with pytest.raises(RuntimeError):
        parse_e2e("Exception in thread main")
    with pytest.raises(RuntimeError):  # Kafka's EndToEndLatency alone: no µs line
        parse_e2e(E2E_OUT.rsplit("Percentiles us", 1)[0])


def _round(p99: float, cpu: float = 0.1) -> dict[str, float]:
    return {
        "p50_ms": 1,
        "p95_ms": 3,
        "p99_ms": p99,
        "p999_ms": 40,
        "max_lat_ms": 90,
        "rec_s": 4999.0,
        "broker_cpu": cpu,
    }


def test_medians_and_the_table() -> None:
    rounds = {
        "kafka": {"5000/s": [_round(20), _round(30), _round(25)], "e2e": []},
        "straitmq": {
            "5000/s": [
                _round(5) | {"broker_p99_ms": 2.5},
                _round(9) | {"broker_p99_ms": 5},
                _round(7, cpu=0.2) | {"broker_p99_ms": 1},
            ],
            "e2e": [{"e2e_avg_ms": 1, "e2e_p50_ms": 1, "e2e_p99_ms": 3, "e2e_p999_ms": 8}],
        },
    }
    med = medians(rounds)
    assert med["kafka"]["5000/s"]["p99_ms"] == 25
    assert med["straitmq"]["5000/s"]["p99_ms"] == 7
    assert med["straitmq"]["5000/s"]["broker_cpu"] == 0.1
    assert "e2e" not in med["kafka"]  # no round: no row
    table = report(rounds)
    assert "| 5000/s | straitmq | 3 | 1 | 3 | 7 (5-9) | 40 | 90 | 4,999/s | 10% | ≤ 2.5 |" in table
    assert "| 5000/s | kafka | 3 | 1 | 3 | 25 (20-30) | 40 | 90 | 4,999/s | 10% | - |" in table
    assert "| e2e | straitmq | 1 | 1.0 | - | 3.0 (3.0-3.0) |" in table
    assert "| straitmq | 0.28 | - |" in table  # p99 7 / 25; no Kafka e2e to compare


def test_the_brokers_own_p99_comes_from_the_histogram_difference() -> None:
    """Cumulative counts per bucket bound, before and after the measured run: the p99 of
    what the run added is the bound of the bucket it falls in."""
    before = {0.001: 100.0, 0.0025: 100.0, 0.005: 100.0, 0.01: 100.0, float("inf"): 100.0}
    after = {0.001: 1080.0, 0.0025: 1095.0, 0.005: 1099.0, 0.01: 1100.0, float("inf"): 1100.0}
    assert bucket_quantile(before, after, 0.5) == 0.001
    assert bucket_quantile(before, after, 0.99) == 0.0025  # 995 of the 1000 by 2.5 ms
    assert bucket_quantile(before, after, 0.999) == 0.005  # 999 by 5 ms
    assert bucket_quantile(after, after, 0.99) is None  # nothing recorded in between
    assert bucket_quantile({}, {}, 0.99) is None


# As Kafka 4.4's ProducerPerformance prints with --warmup-records: a progress line, the
# whole run's summary, then the steady-state one (the records after the warm-up).
PERF_OUT = """\
24998 records sent, 4998.6 records/sec (4.88 MB/sec), 2.1 ms avg latency, 180.0 ms max latency.
75000 records sent, 4999.533364 records/sec (4.88 MB/sec), 1.93 ms avg latency, 180.00 ms \
max latency, 1 ms 50th, 3 ms 95th, 61 ms 99th, 170 ms 99.9th.
50000 steady state records sent, 4999.700018 records/sec (4.88 MB/sec), 0.91 ms avg \
latency, 12.00 ms max latency, 1 ms 50th, 2 ms 95th, 4 ms 99th, 9 ms 99.9th.
"""


def test_the_steady_state_line_is_reported_not_the_warm_up() -> None:
    res = parse_steady(PERF_OUT)
    assert (res["records"], res["p99_ms"], res["max_lat_ms"]) == (50000, 4, 12)
    # Without --warmup-records (a 4.1 client) the one summary is it.
    only = PERF_OUT.rsplit("\n", 2)[0]
    assert parse_steady(only)["p99_ms"] == 61
