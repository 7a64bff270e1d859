"""Connection creation rate quotas per client address (KIP-612: `ip` quota entities,
`connection_creation_rate`), set with Kafka 4.4's `kafka-configs --entity-type ips`.

The validation, the level gate and the rate are checked sans-IO on a fake clock; the
enforcement against a real broker process with raw connections from two loopback
addresses: past its quota, a new connection from the address is answered nothing and
closed once its throttle has passed, as Kafka's acceptor does, while the other address
connects as before. ip entities are written only once `straitmq.metadata.version` 3 is
finalized: release 0.2.0 would store them and enforce nothing.
"""

from __future__ import annotations

import socket
import time

import pytest
from straitmq.broker.quotas import ClientQuotas, ConnectionRates
from straitmq.controller import operations as ops
from straitmq.metadata import features
from straitmq.metadata.image import MetadataImage
from straitmq.metadata.quotas import QuotaError, check_entity, check_ops
from test_limits import _api_versions as round_trip
from test_quotas import _kafka_tool
from waiting import wait_for

from straitmq.admin_client import request_sync

pytestmark = pytest.mark.timeout(180)

RATE = "connection_creation_rate"


# -- validation and the level gate ------------------------------------------------------


def test_ip_entities_are_checked_as_kafka_checks_them() -> None:
    assert check_entity([("ip", "127.0.0.1")]) == (("ip", "127.0.0.1"),)
    assert check_entity([("ip", None)]) == (("ip", None),)  # the ip <default>
    assert check_entity([("ip", "::1")]) == (("ip", "::1"),)
    for pairs, why in (
        ([("ip", "not-an-address")], "not-an-address is not a valid IP or resolvable host"),
        ([("ip", "10.0.0.1"), ("user", "alice")], "Invalid empty client quota entity"),
        ([("ip", "")], "Empty ip not supported"),
    ):
        with pytest.raises(QuotaError, match=why):
            check_entity(pairs)
    ip = check_entity([("ip", "10.0.0.1")])
    assert check_ops({RATE: 5}, ip) == {RATE: 5.0}
    for quotas, why in (
        ({RATE: 1.5}, "must be an Integer value"),
        ({RATE: 2**31}, "must be an Integer value"),
        ({RATE: -1}, "must not be negative"),
        ({"producer_byte_rate": 1}, "Invalid configuration key producer_byte_rate"),
    ):
        with pytest.raises(QuotaError, match=why):
            check_ops(quotas, ip)
    # connection_creation_rate is an ip entity's key only.
    with pytest.raises(QuotaError, match=f"Invalid configuration key {RATE}"):
        check_ops({RATE: 5}, check_entity([("user", "alice")]))


def _image_at(level: int) -> MetadataImage:
    image = MetadataImage()
    for name, value in features.levels_at(level).items():
        image.apply({"type": "feature_level", "name": name, "level": value})
    return image


def test_ip_quotas_wait_for_the_level_that_reads_them() -> None:
    entry = {"entity": [["ip", "10.0.0.1"]], "ops": {RATE: 5}}
    # At release 0.2.0's level (it would store the quota and enforce nothing): refused.
    records, refused = ops.alter_client_quotas(_image_at(2), [entry])
    assert records == []
    assert "ip quotas need straitmq.metadata.version=3 finalized" in refused[0], refused
    # Removing one is always allowed (nothing is written at level 2 that 0.2.0 misreads).
    records, refused = ops.alter_client_quotas(
        _image_at(2), [{"entity": [["ip", "10.0.0.1"]], "ops": {RATE: None}}]
    )
    assert refused == {} and records == []
    records, refused = ops.alter_client_quotas(_image_at(3), [entry])
    assert refused == {}
    assert records == [
        {"type": "client_quota", "entity": [["ip", "10.0.0.1"]], "key": RATE, "value": 5.0}
    ]


# -- the rate, on a fake clock ------------------------------------------------------------


def test_a_connection_past_its_addresss_rate_is_throttled_and_not_counted() -> None:
    image = MetadataImage()
    image.apply({"type": "client_quota", "entity": [["ip", "10.0.0.1"]], "key": RATE, "value": 2})
    rates = ConnectionRates(lambda: image, samples=3, window_ms=1000.0)
    # The rate is measured over at least (samples - 1) windows: 4 connections at once
    # are 2 per second; the fifth is past the quota.
    assert [rates.admit("10.0.0.1", 0.0) for _ in range(4)] == [0, 0, 0, 0]
    throttle = rates.admit("10.0.0.1", 0.0)
    assert 0 < throttle <= 3000, throttle
    # Refused connections do not count: once the windows have moved on, it is admitted.
    assert rates.admit("10.0.0.1", 2500.0) == 0
    # Another address has no quota (no <default>), nor does a malformed one.
    assert all(rates.admit("10.0.0.2", 0.0) == 0 for _ in range(50))
    # The ip <default> gives every other address an allowance of its own.
    image.apply({"type": "client_quota", "entity": [["ip", None]], "key": RATE, "value": 1})
    assert rates.quota("10.0.0.2") == 1 and rates.quota("10.0.0.1") == 2
    assert [rates.admit("10.0.0.2", 10_000.0) for _ in range(3)][:2] == [0, 0]
    assert rates.admit("10.0.0.2", 10_000.0) > 0
    assert rates.admit("10.0.0.3", 10_000.0) == 0
    # Addresses are compared in their canonical form.
    image.apply({"type": "client_quota", "entity": [["ip", "0:0::0:1"]], "key": RATE, "value": 7})
    assert rates.quota("::1") == 7
    # A quota removed: no rate kept, every connection admitted.
    for entity in ([["ip", "10.0.0.1"]], [["ip", None]], [["ip", "0:0::0:1"]]):
        image.apply({"type": "client_quota", "entity": entity, "key": RATE, "value": None})
    assert rates.quota("10.0.0.1") is None
    assert all(rates.admit("10.0.0.1", 20_000.0) == 0 for _ in range(50))


def test_the_addresses_kept_are_bounded() -> None:
    image = MetadataImage()
    image.apply({"type": "client_quota", "entity": [["ip", None]], "key": RATE, "value": 100})
    rates = ConnectionRates(lambda: image, max_addresses=10)
    for i in range(100):
        assert rates.admit(f"10.0.1.{i}", 0.0) == 0
    assert len(rates._rates) == 10


# -- a real broker -----------------------------------------------------------------------


def _api_versions(port: int, source: str) -> bool | None:
    """One new connection from `source`: True when ApiVersions v0 is answered, False
    when the broker closes it unanswered, None when neither happens within 10 s."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as s:
        try:
            return round_trip(s)
        except TimeoutError:
            return None


def test_kafka_configs_sets_an_ip_quota_and_the_broker_holds_new_connections_to_it(
    broker_factory,
) -> None:
    b = broker_factory("--quota-window-num", "2")
    configs = ("kafka-configs", "--bootstrap-server", b.bootstrap)
    _kafka_tool(
        *configs, "--alter", "--add-config", f"{RATE}=2",
        "--entity-type", "ips", "--entity-name", "127.0.0.1",
    )  # fmt: skip
    described = _kafka_tool(*configs, "--describe", "--entity-type", "ips")
    assert f"Quota configs for ip '127.0.0.1' are {RATE}=2.0" in described, described

    # Each broker takes the quota from its metadata: wait for the first refusal.
    outcomes: list[bool | None] = []

    def refused_once() -> bool:
        outcomes.append(_api_versions(b.port, "127.0.0.1"))
        return outcomes[-1] is False

    wait_for(refused_once, 60, "a connection from 127.0.0.1 refused", every=0)
    assert None not in outcomes, outcomes  # never left hanging: answered or closed
    # Refused connections are closed within the throttle (at most the 2 s window) and,
    # not counted, leave room: a connection later is answered again.
    started = time.monotonic()
    burst = [_api_versions(b.port, "127.0.0.1") for _ in range(10)]
    assert False in burst and None not in burst, burst
    assert time.monotonic() - started < 10 * 3.5
    wait_for(lambda: _api_versions(b.port, "127.0.0.1"), 15, "127.0.0.1 admitted again", 0.5)
    # Another address has no quota: every connection is answered.
    assert all(_api_versions(b.port, "127.0.0.2") for _ in range(20))
    refusals = request_sync(b.http, "GET", "/api/v1/cluster")["metrics"]["limit_refusals"]
    assert refusals[RATE] >= 2, refusals

    # Removed with kafka-configs: connections are admitted at any rate.
    _kafka_tool(
        *configs, "--alter", "--delete-config", RATE,
        "--entity-type", "ips", "--entity-name", "127.0.0.1",
    )  # fmt: skip
    wait_for(
        lambda: all(_api_versions(b.port, "127.0.0.1") for _ in range(15)),
        30,
        "127.0.0.1 unthrottled once its quota is gone",
        0.5,
    )


def test_an_image_loaded_from_a_snapshot_is_never_taken_for_the_one_before() -> None:
    """Quota lookups are cached against the image's quotas_version: an image built from
    a snapshot (a broker catching up) gets a version of its own, so the quotas in it are
    seen even when the image before it had never changed its quotas."""
    empty = MetadataImage()
    with_quota = MetadataImage()
    with_quota.apply({"type": "client_quota", "entity": [["ip", None]], "key": RATE, "value": 1})
    with_quota.apply(
        {"type": "client_quota", "entity": [["user", None]], "key": "producer_byte_rate",
         "value": 1024}
    )  # fmt: skip
    loaded = MetadataImage.from_dict(with_quota.to_dict())
    current = [empty]
    rates = ConnectionRates(lambda: current[0])
    quotas = ClientQuotas(lambda: current[0])
    assert rates.quota("10.0.0.1") is None and not quotas.enabled
    current[0] = loaded
    assert rates.quota("10.0.0.1") == 1 and quotas.enabled
