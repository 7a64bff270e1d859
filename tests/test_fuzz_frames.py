"""Fuzz the Kafka frame decoder of a real broker process.

Bad frames of many kinds go to the broker over throwaway connections while a
long-lived "good" client (confluent-kafka producer + consumer) keeps producing and
consuming. After every bad frame the broker must either answer or close that one
connection (checked with an ApiVersions probe pipelined right behind it); the good
client must keep working throughout, and at the end every message it produced must be
readable and the broker process alive.

The RNG is seeded: the seed is printed and goes into every failure message; set
STRAITMQ_FUZZ_SEED to replay a run and STRAITMQ_FUZZ_FRAMES to change the count.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import itertools
import os
import random
import socket
import struct
import threading
import time
import types
import typing
import uuid
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer
from straitmq.broker.api.versions import VERSIONS
from straitmq.broker.record_codec import build_batch

SEED = int(os.environ.get("STRAITMQ_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
FRAMES = int(os.environ.get("STRAITMQ_FUZZ_FRAMES") or 4000)
FUZZ_BUDGET_S = 40.0  # the loop stops early rather than overrun the file's time budget
REPLY_TIMEOUT_S = 10.0
UNSUPPORTED_VERSION = 35
SAMPLE_TOPIC = "fuzz-sample"

# APIs whose bodies may be mutated at random: none of them can block a connection for
# long (Fetch long-polls, group APIs wait on rebalances) or create/delete much state.
MUTABLE_APIS = {0, 2, 3, 10, 15, 16, 18, 32, 60}


# -- raw protocol helpers ------------------------------------------------------------------


def _sample_value(tp: Any, meta: dict, name: str) -> Any:
    overrides = {
        "acks": 1,
        "max_wait": datetime.timedelta(0),
        "min_bytes": 0,
        "timestamp": -1,
        "fetch_offset": 0,
        "partition_max_bytes": 1024,
    }
    if name in overrides:
        value = overrides[name]
        return (
            datetime.timedelta(milliseconds=value)
            if "timedelta" in meta.get("kafka_type", "") and isinstance(value, int)
            else value
        )
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _sample_value(args[0], meta, name)
    if origin is tuple:
        return (_sample_value(typing.get_args(tp)[0], meta, name),)
    if dataclasses.is_dataclass(tp):
        return sample_entity(tp)
    kt = meta.get("kafka_type", "")
    if kt == "records":
        return build_batch([(b"k", b"fuzz", [])], int(time.time() * 1000))
    if kt == "string":
        return SAMPLE_TOPIC
    if kt == "bytes":
        return b""
    if kt == "bool":
        return False
    if kt == "uuid":
        return uuid.UUID(int=0)
    if kt.startswith("timedelta"):
        return datetime.timedelta(0)
    if kt.startswith("datetime"):
        return datetime.datetime.now(datetime.UTC)
    if kt == "float64":
        return 0.0
    if kt == "error_code":
        from kio.schema.errors import ErrorCode

        return ErrorCode.none
    return 0


def sample_entity(schema: type) -> Any:
    """An instance of any kio request schema: defaults where the schema has them,
    small harmless values elsewhere (topic 'fuzz-sample', zero timeouts, acks=1)."""
    hints = typing.get_type_hints(schema)
    kwargs = {}
    for f in dataclasses.fields(schema):
        has_default = f.default is not dataclasses.MISSING or (
            f.default_factory is not dataclasses.MISSING
        )
        if has_default and f.name not in ("acks",):
            continue
        kwargs[f.name] = _sample_value(hints[f.name], dict(f.metadata), f.name)
    return schema(**kwargs)


def encode_request(req: Any, correlation_id: int, client_id: str | None = "fuzz") -> bytes:
    """A complete size-prefixed request frame."""
    hs = req.__header_schema__
    fields = {
        "request_api_key": req.__api_key__,
        "request_api_version": req.__version__,
        "correlation_id": correlation_id,
    }
    if "client_id" in hs.__dataclass_fields__:
        fields["client_id"] = client_id
    buf = io.BytesIO()
    entity_writer(hs)(buf, hs(**fields))
    entity_writer(type(req))(buf, req)
    body = buf.getvalue()
    return struct.pack(">i", len(body)) + body


def decode_response(api_key: int, version: int, payload: bytes) -> tuple[int, Any]:
    schema = load_response_schema(api_key, version)
    header, offset = entity_reader(schema.__header_schema__)(payload, 0)
    body, _ = entity_reader(schema)(payload, offset)
    return header.correlation_id, body


def recv_frame(sock: socket.socket) -> bytes | None:
    """One response frame, or None when the broker closed the connection."""

    def exact(n: int) -> bytes | None:
        out = bytearray()
        while len(out) < n:
            try:
                chunk = sock.recv(n - len(out))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            out += chunk
        return bytes(out)

    head = exact(4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    assert 0 <= size < 64 << 20, f"response frame size {size}"
    return exact(size)


def connect(b: Any) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", b.port), timeout=REPLY_TIMEOUT_S)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def all_samples() -> list[tuple[int, int, Any]]:
    """(api_key, version, request entity) for every API and version the broker handles."""
    out = []
    for key, spec in sorted(VERSIONS.items()):
        for v in range(spec.min_version, spec.max_version + 1):
            out.append((key, v, sample_entity(load_request_schema(key, v))))
    return out


def header_len(frame: bytes) -> int:
    """Bytes of the request header inside a frame (after the size prefix)."""
    api_key, version = struct.unpack_from(">hh", frame, 4)
    hs = load_request_schema(api_key, version).__header_schema__
    _h, offset = entity_reader(hs)(frame[4:], 0)
    return offset


def probe_frame(correlation_id: int) -> bytes:
    from kio.schema.api_versions.v0.request import ApiVersionsRequest

    return encode_request(ApiVersionsRequest(), correlation_id)


def parse_api_versions_v0(payload: bytes) -> tuple[int, int, dict[int, tuple[int, int]]]:
    corr, err, n = struct.unpack_from(">ihi", payload, 0)
    assert len(payload) == 10 + 6 * n, "ApiVersions v0 reply has the wrong length"
    keys = {}
    for i in range(n):
        k, lo, hi = struct.unpack_from(">hhh", payload, 10 + 6 * i)
        keys[k] = (lo, hi)
    return corr, err, keys


# -- the good client -----------------------------------------------------------------------


class GoodClient:
    """confluent-kafka producer and consumer running side by side in threads."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Consumer, Producer

        self.topic = topic
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 2,
                "enable.idempotence": True,
                "message.timeout.ms": 30000,
            }
        )
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "fuzz-good",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 50,
            }
        )
        from confluent_kafka import TopicPartition

        self.consumer.assign([TopicPartition(topic, 0, 0)])
        self.sent: list[bytes] = []
        self.acked: dict[bytes, int] = {}
        self.failed: list[str] = []
        self.consumed: dict[int, bytes] = {}
        self.ack_times: list[float] = []
        self.consume_times: list[float] = []
        self.stop = threading.Event()
        self.flush_timeout = 30.0
        self.errors: list[str] = []
        self.threads = [
            threading.Thread(target=self._produce, daemon=True),
            threading.Thread(target=self._consume, daemon=True),
        ]

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))
        else:
            self.acked[msg.value()] = msg.offset()
            self.ack_times.append(time.monotonic())

    def _produce(self) -> None:
        i = 0
        try:
            while not self.stop.is_set():
                value = f"good-{i:06d}".encode()
                self.producer.produce(
                    self.topic, value=value, partition=0, on_delivery=self._on_delivery
                )
                self.sent.append(value)
                i += 1
                self.producer.poll(0.005)
            self.producer.flush(self.flush_timeout)
        except Exception as e:
            self.errors.append(f"producer: {e!r}")

    def _consume(self) -> None:
        try:
            while not self.stop.is_set():
                self._poll_once()
        except Exception as e:
            self.errors.append(f"consumer: {e!r}")

    def _poll_once(self) -> None:
        msg = self.consumer.poll(0.1)
        if msg is None:
            return
        if msg.error():
            self.errors.append(f"consumer error: {msg.error()}")
            return
        prev = self.consumed.get(msg.offset())
        if prev is not None and prev != msg.value():
            self.errors.append(f"offset {msg.offset()} held {prev!r} then {msg.value()!r}")
        self.consumed[msg.offset()] = msg.value()
        self.consume_times.append(time.monotonic())

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self, timeout: float = 30.0) -> None:
        self.stop.set()
        self.flush_timeout = timeout
        for t in self.threads:
            t.join(timeout + 30)
        # Catch up: everything acknowledged must be readable.
        deadline = time.monotonic() + timeout
        wanted = set(self.acked.values())
        while not wanted <= set(self.consumed) and time.monotonic() < deadline:
            self._poll_once()
        self.consumer.close()


# -- fuzz cases ----------------------------------------------------------------------------

EXPECT_ANY = "answer-or-close"
EXPECT_CLOSE = "close"
EXPECT_ANSWER = "answer"  # a proper response for the frame, and the connection stays open
EXPECT_V0_FALLBACK = "v0-unsupported-version"
EXPECT_EOF_AFTER_HALF_CLOSE = "eof-after-half-close"


class Fuzzer:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.samples = all_samples()
        self.safe_samples = [s for s in self.samples if s[0] in MUTABLE_APIS]
        self.corr = 1000

    def next_corr(self) -> int:
        self.corr += 1
        return self.corr

    def _valid(self, pool: list | None = None) -> tuple[int, int, bytes]:
        key, version, entity = self.rng.choice(pool or self.samples)
        return key, version, encode_request(entity, self.next_corr())

    def case(self) -> tuple[str, bytes, str, tuple[int, int] | None]:
        """(kind, bytes to send, expectation, (api_key, version) when a reply is decoded)."""
        rng = self.rng
        kind = rng.choices(
            [
                "random",
                "garbage-body",
                "truncated",
                "mutated",
                "trailing",
                "unknown-key",
                "unsupported-version",
                "api-versions-unsupported",
                "bad-size",
                "incomplete",
            ],
            weights=[14, 14, 16, 16, 8, 6, 8, 4, 8, 6],
        )[0]
        if kind == "random":
            body = rng.randbytes(rng.randrange(8, 300))
            return kind, struct.pack(">i", len(body)) + body, EXPECT_ANY, None
        if kind == "garbage-body":
            key, version, frame = self._valid()
            hl = header_len(frame)
            body = frame[4 : 4 + hl] + rng.randbytes(rng.randrange(0, 200))
            return kind, struct.pack(">i", len(body)) + body, EXPECT_ANY, None
        if kind == "truncated":
            key, version, frame = self._valid()
            # Any strict prefix of a minimal encoding is undecodable; mostly cut in the
            # body, sometimes inside the header (the size prefix always matches).
            hl = header_len(frame)
            low = 4 + hl if rng.random() < 0.8 and 4 + hl < len(frame) else 12
            body = frame[4 : rng.randrange(low, len(frame))]
            return kind, struct.pack(">i", len(body)) + body, EXPECT_CLOSE, None
        if kind == "mutated":
            key, version, frame = self._valid(self.safe_samples)
            data = bytearray(frame)
            hl = header_len(frame)
            for _ in range(rng.randrange(1, 6)):
                pos = rng.randrange(4 + 4, len(data))  # keep size, api key and version
                if pos < 4 + hl and rng.random() < 0.7:
                    continue
                data[pos] = rng.randrange(256)
            return kind, bytes(data), EXPECT_ANY, None
        if kind == "trailing":
            key, version, frame = self._valid(self.safe_samples)
            extra = rng.randbytes(rng.randrange(1, 64))
            body = frame[4:] + extra
            return kind, struct.pack(">i", len(body)) + body, EXPECT_ANSWER, (key, version)
        if kind == "unknown-key":
            key = rng.choice(
                [k for k in (*range(-5, 80), 1000, 32767, -32768) if k not in VERSIONS]
            )
            body = struct.pack(">hhi", key, rng.randrange(0, 20), self.next_corr())
            body += struct.pack(">h", 4) + b"fuzz" + rng.randbytes(rng.randrange(0, 40))
            return kind, struct.pack(">i", len(body)) + body, EXPECT_CLOSE, None
        if kind == "unsupported-version":
            key, spec = rng.choice([(k, s) for k, s in VERSIONS.items() if k != 18])
            bad = [
                v
                for v in (
                    -1,
                    spec.min_version - 1,
                    spec.max_version + 1,
                    spec.max_version + 7,
                    99,
                    32767,
                )
                if not spec.min_version <= v <= spec.max_version and -32768 <= v
            ]
            version = rng.choice(bad)
            body = struct.pack(">hhi", key, version, self.next_corr())
            body += struct.pack(">h", 4) + b"fuzz" + rng.randbytes(rng.randrange(0, 40))
            return kind, struct.pack(">i", len(body)) + body, EXPECT_CLOSE, None
        if kind == "api-versions-unsupported":
            version = rng.choice([5, 6, 99, 1000, 32767, -1])
            body = struct.pack(">hhi", 18, version, self.next_corr())
            body += struct.pack(">h", 4) + b"fuzz" + rng.randbytes(rng.randrange(0, 40))
            return kind, struct.pack(">i", len(body)) + body, EXPECT_V0_FALLBACK, None
        if kind == "bad-size":
            size = rng.choice(
                [
                    -1,
                    -(2**31),
                    rng.randrange(-(2**31), 0),
                    0,
                    1,
                    7,
                    104857601,
                    2**31 - 1,
                    rng.randrange(104857601, 2**31),
                ]
            )
            return (
                kind,
                struct.pack(">i", size) + rng.randbytes(rng.randrange(0, 64)),
                EXPECT_CLOSE,
                None,
            )
        # incomplete: the size prefix promises more than ever arrives, then the client
        # half-closes; the broker must close rather than wait for ever.
        key, version, frame = self._valid()
        cut = rng.randrange(0, len(frame))
        return kind, frame[:cut], EXPECT_EOF_AFTER_HALF_CLOSE, None


def run_case(
    sock: socket.socket,
    kind: str,
    data: bytes,
    expect: str,
    decode_as: tuple[int, int] | None,
    probe_corr: int,
) -> tuple[bool, str | None]:
    """Send one bad frame (and a probe); returns (connection still usable, failure)."""
    if expect == EXPECT_EOF_AFTER_HALF_CLOSE:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        try:
            reply = recv_frame(sock)
        except TimeoutError:
            return False, "broker kept a half-closed connection with a partial frame open"
        if reply is not None:
            return False, "broker answered a partial frame"
        return False, None
    try:
        sock.sendall(data + probe_frame(probe_corr))
    except (BrokenPipeError, ConnectionResetError):
        # The broker may close before reading everything (e.g. a bad size prefix).
        if expect in (EXPECT_CLOSE, EXPECT_ANY):
            return False, None
        return False, "connection reset while sending"
    answers: list[bytes] = []
    while True:
        try:
            reply = recv_frame(sock)
        except TimeoutError:
            return False, f"no answer and no close within {REPLY_TIMEOUT_S}s"
        if reply is None:
            if expect in (EXPECT_CLOSE, EXPECT_ANY):
                return False, None
            return False, f"connection closed; expected {expect}"
        (corr,) = struct.unpack_from(">i", reply, 0)
        if corr == probe_corr:
            break
        answers.append(reply)
        if len(answers) > 1:
            return False, "more than one answer to one frame"
    if expect == EXPECT_CLOSE:
        return (
            True,
            f"expected the connection to close, got {len(answers)} answer(s) and "
            "the probe answered",
        )
    if expect == EXPECT_V0_FALLBACK:
        if len(answers) != 1:
            return True, "no ApiVersions reply for an unsupported version"
        _corr, err, keys = parse_api_versions_v0(answers[0])
        if err != UNSUPPORTED_VERSION:
            return True, f"ApiVersions fallback error {err}, expected 35"
        if not {0, 1, 3, 18} <= set(keys):
            return True, f"ApiVersions fallback lists {sorted(keys)}"
    if expect == EXPECT_ANSWER:
        if len(answers) != 1:
            return True, "valid request with trailing bytes got no answer"
        assert decode_as is not None
        try:
            decode_response(*decode_as, answers[0])
        except Exception as e:
            return True, f"answer does not decode as {decode_as}: {e!r}"
    return True, None


# -- tests ---------------------------------------------------------------------------------


def test_api_versions_unsupported_version_gets_v0_error(broker: Any) -> None:
    with connect(broker) as s:
        for i, version in enumerate((99, 5, 32767, -1)):
            body = struct.pack(">hhi", 18, version, 77 + i) + struct.pack(">h", 1) + b"x"
            # A v99 body could be anything: the broker must not try to parse it.
            body += b"\xff\xfe\x00garbage"
            s.sendall(struct.pack(">i", len(body)) + body)
            reply = recv_frame(s)
            assert reply is not None, f"connection closed on ApiVersions v{version}"
            corr, err, keys = parse_api_versions_v0(reply)
            assert corr == 77 + i
            assert err == UNSUPPORTED_VERSION
            for key, spec in VERSIONS.items():
                assert key in keys
                assert keys[key][1] == spec.max_version
        # The connection stays usable: a supported ApiVersions version works next.
        from kio.schema.api_versions.v3.request import ApiVersionsRequest

        s.sendall(
            encode_request(
                ApiVersionsRequest(client_software_name="t", client_software_version="1"), 5
            )
        )
        reply = recv_frame(s)
        assert reply is not None
        corr, resp = decode_response(18, 3, reply)
        assert corr == 5 and resp.error_code == 0


def _sample_params() -> list:
    out = []
    for key, version, entity in all_samples():
        out.append(pytest.param(key, version, entity, id=f"api{key}-v{version}"))
    return out


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from conftest import BrokerProcess

    b = BrokerProcess(tmp_path_factory.mktemp("trailing") / "data").start()
    b.create_topic(SAMPLE_TOPIC)
    yield b
    b.stop()


@pytest.mark.parametrize(("key", "version", "entity"), _sample_params())
def test_every_api_version_answers_with_trailing_bytes(
    shared_broker: Any, key: int, version: int, entity: Any
) -> None:
    """A well-formed request of every handled API/version, followed by junk bytes inside
    the frame, gets a response that decodes with that version's schema."""
    rng = random.Random(SEED ^ (key << 8) ^ version)
    frame = encode_request(entity, 4242)
    body = frame[4:] + rng.randbytes(rng.randrange(1, 32))
    with connect(shared_broker) as s:
        s.sendall(struct.pack(">i", len(body)) + body + probe_frame(4243))
        reply = recv_frame(s)
        assert reply is not None, f"broker closed on api {key} v{version} with trailing bytes"
        corr, _resp = decode_response(key, version, reply)
        assert corr == 4242
        probe = recv_frame(s)
        assert probe is not None and parse_api_versions_v0(probe)[:2] == (4243, 0)
    assert shared_broker.proc.poll() is None


def test_fuzz_frames_against_live_broker(broker: Any) -> None:
    print(f"\nfuzz seed {SEED} (set STRAITMQ_FUZZ_SEED={SEED} to replay), frames {FRAMES}")
    rng = random.Random(SEED)
    topic = "fuzz-good"
    broker.create_topic(topic)
    broker.create_topic(SAMPLE_TOPIC)
    good = GoodClient(broker.bootstrap, topic)
    good.start()
    fuzzer = Fuzzer(rng)
    counts: dict[str, int] = {}
    failures: list[str] = []
    sock: socket.socket | None = None
    started = time.monotonic()
    sent = 0
    previous = "none"
    try:
        for n in range(FRAMES):
            if time.monotonic() - started > FUZZ_BUDGET_S:
                break
            kind, data, expect, decode_as = fuzzer.case()
            counts[kind] = counts.get(kind, 0) + 1
            try:
                if sock is None:
                    sock = connect(broker)
                usable, failure = run_case(sock, kind, data, expect, decode_as, fuzzer.next_corr())
            except OSError as e:
                if broker.proc.poll() is None:
                    raise
                failures.append(
                    f"broker died at frame #{n} ({kind}, {data[:48].hex()}...)"
                    f": {e!r}; frame before it: {previous}"
                )
                break
            previous = f"#{n} ({kind}, {data[:64].hex()}...)"
            sent += 1
            if failure:
                failures.append(f"frame #{n} ({kind}, {data[:48].hex()}...): {failure}")
                if len(failures) >= 10:
                    break
            if not usable:
                sock.close()
                sock = None
            if broker.proc.poll() is not None:
                failures.append(f"broker died at frame {previous}")
                break
    finally:
        if sock is not None:
            sock.close()
        elapsed = time.monotonic() - started
        good.finish(timeout=30.0 if broker.proc.poll() is None else 1.0)
    print(f"fuzz: {sent} frames in {elapsed:.1f}s: {counts}")
    print(
        f"good client: {len(good.sent)} sent, {len(good.acked)} acked, "
        f"{len(good.consumed)} consumed"
    )
    if broker.proc.poll() is not None:
        not_json = [
            line
            for line in broker.log_path.read_text(errors="replace").splitlines()
            if not line.startswith("{")
        ]
        pytest.fail(
            f"seed {SEED}: broker process died (exit {broker.proc.returncode}): "
            + "\n".join(failures)
            + "\n"
            + "\n".join(not_json[:8])
        )
    assert not failures, f"seed {SEED}:\n" + "\n".join(failures)
    assert sent >= min(FRAMES, 1000), f"only {sent} frames in {FUZZ_BUDGET_S}s"
    # Every kind of bad frame was tried.
    assert len(counts) == 10, counts

    # The good client kept working throughout: nothing failed, everything produced was
    # acknowledged, and it made progress in every part of the fuzz run.
    assert not good.errors, good.errors[:5]
    assert not good.failed, good.failed[:5]
    assert len(good.acked) == len(good.sent) > 50
    for times in (good.ack_times, good.consume_times):
        points = [started, *sorted(t for t in times if t <= started + elapsed), started + elapsed]
        worst = max(b - a for a, b in itertools.pairwise(points))
        assert worst < 5.0, f"good client stalled for {worst:.1f}s during the fuzz"
    # Nothing lost, nothing duplicated: each acked message at its own offset, readable.
    offsets = sorted(good.acked.values())
    assert len(set(offsets)) == len(offsets), "two acked messages share an offset"
    for value, offset in good.acked.items():
        assert good.consumed.get(offset) == value, f"offset {offset}: {value!r} not readable"
    assert sorted(good.consumed.values()) == sorted(good.acked), "extra or lost messages"

    # The broker still serves fresh connections.
    with connect(broker) as s:
        s.sendall(probe_frame(1))
        reply = recv_frame(s)
        assert reply is not None and parse_api_versions_v0(reply)[1] == 0
    log_text = broker.log_path.read_text(errors="replace")
    assert "Traceback" not in log_text, (
        f"seed {SEED}: broker logged an exception:\n"
        + log_text[log_text.index("Traceback") - 400 :][:3000]
    )


def _hdr(api_key: int, version: int, flexible: bool) -> bytes:
    return struct.pack(">hhih", api_key, version, 31, 4) + b"fuzz" + (b"\x00" if flexible else b"")


# Frames whose array counts claim far more elements than the frame holds. kio reserves
# memory for the count before reading: ~2**32 elements made the broker abort on an
# allocation failure (every client lost), smaller counts can do the same on small hosts.
HUGE_ARRAYS = {
    "metadata-v9-compact-2^32": _hdr(3, 9, True) + bytes.fromhex("ffffffff0f00"),
    "metadata-v9-compact-2^34": _hdr(3, 9, True) + bytes.fromhex("ffffffff7f00"),
    "metadata-v1-int32-max": _hdr(3, 1, False) + struct.pack(">i", 2**31 - 1),
    "delete-topics-v4": _hdr(20, 4, True) + bytes.fromhex("ffffffff0f") + b"\x00" * 8,
    "produce-v9-partitions": _hdr(0, 9, True)
    + bytes.fromhex("00ffff000003e8020274")
    + bytes.fromhex("ffffffff0f"),
    "fetch-v12-topics": _hdr(1, 12, True)
    + struct.pack(">iiiibii", -1, 0, 0, 1 << 20, 0, 0, -1)
    + bytes.fromhex("ffffffff0f"),
    "list-offsets-v1": _hdr(2, 1, False) + struct.pack(">ii", -1, 2**31 - 2),
    # A null where the schema has no null: kio returns None, the handler must never see it.
    "produce-v3-null-topics": _hdr(0, 3, False) + struct.pack(">hhii", -1, 1, 1000, -1),
    "produce-v9-null-topics": _hdr(0, 9, True) + bytes.fromhex("000001000003e800"),
}


@pytest.mark.parametrize("name", list(HUGE_ARRAYS))
def test_array_count_beyond_frame_closes_connection(shared_broker: Any, name: str) -> None:
    body = HUGE_ARRAYS[name]
    log_start = shared_broker.log_path.stat().st_size
    with connect(shared_broker) as keep, connect(shared_broker) as bad:
        bad.sendall(struct.pack(">i", len(body)) + body + probe_frame(8))
        assert recv_frame(bad) is None, "a request with an impossible array count was served"
        time.sleep(0.05)
        assert shared_broker.proc.poll() is None, "broker died"
        keep.sendall(probe_frame(9))
        reply = recv_frame(keep)
        assert reply is not None and parse_api_versions_v0(reply)[:2] == (9, 0)
    with open(shared_broker.log_path, "rb") as f:
        f.seek(log_start)
        log_text = f.read().decode(errors="replace")
    assert "Traceback" not in log_text, log_text[log_text.index("Traceback") - 300 :][:2000]


@pytest.mark.parametrize("size", [-1, -(2**31), 0, 7, 104857601, 2**31 - 1])
def test_bad_length_prefix_closes_only_that_connection(broker: Any, size: int) -> None:
    with connect(broker) as keep, connect(broker) as bad:
        bad.sendall(struct.pack(">i", size) + b"\x00" * 16)
        assert recv_frame(bad) is None
        keep.sendall(probe_frame(9))
        reply = recv_frame(keep)
        assert reply is not None and parse_api_versions_v0(reply)[:2] == (9, 0)
