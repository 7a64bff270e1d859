"""Client quotas (Kafka's semantics): metadata records, DescribeClientQuotas and
AlterClientQuotas, and enforcement by throttle time and a muted connection.

The rate and throttle math, the token bucket, precedence, validation and the image are
checked sans-IO on a fake clock; the rest against real broker processes with real
clients (librdkafka through confluent-kafka, Kafka 4.1's Java tools), comparing the
rate of a client with a quota to one without (ratios, not absolute timings: the machine
is shared). The brokers here measure over 3 samples of 1 s (`--quota-window-num 3`)
instead of Kafka's 11, so a new client's first burst is over in seconds.
"""

from __future__ import annotations

import orjson
import pytest
from straitmq.broker.quotas import ClientQuotas, Rate, TokenBucket, throttle_ms, user_of
from straitmq.controller import operations as ops
from straitmq.metadata.image import MetadataImage
from straitmq.metadata.quotas import (
    QuotaError,
    check_value,
    entity_key,
    matches,
    parse_filter,
    precedence,
)

pytestmark = pytest.mark.timeout(180)
MB = 1024 * 1024
WINDOWS = ("--quota-window-num", "3")


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


def test_strict_mutation_quota_refuses_once_overdrawn_and_permissive_only_throttles() -> None:
    image = _image({(("client-id", "storm"),): {"controller_mutation_rate": 1.0}})
    quotas = ClientQuotas(lambda: image, 3, 1000.0)
    q = quotas.mutation("u", "storm", 0.0)
    assert q is not None
    assert not q.exceeded(0.0)
    q.record(5, 0.0)  # 3 tokens: the request that overdraws still goes through
    assert q.exceeded(0.0)
    assert q.throttle_ms == 2000
    assert quotas.mutation("u", "calm", 0.0) is None


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
