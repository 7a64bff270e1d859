"""Client quotas as metadata: Kafka's entities, keys, validation and describe filters.

A quota entity is a set of (entity type, name) pairs; a name of None is the type's
default (`<default>` in `kafka-configs`). The image keys them by `entity_key`, a sorted
tuple of pairs, so {user: alice, client-id: app} is one entity whichever order the
request named them in. Values are floats, as Kafka's QuotaRecord holds them.

Kafka's reference: ClientQuotaControlManager (validation), ClientQuotasImage (describe
filters), DefaultQuotaCallback / ClientQuotaManager (which entity applies: `precedence`).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Iterable, Mapping

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"

# Key -> whether Kafka types it LONG (a whole number) rather than DOUBLE.
CLIENT_QUOTA_KEYS: dict[str, bool] = {
    PRODUCER_BYTE_RATE: True,
    CONSUMER_BYTE_RATE: True,
    REQUEST_PERCENTAGE: False,
    CONTROLLER_MUTATION_RATE: False,
}

# The keys of an ip entity (KIP-612: new connections per second from that address, an
# Integer in Kafka), which go with no user or client id.
IP_QUOTA_KEYS: dict[str, bool] = {CONNECTION_CREATION_RATE: True}
# straitmq.metadata.version from which ip entities may be written: release 0.2.0 would
# store them and enforce nothing, so a cluster it can still join refuses them.
IP_QUOTAS_LEVEL = 3

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
        if kind not in (USER, CLIENT_ID, IP):
            raise QuotaError(f"Unhandled client quota entity type: {kind}")
        if name is not None and name == "":
            raise QuotaError(f"Empty {kind} not supported")
    if IP in seen and len(seen) > 1:
        raise QuotaError("Invalid empty client quota entity")  # Kafka's words for it
    ip = dict(pairs).get(IP)
    if ip is not None and ip_address(ip) is None:
        # Kafka also takes a host name it can resolve; StraitMQ takes addresses only.
        raise QuotaError(f"{ip} is not a valid IP or resolvable host.")
    return entity_key(pairs)


def ip_address(text: str) -> str | None:
    """The address in its canonical form (as a connection's peer address is written),
    or None when `text` is no IPv4 or IPv6 address."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def is_ip_entity(entity: EntityKey) -> bool:
    return any(kind == IP for kind, _ in entity)


def check_value(key: str, value: object, ip: bool = False) -> float:
    """The value as a float, or QuotaError with the reason (unknown key, not a number,
    negative, not whole where Kafka wants a Long or an Integer). `ip`: for an ip entity."""
    keys = IP_QUOTA_KEYS if ip else CLIENT_QUOTA_KEYS
    whole = keys.get(key)
    if whole is None:
        raise QuotaError(f"Invalid configuration key {key} (known: {', '.join(keys)})")
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
        raise QuotaError(f"Configuration {key} must be {'an Integer' if ip else 'a Long'} value")
    if ip and number > 2**31 - 1:
        raise QuotaError(f"Configuration {key} must be an Integer value")
    return number


def check_ops(ops: Mapping[str, object], entity: EntityKey = ()) -> dict[str, float | None]:
    """{key: value or None to remove}, each value checked for `entity`'s kind."""
    ip = is_ip_entity(entity)
    return {k: None if v is None else check_value(k, v, ip) for k, v in ops.items()}


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
