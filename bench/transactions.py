"""Transactions (issue 26): transactional produce and read_committed consume, StraitMQ
(one broker) beside Apache Kafka 4.4 (one KRaft combined broker, bench/kafka_ref.py),
one system at a time, in one run, with the same clients (not a pytest test).

    python -m bench.transactions [--records 200000] [--txn-records 100000] [--rounds 3]
                                 [--systems kafka,straitmq]
    python -m bench.transactions --profile [--records 200000]  # cProfile of StraitMQ's
                                                               # broker during the produce

Per system, after a warm-up (both produce phases once, smaller, not reported; a JVM
broker must not be measured cold), `--rounds` times, on fresh 1-partition RF 1 topics:

  txn produce, by duration   Kafka 4.4's ProducerPerformance (from the 4.4 jars),
                             `--records` x 1 KiB, `--throughput -1`, `--transactional-id`,
                             `--transaction-duration-ms` (100: Kafka Streams' commit
                             interval under exactly_once_v2), batch.size 64 KiB, linger
                             5 ms: MB/s, p99 latency (its own), broker CPU s per GB
  txn produce, 100 per txn   ProducerPerformance has no "records per transaction", so
                             librdkafka (confluent-kafka's transactional Producer):
                             `--txn-records` x 1 KiB, begin, `--per-txn` (100) produce()
                             calls, commit_transaction() (which flushes and waits for
                             EndTxn), the next; linger 5 ms: MB/s, p99 of each record's
                             produce()-to-ack latency (its delivery report), CPU s per GB
  consume                    Kafka 4.4's ConsumerPerformance (own group, from the start)
                             reading each of the two topics whole, with
                             isolation.level=read_committed and again read_uncommitted
                             (`--consumer.config`), the order flipped every round:
                             MB/s (`fetch.MB.sec`: without the group join) and broker CPU
                             s per GB; it must read exactly the records produced (every
                             transaction committed: nothing is filtered, but the broker
                             bounds read_committed fetches by the LSO and lists aborted
                             transactions, and the client drops the markers)

Broker CPU: utime + stime of the broker's process tree from /proc (bench/cleaner.py's
`tree_cpu_s`), from just before the client starts to its end (JVM start-up included: the
broker is idle meanwhile; its idle CPU s/s, measured over `--idle-seconds` after the
warm-up, is in the table), per 10^9 bytes of values. MB = 2^20 bytes (as Kafka's tools).
Medians over the rounds are reported, each run is in the JSON. The goal of issue 26: at
least Kafka's MB/s at no more than half its broker CPU per GB; the ratios table says
StraitMQ/Kafka for each.

`--profile` runs StraitMQ's broker under `python -m cProfile` (its event loop thread),
does one warm-up and one ProducerPerformance run and one 100-per-txn run, stops the
broker (SIGTERM: cProfile writes on exit) and prints the top functions by own time.

Output: markdown tables, JSON of everything (`--json`, default
.cache/bench/transactions-<timestamp>.json; `--report JSON` re-prints a run's tables).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import io
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # allow `python bench/transactions.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import KafkaException, Producer

from bench.cleaner import Kafka, Strait, System, create_topic, log, medians
from bench.cluster_throughput import broker_cpu_s
from bench.cluster_throughput import create_topic as create_rf3_topic
from bench.failover import KafkaTarget, StraitTarget
from bench.javatools import CONSUMER_PERF, PRODUCER_PERF, REPO_ROOT
from bench.throughput import (
    PhaseError,
    parse_consumer_perf,
    parse_producer_perf,
    percentile,
    run_tool,
)

MB = 1024 * 1024
GB = 1e9
RECORD_SIZE = 1024


# -- 3 brokers ------------------------------------------------------------------------


class Cluster:
    """3 controllers + 3 brokers (bench/failover.py's targets, each system's default
    timeouts), with System's interface as far as this bench uses it: topics RF 3,
    min.insync.replicas 2, the transaction state log RF 3 too; CPU = the 3 brokers'."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name.startswith("kafka"):
            self.target: Any = KafkaTarget(fast_failover=False)
        else:
            self.target = StraitTarget(
                fast_failover=False,
                extra_broker_args=("--transaction-state-log-replication-factor", "3"),
            )

    @property
    def bootstrap(self) -> str:
        return self.target.bootstrap

    def start(self) -> None:
        self.target.start()

    def stop(self) -> None:
        self.target.stop()

    def cpu_s(self) -> float:
        return broker_cpu_s(self.target)


Target = System | Cluster


def make_topic(s: Target, topic: str) -> None:
    if isinstance(s, Cluster):
        create_rf3_topic(s.bootstrap, topic, 1)
    else:
        create_topic(s, topic, {})


# -- clients ---------------------------------------------------------------------------


def producer_perf_txn(s: Target, topic: str, n: int, a: argparse.Namespace) -> dict[str, Any]:
    """Kafka 4.4's ProducerPerformance, transactional, one commit per
    `--transaction-duration-ms`; MB/s and p99 as it reports them."""
    args: list[Any] = [
        "--topic",
        topic,
        "--num-records",
        n,
        "--record-size",
        RECORD_SIZE,
        "--throughput",
        -1,
        "--transactional-id",
        f"bench-pp-{uuid.uuid4().hex[:8]}",
        "--transaction-duration-ms",
        a.transaction_duration_ms,
        "--producer-props",
        f"bootstrap.servers={s.bootstrap}",
        *a.producer_prop,
    ]
    out, _ = run_tool(PRODUCER_PERF, args, timeout=a.phase_timeout, jars="4.4")
    r: dict[str, Any] = parse_producer_perf(out)
    if r["records"] != n:
        raise PhaseError(f"ProducerPerformance sent {r['records']:.0f} of {n}")
    return r


def rdkafka_txn(s: Target, topic: str, n: int, a: argparse.Namespace) -> dict[str, Any]:
    """librdkafka's transactional producer: `a.per_txn` records per transaction."""
    p = Producer(
        {
            "bootstrap.servers": s.bootstrap,
            "transactional.id": f"bench-rd-{uuid.uuid4().hex[:8]}",
            "linger.ms": 5,
            "log_level": 3,
        }
    )
    p.init_transactions(60)
    p.list_topics(topic, timeout=30)  # metadata before the clock starts
    payload = os.urandom(RECORD_SIZE)
    lat: list[float] = []
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            lat.append(msg.latency())

    t0 = time.perf_counter()
    sent = 0
    txns = 0
    try:
        while sent < n:
            p.begin_transaction()
            for _ in range(min(a.per_txn, n - sent)):
                p.produce(topic, payload, partition=0, on_delivery=on_delivery)
                sent += 1
            p.commit_transaction(a.phase_timeout)
            txns += 1
    except KafkaException as e:
        raise PhaseError(f"rdkafka transaction {txns}: {e}") from None
    dt = time.perf_counter() - t0
    p.flush(10)
    if errors or len(lat) != n:
        raise PhaseError(f"rdkafka txn: {len(lat)} of {n} acked, errors {errors[:1]}")
    lat.sort()
    return {
        "records": n,
        "transactions": txns,
        "seconds": dt,
        "rec_s": n / dt,
        "mb_s": n * RECORD_SIZE / MB / dt,
        "txn_s": txns / dt,
        "p50_ms": percentile(lat, 0.50) * 1000,
        "p99_ms": percentile(lat, 0.99) * 1000,
    }


def consumer_perf(
    s: Target, topic: str, n: int, isolation: str, workdir: Path, a: argparse.Namespace
) -> dict[str, Any]:
    """Kafka 4.4's ConsumerPerformance reading `topic` whole at `isolation`."""
    cfg = workdir / f"consumer-{isolation}.properties"
    cfg.write_text(f"isolation.level={isolation}\nauto.offset.reset=earliest\n")
    args: list[Any] = [
        "--bootstrap-server",
        s.bootstrap,
        "--topic",
        topic,
        "--messages",
        n,
        "--timeout",
        30000,
        "--group",
        f"bench-{uuid.uuid4().hex[:8]}",
        "--consumer.config",
        cfg,
    ]
    out, _ = run_tool(CONSUMER_PERF, args, timeout=a.phase_timeout, jars="4.4")
    res = parse_consumer_perf(out)
    got = int(res["data.consumed.in.nMsg"])
    if got != n:
        raise PhaseError(f"ConsumerPerformance {isolation} read {got} of {n} from {topic}")
    return {
        "mb_s": float(res["fetch.MB.sec"]),
        "mb_s_with_join": float(res["MB.sec"]),
        "rebalance_ms": float(res["rebalance.time.ms"]),
        "records": got,
    }


def with_cpu(s: Target, n: int, idle: float, f: Any, *args: Any) -> dict[str, Any]:
    """Run f(*args) and add the broker's CPU seconds per GB of `n` records' values, as
    measured and net of what the broker burns idle (`idle` CPU s/s) over the same time:
    a client's JVM start-up is seconds, as long as some runs."""
    c0 = s.cpu_s()
    t0 = time.monotonic()
    r = f(*args)
    r["cpu_s"] = s.cpu_s() - c0
    r["wall_s"] = time.monotonic() - t0
    r["cpu_s_per_gb"] = r["cpu_s"] / (n * RECORD_SIZE / GB)
    r["cpu_s_per_gb_net"] = max(0.0, r["cpu_s"] - idle * r["wall_s"]) / (n * RECORD_SIZE / GB)
    return r


# -- one system ------------------------------------------------------------------------

PRODUCE = ("produce txn 100 ms", "produce 100/txn")
CONSUME = tuple(f"consume {iso} ({p})" for p in ("100 ms", "100/txn") for iso in ("rc", "ru"))
ISOLATION = {"rc": "read_committed", "ru": "read_uncommitted"}


def run_system(s: Target, a: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    t = time.monotonic()
    s.start()
    log(f"{s.name}: ready in {time.monotonic() - t:.1f}s on {s.bootstrap}")
    run = uuid.uuid4().hex[:6]
    # warm-up: the JIT, the coordinator's first transactional id, the consumer path
    make_topic(s, f"warm-pp-{run}")
    make_topic(s, f"warm-rd-{run}")
    w = producer_perf_txn(s, f"warm-pp-{run}", a.warmup_records, a)
    rdkafka_txn(s, f"warm-rd-{run}", a.warmup_records // 4, a)
    consumer_perf(s, f"warm-pp-{run}", a.warmup_records, "read_committed", workdir, a)
    log(f"{s.name}: warm-up produce {w['mb_s']:.1f} MB/s")
    # What the broker burns with no client: part of every CPU figure (JVM start-ups).
    c0, t0 = s.cpu_s(), time.monotonic()
    time.sleep(a.idle_seconds)
    idle = (s.cpu_s() - c0) / (time.monotonic() - t0)
    log(f"{s.name}: idle broker CPU {idle:.3f} s/s")

    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in PRODUCE + CONSUME}
    for rnd in range(a.rounds):
        topics = {"100 ms": f"pp-{run}-r{rnd}", "100/txn": f"rd-{run}-r{rnd}"}
        counts = {"100 ms": a.records, "100/txn": a.txn_records}
        for t in topics.values():
            make_topic(s, t)
        r = with_cpu(s, a.records, idle, producer_perf_txn, s, topics["100 ms"], a.records, a)
        runs[PRODUCE[0]].append(r)
        log(
            f"{s.name}: round {rnd + 1} {PRODUCE[0]:22} {r['mb_s']:6.1f} MB/s"
            f" p99 {r['p99_ms']:.0f} ms  {r['cpu_s_per_gb']:.1f} CPU s/GB"
        )
        r = with_cpu(s, a.txn_records, idle, rdkafka_txn, s, topics["100/txn"], a.txn_records, a)
        runs[PRODUCE[1]].append(r)
        log(
            f"{s.name}: round {rnd + 1} {PRODUCE[1]:22} {r['mb_s']:6.1f} MB/s"
            f" p99 {r['p99_ms']:.1f} ms  {r['txn_s']:.0f} txn/s"
            f"  {r['cpu_s_per_gb']:.1f} CPU s/GB"
        )
        for which, topic in topics.items():
            order = ("rc", "ru") if rnd % 2 == 0 else ("ru", "rc")
            for iso in order:
                n = counts[which]
                r = with_cpu(s, n, idle, consumer_perf, s, topic, n, ISOLATION[iso], workdir, a)
                key = f"consume {iso} ({which})"
                runs[key].append(r)
                log(
                    f"{s.name}: round {rnd + 1} {key:22} {r['mb_s']:6.1f} MB/s"
                    f"  {r['cpu_s_per_gb']:.1f} CPU s/GB"
                )
    return {
        "median": {k: medians(v) for k, v in runs.items()},
        "rounds": runs,
        "idle_cpu_s_per_s": idle,
    }


# -- profile ---------------------------------------------------------------------------


def profile(a: argparse.Namespace, work: Path) -> str:
    """StraitMQ's broker under cProfile through a warm-up and one run of each produce."""
    out = work / "broker.prof"
    s = Strait(work, "process")
    s.interpreter_args = ["-m", "cProfile", "-o", str(out)]
    a.rounds = 1
    s.start()
    try:
        run = uuid.uuid4().hex[:6]
        create_topic(s, f"pp-{run}", {})
        create_topic(s, f"rd-{run}", {})
        r1 = producer_perf_txn(s, f"pp-{run}", a.records, a)
        r2 = rdkafka_txn(s, f"rd-{run}", a.txn_records, a)
    finally:
        s.stop()
    if not out.exists():
        raise PhaseError("the broker wrote no profile (did it exit cleanly?)")
    return (
        f"under cProfile: {PRODUCE[0]} {r1['mb_s']:.1f} MB/s, {PRODUCE[1]}"
        f" {r2['mb_s']:.1f} MB/s\n"
        + top_functions(out, a.profile_top)
        + "\nthe transactional parts, by cumulative time:\n"
        + top_functions(out, a.profile_top, r"transactions|producer_state|partition_txns")
    )


def top_functions(path: Path, n: int, only: str = "") -> str:
    """The `n` functions of a cProfile dump with the most own time (with `only`, of
    those whose file:line(name) matches that regular expression, by cumulative time)."""
    buf = io.StringIO()
    st = pstats.Stats(str(path), stream=buf)
    if only:
        st.sort_stats("cumulative").print_stats(only, n)
    else:
        st.sort_stats("tottime").print_stats(n)
    return buf.getvalue()


# -- report ----------------------------------------------------------------------------

GOAL_MB_S = 1.0  # at least Kafka's MB/s
GOAL_CPU = 0.5  # at no more than half its broker CPU per GB


def goal(strait: dict[str, float], kafka: dict[str, float]) -> dict[str, Any]:
    """StraitMQ/Kafka MB/s and CPU s/GB (as measured; net of idle too when both have it)
    of one phase, and whether issue 26's goal holds on the measured CPU."""
    mb = strait["mb_s"] / kafka["mb_s"]
    cpu = strait["cpu_s_per_gb"] / kafka["cpu_s_per_gb"]
    out = {"mb_s": mb, "cpu_s_per_gb": cpu, "met": mb >= GOAL_MB_S and cpu <= GOAL_CPU}
    if kafka.get("cpu_s_per_gb_net") and "cpu_s_per_gb_net" in strait:
        out["cpu_s_per_gb_net"] = strait["cpu_s_per_gb_net"] / kafka["cpu_s_per_gb_net"]
    return out


def table(results: dict[str, dict[str, Any]]) -> str:
    names = list(results)
    cols = [
        ("MB/s", "mb_s"),
        ("p99 ms", "p99_ms"),
        ("CPU s/GB", "cpu_s_per_gb"),
        ("net", "cpu_s_per_gb_net"),
    ]
    lines = [
        "| phase | " + " | ".join(f"{n} {c}" for n in names for c, _ in cols) + " |",
        "|---|" + "---:|" * (len(names) * len(cols)),
    ]
    for ph in PRODUCE + CONSUME:
        cells = []
        for n in names:
            m = results[n]["median"].get(ph, {})
            for _, k in cols:
                cells.append(_fmt(m[k]) if k in m else "-")
        lines.append(f"| {ph} | " + " | ".join(cells) + " |")
    idle = []
    for n in names:  # in the CPU column
        idle += ["", "", _fmt(results[n].get("idle_cpu_s_per_s", float("nan"))), ""]
    lines.append("| idle broker CPU s/s | " + " | ".join(idle) + " |")
    for n in names:
        base = "kafka-3" if n.endswith("-3") else "kafka"
        if n.startswith("kafka") or base not in results:
            continue
        lines += [
            "",
            f"| {n}/{base} | MB/s | CPU s/GB | net of idle | goal (MB/s >= 1, CPU <= 0.5) |",
            "|---|---:|---:|---:|---|",
        ]
        for ph in PRODUCE + CONSUME:
            try:
                g = goal(results[n]["median"][ph], results[base]["median"][ph])
            except (KeyError, ZeroDivisionError):
                continue
            verdict = "met" if g["met"] else "not met"
            net = f"{g['cpu_s_per_gb_net']:.2f}" if "cpu_s_per_gb_net" in g else "-"
            lines.append(
                f"| {ph} | {g['mb_s']:.2f} | {g['cpu_s_per_gb']:.2f} | {net} | {verdict} |"
            )
    return "\n".join(lines)


def _fmt(v: float) -> str:
    return f"{v:,.2f}" if v < 10 else f"{v:,.1f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default="kafka,straitmq")
    ap.add_argument("--records", type=int, default=200_000, help="ProducerPerformance run")
    ap.add_argument("--txn-records", type=int, default=100_000, help="100-per-txn run")
    ap.add_argument("--per-txn", type=int, default=100, help="records per transaction")
    ap.add_argument("--transaction-duration-ms", type=int, default=100)
    ap.add_argument("--warmup-records", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3, help="medians of this many runs")
    ap.add_argument(
        "--producer-prop",
        action="append",
        default=["batch.size=65536", "linger.ms=5"],
        help="ProducerPerformance producer property k=v (repeatable)",
    )
    ap.add_argument("--idle-seconds", type=float, default=3.0, help="idle CPU window")
    ap.add_argument("--phase-timeout", type=float, default=300)
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--json", default=None)
    ap.add_argument("--report", metavar="JSON", help="print the tables of an earlier run")
    ap.add_argument("--profile", action="store_true", help="cProfile StraitMQ's broker")
    ap.add_argument("--profile-top", type=int, default=30)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.report:
        print(table(json.loads(Path(a.report).read_text())["results"]))
        return 0
    work = Path(tempfile.mkdtemp(prefix="txn-bench-"))
    t0 = time.monotonic()
    if a.profile:
        try:
            print(profile(a, work))
        finally:
            if a.keep:
                log(f"work folder kept: {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)
        return 0
    results: dict[str, Any] = {}
    errors: list[str] = []
    for name in a.systems.split(","):
        d = work / name
        d.mkdir()
        s: Target
        if name.endswith("-3"):
            s = Cluster(name)
        else:
            s = Kafka(d) if name == "kafka" else Strait(d, "process")
        try:
            load0 = os.getloadavg()[0]
            results[name] = run_system(s, a, d)
            # the machine is shared: how busy it was says how far to trust MB/s
            results[name]["loadavg_1min"] = [load0, os.getloadavg()[0]]
        except Exception as e:
            errors.append(f"{name}: {e!r}")
            log(f"{name}: FAILED {e!r}")
        finally:
            s.stop()
            if not a.keep:
                shutil.rmtree(d, ignore_errors=True)
    if a.keep:
        log(f"work folder kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    log(f"total {time.monotonic() - t0:.0f}s")
    if errors:
        print("\nerrors:\n  " + "\n  ".join(errors))
    path = (
        Path(a.json)
        if a.json
        else REPO_ROOT
        / ".cache"
        / "bench"
        / f"transactions-{_dt.datetime.now():%Y%m%d-%H%M%S}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"args": vars(a), "results": results, "errors": errors}, indent=1))
    log(f"results written to {path}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
