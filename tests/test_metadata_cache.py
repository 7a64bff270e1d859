"""Metadata answers are cached per topic and response version (api/metadata.py
TopicAnswers): every change a record makes must show in the very next answer, for old
and new protocol versions alike. Real clients against a real broker."""

from __future__ import annotations

import struct

from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic


def partitions_seen(admin: AdminClient, topic: str) -> int | None:
    md = admin.list_topics(topic, timeout=10).topics[topic]
    return None if md.error is not None else len(md.partitions)


def metadata_v1_partitions(host: str, port: int, topic: str) -> int:
    """Metadata v1 (non-flexible), by hand: the partition count of `topic`."""
    import socket

    name = topic.encode()
    body = struct.pack(">hhih", 3, 1, 7, 4) + b"test" + struct.pack(">ih", 1, len(name)) + name
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", _read(s, 4))[0]
        data = _read(s, size)
    pos = 4  # correlation id
    (brokers,) = struct.unpack_from(">i", data, pos)
    pos += 4
    for _ in range(brokers):
        pos += 4  # node id
        (hl,) = struct.unpack_from(">h", data, pos)
        pos += 2 + hl + 4  # host, port
        (rl,) = struct.unpack_from(">h", data, pos)
        pos += 2 + max(rl, 0)  # rack (nullable)
    pos += 4  # controller id
    (topics,) = struct.unpack_from(">i", data, pos)
    assert topics == 1
    pos += 4
    (err,) = struct.unpack_from(">h", data, pos)
    pos += 2
    (nl,) = struct.unpack_from(">h", data, pos)
    pos += 2 + nl + 1  # name, is_internal
    (parts,) = struct.unpack_from(">i", data, pos)
    return -1 if err else parts


def _read(s, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "connection closed"
        buf += chunk
    return buf


def test_every_change_shows_in_the_next_answer_of_every_version(broker) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    host, port_s = broker.bootstrap.rsplit(":", 1)
    port = int(port_s)
    admin.create_topics([NewTopic("c", 2, 1)])["c"].result(30)
    # Both versions answer (and so fill the cache) before each change.
    assert partitions_seen(admin, "c") == 2 and metadata_v1_partitions(host, port, "c") == 2
    admin.create_partitions([NewPartitions("c", 5)])["c"].result(30)
    assert partitions_seen(admin, "c") == 5 and metadata_v1_partitions(host, port, "c") == 5
    admin.delete_topics(["c"])["c"].result(30)
    # Asking for it auto-creates it anew, with the broker's default of 1 partition.
    assert partitions_seen(admin, "c") == 1 and metadata_v1_partitions(host, port, "c") == 1
    admin.delete_topics(["c"])["c"].result(30)
    admin.create_topics([NewTopic("c", 3, 1)])["c"].result(30)
    assert partitions_seen(admin, "c") == 3 and metadata_v1_partitions(host, port, "c") == 3


def test_assembled_answers_are_the_bytes_kio_encodes_in_every_version() -> None:
    """The answer is spliced from cached per-topic bytes into an answer kio encoded
    without topics: byte for byte what kio encodes whole, for every Metadata version,
    with the fields that follow the topic array (v8-10 cluster operations, v9+ tagged
    fields) and the per-topic operations bits."""
    from straitmq.broker.api.context import RequestContext
    from straitmq.broker.api.metadata import _answer, _topic_entity

    from straitmq.protocol.build import build
    from straitmq.protocol.codec import encode_entity, encode_response, response_schema

    part = {
        "error_code": 0,
        "partition_index": 0,
        "leader_id": 2,
        "leader_epoch": 7,
        "replica_nodes": [2, 1, 3],
        "isr_nodes": [2, 1],
        "offline_replicas": [3],
    }
    topics = [
        {
            "error_code": 0,
            "name": "a",
            "topic_id": None,
            "is_internal": False,
            "partitions": [part, {**part, "partition_index": 1, "leader_id": -1}],
        },
        {"error_code": 3, "name": "gone", "topic_id": None, "partitions": []},
    ]
    for v in range(13):
        for count in (0, 1, 2):
            ctx = RequestContext(3, v, 1234 + v, "t", "/127.0.0.1")
            brokers = [
                {"node_id": 2, "host": "h", "port": 9092, "rack": "r"},
                {"node_id": 1, "host": "h1", "port": 9093, "rack": None},
            ]
            head = {"throttle_time": 0, "cluster_id": "cid", "controller_id": 2, "brokers": brokers}
            entries = [dict(t) for t in topics[:count]]
            if 8 <= v <= 10:
                head["cluster_authorized_operations"] = 0x5A
            if v >= 8 and entries:
                entries[0]["topic_authorized_operations"] = 0x1F8
            whole = encode_response(
                3, v, ctx.correlation_id, build(response_schema(3, v), {**head, "topics": entries})
            )
            parts = [encode_entity(_topic_entity(ctx, e)) for e in entries]
            raw = _answer(ctx, head, parts)
            got = b"".join(raw.pieces)  # type: ignore[arg-type]
            assert got == whole, (v, count)
            assert raw.size == len(got)


def test_hand_encoded_topics_are_the_bytes_kio_encodes_in_every_version() -> None:
    """encode_topic (the cached per-topic bytes) against kio's encoding of the same
    entry: leaders and none, offline replicas, an internal topic, a topic id, and a
    replica list longer than the packers prepared in advance."""
    import uuid

    from straitmq.broker.api.context import RequestContext
    from straitmq.broker.api.metadata import TopicAnswers, _topic_entity, encode_topic, topic_entry
    from straitmq.metadata.image import MetadataImage

    from straitmq.protocol.codec import encode_entity

    img = MetadataImage(cluster_id="c")
    for bid in range(1, 131):
        img.apply(
            {
                "type": "register_broker",
                "id": bid,
                "incarnation": "i",
                "host": "h",
                "port": 9000 + bid,
                "http_port": 1,
            }
        )
        if bid not in (3, 7):
            img.apply({"type": "unfence_broker", "id": bid})
    for name, internal in (("plain", False), ("__consumer_offsets", True)):
        img.apply(
            {"type": "topic", "name": name, "topic_id": str(uuid.uuid4()), "internal": internal}
        )
        layouts = [
            ([1, 2, 3], [1, 2], 1),
            ([3, 7], [3], -1),
            ([5], [5], 5),
            (list(range(1, 21)), list(range(20, 0, -1)), 9),
            ([30, 2], [2], 2),
        ]
        for i, (replicas, isr, leader) in enumerate(layouts):
            img.apply(
                {
                    "type": "partition",
                    "topic": name,
                    "index": i,
                    "replicas": replicas,
                    "isr": isr,
                    "leader": leader,
                }
            )
        img.apply({"type": "partition_change", "topic": name, "index": 0, "leader": 2})
    # 130 replicas: a count that takes two bytes in flexible versions (kio encodes it).
    img.apply({"type": "topic", "name": "wide", "topic_id": str(uuid.uuid4())})
    img.apply(
        {
            "type": "partition",
            "topic": "wide",
            "index": 0,
            "replicas": list(range(1, 131)),
            "isr": [1],
            "leader": 1,
        }
    )

    live = frozenset(i for i, b in img.brokers.items() if not b.fenced)
    answers = TopicAnswers()
    for v in range(13):
        ctx = RequestContext(3, v, 1, "t", "/127.0.0.1")
        for name in img.topics:
            expected = encode_entity(_topic_entity(ctx, topic_entry(img, name)))
            assert answers.get(ctx, img, name) == expected, (v, name)
            if name != "wide":
                assert encode_topic(v, img.topics[name], live) == expected, (v, name)
