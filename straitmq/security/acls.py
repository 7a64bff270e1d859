"""ACL bindings and the authorizer, with the semantics of Kafka's StandardAuthorizer.

A binding is (resource type, resource name, pattern type, principal, host, operation,
permission), the codes being Kafka's wire values. Bindings live in the metadata log
(`acl` / `remove_acl` records, services/metadata/image.py), so every broker decides the
same way. The decision:

1. a super user (`super.users`) may do everything;
2. the bindings that apply to the resource are the LITERAL ones with its name or `*`
   and the PREFIXED ones whose name starts it;
3. among those that name the principal (or `User:*`) and the client's host (or `*`),
   a DENY for the operation (or ALL) wins; else an ALLOW for the operation, ALL, or an
   operation implying it (READ/WRITE/DELETE/ALTER imply DESCRIBE, ALTER_CONFIGS implies
   DESCRIBE_CONFIGS) allows;
4. if no binding at all applies to the resource, `allow.everyone.if.no.acl.found`
   decides (default: deny).

Decisions are cached per (principal, host, operation, resource): Produce and Fetch ask
once per partition per request, and a hit is one dict lookup. The cache is dropped
whenever the image's ACL version moves (a binding was added or removed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from .settings import default

log = logging.getLogger("straitmq.authorizer")

# Resource types (org.apache.kafka.common.resource.ResourceType)
R_UNKNOWN, R_ANY, TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID, DELEGATION_TOKEN, USER = range(8)
# Pattern types (PatternType)
P_UNKNOWN, P_ANY, P_MATCH, LITERAL, PREFIXED = range(5)
# Operations (AclOperation)
(
    OP_UNKNOWN,
    OP_ANY,
    ALL,
    READ,
    WRITE,
    CREATE,
    DELETE,
    ALTER,
    DESCRIBE,
    CLUSTER_ACTION,
    DESCRIBE_CONFIGS,
    ALTER_CONFIGS,
    IDEMPOTENT_WRITE,
    CREATE_TOKENS,
    DESCRIBE_TOKENS,
    TWO_PHASE_COMMIT,
) = range(16)
# Permission types (AclPermissionType)
PERM_UNKNOWN, PERM_ANY, DENY, ALLOW = range(4)

CLUSTER_NAME = "kafka-cluster"  # the one name of the CLUSTER resource
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
MAX_CACHED_DECISIONS = 100_000  # a bound on the cache; past it, it starts over

# An ALLOW of the key also allows these (Kafka's AclOperation implication).
_IMPLIED_BY: dict[int, frozenset[int]] = {
    DESCRIBE: frozenset({DESCRIBE, READ, WRITE, DELETE, ALTER, ALL}),
    DESCRIBE_CONFIGS: frozenset({DESCRIBE_CONFIGS, ALTER_CONFIGS, ALL}),
}


class AclBinding(NamedTuple):
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int

    def as_record(self) -> dict:
        return {
            "resource_type": self.resource_type,
            "resource_name": self.resource_name,
            "pattern_type": self.pattern_type,
            "principal": self.principal,
            "host": self.host,
            "operation": self.operation,
            "permission": self.permission,
        }


def validate_binding(b: AclBinding) -> str | None:
    """Why Kafka would refuse to create this binding (INVALID_REQUEST), or None."""
    if not TOPIC <= b.resource_type <= USER:
        return f"Invalid resourceType {b.resource_type}"
    if b.pattern_type not in (LITERAL, PREFIXED):
        return f"Invalid patternType {b.pattern_type}: only LITERAL and PREFIXED bindings exist"
    if not ALL <= b.operation <= TWO_PHASE_COMMIT:
        return f"Invalid operation {b.operation}"
    if b.permission not in (DENY, ALLOW):
        return f"Invalid permissionType {b.permission}"
    if not b.resource_name:
        return "Resource name should not be empty"
    if b.resource_type == CLUSTER and (
        b.resource_name != CLUSTER_NAME or b.pattern_type != LITERAL
    ):
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME} (LITERAL)"
    kind, sep, name = b.principal.partition(":")
    if not sep or not kind or not name:
        return f"Could not parse principal from `{b.principal}` (no colon is found)"
    if b.host is None or b.host == "":
        return "Invalid host: use * for any host"
    return None


@dataclass(frozen=True, slots=True)
class AclFilter:
    """A DescribeAcls/DeleteAcls filter: ANY and None match everything; pattern MATCH
    matches the bindings that would apply to the named resource (literal, `*`, prefixes)."""

    resource_type: int
    resource_name: str | None
    pattern_type: int
    principal: str | None
    host: str | None
    operation: int
    permission: int

    def invalid(self) -> str | None:
        if self.resource_type == R_UNKNOWN or self.resource_type > USER:
            return f"Invalid resourceType filter {self.resource_type}"
        if self.pattern_type == P_UNKNOWN or self.pattern_type > PREFIXED:
            return f"Invalid patternType filter {self.pattern_type}"
        if self.operation == OP_UNKNOWN or self.operation > TWO_PHASE_COMMIT:
            return f"Invalid operation filter {self.operation}"
        if self.permission == PERM_UNKNOWN or self.permission > ALLOW:
            return f"Invalid permissionType filter {self.permission}"
        return None

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type != R_ANY and self.resource_type != b.resource_type:
            return False
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.host is not None and self.host != b.host:
            return False
        if self.operation != OP_ANY and self.operation != b.operation:
            return False
        if self.permission != PERM_ANY and self.permission != b.permission:
            return False
        name, pt = self.resource_name, self.pattern_type
        if pt == P_MATCH:
            if name is None:
                return True
            if b.pattern_type == LITERAL:
                return b.resource_name in (name, WILDCARD)
            return b.pattern_type == PREFIXED and name.startswith(b.resource_name)
        if pt != P_ANY and pt != b.pattern_type:
            return False
        return name is None or name == b.resource_name


@dataclass(slots=True)
class AuthorizerSettings:
    enabled: bool = False
    super_users: frozenset[str] = frozenset()
    allow_if_no_acl: bool = False

    @classmethod
    def from_properties(cls, props: dict[str, str]) -> AuthorizerSettings:
        supers = props.get("super.users", default("super.users"))
        return cls(
            enabled=bool(
                props.get("authorizer.class.name", default("authorizer.class.name")).strip()
            ),
            # Kafka separates super users with semicolons (names may hold commas).
            super_users=frozenset(s.strip() for s in supers.split(";") if s.strip()),
            allow_if_no_acl=props.get(
                "allow.everyone.if.no.acl.found", default("allow.everyone.if.no.acl.found")
            )
            .strip()
            .lower()
            == "true",
        )


# What each resource type supports (Kafka's AclEntry.supportedOperations): the bits a
# Describe* answer's authorized_operations may hold.
SUPPORTED_OPERATIONS: dict[int, tuple[int, ...]] = {
    TOPIC: (READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS),
    GROUP: (READ, DESCRIBE, DELETE),
    CLUSTER: (
        CREATE,
        CLUSTER_ACTION,
        DESCRIBE_CONFIGS,
        ALTER_CONFIGS,
        IDEMPOTENT_WRITE,
        ALTER,
        DESCRIBE,
    ),
    TRANSACTIONAL_ID: (DESCRIBE, WRITE),
}


def operations_bitfield(resource_type: int, allowed: Callable[[int], bool]) -> int:
    """Kafka's authorized_operations: bit `code` set for each supported operation the
    principal may do (all of them with no authorizer, as Kafka answers)."""
    bits = 0
    for op in SUPPORTED_OPERATIONS[resource_type]:
        if allowed(op):
            bits |= 1 << op
    return bits


class AclSource(Protocol):
    """Where the bindings come from: the metadata image (straitmq.metadata.image), which
    this ground-floor module does not import."""

    @property
    def acls(self) -> Iterable[tuple]: ...

    @property
    def acls_version(self) -> int: ...


class Authorizer:
    """Decides from the image's bindings; `authorize` is the one entry point."""

    def __init__(self, settings: AuthorizerSettings, image: Callable[[], AclSource]) -> None:
        self.settings = settings
        self.enabled = settings.enabled
        self._image = image  # () -> the node's current metadata image
        self._cache: dict[tuple, bool] = {}
        self._version = -1
        self._by_type: dict[int, list[AclBinding]] = {}
        # (resource type, pattern type, resource name) -> bindings: a decision looks up
        # the name, `*` and each prefix of the name, never scans every binding.
        self._index: dict[tuple[int, int, str], list[AclBinding]] = {}

    def _bindings(self) -> dict[int, list[AclBinding]]:
        image = self._image()
        if image.acls_version != self._version:
            self._version = image.acls_version
            self._cache = {}
            by_type: dict[int, list[AclBinding]] = {}
            index: dict[tuple[int, int, str], list[AclBinding]] = {}
            for t in image.acls:
                b = AclBinding(*t)
                by_type.setdefault(b.resource_type, []).append(b)
                index.setdefault((b.resource_type, b.pattern_type, b.resource_name), []).append(b)
            self._by_type, self._index = by_type, index
        return self._by_type

    def _applying(self, rtype: int, name: str) -> list[AclBinding]:
        """The bindings that apply to the resource: LITERAL with its name or `*`, and
        PREFIXED with any prefix of its name."""
        index = self._index
        out: list[AclBinding] = []
        for key in ((rtype, LITERAL, name), (rtype, LITERAL, WILDCARD)):
            out += index.get(key, ())
        for end in range(1, len(name) + 1):
            hit = index.get((rtype, PREFIXED, name[:end]))
            if hit:
                out += hit
        return out

    def authorize(
        self, principal: str, host: str, operation: int, resource_type: int, name: str
    ) -> bool:
        if not self.enabled:
            return True
        self._bindings()
        key = (principal, host, operation, resource_type, name)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        allowed = self._decide(self._applying(resource_type, name), *key)
        if len(self._cache) >= MAX_CACHED_DECISIONS:
            self._cache = {}
        self._cache[key] = allowed
        if not allowed:
            log.debug(
                "denied",
                extra={
                    "principal": principal,
                    "host": host,
                    "operation": operation,
                    "resource_type": resource_type,
                    "resource": name,
                },
            )
        return allowed

    def _decide(
        self,
        bindings: list[AclBinding],
        principal: str,
        host: str,
        op: int,
        rtype: int,
        name: str,
    ) -> bool:
        if principal in self.settings.super_users:
            return True
        allowed_by = _IMPLIED_BY.get(op, frozenset({op, ALL}))
        # `bindings` all apply to the resource (see _applying): any of them means an ACL
        # was found for it, whoever it names.
        found = bool(bindings)
        allow = False
        for b in bindings:
            if b.principal != principal and b.principal != WILDCARD_PRINCIPAL:
                continue
            if b.host != WILDCARD and b.host != host:
                continue
            if b.permission == DENY:
                if b.operation == op or b.operation == ALL:
                    return False  # DENY wins, whatever else allows
            elif b.operation in allowed_by:
                allow = True
        if not found:
            return self.settings.allow_if_no_acl
        return allow

    def authorize_any_topic(self, principal: str, host: str, operation: int) -> bool:
        """Kafka's authorizeByResourceType(TOPIC, op): may the principal do `op` on some
        topic? Used for idempotent producers without IDEMPOTENT_WRITE (Kafka 3+): an
        ALLOW on any topic name or prefix not denied for all topics by a `*` DENY."""
        if not self.enabled or principal in self.settings.super_users:
            return True
        topics = self._bindings().get(TOPIC, ())
        ok = set(_IMPLIED_BY.get(operation, frozenset({operation, ALL})))

        def applies(b: AclBinding) -> bool:
            return b.principal in (principal, WILDCARD_PRINCIPAL) and b.host in (WILDCARD, host)

        for b in topics:
            if (
                applies(b)
                and b.permission == DENY
                and b.operation in (operation, ALL)
                and b.pattern_type == LITERAL
                and b.resource_name == WILDCARD
            ):
                return False
        return any(applies(b) and b.permission == ALLOW and b.operation in ok for b in topics)
