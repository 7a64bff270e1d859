"""The pipeline job (spark-jobs/jobs/event_windows.py) in local-mode Spark against a real broker:
its Parquet output and result topic match an independent computation on the produced events,
through the `straitmq` data source and through Spark's own Kafka source alike."""

from __future__ import annotations

import json
import random
import sys
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyspark  # noqa: F401  (pinned in pyproject.toml: missing, the tests fail, not skip)
import pytest
from conftest import ROOT, BrokerProcess

sys.path.insert(0, str(ROOT / "spark-jobs" / "jobs"))

import event_windows
from common import spark_session

WINDOW_MS = 60_000
WATERMARK_MS = 30_000
KINDS = ("view", "click", "buy")
BASE_MS = 1_700_000_000_000 - 1_700_000_000_000 % WINDOW_MS


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("spark-pipeline") / "data").start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def spark() -> Any:
    return spark_session(
        "straitmq-tests", with_kafka_jars=True, spark__sql__shuffle__partitions="2"
    )


@pytest.fixture(scope="module")
def events(broker: BrokerProcess) -> list[dict]:
    """2000 events over ~6 minutes of event time, out of order, on 3 partitions."""
    from confluent_kafka import Producer

    broker.create_topic("events", 3)
    rng = random.Random(7)
    evs = [
        {
            "event_id": i,
            "user": f"u{rng.randrange(50)}",
            "kind": rng.choice(KINDS),
            "amount": round(rng.uniform(0, 100), 2),
            "ts": BASE_MS + rng.randrange(6 * WINDOW_MS),
        }
        for i in range(2000)
    ]
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for e in evs:
        p.produce("events", key=e["user"].encode(), value=json.dumps(e).encode())
    p.produce("events", value=b"not json")  # ignored by the job
    assert p.flush(30) == 0
    return evs


def expected_final_windows(evs: list[dict]) -> dict[tuple[int, str], tuple[int, float]]:
    """Independent of Spark: tumbling windows per kind, keeping those the watermark (max event
    time - 30 s) has closed, i.e. those append mode has written."""
    watermark = max(e["ts"] for e in evs) - WATERMARK_MS
    acc: dict[tuple[int, str], list] = defaultdict(lambda: [0, 0.0])
    for e in evs:
        start = e["ts"] - e["ts"] % WINDOW_MS
        acc[(start, e["kind"])][0] += 1
        acc[(start, e["kind"])][1] += e["amount"]
    return {k: (n, s) for k, (n, s) in acc.items() if k[0] + WINDOW_MS <= watermark}


def ms(dt: datetime) -> int:
    return (
        int(dt.replace(tzinfo=UTC).timestamp() * 1000)
        if dt.tzinfo is None
        else int(dt.timestamp() * 1000)
    )


def run_pipeline(spark: Any, broker: BrokerProcess, source: str, tmp: Path) -> tuple[dict, str]:
    out, results = str(tmp / f"{source}-windows"), f"windows-{source}"
    broker.create_topic(results, 1)
    # Run twice (like a scheduled job): the second run goes on from the checkpoint; it reads
    # no new event but lets the watermark close the last windows it had not yet written.
    for _ in range(2):
        queries = event_windows.run(
            spark,
            source=source,
            bootstrap=broker.bootstrap,
            events_topic="events",
            results_topic=results,
            out=out,
            checkpoint=str(tmp / f"{source}-ckpt"),
        )
        assert all(q.exception() is None for q in queries)
    got = {}
    for r in spark.read.parquet(out).collect():
        key = (ms(r["window_start"]), r["kind"])
        assert key not in got, f"window {key} written twice"
        assert ms(r["window_end"]) - key[0] == WINDOW_MS
        got[key] = (r["events"], r["amount"])
    return got, results


def read_topic(bootstrap: str, topic: str) -> dict[str, dict]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "check",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    out = {}
    while True:
        m = c.poll(10)
        assert m is not None, "timed out reading the result topic"
        if m.error():
            break
        out[m.key().decode()] = json.loads(m.value())
    c.close()
    return out


@pytest.mark.parametrize("source", ["straitmq", "kafka"])
def test_pipeline_output_matches_independent_computation(
    spark: Any, broker: BrokerProcess, events: list[dict], tmp_path: Path, source: str
) -> None:
    want = expected_final_windows(events)
    assert len(want) >= 12  # 4+ closed minutes x 3 kinds: the check has something to check
    got, results = run_pipeline(spark, broker, source, tmp_path)
    assert got.keys() == want.keys()
    for k, (n, total) in want.items():
        assert got[k][0] == n, k
        assert got[k][1] == pytest.approx(total), k

    # The result topic holds the same windows, one record each.
    records = read_topic(broker.bootstrap, results)
    assert len(records) == len(want)
    for (start, kind), (n, total) in want.items():
        iso = datetime.fromtimestamp(start / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        rec = records[f"{kind}@{iso}"]
        assert (rec["kind"], rec["events"]) == (kind, n)
        assert rec["amount"] == pytest.approx(total)
