"""Spark read throughput from StraitMQ and from Apache Kafka, side by side (not a pytest test).

Cases, all in one local-mode Spark (local[2] by default) and one run:

  straitmq / straitmq-source   the pure-Python `straitmq` data source (straitmq.spark)
  straitmq / kafka-source      Spark's own Kafka source (spark-sql-kafka-0-10), unchanged
  kafka    / kafka-source      Spark's Kafka source reading Apache Kafka 4.4 (the reference)
  kafka    / straitmq-source   the Python data source reading Apache Kafka

Each case is a batch read of the whole topic (N records of --record-size bytes over
--partitions partitions) forced by `count(*), sum(length(value))`, so every record's value
is materialised; the cases alternate over --repeat rounds after one warm-up round, and the
table shows the median records/s and MB/s with the ratio to kafka / kafka-source.

    python -m bench.spark_read                       # 200,000 x 512 B, 4 partitions, 3 rounds
    python -m bench.spark_read --num-records 1000000 --record-size 1024 --repeat 5
    python -m bench.spark_read --strait 127.0.0.1:9092 --kafka 127.0.0.1:19092  # running ones

Brokers: a StraitMQ broker process and an Apache Kafka (bench.kafka_ref.KafkaRef, from the
Maven jars) are started on free loopback ports unless given. JSON: --json PATH (default
.cache/bench/spark-read-<timestamp>.json).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # allow `python bench/spark_read.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.javatools import REPO_ROOT
from bench.kafka_ref import KafkaRef
from bench.strait_ref import StraitRef

sys.path.insert(0, str(REPO_ROOT / "spark-jobs" / "jobs"))

CASES = [
    ("straitmq", "straitmq"),
    ("straitmq", "kafka"),
    ("kafka", "kafka"),
    ("kafka", "straitmq"),
]
BASELINE = ("kafka", "kafka")


def log(msg: str) -> None:
    print(f"[spark_read] {msg}", file=sys.stderr, flush=True)


def create_and_fill(bootstrap: str, topic: str, a: argparse.Namespace) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(topic, a.partitions, 1)])[topic]
    fut.result(30)
    time.sleep(0.5)
    p = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1 << 20,
            "compression.type": "none",
            "queue.buffering.max.kbytes": 1 << 20,
        }
    )
    payload = os.urandom(a.record_size)
    t0 = time.monotonic()
    for i in range(a.num_records):
        while True:
            try:
                p.produce(topic, value=payload, key=str(i).encode(), partition=i % a.partitions)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(120) == 0, "produce did not finish"
    log(f"{bootstrap}: {a.num_records} records in {time.monotonic() - t0:.1f} s")


def read_once(spark: Any, source: str, bootstrap: str, topic: str) -> tuple[float, int, int]:
    from pyspark.sql import functions as F

    df = (
        spark.read.format(source)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    t0 = time.perf_counter()
    row = df.agg(F.count("*").alias("n"), F.sum(F.length("value")).alias("b")).collect()[0]
    return time.perf_counter() - t0, int(row["n"]), int(row["b"] or 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Spark read throughput, StraitMQ vs Apache Kafka")
    ap.add_argument("--num-records", type=int, default=200_000)
    ap.add_argument("--record-size", type=int, default=512)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--strait", help="bootstrap of a running StraitMQ (default: start one)")
    ap.add_argument("--kafka", help="bootstrap of a running Apache Kafka (default: start one)")
    ap.add_argument("--json", help="where to write the results")
    a = ap.parse_args(argv)

    from common import spark_session

    started: list[Any] = []
    try:
        strait = a.strait
        if not strait:
            b = StraitRef()  # data in a temp folder, removed on stop
            b.start()
            started.append(b)
            strait = b.bootstrap
        kafka = a.kafka
        if not kafka:
            k = KafkaRef()
            k.start()
            started.append(k)
            kafka = k.bootstrap
        targets = {"straitmq": strait, "kafka": kafka}
        topic = f"spark-read-{int(time.time())}"
        for name, bootstrap in targets.items():
            log(f"filling {name} ({bootstrap}) ...")
            create_and_fill(bootstrap, topic, a)

        spark = spark_session("bench-spark-read", with_kafka_jars=True, master=a.master)
        times: dict[tuple[str, str], list[float]] = {c: [] for c in CASES}
        for rnd in range(a.repeat + 1):
            for target, source in CASES:
                dt, n, nbytes = read_once(spark, source, targets[target], topic)
                if n != a.num_records or nbytes != a.num_records * a.record_size:
                    raise RuntimeError(f"{target}/{source}: read {n} records, {nbytes} bytes")
                label = "warm-up" if rnd == 0 else f"round {rnd}"
                log(f"{label}: {target}/{source}-source {dt:.2f} s")
                if rnd:
                    times[(target, source)].append(dt)
        spark.stop()
    finally:
        for s in reversed(started):
            s.stop()

    mb = a.num_records * a.record_size / 1e6
    base = statistics.median(times[BASELINE])
    rows = []
    for case in CASES:
        med = statistics.median(times[case])
        rows.append(
            {
                "broker": case[0],
                "source": f"{case[1]}-source",
                "median_s": round(med, 3),
                "records_per_s": round(a.num_records / med),
                "mb_per_s": round(mb / med, 1),
                "ratio_to_kafka_kafka_source": round(base / med, 2),
                "runs_s": times[case],
            }
        )
    print(
        f"\nSpark {a.master} batch read of {a.num_records:,} x {a.record_size} B, "
        f"{a.partitions} partitions, median of {a.repeat}\n"
    )
    print("| broker | Spark source | records/s | MB/s | vs Kafka + kafka source |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['broker']} | {r['source']} | {r['records_per_s']:,} | {r['mb_per_s']} | "
            f"{r['ratio_to_kafka_kafka_source']:.2f} |"
        )
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(a.json or REPO_ROOT / ".cache" / "bench" / f"spark-read-{stamp}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"args": vars(a), "results": rows}, indent=2))
    log(f"results in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
