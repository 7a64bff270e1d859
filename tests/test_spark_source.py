"""The `straitmq` Spark data source and Spark's own Kafka source, in local-mode Spark against a
real broker: exact records, offsets, restart from a checkpoint, and errors a user can read."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark  # noqa: F401  (pinned in pyproject.toml: missing, the tests fail, not skip)
import pytest
from conftest import ROOT, BrokerProcess, free_port

sys.path.insert(0, str(ROOT / "spark-jobs" / "jobs"))

import topic_to_parquet
from common import spark_session
from straitmq.spark import StraitMQSparkError, user_message
from straitmq.spark.options import SourceOptions, rate_limit

PARTITIONS = 4
RECORDS = 3000

# ---- no Spark needed ------------------------------------------------------------------------


def test_rate_limit_shares_in_proportion_and_always_progresses() -> None:
    a, b, c = ("t", 0), ("t", 1), ("t", 2)
    start = {a: 0, b: 100, c: 5}
    latest = {a: 300, b: 200, c: 5}  # 300 + 100 + 0 waiting
    end = rate_limit(start, latest, 100)
    assert end == {a: 75, b: 125, c: 5}
    assert sum(end[tp] - start[tp] for tp in start) == 100
    # Less waiting than the limit: everything.
    assert rate_limit(start, latest, 1000) == latest
    # A tiny limit still moves forward.
    one = rate_limit(start, latest, 1)
    assert sum(one[tp] - start[tp] for tp in start) == 1


def test_options_parse_and_refuse_with_clear_messages() -> None:
    o = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": "h:1",
            "subscribe": "a, b",
            "startingOffsets": '{"a": {"0": 5, "1": -2}}',
            "maxOffsetsPerTrigger": "10",
            "kafka.security.protocol": "PLAINTEXT",
        },
        streaming=True,
    )
    assert o.topics == ("a", "b")
    assert o.starting == {"a": {"0": 5, "1": -2}}
    assert o.max_records_per_trigger == 10
    assert o.client_config == {"security.protocol": "PLAINTEXT"}
    bad = [
        ({"subscribe": "a"}, "bootstrap servers not set"),
        ({"kafka.bootstrap.servers": "h:1"}, "no StraitMQ topic to read"),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "a", "startingOffsets": "{x"}, "JSON"),
        (
            {"kafka.bootstrap.servers": "h:1", "subscribe": "a", "maxRecordsPerTrigger": "0"},
            "positive integer",
        ),
        ({"kafka.bootstrap.servers": "h:1", "subscribe": "a", "kafka.group.id": "g"}, "group.id"),
    ]
    for options, words in bad:
        with pytest.raises(StraitMQSparkError, match=words):
            SourceOptions.parse(options, streaming=False)


# ---- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(tmp_path_factory.mktemp("spark-broker") / "data").start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def spark() -> Any:
    # One session for every Spark test module in this process (getOrCreate), with Spark's
    # Kafka source on the classpath; never stopped here (the JVM ends with pytest).
    return spark_session(
        "straitmq-tests", with_kafka_jars=True, spark__sql__shuffle__partitions="2"
    )


def produce(
    bootstrap: str, topic: str, n: int, partitions: int, tag: str = "r"
) -> dict[tuple[int, int], tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """n records spread over every partition; returns {(partition, offset): (key, value,
    headers)} as the broker acknowledged them."""
    from confluent_kafka import Producer

    acked: dict[tuple[int, int], tuple[bytes, bytes, list[tuple[str, bytes]]]] = {}
    errors: list[str] = []
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in range(n):
        key = f"k{i % 17}".encode()
        value = f"{tag}-{i}-{'x' * (i % 50)}".encode()
        headers = [("n", str(i).encode()), ("tag", tag.encode())]

        def cb(err: Any, msg: Any, kv: Any = (key, value, headers)) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                acked[(msg.partition(), msg.offset())] = kv

        p.produce(
            topic, key=key, value=value, headers=headers, partition=i % partitions, on_delivery=cb
        )
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    assert not errors
    assert len(acked) == n
    return acked


@pytest.fixture(scope="module")
def topic(broker: BrokerProcess) -> tuple[str, dict]:
    name = "spark-src"
    broker.create_topic(name, PARTITIONS)
    return name, produce(broker.bootstrap, name, RECORDS, PARTITIONS)


def rows_by_position(rows: list[Any]) -> dict[tuple[int, int], Any]:
    out = {(r["partition"], r["offset"]): r for r in rows}
    assert len(out) == len(rows), "a (partition, offset) appears twice"
    return out


# ---- batch ------------------------------------------------------------------------------------


def test_batch_reads_exactly_the_produced_records(
    spark: Any, broker: BrokerProcess, topic: tuple[str, dict]
) -> None:
    name, acked = topic
    df = (
        spark.read.format("straitmq")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", name)
        .option("includeHeaders", "true")
        .load()
    )
    assert df.rdd.getNumPartitions() == PARTITIONS  # one Spark partition per topic partition
    assert [f.name for f in df.schema.fields] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    got = rows_by_position(df.collect())
    assert got.keys() == acked.keys()
    now = time.time()
    for pos, (key, value, headers) in acked.items():
        r = got[pos]
        assert (bytes(r["key"]), bytes(r["value"]), r["topic"]) == (key, value, name)
        assert [(h["key"], bytes(h["value"])) for h in r["headers"]] == headers
        assert r["timestampType"] == 0  # CreateTime
        assert abs(r["timestamp"].timestamp() - now) < 600


def test_batch_offset_ranges(spark: Any, broker: BrokerProcess, topic: tuple[str, dict]) -> None:
    name, acked = topic
    df = (
        spark.read.format("straitmq")
        .option("kafka.bootstrap.servers", broker.bootstrap)
        .option("subscribe", name)
        .option("startingOffsets", f'{{"{name}": {{"0": 100, "2": -2}}}}')
        .option("endingOffsets", f'{{"{name}": {{"0": 250, "1": 10}}}}')
        .load()
    )
    got = {(r["partition"], r["offset"]) for r in df.select("partition", "offset").collect()}
    ends = {p: 1 + max(o for q, o in acked if q == p) for p in range(PARTITIONS)}
    want = {(0, o) for o in range(100, 250)} | {(1, o) for o in range(10)}
    want |= {(2, o) for o in range(ends[2])} | {(3, o) for o in range(ends[3])}
    assert got == want


def test_spark_kafka_source_gives_the_same_result(
    spark: Any, broker: BrokerProcess, topic: tuple[str, dict], tmp_path: Path
) -> None:
    name, acked = topic
    outs = {}
    for source in ("straitmq", "kafka"):
        out = str(tmp_path / source)
        topic_to_parquet.run(spark, source=source, bootstrap=broker.bootstrap, topic=name, out=out)
        outs[source] = sorted(tuple(r) for r in spark.read.parquet(out).collect())
    assert len(outs["straitmq"]) == RECORDS
    assert outs["straitmq"] == outs["kafka"]
    assert {(r[3], r[4]) for r in outs["kafka"]} == acked.keys()


def test_read_committed_reads_only_committed_transactions(
    spark: Any, broker: BrokerProcess
) -> None:
    """`kafka.isolation.level=read_committed`, with the straitmq source and with Spark's
    own Kafka source: the records of committed transactions, never an aborted one's;
    read_uncommitted gets both."""
    from confluent_kafka import Producer

    name = f"spark-txn-{uuid.uuid4().hex[:6]}"
    broker.create_topic(name, 2)
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": name})
    p.init_transactions(30)
    for batch in range(6):
        p.begin_transaction()
        for i in range(50):
            p.produce(name, key=b"%d" % i, value=f"{batch}-{i}".encode(), partition=i % 2)
        if batch % 3 == 2:
            assert p.flush(30) == 0  # sent, then aborted (librdkafka drops unsent ones)
            p.abort_transaction(30)
        else:
            p.commit_transaction(30)
    committed = sorted(f"{b}-{i}" for b in range(6) if b % 3 != 2 for i in range(50))

    def values(source: str, isolation: str) -> list[str]:
        df = (
            spark.read.format(source)
            .option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", name)
            .option("kafka.isolation.level", isolation)
            .load()
        )
        return sorted(bytes(r["value"]).decode() for r in df.select("value").collect())

    for source in ("straitmq", "kafka"):
        assert values(source, "read_committed") == committed, source
    assert len(values("straitmq", "read_uncommitted")) == 300


# ---- streaming --------------------------------------------------------------------------------


def test_stream_stopped_and_restarted_reads_each_record_once(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    name = f"spark-stream-{uuid.uuid4().hex[:6]}"
    broker.create_topic(name, 3)
    first = produce(broker.bootstrap, name, 1500, 3, tag="a")
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    df = topic_to_parquet.reader(
        spark, "straitmq", broker.bootstrap, name, True, maxRecordsPerTrigger="200"
    ).selectExpr(*topic_to_parquet.COLUMNS)

    # 1. A continuous query, stopped after a few micro-batches: part of the data is read.
    q = (
        df.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", ckpt)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    deadline = time.monotonic() + 60
    while len([p for p in q.recentProgress if p["numInputRows"] > 0]) < 2:
        assert time.monotonic() < deadline, q.exception() or q.recentProgress
        time.sleep(0.2)
    q.stop()
    sizes = [p["numInputRows"] for p in q.recentProgress]
    assert max(sizes) <= 200  # maxRecordsPerTrigger honoured
    part_one = spark.read.parquet(out).count()
    assert 0 < part_one < 1500

    # 2. More records arrive; the same query restarts from its checkpoint and catches up.
    second = produce(broker.bootstrap, name, 600, 3, tag="b")
    q2 = topic_to_parquet.run(
        spark,
        source="straitmq",
        bootstrap=broker.bootstrap,
        topic=name,
        out=out,
        stream=True,
        checkpoint=ckpt,
        max_records=500,
    )
    assert q2.exception() is None
    assert all(p["numInputRows"] <= 500 for p in q2.recentProgress)

    rows = spark.read.parquet(out).collect()
    got = rows_by_position(rows)  # no record twice
    want = {**first, **second}
    assert got.keys() == want.keys()  # no record missing
    for pos, (key, value, _) in want.items():
        assert (got[pos]["key"], got[pos]["value"]) == (key.decode(), value.decode())

    # 3. A third run with nothing new reads nothing.
    q3 = topic_to_parquet.run(
        spark,
        source="straitmq",
        bootstrap=broker.bootstrap,
        topic=name,
        out=out,
        stream=True,
        checkpoint=ckpt,
    )
    assert sum(p["numInputRows"] for p in q3.recentProgress) == 0
    assert spark.read.parquet(out).count() == len(want)


def test_stream_through_spark_kafka_source_gives_the_same_result(
    spark: Any, broker: BrokerProcess, topic: tuple[str, dict], tmp_path: Path
) -> None:
    name, _ = topic
    outs = {}
    for source in ("straitmq", "kafka"):
        out = str(tmp_path / f"{source}-out")
        topic_to_parquet.run(
            spark,
            source=source,
            bootstrap=broker.bootstrap,
            topic=name,
            out=out,
            stream=True,
            checkpoint=str(tmp_path / f"{source}-ckpt"),
            max_records=1000,
        )
        outs[source] = sorted(tuple(r) for r in spark.read.parquet(out).collect())
    assert len(outs["straitmq"]) == RECORDS
    assert outs["straitmq"] == outs["kafka"]


# ---- errors -----------------------------------------------------------------------------------


def assert_one_clear_line(exc: BaseException, *words: str) -> str:
    """What the user sees: the exception's text names the problem on its first line, with no
    Java stack frame and no Python traceback anywhere in it."""
    text = str(exc)
    first = text.strip().splitlines()[0]
    for w in words:
        assert w in first, f"{w!r} not in the first line of: {text[:2000]}"
    assert "\tat " not in text and "Traceback" not in text, text[:3000]
    msg = user_message(exc)
    assert msg is not None and all(w in msg for w in words), (msg, text[:2000])
    return first


def batch_read(spark: Any, bootstrap: str, topic: str, **opts: str) -> Any:
    r = spark.read.format("straitmq").option("kafka.bootstrap.servers", bootstrap)
    r = r.option("subscribe", topic)
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load()


def stream_error(spark: Any, bootstrap: str, topic: str, tmp_path: Path, **opts: str) -> Any:
    from pyspark.errors import StreamingQueryException

    r = spark.readStream.format("straitmq").option("kafka.bootstrap.servers", bootstrap)
    r = r.option("subscribe", topic)
    for k, v in opts.items():
        r = r.option(k, v)
    q = (
        r.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / f"ckpt-{uuid.uuid4().hex[:6]}"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException) as ei:
        q.awaitTermination(60)
    return ei.value


def test_missing_topic_is_one_clear_error(
    spark: Any, broker: BrokerProcess, tmp_path: Path
) -> None:
    words = ("StraitMQ topic 'no-such-topic' does not exist", broker.bootstrap)
    with pytest.raises(Exception) as ei:
        batch_read(spark, broker.bootstrap, "no-such-topic").count()
    assert_one_clear_line(ei.value, *words)
    assert_one_clear_line(stream_error(spark, broker.bootstrap, "no-such-topic", tmp_path), *words)


def test_offset_out_of_range_is_one_clear_error(
    spark: Any, broker: BrokerProcess, topic: tuple[str, dict], tmp_path: Path
) -> None:
    name, _ = topic
    offsets = f'{{"{name}": {{"1": 999999}}}}'
    words = (f"offset 999999 for StraitMQ partition {name}-1 is out of range", "holds offsets 0..")
    with pytest.raises(Exception) as ei:
        batch_read(spark, broker.bootstrap, name, startingOffsets=offsets).count()
    assert_one_clear_line(ei.value, *words)
    err = stream_error(spark, broker.bootstrap, name, tmp_path, startingOffsets=offsets)
    assert_one_clear_line(err, *words)
    with pytest.raises(Exception) as ei:
        batch_read(
            spark, broker.bootstrap, name, startingOffsets=f'{{"{name}": {{"9": 0}}}}'
        ).count()
    assert_one_clear_line(ei.value, f"partition {name}-9", f"has {PARTITIONS} partition(s)")


def test_unreachable_cluster_is_one_clear_error(spark: Any, tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    words = (f"StraitMQ cluster at bootstrap {dead} did not answer", "check kafka.bootstrap")
    t0 = time.monotonic()
    with pytest.raises(Exception) as ei:
        batch_read(spark, dead, "orders", metadataTimeoutMs="2000").count()
    assert time.monotonic() - t0 < 30
    assert_one_clear_line(ei.value, *words)
    err = stream_error(spark, dead, "orders", tmp_path, metadataTimeoutMs="2000")
    assert_one_clear_line(err, *words)


def test_job_command_line_prints_one_line_and_exits_2(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """What a user running a job sees: one `error:` line, no traceback, exit code 2."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "spark-jobs" / "jobs" / "topic_to_parquet.py"),
            "--bootstrap",
            broker.bootstrap,
            "--topic",
            "missing-topic",
            "--out",
            str(tmp_path / "o"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "\tat " not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: StraitMQ topic 'missing-topic' does not exist"), last
