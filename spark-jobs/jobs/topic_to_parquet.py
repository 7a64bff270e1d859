"""Copy a topic to Parquet, through either Spark source: the same job, the same output.

    python spark-jobs/jobs/topic_to_parquet.py --bootstrap 127.0.0.1:9092 --topic orders \\
        --out /tmp/orders.parquet [--source straitmq|kafka] \\
        [--stream --checkpoint /tmp/orders.ckpt [--max-records 10000]] \\
        [--command-config client.properties]

--source straitmq   the pure-Python data source (straitmq.spark): no jar needed
--source kafka      Spark's own Kafka source (spark-sql-kafka-0-10), unchanged, pointed at
                    StraitMQ: StraitMQ speaks the Kafka protocol
Batch by default (all records now); --stream runs a streaming query that processes what is
there (Trigger.AvailableNow) and stops; run it again to pick up from its checkpoint.
Output columns: key, value (strings), topic, partition, offset, timestamp.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import client_options, run_main, spark_session

COLUMNS = [
    "CAST(key AS STRING) AS key",
    "CAST(value AS STRING) AS value",
    "topic",
    "partition",
    "offset",
    "timestamp",
]


def reader(spark: Any, source: str, bootstrap: str, topic: str, stream: bool, **opts: str) -> Any:
    """spark.read / spark.readStream for `source` ('straitmq' or 'kafka'), same options."""
    r = (spark.readStream if stream else spark.read).format(source)
    r = r.option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
    r = r.option("startingOffsets", opts.pop("startingOffsets", "earliest"))
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def run(
    spark: Any,
    *,
    source: str,
    bootstrap: str,
    topic: str,
    out: str,
    stream: bool = False,
    checkpoint: str | None = None,
    max_records: int | None = None,
    client: dict[str, str] | None = None,
) -> Any:
    """Batch: write and return None. Stream: run until caught up, return the finished query.
    `client`: `kafka.*` options (security settings) for either source."""
    opts = dict(client or {})
    if max_records:
        opts["maxOffsetsPerTrigger" if source == "kafka" else "maxRecordsPerTrigger"] = str(
            max_records
        )
    df = reader(spark, source, bootstrap, topic, stream, **opts).selectExpr(*COLUMNS)
    if not stream:
        df.write.mode("overwrite").parquet(out)
        return None
    if not checkpoint:
        raise SystemExit("--stream needs --checkpoint")
    query = (
        df.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--source", choices=["straitmq", "kafka"], default="straitmq")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--checkpoint")
    ap.add_argument("--max-records", type=int)
    ap.add_argument(
        "--command-config",
        help="Kafka client properties file (security settings), as Kafka's tools take",
    )
    a = ap.parse_args(argv)
    spark = spark_session("topic-to-parquet", with_kafka_jars=a.source == "kafka")
    run(
        spark,
        source=a.source,
        bootstrap=a.bootstrap,
        topic=a.topic,
        out=a.out,
        stream=a.stream,
        checkpoint=a.checkpoint,
        max_records=a.max_records,
        client=client_options(a.command_config),
    )
    n = spark.read.parquet(a.out).count()
    print(f"{n} records in {a.out}")
    return 0


if __name__ == "__main__":
    run_main(main)
