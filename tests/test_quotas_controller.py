"""Client quotas where Kafka enforces them outside a broker's own listener.

controller_mutation_rate is the active controller's (Kafka with KRaft: the brokers forward
CreateTopics, CreatePartitions and DeleteTopics, and ControllerApis charges the request's
principal and client id to one token bucket for the whole cluster), so three brokers do
not give a client three allowances. And a client of a request version before KIP-219
(Produce < v6) is told its throttle and muted, as every client is, not held back twice.

The bucket's math is checked sans-IO on a fake clock against Kafka's own unit test's
numbers (StrictControllerMutationQuotaTest); the rest with real processes, Kafka 4.4's
kafka-configs and raw requests (kio).
"""

from __future__ import annotations

import dataclasses
import subprocess
from types import SimpleNamespace
from typing import Any

import pytest
from cluster_support import Cluster, cluster_factory, wait_for
from conftest import record_batch
from kio.schema.errors import ErrorCode
from straitmq.controller.mutation_quotas import MutationQuotas
from straitmq.metadata.image import MetadataImage
from straitmq.metadata.quotas import entity_key
from test_errors import code, create_topics, produce, produce_partition
from test_metrics import scrape, total
from test_quotas import Client

from bench.javatools import KAFKA44_TOOLS, ensure_jars, java_cmd
from straitmq.admin_client import request_sync

pytestmark = pytest.mark.timeout(240)


def _image(quotas: dict) -> MetadataImage:
    image = MetadataImage()
    image.client_quotas = {entity_key(e): dict(v) for e, v in quotas.items()}
    image.quotas_version = 1
    return image


def kafka_configs(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    ensure_jars()
    r = subprocess.run(
        java_cmd(
            KAFKA44_TOOLS["kafka-configs"], ["--bootstrap-server", bootstrap, *args], jars="4.4"
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r


# -- the controller's bucket, on a fake clock -------------------------------------------


def test_strict_lets_the_overdraw_through_unthrottled_then_refuses_as_kafka() -> None:
    """Kafka's StrictControllerMutationQuotaTest: quota 10/s over 10 windows of 1 s (a
    bucket of 100); 90 then 90 are accepted with no throttle (the second overdraws to
    -80), the third is refused with 8000 ms."""
    image = _image({(("client-id", "storm"),): {"controller_mutation_rate": 10.0}})
    quotas = MutationQuotas(10, 1)
    a = quotas.allowance(image, "ANONYMOUS", "storm", 0.0)
    assert a is not None
    assert quotas.charge(a, 90, True, 0.0) == (False, 0)
    assert quotas.charge(a, 90, True, 0.0) == (False, 0)
    assert quotas.charge(a, 90, True, 0.0) == (True, 8000)
    # 5 s later 50 tokens came back: still -30, 3000 ms.
    assert quotas.charge(a, 90, True, 5000.0) == (True, 3000)
    # Permissive (older versions): everything goes through, throttled once below zero.
    b = quotas.allowance(image, "bob", "storm", 0.0)
    assert b is a  # one client id quota: shared by every user of that client id
    assert quotas.allowance(image, "bob", "calm", 0.0) is None
    fresh = MutationQuotas(10, 1)
    p = fresh.allowance(image, "u", "storm", 0.0)
    assert p is not None
    assert fresh.charge(p, 90, False, 0.0) == (False, 0)
    assert fresh.charge(p, 90, False, 0.0) == (False, 8000)


def test_a_quota_moved_to_another_entity_starts_a_new_bucket() -> None:
    quotas = MutationQuotas(2, 1)
    image = _image({(("client-id", "c"),): {"controller_mutation_rate": 1.0}})
    a = quotas.allowance(image, "u", "c", 0.0)
    assert a is not None
    quotas.charge(a, 5, False, 0.0)
    image.client_quotas = {entity_key([("user", "u")]): {"controller_mutation_rate": 3.0}}
    image.quotas_version = 2
    b = quotas.allowance(image, "u", "c", 0.0)
    assert b is not None and b is not a and b.quota == 3.0
    assert quotas.charge(b, 6, True, 0.0) == (False, 0)  # a full bucket of its own


# -- three brokers, one allowance ------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Any) -> Any:
    yield from cluster_factory(tmp_path)


def test_controller_mutation_rate_is_one_allowance_for_the_whole_cluster(
    cluster: Any,
) -> None:
    """controller_mutation_rate 0.5 partitions/s for client id `storm` (a bucket of 11
    windows: 5.5), set with Kafka's kafka-configs. Eight one-partition topics asked of
    each of the three brokers (CreateTopics v7, strict): the first broker's request takes
    the bucket (six topics: five and a half tokens, and the one that overdraws), the
    others find it spent. Counted per broker, each would have made six."""
    c: Cluster = cluster(brokers=3)
    kafka_configs(
        c.bootstrap,
        "--alter",
        "--entity-type",
        "clients",
        "--entity-name",
        "storm",
        "--add-config",
        "controller_mutation_rate=0.5",
    )
    for node in c.brokers.values():
        url = f"http://{node.host}:{node.http_port}"
        wait_for(
            lambda url=url: request_sync(url, "GET", "/api/v1/quotas?client-id=storm"),
            30,
            "the quota on every broker",
        )
    made: dict[int, list[str]] = {}
    refused, throttles = [], []
    for bid, node in sorted(c.brokers.items()):
        client = Client(SimpleNamespace(port=node.kafka_port), "storm")
        one = create_topics(7, f"b{bid}-0")
        topics = tuple(dataclasses.replace(one.topics[0], name=f"b{bid}-{i}") for i in range(8))
        try:
            resp = client.call(dataclasses.replace(one, topics=topics))
        finally:
            client.close()
        made[bid] = [t.name for t in resp.topics if code(t) == ErrorCode.none]
        for t in resp.topics:
            if code(t) != ErrorCode.none:
                assert code(t) == ErrorCode.throttling_quota_exceeded, t
                assert t.error_message == "The throttling quota has been exceeded."
                refused.append(t.name)
        throttles.append(resp.throttle_time.total_seconds())
    first = min(c.brokers)
    # The first request: 5.5 tokens and the topic that overdraws them, in its order.
    assert made[first][:6] == [f"b{first}-{i}" for i in range(6)], made
    # In all, what refilled at 0.5/s meanwhile more (a few seconds): far below the 18
    # that a bucket per broker would allow.
    created = sum(len(v) for v in made.values())
    assert 6 <= created <= 9, made
    assert len(refused) == 24 - created
    # Every answer carries the controller's throttle (each had a topic refused).
    assert all(t > 0 for t in throttles), throttles
    # The active controller's /metrics say the same, for the allowance of `storm`.
    ac = c.wait_active_controller()
    m = scrape(f"http://{ac.host}:{ac.http_port}")
    storm = {"straitmq_quota_client_id": "storm", "straitmq_quota_user": ""}
    assert total(m, "straitmq_controller_quota_mutations_total", **storm) == created, m.keys()
    assert total(m, "straitmq_controller_quota_throttled_total", **storm) == len(refused)
    assert total(m, "straitmq_controller_quota_throttle_time_seconds_total", **storm) > 0


# -- before KIP-219: told and muted, not held ---------------------------------------------


@pytest.mark.parametrize("version", [5, 9])
def test_an_old_producer_is_answered_at_once_with_its_throttle(
    broker_factory: Any, version: int
) -> None:
    """Produce v5 (before KIP-219) over producer_byte_rate: Kafka answers at once with
    throttle_time_ms and mutes the connection (ClientQuotaManager.throttle); the client
    does not wait by itself (shouldClientThrottle), so it waits once, for the mute. The
    broker's own request duration shows it did not also hold the answer back."""
    b = broker_factory("--quota-window-num", "2")
    b.create_topic("old-clients")
    admin = Client(b, "admin")
    try:
        from kio.schema.alter_client_quotas.v1 import request as acq
        from kio.static.primitive import f64

        entry = acq.EntryData(
            entity=(acq.EntityData(entity_type="client-id", entity_name="old"),),
            ops=(acq.OpData(key="producer_byte_rate", value=f64(10_000.0), remove=False),),
        )
        resp = admin.call(acq.AlterClientQuotasRequest(entries=(entry,), validate_only=False))
        assert [e.error_code for e in resp.entries] == [ErrorCode.none]
    finally:
        admin.close()

    def produced() -> tuple[float, float]:
        s = scrape(b.http)
        labels = {"kafka_api_name": "Produce"}
        return (
            total(s, "straitmq_broker_request_duration_seconds_count", **labels),
            total(s, "straitmq_broker_request_duration_seconds_sum", **labels),
        )

    count0, sum0 = produced()
    old = Client(b, "old")
    try:
        # 100 kB against 10 kB/s measured over at least one window: ~9 s of throttle.
        resp = old.call(produce(version, "old-clients", record_batch([b"x" * 100_000])))
    finally:
        old.close()
    assert code(produce_partition(resp)) == ErrorCode.none
    throttle_s = resp.throttle_time.total_seconds()
    assert throttle_s > 5, throttle_s
    count1, sum1 = produced()
    assert count1 - count0 == 1
    # The broker's time for the request is its handling, not the throttle as well.
    assert sum1 - sum0 < throttle_s / 2, (sum1 - sum0, throttle_s)
