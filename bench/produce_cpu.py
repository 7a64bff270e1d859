"""Broker CPU per Produce request at linger.ms=0: one record per request, acks=all (issue 31).

    python -m bench.produce_cpu --strait before=/tmp/base/.venv/bin/python \\
        --strait after=.venv/bin/python [--rounds 5] [--seconds 10] [--rf 3]

The load ProducerPerformance puts on a broker at linger.ms=0 is mostly per-request work:
each Produce carries one record or a few. This bench sends exactly that, from a minimal
Python client that costs little of its own: one idempotent producer (InitProducerId
first, then sequence numbers, as Kafka's producer with its defaults), Produce v12,
acks=all, one 1 KiB record per request, `--inflight` requests in flight on
`--connections` connections, as fast as the broker answers (or at `--rate` requests/s).
Each request's bytes are made once and only the correlation id, the sequence and the
batch CRC change.

What it reports per StraitMQ build (`--strait NAME=PYTHON`: that checkout's venv python;
all builds up for the whole run, rounds alternating, order flipped every round): the
brokers' CPU (user + system, all broker processes, /proc) per request in microseconds,
and the request rate reached, as the median over the rounds (min-max). On a noisy
machine CPU per request is the figure that holds still; the rate moves with whatever
else runs. --rf 3 runs 3 controllers + 3 brokers per build (bench/latency.py's
StraitCluster), topics with min.insync.replicas 2, and sums the brokers' CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import io
import json
import statistics
import struct
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # allow `python bench/produce_cpu.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka.admin import AdminClient
from crc32c import crc32c
from kio.schema.produce.v12 import request as produce_v12
from straitmq.broker.record_codec import build_batch

from bench.latency import StraitCluster, StraitNode, System, create_topic, delete_topic
from bench.throughput import log
from straitmq.protocol.client import KafkaConnection
from straitmq.protocol.codec import _reader, _writer, request_schema, response_schema

_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
CLIENT_ID = "produce-cpu"


def produce_frame(topic: str, batch: bytes) -> bytearray:
    """A whole Produce v12 request (size prefix included) with correlation id 0."""
    schema = request_schema(0, 12)
    header_schema = schema.__header_schema__
    body = produce_v12.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=_dt.timedelta(seconds=30),
        topic_data=(
            produce_v12.TopicProduceData(
                name=topic,
                partition_data=(produce_v12.PartitionProduceData(index=0, records=batch),),
            ),
        ),
    )
    buf = io.BytesIO()
    buf.write(b"\x00\x00\x00\x00")
    _writer(header_schema)(
        buf,
        header_schema(
            request_api_key=0, request_api_version=12, correlation_id=0, client_id=CLIENT_ID
        ),
    )
    _writer(schema)(buf, body)
    out = bytearray(buf.getvalue())
    _I32.pack_into(out, 0, len(out) - 4)
    return out


class _Pipe(asyncio.Protocol):
    """Counts whole response frames; wakes the sender on each."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.answered = 0
        self.ready = asyncio.Event()
        self.lost: str | None = None
        self.transport: asyncio.Transport | None = None
        self.last = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        pos = 0
        while len(self.buf) - pos >= 4:
            (size,) = _I32.unpack_from(self.buf, pos)
            if len(self.buf) - pos - 4 < size:
                break
            # Answers are counted; the last one is kept and decoded at the end.
            self.last = bytes(self.buf[pos + 4 : pos + 4 + size])
            pos += 4 + size
            self.answered += 1
        del self.buf[:pos]
        self.ready.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = str(exc or "closed")
        self.ready.set()


async def producer_id(host: str, port: int) -> tuple[int, int]:
    conn = KafkaConnection(host, port, CLIENT_ID)
    try:
        schema = request_schema(22, 4)
        answer = await conn.request(
            22,
            4,
            schema(
                transactional_id=None,
                transaction_timeout=_dt.timedelta(milliseconds=60000),
                producer_id=-1,
                producer_epoch=-1,
            ),
            10.0,
        )
        if answer.error_code:
            raise RuntimeError(f"InitProducerId: {answer.error_code}")
        return int(answer.producer_id), int(answer.producer_epoch)
    finally:
        conn.close()


async def _sender(pipe: _Pipe, frame: bytearray, start: int, size: int, a: Any) -> None:
    """Sends the request again and again: a new correlation id and sequence each time,
    and the batch CRC over them; at most `inflight` unanswered."""
    loop = asyncio.get_running_loop()
    transport = pipe.transport
    assert transport is not None
    inflight, rate = a.inflight, a.rate / a.connections
    seq = correlation = 0
    crc_from, crc_to = start + 21, start + size
    t0 = loop.time()
    while pipe.lost is None:
        while correlation - pipe.answered >= inflight:
            pipe.ready.clear()
            await pipe.ready.wait()
            if pipe.lost is not None:
                return
        if rate:
            due = t0 + correlation / rate
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
        correlation += 1
        _I32.pack_into(frame, 8, correlation)
        _I32.pack_into(frame, start + 53, seq)
        _U32.pack_into(frame, start + 17, crc32c(memoryview(frame)[crc_from:crc_to]))
        transport.write(bytes(frame))
        seq = (seq + 1) & 0x7FFFFFFF


async def drive(s: System, topic: str, a: argparse.Namespace) -> dict[str, float]:
    """Requests answered and broker CPU over `a.seconds`, after 1 s not counted."""
    host, port = leader(s, topic).rsplit(":", 1)
    loop = asyncio.get_running_loop()
    pipes: list[_Pipe] = []
    tasks: list[asyncio.Task] = []
    for _ in range(a.connections):
        pid, epoch = await producer_id(host, int(port))
        batch = build_batch([(None, bytes(1024), [])], int(time.time() * 1000))
        frame = produce_frame(topic, batch)
        start = frame.index(batch)
        # This producer's batch: id and epoch at 43, base sequence at 53 (set per send).
        struct.pack_into(">qh", frame, start + 43, pid, epoch)
        _, pipe = await loop.create_connection(_Pipe, host, int(port))
        pipes.append(pipe)
        tasks.append(loop.create_task(_sender(pipe, frame, start, len(batch), a)))
    try:
        await asyncio.sleep(1.0)
        n0, cpu0, t0 = sum(p.answered for p in pipes), s.cpu_s(), time.monotonic()
        await asyncio.sleep(a.seconds)
        n1, cpu1, t1 = sum(p.answered for p in pipes), s.cpu_s(), time.monotonic()
    finally:
        for t in tasks:
            t.cancel()
        for p in pipes:
            if p.transport is not None:
                p.transport.close()
    for p in pipes:
        check_answer(p.last)
    lost = [p.lost for p in pipes if p.lost not in (None, "closed")]
    if lost:
        raise RuntimeError(f"connection lost: {lost[0]}")
    rps = (n1 - n0) / (t1 - t0)
    cpu_rate = (cpu1 - cpu0) / (t1 - t0)
    return {
        "req_s": rps,
        "cpu_share": cpu_rate,
        "cpu_us_per_req": cpu_rate / rps * 1e6 if rps else float("nan"),
    }


def leader(s: System, topic: str) -> str:
    """host:port of the broker leading the topic's partition 0."""
    admin = AdminClient({"bootstrap.servers": s.bootstrap, "log_level": 2})
    md = admin.list_topics(topic, timeout=10)
    broker = md.brokers[md.topics[topic].partitions[0].leader]
    return f"{broker.host}:{broker.port}"


def check_answer(frame: bytes) -> None:
    """The Produce answer (header included) says no error."""
    schema = response_schema(0, 12)
    _, offset = _reader(schema.__header_schema__)(frame, 0)
    body, _ = _reader(schema)(frame, offset)
    for topic in body.responses:
        for part in topic.partition_responses:
            if part.error_code:
                raise RuntimeError(f"Produce answered error {part.error_code}")


def measure(s: System, a: argparse.Namespace) -> dict[str, float]:
    topic = f"cpu-{uuid.uuid4().hex[:6]}"
    create_topic(s, topic, argparse.Namespace(partitions=1, rf=a.rf))
    try:
        return asyncio.run(drive(s, topic, a))
    finally:
        delete_topic(s, topic)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strait", action="append", default=[], metavar="NAME=PYTHON")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--inflight", type=int, default=1)
    ap.add_argument("--connections", type=int, default=1)
    ap.add_argument("--rate", type=float, default=0.0, help="requests/s in all (0: closed loop)")
    ap.add_argument("--rf", type=int, choices=(1, 3), default=1)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    builds = [x.split("=", 1) for x in a.strait] or [["straitmq", sys.executable]]
    tmp = Path(tempfile.mkdtemp(prefix="produce-cpu-"))
    systems: list[System] = []
    for name, python in builds:
        s: System = (
            StraitNode(name, python, tmp / name)
            if a.rf == 1
            else StraitCluster(name, python, tmp / name)
        )
        s.name = name
        systems.append(s)
    rounds: dict[str, list[dict[str, float]]] = {s.name: [] for s in systems}
    try:
        for s in systems:
            log(f"starting {s.name}")
            s.start()
        for r in range(a.rounds):
            order = systems if r % 2 == 0 else systems[::-1]
            for s in order:
                m = measure(s, a)
                rounds[s.name].append(m)
                log(
                    f"round {r + 1} {s.name}: {m['req_s']:,.0f} req/s, "
                    f"{m['cpu_share'] * 100:.0f}% CPU, {m['cpu_us_per_req']:.0f} us/req"
                )
    finally:
        for s in systems:
            s.stop()
    print("| build | rounds | broker CPU us/request (min-max) | requests/s | broker CPU |")
    print("|---|---:|---:|---:|---:|")
    for name, ms in rounds.items():
        us = [m["cpu_us_per_req"] for m in ms]
        print(
            f"| {name} | {len(ms)} | {statistics.median(us):.0f} ({min(us):.0f}-{max(us):.0f}) "
            f"| {statistics.median(m['req_s'] for m in ms):,.0f} "
            f"| {statistics.median(m['cpu_share'] for m in ms) * 100:.0f}% |"
        )
    out = a.json or Path(".cache/bench") / f"produce-cpu-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(a) | {"json": str(a.json)}, "rounds": rounds}))
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
