"""Metadata and DescribeCluster: answered from the metadata image.

Clients see the live (unfenced) brokers, each partition's leader, leader epoch,
replicas, ISR and offline replicas, exactly as the committed metadata says. The
"controller" clients see is a live broker: KRaft clusters hide the quorum from clients.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from straitmq.metadata.image import NO_LEADER, MetadataImage, TopicImage

from straitmq.errors import KafkaError
from straitmq.protocol.build import build, nested_schema
from straitmq.protocol.codec import encode_entity, encode_response, response_schema
from straitmq.protocol.varint import uvarint
from straitmq.security.acls import CLUSTER, CLUSTER_NAME, CREATE, DESCRIBE, TOPIC

from ..security.listeners import endpoint_for
from .context import RawResponse, RequestContext

if TYPE_CHECKING:
    from .deps import MetadataDeps

_I32 = struct.Struct(">i")


class TopicAnswers:
    """Each topic's part of the Metadata answer, encoded once per response version and
    reused until a record changes the topic or the set of live brokers (offline
    replicas depend on it). Clients ask for every topic they know (librdkafka does, and
    Metadata without topics means all): assembling 40,000 partitions from cached bytes
    is a join, and a topic that changed is encoded by hand (`encode_topic`), about ten
    times faster than through kio, as a fencing changes every topic at once."""

    def __init__(self) -> None:
        self.image: MetadataImage | None = None
        self.entries: dict[tuple[int, str], tuple[tuple[int, frozenset[int]], bytes]] = {}
        self._live: tuple[int, frozenset[int]] = (-1, frozenset())

    def get(self, ctx: RequestContext, image: MetadataImage, name: str) -> bytes:
        if self.image is not image or len(self.entries) > 4 * len(image.topics) + 1000:
            self.image, self.entries = image, {}  # a snapshot replaced it, or churn
            self._live = (-1, frozenset())
        if self._live[0] != image.brokers_version:
            live = frozenset(i for i, b in image.brokers.items() if not b.fenced)
            self._live = (image.brokers_version, live)
        live = self._live[1]
        key = (ctx.version, name)
        stamp = (image.topic_versions.get(name, 0), live)
        hit = self.entries.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        try:
            encoded = encode_topic(ctx.version, image.topics[name], live)
        except _TooWide:
            encoded = encode_entity(_topic_entity(ctx, topic_entry(image, name)))
        self.entries[key] = (stamp, encoded)
        return encoded


_I16 = struct.Struct(">h")


class _TooWide(Exception):
    pass


_MIN_INT32 = -(2**31)  # topic_authorized_operations when not asked for
# One packer per (version, replicas, ISR, offline replicas) shape: a partition is one
# pack call (its arrays' counts included), whatever the shape.
_PARTITION_PACKERS: dict[tuple[int, int, int, int], struct.Struct] = {}


def _partition_packer(v: int, nr: int, ni: int, no: int) -> struct.Struct:
    packer = _PARTITION_PACKERS.get((v, nr, ni, no))
    if packer is None:
        count = "B" if v >= 9 else "i"  # flexible: a one-byte varint below 127
        fmt = ">hii" + ("i" if v >= 7 else "") + f"{count}{nr}i{count}{ni}i"
        if v >= 5:
            fmt += f"{count}{no}i"
        if v >= 9:
            fmt += "B"  # no tagged fields
        packer = _PARTITION_PACKERS[(v, nr, ni, no)] = struct.Struct(fmt)
    return packer


def encode_topic(version: int, topic: TopicImage, live: frozenset[int]) -> bytes:
    """A known topic's entry in a Metadata answer (no error, no per-principal
    operations), as kio would encode it for `version`; `live` are the unfenced brokers.
    tests/test_metadata_cache.py checks it byte for byte against kio in every version."""
    v = version
    flexible = v >= 9
    raw = topic.name.encode()
    out = bytearray(b"\x00\x00")  # error code
    out += uvarint(len(raw) + 1) if flexible else _I16.pack(len(raw))
    out += raw
    if v >= 10:
        out += topic.topic_id.bytes
    if v >= 1:
        out.append(1 if topic.internal else 0)
    parts = topic.partitions
    out += uvarint(len(parts) + 1) if flexible else _I32.pack(len(parts))
    k = 1 if flexible else 0  # compact arrays count n + 1
    no_leader = ErrorCode.leader_not_available
    for i, p in enumerate(parts):
        replicas, isr, leader = p.replicas, p.isr, p.leader
        if len(replicas) >= 127 or len(isr) >= 127:
            raise _TooWide  # a two-byte count: left to kio
        offline = [r for r in replicas if r not in live] if v >= 5 else []
        fields: list[int] = [no_leader if leader == NO_LEADER else 0, i, leader]
        if v >= 7:
            fields.append(p.leader_epoch)
        fields.append(len(replicas) + k)
        fields += replicas
        fields.append(len(isr) + k)
        fields += isr
        if v >= 5:
            fields.append(len(offline) + k)
            fields += offline
        if flexible:
            fields.append(0)
        out += _partition_packer(v, len(replicas), len(isr), len(offline)).pack(*fields)
    if v >= 8:
        out += _I32.pack(_MIN_INT32)
    if flexible:
        out.append(0)
    return bytes(out)


def _topic_entity(ctx: RequestContext, entry: dict) -> Any:
    return build(nested_schema(response_schema(3, ctx.version), "topics"), entry)


def _answer(ctx: RequestContext, head: dict, topics: list[bytes]) -> RawResponse:
    """The whole answer: kio encodes everything but the topics (an answer with none),
    and the topics' bytes go where that answer's empty array is. What follows the array
    is fixed by the version: v8-10's cluster operations, v9+'s empty tagged fields."""
    v = ctx.version
    flexible = v >= 9
    empty = encode_response(
        3, v, ctx.correlation_id, build(response_schema(3, v), {**head, "topics": ()})
    )
    tail = (4 if 8 <= v <= 10 else 0) + (1 if flexible else 0)
    at = len(empty) - tail - (1 if flexible else 4)
    count = uvarint(len(topics) + 1) if flexible else _I32.pack(len(topics))
    size = sum(map(len, topics))
    out = RawResponse()
    prefix = _I32.pack(at - 4 + len(count) + size + tail) + empty[4:at] + count
    out.add(prefix, len(prefix))
    for t in topics:
        out.add(t, len(t))
    out.add(empty[len(empty) - tail :], tail)
    return out


def _brokers(deps: MetadataDeps, ctx: RequestContext, key: str = "node_id") -> list[dict]:
    """The live brokers' endpoints on the listener this client came in on; brokers
    without that listener are left out, as Kafka does."""
    live = []
    for b in sorted(deps.metadata.image.brokers.values(), key=lambda b: b.id):
        ep = endpoint_for(b, ctx.listener) if not b.fenced else None
        if ep is not None:
            live.append({key: b.id, "host": ep[0], "port": ep[1], "rack": b.rack})
    if not live:
        # Never zero brokers (librdkafka takes that as a partial response and stalls):
        # when the image shows every broker fenced, this one still answers.
        c = deps.config
        host, port = c.advertised_host, c.advertised_port
        for ln in deps.listeners:
            if ln.name == ctx.listener:
                host, port = ln.spec.advertised_host, ln.spec.advertised_port
        live = [{key: c.node_id, "host": host, "port": port, "rack": c.rack}]
    return live


def _controller_id(deps: MetadataDeps) -> int:
    live = [b.id for b in deps.metadata.image.live_brokers()]
    node_id = deps.config.node_id
    return node_id if node_id in live or not live else min(live)


def topic_entry(image: MetadataImage, name: str) -> dict:
    topic = image.topics.get(name)
    if topic is None:
        return {
            "error_code": ErrorCode.unknown_topic_or_partition,
            "name": name,
            "topic_id": None,
            "is_internal": False,
            "partitions": [],
        }
    parts = []
    for i, p in enumerate(topic.partitions):
        offline = [r for r in p.replicas if (b := image.brokers.get(r)) is None or b.fenced]
        parts.append(
            {
                "error_code": ErrorCode.leader_not_available if p.leader == NO_LEADER else 0,
                "partition_index": i,
                "leader_id": p.leader,
                "leader_epoch": p.leader_epoch,
                "replica_nodes": p.replicas,
                "isr_nodes": p.isr,
                "offline_replicas": offline,
            }
        )
    return {
        "error_code": 0,
        "name": name,
        "topic_id": topic.topic_id,
        "is_internal": topic.internal,
        "partitions": parts,
    }


async def handle_metadata(deps: MetadataDeps, ctx: RequestContext, req: Any) -> RawResponse:
    metadata = deps.metadata
    if req.topics is None:
        names = list(metadata.image.topics)
    else:
        names = [t.name for t in req.topics if t.name is not None]
    allow_auto = getattr(req, "allow_auto_topic_creation", True)
    with_operations = getattr(req, "include_topic_authorized_operations", False)  # v8+
    topics: list[bytes] = []

    def add_known(name: str) -> None:
        if not with_operations:
            topics.append(deps.answers.get(ctx, metadata.image, name))
            return
        # Per principal, so not cached.
        entry = topic_entry(metadata.image, name)
        entry["topic_authorized_operations"] = ctx.authorized_operations(TOPIC, name)
        topics.append(encode_entity(_topic_entity(ctx, entry)))

    def add_error(entry: dict) -> None:
        topics.append(encode_entity(_topic_entity(ctx, entry)))

    if req.topics is not None and any(t.name is None for t in req.topics):
        # v10+ asks by topic id (librdkafka does for the ids of a KIP-848 assignment).
        # Kafka answers UNKNOWN_TOPIC_ID for an id it does not know or the principal
        # may not DESCRIBE (so the answer does not tell which ids exist).
        for t in req.topics:
            if t.name is not None:
                continue
            name = metadata.image.topic_name(getattr(t, "topic_id", None))
            if name is not None and ctx.allowed(DESCRIBE, TOPIC, name):
                add_known(name)
            else:
                add_error(
                    {
                        "error_code": ErrorCode.unknown_topic_id,
                        "name": None,
                        "topic_id": t.topic_id,
                        "partitions": [],
                    }
                )
    for name in names:
        # Kafka: all topics lists only those the principal may DESCRIBE; a named topic
        # it may not is TOPIC_AUTHORIZATION_FAILED, whether it exists or not.
        if not ctx.allowed(DESCRIBE, TOPIC, name):
            if req.topics is not None:
                add_error(_refused(name))
            continue
        if name not in metadata.image.topics and req.topics is not None:
            if allow_auto and deps.config.auto_create_topics:
                if not ctx.cluster_allowed(CREATE) and not ctx.allowed(CREATE, TOPIC, name):
                    add_error(_refused(name))
                    continue
                try:
                    await deps.control("create_topic", {"name": name})
                except KafkaError as e:
                    if e.code != ErrorCode.topic_already_exists:  # a concurrent create won
                        add_error(
                            {"error_code": e.code, "name": name, "topic_id": None, "partitions": []}
                        )
                        continue
        if name in metadata.image.topics:
            add_known(name)
        else:
            add_error(topic_entry(metadata.image, name))
    head = {
        "throttle_time": 0,
        "brokers": _brokers(deps, ctx),
        "cluster_id": metadata.image.cluster_id,
        "controller_id": _controller_id(deps),
    }
    if getattr(req, "include_cluster_authorized_operations", False):  # v8-10
        head["cluster_authorized_operations"] = ctx.authorized_operations(CLUSTER, CLUSTER_NAME)
    return _answer(ctx, head, topics)


def _refused(name: str) -> dict:
    return {
        "error_code": ErrorCode.topic_authorization_failed,
        "name": name,
        "topic_id": None,
        "is_internal": False,
        "partitions": [],
    }


async def handle_describe_cluster(deps: MetadataDeps, ctx: RequestContext, req: Any) -> dict:
    # endpoint_type 2 (controllers, `--bootstrap-controller`): the controllers serve HTTP
    # only, and every broker answers the controller APIs (DescribeQuorum, AddRaftVoter,
    # ...) by asking the active one, so the brokers are the controller endpoints.
    endpoint_type = getattr(req, "endpoint_type", 1)
    return {
        "throttle_time": 0,
        "error_code": 0,
        "error_message": None,
        "endpoint_type": endpoint_type if endpoint_type in (1, 2) else 1,
        "cluster_id": deps.metadata.image.cluster_id,
        "controller_id": _controller_id(deps),
        "brokers": _brokers(deps, ctx, "broker_id"),
        **(
            {"cluster_authorized_operations": ctx.authorized_operations(CLUSTER, CLUSTER_NAME)}
            if req.include_cluster_authorized_operations
            else {}
        ),
    }
