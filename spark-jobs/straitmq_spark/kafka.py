"""The Kafka-protocol side of the data source, over confluent-kafka (librdkafka).

`Cluster` runs on the driver: topics and partitions, watermarks, offset resolution.
`read_range` runs on executors: the records of one partition between two offsets, with
assign() at an explicit offset (no consumer group, nothing committed: offsets live in
Spark's checkpoint).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

from .errors import StraitMQSparkError
from .options import EARLIEST, LATEST, Offsets, SinkOptions, SourceOptions, TopicPartition

log = logging.getLogger("straitmq.spark")
# librdkafka's own log lines (e.g. "Connect to ... failed") go to Python logging at DEBUG
# instead of stderr: the data source reports one clear error of its own instead.
_rdkafka_log = logging.getLogger("straitmq.spark.librdkafka")


def _consumer_config(opts: SourceOptions, purpose: str) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": opts.bootstrap,
        # Required by librdkafka; never joined (assign() only) and never committed to.
        "group.id": f"straitmq-spark-{purpose}-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
        "isolation.level": "read_uncommitted",  # Spark's Kafka source default
        "fetch.max.bytes": 64 * 1024 * 1024,
        "max.partition.fetch.bytes": 16 * 1024 * 1024,
        "queued.max.messages.kbytes": 256 * 1024,
        "socket.connection.setup.timeout.ms": min(opts.metadata_timeout_ms, 30000),
        "logger": _rdkafka_log,
        "log.connection.close": False,
    }
    conf.update(opts.client_config)
    return conf


# librdkafka's codes for a refused login or TLS handshake: retrying cannot fix those.
_LOGIN_ERRORS = {"_AUTHENTICATION", "_SSL", "SASL_AUTHENTICATION_FAILED", "_UNSUPPORTED_FEATURE"}


def _consumer(opts: SourceOptions, purpose: str, refused: list[str] | None = None) -> Any:
    from confluent_kafka import Consumer, KafkaException

    conf = _consumer_config(opts, purpose)
    if refused is not None:
        # librdkafka reports a failed login here at once; without it the metadata
        # request just runs into its timeout and the user sees "unreachable".
        def on_error(err: Any) -> None:
            if err.name() in _LOGIN_ERRORS:
                refused.append(err.str())

        conf["error_cb"] = on_error
    try:
        return Consumer(conf)
    except (KafkaException, ValueError, TypeError) as e:
        raise StraitMQSparkError(
            f"StraitMQ client options refused at bootstrap {opts.bootstrap}: {e} "
            "(check the kafka.* options)"
        ) from None


def _unreachable(opts: SourceOptions, what: str, err: object) -> StraitMQSparkError:
    return StraitMQSparkError(
        f"StraitMQ cluster at bootstrap {opts.bootstrap} did not answer {what} within "
        f"{opts.metadata_timeout_ms} ms ({err}); check kafka.bootstrap.servers and that "
        "the brokers are up and reachable from the Spark driver and executors"
    )


class Cluster:
    """Driver-side metadata: one short-lived consumer, closed by `close()`."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._refused: list[str] = []
        self._consumer = _consumer(opts, "driver", self._refused)

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def partitions(self) -> list[TopicPartition]:
        """Every partition of the subscribed topics; a clear error if a topic is missing."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self.opts.metadata_timeout_ms / 1000
        while True:
            try:
                # All topics: asking for one by name could auto-create it on some clusters.
                md = self._consumer.list_topics(
                    timeout=min(1.0, self.opts.metadata_timeout_ms / 1000)
                )
                break
            except KafkaException as e:
                self._poll_errors()
                if time.monotonic() >= deadline:
                    raise _unreachable(self.opts, "a metadata request", e.args[0]) from None
        out: list[TopicPartition] = []
        for topic in self.opts.topics:
            t = md.topics.get(topic)
            if t is None or (t.error is not None and t.error.code() != 0):
                known = sorted(n for n in md.topics if not n.startswith("__"))
                hint = ", ".join(known[:10]) + (" ..." if len(known) > 10 else "")
                raise StraitMQSparkError(
                    f"StraitMQ topic '{topic}' does not exist at bootstrap {self.opts.bootstrap} "
                    f"(create it or check `subscribe`; topics there: {hint or 'none'})"
                )
            out.extend((topic, p) for p in sorted(t.partitions))
        return out

    def _poll_errors(self) -> None:
        """Serve librdkafka's error callback; a refused login or handshake is final."""
        self._consumer.poll(0)
        if self._refused:
            raise StraitMQSparkError(
                f"StraitMQ at bootstrap {self.opts.bootstrap} refused the connection: "
                f"{self._refused[-1]} (check kafka.security.protocol, kafka.sasl.mechanism, "
                "kafka.sasl.jaas.config or sasl.username/sasl.password, and the CA in "
                "kafka.ssl.truststore.location)"
            )

    def watermarks(self, tps: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        """(log start offset, high watermark) of each partition."""
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as TP

        timeout = self.opts.metadata_timeout_ms / 1000
        out = {}
        for topic, part in tps:
            try:
                low, high = self._consumer.get_watermark_offsets(
                    TP(topic, part), timeout=timeout, cached=False
                )
            except KafkaException as e:
                raise _unreachable(
                    self.opts, f"ListOffsets for {topic}-{part}", e.args[0]
                ) from None
            out[(topic, part)] = (low, high)
        return out

    def resolve(
        self,
        spec: str | Offsets,
        name: str,
        tps: list[TopicPartition],
        marks: dict[TopicPartition, tuple[int, int]],
        *,
        default: int,
    ) -> dict[TopicPartition, int]:
        """`earliest` / `latest` / per-partition JSON into concrete offsets, each checked to
        lie within the partition's [log start, high watermark]."""
        if spec == "earliest":
            return {tp: marks[tp][0] for tp in tps}
        if spec == "latest":
            return {tp: marks[tp][1] for tp in tps}
        assert isinstance(spec, dict)
        known = set(tps)
        for topic, parts in spec.items():
            if topic not in self.opts.topics:
                raise StraitMQSparkError(
                    f"{name} names topic '{topic}', which is not in `subscribe` "
                    f"({','.join(self.opts.topics)})"
                )
            for p in parts:
                if (topic, int(p)) not in known:
                    n = sum(1 for t, _ in tps if t == topic)
                    raise StraitMQSparkError(
                        f"{name} names partition {topic}-{p}, but StraitMQ topic '{topic}' has "
                        f"{n} partition(s) (0..{n - 1})"
                    )
        out = {}
        for topic, part in tps:
            want = spec.get(topic, {}).get(str(part), default)
            low, high = marks[(topic, part)]
            if want == EARLIEST:
                want = low
            elif want == LATEST:
                want = high
            elif not low <= want <= high:
                raise StraitMQSparkError(
                    f"{name} offset {want} for StraitMQ partition {topic}-{part} is out of "
                    f"range: it holds offsets {low}..{high} (use an offset in that range, "
                    "-2 for earliest or -1 for latest)"
                )
            out[(topic, part)] = want
        return out


class _ColumnBuilder:
    """Record columns for one Arrow batch."""

    def __init__(self, include_headers: bool) -> None:
        self.include_headers = include_headers
        self.key: list[bytes | None] = []
        self.value: list[bytes | None] = []
        self.offset: list[int] = []
        self.ts: list[int | None] = []
        self.ts_type: list[int] = []
        self.headers: list[list[dict[str, Any]] | None] = []

    def __len__(self) -> int:
        return len(self.offset)


# librdkafka timestamp types -> Kafka's TimestampType ids (what Spark's Kafka source shows).
_TS_TYPE = {0: -1, 1: 0, 2: 1}


def read_range(
    opts: SourceOptions, topic: str, partition: int, start: int, end: int, batch_rows: int = 8192
) -> Iterator[Any]:
    """Arrow record batches with the records of `topic`-`partition` in [start, end)."""
    import pyarrow as pa
    from confluent_kafka import KafkaError
    from confluent_kafka import TopicPartition as TP

    from .schema import arrow_schema

    schema = arrow_schema(opts.include_headers)
    _RESET = KafkaError._AUTO_OFFSET_RESET
    if start >= end:
        return
    consumer = _consumer(opts, "executor")
    try:
        consumer.assign([TP(topic, partition, start)])
        next_offset = start
        eof_at: int | None = None
        cols = _ColumnBuilder(opts.include_headers)
        deadline = time.monotonic() + opts.poll_timeout_ms / 1000
        while next_offset < end:
            msgs = consumer.consume(num_messages=min(batch_rows, 10000), timeout=1.0)
            if not msgs or eof_at is not None:
                if time.monotonic() > deadline:
                    if eof_at is not None and eof_at < end:
                        _data_loss(opts, topic, partition, next_offset, end, eof_at)
                        break
                    raise StraitMQSparkError(
                        f"no record from StraitMQ partition {topic}-{partition} at offset "
                        f"{next_offset} within {opts.poll_timeout_ms} ms (reading up to {end}); "
                        f"check that bootstrap {opts.bootstrap} is reachable from executors, "
                        "or raise kafkaConsumer.pollTimeoutMs"
                    )
                if not msgs:
                    continue
            eof_at = None
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if m.offset() >= end:  # the last offsets were gaps (e.g. compaction)
                            next_offset = end
                            break
                        # The partition ends before `end` for now (a new leader's high
                        # watermark can lag a moment); the deadline turns a lasting gap into
                        # an error.
                        eof_at = m.offset()
                        continue
                    if err.code() in (
                        KafkaError._AUTO_OFFSET_RESET,
                        KafkaError.OFFSET_OUT_OF_RANGE,
                    ):
                        _data_loss(opts, topic, partition, next_offset, end, None)
                        # failOnDataLoss=false: go on from what is still there.
                        low, _ = consumer.get_watermark_offsets(
                            TP(topic, partition), timeout=opts.metadata_timeout_ms / 1000
                        )
                        next_offset = max(low, next_offset) if low < end else end
                        consumer.assign([TP(topic, partition, next_offset)])
                        break
                    if err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise StraitMQSparkError(
                            f"StraitMQ partition {topic}-{partition} disappeared while Spark "
                            "was reading it (was the topic deleted?)"
                        )
                    if err.retriable() or err.code() in (
                        KafkaError._TRANSPORT,
                        KafkaError._ALL_BROKERS_DOWN,
                    ):
                        continue
                    raise StraitMQSparkError(
                        f"reading StraitMQ partition {topic}-{partition} at offset "
                        f"{next_offset} failed: {err.str()}"
                    )
                off = m.offset()
                if off < next_offset:
                    continue
                if off >= end:
                    next_offset = end
                    break
                cols.key.append(m.key())
                cols.value.append(m.value())
                cols.offset.append(off)
                ts_type, ts = m.timestamp()
                cols.ts.append(ts * 1000 if ts_type != 0 and ts >= 0 else None)
                cols.ts_type.append(_TS_TYPE.get(ts_type, -1))
                if opts.include_headers:
                    h = m.headers()
                    cols.headers.append(
                        [{"key": k, "value": v} for k, v in h] if h is not None else []
                    )
                next_offset = off + 1
                deadline = time.monotonic() + opts.poll_timeout_ms / 1000
                if len(cols) >= batch_rows:
                    yield _to_batch(pa, schema, topic, partition, cols)
                    cols = _ColumnBuilder(opts.include_headers)
        if len(cols):
            yield _to_batch(pa, schema, topic, partition, cols)
    finally:
        consumer.close()


def _data_loss(
    opts: SourceOptions, topic: str, part: int, at: int, end: int, eof: int | None
) -> None:
    what = (
        f"offset {at} is no longer available"
        if eof is None
        else f"the partition ends at {eof}, before the planned end {end}"
    )
    msg = (
        f"StraitMQ partition {topic}-{part}: {what} (deleted by retention or truncated while "
        "the query ran). Records were lost to this query; restart it from a new checkpoint, "
        "or set failOnDataLoss=false to skip what is gone"
    )
    if opts.fail_on_data_loss:
        raise StraitMQSparkError(msg)
    log.warning("%s: skipping", msg)


def _to_batch(pa: Any, schema: Any, topic: str, partition: int, cols: _ColumnBuilder) -> Any:
    n = len(cols)
    arrays = [
        pa.array(cols.key, type=pa.binary()),
        pa.array(cols.value, type=pa.binary()),
        pa.array([topic] * n, type=pa.string()),
        pa.array([partition] * n, type=pa.int32()),
        pa.array(cols.offset, type=pa.int64()),
        pa.array(cols.ts, type=schema.field("timestamp").type),
        pa.array(cols.ts_type, type=pa.int32()),
    ]
    if cols.include_headers:
        arrays.append(pa.array(cols.headers, type=schema.field("headers").type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# ---- writing -----------------------------------------------------------------------------


def _producer(sink: SinkOptions) -> Any:
    from confluent_kafka import KafkaException, Producer

    conf: dict[str, Any] = {
        "bootstrap.servers": sink.bootstrap,
        "enable.idempotence": True,
        "linger.ms": 5,
        "logger": _rdkafka_log,
        "log.connection.close": False,
    }
    conf.update(sink.client_config)
    try:
        return Producer(conf)
    except (KafkaException, ValueError, TypeError) as e:
        raise StraitMQSparkError(
            f"StraitMQ client options refused at bootstrap {sink.bootstrap}: {e} "
            "(check the kafka.* options)"
        ) from None


def check_topic_exists(sink: SinkOptions) -> None:
    """A clear error on the driver, before any task runs, if the target topic is missing."""
    from confluent_kafka import KafkaException

    opts = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": sink.bootstrap,
            "subscribe": sink.topic or "",
            "metadataTimeoutMs": str(sink.metadata_timeout_ms),
            **{f"kafka.{k}": v for k, v in sink.client_config.items()},
        },
        streaming=False,
    )
    with Cluster(opts) as cluster:
        try:
            cluster.partitions()
        except KafkaException as e:  # pragma: no cover - partitions() converts these
            raise _unreachable(opts, "a metadata request", e) from None


def _as_bytes(v: Any) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, bytearray | memoryview):
        return bytes(v)
    return str(v).encode()


def produce_rows(sink: SinkOptions, rows: Iterator[Any]) -> int:
    """Produce every row and wait until the cluster acknowledged all of them."""
    producer = _producer(sink)
    failures: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None and len(failures) < 5:
            failures.append(err.str())

    n = 0
    for row in rows:
        d = row.asDict() if hasattr(row, "asDict") else dict(row)
        if "value" not in d:
            raise StraitMQSparkError(
                "rows written to StraitMQ need a `value` column (binary or string)"
            )
        topic = d.get("topic") or sink.topic
        if not topic:
            raise StraitMQSparkError(
                'no topic to write to: add .option("topic", "name") or a `topic` column'
            )
        kwargs: dict[str, Any] = {"value": _as_bytes(d["value"]), "on_delivery": on_delivery}
        if d.get("key") is not None:
            kwargs["key"] = _as_bytes(d["key"])
        if d.get("partition") is not None:
            kwargs["partition"] = int(d["partition"])
        if d.get("headers"):
            kwargs["headers"] = [(h["key"], _as_bytes(h["value"])) for h in d["headers"]]
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.1)
        n += 1
        producer.poll(0)
    left = producer.flush(sink.metadata_timeout_ms / 1000 * 4)
    if left:
        failures.append(f"{left} record(s) still unacknowledged after the flush timeout")
    if failures:
        raise StraitMQSparkError(
            f"writing to StraitMQ at bootstrap {sink.bootstrap} failed: {'; '.join(failures)}"
        )
    return n
