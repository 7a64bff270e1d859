"""Bad input gets the Kafka error code a Kafka client expects.

Mostly raw protocol: kio request classes framed by hand over a socket, responses read
back with kio's entity_reader, several versions per API. Client admin APIs
(confluent-kafka) and the REST API are checked too.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import json
import socket
import struct
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import record_batch
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from straitmq.broker.record_codec import build_batch, decode_batch
from waiting import wait_for

NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_TOO_LARGE = 10
INVALID_TOPIC_EXCEPTION = 17
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_CONFIG = 40
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
INVALID_PRODUCER_EPOCH = 47
INVALID_RECORD = 87

BAD_TOPIC_NAMES = ["bad name!", "..", "x" * 250, ".", ""]
MS = datetime.timedelta(milliseconds=1)


# -- raw protocol --------------------------------------------------------------------------


def kio_module(api: str, version: int, kind: str = "request") -> Any:
    return importlib.import_module(f"kio.schema.{api}.v{version}.{kind}")


def make(cls: type, **kwargs: Any) -> Any:
    """Build a kio entity, dropping arguments this version of the schema does not have."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in kwargs.items() if k in names})


class Raw:
    """One Kafka connection speaking kio entities."""

    def __init__(self, b: Any) -> None:
        self.sock = socket.create_connection(("127.0.0.1", b.port), timeout=15)
        self.corr = 0

    def close(self) -> None:
        self.sock.close()

    def _recv(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            out += chunk
        return bytes(out)

    def send(self, req: Any) -> None:
        """A request with no answer (Produce with acks=0)."""
        self.corr += 1
        self.sock.sendall(self._frame(req))

    def call(self, req: Any) -> Any:
        self.corr += 1
        self.sock.sendall(self._frame(req))
        (size,) = struct.unpack(">i", self._recv(4))
        payload = self._recv(size)
        schema = load_response_schema(req.__api_key__, req.__version__)
        header, offset = entity_reader(schema.__header_schema__)(payload, 0)
        assert header.correlation_id == self.corr
        resp, _ = entity_reader(schema)(payload, offset)
        return resp

    def _frame(self, req: Any) -> bytes:
        hs = req.__header_schema__
        buf = io.BytesIO()
        entity_writer(hs)(
            buf,
            hs(
                request_api_key=req.__api_key__,
                request_api_version=req.__version__,
                correlation_id=self.corr,
                client_id="errors-test",
            ),
        )
        entity_writer(type(req))(buf, req)
        body = buf.getvalue()
        return struct.pack(">i", len(body)) + body


@pytest.fixture
def raw(request: pytest.FixtureRequest) -> Iterator:
    """raw(broker) -> a Raw connection, closed after the test."""
    opened: list[Raw] = []

    def connect(b: Any) -> Raw:
        r = Raw(b)
        opened.append(r)
        return r

    yield connect
    for r in opened:
        r.close()


def _module_broker(tmp_path_factory: pytest.TempPathFactory, name: str, *args: str) -> Any:
    from conftest import BrokerProcess

    return BrokerProcess(tmp_path_factory.mktemp(name) / "data", extra_args=list(args)).start()


@pytest.fixture(scope="module")
def strict_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """Auto-creation off, as production Kafka clusters usually run."""
    b = _module_broker(tmp_path_factory, "strict", "--no-auto-create")
    yield b
    b.stop()


@pytest.fixture(scope="module")
def auto_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    b = _module_broker(tmp_path_factory, "auto")
    yield b
    b.stop()


def code(x: Any) -> int:
    return int(x.error_code)


# -- request builders ----------------------------------------------------------------------


def create_topics(
    version: int,
    name: str,
    partitions: int = 1,
    rf: int = 1,
    configs: dict[str, str] | None = None,
    validate_only: bool = False,
) -> Any:
    m = kio_module("create_topics", version)
    topic = make(
        m.CreatableTopic,
        name=name,
        num_partitions=partitions,
        replication_factor=rf,
        assignments=(),
        configs=tuple(
            make(m.CreatableTopicConfig, name=k, value=v) for k, v in (configs or {}).items()
        ),
    )
    return make(
        m.CreateTopicsRequest, topics=(topic,), timeout=5000 * MS, validate_only=validate_only
    )


def produce(version: int, topic: str, records: bytes, partition: int = 0, acks: int = -1) -> Any:
    m = kio_module("produce", version)
    return make(
        m.ProduceRequest,
        transactional_id=None,
        acks=acks,
        timeout=5000 * MS,
        topic_data=(
            make(
                m.TopicProduceData,
                name=topic,
                partition_data=(make(m.PartitionProduceData, index=partition, records=records),),
            ),
        ),
    )


def fetch(version: int, topic: str, offset: int, partition: int = 0) -> Any:
    m = kio_module("fetch", version)
    part = make(
        m.FetchPartition,
        partition=partition,
        fetch_offset=offset,
        partition_max_bytes=1 << 20,
        current_leader_epoch=-1,
        log_start_offset=-1,
        last_fetched_epoch=-1,
    )
    return make(
        m.FetchRequest,
        replica_id=-1,
        max_wait=0 * MS,
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(make(m.FetchTopic, topic=topic, partitions=(part,)),),
        forgotten_topics_data=(),
        rack_id="",
    )


def metadata(version: int, names: list[str], allow_auto: bool = True) -> Any:
    m = kio_module("metadata", version)
    return make(
        m.MetadataRequest,
        topics=tuple(make(m.MetadataRequestTopic, name=n, topic_id=None) for n in names),
        allow_auto_topic_creation=allow_auto,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


def list_offsets(version: int, topic: str, timestamp: int, partition: int = 0) -> Any:
    m = kio_module("list_offsets", version)
    part = make(
        m.ListOffsetsPartition,
        partition_index=partition,
        timestamp=timestamp,
        current_leader_epoch=-1,
        max_num_offsets=1,
    )
    return make(
        m.ListOffsetsRequest,
        replica_id=-1,
        isolation_level=0,
        topics=(make(m.ListOffsetsTopic, name=topic, partitions=(part,)),),
    )


def produce_partition(resp: Any) -> Any:
    (t,) = resp.responses
    (p,) = t.partition_responses
    return p


def fetch_partition(resp: Any) -> Any:
    (t,) = resp.responses
    (p,) = t.partitions
    return p


def records_of(data: bytes | None) -> list[tuple[int, bytes | None]]:
    out = []
    pos = 0
    data = data or b""
    while pos + 12 <= len(data):
        size = int.from_bytes(data[pos + 8 : pos + 12], "big") + 12
        if pos + size > len(data):
            break
        out += [(r.offset, r.value) for r in decode_batch(data[pos : pos + size])]
        pos += size
    return out


def new_topic(r: Raw, name: str, partitions: int = 1, configs: dict | None = None) -> None:
    resp = r.call(create_topics(4, name, partitions, 1, configs))
    assert code(resp.topics[0]) == NONE, resp


def create_topics_versions() -> list:
    return [2, 4, 5, 7]


# -- produce: MESSAGE_TOO_LARGE ------------------------------------------------------------


@pytest.mark.parametrize("version", [3, 7, 9])
def test_produce_larger_than_max_message_bytes(strict_broker: Any, raw: Any, version: int) -> None:
    r = raw(strict_broker)
    topic = f"small-msgs-v{version}"
    new_topic(r, topic, configs={"max.message.bytes": "2000"})
    big = record_batch([b"x" * 3000])
    resp = r.call(produce(version, topic, big))
    p = produce_partition(resp)
    assert code(p) == MESSAGE_TOO_LARGE
    assert p.base_offset == -1
    # Just under the limit is fine, and nothing of the refused batch was stored.
    ok = r.call(produce(version, topic, record_batch([b"y" * 1800])))
    assert code(produce_partition(ok)) == NONE
    assert produce_partition(ok).base_offset == 0
    latest = r.call(list_offsets(6, topic, -1)).topics[0].partitions[0]
    assert latest.offset == 1


def test_refused_acks0_produce_closes_the_connection(strict_broker: Any, raw: Any) -> None:
    """acks=0 has no answer to carry an error, so (as Kafka) a refused write closes the
    connection; an accepted one leaves it open and the next request is served."""
    r = raw(strict_broker)
    new_topic(r, "fire-and-forget")
    r.send(produce(9, "fire-and-forget", record_batch([b"a"]), acks=0))
    assert r.call(list_offsets(6, "fire-and-forget", -1)).topics[0].partitions[0].offset == 1
    r.send(produce(9, "no-such-topic-acks0", record_batch([b"b"]), acks=0))
    with pytest.raises(ConnectionError):
        r.call(list_offsets(6, "fire-and-forget", -1))
    # Others are served as before.
    assert (
        code(
            produce_partition(
                raw(strict_broker).call(produce(9, "fire-and-forget", record_batch([b"c"])))
            )
        )
        == NONE
    )


def test_produce_corrupt_batch(strict_broker: Any, raw: Any) -> None:
    r = raw(strict_broker)
    new_topic(r, "corrupt")
    good = bytearray(record_batch([b"payload-1", b"payload-2"]))
    bad_crc = bytes(good[:-1]) + bytes([good[-1] ^ 1])
    assert code(produce_partition(r.call(produce(9, "corrupt", bad_crc)))) == CORRUPT_MESSAGE
    torn = bytes(good[: len(good) - 5])
    assert code(produce_partition(r.call(produce(9, "corrupt", torn)))) == CORRUPT_MESSAGE
    assert code(produce_partition(r.call(produce(9, "corrupt", bytes(good))))) == NONE
    assert [v for _o, v in log_values(r, "corrupt")] == [b"payload-1", b"payload-2"]


@pytest.mark.parametrize("version", [3, 9])
def test_keyless_records_to_a_compacted_topic(strict_broker: Any, raw: Any, version: int) -> None:
    """Kafka refuses a record without a key in a compacted topic: INVALID_RECORD, with
    the record's index in its batch (Produce v8+), and the batch is not written."""
    r = raw(strict_broker)
    topic = f"compacted-keys-v{version}"
    new_topic(r, topic, configs={"cleanup.policy": "compact"})
    ts = int(datetime.datetime.now().timestamp() * 1000)
    mixed = build_batch([(b"k0", b"a", []), (None, b"b", []), (b"k2", b"c", [])], ts, 1)
    p = produce_partition(r.call(produce(version, topic, mixed)))
    assert code(p) == INVALID_RECORD and p.base_offset == -1
    if version >= 8:
        why = f"Compacted topic cannot accept message without key in topic partition {topic}-0"
        assert [(e.batch_index, e.batch_index_error_message) for e in p.record_errors] == [(1, why)]
        assert p.error_message == (
            "One or more records have been rejected due to 1 record errors in total, and only "
            f"showing the first three errors at most: [RecordError(batchIndex=1, message='{why}')]"
        )
    ok = produce_partition(r.call(produce(version, topic, build_batch([(b"k", b"v", [])], ts))))
    assert code(ok) == NONE and ok.base_offset == 0
    assert log_values(r, topic) == [(0, b"v")]
    # The REST API writes through the same path: a keyless record is a 400 that says why.
    status, body, _ = _http(
        strict_broker, "POST", f"/api/v1/topics/{topic}/records", b'{"records": [{"value": "x"}]}'
    )
    assert status == 400 and b"without key" in body, body
    assert log_values(r, topic) == [(0, b"v")]


def test_broker_wide_message_max_bytes(broker_factory: Any, raw: Any) -> None:
    b = broker_factory("--message-max-bytes", "5000", "--no-auto-create")
    r = raw(b)
    new_topic(r, "t")
    assert (
        code(produce_partition(r.call(produce(9, "t", record_batch([b"z" * 6000])))))
        == MESSAGE_TOO_LARGE
    )
    assert code(produce_partition(r.call(produce(9, "t", record_batch([b"z" * 4000]))))) == NONE


def test_produce_larger_than_max_message_bytes_confluent(strict_broker: Any, raw: Any) -> None:
    from confluent_kafka import KafkaError, Producer

    new_topic(raw(strict_broker), "small-msgs-client", configs={"max.message.bytes": "2000"})
    p = Producer(
        {
            "bootstrap.servers": strict_broker.bootstrap,
            "message.max.bytes": 100000,
            "linger.ms": 0,
            "retries": 0,
        }
    )
    errors: list[Any] = []
    p.produce("small-msgs-client", b"v" * 5000, on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(20) == 0
    assert errors and errors[0] is not None
    assert errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE


# -- topic names, unknown topics -------------------------------------------------------------------


@pytest.mark.parametrize("version", create_topics_versions())
@pytest.mark.parametrize(
    "name", BAD_TOPIC_NAMES, ids=["space-bang", "dotdot", "250chars", "dot", "empty"]
)
def test_create_topic_with_invalid_name(
    strict_broker: Any, raw: Any, name: str, version: int
) -> None:
    resp = raw(strict_broker).call(create_topics(version, name))
    assert code(resp.topics[0]) == INVALID_TOPIC_EXCEPTION
    assert resp.topics[0].error_message


def test_249_char_topic_name_is_valid(strict_broker: Any, raw: Any) -> None:
    resp = raw(strict_broker).call(create_topics(4, "y" * 249))
    assert code(resp.topics[0]) == NONE


@pytest.mark.parametrize("name", BAD_TOPIC_NAMES[:3], ids=["space-bang", "dotdot", "250chars"])
@pytest.mark.parametrize("version", [4, 9, 12])
def test_metadata_auto_create_invalid_name(
    auto_broker: Any, raw: Any, name: str, version: int
) -> None:
    resp = raw(auto_broker).call(metadata(version, [name]))
    (t,) = resp.topics
    assert code(t) == INVALID_TOPIC_EXCEPTION
    assert name not in json.loads(_http(auto_broker, "GET", "/api/v1/topics")[1])["topics"]


@pytest.mark.parametrize("version", [4, 9, 12])
def test_metadata_no_auto_create_when_client_says_so(
    auto_broker: Any, raw: Any, version: int
) -> None:
    r = raw(auto_broker)
    name = f"not-wanted-v{version}"
    (t,) = r.call(metadata(version, [name], allow_auto=False)).topics
    assert code(t) == UNKNOWN_TOPIC_OR_PARTITION
    (t,) = r.call(metadata(version, [name], allow_auto=True)).topics
    assert code(t) == NONE and len(t.partitions) == 1


def test_create_topic_invalid_name_admin_client(strict_broker: Any) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": strict_broker.bootstrap})
    futures = admin.create_topics(
        [NewTopic("bad name!", 1, 1), NewTopic("..", 1, 1)], request_timeout=10
    )
    for fut in futures.values():
        with pytest.raises(Exception) as e:
            fut.result(15)
        assert e.value.args[0].code() == KafkaError.TOPIC_EXCEPTION


@pytest.mark.parametrize("version", [1, 4, 9, 12])
def test_metadata_unknown_topic_without_auto_create(
    strict_broker: Any, raw: Any, version: int
) -> None:
    resp = raw(strict_broker).call(metadata(version, ["no-such-topic"]))
    (t,) = resp.topics
    assert code(t) == UNKNOWN_TOPIC_OR_PARTITION
    assert t.partitions == ()


def test_unknown_topic_everywhere_without_auto_create(strict_broker: Any, raw: Any) -> None:
    r = raw(strict_broker)
    for v in (3, 9):
        assert (
            code(produce_partition(r.call(produce(v, "ghost", record_batch([b"a"])))))
            == UNKNOWN_TOPIC_OR_PARTITION
        )
    for v in (4, 12):
        assert code(fetch_partition(r.call(fetch(v, "ghost", 0)))) == UNKNOWN_TOPIC_OR_PARTITION
    for v in (1, 6):
        p = r.call(list_offsets(v, "ghost", -1)).topics[0].partitions[0]
        assert code(p) == UNKNOWN_TOPIC_OR_PARTITION
    # A partition that does not exist on a topic that does.
    new_topic(r, "one-part")
    assert (
        code(produce_partition(r.call(produce(9, "one-part", record_batch([b"a"]), partition=5))))
        == UNKNOWN_TOPIC_OR_PARTITION
    )
    assert (
        code(fetch_partition(r.call(fetch(12, "one-part", 0, partition=5))))
        == UNKNOWN_TOPIC_OR_PARTITION
    )
    # And nothing was created behind our back.
    assert code(r.call(metadata(12, ["ghost"])).topics[0]) == UNKNOWN_TOPIC_OR_PARTITION


def test_unknown_topic_confluent_producer(strict_broker: Any) -> None:
    from confluent_kafka import KafkaError, Producer

    p = Producer({"bootstrap.servers": strict_broker.bootstrap, "message.timeout.ms": 3000})
    errors: list[Any] = []
    p.produce("ghost-topic", b"v", on_delivery=lambda err, msg: errors.append(err))
    p.flush(15)
    assert errors and errors[0] is not None
    assert errors[0].code() in (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._MSG_TIMED_OUT,
    )


# -- topic admin ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", create_topics_versions())
def test_create_topic_replication_factor_above_broker_count(
    strict_broker: Any, raw: Any, version: int
) -> None:
    r = raw(strict_broker)
    resp = r.call(create_topics(version, f"rf3-v{version}", partitions=1, rf=3))
    assert code(resp.topics[0]) == INVALID_REPLICATION_FACTOR
    assert code(r.call(metadata(12, [f"rf3-v{version}"])).topics[0]) == UNKNOWN_TOPIC_OR_PARTITION
    # validate_only gives the same answer.
    resp = r.call(create_topics(version, f"rf3b-v{version}", rf=3, validate_only=True))
    assert code(resp.topics[0]) == INVALID_REPLICATION_FACTOR


def test_admin_client_replication_factor_partitions_configs(strict_broker: Any) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

    admin = AdminClient({"bootstrap.servers": strict_broker.bootstrap})

    def error_of(futures: dict) -> int:
        (fut,) = futures.values()
        with pytest.raises(Exception) as e:
            fut.result(15)
        return e.value.args[0].code()

    assert (
        error_of(admin.create_topics([NewTopic("adm-rf3", 1, 3)]))
        == KafkaError.INVALID_REPLICATION_FACTOR
    )
    assert (
        error_of(admin.create_topics([NewTopic("adm-cfg", 1, 1, config={"no.such.config": "1"})]))
        == KafkaError.INVALID_CONFIG
    )
    for fut in admin.create_topics([NewTopic("adm-4", 4, 1)]).values():
        fut.result(15)
    assert (
        error_of(admin.create_partitions([NewPartitions("adm-4", 2)]))
        == KafkaError.INVALID_PARTITIONS
    )
    assert (
        error_of(admin.create_partitions([NewPartitions("adm-4", 4)]))
        == KafkaError.INVALID_PARTITIONS
    )


@pytest.mark.parametrize("version", [0, 1, 3])
def test_create_partitions_shrinking_or_same(strict_broker: Any, raw: Any, version: int) -> None:
    r = raw(strict_broker)
    name = f"parts-v{version}"
    new_topic(r, name, partitions=4)
    m = kio_module("create_partitions", version)
    for count in (2, 4, 0, -1):
        req = m.CreatePartitionsRequest(
            topics=(m.CreatePartitionsTopic(name=name, count=count, assignments=None),),
            timeout=5000 * MS,
            validate_only=False,
        )
        (res,) = r.call(req).results
        assert code(res) == INVALID_PARTITIONS, count
    req = m.CreatePartitionsRequest(
        topics=(m.CreatePartitionsTopic(name="ghost", count=8, assignments=None),),
        timeout=5000 * MS,
        validate_only=False,
    )
    assert code(r.call(req).results[0]) == UNKNOWN_TOPIC_OR_PARTITION
    assert len(r.call(metadata(12, [name])).topics[0].partitions) == 4
    # Growing works.
    req = m.CreatePartitionsRequest(
        topics=(m.CreatePartitionsTopic(name=name, count=6, assignments=None),),
        timeout=5000 * MS,
        validate_only=False,
    )
    assert code(r.call(req).results[0]) == NONE
    assert len(r.call(metadata(12, [name])).topics[0].partitions) == 6


@pytest.mark.parametrize("version", create_topics_versions())
@pytest.mark.parametrize(
    "configs",
    [
        {"no.such.config": "1"},
        {"retention.ms": "soon"},
        {"cleanup.policy": "compact,delete,bogus"},
        {"segment.bytes": "1"},
    ],
    ids=["unknown", "not-a-number", "bad-enum", "out-of-range"],
)
def test_create_topic_invalid_config(
    strict_broker: Any, raw: Any, version: int, configs: dict
) -> None:
    r = raw(strict_broker)
    name = f"cfg-v{version}-{abs(hash(json.dumps(configs))) % 10000}"
    resp = r.call(create_topics(version, name, configs=configs))
    assert code(resp.topics[0]) == INVALID_CONFIG
    assert code(r.call(metadata(12, [name])).topics[0]) == UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize("version", [0, 1])
def test_alter_unknown_topic_config(strict_broker: Any, raw: Any, version: int) -> None:
    r = raw(strict_broker)
    name = f"alter-v{version}"
    new_topic(r, name)
    m = kio_module("incremental_alter_configs", version)

    def alter(topic: str, key: str, value: str | None, op: int = 0) -> int:
        req = m.IncrementalAlterConfigsRequest(
            resources=(
                m.AlterConfigsResource(
                    resource_type=2,
                    resource_name=topic,
                    configs=(m.AlterableConfig(name=key, config_operation=op, value=value),),
                ),
            ),
            validate_only=False,
        )
        return code(r.call(req).responses[0])

    assert alter(name, "no.such.config", "1") == INVALID_CONFIG
    assert alter(name, "retention.ms", "soon") == INVALID_CONFIG
    assert alter("ghost", "retention.ms", "1000") == UNKNOWN_TOPIC_OR_PARTITION
    assert alter(name, "retention.ms", "1000") == NONE


# -- topic and broker configs through confluent-kafka's AdminClient -----------------------


def _admin_error(future: Any) -> Any:
    """The KafkaError a failed admin future carries."""
    with pytest.raises(Exception) as e:
        future.result(15)
    return e.value.args[0]


def _describe(admin: Any, resource: Any) -> dict:
    (fut,) = admin.describe_configs([resource]).values()
    return fut.result(15)


def _alter(admin: Any, resource: Any, *entries: tuple[str, str | None, Any]) -> Any:
    """One IncrementalAlterConfigs of (name, value, AlterConfigOpType) on `resource`;
    its future."""
    from confluent_kafka.admin import ConfigEntry, ConfigResource

    res = ConfigResource(
        resource.restype,
        resource.name,
        incremental_configs=[
            ConfigEntry(name, value, incremental_operation=op) for name, value, op in entries
        ],
    )
    (fut,) = admin.incremental_alter_configs([res]).values()
    return fut


@pytest.mark.parametrize("policy", ["delete", "compact", "compact,delete", "delete, compact"])
def test_topics_with_every_cleanup_policy_through_the_admin_client(
    strict_broker: Any, policy: str
) -> None:
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigResource,
        ConfigSource,
        NewTopic,
        ResourceType,
    )

    admin = AdminClient({"bootstrap.servers": strict_broker.bootstrap})
    name = "policy-" + policy.replace(",", "-").replace(" ", "")
    configs = {"cleanup.policy": policy, "min.cleanable.dirty.ratio": "0.25"}
    for fut in admin.create_topics([NewTopic(name, 1, 1, config=configs)]).values():
        fut.result(15)
    topic = ConfigResource(ResourceType.TOPIC, name)
    described = _describe(admin, topic)
    entry = described["cleanup.policy"]
    # Kafka describes a LIST config parsed: entries joined by ',' without spaces.
    assert entry.value == policy.replace(" ", "")
    assert entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value and not entry.is_default
    assert described["min.cleanable.dirty.ratio"].value == "0.25"
    for key, default in [
        ("delete.retention.ms", "86400000"),
        ("min.compaction.lag.ms", "0"),
        ("max.compaction.lag.ms", str(2**63 - 1)),
        ("segment.jitter.ms", "0"),
        ("remote.storage.enable", "false"),
    ]:
        assert described[key].value == default and described[key].is_default, key
    # APPEND and SUBTRACT apply to the list; SET replaces it.
    _alter(admin, topic, ("cleanup.policy", "compact", AlterConfigOpType.APPEND)).result(15)
    assert set(_describe(admin, topic)["cleanup.policy"].value.split(",")) >= {"compact"}
    _alter(admin, topic, ("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT)).result(15)
    assert _describe(admin, topic)["cleanup.policy"].value == "compact"
    _alter(
        admin,
        topic,
        ("cleanup.policy", "compact,delete", AlterConfigOpType.SET),
        ("delete.retention.ms", "1000", AlterConfigOpType.SET),
        ("min.compaction.lag.ms", "5000", AlterConfigOpType.SET),
    ).result(15)
    after = _describe(admin, topic)
    assert after["cleanup.policy"].value == "compact,delete"
    assert after["delete.retention.ms"].value == "1000"
    # Refused, saying why; the topic keeps its configs.
    for entries, fragment in [
        ((("cleanup.policy", "compact,shred", AlterConfigOpType.SET),), "'shred' is not"),
        ((("remote.storage.enable", "true", AlterConfigOpType.SET),), "tiered storage"),
        ((("min.cleanable.dirty.ratio", "1.01", AlterConfigOpType.SET),), "outside [0, 1]"),
        (
            (("max.compaction.lag.ms", "10", AlterConfigOpType.SET),),
            "min.compaction.lag.ms (5000) > max.compaction.lag.ms (10)",
        ),
        ((("retention.ms", "1", AlterConfigOpType.APPEND),), "list configs only"),
    ]:
        err = _admin_error(_alter(admin, topic, *entries))
        assert err.code() == KafkaError.INVALID_CONFIG and fragment in err.str(), err
    assert _describe(admin, topic)["cleanup.policy"].value == "compact,delete"
    # What `kafka-reassign-partitions --verify` clears on every moved topic.
    _alter(
        admin,
        topic,
        ("leader.replication.throttled.replicas", None, AlterConfigOpType.DELETE),
        ("follower.replication.throttled.replicas", None, AlterConfigOpType.DELETE),
    ).result(15)
    err = _admin_error(
        admin.create_topics([NewTopic(name + "-x", 1, 1, config={"cleanup.policy": "shred"})])[
            name + "-x"
        ]
    )
    assert (
        err.code() == KafkaError.INVALID_CONFIG and "'shred' is not a cleanup policy" in err.str()
    )


def test_cleaner_broker_configs_at_runtime_through_the_admin_client(
    broker_factory: Any, raw: Any
) -> None:
    """`kafka-configs --entity-type brokers` on the log cleaner's settings: set, shown as
    dynamic configs, checked as Kafka checks them, deleted back to the static value; the
    broker default of cleanup.policy reaches topics without their own. Also what
    `kafka-reassign-partitions --verify` clears on each broker."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import (
        AdminClient,
        AlterConfigOpType,
        ConfigResource,
        ConfigSource,
        NewTopic,
        ResourceType,
    )

    b = broker_factory("--log-cleaner-backoff-ms", "1000")
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    node = ConfigResource(ResourceType.BROKER, "1")
    before = _describe(admin, node)
    assert before["log.cleaner.threads"].value == "1"
    assert before["log.cleaner.threads"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert before["log.cleaner.backoff.ms"].value == "1000"
    assert before["log.cleanup.policy"].value == "delete"
    SET, DELETE = AlterConfigOpType.SET, AlterConfigOpType.DELETE
    _alter(
        admin,
        node,
        ("log.cleaner.threads", "2", SET),
        ("log.cleaner.io.max.bytes.per.second", "1048576", SET),
        ("log.cleaner.dedupe.buffer.size", "67108864", SET),
        ("log.cleaner.min.cleanable.ratio", "0.1", SET),
    ).result(15)
    now = _describe(admin, node)
    assert now["log.cleaner.threads"].value == "2"
    assert now["log.cleaner.threads"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    assert now["log.cleaner.io.max.bytes.per.second"].value == "1048576"
    assert now["log.cleaner.backoff.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    # One value for the cluster: the cluster default (`kafka-configs --entity-default`,
    # resource "", which confluent-kafka does not send) shows it too, with its doc.
    m = kio_module("describe_configs", 4)
    r = raw(b)
    resource = m.DescribeConfigsResource(
        resource_type=4, resource_name="", configuration_keys=("log.cleaner.threads",)
    )
    req = m.DescribeConfigsRequest(
        resources=(resource,), include_synonyms=True, include_documentation=True
    )
    (res,) = r.call(req).results
    (entry,) = res.configs
    assert (code(res), entry.value) == (NONE, "2")
    assert entry.config_source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
    assert not entry.read_only and "cleaner workers" in entry.documentation
    # Refused as Kafka refuses them, saying why; nothing changes.
    for name, value, fragment in [
        ("log.cleaner.threads", "5", "more than double the current value 2"),
        ("log.cleaner.threads", "0", "at least 1"),
        ("log.cleaner.threads", "two", "'two' is not an integer"),
        ("log.cleaner.dedupe.buffer.size", "1000", "at least 1MB per cleaner thread"),
        ("log.cleaner.min.cleanable.ratio", "1.5", "outside [0, 1]"),
        ("log.cleanup.policy", "shred", "'shred' is not a cleanup policy"),
        ("log.retention.ms", "1000", "cannot be altered at runtime"),
    ]:
        err = _admin_error(_alter(admin, node, (name, value, SET)))
        assert err.code() == KafkaError.INVALID_CONFIG and fragment in err.str(), (name, err)
    assert _describe(admin, node)["log.cleaner.threads"].value == "2"
    # The broker default of cleanup.policy: topics without their own policy take it.
    for fut in admin.create_topics(
        [NewTopic("own", 1, 1, config={"cleanup.policy": "delete"}), NewTopic("dflt", 1, 1)]
    ).values():
        fut.result(15)
    _alter(admin, node, ("log.cleanup.policy", "compact", SET)).result(15)

    def policy(topic: str) -> str:
        return _describe(admin, ConfigResource(ResourceType.TOPIC, topic))["cleanup.policy"].value

    wait_for(lambda: policy("dflt") == "compact", 10, "the topic to take the broker default")
    assert policy("own") == "delete"
    # Deleted: back to the static values.
    _alter(
        admin,
        node,
        ("log.cleaner.threads", None, DELETE),
        ("log.cleaner.io.max.bytes.per.second", None, DELETE),
        ("log.cleaner.dedupe.buffer.size", None, DELETE),
        ("log.cleaner.min.cleanable.ratio", None, DELETE),
        ("log.cleanup.policy", None, DELETE),
    ).result(15)
    back = _describe(admin, node)
    assert back["log.cleaner.threads"].value == "1"
    assert back["log.cleaner.threads"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    wait_for(lambda: policy("dflt") == "delete", 10, "the topic to take the static default")
    # `kafka-reassign-partitions --verify` clears these three on every broker it moved
    # replicas to; the log-dirs quota is accepted (and has no effect: one log directory).
    _alter(admin, node, ("replica.alter.log.dirs.io.max.bytes.per.second", "1048576", SET)).result(
        15
    )
    shown = _describe(admin, node)["replica.alter.log.dirs.io.max.bytes.per.second"]
    assert shown.value == "1048576" and shown.source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    _alter(
        admin,
        node,
        ("leader.replication.throttled.rate", None, DELETE),
        ("follower.replication.throttled.rate", None, DELETE),
        ("replica.alter.log.dirs.io.max.bytes.per.second", None, DELETE),
    ).result(15)
    shown = _describe(admin, node)["replica.alter.log.dirs.io.max.bytes.per.second"]
    assert shown.source == ConfigSource.DEFAULT_CONFIG.value


# -- fetch ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [4, 7, 11, 12])
def test_fetch_offset_out_of_range(strict_broker: Any, raw: Any, version: int) -> None:
    r = raw(strict_broker)
    topic = f"oor-v{version}"
    new_topic(r, topic)
    for _i in range(3):
        assert (
            code(produce_partition(r.call(produce(9, topic, record_batch([b"a", b"b"]))))) == NONE
        )
    end = 6
    for offset in (end + 1, end + 1000, 2**40, -5):
        p = fetch_partition(r.call(fetch(version, topic, offset)))
        assert code(p) == OFFSET_OUT_OF_RANGE, offset
        assert p.high_watermark == end
        assert not p.records
    # At the end exactly: no error, no data. Inside: the data.
    p = fetch_partition(r.call(fetch(version, topic, end)))
    assert code(p) == NONE and not p.records
    p = fetch_partition(r.call(fetch(version, topic, 3)))
    assert code(p) == NONE
    assert [o for o, _v in records_of(p.records) if o >= 3] == [3, 4, 5]


# -- idempotent producer -------------------------------------------------------------------


def init_producer_id(r: Raw, version: int = 4) -> tuple[int, int]:
    m = kio_module("init_producer_id", version)
    resp = r.call(
        make(
            m.InitProducerIdRequest,
            transactional_id=None,
            transaction_timeout=60000 * MS,
            producer_id=-1,
            producer_epoch=-1,
        )
    )
    assert code(resp) == NONE
    assert resp.producer_id >= 0 and resp.producer_epoch >= 0
    return resp.producer_id, resp.producer_epoch


def log_values(r: Raw, topic: str) -> list[tuple[int, bytes | None]]:
    return records_of(fetch_partition(r.call(fetch(12, topic, 0))).records)


def send(
    r: Raw, topic: str, values: list[bytes], producer: tuple[int, int, int], version: int = 9
) -> tuple[int, int]:
    p = produce_partition(r.call(produce(version, topic, record_batch(values, producer))))
    return code(p), p.base_offset


@pytest.mark.parametrize("version", [3, 9])
def test_idempotent_retry_gets_original_offset(strict_broker: Any, raw: Any, version: int) -> None:
    r = raw(strict_broker)
    topic = f"idem-v{version}"
    new_topic(r, topic)
    pid, epoch = init_producer_id(r)
    other_pid, _ = init_producer_id(r, 0)
    assert other_pid != pid
    # Something else first, so the idempotent batch does not start at offset 0.
    assert send(r, topic, [b"plain"], (-1, -1, -1), version) == (NONE, 0)
    assert send(r, topic, [b"a0", b"a1", b"a2"], (pid, epoch, 0), version) == (NONE, 1)
    # The same batch again (a retry after a lost response): original offset, not stored.
    assert send(r, topic, [b"a0", b"a1", b"a2"], (pid, epoch, 0), version) == (NONE, 1)
    assert send(r, topic, [b"a3"], (pid, epoch, 3), version) == (NONE, 4)
    assert send(r, topic, [b"a3"], (pid, epoch, 3), version) == (NONE, 4)
    # A gap in the sequence is refused and not stored.
    err, _ = send(r, topic, [b"gap"], (pid, epoch, 9), version)
    assert err == OUT_OF_ORDER_SEQUENCE_NUMBER
    # A different producer has its own sequence.
    assert send(r, topic, [b"o0"], (other_pid, 0, 0), version) == (NONE, 5)
    assert log_values(r, topic) == [
        (0, b"plain"),
        (1, b"a0"),
        (2, b"a1"),
        (3, b"a2"),
        (4, b"a3"),
        (5, b"o0"),
    ]


def test_idempotent_epochs(strict_broker: Any, raw: Any) -> None:
    r = raw(strict_broker)
    topic = "idem-epochs"
    new_topic(r, topic)
    pid, epoch = init_producer_id(r)
    assert send(r, topic, [b"e0-0", b"e0-1"], (pid, epoch, 0)) == (NONE, 0)
    # A new epoch must start at sequence 0.
    err, _ = send(r, topic, [b"e1-x"], (pid, epoch + 1, 5))
    assert err == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert send(r, topic, [b"e1-0"], (pid, epoch + 1, 0)) == (NONE, 2)
    # The older epoch is fenced now, whatever its sequence.
    for seq in (2, 0):
        err, _ = send(r, topic, [b"stale"], (pid, epoch, seq))
        assert err == INVALID_PRODUCER_EPOCH, seq
    assert send(r, topic, [b"e1-1"], (pid, epoch + 1, 1)) == (NONE, 3)
    assert [v for _o, v in log_values(r, topic)] == [b"e0-0", b"e0-1", b"e1-0", b"e1-1"]


def test_idempotent_dedup_window_is_five_batches(strict_broker: Any, raw: Any) -> None:
    r = raw(strict_broker)
    topic = "idem-window"
    new_topic(r, topic)
    pid, epoch = init_producer_id(r)
    offsets = {}
    seq = 0
    for i in range(7):
        values = [f"b{i}-{j}".encode() for j in range(i % 3 + 1)]
        err, base = send(r, topic, values, (pid, epoch, seq))
        assert err == NONE
        offsets[i] = (values, seq, base)
        seq += len(values)
    end = sum(len(v) for v, _s, _b in offsets.values())
    # Any of the last five batches, retried in any order, gets its original offset.
    for i in (6, 2, 4, 3, 5, 6):
        values, s, base = offsets[i]
        assert send(r, topic, values, (pid, epoch, s)) == (NONE, base), i
    # Older than the window: refused, never written twice.
    for i in (0, 1):
        values, s, _base = offsets[i]
        err, _ = send(r, topic, values, (pid, epoch, s))
        assert err == OUT_OF_ORDER_SEQUENCE_NUMBER, i
    # A retry with the right first sequence but a different length is no duplicate.
    values, s, _base = offsets[5]
    assert len(values) == 3
    err, _ = send(r, topic, values[:1], (pid, epoch, s))
    assert err == OUT_OF_ORDER_SEQUENCE_NUMBER
    got = log_values(r, topic)
    assert [o for o, _v in got] == list(range(end))
    assert len({v for _o, v in got}) == end
    # The next sequence still goes on.
    assert send(r, topic, [b"next"], (pid, epoch, seq)) == (NONE, end)


def test_idempotent_dedup_survives_restart(broker_factory: Any, raw: Any) -> None:
    b = broker_factory("--no-auto-create")
    r = raw(b)
    new_topic(r, "idem-restart")
    pid, epoch = init_producer_id(r)
    sent = []
    seq = 0
    for i in range(4):
        values = [f"r{i}-{j}".encode() for j in range(2)]
        err, base = send(r, "idem-restart", values, (pid, epoch, seq))
        assert err == NONE
        sent.append((values, seq, base))
        seq += 2
    for stop in (b.restart, lambda: (b.kill9(), b.start())):
        r.close()
        stop()
        r = raw(b)
        for values, s, base in sent[-2:]:
            assert send(r, "idem-restart", values, (pid, epoch, s)) == (NONE, base)
        err, _ = send(r, "idem-restart", [b"gap"], (pid, epoch, seq + 1))
        assert err == OUT_OF_ORDER_SEQUENCE_NUMBER
    assert len(log_values(r, "idem-restart")) == 8
    # New producer ids never repeat one handed out before the restart.
    assert init_producer_id(r)[0] != pid


# -- REST API ------------------------------------------------------------------------------


def _http(
    b: Any,
    method: str,
    path: str,
    body: bytes | None = None,
    content_type: str = "application/json",
) -> tuple[int, bytes, str]:
    req = urllib.request.Request(
        f"{b.http}{path}", method=method, data=body, headers={"Content-Type": content_type}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "")


REST_ERRORS = [
    ("POST", "/api/v1/topics", b"{not json", 400),
    ("POST", "/api/v1/topics", b"[1, 2]", 400),
    ("POST", "/api/v1/topics", b"", 400),
    ("POST", "/api/v1/topics", b'{"name": 5}', 400),
    ("POST", "/api/v1/topics", b'{"name": "bad name!"}', 400),
    ("POST", "/api/v1/topics", b'{"name": "rest-x", "replication_factor": 3}', 400),
    ("POST", "/api/v1/topics", b'{"name": "rest-x", "configs": {"nope": "1"}}', 400),
    ("POST", "/api/v1/topics", b'{"name": "rest-x", "partitions": "many"}', 400),
    ("GET", "/api/v1/topics/ghost", None, 404),
    ("DELETE", "/api/v1/topics/ghost", None, 404),
    ("PATCH", "/api/v1/topics/ghost", b'{"partitions": 3}', 404),
    ("PATCH", "/api/v1/topics/rest-t", b"{oops", 400),
    ("PATCH", "/api/v1/topics/rest-t", b'{"partitions": 1}', 400),
    ("PATCH", "/api/v1/topics/rest-t", b'{"configs": {"nope": "1"}}', 400),
    ("POST", "/api/v1/topics/ghost/records", b'{"records": [{"value": "v"}]}', 404),
    ("POST", "/api/v1/topics/rest-t/records", b'{"records": [', 400),
    ("POST", "/api/v1/topics/rest-t/records", b'{"records": []}', 400),
    (
        "POST",
        "/api/v1/topics/rest-t/records",
        b'{"records": [{"value": "v", "partition": 9}]}',
        400,
    ),
    ("POST", "/api/v1/topics/rest-t/records", b'{"records": [7]}', 400),
    ("GET", "/api/v1/topics/ghost/partitions/0/records", None, 404),
    ("GET", "/api/v1/topics/rest-t/partitions/9/records", None, 404),
    ("GET", "/api/v1/topics/rest-t/partitions/x/records", None, 400),
    ("GET", "/api/v1/topics/rest-t/partitions/0/records?offset=99", None, 416),
    ("GET", "/api/v1/topics/rest-t/partitions/0/records?offset=abc", None, 400),
    ("GET", "/api/v1/groups/ghost-group", None, 404),
    ("DELETE", "/api/v1/groups/ghost-group", None, 404),
]


@pytest.fixture(scope="module")
def rest_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    b = _module_broker(tmp_path_factory, "rest", "--no-auto-create")
    status, body, _ = _http(b, "POST", "/api/v1/topics", b'{"name": "rest-t", "partitions": 2}')
    assert status == 201, body
    yield b
    b.stop()


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    REST_ERRORS,
    ids=[f"{m}-{p}-{i}" for i, (m, p, _b, _s) in enumerate(REST_ERRORS)],
)
def test_rest_errors_are_json(
    rest_broker: Any, method: str, path: str, body: bytes | None, status: int
) -> None:
    got, payload, ctype = _http(rest_broker, method, path, body)
    assert got == status, payload[:300]
    assert ctype.startswith("application/json"), ctype
    doc = json.loads(payload)
    assert isinstance(doc, dict) and isinstance(doc.get("error"), str) and doc["error"]


def test_rest_errors_leave_no_trace(rest_broker: Any) -> None:
    _status, payload, _ = _http(rest_broker, "GET", "/api/v1/topics")
    names = [t["name"] for t in json.loads(payload)["topics"]]
    assert "rest-x" not in names and "ghost" not in names
    _status, payload, _ = _http(rest_broker, "GET", "/api/v1/topics/rest-t")
    topic = json.loads(payload)
    assert len(topic["partitions"]) == 2
    assert all(p["high_watermark"] == 0 for p in topic["partitions"])


def test_list_config_resources_lists_what_has_configs_and_refuses_the_rest(
    strict_broker: Any, raw: Any
) -> None:
    """ListConfigResources (KIP-1142; v0 ListClientMetricsResources), what `kafka-configs
    --describe --entity-type X` without a name and `kafka-client-metrics --list` send: the
    topics and brokers, no client-metrics subscriptions (KIP-714 is not supported, so
    there are none); a type that has no configs here (BROKER_LOGGER, 8) is refused with
    INVALID_REQUEST at once rather than answered with an empty list."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": strict_broker.bootstrap})
    admin.create_topics([NewTopic("listed-configs", 1, 1)])["listed-configs"].result(30)
    r = raw(strict_broker)
    m = kio_module("list_config_resources", 1)
    res = r.call(m.ListConfigResourcesRequest(resource_types=()))
    listed = {(int(c.resource_type), c.resource_name) for c in res.config_resources}
    assert code(res) == NONE
    assert (2, "listed-configs") in listed and any(t == 4 for t, _ in listed), listed
    assert not any(t == 16 for t, _ in listed)
    only_topics = r.call(m.ListConfigResourcesRequest(resource_types=(2,)))
    assert {int(c.resource_type) for c in only_topics.config_resources} == {2}
    metrics = r.call(m.ListConfigResourcesRequest(resource_types=(16,)))
    assert (code(metrics), metrics.config_resources) == (NONE, ())
    loggers = r.call(m.ListConfigResourcesRequest(resource_types=(8,)))
    assert (code(loggers), loggers.config_resources) == (ErrorCode.invalid_request, ())
    v0 = kio_module("list_config_resources", 0)
    old = r.call(v0.ListConfigResourcesRequest())
    assert (code(old), old.config_resources) == (NONE, ())
