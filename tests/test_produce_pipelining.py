"""acks=all Produce requests pipelined on one connection (issue 13, point 3): while one
waits for its in-sync replicas the next is appended already, and the answers still come
back in request order, with any other request answered after them."""

from __future__ import annotations

import datetime
import signal
import socket
import struct
from types import SimpleNamespace

import pytest
from cluster_support import BROKER_ARGS, CONTROLLER_ARGS, cluster_factory, wait_for
from conftest import record_batch
from kio.index import load_response_schema
from kio.serial import entity_reader
from test_errors import Raw, kio_module, make

VERSION = 9


@pytest.fixture
def cluster(tmp_path):
    yield from cluster_factory(tmp_path)


def _replace(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


def _produce(records: bytes, acks: int) -> object:
    m = kio_module("produce", VERSION)
    return make(
        m.ProduceRequest,
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=60),
        topic_data=(
            make(
                m.TopicProduceData,
                name="pipe",
                partition_data=(make(m.PartitionProduceData, index=0, records=records),),
            ),
        ),
    )


def _peek(raw: Raw) -> bytes:
    """What the broker has answered so far, left unread."""
    try:
        return raw.sock.recv(256, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return b""


def test_acks_all_produces_on_one_connection_replicate_together_in_order(cluster) -> None:
    # Frozen followers must stay in the ISR for the whole test: long session and lag.
    c = cluster(
        controller_args=_replace(CONTROLLER_ARGS, "--broker-session-timeout-ms", "60000"),
        broker_args=_replace(BROKER_ARGS, "--replica-lag-time-max-ms", "60000"),
    )
    c.create_topic("pipe", partitions=1, rf=3, min_isr=2)
    leader = c.leader_of("pipe", 0)
    lead = c.brokers[leader]

    def leo() -> int:
        return lead.get("/api/v1/topics/pipe")["partitions"][0]["log_end_offset"]

    def own_view() -> dict:  # {} until the leader has the topic in its own metadata
        topic = lead.get("/api/v1/topics/pipe")
        return topic["partitions"][0] if topic else {}

    # The leader must know it leads before the followers freeze: the ISR seen by another
    # broker may be ahead of the leader's own view, and a Produce it is not yet leader for
    # would be refused, never appended.
    wait_for(
        lambda: own_view().get("local") == "leader" and len(own_view().get("isr", ())) == 3,
        20,
        "the leader's own view: leader with a full ISR",
    )
    raw = Raw(SimpleNamespace(port=lead.kafka_port))
    try:
        base = leo()
        followers = [n for b, n in c.brokers.items() if b != leader]
        for n in followers:
            n.signal(signal.SIGSTOP)
        try:
            # A and B wait for replication; C (acks=1) and the Metadata request are
            # answered only after them.
            raw.send(_produce(record_batch([b"a0", b"a1", b"a2"]), -1))
            raw.send(_produce(record_batch([b"b0", b"b1"]), -1))
            raw.send(_produce(record_batch([b"c0"]), 1))
            meta = kio_module("metadata", 12)
            raw.send(
                make(
                    meta.MetadataRequest,
                    topics=None,
                    allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False,
                )
            )
            # B and C are in the leader's log while A still waits for the frozen ISR.
            wait_for(
                lambda: leo() == base + 6 or None,
                20,
                "B and C appended behind A",
                detail=lambda: f"leader's view {own_view()}, answers so far {_peek(raw)!r}",
            )
            raw.sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                raw.sock.recv(1)  # no answer yet: A cannot be confirmed
        finally:
            for n in followers:
                n.signal(signal.SIGCONT)
        raw.sock.settimeout(30)
        answers = []
        for _ in range(4):
            (size,) = struct.unpack(">i", raw._recv(4))
            answers.append(raw._recv(size))
        assert [struct.unpack_from(">i", a)[0] for a in answers] == [1, 2, 3, 4]
        schema = load_response_schema(0, VERSION)
        offsets = []
        for payload in answers[:3]:
            _, pos = entity_reader(schema.__header_schema__)(payload, 0)
            resp, _ = entity_reader(schema)(payload, pos)
            part = resp.responses[0].partition_responses[0]
            assert int(part.error_code) == 0, part
            offsets.append(part.base_offset)
        assert offsets == [base, base + 3, base + 5]
        mschema = load_response_schema(3, 12)
        _, pos = entity_reader(mschema.__header_schema__)(answers[3], 0)
        md, _ = entity_reader(mschema)(answers[3], pos)
        assert len(md.brokers) == 3
        assert c.converge("pipe")[0] == base + 6
    finally:
        raw.close()
