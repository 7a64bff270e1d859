"""Produce requests decoded with their record batches left in the frame
(straitmq/protocol/produce_request.py): the same entities as kio's reader, every
version the broker serves, records as memoryviews into the frame; what that reader
does not take goes to kio's, which answers as before. And Produce answers written
straight from the handler's dict (straitmq/protocol/produce_response.py): the same
bytes as `build` and kio's writer, every version the broker serves."""

from __future__ import annotations

import datetime
import io
import random
import sys
from typing import Any

import pytest
from kio.serial import entity_writer

from straitmq.protocol.build import build
from straitmq.protocol.codec import (
    LARGE_PRODUCE_BYTES,
    ProtocolError,
    encode_response,
    parse_request,
    request_schema,
    response_schema,
)
from straitmq.protocol.produce_request import VERSIONS, NotDecoded, parse_produce
from straitmq.protocol.produce_response import encode_produce_response


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


def answer_sample(rng: random.Random) -> dict:
    """A Produce answer as handle_produce builds it: any topics, partitions, errors."""

    def partition() -> dict:
        errors = [
            {
                "batch_index": rng.randrange(10),
                "batch_index_error_message": rng.choice([None, "", "bad é"]),
            }
            for _ in range(rng.choice([0, 0, 1, 3]))
        ]
        return {
            "index": rng.randrange(2**31),
            "error_code": rng.choice([0, 0, 6, 7, 87]),
            "base_offset": rng.choice([-1, 0, rng.randrange(2**62)]),
            "log_append_time": None,
            "log_start_offset": rng.choice([-1, 0, rng.randrange(2**40)]),
            "record_errors": errors,
            "error_message": rng.choice(
                [None, None, "", "the ISR shrank é" * rng.randrange(1, 20)]
            ),
        }

    return {
        "responses": [
            {
                "name": rng.choice(["t", "topic-é", "x" * 200]),
                "partition_responses": [partition() for _ in range(rng.randrange(4))],
            }
            for _ in range(rng.choice([0, 1, 1, 2, 5]))
        ],
        "throttle_time": rng.choice([0, 0, 1, 30_000]),
    }


def generic_answer(version: int, correlation_id: int, answer: dict) -> bytes:
    return encode_response(0, version, correlation_id, build(response_schema(0, version), answer))


@pytest.mark.parametrize("version", list(VERSIONS))
def test_produce_answer_written_directly_is_the_generic_encoders(version: int) -> None:
    rng = random.Random(1000 + version)
    for _ in range(60):
        answer = answer_sample(rng)
        correlation_id = rng.randrange(-(2**31), 2**31)
        assert encode_produce_response(version, correlation_id, answer) == generic_answer(
            version, correlation_id, answer
        )


def test_produce_answer_with_other_fields_goes_the_generic_way() -> None:
    """A log append time, KIP-951's current leader or node endpoints, an entity instead
    of a dict, or a version outside 3-12: not written here (None), so the listener uses
    `build` and kio's writer, which know every field."""
    base = answer_sample(random.Random(5))
    base["responses"] = [{"name": "t", "partition_responses": [{"index": 0, "base_offset": 1}]}]
    assert encode_produce_response(12, 1, base) == generic_answer(12, 1, base)
    part = base["responses"][0]["partition_responses"][0]
    for key, value in (
        ("log_append_time", 1_700_000_000_000),
        ("current_leader", {"leader_id": 2, "leader_epoch": 3}),
    ):
        assert (
            encode_produce_response(
                12,
                1,
                {
                    **base,
                    "responses": [{"name": "t", "partition_responses": [{**part, key: value}]}],
                },
            )
            is None
        )
    assert encode_produce_response(12, 1, {**base, "node_endpoints": []}) is None
    assert encode_produce_response(2, 1, base) is None
    assert encode_produce_response(13, 1, base) is None
