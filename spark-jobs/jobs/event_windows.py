"""The pipeline: events from a topic, counted and summed per kind in one-minute event-time
windows with a watermark, written to Parquet and to a result topic.

    python spark-jobs/jobs/event_windows.py --bootstrap 127.0.0.1:9092 \\
        --events events --results event-windows --out /tmp/windows.parquet \\
        --checkpoint /tmp/windows.ckpt [--source straitmq|kafka] [--continuous]

Events are JSON values: {"event_id": 1, "user": "u7", "kind": "click", "amount": 2.5,
"ts": <epoch ms of the event>}. A window is final, and written once (append mode), when
the watermark (latest event time seen - --watermark) passes its end; events later than
that are dropped, as Spark's watermark semantics say.

Parquet rows: window_start, window_end (timestamps), kind, events (count), amount (sum).
Result topic: key "<kind>@<window_start ISO>", value the same row as JSON.
Without --continuous the query processes what is there (Trigger.AvailableNow) and stops;
run it again and it goes on from its checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import client_options, run_main, spark_session

EVENT_SCHEMA = "event_id LONG, user STRING, kind STRING, amount DOUBLE, ts LONG"


def windows(events: Any, *, window: str = "1 minute", watermark: str = "30 seconds") -> Any:
    """The aggregation, on a DataFrame with the Kafka columns (value = event JSON)."""
    from pyspark.sql import functions as F

    parsed = events.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
    timed = parsed.select("e.*", F.timestamp_millis(F.col("e.ts")).alias("event_time")).where(
        F.col("kind").isNotNull() & F.col("ts").isNotNull()
    )
    agg = (
        timed.withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window), "kind")
        .agg(F.count("*").alias("events"), F.sum("amount").alias("amount"))
    )
    return agg.select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "kind",
        "events",
        "amount",
    )


def run(
    spark: Any,
    *,
    source: str,
    bootstrap: str,
    events_topic: str,
    results_topic: str | None,
    out: str,
    checkpoint: str,
    continuous: bool = False,
    client: dict[str, str] | None = None,
) -> list[Any]:
    """Start the Parquet query (and the result-topic query); wait for them unless continuous.
    `client`: `kafka.*` options (security settings) for the source and the sink."""
    from pyspark.sql import functions as F

    client = client or {}
    events = (
        spark.readStream.format(source)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", events_topic)
        .option("startingOffsets", "earliest")
        .options(**client)
        .load()
    )
    agg = windows(events)

    def trigger(w: Any) -> Any:
        return w.trigger(processingTime="2 seconds") if continuous else w.trigger(availableNow=True)

    queries = [
        trigger(
            agg.writeStream.format("parquet")
            .outputMode("append")
            .option("path", out)
            .option("checkpointLocation", os.path.join(checkpoint, "parquet"))
        ).start()
    ]
    if results_topic:
        as_record = agg.select(
            F.concat_ws(
                "@", "kind", F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss'Z'")
            ).alias("key"),
            F.to_json(F.struct("window_start", "window_end", "kind", "events", "amount")).alias(
                "value"
            ),
        )
        # Spark's Kafka sink when its jar is there, else the straitmq data source's writer.
        queries.append(
            trigger(
                as_record.writeStream.format(source)
                .outputMode("append")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("topic", results_topic)
                .options(**client)
                .option("checkpointLocation", os.path.join(checkpoint, "topic"))
            ).start()
        )
    if not continuous:
        for q in queries:
            q.awaitTermination()
    return queries


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--events", required=True, help="topic of event JSON records")
    ap.add_argument("--results", help="topic for the window results (optional)")
    ap.add_argument("--out", required=True, help="Parquet folder")
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--source", choices=["straitmq", "kafka"], default="straitmq")
    ap.add_argument("--continuous", action="store_true", help="run until stopped")
    ap.add_argument(
        "--command-config",
        help="Kafka client properties file (security settings), as Kafka's tools take",
    )
    a = ap.parse_args(argv)
    spark = spark_session("event-windows", with_kafka_jars=a.source == "kafka")
    queries = run(
        spark,
        source=a.source,
        bootstrap=a.bootstrap,
        events_topic=a.events,
        results_topic=a.results,
        out=a.out,
        checkpoint=a.checkpoint,
        continuous=a.continuous,
        client=client_options(a.command_config),
    )
    if a.continuous:
        spark.streams.awaitAnyTermination()
    for q in queries:
        if q.exception() is not None:
            raise q.exception()
    print(f"{spark.read.parquet(a.out).count()} final windows in {a.out}")
    return 0


if __name__ == "__main__":
    run_main(main)
