"""Client quotas as metadata: Kafka's entities, keys, validation and describe filters.

A quota entity is a set of (entity type, name) pairs; a name of None is the type's
default (`<default>` in `kafka-configs`). The image keys them by `entity_key`, a sorted
tuple of pairs, so {user: alice, client-id: app} is one entity whichever order the
request named them in. Values are floats, as Kafka's QuotaRecord holds them.

Kafka's reference: ClientQuotaControlManager (validation), ClientQuotasImage (describe
filters), DefaultQuotaCallback / ClientQuotaManager (which entity applies: `precedence`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"

# Key -> whether Kafka types it LONG (a whole number) rather than DOUBLE.
CLIENT_QUOTA_KEYS: dict[str, bool] = {
    PRODUCER_BYTE_RATE: True,
    CONSUMER_BYTE_RATE: True,
    REQUEST_PERCENTAGE: False,
    CONTROLLER_MUTATION_RATE: False,
}

EntityKey = tuple[tuple[str, str | None], ...]

MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2


class QuotaError(ValueError):
    """INVALID_REQUEST, with Kafka's reason."""


def entity_key(pairs: Iterable[tuple[str, str | None]]) -> EntityKey:
    return tuple(sorted(pairs, key=lambda p: p[0]))


def check_entity(pairs: list[tuple[str, str | None]]) -> EntityKey:
    """The entity's key, or QuotaError saying what is wrong with it."""
    if not pairs:
        raise QuotaError("Invalid empty client quota entity")
    seen: set[str] = set()
    for kind, name in pairs:
        if kind in seen:
            raise QuotaError(f"Invalid empty client quota entity, duplicate entity entry {kind}")
        seen.add(kind)
        if kind == IP:
            # Kafka's connection_creation_rate per IP is enforced at accept time, which
            # StraitMQ does not do: refused rather than stored and silently ignored.
            raise QuotaError("ip quotas (connection_creation_rate) are not supported")
        if kind not in (USER, CLIENT_ID):
            raise QuotaError(f"Unhandled client quota entity type: {kind}")
        if name is not None and name == "":
            raise QuotaError(f"Empty {kind} not supported")
    return entity_key(pairs)


def check_value(key: str, value: object) -> float:
    """The value as a float, or QuotaError with the reason (unknown key, not a number,
    negative, not whole where Kafka wants a Long)."""
    whole = CLIENT_QUOTA_KEYS.get(key)
    if whole is None:
        raise QuotaError(f"Invalid configuration key {key} (known: {', '.join(CLIENT_QUOTA_KEYS)})")
    if isinstance(value, bool):
        raise QuotaError(f"Configuration {key} must be a number, got {value!r}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise QuotaError(f"Configuration {key} must be a number, got {value!r}") from None
    if math.isnan(number) or math.isinf(number):
        raise QuotaError(f"Configuration {key} must be a finite number, got {value!r}")
    if number < 0:
        raise QuotaError(f"Configuration {key} must not be negative, got {value!r}")
    if whole and abs(round(number) - number) > 1e-6:
        raise QuotaError(f"Configuration {key} must be a Long value")
    return number


def check_ops(ops: Mapping[str, object]) -> dict[str, float | None]:
    """{key: value or None to remove}, each value checked."""
    return {k: None if v is None else check_value(k, v) for k, v in ops.items()}


def parse_filter(components: list[tuple[str, int, str | None]]) -> tuple[dict, set]:
    """A DescribeClientQuotas filter as (exact {type: name or None}, types that must be
    there with any name); QuotaError for what Kafka refuses."""
    exact: dict[str, str | None] = {}
    specified: set[str] = set()
    for kind, match_type, match in components:
        if not kind:
            raise QuotaError("Invalid empty entity type.")
        if kind in exact or kind in specified:
            raise QuotaError(f"Entity type {kind} cannot appear more than once in the filter.")
        if kind not in (USER, CLIENT_ID, IP):
            raise QuotaError(f"Unknown entity type {kind}")
        if match_type == MATCH_EXACT:
            if match is None:
                raise QuotaError(
                    "Request specified MATCH_TYPE_EXACT, but set match string to null."
                )
            exact[kind] = match
        elif match_type == MATCH_DEFAULT:
            if match is not None:
                raise QuotaError(
                    "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."
                )
            exact[kind] = None
        elif match_type == MATCH_SPECIFIED:
            if match is not None:
                raise QuotaError(
                    "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."
                )
            specified.add(kind)
        else:
            raise QuotaError(f"Unknown match type {match_type}")
    has_ip = IP in exact or IP in specified
    if has_ip and (exact.keys() | specified) - {IP}:
        raise QuotaError(
            "Invalid entity filter component combination, IP filter component should not "
            "be used with user or clientId filter component."
        )
    return exact, specified


def matches(entity: EntityKey, exact: dict, specified: set, strict: bool) -> bool:
    names = dict(entity)
    if strict and len(names) != len(exact) + len(specified):
        return False
    for kind, name in exact.items():
        if kind not in names or names[kind] != name:
            return False
    return all(kind in names for kind in specified)


def precedence(user: str, client_id: str) -> tuple[tuple[EntityKey, str, str], ...]:
    """The entities that may hold a client's quota, most specific first, each with the
    (user, client-id) the measured rate is shared by (Kafka's metric tags): a quota on
    `<default>` gives every user its own allowance, a quota on one user is shared by all
    of that user's clients."""
    u, c = (USER, user), (CLIENT_ID, client_id)
    du, dc = (USER, None), (CLIENT_ID, None)
    return (
        (entity_key((u, c)), user, client_id),
        (entity_key((u, dc)), user, client_id),
        (entity_key((u,)), user, ""),
        (entity_key((du, c)), user, client_id),
        (entity_key((du, dc)), user, client_id),
        (entity_key((du,)), user, ""),
        (entity_key((c,)), "", client_id),
        (entity_key((dc,)), "", client_id),
    )
