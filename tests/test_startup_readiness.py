"""A broker serves clients only once it is ready (issue 10).

Every client here starts together with the broker and fires at the first moment it can:
a watcher connects to the Kafka port every few milliseconds and the client starts the
instant a connection is accepted (the Java client is started before the broker, as a
JVM starting with its cluster would be). Each one then asks for Metadata, creates a
topic, produces with acks=all and joins a group, each step within a bound, on:
- a fresh single (combined) node,
- a single node restarted after kill -9 with a large log to recover,
- a 3+3 cluster whose six processes start in a random (seeded, printed) order.
Nothing acknowledged before or during the test may be missing afterwards.

Before the fix, the first Metadata answered with no brokers ("Local: Partial response"
in librdkafka) and a CreateTopics sent at that moment never completed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cluster_support import PYTHON, wait_for
from conftest import ROOT, BrokerProcess
from straitmq.cli.local_cluster import LocalCluster, free_port_run

from bench.javatools import STRAIT_CLIENT, ensure_jars, java_cmd
from straitmq.admin_client import exchange_sync

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", autouse=True)
def _jars() -> None:
    ensure_jars()


STEP_S = 45.0  # the bound for each client step (metadata, create, produce, group)
PARTITIONS = 3
NEW_VALUES = 60


@dataclass
class Storm:
    """What one client saw while storming a starting broker."""

    brokers_seen: int = 0
    acked: list[tuple[int, int, bytes]] = field(default_factory=list)  # partition, offset, value
    consumed: set[bytes] = field(default_factory=set)
    error: BaseException | None = None


class Client:
    name = ""

    def storm(
        self,
        bootstrap: str,
        new_topic: str,
        topic: str,
        rf: int,
        values: list[bytes],
        group: str,
        expect: set[bytes],
        out: Storm,
    ) -> None:
        raise NotImplementedError


def _retry_invalid_rf(
    create: Callable[[], None], is_invalid_rf: Callable[[BaseException], bool]
) -> None:
    """A cluster still starting may have fewer registered brokers than the replication
    factor: INVALID_REPLICATION_FACTOR is then the correct (Kafka's) answer; retry it."""
    deadline = time.monotonic() + STEP_S
    while True:
        try:
            create()
            return
        except Exception as e:
            if not is_invalid_rf(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Confluent(Client):
    name = "confluent"

    def storm(self, bootstrap, new_topic, topic, rf, values, group, expect, out) -> None:
        from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        md = admin.list_topics(timeout=STEP_S)
        out.brokers_seen = len(md.brokers)

        def create() -> None:
            fut = admin.create_topics([NewTopic(new_topic, PARTITIONS, rf)])[new_topic]
            fut.result(timeout=STEP_S)

        def invalid_rf(e: BaseException) -> bool:
            return (
                isinstance(e, KafkaException)
                and e.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR
            )

        _retry_invalid_rf(create, invalid_rf)
        p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
            }
        )
        errors: list[str] = []

        def on_delivery(err, m) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                out.acked.append((m.partition(), m.offset(), m.value()))

        for v in values:
            p.produce(topic, value=v, on_delivery=on_delivery)
        assert p.flush(STEP_S) == 0 and not errors, errors
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        c.subscribe([topic])
        try:
            deadline = time.monotonic() + STEP_S
            while not expect <= out.consumed and time.monotonic() < deadline:
                for m in c.consume(num_messages=500, timeout=0.2):
                    if m.error() is None:
                        out.consumed.add(m.value())
            c.commit(asynchronous=False)
        finally:
            c.close()


class AioKafka(Client):
    name = "aiokafka"

    def storm(self, bootstrap, new_topic, topic, rf, values, group, expect, out) -> None:
        asyncio.run(
            asyncio.wait_for(
                self._storm(bootstrap, new_topic, topic, rf, values, group, expect, out), 4 * STEP_S
            )
        )

    async def _storm(self, bootstrap, new_topic, topic, rf, values, group, expect, out) -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
        from aiokafka.admin import AIOKafkaAdminClient, NewTopic
        from aiokafka.errors import InvalidReplicationFactorError

        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
        await admin.start()
        try:
            cluster = await admin.describe_cluster()
            out.brokers_seen = len(cluster["brokers"])
            deadline = time.monotonic() + STEP_S
            while True:
                resp = await admin.create_topics([NewTopic(new_topic, PARTITIONS, rf)])
                ((_, code, *_rest),) = resp.topic_errors
                if code == InvalidReplicationFactorError.errno and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                    continue
                assert code == 0, resp
                break
        finally:
            await admin.close()
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
        await p.start()
        try:
            futs = [await p.send(topic, value=v) for v in values]
            mds = await asyncio.wait_for(asyncio.gather(*futs), STEP_S)
            out.acked += [(md.partition, md.offset, v) for md, v in zip(mds, values, strict=True)]
        finally:
            await p.stop()
        c = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await c.start()
        try:
            deadline = time.monotonic() + STEP_S
            while not expect <= out.consumed and time.monotonic() < deadline:
                for msgs in (await c.getmany(timeout_ms=200)).values():
                    out.consumed.update(m.value for m in msgs)
            await c.commit()
        finally:
            await c.stop()


class KafkaPython(Client):
    name = "kafka-python"

    def storm(self, bootstrap, new_topic, topic, rf, values, group, expect, out) -> None:
        from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
        from kafka.admin import NewTopic
        from kafka.errors import InvalidReplicationFactorError

        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
        try:
            out.brokers_seen = len(admin.describe_cluster()["brokers"])
            _retry_invalid_rf(
                lambda: admin.create_topics([NewTopic(new_topic, PARTITIONS, rf)]),
                lambda e: isinstance(e, InvalidReplicationFactorError),
            )
        finally:
            admin.close()
        p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
        try:
            futs = [(v, p.send(topic, value=v)) for v in values]
            p.flush(STEP_S)
            for v, f in futs:
                md = f.get(timeout=STEP_S)
                out.acked.append((md.partition, md.offset, v))
        finally:
            p.close(timeout=5)
        # A pattern subscription: see test_clients_python for the kafka-python 3.0.12 bug
        # that a plain subscription runs into during a join.
        c = KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        c.subscribe(pattern=f"^{topic}$")
        try:
            deadline = time.monotonic() + STEP_S
            while not expect <= out.consumed and time.monotonic() < deadline:
                for msgs in c.poll(timeout_ms=200).values():
                    out.consumed.update(m.value for m in msgs)
            c.commit()
        finally:
            c.close(autocommit=False)


class Java(Client):
    """kafka-clients through tools/java/StraitClient (one JVM per step)."""

    name = "java"

    def __init__(self) -> None:
        self.first: subprocess.Popen | None = None

    def prestart(self, bootstrap: str) -> None:
        """The first request comes from a JVM started before the broker: it connects
        (after refused attempts) the moment the listener accepts."""
        self.first = subprocess.Popen(
            java_cmd(
                STRAIT_CLIENT,
                [
                    "admin",
                    "--bootstrap",
                    bootstrap,
                    "describe-cluster",
                    "--timeout-ms",
                    int(STEP_S * 1000),
                ],
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def _run(self, args: list) -> dict:
        res = subprocess.run(
            java_cmd(STRAIT_CLIENT, args), capture_output=True, text=True, timeout=STEP_S + 30
        )
        lines = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
        if res.returncode != 0:
            raise RuntimeError(
                f"StraitClient {args[:3]} exit {res.returncode}: "
                f"{res.stdout[-800:]} {res.stderr[-1500:]}"
            )
        return {"lines": lines}

    def storm(self, bootstrap, new_topic, topic, rf, values, group, expect, out) -> None:
        assert self.first is not None
        stdout, stderr = self.first.communicate(timeout=STEP_S + 30)
        assert self.first.returncode == 0, stderr[-2000:]
        out.brokers_seen = len(json.loads(stdout.splitlines()[-1])["nodes"])
        ms = int(STEP_S * 1000)
        deadline = time.monotonic() + STEP_S
        while True:
            try:
                self._run(
                    [
                        "admin",
                        "--bootstrap",
                        bootstrap,
                        "create-topic",
                        new_topic,
                        PARTITIONS,
                        rf,
                        "--timeout-ms",
                        ms,
                    ]
                )
                break
            except RuntimeError as e:
                if "InvalidReplicationFactor" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        prefix = values[0].decode().rstrip("0123456789")
        res = self._run(
            [
                "produce",
                "--bootstrap",
                bootstrap,
                "--topic",
                topic,
                "--count",
                len(values),
                "--acks",
                "all",
                "--value-prefix",
                prefix,
                "--timeout-ms",
                ms,
            ]
        )
        summary = res["lines"][-1]
        assert summary["acked"] == len(values) and summary["errors"] == 0, summary
        for p, (first, last) in summary["offsets"].items():
            out.acked += [(int(p), o, b"") for o in range(first, last + 1)]
        res = self._run(
            [
                "consume",
                "--bootstrap",
                bootstrap,
                "--topic",
                topic,
                "--group",
                group,
                "--count",
                len(expect),
                "--timeout-ms",
                ms,
                "--quiet",
            ]
        )
        # --quiet prints only the summary; the count reached means every record was read.
        assert res["lines"][-1]["done"] >= len(expect), res["lines"][-1]
        out.consumed |= expect


CLIENTS = [Confluent(), AioKafka(), KafkaPython(), Java()]


def _java_values(prefix: str, n: int) -> list[bytes]:
    # StraitClient writes "<prefix><i>" for i in 0..n-1.
    return [f"{prefix}{i}".encode() for i in range(n)]


def _port_open(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), 0.2).close()
        return True
    except OSError:
        return False


def storm_at_open(
    client: Client, addrs: list[tuple[str, int]], **kw
) -> tuple[threading.Thread, Storm]:
    """A thread that waits for the first of `addrs` to accept a connection, then storms."""
    out = Storm()
    bootstrap = ",".join(f"{h}:{p}" for h, p in addrs)

    def run() -> None:
        try:
            deadline = time.monotonic() + 120
            while not any(_port_open(h, p) for h, p in addrs):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no Kafka port of {bootstrap} opened in 120 s")
                time.sleep(0.005)
            client.storm(bootstrap, **kw, out=out)
        except BaseException as e:  # reported by check_storm
            out.error = e

    if isinstance(client, Java):
        client.prestart(bootstrap)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def check_storm(
    t: threading.Thread,
    out: Storm,
    values: list[bytes],
    expect: set[bytes],
    logs: Callable[[], str],
) -> None:
    t.join(5 * STEP_S)
    assert not t.is_alive(), f"the client did not finish within {5 * STEP_S} s\n{logs()}"
    if out.error is not None:
        raise AssertionError(f"client failed: {out.error!r}\n{logs()}") from out.error
    assert out.brokers_seen >= 1, "Metadata listed no brokers"
    assert len(out.acked) == len(values)
    missing = expect - out.consumed
    assert not missing, (
        f"{len(missing)} acknowledged values not read back, e.g. {sorted(missing)[:5]}"
    )


def _values(tag: str, n: int = NEW_VALUES) -> list[bytes]:
    return _java_values(f"{tag}-", n)


# -- single node ------------------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.name)
def test_fresh_single_node_serves_its_first_clients(client: Client, tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data")
    values = _values("fresh")
    t, out = storm_at_open(
        client,
        [("127.0.0.1", b.port)],
        new_topic="created-at-open",
        topic="orders-at-open",
        rf=1,
        values=values,
        group="g-open",
        expect=set(values),
    )
    try:
        b.launch()
        check_storm(t, out, values, set(values), lambda: _tail(b.log_path))
    finally:
        b.stop()


BULK_VALUE = 64 * 1024
BULK_COUNT = 1500  # ~100 MB in one segment: recovered (scanned, CRC-checked) after kill -9


def _fill(bootstrap: str, topic: str, values: list[bytes]) -> int:
    from confluent_kafka import Producer

    p = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
    )
    acked = 0

    def on_delivery(err, m) -> None:
        nonlocal acked
        assert err is None, err
        acked += 1

    for v in values:
        while True:
            try:
                p.produce(topic, value=v, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0
    return acked


def _end_offsets(bootstrap: str, topic: str, partitions: int) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    try:
        return [
            c.get_watermark_offsets(TopicPartition(topic, i), timeout=20)[1]
            for i in range(partitions)
        ]
    finally:
        c.close()


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.name)
def test_single_node_restarted_after_kill9_with_a_large_log(client: Client, tmp_path: Path) -> None:
    b = BrokerProcess(tmp_path / "data").start()
    try:
        b.create_topic("orders", PARTITIONS)
        b.create_topic("bulk", 1)
        before = _values("before", 200)
        assert _fill(b.bootstrap, "orders", before) == len(before)
        assert _fill(b.bootstrap, "bulk", [os.urandom(BULK_VALUE)] * BULK_COUNT) == BULK_COUNT
        b.kill9()
        values = _values("after")
        expect = set(before) | set(values)
        t, out = storm_at_open(
            client,
            [("127.0.0.1", b.port)],
            new_topic="created-after",
            topic="orders",
            rf=1,
            values=values,
            group="g-after",
            expect=expect,
        )
        b.launch()
        check_storm(t, out, values, expect, lambda: _tail(b.log_path))
        assert _end_offsets(b.bootstrap, "bulk", 1) == [BULK_COUNT]
    finally:
        b.stop()


# -- a 3+3 cluster started in random order -------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS, ids=lambda c: c.name)
def test_cluster_started_in_random_order_serves_its_first_clients(
    client: Client, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"start order seed {seed}")
    cluster = LocalCluster(
        str(tmp_path / "cluster"),
        kafka_base=None,
        http_base=None,
        controller_base=None,
        broker_args=[
            "--default-replication-factor",
            "3",
            "--offsets-topic-replication-factor",
            "3",
            "--group-initial-rebalance-delay-ms",
            "0",
        ],
        log_level="info",
        python=PYTHON,
    )
    values = _values("cluster")
    addrs = [(n.host, n.kafka_port) for n in cluster.brokers.values()]
    t, out = storm_at_open(
        client,
        addrs,
        new_topic="created-in-cluster",
        topic="events",
        rf=3,
        values=values,
        group="g-cluster",
        expect=set(values),
    )
    order = cluster.nodes()
    rng.shuffle(order)
    print("start order:", [n.name for n in order])
    try:
        for n in order:
            n.start()
            time.sleep(rng.uniform(0, 1.5))
        check_storm(
            t,
            out,
            values,
            set(values),
            lambda: "\n".join(f"== {n.name}\n{cluster.tail(n)}" for n in order),
        )
    finally:
        cluster.stop()


# -- HTTP and the listener before the broker is ready ------------------------------------------


def _http(url: str, method: str = "GET", body: dict | None = None) -> tuple[int, dict]:
    return exchange_sync(url, method, "", body, timeout_s=5)


def test_broker_without_reachable_controllers_says_why_and_serves_nothing(tmp_path: Path) -> None:
    """Controllers not up yet: liveness answers, readiness and the admin API say why
    with a 503, the Kafka port refuses connections; once the quorum is up, it serves."""
    cluster = LocalCluster(
        str(tmp_path / "cluster"),
        brokers=1,
        kafka_base=None,
        http_base=None,
        controller_base=None,
        broker_args=[
            "--default-replication-factor",
            "1",
            "--offsets-topic-replication-factor",
            "1",
        ],
        log_level="info",
        python=PYTHON,
    )
    broker = cluster.brokers[1]
    base = f"http://{broker.host}:{broker.http_port}"
    try:
        broker.start()
        wait_for(lambda: broker.get("/healthz") is not None, 30, "the broker's /healthz")
        status, body = _http(f"{base}/readyz")
        assert status == 503 and "controller quorum" in body["reason"], body
        status, body = _http(f"{base}/api/v1/topics", "POST", {"name": "t", "partitions": 1})
        assert status == 503 and "controller quorum" in body["error"], body
        status, body = _http(f"{base}/api/v1/topics")
        assert status == 503, body
        assert not _port_open(broker.host, broker.kafka_port)
        assert b"not serving yet" in wait_for(
            lambda: (
                b"not serving yet" in Path(broker.log_path).read_bytes()
                and Path(broker.log_path).read_bytes()
            ),
            30,
            "the broker's 'not serving yet' line",
        )
        for n in cluster.controllers.values():
            n.start()
        cluster.wait_ready(60)
        assert _port_open(broker.host, broker.kafka_port)
        status, body = _http(f"{base}/api/v1/topics", "POST", {"name": "t", "partitions": 1})
        assert status == 201, body
    finally:
        cluster.stop()


def test_strait_up_prints_ready_only_when_every_broker_serves(tmp_path: Path) -> None:
    """The moment `strait up` says ready, every broker answers Metadata with all three."""
    from confluent_kafka.admin import AdminClient

    kafka, http, ctl = (free_port_run(3) for _ in range(3))
    proc = subprocess.Popen(
        [
            str(ROOT / ".venv" / "bin" / "strait"),
            "up",
            "--data-dir",
            str(tmp_path),
            "--listen",
            f"127.0.0.1:{kafka}",
            "--http-listen",
            f"127.0.0.1:{http}",
            "--controller-port",
            str(ctl),
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 120
        lines: list[str] = []
        while not (lines and lines[-1].startswith("StraitMQ cluster ")):
            lines.append(proc.stderr.readline())
            assert lines[-1] and time.monotonic() < deadline, (
                "strait up ended without a ready line: " + "".join(lines)
            )
        for i in range(3):
            md = AdminClient({"bootstrap.servers": f"127.0.0.1:{kafka + i}"}).list_topics(
                timeout=10
            )
            assert sorted(md.brokers) == [1, 2, 3], md.brokers
    finally:
        proc.terminate()
        proc.wait(60)


def _tail(path: Path | str | None, size: int = 4000) -> str:
    if path is None:
        return ""
    data = Path(path).read_bytes()
    return data[-size:].decode(errors="replace")
