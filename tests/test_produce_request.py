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

from straitmq.protocol.codec import ProtocolError, parse_request, request_schema
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
        header, got = parse_request(frame, 0, version)
        assert header.correlation_id == 77 and header.api_version == version
        assert (got.transactional_id, got.acks, got.timeout) == (
            body.transactional_id,
            body.acks,
            body.timeout,
        )
        assert as_bytes(got) == as_bytes(body) and type(got) is schema
        for t in got.topic_data:
            for p in t.partition_data:
                if p.records is not None:
                    assert isinstance(p.records, memoryview) and p.records.obj is frame.obj


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
