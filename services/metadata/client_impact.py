"""Which clients a feature-level change affects: the rules of `strait upgrade plan`.

Brokers record, per client (straitmq.broker.client_registry), its software name and
version (ApiVersions v3+), the API versions it used and what they say of it: its group
protocol and its transaction version. This module says what those mean and what a
change of feature levels does to each client, as Kafka defines the features:

- transaction.version: 2 makes Kafka 4 Java producers use transactions v2 (KIP-890 part
  2: EndTxn v5, Produce v12 with the partitions added implicitly); below 2 they fall back
  to v1 at their next transaction. v1 clients (librdkafka, Java < 4: AddPartitionsToTxn
  v0-3 from the client, EndTxn < v5) work the same at every level.
- group.version: 1 enables KIP-848's consumer group protocol (ConsumerGroupHeartbeat);
  the classic protocol (JoinGroup/SyncGroup/Heartbeat) does not depend on it.
- share.version: 1 enables share groups (KIP-932: ShareGroupHeartbeat, ShareFetch,
  ShareAcknowledge).
- streams.version: 1 enables KIP-1071's streams groups (StreamsGroupHeartbeat).
- the other features change nothing a client sends.

Sans-IO: plain dicts in (what GET /api/v1/clients answers), sentences out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .features import SUPPORTED

UNKNOWN_OLD = "unknown (ApiVersions < v3)"  # ApiVersions v0-2 carry no software name
UNKNOWN_NONE = "unknown (no ApiVersions)"  # a client that never asked

PRODUCE, FETCH, JOIN_GROUP, HEARTBEAT, SYNC_GROUP = 0, 1, 11, 12, 14
API_VERSIONS, ADD_PARTITIONS_TO_TXN, END_TXN, WRITE_TXN_MARKERS = 18, 24, 26, 27
CONSUMER_GROUP_HEARTBEAT = 68
SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE = 76, 77, 78, 79
STREAMS_GROUP_HEARTBEAT, STREAMS_GROUP_DESCRIBE = 88, 89

# The APIs the rules name (the broker names every API it serves; see client_registry).
API_NAMES = {
    PRODUCE: "Produce",
    FETCH: "Fetch",
    JOIN_GROUP: "JoinGroup",
    HEARTBEAT: "Heartbeat",
    SYNC_GROUP: "SyncGroup",
    API_VERSIONS: "ApiVersions",
    ADD_PARTITIONS_TO_TXN: "AddPartitionsToTxn",
    END_TXN: "EndTxn",
    CONSUMER_GROUP_HEARTBEAT: "ConsumerGroupHeartbeat",
    SHARE_GROUP_HEARTBEAT: "ShareGroupHeartbeat",
    SHARE_GROUP_DESCRIBE: "ShareGroupDescribe",
    SHARE_FETCH: "ShareFetch",
    SHARE_ACKNOWLEDGE: "ShareAcknowledge",
    STREAMS_GROUP_HEARTBEAT: "StreamsGroupHeartbeat",
    STREAMS_GROUP_DESCRIBE: "StreamsGroupDescribe",
}
_SHARE_APIS = (SHARE_GROUP_HEARTBEAT, SHARE_FETCH, SHARE_ACKNOWLEDGE, SHARE_GROUP_DESCRIBE)

# Group protocols, as ListGroups v5 names group types.
CLASSIC, CONSUMER, SHARE, STREAMS = "classic", "consumer", "share", "streams"


def software_label(name: str | None, version: str | None, api_versions: int | None) -> str:
    """How a client's software is shown: "librdkafka 2.0.2", or why it is unknown
    (`api_versions`: the ApiVersions version it sent, None if it sent none)."""
    if name:
        return f"{name} {version}" if version else name
    return UNKNOWN_NONE if api_versions is None else UNKNOWN_OLD


def group_protocols(apis: Mapping[int, Iterable[int]]) -> list[str]:
    """The group protocols a client's APIs show (it may use several, one per consumer)."""
    out = []
    if JOIN_GROUP in apis or SYNC_GROUP in apis or HEARTBEAT in apis:
        out.append(CLASSIC)
    if CONSUMER_GROUP_HEARTBEAT in apis:
        out.append(CONSUMER)
    if SHARE_GROUP_HEARTBEAT in apis or SHARE_FETCH in apis:
        out.append(SHARE)
    if STREAMS_GROUP_HEARTBEAT in apis:
        out.append(STREAMS)
    return out


def transaction_versions(
    apis: Mapping[int, Iterable[int]], transactional_produce: Iterable[int] = ()
) -> list[int]:
    """The transaction versions a client's APIs show: 1 for AddPartitionsToTxn v0-3
    (from a client; v4+ is the brokers' batched form) or EndTxn below v5; 2 for EndTxn
    v5+ or a transactional Produce v12 (`transactional_produce`: the Produce versions
    it sent with a transactional id)."""
    out = set()
    if any(v < 4 for v in apis.get(ADD_PARTITIONS_TO_TXN, ())):
        out.add(1)
    for v in apis.get(END_TXN, ()):
        out.add(2 if v >= 5 else 1)
    if any(v >= 12 for v in transactional_produce):
        out.add(2)
    return sorted(out)


# The client id prefix of a broker's own replica fetchers (straitmq.broker.replication.
# follower_id): their fetches are replication, not a consumer's.
REPLICA_FETCHER_PREFIX = "replica-fetcher-"


def roles(apis: Mapping[int, Iterable[int]], client_id: str | None = None) -> list[str]:
    """What a client does: producer, consumer, share consumer; "broker" for another
    broker's calls (transaction markers, partition verification: AddPartitionsToTxn v4+,
    replica fetchers)."""
    if client_id and client_id.startswith(REPLICA_FETCHER_PREFIX):
        return ["broker"]
    out = []
    if WRITE_TXN_MARKERS in apis or any(v >= 4 for v in apis.get(ADD_PARTITIONS_TO_TXN, ())):
        out.append("broker")
    if PRODUCE in apis:
        out.append("producer")
    if any(k in apis for k in _SHARE_APIS):
        out.append("share consumer")
    elif FETCH in apis:
        out.append("consumer")
    return out


def api_map(client: Mapping) -> dict[int, list[int]]:
    """{api key: versions} of a client as GET /api/v1/clients shows it."""
    return {int(a["api_key"]): list(a["versions"]) for a in client.get("apis", ())}


# -- several brokers' views, one list ---------------------------------------------------


def identity(client: Mapping) -> tuple:
    return (
        client.get("software_name"),
        client.get("software_version"),
        client.get("client_id"),
        client.get("principal"),
        client.get("host"),
    )


def merge(views: Mapping[int, Sequence[Mapping]]) -> list[dict]:
    """One entry per client from each broker's GET /api/v1/clients ({broker id: its
    clients}): connections added up, API versions joined, `brokers` saying where."""
    merged: dict[tuple, dict] = {}
    names: dict[int, str | None] = {}
    for broker, clients in sorted(views.items()):
        for c in clients:
            key = identity(c)
            m = merged.get(key)
            if m is None:
                m = merged[key] = {
                    **c,
                    "apis": {},
                    "transactional_produce": set(),
                    "brokers": [],
                    "connections": 0,
                    "connections_seen": 0,
                }
            m["brokers"].append(broker)
            m["connections"] += c.get("connections", 0)
            m["connections_seen"] += c.get("connections_seen", 0)
            m["last_seen_ms"] = max(m.get("last_seen_ms", 0), c.get("last_seen_ms", 0))
            first = c.get("first_seen_ms", 0)
            m["first_seen_ms"] = min(m.get("first_seen_ms", first), first)
            if m.get("api_versions_version") is None:
                m["api_versions_version"] = c.get("api_versions_version")
            for a in c.get("apis", ()):
                m["apis"].setdefault(int(a["api_key"]), set()).update(a["versions"])
                names[int(a["api_key"])] = a.get("name")
            m["transactional_produce"].update(c.get("transactional_produce", ()))
    out = []
    for m in merged.values():
        apis = {k: sorted(v) for k, v in sorted(m["apis"].items())}
        m["apis"] = [
            {"api_key": k, "name": names.get(k) or API_NAMES.get(k, f"api {k}"), "versions": v}
            for k, v in apis.items()
        ]
        m["transactional_produce"] = sorted(m["transactional_produce"])
        m["group_protocols"] = group_protocols(apis)
        m["transaction_versions"] = transaction_versions(apis, m["transactional_produce"])
        m["roles"] = roles(apis, m.get("client_id"))
        out.append(m)
    return sorted(out, key=_order)


def _order(c: Mapping) -> tuple:
    return (c.get("software") or "", c.get("client_id") or "", c.get("host") or "")


# -- the plan -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Finding:
    """One sentence of a plan and the clients it is about. `affected`: these clients
    change behaviour or need something done (False: a sentence saying who is not)."""

    feature: str
    sentence: str
    clients: tuple[Mapping, ...] = ()
    affected: bool = False


@dataclass(slots=True)
class Plan:
    changes: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (now, to)
    findings: list[Finding] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)  # changes the cluster would refuse

    @property
    def affected(self) -> list[Finding]:
        return [f for f in self.findings if f.affected]


def plan(
    clients: Sequence[Mapping], current: Mapping[str, int], targets: Mapping[str, int]
) -> Plan:
    """What changing the finalized levels `current` to `targets` does to `clients` (as
    `merge` gives them, or one broker's GET /api/v1/clients)."""
    out = Plan()
    for name, to in targets.items():
        feature = SUPPORTED.get(name)
        if feature is None:
            out.refusals.append(f"unknown feature {name!r}; known: {', '.join(sorted(SUPPORTED))}")
            continue
        now = current.get(name, 0)
        if not feature.min_level <= to <= feature.max_level:
            out.refusals.append(
                f"{name}={to} is outside the supported range "
                f"{feature.min_level}..{feature.max_level}: the change would be refused"
            )
            continue
        if to < now and not feature.downgradable:
            out.refusals.append(
                f"{name} cannot go from {now} down to {to}: what was written at {now} "
                "cannot be read at a lower level"
            )
            continue
        out.changes[name] = (now, to)
        if to == now:
            out.findings.append(Finding(name, f"{name} is already {now}: nothing changes"))
            continue
        rule = _RULES.get(name, _no_client_effect)
        out.findings.extend(rule(name, now, to, clients))
    return out


def _no_client_effect(name: str, now: int, to: int, clients: Sequence[Mapping]) -> list[Finding]:
    return [
        Finding(
            name,
            f"{name} {now} -> {to} changes no API or version a client uses: "
            f"no client is affected ({_count(len(clients), 'client')} seen)",
        )
    ]


def _transactions(name: str, now: int, to: int, clients: Sequence[Mapping]) -> list[Finding]:
    v2 = [c for c in clients if 2 in c.get("transaction_versions", ())]
    v1 = [c for c in clients if c.get("transaction_versions") == [1]]
    out: list[Finding] = []
    if not v1 and not v2:
        return [Finding(name, f"no transactional clients seen: {name}={to} affects none")]
    if to < 2 <= now:
        for label, group in _by_software(v2):
            out.append(
                Finding(
                    name,
                    f"{label} ({_connections(group)}) use transactions v2: they fall back to "
                    f"v1 if {name} is downgraded to {to} (Kafka 4 Java producers read the "
                    "level again and start their next transaction with v1)",
                    tuple(group),
                    affected=True,
                )
            )
    elif now < 2 <= to:
        for label, group in _by_software(v1):
            java4 = [c for c in group if _kafka4_java(c)]
            if java4:
                out.append(
                    Finding(
                        name,
                        f"{label} ({_connections(group)}) use transactions v1 now: Kafka 4 "
                        f"Java producers switch to v2 (EndTxn v5, Produce v12) at their next "
                        f"transaction once {name}={to}",
                        tuple(group),
                        affected=True,
                    )
                )
        v1 = [c for c in v1 if not _kafka4_java(c)]
    for label, group in _by_software(v1):
        out.append(
            Finding(
                name,
                f"{label} ({_connections(group)}) use transactions v1: unaffected by {name}={to}",
                tuple(group),
            )
        )
    if v2 and not (to < 2 <= now):
        out.append(
            Finding(
                name,
                f"{_count(len(v2), 'client')} on transactions v2 stay on v2 at {name}={to}",
                tuple(v2),
            )
        )
    return out


def _groups(name: str, now: int, to: int, clients: Sequence[Mapping]) -> list[Finding]:
    kip848 = [c for c in clients if CONSUMER in c.get("group_protocols", ())]
    classic = [c for c in clients if CLASSIC in c.get("group_protocols", ())]
    out: list[Finding] = []
    if to < 1 <= now:
        for label, group in _by_software(kip848):
            out.append(
                Finding(
                    name,
                    f"{label} ({_connections(group)}) use the consumer group protocol "
                    f"(KIP-848, ConsumerGroupHeartbeat {_versions(group, 68)}): it needs "
                    f"{name}>=1 (Kafka refuses its heartbeats below); with {name}={to} they "
                    "must switch to group.protocol=classic first",
                    tuple(group),
                    affected=True,
                )
            )
        if not kip848:
            out.append(
                Finding(
                    name, f"no consumer-protocol (KIP-848) clients seen: {name}={to} affects none"
                )
            )
    elif kip848:
        out.append(
            Finding(
                name,
                f"{_count(len(kip848), 'client')} on the consumer group protocol (KIP-848) "
                f"keep it at {name}={to}",
                tuple(kip848),
            )
        )
    if classic:
        labels = ", ".join(label for label, _ in _by_software(classic))
        out.append(
            Finding(
                name,
                f"clients using the classic group protocol are unaffected by {name} "
                f"({_count(len(classic), 'client')}: {labels})",
                tuple(classic),
            )
        )
    return out


class _GroupKind:
    """share.version and streams.version: level 1 enables a kind of group."""

    def __init__(self, apis: tuple[int, ...], what: str, kip: str) -> None:
        self.apis, self.what, self.kip = apis, what, kip

    def __call__(self, name: str, now: int, to: int, clients: Sequence[Mapping]) -> list[Finding]:
        users = [c for c in clients if any(k in api_map(c) for k in self.apis)]
        if not users:
            api_names = ", ".join(API_NAMES[k] for k in self.apis)
            return [
                Finding(
                    name, f"no {self.what} clients seen ({api_names}): {name}={to} affects none"
                )
            ]
        used = self._used(users)
        who = "; ".join(f"{label}: {_connections(g)}" for label, g in _by_software(users))
        if to < 1 <= now:
            return [
                Finding(
                    name,
                    f"{_count(len(users), 'client')} still on {used} ({who}): "
                    f"{self.what} groups ({self.kip}) need {name}>=1; with {name}={to} "
                    "Kafka refuses their requests",
                    tuple(users),
                    affected=True,
                )
            ]
        outcome = f"can use {self.what} groups once" if now < 1 <= to else "keep working at"
        return [
            Finding(
                name,
                f"{_count(len(users), 'client')} on {used} ({who}) {outcome} {name}={to}",
                tuple(users),
            )
        ]

    def _used(self, users: Sequence[Mapping]) -> str:
        parts = []
        for k in self.apis:
            versions = sorted({v for c in users for v in api_map(c).get(k, ())})
            if versions:
                parts.append(f"{API_NAMES[k]} {_vs(versions)}")
        return ", ".join(parts)


Rule = Callable[[str, int, int, Sequence[Mapping]], list[Finding]]
_RULES: dict[str, Rule] = {
    "transaction.version": _transactions,
    "group.version": _groups,
    "share.version": _GroupKind(
        (SHARE_FETCH, SHARE_GROUP_HEARTBEAT, SHARE_ACKNOWLEDGE), "share", "KIP-932"
    ),
    "streams.version": _GroupKind((STREAMS_GROUP_HEARTBEAT,), "streams", "KIP-1071"),
}


# -- wording ------------------------------------------------------------------------------


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _vs(versions: Sequence[int]) -> str:
    return "v" + ", v".join(str(v) for v in versions)


def _versions(group: Sequence[Mapping], api_key: int) -> str:
    return _vs(sorted({v for c in group for v in api_map(c).get(api_key, ())}))


def _connections(group: Sequence[Mapping]) -> str:
    n = sum(int(c.get("connections", 0)) for c in group)
    conns = _count(n, "connection") if n else "not connected now"
    return conns if len(group) == 1 else f"{_count(len(group), 'client')}, {conns}"


def _by_software(clients: Sequence[Mapping]) -> list[tuple[str, list[Mapping]]]:
    """Clients grouped by software and role: ("librdkafka 2.0.2 producers", [...])."""
    groups: dict[str, list[Mapping]] = {}
    for c in clients:
        groups.setdefault(_label(c), []).append(c)
    return sorted(groups.items())


def _label(c: Mapping) -> str:
    software = c.get("software") or software_label(
        c.get("software_name"), c.get("software_version"), c.get("api_versions_version")
    )
    rs = c.get("roles") or roles(api_map(c), c.get("client_id"))
    role = " and ".join(f"{r}s" for r in rs) if rs else "clients"
    return f"{software} {role}"


def _kafka4_java(c: Mapping) -> bool:
    """Kafka's Java client 4.0 or newer (it uses transactions v2 once finalized)."""
    if c.get("software_name") != "apache-kafka-java":
        return False
    major = (c.get("software_version") or "0").split(".", 1)[0]
    return major.isdigit() and int(major) >= 4
