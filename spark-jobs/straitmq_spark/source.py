"""`straitmq`: a Spark data source (pyspark.sql.datasource) for StraitMQ, batch and streaming.

    spark.dataSource.register(StraitMQDataSource)
    df = (spark.read.format("straitmq")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "orders")
          .load())

One Spark partition per topic partition (per micro-batch when streaming). A streaming
query's offsets are the JSON dicts of Spark's Kafka source ({"orders": {"0": 23, ...}}),
kept in Spark's checkpoint: a restarted query goes on from the last committed batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from .errors import StraitMQSparkError, one_line_errors
from .kafka import Cluster, check_topic_exists, produce_rows, read_range
from .options import (
    EARLIEST,
    LATEST,
    Offsets,
    SinkOptions,
    SourceOptions,
    TopicPartition,
    flatten,
    rate_limit,
    sorted_offsets,
)
from .schema import spark_schema


class OffsetRange(InputPartition):
    """Records [start, end) of one topic partition: one Spark task."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


class StraitMQDataSource(DataSource):
    """Options (names as in Spark's Kafka source where it has one):

    kafka.bootstrap.servers   host:port[,host:port]             (required)
    subscribe                 topic[,topic...]                  (required; alias: topics)
    startingOffsets           earliest | latest | JSON           batch default earliest,
                                                                 streaming default latest
    endingOffsets             latest | JSON                      batch only, default latest
    maxRecordsPerTrigger      records per micro-batch, shared among partitions
                              (alias: maxOffsetsPerTrigger)
    includeHeaders            true | false                       default false
    failOnDataLoss            true | false                       default true
    kafkaConsumer.pollTimeoutMs   executor wait for records      default 120000
    metadataTimeoutMs         driver wait for metadata/offsets   default 15000
    kafka.<librdkafka option> passed to the client (security.protocol, sasl.*, ssl.*, ...)
    kafka.<Java option>       Spark's Kafka-source security options work too:
                              sasl.jaas.config (PLAIN/SCRAM), ssl.truststore.* (PEM),
                              ssl.keystore.* (PEM/PKCS12); see straitmq.client_security

    Writing (df.write / df.writeStream .format("straitmq")): kafka.bootstrap.servers and
    `topic` (or a `topic` column); rows need `value`, may have `key`, `partition`, `headers`.
    """

    @classmethod
    def name(cls) -> str:
        return "straitmq"

    def schema(self) -> StructType:
        opts = {k.lower(): v for k, v in self.options.items()}
        include = str(opts.get("includeheaders", "false")).strip().lower() in ("true", "1", "yes")
        return spark_schema(include)

    @one_line_errors
    def reader(self, schema: StructType) -> DataSourceReader:
        return StraitMQBatchReader(SourceOptions.parse(self.options, streaming=False))

    @one_line_errors
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StraitMQStreamReader(SourceOptions.parse(self.options, streaming=True))

    @one_line_errors
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return StraitMQBatchWriter(self.options)

    @one_line_errors
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return StraitMQStreamWriter(self.options)


class StraitMQBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        # Resolve offsets now, on the driver, so that every bad input fails at planning.
        with Cluster(opts) as cluster:
            tps = cluster.partitions()
            marks = cluster.watermarks(tps)
            start = cluster.resolve(opts.starting, "startingOffsets", tps, marks, default=EARLIEST)
            end = cluster.resolve(opts.ending, "endingOffsets", tps, marks, default=LATEST)
        for tp in tps:
            if end[tp] < start[tp]:
                raise StraitMQSparkError(
                    f"endingOffsets {end[tp]} is before startingOffsets {start[tp]} for "
                    f"StraitMQ partition {tp[0]}-{tp[1]}"
                )
        self.ranges = [OffsetRange(t, p, start[(t, p)], end[(t, p)]) for t, p in tps]

    @one_line_errors
    def partitions(self) -> Sequence[InputPartition]:
        return list(self.ranges)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRange)
        return read_range(
            self.opts, partition.topic, partition.partition, partition.start, partition.end
        )


class StraitMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._cluster: Cluster | None = None
        self._available_now: dict[TopicPartition, int] | None = None

    # The driver-side client is made on first use and never pickled to executors.
    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "_cluster": None, "_available_now": None}

    def _meta(self) -> Cluster:
        if self._cluster is None:
            self._cluster = Cluster(self.opts)
        return self._cluster

    def _current(self) -> tuple[list[TopicPartition], dict[TopicPartition, tuple[int, int]]]:
        cluster = self._meta()
        tps = cluster.partitions()
        return tps, cluster.watermarks(tps)

    @one_line_errors
    def initialOffset(self) -> Offsets:
        tps, marks = self._current()
        start = self._meta().resolve(
            self.opts.starting, "startingOffsets", tps, marks, default=LATEST
        )
        return sorted_offsets(start)

    def _start_with_new_partitions(
        self, start: dict[TopicPartition, int], marks: dict[TopicPartition, tuple[int, int]]
    ) -> dict[TopicPartition, int]:
        """Partitions added since `start` was planned are read from their beginning."""
        out = dict(start)
        for tp, (low, _) in marks.items():
            out.setdefault(tp, low)
        return out

    @one_line_errors
    def prepareForTriggerAvailableNow(self) -> None:
        _, marks = self._current()
        self._available_now = {tp: high for tp, (_, high) in marks.items()}

    @one_line_errors
    def latestOffset(self, start: Offsets, limit: ReadLimit) -> Offsets:
        prev = flatten(start)
        tps, marks = self._current()
        begin = self._start_with_new_partitions(prev, marks)
        latest = {tp: marks[tp][1] for tp in tps}
        if self._available_now is not None:
            latest = {
                tp: min(h, self._available_now.get(tp, begin[tp])) for tp, h in latest.items()
            }
        for tp in tps:
            if latest[tp] < begin[tp]:
                latest[tp] = self._check_loss(tp, begin[tp], marks[tp])
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows)
        # Partitions that vanished (topic deleted and re-created smaller) keep their offset.
        for tp, off in prev.items():
            latest.setdefault(tp, off)
        return sorted_offsets(latest)

    def _check_loss(self, tp: TopicPartition, at: int, mark: tuple[int, int]) -> int:
        msg = (
            f"StraitMQ partition {tp[0]}-{tp[1]} now ends at offset {mark[1]}, before offset "
            f"{at} that this query already read up to (was the topic deleted and re-created?); "
            "restart the query from a new checkpoint, or set failOnDataLoss=false"
        )
        if self.opts.fail_on_data_loss:
            raise StraitMQSparkError(msg)
        return at

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_trigger:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable()

    @one_line_errors
    def reportLatestOffset(self) -> Offsets | None:
        _, marks = self._current()
        return sorted_offsets({tp: high for tp, (_, high) in marks.items()})

    @one_line_errors
    def partitions(self, start: Offsets, end: Offsets) -> Sequence[InputPartition]:
        begin = flatten(start)
        stop = flatten(end)
        new = [tp for tp in stop if tp not in begin]
        if new:
            marks = self._meta().watermarks(new)
            for tp in new:
                begin[tp] = marks[tp][0]
        ranges = []
        for tp in sorted(stop):
            lo, hi = begin[tp], stop[tp]
            if hi > lo:
                ranges.append(OffsetRange(tp[0], tp[1], lo, hi))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, OffsetRange)
        return read_range(
            self.opts, partition.topic, partition.partition, partition.start, partition.end
        )

    def commit(self, end: Offsets) -> None:
        """Nothing to do: offsets live in Spark's checkpoint, never in a consumer group."""

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


# ---- writing: df.write / df.writeStream .format("straitmq") ---------------------------------


class _CommitMessage(WriterCommitMessage):
    def __init__(self, records: int) -> None:
        self.records = records


class StraitMQBatchWriter(DataSourceWriter):
    """Rows with a `value` column (binary or string), optional `key`, `partition` and
    `headers` columns, produced to the topic of option `topic` (or each row's `topic`).
    Delivery is at-least-once, as with Spark's Kafka sink."""

    def __init__(self, options: Any) -> None:
        self.sink = SinkOptions.parse(options)
        # Fail at planning, on the driver, if the topic is missing.
        if self.sink.topic:
            check_topic_exists(self.sink)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _CommitMessage(produce_rows(self.sink, iterator))


class StraitMQStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: Any) -> None:
        self.sink = SinkOptions.parse(options)
        if self.sink.topic:
            check_topic_exists(self.sink)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return _CommitMessage(produce_rows(self.sink, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Records are acknowledged by the cluster in write(); nothing more to do."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Records already acknowledged stay: delivery is at-least-once."""
