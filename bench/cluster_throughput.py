"""Producer throughput of a replicated cluster, acks=1 vs acks=all: StraitMQ (3 controllers +
3 brokers, LocalCluster) beside Apache Kafka 4.4 (3 KRaft controllers + 3 brokers,
bench/kafka_ref.py KafkaCluster), both running at the same time (not a pytest test).

Every measurement writes to a new topic with replication factor 3, min.insync.replicas 2 and
``--partitions`` partitions (default 3: one leader per broker), which is deleted afterwards:

  rdkafka   librdkafka (confluent_kafka) producer, 400,000 x 1 KiB as fast as it goes
            (linger 5 ms)
  java      Kafka's org.apache.kafka.tools.ProducerPerformance, 100,000 x 1 KiB
            (--throughput -1, 3.9 client defaults: 16 KiB batches, linger 0), as
            bench/throughput.py runs it

each with acks=1 and acks=all. Rounds alternate the targets (and the acks order) and the
table shows per-metric medians; each target first gets an unreported warm-up run. Both
clusters use each system's default timeouts (no failover tuning here) and no automatic
preferred-leader rebalancing.

  python -m bench.cluster_throughput [--with-kafka] [--rounds 3] [--num-records 100000]

Besides the producer's own MB/s (acknowledged), each measurement waits until the topic's high
watermarks cover every record, i.e. every in-sync replica has it and consumers can read it:
``replicated_mb_s`` is MB/s up to that point (with acks=1 the followers may still be far
behind when the producer is done), ``broker_cpu_s_per_gb`` the brokers' CPU seconds (user +
system, all broker processes, replication included) per GB written.

Output: a table (median per target, StraitMQ/Kafka ratio) and a JSON dump (default
.cache/bench/cluster-throughput-<timestamp>.json).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # allow `python bench/cluster_throughput.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka.admin import AdminClient, NewTopic

from bench.failover import KafkaTarget, StraitTarget, log
from bench.javatools import REPO_ROOT
from bench.throughput import process_cpu_s, producer_perf, rdkafka_produce


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    a = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    nt = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=3,
        config={"min.insync.replicas": "2"},
    )
    a.create_topics([nt], operation_timeout=30, request_timeout=30)[topic].result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # every partition led, full ISR, on every broker
        ok = True
        for b in bootstrap.split(","):
            try:
                md = AdminClient({"bootstrap.servers": b, "log_level": 2}).list_topics(
                    topic, timeout=5
                )
                ps = md.topics[topic].partitions
                ok = (
                    ok
                    and len(ps) == partitions
                    and all(p.leader >= 0 and len(p.isrs) == 3 for p in ps.values())
                )
            except Exception:
                ok = False
        if ok:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{topic} not fully replicated after 60 s")


def delete_topic(bootstrap: str, topic: str) -> None:
    try:
        a = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
        a.delete_topics([topic], operation_timeout=30)[topic].result(60)
    except Exception as e:  # best effort
        log(f"  delete {topic}: {e}")


def wait_replicated(bootstrap: str, topic: str, partitions: int, n: int, within_s: float) -> float:
    """Seconds until the topic's high watermarks add up to `n`: until every in-sync replica
    has every acknowledged record and a consumer can read them all. With acks=1 the leader
    answers first and its followers may still be far behind when the producer is done."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    a = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    want = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
    t0 = time.monotonic()
    while time.monotonic() - t0 < within_s:
        got = a.list_offsets(want, request_timeout=10)
        if sum(f.result(15).offset for f in got.values()) >= n:
            return time.monotonic() - t0
        time.sleep(0.02)
    raise TimeoutError(f"{topic}: high watermarks short of {n} after {within_s:.0f}s")


def broker_cpu_s(target: Any) -> float:
    """CPU seconds (user + system) the target's broker processes have used so far."""
    return sum(
        process_cpu_s(node.proc.pid)
        for node in target.cluster.brokers.values()
        if node.proc is not None and node.proc.poll() is None
    )


def measure(target, client: str, acks: str, a: argparse.Namespace, n: int) -> dict[str, float]:
    topic = f"ct-{client}-{acks}-{uuid.uuid4().hex[:6]}"
    create_topic(target.bootstrap, topic, a.partitions)
    ns = argparse.Namespace(
        num_records=n,
        record_size=a.record_size,
        phase_timeout=a.phase_timeout,
        rdkafka_acks=acks,
        rdkafka_linger_ms=a.linger_ms,
        producer_prop=[],
    )
    try:
        cpu0 = broker_cpu_s(target)
        if client == "rdkafka":
            res = rdkafka_produce(target.bootstrap, topic, ns)
        else:
            res = producer_perf(target.bootstrap, topic, ns, acks)
        res["replicated_wait_s"] = wait_replicated(
            target.bootstrap, topic, a.partitions, n, a.phase_timeout
        )
        # Brokers' CPU for the whole write, replication included, per GB written.
        res["broker_cpu_s_per_gb"] = (broker_cpu_s(target) - cpu0) / (n * a.record_size / 1e9)
        if "seconds" in res:  # MB/s until the last record is on every in-sync replica
            res["replicated_mb_s"] = (
                res["mb_s"] * res["seconds"] / (res["seconds"] + res["replicated_wait_s"])
            )
        return res
    finally:
        delete_topic(target.bootstrap, topic)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--with-kafka", action="store_true", help="also run Apache Kafka 4.4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-records", type=int, default=100_000, help="Java producer records")
    ap.add_argument(
        "--rdkafka-records",
        type=int,
        default=400_000,
        help="librdkafka producer records (more: it is ~10x faster than the Java tool)",
    )
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--linger-ms", type=float, default=5, help="librdkafka linger.ms")
    ap.add_argument("--clients", default="rdkafka,java", help="comma list: rdkafka,java")
    ap.add_argument("--warmup-records", type=int, default=20_000)
    ap.add_argument("--phase-timeout", type=float, default=300)
    ap.add_argument("--json", default=None)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    clients = [c for c in a.clients.split(",") if c]
    targets: list[Any] = [StraitTarget(fast_failover=False)]
    if a.with_kafka:
        targets.insert(0, KafkaTarget(fast_failover=False))
    raw: dict[str, dict[str, list[float]]] = {t.name: {} for t in targets}
    errors: list[str] = []
    started: list[Any] = []
    try:
        for t in targets:
            t0 = time.monotonic()
            log(f"{t.name}: starting the cluster")
            started.append(t)
            t.start()
            log(f"{t.name}: ready in {time.monotonic() - t0:.1f}s at {t.bootstrap}")
        for t in targets:
            if a.warmup_records:
                log(f"{t.name}: warm-up")
                for c in clients:
                    measure(t, c, "all", a, a.warmup_records)
        for r in range(a.rounds):
            order = targets if r % 2 == 0 else targets[::-1]
            acks_order = ["1", "all"] if r % 2 == 0 else ["all", "1"]
            for t in order:
                for c in clients:
                    for acks in acks_order:
                        key = f"{c}_acks{acks}"
                        try:
                            n = a.rdkafka_records if c == "rdkafka" else a.num_records
                            res = measure(t, c, acks, a, n)
                        except Exception as e:
                            errors.append(f"{t.name} {key} round {r + 1}: {e}")
                            log(f"  {t.name} {key}: FAILED {e}")
                            continue
                        for m in (
                            "mb_s",
                            "rec_s",
                            "avg_lat_ms",
                            "p99_ms",
                            "replicated_mb_s",
                            "replicated_wait_s",
                            "broker_cpu_s_per_gb",
                        ):
                            if m in res:
                                raw[t.name].setdefault(f"{key}_{m}", []).append(res[m])
                        lat = f", avg {res['avg_lat_ms']:.1f} ms" if "avg_lat_ms" in res else ""
                        log(f"  round {r + 1} {t.name} {key}: {res['mb_s']:.1f} MB/s{lat}")
    finally:
        for t in started:
            t.stop()
    med = {t: {k: statistics.median(v) for k, v in d.items()} for t, d in raw.items()}
    names = [t.name for t in targets]
    keys = sorted({k for d in med.values() for k in d})
    print()
    print("| metric | " + " | ".join(names) + (" | straitmq/kafka |" if len(names) > 1 else " |"))
    print("|---|" + "---:|" * (len(names) + (1 if len(names) > 1 else 0)))
    for k in keys:
        vals = [med[n].get(k) for n in names]
        cells = [f"{v:,.1f}" if v is not None else "-" for v in vals]
        ratio = ""
        if len(names) > 1 and all(vals):
            ratio = f" {med['straitmq'][k] / med['kafka'][k]:.2f} |"
        print(f"| {k} | " + " | ".join(cells) + " |" + ratio)
    for t in names:  # the cost of acks=all relative to acks=1 on the same system
        for c in clients:
            one = med[t].get(f"{c}_acks1_mb_s")
            allv = med[t].get(f"{c}_acksall_mb_s")
            if one and allv:
                print(f"{t} {c}: acks=all / acks=1 throughput = {allv / one:.2f}")
            one = med[t].get(f"{c}_acks1_replicated_mb_s")
            allv = med[t].get(f"{c}_acksall_replicated_mb_s")
            if one and allv:
                print(f"{t} {c}: acks=all / acks=1 until replicated = {allv / one:.2f}")
    if errors:
        print("\nerrors:\n  " + "\n  ".join(errors))
    path = (
        Path(a.json)
        if a.json
        else (
            REPO_ROOT
            / ".cache"
            / "bench"
            / f"cluster-throughput-{_dt.datetime.now():%Y%m%d-%H%M%S}.json"
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"args": vars(a), "raw": raw, "median": med, "errors": errors}))
    log(f"results written to {path}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
