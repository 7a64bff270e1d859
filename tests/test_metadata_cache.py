"""Metadata answers are cached per topic and response version (api/metadata.py
TopicEntities): every change a record makes must show in the very next answer, for old
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


def _read(s, n: int) -> bytes:  # type: ignore[no-untyped-def]
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        assert chunk, "connection closed"
        buf += chunk
    return buf


def test_every_change_shows_in_the_next_answer_of_every_version(broker) -> None:  # type: ignore[no-untyped-def]
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
