"""Client quotas (Kafka's semantics): metadata records, DescribeClientQuotas and
AlterClientQuotas, and enforcement by throttle time and a muted connection.

The rate and throttle math, the token bucket, precedence, validation and the image are
checked sans-IO on a fake clock; the rest against real broker processes with real
clients (librdkafka through confluent-kafka, Kafka 4.4's Java tools), comparing the
rate of a client with a quota to one without (ratios, not absolute timings: the machine
is shared). The brokers here measure over 3 samples of 1 s (`--quota-window-num 3`)
instead of Kafka's 11, so a new client's first burst is over in seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import shutil
import struct
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from conftest import record_batch
from kio.schema.alter_client_quotas.v1 import request as acq
from kio.schema.describe_client_quotas.v1 import request as dcq
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12.request import MetadataRequest
from kio.serial import entity_writer
from kio.static.primitive import f64, i8
from straitmq.broker import server
from straitmq.broker.api.context import RequestContext
from straitmq.broker.api.dispatch import ApiSpec
from straitmq.broker.metrics import BrokerMetrics
from straitmq.broker.quotas import ClientQuotas, Rate, throttle_ms, user_of
from straitmq.broker.security.sasl import ConnectionSecurity
from straitmq.broker.server import KafkaConnection, ListenerDeps, _Timed
from straitmq.controller import operations as ops
from straitmq.controller.mutation_quotas import TokenBucket
from straitmq.metadata.image import MetadataImage
from straitmq.metadata.quotas import (
    REQUEST_PERCENTAGE,
    QuotaError,
    check_value,
    entity_key,
    matches,
    parse_filter,
    precedence,
)
from straitmq.operator import user
from straitmq.operator.admin import AdminClient, AdminError
from test_errors import Raw, code, create_topics, fetch, produce
from test_metrics import check_served, dashboards, scrape, total

from bench.javatools import KAFKA44_JARS_DIR, KAFKA44_TOOLS, LOG4J2_CONFIG
from straitmq.protocol.codec import load as load_schemas

pytestmark = pytest.mark.timeout(180)
MB = 1024 * 1024
WINDOWS = ("--quota-window-num", "2")
RUN_S = 12.0  # each rate test's clients run this long


# -- the math, on a fake clock --------------------------------------------------------


def test_a_new_rate_is_measured_over_the_whole_window_so_a_new_client_may_burst() -> None:
    r = Rate(0.0, 11, 1000.0)
    r.record(10 * MB, 0.0)
    rate, window = r.measure(0.0)
    # Elapsed 0 s, but at least samples-1 windows: 10 MB over 10 s is 1 MB/s.
    assert window == 10_000.0
    assert rate == pytest.approx(MB)
    assert throttle_ms(rate, MB, window) == 0
    r.record(10 * MB, 0.0)
    rate, window = r.measure(0.0)
    # Twice the quota: (2 - 1) / 1 * 10 s, the delay that brings it back to the quota.
    assert throttle_ms(rate, MB, window) == 10_000


def test_samples_expire_after_the_full_window() -> None:
    r = Rate(0.0, 3, 1000.0)
    for t in range(3):
        r.record(1000, t * 1000.0)
    assert r.measure(2500.0)[0] == pytest.approx(3000 / 2.5)
    # 3 windows after a sample started it no longer counts: 2000 over the 2 s left.
    assert r.measure(3000.0)[0] == pytest.approx(1000)
    assert r.measure(6000.0)[0] == 0.0


def test_a_client_that_honours_its_throttle_converges_to_the_quota() -> None:
    """A simulated producer sends 64 KiB requests back to back, waiting out each
    throttle: over a long run its rate is the quota, within 10 %, and no window of the
    broker's measure ever holds much more than the quota allows."""
    image = _image({(("client-id", "slow"),): {"producer_byte_rate": MB}})
    quotas = ClientQuotas(lambda: image, 3, 1000.0)
    now, sent = 0.0, []
    while now < 90_000:
        sent.append((now, 64 * 1024))
        ms = quotas.produce("ANONYMOUS", "slow", 64 * 1024, now)
        now += max(ms, 1)
    late = sum(n for t, n in sent if 10_000 <= t < 90_000)
    assert late / 80 == pytest.approx(MB, rel=0.1)
    # The samples kept span up to one window more than the quota.window.num measured.
    for start in range(10_000, 86_000, 250):
        held = sum(n for t, n in sent if start <= t < start + 3000)
        assert held <= MB * 4 + 64 * 1024
    # A client without a quota is never throttled (and costs no lookup beyond the first).
    assert quotas.produce("ANONYMOUS", "fast", 100 * MB, now) == 0


def test_request_percentage_throttles_at_most_one_window() -> None:
    image = _image({(("user", "alice"),): {"request_percentage": 10.0}})
    quotas = ClientQuotas(lambda: image, 11, 1000.0)
    # 5 s of handling at once: 500 %-seconds over 10 s is 50 %, five times the quota.
    assert quotas.request_time("alice", "any", 5.0, 0.0) == 1000
    assert quotas.request_time("bob", "any", 5.0, 0.0) == 0


def test_token_bucket_bursts_then_throttles_until_refilled() -> None:
    b = TokenBucket(0.0, 11.0)
    assert b.level(2.0, 0.0) == 22.0  # starts full: samples * window * quota
    b.record(30, 2.0, 0.0)
    assert b.throttle_ms(2.0, 0.0) == 4000  # 8 mutations owed at 2/s
    assert b.throttle_ms(2.0, 4000.0) == 0


# The controller's strict and permissive mutation quotas: tests/test_quotas_controller.py.


def test_precedence_is_kafkas_from_user_and_client_down_to_the_defaults() -> None:
    order = [e for e, _, _ in precedence("alice", "app")]
    assert order == [
        entity_key([("user", "alice"), ("client-id", "app")]),
        entity_key([("user", "alice"), ("client-id", None)]),
        entity_key([("user", "alice")]),
        entity_key([("user", None), ("client-id", "app")]),
        entity_key([("user", None), ("client-id", None)]),
        entity_key([("user", None)]),
        entity_key([("client-id", "app")]),
        entity_key([("client-id", None)]),
    ]
    quotas = {
        entity_key([("client-id", None)]): {"producer_byte_rate": 1.0},
        entity_key([("client-id", "app")]): {"producer_byte_rate": 2.0},
        entity_key([("user", None)]): {"producer_byte_rate": 3.0},
        entity_key([("user", "alice")]): {"producer_byte_rate": 4.0},
        entity_key([("user", "alice"), ("client-id", "app")]): {"producer_byte_rate": 5.0},
    }
    image = _image(quotas)
    cq = ClientQuotas(lambda: image)

    def applied(user: str, client: str) -> tuple[float, str, str]:
        s = cq._sensors(user, client, 0.0)[0]
        assert s is not None
        return s.quota, s.user, s.client_id

    assert applied("alice", "app") == (5.0, "alice", "app")
    # A user's own quota is shared by all of that user's clients.
    assert applied("alice", "other") == (4.0, "alice", "")
    assert applied("bob", "app") == (3.0, "bob", "")  # <default> user: each user its own
    del image.client_quotas[entity_key([("user", None)])]
    image.quotas_version += 1  # the lookups are cached per version
    assert applied("bob", "app") == (2.0, "", "app")
    assert applied("bob", "x") == (1.0, "", "x")  # <default> client-id: each client its own


def test_rates_are_kept_only_while_their_quota_is() -> None:
    """The metrics' cardinality: a rate per client a quota applies to, gone with it."""
    image = _image({(("client-id", None),): {"producer_byte_rate": 1000.0}})
    cq = ClientQuotas(lambda: image)
    for i in range(5):
        cq.produce("u", f"c{i}", 10, 0.0)
    assert cq.produce("u", "c0", 10, 0.0) == 0
    assert len(cq.sensors) == 5  # <default> client id: each client its own allowance
    image.client_quotas = {entity_key([("client-id", "c0")]): {"consumer_byte_rate": 1.0}}
    image.quotas_version += 1
    assert cq.produce("u", "c0", 10, 0.0) == 0
    assert list(cq.sensors) == [("consumer_byte_rate", "", "c0")]  # the five others gone
    assert cq.fetch("u", "c0", 100, 0.0) > 0  # over quota: the bytes are not counted
    assert [s.recorded for s in cq.sensors.values()] == [0]


def test_values_are_checked_with_the_reason() -> None:
    assert check_value("producer_byte_rate", 1048576) == 1048576.0
    assert check_value("request_percentage", "12.5") == 12.5
    for key, value, why in (
        ("producer_bytes_rate", 1, "Invalid configuration key producer_bytes_rate"),
        ("producer_byte_rate", -5, "must not be negative"),
        ("consumer_byte_rate", "fast", "must be a number"),
        ("consumer_byte_rate", 1.5, "must be a Long value"),
        ("controller_mutation_rate", float("nan"), "must be a finite number"),
    ):
        with pytest.raises(QuotaError, match=why):
            check_value(key, value)


def test_describe_filters_match_strictly_or_not() -> None:
    alice = entity_key([("user", "alice")])
    alice_app = entity_key([("user", "alice"), ("client-id", "app")])
    default_user = entity_key([("user", None)])
    exact, specified = parse_filter([("user", 0, "alice")])
    assert matches(alice, exact, specified, False) and matches(alice_app, exact, specified, False)
    assert matches(alice, exact, specified, True) and not matches(alice_app, exact, specified, True)
    exact, specified = parse_filter([("user", 1, None)])
    assert matches(default_user, exact, specified, True) and not matches(
        alice, exact, specified, True
    )
    exact, specified = parse_filter([("user", 2, None)])
    assert all(matches(e, exact, specified, False) for e in (alice, alice_app, default_user))
    for components, why in (
        ([("user", 0, None)], "MATCH_TYPE_EXACT, but set match string to null"),
        ([("user", 1, "x")], "MATCH_TYPE_DEFAULT, but also specified"),
        ([("group", 2, None)], "Unknown entity type group"),
        ([("user", 2, None), ("user", 0, "a")], "cannot appear more than once"),
        ([("ip", 2, None), ("user", 2, None)], "IP filter component should not be used"),
    ):
        with pytest.raises(QuotaError, match=why):
            parse_filter(components)


def test_quota_records_survive_snapshots_and_only_changes_are_written() -> None:
    image = MetadataImage()
    entries = [
        {"entity": [["client-id", "app"], ["user", "alice"]], "ops": {"producer_byte_rate": 1e6}},
        {"entity": [["user", None]], "ops": {"consumer_byte_rate": 2e6, "request_percentage": 50}},
        {"entity": [["user", "x"]], "ops": {"bogus": 1}},
        {"entity": [], "ops": {"producer_byte_rate": 1}},
    ]
    records, refused = ops.alter_client_quotas(image, entries)
    assert refused == {
        2: "Invalid configuration key bogus (known: producer_byte_rate, consumer_byte_rate, "
        "request_percentage, controller_mutation_rate)",
        3: "Invalid empty client quota entity",
    }
    for r in records:
        image.apply(r)
    assert image.client_quotas == {
        entity_key([("user", "alice"), ("client-id", "app")]): {"producer_byte_rate": 1e6},
        entity_key([("user", None)]): {"consumer_byte_rate": 2e6, "request_percentage": 50.0},
    }
    # Setting what is already set, or removing what is not there, writes nothing.
    again, _ = ops.alter_client_quotas(image, entries[:2])
    assert again == []
    gone, _ = ops.alter_client_quotas(
        image, [{"entity": [["user", None]], "ops": {"request_percentage": None, "x": None}}]
    )
    assert gone == [
        {
            "type": "client_quota",
            "entity": [["user", None]],
            "key": "request_percentage",
            "value": None,
        }
    ]
    restored = MetadataImage.from_dict(orjson.loads(image.encoded()))
    assert restored.client_quotas == image.client_quotas
    assert MetadataImage.from_dict(image.to_dict()).client_quotas == image.client_quotas
    assert image.copy().client_quotas == image.client_quotas


def test_principal_names_are_kafkas_user_names() -> None:
    assert user_of("User:alice") == "alice"
    assert user_of("User:ANONYMOUS") == "ANONYMOUS"


def _image(quotas: dict) -> MetadataImage:
    image = MetadataImage()
    image.client_quotas = {entity_key(e): dict(v) for e, v in quotas.items()}
    image.quotas_version = 1
    return image


# -- over the wire ----------------------------------------------------------------------


class Client(Raw):
    """A Kafka connection with a client id of its own."""

    def __init__(self, b: Any, client_id: str) -> None:
        super().__init__(b)
        self.client_id = client_id

    def _frame(self, req: Any) -> bytes:
        hs = req.__header_schema__
        buf = io.BytesIO()
        header = hs(
            request_api_key=req.__api_key__,
            request_api_version=req.__version__,
            correlation_id=self.corr,
            client_id=self.client_id,
        )
        entity_writer(hs)(buf, header)
        entity_writer(type(req))(buf, req)
        return struct.pack(">i", len(buf.getvalue())) + buf.getvalue()


def alter(r: Raw, *entries: tuple[dict, dict], validate_only: bool = False) -> list:
    """entries: ({entity type: name or None}, {key: value or None to remove})."""
    req = acq.AlterClientQuotasRequest(
        entries=tuple(
            acq.EntryData(
                entity=tuple(acq.EntityData(entity_type=t, entity_name=n) for t, n in e.items()),
                ops=tuple(
                    acq.OpData(key=k, value=f64(v if v is not None else 0.0), remove=v is None)
                    for k, v in ops.items()
                ),
            )
            for e, ops in entries
        ),
        validate_only=validate_only,
    )
    return list(r.call(req).entries)


def describe(r: Raw, *components: tuple[str, int, str | None], strict: bool = False) -> Any:
    return r.call(
        dcq.DescribeClientQuotasRequest(
            components=tuple(
                dcq.ComponentData(entity_type=t, match_type=i8(m), match=s)
                for t, m, s in components
            ),
            strict=strict,
        )
    )


def described(resp: Any) -> dict:
    return {
        tuple((e.entity_type, e.entity_name) for e in entry.entity): {
            v.key: v.value for v in entry.values
        }
        for entry in resp.entries
    }


@pytest.fixture
def clients() -> Iterator:
    """clients(broker, client id="admin") -> a connection, closed after the test."""
    opened: list[Client] = []

    def connect(b: Any, client_id: str = "admin") -> Client:
        opened.append(Client(b, client_id))
        return opened[-1]

    yield connect
    for c in opened:
        c.close()


@pytest.fixture
def quota_broker(broker_factory: Any) -> Any:
    return broker_factory(*WINDOWS)


def test_quotas_are_set_described_and_removed(quota_broker: Any, clients: Any) -> None:
    r = clients(quota_broker)
    assert described(describe(r)) == {}
    ok = alter(
        r,
        ({"client-id": "slow"}, {"producer_byte_rate": 1048576.0}),
        ({"user": "alice", "client-id": None}, {"consumer_byte_rate": 2e6}),
        ({"user": None}, {"request_percentage": 50.0, "controller_mutation_rate": 5.0}),
    )
    assert [code(e) for e in ok] == [0, 0, 0]
    everything = described(describe(r))
    assert everything == {
        (("client-id", "slow"),): {"producer_byte_rate": 1048576.0},
        (("client-id", None), ("user", "alice")): {"consumer_byte_rate": 2e6},
        (("user", None),): {"controller_mutation_rate": 5.0, "request_percentage": 50.0},
    }
    # Non-strict: every entity with a user part; strict: only the user-only ones.
    users = described(describe(r, ("user", 2, None)))
    assert set(users) == {(("client-id", None), ("user", "alice")), (("user", None),)}
    assert set(described(describe(r, ("user", 2, None), strict=True))) == {(("user", None),)}
    assert set(described(describe(r, ("user", 0, "alice")))) == {
        (("client-id", None), ("user", "alice"))
    }
    assert set(described(describe(r, ("client-id", 1, None)))) == {
        (("client-id", None), ("user", "alice"))
    }
    bad = describe(r, ("user", 0, None))
    assert code(bad) == ErrorCode.invalid_request and "MATCH_TYPE_EXACT" in bad.error_message
    # validate_only writes nothing; removing the last key removes the entity.
    assert [
        code(e)
        for e in alter(r, ({"client-id": "x"}, {"producer_byte_rate": 5.0}), validate_only=True)
    ] == [0]
    assert (("client-id", "x"),) not in described(describe(r))
    assert code(alter(r, ({"client-id": "slow"}, {"producer_byte_rate": None}))[0]) == 0
    assert (("client-id", "slow"),) not in described(describe(r))


def test_bad_quotas_are_invalid_request_with_the_reason(quota_broker: Any, clients: Any) -> None:
    r = clients(quota_broker)
    results = alter(
        r,
        ({"client-id": "a"}, {"producer_byte_rate": -5.0}),
        ({"client-id": "b"}, {"producer_bytes_rate": 5.0}),
        ({"client-id": "c"}, {"consumer_byte_rate": 1.5}),
        ({"client-id": ""}, {"request_percentage": 5.0}),
        ({"group": "e"}, {"producer_byte_rate": 5.0}),
        ({"client-id": "ok"}, {"producer_byte_rate": 5.0}),
    )
    assert [code(e) for e in results] == [ErrorCode.invalid_request] * 5 + [0]
    reasons = [e.error_message for e in results]
    assert "must not be negative" in reasons[0]
    assert "Invalid configuration key producer_bytes_rate" in reasons[1]
    assert "must be a Long value" in reasons[2]
    assert "Empty client-id not supported" in reasons[3]
    assert "Unhandled client quota entity type: group" in reasons[4]
    # Each entity alone: the valid one is set, none of the others.
    assert set(described(describe(r))) == {(("client-id", "ok"),)}


def _produce_throttle(b: Any, client_id: str, topic: str, size: int) -> int:
    c = Client(b, client_id)
    try:
        resp = c.call(produce(9, topic, record_batch([b"x" * size])))
        assert code(resp.responses[0].partition_responses[0]) == 0
        return int(resp.throttle_time.total_seconds() * 1000)
    finally:
        c.close()


def test_precedence_user_and_client_over_user_over_client_over_defaults(
    quota_broker: Any, clients: Any
) -> None:
    """A PLAINTEXT connection is user ANONYMOUS (Kafka's name): one 200 KB produce over
    2 s of measure is 100 KB/s, over a 1000 B/s quota and under a 10 MB/s one."""
    b = quota_broker
    b.create_topic("prec")
    r = clients(b)
    slow, fast = {"producer_byte_rate": 1000.0}, {"producer_byte_rate": 1e7}

    def throttled(client: str) -> bool:
        return _produce_throttle(b, client, "prec", 200_000) > 0

    assert not throttled("c1")  # no quota anywhere
    alter(r, ({"client-id": None}, slow))
    assert throttled("c1") and throttled("c2")  # <default> client-id: each client its own
    alter(r, ({"client-id": "c2"}, fast))
    assert not throttled("c2")  # a client's own quota over the default
    alter(r, ({"user": None}, fast))
    assert not throttled("c1")  # <default> user over any client-id quota
    alter(r, ({"user": "ANONYMOUS"}, slow))
    assert throttled("c3")  # the user's own over <default> user
    alter(r, ({"user": None, "client-id": "c3"}, fast))
    assert throttled("c3")  # ... and over <default> user + client
    alter(r, ({"user": "ANONYMOUS", "client-id": None}, fast))
    assert not throttled("c4")  # user + <default> client over the user's own
    alter(r, ({"user": "ANONYMOUS", "client-id": "c4"}, slow))
    assert throttled("c4")  # user + client over everything


def _producer(b: Any, client_id: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": b.bootstrap,
            "client.id": client_id,
            "acks": 1,
            "linger.ms": 2,
            "batch.size": 16384,
            "queue.buffering.max.kbytes": 4096,
        }
    )


def _run_producer(p: Producer, topic: str, seconds: float, acked: list) -> None:
    """Produce 4 KB records (the batch and request overhead about 1 % of the bytes the
    broker counts) as fast as the client may for `seconds`; `acked` gets
    (time, bytes) of each delivery."""

    def done(err: Any, msg: Any) -> None:
        if err is None:
            acked.append((time.monotonic(), len(msg.value())))

    value = b"v" * 4000
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            p.produce(topic, value, on_delivery=done)
        except BufferError:
            p.poll(0.01)
            continue
        p.poll(0)
    p.flush(30)


def _rate(points: list, start: float, end: float) -> float:
    return sum(n for t, n in points if start <= t < end) / (end - start)


def test_two_producers_one_held_to_its_quota_the_other_not_slowed(quota_broker: Any) -> None:
    b = quota_broker
    b.create_topic("rates")
    r = Client(b, "admin")
    assert code(alter(r, ({"client-id": "slow"}, {"producer_byte_rate": float(MB)}))[0]) == 0
    r.close()
    slow_acked: list = []
    fast_acked: list = []
    threads = [
        threading.Thread(
            target=_run_producer, args=(_producer(b, cid), "rates", RUN_S, acked), daemon=True
        )
        for cid, acked in (("slow", slow_acked), ("fast", fast_acked))
    ]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Past the first burst (the measure starts as if (samples - 1) windows had passed),
    # over several cycles of samples expiring.
    slow = _rate(slow_acked, t0 + 2, t0 + RUN_S)
    fast = _rate(fast_acked, t0 + 2, t0 + RUN_S)
    assert slow == pytest.approx(MB, rel=0.1), f"slow producer at {slow / MB:.2f} MB/s"
    assert fast > 3 * slow, f"the other producer at {fast / MB:.2f} MB/s"


def _run_consumer(
    b: Any, client_id: str, topic: str, total: int, seconds: float, got: list
) -> None:
    """Read the topic from the start for `seconds` or until `total` bytes came; `got`
    gets (time, bytes) of each record."""
    c = Consumer(
        {
            "bootstrap.servers": b.bootstrap,
            "client.id": client_id,
            "group.id": f"g-{client_id}",
            "enable.auto.commit": False,
            "max.partition.fetch.bytes": 131072,
            "fetch.max.bytes": 262144,
            "message.max.bytes": 262144,
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    end = time.monotonic() + seconds
    seen = 0
    try:
        while time.monotonic() < end and seen < total:
            msg = c.poll(0.2)
            if msg is None or msg.error():
                continue
            seen += len(msg.value())
            got.append((time.monotonic(), len(msg.value())))
    finally:
        c.close()


def test_two_consumers_one_held_to_its_quota_the_other_not_slowed(
    quota_broker: Any, clients: Any
) -> None:
    b = quota_broker
    b.create_topic("reads")
    p = _producer(b, "filler")
    for _ in range(4 * 1024):
        while True:
            try:
                p.produce("reads", b"r" * 4000)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(30) == 0
    total = 4 * 1024 * 4000
    assert (
        code(alter(clients(b), ({"client-id": "slow"}, {"consumer_byte_rate": float(MB)}))[0]) == 0
    )
    slow_got: list = []
    fast_got: list = []
    threads = [
        threading.Thread(
            target=_run_consumer, args=(b, cid, "reads", total, RUN_S, got), daemon=True
        )
        for cid, got in (("slow", slow_got), ("fast", fast_got))
    ]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    slow = _rate(slow_got, t0 + 2, t0 + RUN_S)
    assert slow == pytest.approx(MB, rel=0.1), f"slow consumer at {slow / MB:.2f} MB/s"
    assert sum(n for _, n in fast_got) == total  # the other read everything meanwhile
    fast = total / (fast_got[-1][0] - t0)
    assert fast > 3 * slow, f"the other consumer at {fast / MB:.2f} MB/s"


def _create_many(version: int, names: list[str]) -> Any:
    one = create_topics(version, names[0])
    topics = tuple(dataclasses.replace(one.topics[0], name=n) for n in names)
    return dataclasses.replace(one, topics=topics)


def test_a_topic_creation_storm_is_slowed_to_the_quota(quota_broker: Any, clients: Any) -> None:
    """controller_mutation_rate 5 partitions/s (a bucket of 2 windows: 10): in one
    request the topics past the bucket are THROTTLING_QUOTA_EXCEEDED (v6+, Kafka's
    strict mode) or all made and the answer throttled (older versions); a storm of
    single creations, each refused one asked again as Kafka's admin client does, is
    slowed to the quota while other clients are answered. What is
    asserted is what the bucket allows, whatever the time between requests: a request
    of more topics than a full bucket holds is throttled, and the mutations since a
    moment took at least (those past a full bucket) / 5 s."""
    b = quota_broker
    admin = clients(b)
    assert code(alter(admin, ({"client-id": "storm"}, {"controller_mutation_rate": 5.0}))[0]) == 0
    storm = clients(b, "storm")
    first = storm.call(_create_many(7, [f"s{i}" for i in range(14)]))
    codes = [code(t) for t in first.topics]
    assert codes[:11] == [0] * 11  # 10 tokens, and the request that overdraws
    assert codes[11:] == [ErrorCode.throttling_quota_exceeded] * 3
    assert first.topics[11].error_message == "The throttling quota has been exceeded."
    assert first.throttle_time.total_seconds() > 0
    # The throttled connection is muted meanwhile; the next request waits it out. A
    # permissive (v5) request makes all its topics: 12, more than the bucket holds
    # however long it refilled (at most 10), so it is throttled.
    t0 = time.monotonic()
    old = storm.call(_create_many(5, [f"old{i}" for i in range(12)]))
    assert [code(t) for t in old.topics] == [0] * 12
    assert old.throttle_time.total_seconds() > 0
    # A storm of one topic per request. Strict (StrictControllerMutationQuota): the
    # request that overdraws the bucket goes through unthrottled, the next is refused
    # with the time until the bucket is back at zero, and the connection is muted that
    # long; the refused topic is asked again (the admin client's retry of
    # THROTTLING_QUOTA_EXCEEDED, KIP-599), so all are made, slowed to the quota.
    latencies: list[float] = []
    stop = threading.Event()

    def other_client() -> None:
        c = Client(b, "bystander")
        try:
            while not stop.is_set():
                t = time.monotonic()
                c.call(
                    MetadataRequest(
                        topics=None,
                        allow_auto_topic_creation=False,
                        include_topic_authorized_operations=False,
                    )
                )
                latencies.append(time.monotonic() - t)
        finally:
            c.close()

    bystander = threading.Thread(target=other_client, daemon=True)
    bystander.start()
    refused = 0
    for i in range(15):
        while (resp := storm.call(create_topics(7, f"one{i}"))).topics[0].error_code:
            assert code(resp.topics[0]) == ErrorCode.throttling_quota_exceeded, resp
            assert resp.throttle_time.total_seconds() > 0
            refused += 1
            assert refused < 60, "refused again and again"
    end = time.monotonic()
    stop.set()
    bystander.join(10)
    # Since t0 the bucket held at most 10 tokens and gained 5/s. The strict requests
    # each found it at 0 or more: the 12 + 14 mutations before the last one took at
    # least (26 - 10) / 5 s, however slow or fast the machine answered.
    assert end - t0 >= (12 + 14 - 10) / 5, f"26 topics in {end - t0:.1f} s at 5/s"
    assert latencies and max(latencies) < (end - t0) / 3


def _kafka_tool(name: str, *args: str, timeout: float = 120) -> str:
    """A Kafka 4.4 tool from the jars scripts/fetch-jars.sh left in .cache (the test
    is skipped without them)."""
    if shutil.which("java") is None or not any(KAFKA44_JARS_DIR.glob("kafka-clients-*.jar")):
        pytest.skip("the Kafka 4.4 jars are not in .cache/jars (scripts/fetch-jars.sh)")
    cmd = [
        "java",
        f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
        "-Dstrait.loglevel=WARN",
        "-cp",
        f"{KAFKA44_JARS_DIR}/*",
        KAFKA44_TOOLS[name],
        *args,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{name} {' '.join(args)}: exit {r.returncode}\n{r.stderr[-3000:]}"
    return r.stdout


def _perf_test(b: Any, client_id: str, records: int) -> tuple[float, dict[str, float]]:
    """kafka-producer-perf-test of `records` of 1000 bytes: the run's seconds (its first
    send to its last acknowledgement, by the tool's own count) and the producer's
    metrics at the end (--print-metrics), by name without the client id."""
    out = _kafka_tool(
        "kafka-producer-perf-test",
        "--topic",
        "java-rates",
        "--num-records",
        str(records),
        "--record-size",
        "1000",
        "--throughput",
        "-1",
        "--print-metrics",
        "--producer-props",
        f"bootstrap.servers={b.bootstrap}",
        f"client.id={client_id}",
        "acks=1",
        "batch.size=16384",
        "linger.ms=2",
    )
    lines = out.splitlines()
    # "1200 records sent, 67.4 records/sec (0.06 MB/sec), ...": the last is the run's.
    whole = [line for line in lines if " records sent, " in line][-1]
    sent, per_s = whole.split(" records/sec")[0].split(" records sent, ")
    assert int(sent) == records, whole
    metrics = {}
    for line in lines:  # "producer-metrics:produce-throttle-time-max:{client-id=x} : 12.000"
        name, sep, value = line.rpartition(" : ")
        if sep and ":{" in name and name.startswith("producer-metrics:"):
            metrics[name.split(":{")[0].removeprefix("producer-metrics:")] = float(value)
    return records / float(per_s), metrics


def test_java_tools_set_and_read_quotas_and_the_java_producer_honours_them(
    quota_broker: Any,
) -> None:
    """kafka-configs sets and describes quotas; the Java producer is held to its
    producer_byte_rate and told of it. Asserted from the broker's own counters against
    the quota's math, not from the producer's rates (a loaded machine slows a client
    below its quota, which is no fault of the broker's): the bytes the broker took fit
    the quota over the run (plus what the measure allows at once), the throttle it gave
    is at most the time those bytes take at the quota, and the producer heard it."""
    quota = 65536  # bytes/s
    b = quota_broker
    b.create_topic("java-rates")
    configs = ("kafka-configs", "--bootstrap-server", b.bootstrap)
    _kafka_tool(
        *configs,
        "--alter",
        "--add-config",
        "producer_byte_rate=65536",
        "--entity-type",
        "clients",
        "--entity-name",
        "javaslow",
    )
    _kafka_tool(
        *configs,
        "--alter",
        "--add-config",
        "consumer_byte_rate=2000000",
        "--entity-type",
        "users",
        "--entity-default",
    )
    described = _kafka_tool(
        *configs, "--describe", "--entity-type", "clients", "--entity-name", "javaslow"
    )
    assert "Quota configs for client-id 'javaslow' are producer_byte_rate=65536.0" in described
    assert "consumer_byte_rate=2000000.0" in _kafka_tool(
        *configs, "--describe", "--entity-type", "users", "--entity-default"
    )
    # 64 KiB/s, well under what the Java producer reaches here (0.4-1 MB/s on a busy
    # 2-core machine): 1.2 MB is a first burst, then about 17 s at the quota.
    seconds, slow = _perf_test(b, "javaslow", 1_200)
    _, fast = _perf_test(b, "javafast", 1_200)
    served = scrape(b.http)
    labels = {"straitmq_quota_type": "producer_byte_rate", "straitmq_quota_client_id": "javaslow"}
    took = total(served, "straitmq_broker_quota_io_bytes_total", **labels)
    throttled = total(served, "straitmq_broker_quota_throttle_time_seconds_total", **labels)
    assert took >= 1_200 * 1000, took  # every record, and the requests around them
    # Held to the quota: what the measure lets through at once is (samples - 1)
    # windows of it and the request that goes over (a batch of 16 KiB), the rest at
    # most the quota over the run; the tool's run spans every request the broker took.
    samples = int(WINDOWS[1])
    allowed = quota * (seconds + samples) + 64 * 1024
    assert took <= allowed, f"{took:.0f} bytes in {seconds:.1f} s at {quota} bytes/s"
    # Throttled, but by no more than the bytes taken need at the quota.
    assert 0 < throttled <= took / quota, f"throttled {throttled:.1f} s for {took:.0f} bytes"
    # The Java producer read the throttle from the answers; the other was never throttled.
    assert slow["produce-throttle-time-max"] > 0, slow
    assert not fast["produce-throttle-time-max"] > 0, fast
    assert not [
        ls for ls, _ in served["straitmq_broker_quota_io_bytes_total"] if "javafast" in ls.values()
    ]


def test_throttle_time_and_byte_rates_are_on_metrics_for_clients_with_a_quota(
    quota_broker: Any, clients: Any
) -> None:
    """Only clients a quota applies to get series (bounded cardinality); the quotas
    dashboard's every metric is served once a client is throttled."""
    b = quota_broker
    b.create_topic("metered")
    assert (
        code(alter(clients(b), ({"client-id": "metered"}, {"producer_byte_rate": 1000.0}))[0]) == 0
    )
    assert _produce_throttle(b, "metered", "metered", 100_000) > 0
    assert _produce_throttle(b, "free", "metered", 100_000) == 0
    served = scrape(b.http)
    labels = {
        "straitmq_quota_type": "producer_byte_rate",
        "straitmq_quota_user": "",
        "straitmq_quota_client_id": "metered",
    }
    throttle = "straitmq_broker_quota_throttle_time_seconds_total"
    assert [ls for ls, _ in served[throttle]] == [labels]
    assert total(served, throttle, **labels) > 0
    assert total(served, "straitmq_broker_quota_io_bytes_total", **labels) >= 100_000
    assert total(served, "straitmq_broker_quota_limit", **labels) == 1000.0
    check_served(dashboards()["quotas"], served, "a broker with a throttled client")


def test_the_operators_admin_client_keeps_a_users_quotas_exactly_its_spec(
    quota_broker: Any, clients: Any
) -> None:
    """What the User reconciler does, over the broker's HTTP API: spec.quotas made the
    user's own quotas exactly, visible to Kafka clients; a bad value is a 400 with the
    reason; deleting the User removes them."""

    async def run() -> None:
        async with AdminClient(quota_broker.http, 10.0) as admin:
            want = user.quota_values({"producerByteRate": 1048576, "requestPercentage": 25.5})
            changes = user.quota_changes(want, await admin.user_quotas("alice"))
            assert changes == {"producer_byte_rate": 1048576.0, "request_percentage": 25.5}
            await admin.alter_user_quotas("alice", changes)
            assert await admin.user_quotas("alice") == want
            want = user.quota_values({"consumerByteRate": 2000000})
            changes = user.quota_changes(want, await admin.user_quotas("alice"))
            assert changes == {
                "consumer_byte_rate": 2e6,
                "producer_byte_rate": None,
                "request_percentage": None,
            }
            await admin.alter_user_quotas("alice", changes)
            assert await admin.user_quotas("alice") == {"consumer_byte_rate": 2e6}
            with pytest.raises(AdminError) as e:
                await admin.alter_user_quotas("alice", {"consumer_byte_rate": "fast"})  # type: ignore[dict-item]
            assert e.value.status == 400 and "must be a number" in e.value.message

    asyncio.run(run())
    assert described(describe(clients(quota_broker), ("user", 0, "alice"), strict=True)) == {
        (("user", "alice"),): {"consumer_byte_rate": 2e6}
    }
    with pytest.raises(user.UserProblem, match=r"quotas\.producerByteRate must be a number >= 0"):
        user.quota_values({"producerByteRate": -1})
    with pytest.raises(user.UserProblem, match="unknown quota 'producer_byte_rate'"):
        user.quota_values({"producer_byte_rate": 1})


def test_rest_produce_and_consume_count_against_the_principals_quotas(
    quota_broker: Any, clients: Any
) -> None:
    """Without authentication a REST caller is user ANONYMOUS; X-Client-Id names its
    client. Over quota the answer waits out the throttle and says so; a consume over
    quota answers no records, from the same offset."""
    b = quota_broker
    b.create_topic("rest")
    quota = {"producer_byte_rate": 50_000.0, "consumer_byte_rate": 50_000.0}
    assert code(alter(clients(b), ({"user": "ANONYMOUS", "client-id": "rest-slow"}, quota))[0]) == 0
    records = {"records": [{"value": "x" * 1000, "partition": 0} for _ in range(100)]}

    def post(client_id: str | None) -> tuple[float, dict, str | None]:
        headers = {"Content-Type": "application/json"}
        if client_id:
            headers["X-Client-Id"] = client_id
        req = urllib.request.Request(
            f"{b.http}/api/v1/topics/rest/records", orjson.dumps(records), headers, method="POST"
        )
        t = time.monotonic()
        with urllib.request.urlopen(req, timeout=60) as r:
            return time.monotonic() - t, orjson.loads(r.read()), r.headers.get("X-Throttle-Time-Ms")

    took, answer, throttle = post("rest-slow")
    assert answer["offsets"][0]["count"] == 100
    # ~100 KB over at least one window of 1 s is twice the quota: one more window.
    assert throttle is not None and 700 <= int(throttle) <= 1300, throttle
    assert took >= int(throttle) / 1000 * 0.9
    assert post("rest-fast")[2] is None

    def get(client_id: str) -> tuple[dict, str | None]:
        req = urllib.request.Request(
            f"{b.http}/api/v1/topics/rest/partitions/0/records?offset=0&limit=1000",
            headers={"X-Client-Id": client_id},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return orjson.loads(r.read()), r.headers.get("X-Throttle-Time-Ms")

    fast, throttle = get("rest-fast")
    assert len(fast["records"]) == 200 and throttle is None
    slow, throttle = get("rest-slow")
    assert slow["records"] == [] and slow["next_offset"] == 0 and int(throttle) > 0


def test_only_a_requests_own_running_time_counts_toward_request_percentage() -> None:
    """What the listener charges to request_percentage: the steps of the handler's
    coroutine, not its waits (a long-polling Fetch costs nothing while it waits)."""

    async def handler() -> str:
        await asyncio.sleep(0.3)  # a wait: not counted
        spin = time.perf_counter() + 0.05
        while time.perf_counter() < spin:  # running: counted
            pass
        return "answer"

    async def run() -> tuple[str, float]:
        timed = _Timed(handler())
        return await timed, timed.spent

    answer, spent = asyncio.run(run())
    assert answer == "answer"
    assert 0.05 <= spent < 0.25, spent

    async def cancel_passes_through() -> bool:
        seen: list[str] = []

        async def waits() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        async def wrapped() -> None:
            await _Timed(waits())

        task = asyncio.get_running_loop().create_task(wrapped())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return seen == ["cancelled"]

    assert asyncio.run(cancel_passes_through())


def _listener(image: MetadataImage, handler: Any) -> tuple[KafkaConnection, ClientQuotas]:
    """A listener connection, in this process, serving Metadata with `handler`."""
    quotas = ClientQuotas(lambda: image, 2, 1000.0)
    deps = ListenerDeps(
        BrokerMetrics(),
        set(),
        1 << 20,
        lambda: image,
        lambda *a: RequestContext(*a[:5], listener=a[5], security=a[6]),
        {3: ApiSpec(0, 12, handler)},
        quotas,
    )
    conn = KafkaConnection(deps)
    conn.security = ConnectionSecurity(None, lambda user, mech: None)
    return conn, quotas


def _metadata_frame(client_id: str) -> memoryview:
    """A Metadata v12 request as the listener frames it (no size prefix)."""
    req = MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    buf = io.BytesIO()
    hs = req.__header_schema__
    header = hs(
        request_api_key=req.__api_key__,
        request_api_version=req.__version__,
        correlation_id=1,
        client_id=client_id,
    )
    entity_writer(hs)(buf, header)
    entity_writer(type(req))(buf, req)
    return memoryview(buf.getvalue())


WAIT_S = 0.5  # each wait below: 50 percent-seconds of request_percentage if counted


@pytest.mark.parametrize(
    "wait",
    [
        "the handler's long poll",
        "loading the version's schemas",
    ],
)
def test_what_the_listener_charges_to_request_percentage_leaves_its_waits_out(
    wait: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request's waits are not its handling time, however long, on whatever machine:
    one request that waits WAIT_S (a long poll in its handler, or in a thread loading
    schemas) is charged a small part of it (its steps' time, which load only inflates
    by milliseconds). A wait counted would be the whole WAIT_S."""
    image = _image({(("client-id", "poller"),): {"request_percentage": 10.0}})

    async def handler(ctx: Any, body: Any) -> None:
        if wait == "the handler's long poll":
            await asyncio.sleep(WAIT_S)

    load_schemas(3, 12)
    if wait == "loading the version's schemas":
        real_load = server.load_schemas

        def slow_load(api_key: int, version: int) -> None:
            time.sleep(WAIT_S)  # a thread: kio importing a version's schema modules
            real_load(api_key, version)

        monkeypatch.setattr(server, "load_schemas", slow_load)
        server.LOADED.discard((3, 12))
    conn, quotas = _listener(image, handler)
    t0 = time.monotonic()
    asyncio.run(conn.handle(_metadata_frame("poller")))
    assert time.monotonic() - t0 >= WAIT_S  # it did wait
    sensor = quotas.sensors[(REQUEST_PERCENTAGE, "", "poller")]
    charged = sensor.recorded / 100.0  # percent-seconds: seconds of handling
    assert charged < WAIT_S / 2, f"charged {charged:.3f} s for a request that waited {WAIT_S} s"
    assert (3, 12) in server.LOADED


def test_a_long_polling_consumer_is_not_throttled_by_request_percentage(
    quota_broker: Any, clients: Any
) -> None:
    """Each Fetch long-polls an empty partition for 1 s. Counted, that wait alone would
    be 100 % of a thread against a 50 % quota: every answer throttled (a window). Not
    counted, the fetches cost their own steps' time: milliseconds, which a loaded
    machine stretches but not to the 0.5 s of handling the quota allows in the measured
    window. The answers and the broker's throttle counter both say no throttle."""
    b = quota_broker
    b.create_topic("idle")
    alter(clients(b), ({"client-id": "poller"}, {"request_percentage": 50.0}))
    # The first Fetch v12 on this broker loads its schemas in a thread (a wait that is
    # not charged either, the test above); this test is about the long poll.
    clients(b, "warm-up").call(fetch(12, "idle", 0))
    c = clients(b, "poller")
    for _ in range(3):
        req = dataclasses.replace(fetch(12, "idle", 0), max_wait=timedelta(milliseconds=1000))
        t = time.monotonic()
        resp = c.call(req)
        assert time.monotonic() - t >= 0.9, "the Fetch did not wait: no long poll tested"
        assert resp.throttle_time.total_seconds() == 0
    throttled = total(
        scrape(b.http),
        "straitmq_broker_quota_throttle_time_seconds_total",
        straitmq_quota_type="request_percentage",
        straitmq_quota_client_id="poller",
    )
    assert throttled == 0
