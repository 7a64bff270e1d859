"""Produce requests decoded with their record batches left in the frame
(straitmq/protocol/produce_request.py): the same entities as kio's reader, every
version the broker serves, records as memoryviews into the frame; what that reader
does not take goes to kio's, which answers as before."""

from __future__ import annotations

import datetime
import io
import random
import sys
from typing import Any

import pytest
from kio.serial import entity_writer

from straitmq.protocol.codec import (
    LARGE_PRODUCE_BYTES,
    ProtocolError,
    parse_request,
    request_schema,
)
from straitmq.protocol.produce_request import VERSIONS, NotDecoded, parse_produce


def encode(version: int, body: Any, client_id: str | None = "bench") -> memoryview:
    schema = request_schema(0, version)
    header = schema.__header_schema__
    buf = io.BytesIO()
    entity_writer(header)(
        buf,
        header(
            request_api_key=0, request_api_version=version, correlation_id=77, client_id=client_id
        ),
    )
    entity_writer(schema)(buf, body)
    return memoryview(buf.getvalue())


def sample(version: int, rng: random.Random) -> Any:
    schema = request_schema(0, version)
    mod = sys.modules[schema.__module__]
    topics = tuple(
        mod.TopicProduceData(
            name=f"topic-{t}-é",
            partition_data=tuple(
                mod.PartitionProduceData(
                    index=rng.randrange(1000),
                    records=None if rng.random() < 0.2 else rng.randbytes(rng.randrange(300)),
                )
                for _ in range(rng.randrange(4))
            ),
        )
        for t in range(rng.randrange(4))
    )
    return schema(
        transactional_id=rng.choice([None, "", "txn-1"]),
        acks=rng.choice([-1, 0, 1]),
        timeout=datetime.timedelta(milliseconds=rng.randrange(60_000)),
        topic_data=topics,
    )


def as_bytes(body: Any) -> list:
    return [
        (
            t.name,
            [(p.index, None if p.records is None else bytes(p.records)) for p in t.partition_data],
        )
        for t in body.topic_data
    ]


@pytest.mark.parametrize("version", list(VERSIONS))
def test_same_request_as_kio_with_records_left_in_the_frame(version: int) -> None:
    rng = random.Random(version)
    schema = request_schema(0, version)
    for _ in range(30):
        body = sample(version, rng)
        frame = encode(version, body, rng.choice([None, "client"]))
        kio_header, kio_body = parse_request(frame, 0, version)  # small: kio's reader
        correlation_id, client_id, got = parse_produce(frame, version, schema)
        assert (correlation_id, client_id) == (kio_header.correlation_id, kio_header.client_id)
        assert (got.transactional_id, got.acks, got.timeout) == (
            kio_body.transactional_id,
            kio_body.acks,
            kio_body.timeout,
        )
        assert as_bytes(got) == as_bytes(kio_body) == as_bytes(body) and type(got) is schema
        for t in got.topic_data:
            for p in t.partition_data:
                if p.records is not None:
                    assert isinstance(p.records, memoryview) and p.records.obj is frame.obj


def test_only_large_requests_take_the_python_reader() -> None:
    """It saves a copy of the batches but costs more per request than kio's native
    reader: a small request goes to kio, a large one keeps its batches in the frame."""
    schema = request_schema(0, 11)
    mod = sys.modules[schema.__module__]

    def request(size: int) -> memoryview:
        part = mod.PartitionProduceData(index=0, records=b"r" * size)
        topic = mod.TopicProduceData(name="t", partition_data=(part,))
        timeout = datetime.timedelta(seconds=30)
        return encode(
            11, schema(transactional_id=None, acks=-1, timeout=timeout, topic_data=(topic,))
        )

    small, large = request(1000), request(LARGE_PRODUCE_BYTES)
    (small_records,) = [
        p.records for t in parse_request(small, 0, 11)[1].topic_data for p in t.partition_data
    ]
    (large_records,) = [
        p.records for t in parse_request(large, 0, 11)[1].topic_data for p in t.partition_data
    ]
    assert type(small_records) is bytes
    assert isinstance(large_records, memoryview) and large_records.obj is large.obj
    assert bytes(large_records) == b"r" * LARGE_PRODUCE_BYTES


@pytest.mark.parametrize("version", [3, 9, 12])
def test_malformed_frames_go_to_kio_which_refuses_them(version: int) -> None:
    rng = random.Random(1)
    frame = encode(version, sample(version, rng))
    for cut in range(8, len(frame) - 1, 3):
        truncated = memoryview(bytes(frame[:cut]))
        with pytest.raises(NotDecoded):
            parse_produce(truncated, version, request_schema(0, version))
        try:
            parse_request(truncated, 0, version)
        except ProtocolError:
            pass  # as before: kio's reader says what is wrong
