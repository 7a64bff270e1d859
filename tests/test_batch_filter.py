"""The log cleaner's record-level batch filter (storage/batch_filter.py) and the produce
path's refusal of keyless records to compacted topics.

Batches come from a real client's encoder (kafka-python's DefaultRecordBatchBuilder) and
rebuilt ones are read back by its DefaultRecordBatch, the reader real clients share the
format with.
"""

from __future__ import annotations

import asyncio
import datetime
import random
import struct
import uuid
from pathlib import Path
from typing import Any

import cramjam
import lz4.frame
import pytest
from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kio.schema.produce import v3 as produce_v3
from kio.schema.produce import v9 as produce_v9
from straitmq.broker import partition_write
from straitmq.broker.api.context import RequestContext
from straitmq.broker.api.produce import handle_produce
from straitmq.broker.metrics import BrokerMetrics
from straitmq.broker.partition_write import PartitionWriter
from straitmq.broker.partitions import PartitionManager
from straitmq.broker.storage.batch_filter import (
    ATTR_DELETE_HORIZON,
    ParsedBatch,
    compress,
    decompress,
    first_keyless,
    parse_batch,
    rebuild_batch,
)
from straitmq.metadata.image import MetadataImage

from straitmq.protocol.build import build
from straitmq.protocol.codec import response_schema

CODECS = [0, 1, 2, 3, 4]  # none, gzip, snappy, lz4, zstd
CODEC_IDS = ["none", "gzip", "snappy", "lz4", "zstd"]
BASE_OFFSET = 1_000_000
LEADER_EPOCH = 7

Rec = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def client_batch(
    records: list[Rec],
    codec: int = 0,
    producer: tuple[int, int, int] = (-1, -1, -1),
    transactional: bool = False,
    base_offset: int = BASE_OFFSET,
) -> bytes:
    """A batch as kafka-python's producer encodes it; `records` are (offset delta,
    timestamp, key, value, headers). Base offset and leader epoch are set as the broker
    sets them (outside the CRC)."""
    pid, epoch, seq = producer
    b = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        batch_size=1 << 26,
    )
    for delta, ts, key, value, headers in records:
        assert b.append(delta, timestamp=ts, key=key, value=value, headers=headers) is not None
    data = bytearray(b.build())
    struct.pack_into(">q", data, 0, base_offset)
    struct.pack_into(">i", data, 12, LEADER_EPOCH)
    return bytes(data)


def patch(batch: bytes, fmt: str, at: int, *values: Any) -> bytes:
    """`batch` with a header field changed and its CRC made right again."""
    data = bytearray(batch)
    struct.pack_into(fmt, data, at, *values)
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    return bytes(data)


def read_back(batch: bytes) -> tuple[DefaultRecordBatch, list[tuple]]:
    rb = DefaultRecordBatch(batch)
    assert rb.validate_crc()
    return rb, [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in rb]


def sample(n: int = 300, seed: int = 1) -> list[Rec]:
    rnd = random.Random(seed)
    out: list[Rec] = []
    delta = 0
    for i in range(n):
        key = None if i % 11 == 5 else b"key-%d" % rnd.randrange(40)
        value = None if i % 7 == 3 else rnd.randbytes(rnd.choice((0, 5, 70, 300)))
        headers = [(f"h{j}", None if j == 1 else b"v%d" % i) for j in range(i % 3)]
        out.append((delta, 1_700_000_000_000 + rnd.randrange(-5000, 90_000), key, value, headers))
        delta += rnd.choice((1, 1, 1, 2, 70))  # gaps, as a cleaned batch has
    return out


# -- round trip through a real client's encoder and reader -----------------------------


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_parse_and_rebuild_round_trip_every_codec(codec: int) -> None:
    recs = sample()
    raw = client_batch(recs, codec, producer=(4242, 3, 100))
    p = parse_batch(raw)
    assert (p.codec, p.base_offset, p.partition_leader_epoch) == (codec, BASE_OFFSET, LEADER_EPOCH)
    assert (p.producer_id, p.producer_epoch, p.base_sequence) == (4242, 3, 100)
    assert p.last_offset_delta == recs[-1][0] and not p.transactional and not p.control
    assert p.delete_horizon_ms is None
    _, original = read_back(raw)
    assert [(r.offset, r.timestamp, r.key, r.tombstone) for r in p.records] == [
        (o, ts, k, v is None) for o, ts, k, v, _h in original
    ]
    # The spans cover the body exactly, one record after the other.
    assert p.records[0].start == 0 and p.records[-1].end == len(p.body)
    assert all(a.end == b.start for a, b in zip(p.records, p.records[1:], strict=False))

    kept = [i for i in range(len(recs)) if i % 3 != 1]
    out = rebuild_batch(p, kept)
    rb, got = read_back(out)
    assert got == [original[i] for i in kept]
    assert rb.compression_type == codec
    assert (rb.base_offset, rb.last_offset_delta) == (BASE_OFFSET, recs[-1][0])
    assert rb.leader_epoch == LEADER_EPOCH and rb.records_count == len(kept)
    assert (rb.producer_id, rb.producer_epoch, rb.base_sequence) == (4242, 3, 100)
    assert rb.first_timestamp == p.base_timestamp  # unchanged: the record bytes reused
    assert rb.max_timestamp == max(original[i][1] for i in kept)
    assert [(r.offset, r.timestamp, r.key, r.tombstone) for r in parse_batch(out).records] == [
        (r.offset, r.timestamp, r.key, r.tombstone) for r in (p.records[i] for i in kept)
    ]

    # A delete horizon: the base timestamp holds it, every delta is re-encoded, and the
    # timestamps a reader sees do not change.
    horizon = 1_800_000_000_000
    out_h = rebuild_batch(p, kept, delete_horizon_ms=horizon)
    rb_h, got_h = read_back(out_h)
    assert got_h == got
    assert rb_h.attributes & ATTR_DELETE_HORIZON and rb_h.first_timestamp == horizon
    assert rb_h.compression_type == codec
    ph = parse_batch(out_h)
    assert ph.delete_horizon_ms == horizon
    # Cleaned again without a new horizon: the old one stays, bytes as they are.
    again = rebuild_batch(ph, [0, len(kept) - 1])
    rb_a, got_a = read_back(again)
    assert rb_a.attributes & ATTR_DELETE_HORIZON and rb_a.first_timestamp == horizon
    assert got_a == [got[0], got[-1]]
    # ... and a new horizon replaces it.
    newer = rebuild_batch(ph, [1], delete_horizon_ms=horizon + 5)
    assert parse_batch(newer).delete_horizon_ms == horizon + 5
    assert read_back(newer)[1] == [got[1]]


def test_keeping_everything_uncompressed_gives_back_the_same_bytes() -> None:
    raw = client_batch(sample(50))
    p = parse_batch(raw)
    assert rebuild_batch(p, range(50)) == raw


def test_framing_is_what_java_clients_read() -> None:
    """LZ4: Kafka's Lz4BlockInputStream refuses dependent blocks and reads 64 KiB blocks;
    snappy: snappy-java's stream framing (xerial) in 32 KiB blocks, as the Java producer
    writes it. Bodies large and incompressible enough for several blocks, some stored."""
    rnd = random.Random(5)
    recs: list[Rec] = [(i, 1000 + i, b"k%d" % i, rnd.randbytes(9000), []) for i in range(40)]
    recs += [(40 + i, 2000, b"z%d" % i, b"a" * 9000, []) for i in range(40)]
    raw = client_batch(recs, 0)
    p = parse_batch(raw)
    assert len(p.body) > 3 * 65536
    kept = list(range(0, 80, 1))
    for codec in (3, 2):
        out = rebuild_batch(ParsedBatch(**{**_fields(p), "attributes": codec}), kept)
        payload = out[61:]
        if codec == 3:
            assert payload[:7] == b"\x04\x22\x4d\x18\x60\x40\x82"  # FLG, BD, descriptor checksum
            info = lz4.frame.get_frame_info(payload)
            assert not info["block_linked"] and not info["content_checksum"]
            assert info["block_size"] == 65536 and info["content_size"] == 0
            assert lz4.frame.decompress(payload) == p.body
            # Every block (length LE, high bit = stored) holds at most 64 KiB.
            pos, stored = 7, 0
            while (n := int.from_bytes(payload[pos : pos + 4], "little")) != 0:
                stored += bool(n & 0x80000000)
                pos += 4 + (n & 0x7FFFFFFF)
            assert stored >= 1 and pos + 4 == len(payload)
        else:
            assert payload[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
            pos, blocks = 16, 0
            while pos < len(payload):
                n = int.from_bytes(payload[pos : pos + 4], "big")
                pos += 4 + n
                blocks += 1
            assert blocks == -(-len(p.body) // 32768)
        assert read_back(out)[1] == read_back(raw)[1]


def _fields(p: ParsedBatch) -> dict[str, Any]:
    return {f: getattr(p, f) for f in ParsedBatch.__dataclass_fields__}


def test_raw_snappy_and_control_and_transactional_bits() -> None:
    raw = client_batch(sample(20), 0, producer=(9, 1, 0), transactional=True)
    # A raw (unframed) snappy body, as some non-Java clients send it, is read too.
    body = parse_batch(raw).body
    snappy_raw = (
        raw[:21] + struct.pack(">h", 0x12) + raw[23:61] + bytes(cramjam.snappy.compress_raw(body))
    )
    snappy_raw = patch(snappy_raw, ">i", 8, len(snappy_raw) - 12)
    p = parse_batch(snappy_raw)
    assert p.codec == 2 and p.transactional and p.body == body
    # Control records (transaction markers: key version 0, type 1 = COMMIT).
    markers: list[Rec] = [
        (i, 5000 + i, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x07", []) for i in range(5)
    ]
    txn = client_batch(markers, 0, producer=(9, 1, -1), transactional=True)
    control = patch(txn, ">h", 21, 0x30 | 0x08)  # control + transactional + LogAppendTime
    pc = parse_batch(control)
    assert pc.control and pc.transactional
    # LogAppendTime: each record's timestamp is the batch's max timestamp.
    assert {r.timestamp for r in pc.records} == {pc.max_timestamp}
    out = rebuild_batch(pc, [2, 3])
    rb, got = read_back(out)
    assert [o for o, *_ in got] == [BASE_OFFSET + 2, BASE_OFFSET + 3]
    assert rb.is_control_batch and rb.is_transactional and rb.timestamp_type == 1
    assert rb.max_timestamp == pc.max_timestamp


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_empty_batch_as_kafka_writes_it(codec: int) -> None:
    """writeEmptyHeader: no records, uncompressed, base timestamp -1, the max timestamp,
    offsets, producer fields, transactional and control bits kept; no horizon bit."""
    raw = client_batch(sample(30), codec, producer=(77, 2, 500), transactional=True)
    p = parse_batch(raw)
    out = rebuild_batch(p, [], delete_horizon_ms=123)
    assert len(out) == 61
    (base, length, epoch, magic, _crc, attrs, lod, base_ts, max_ts, pid, pe, seq, count) = (
        struct.unpack(">qiibIhiqqqhii", out)
    )
    assert (base, length, epoch, magic, lod) == (
        BASE_OFFSET,
        49,
        LEADER_EPOCH,
        2,
        p.last_offset_delta,
    )
    assert (attrs, base_ts, max_ts, count) == (0x10, -1, p.max_timestamp, 0)
    assert (pid, pe, seq) == (77, 2, 500)
    rb, got = read_back(out)
    assert got == [] and rb.next_offset == BASE_OFFSET + p.last_offset_delta + 1
    e = parse_batch(out)
    assert e.records == [] and e.transactional and e.codec == 0


# -- property: random batches, random subsets -------------------------------------------


def test_random_batches_rebuild_to_exactly_the_kept_records() -> None:
    rnd = random.Random(20251127)
    codecs_seen: set[int] = set()
    for round_ in range(120):
        n = rnd.randint(1, 60)
        recs: list[Rec] = []
        delta = 0
        base_ts = rnd.randrange(0, 2**41)
        for _ in range(n):
            key = None if rnd.random() < 0.2 else rnd.randbytes(rnd.choice((0, 1, 63, 64, 200)))
            # Mostly compressible (a random pattern repeated), so the codecs are used.
            size = rnd.choice((0, 10, 300, 8200))
            value = None if rnd.random() < 0.2 else (rnd.randbytes(7) * 1200)[:size]
            headers = [
                (rnd.choice(("a", "trace", "é")), None if rnd.random() < 0.3 else rnd.randbytes(9))
                for _ in range(rnd.choice((0, 0, 1, 3)))
            ]
            ts = base_ts + rnd.randrange(-(2**33), 2**33)
            recs.append((delta, ts, key, value, headers))
            delta += rnd.choice((1, 1, 2, 64, 9000))
        codec = rnd.choice(CODECS)
        raw = client_batch(recs, codec, base_offset=rnd.randrange(0, 2**40))
        p = parse_batch(raw)
        codecs_seen.add(p.codec)  # kafka-python stores a batch that would grow uncompressed
        _, original = read_back(raw)
        for _ in range(3):
            kept = sorted(rnd.sample(range(n), rnd.randint(0, n)))
            horizon = rnd.choice((None, None, base_ts + rnd.randrange(-(2**30), 2**30)))
            out = rebuild_batch(p, kept, delete_horizon_ms=horizon)
            q = parse_batch(out)
            want = [p.records[i] for i in kept]
            assert [(r.offset, r.timestamp, r.key, r.tombstone) for r in q.records] == [
                (r.offset, r.timestamp, r.key, r.tombstone) for r in want
            ], (round_, codec, kept, horizon)
            assert q.base_offset == p.base_offset
            assert q.last_offset_delta == p.last_offset_delta
            assert read_back(out)[1] == [original[i] for i in kept]
            if kept:
                assert q.codec == p.codec
                assert q.max_timestamp == max(r.timestamp for r in want)
                assert q.delete_horizon_ms == horizon
            # Filtering a filtered batch again (the cleaner's next pass).
            if len(kept) > 1:
                sub = sorted(rnd.sample(range(len(kept)), rnd.randint(1, len(kept))))
                twice = parse_batch(rebuild_batch(q, sub))
                assert [r.offset for r in twice.records] == [want[i].offset for i in sub]
                assert twice.delete_horizon_ms == horizon
    assert codecs_seen == set(CODECS)


# -- corrupt input: ValueError, and nothing else ----------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_corrupt_batches_raise_value_error(codec: int) -> None:
    raw = client_batch(sample(40), codec)
    parse_batch(raw)
    # Any flipped byte under the CRC is caught; base offset and leader epoch are not
    # covered by it (the broker sets them), so flipping those still parses.
    for at in range(len(raw)):
        bad = bytearray(raw)
        bad[at] ^= 0x41
        if at < 8 or 12 <= at < 16:
            parse_batch(bytes(bad))
        else:
            with pytest.raises(ValueError):
                parse_batch(bytes(bad))
    for cut in (0, 10, 60, 61, len(raw) - 1):
        with pytest.raises(ValueError):
            parse_batch(raw[:cut])
    # A torn body with its length field and CRC made to agree: the records are short.
    torn = patch(raw[:-7], ">i", 8, len(raw) - 7 - 12)
    with pytest.raises(ValueError):
        parse_batch(torn)
    for count in (39, 41, 1000, -1):
        with pytest.raises(ValueError, match=r"record|count"):
            parse_batch(patch(raw, ">i", 57, count))
    with pytest.raises(ValueError, match="codec"):
        parse_batch(patch(raw, ">h", 21, 5))
    with pytest.raises(ValueError, match="magic"):
        parse_batch(patch(raw, ">b", 16, 1))


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_garbage_under_a_valid_crc_raises_value_error(codec: int) -> None:
    """Bytes changed inside the (compressed) body with the CRC recomputed: the codec or
    the record walk must notice, always as ValueError; first_keyless too."""
    rnd = random.Random(codec)
    raw = client_batch(sample(25), codec)
    body = parse_batch(raw).body
    for trial in range(300):
        if trial % 2:  # garbage in the compressed payload
            data = bytearray(raw)
            for _ in range(rnd.randint(1, 4)):
                data[rnd.randrange(61, len(data))] = rnd.randrange(256)
            bad = patch(bytes(data), ">i", 8, len(data) - 12)
        else:  # a well-compressed body whose records are garbage
            b = bytearray(body)
            for _ in range(rnd.randint(1, 4)):
                b[rnd.randrange(len(b))] = rnd.randrange(256)
            payload = compress(codec, bytes(b))
            bad = patch(raw[:61] + payload, ">i", 8, 61 + len(payload) - 12)
        for f in (parse_batch, first_keyless):
            try:
                f(bad)
            except ValueError:
                pass


def test_decompress_errors_and_unknown_codec() -> None:
    for codec in (1, 2, 3, 4):
        with pytest.raises(ValueError):
            decompress(codec, b"\x00\x01 not compressed at all")
    with pytest.raises(ValueError, match="unknown compression codec 6"):
        decompress(6, b"")
    with pytest.raises(ValueError, match="unknown compression codec"):
        compress(7, b"")


# -- first_keyless ---------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=CODEC_IDS)
def test_first_keyless(codec: int) -> None:
    ts = 1_700_000_000_000

    def batch(keys: list[bytes | None]) -> bytes:
        # Large timestamp deltas and offset deltas > 63: multi-byte varints to skip.
        return client_batch(
            [
                (i * 100, ts + i * 10**7, k, b"v" * i, [("h", b"x")] * (i % 2))
                for i, k in enumerate(keys)
            ],
            codec,
        )

    assert first_keyless(batch([b"a", b"b", b"", b"c"])) is None  # an empty key is a key
    assert first_keyless(batch([None, b"b"])) == 0
    assert first_keyless(batch([b"a", b"b", None, b"c", None])) == 200
    assert first_keyless(batch([b"x"] * 99 + [None])) == 9900
    assert first_keyless(memoryview(batch([b"a", None]))) == 100


# -- produce: keyless records to a compacted topic are refused --------------------------


def _image(policy: str | None) -> MetadataImage:
    image = MetadataImage()
    configs = {} if policy is None else {"cleanup.policy": policy}
    image.apply({"type": "topic", "name": "t", "topic_id": str(uuid.uuid4()), "configs": configs})
    image.apply(
        {"type": "partition", "topic": "t", "index": 0, "replicas": [1], "isr": [1], "leader": 1}
    )
    return image


def _writer(tmp_path: Path, policy: str | None) -> tuple[PartitionWriter, PartitionManager]:
    image = _image(policy)
    data_dir = tmp_path / (policy or "default").replace(",", "_")
    parts = PartitionManager(str(data_dir), {}, 1)
    parts.sync(image)
    return PartitionWriter(BrokerMetrics(), parts, lambda: image, lambda: True), parts


class _NoCoordinator:
    """The produce handler's transaction verifier, for requests without a transactional
    id: those never ask a coordinator (KIP-890 verifies transactional writes only)."""

    def verifying(self) -> bool:
        raise AssertionError("a non-transactional produce asked about verification")

    async def verify(self, *args: Any) -> dict:
        raise AssertionError("a non-transactional produce asked a coordinator")


def _produce(writer: PartitionWriter, batch: bytes, version: int = 9) -> Any:
    m = produce_v9 if version >= 8 else produce_v3
    req = m.request.ProduceRequest(
        transactional_id=None,
        acks=1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            m.request.TopicProduceData(
                name="t",
                partition_data=(m.request.PartitionProduceData(index=0, records=batch),),
            ),
        ),
    )
    ctx = RequestContext(
        api_key=0, version=version, correlation_id=1, client_id=None, client_host="/127.0.0.1"
    )
    answer = asyncio.run(handle_produce(writer, _NoCoordinator(), ctx, req))  # type: ignore[arg-type]
    assert isinstance(answer, dict)
    # What goes on the wire, through the real response builder of that version.
    wire = build(response_schema(0, version), answer)
    return wire.responses[0].partition_responses[0]


def keyed(*keys: bytes | None, codec: int = 0) -> bytes:
    return client_batch(
        [(i, 1_700_000_000_000, k, b"value-%d" % i, []) for i, k in enumerate(keys)],
        codec,
        base_offset=0,
    )


@pytest.mark.parametrize("policy", ["compact", "compact,delete", "delete,compact"])
def test_keyless_records_to_a_compacted_topic_are_refused(tmp_path: Path, policy: str) -> None:
    writer, parts = _writer(tmp_path, policy)
    log = parts.get("t", 0)
    assert log is not None and log.log.config.compact
    ok = _produce(writer, keyed(b"a", b"b"))
    assert (ok.error_code, ok.base_offset, ok.record_errors) == (0, 0, ())
    why = "Compacted topic cannot accept message without key in topic partition t-0"
    for codec in CODECS:
        p = _produce(writer, keyed(b"a", None, b"c", None, codec=codec))
        assert p.error_code == 87 and p.base_offset == -1  # INVALID_RECORD
        assert [(e.batch_index, e.batch_index_error_message) for e in p.record_errors] == [
            (1, why),
            (3, why),
        ]
        assert p.error_message == (
            "One or more records have been rejected due to 2 record errors in total, and only "
            f"showing the first three errors at most: [RecordError(batchIndex=1, message='{why}'), "
            f"RecordError(batchIndex=3, message='{why}')]"
        )
    first = _produce(writer, keyed(None))
    assert [e.batch_index for e in first.record_errors] == [0] and first.error_code == 87
    # Produce v3 has no record_errors: the error code and no more.
    old = _produce(writer, keyed(None, b"x"), version=3)
    assert old.error_code == 87
    # Nothing of the refused batches was written; keyed ones still are.
    assert log.log.log_end_offset == 2
    assert _produce(writer, keyed(b"z", codec=4)).base_offset == 2


def test_other_topics_accept_keyless_records_without_looking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No per-record work for topics that are not compacted: the scan is never called."""

    def must_not_run(_batch: Any) -> int | None:
        raise AssertionError("first_keyless called for a topic that is not compacted")

    monkeypatch.setattr(partition_write, "first_keyless", must_not_run)
    for policy in (None, "delete"):
        writer, _parts = _writer(tmp_path, policy)
        p = _produce(writer, keyed(None, None))
        assert (p.error_code, p.base_offset) == (0, 0)


def test_a_corrupt_record_in_a_compacted_topic_is_corrupt_message(tmp_path: Path) -> None:
    writer, _parts = _writer(tmp_path, "compact")
    good = keyed(b"a", b"b")
    # The record length of the first record claims more than the body holds; CRC right.
    bad = patch(good[:61] + b"\x7e" + good[62:], ">i", 8, len(good) - 12)
    p = _produce(writer, bad)
    assert p.error_code == 2  # CORRUPT_MESSAGE
