"""The clients this broker has seen lately: who they are and which API versions they use.

A client is its identity: software name and version (ApiVersions v3+ says them; older
requests do not), client id, principal and source host. For each, the registry keeps the
API versions it used (per API key), whether its Produce requests were transactional, its
open connections and when it was last seen: enough to tell its group protocol and its
transaction version (straitmq.metadata.client_impact), which `strait upgrade plan` reads.

Cost: the listener asks the registry only the first time a connection uses an API
version (a set on the connection is the only per-request work), and when a connection
closes. A client with an open connection is seen now; one without is dropped
`expiry_s` after its last connection closed. At most `max_entries` clients are kept: a
new one pushes out the one seen least recently (one without an open connection first),
counted in `dropped`.

Sans-IO: fed events and the time (seconds, wall clock), answers plain dicts.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from kio.schema.index import api_key_map
from straitmq.metadata import client_impact as impact

# software name, software version, client id, principal, host
Identity = tuple[str | None, str | None, str, str, str]


@dataclass(slots=True)
class ConnectionClient:
    """One connection as the registry knows it (held by the connection)."""

    host: str  # the bare address
    listener: str
    software_name: str | None = None
    software_version: str | None = None
    api_versions_version: int | None = None  # the ApiVersions version it sent
    apis: dict[int, set[int]] = field(default_factory=dict)  # what it used
    transactional_produce: set[int] = field(default_factory=set)  # Produce versions
    key: Identity | None = None  # the client it counts toward


@dataclass(slots=True)
class ClientEntry:
    identity: Identity
    listener: str
    first_seen: float
    last_seen: float
    api_versions_version: int | None = None
    connections: int = 0  # open now
    connections_seen: int = 0  # ever counted toward it
    moved_out: int = 0  # of those, the ones that turned out to be another client
    apis: dict[int, set[int]] = field(default_factory=dict)
    transactional_produce: set[int] = field(default_factory=set)


class ClientRegistry:
    def __init__(self, max_entries: int = 1000, expiry_s: float = 900.0) -> None:
        self.max_entries = max(1, max_entries)
        self.expiry_s = expiry_s
        self._entries: OrderedDict[Identity, ClientEntry] = OrderedDict()  # least recent first
        self.dropped = 0  # pushed out by the limit
        self.expired = 0  # gone expiry_s after their last connection

    def __len__(self) -> int:
        return len(self._entries)

    # -- events --------------------------------------------------------------------------

    @staticmethod
    def connection(host: str, listener: str) -> ConnectionClient:
        return ConnectionClient(host.removeprefix("/"), listener)

    def used(
        self,
        conn: ConnectionClient,
        api_key: int,
        version: int,
        client_id: str | None,
        principal: str,
        now: float,
        *,
        software: tuple[str, str] | None = None,
        transactional: bool = False,
    ) -> None:
        """`conn` used `version` of `api_key` for the first time. `software`: the name
        and version an ApiVersions v3+ carried; `transactional`: a Produce with a
        transactional id."""
        if api_key == impact.API_VERSIONS:
            conn.api_versions_version = version
            if software is not None and (software[0] or software[1]):
                conn.software_name, conn.software_version = software
        conn.apis.setdefault(api_key, set()).add(version)
        if transactional:
            conn.transactional_produce.add(version)
        identity = (
            conn.software_name,
            conn.software_version,
            client_id or "",
            principal,
            conn.host,
        )
        entry = self._entries.get(identity) if conn.key == identity else None
        if entry is None:
            entry = self._attach(conn, identity, now)
        else:
            entry.apis.setdefault(api_key, set()).add(version)
            if transactional:
                entry.transactional_produce.add(version)
            self._entries.move_to_end(identity)
        if conn.api_versions_version is not None:
            entry.api_versions_version = conn.api_versions_version
        entry.last_seen = now

    def closed(self, conn: ConnectionClient, now: float) -> None:
        entry = self._entries.get(conn.key) if conn.key is not None else None
        conn.key = None
        if entry is not None:
            entry.connections -= 1
            entry.last_seen = now
            self._entries.move_to_end(entry.identity)

    def _attach(self, conn: ConnectionClient, identity: Identity, now: float) -> ClientEntry:
        """The connection counts toward `identity` from now on (its first request, or it
        said who it is: a SASL login, a software name), with all it used so far."""
        old = self._entries.get(conn.key) if conn.key is not None else None
        if old is not None:
            old.connections -= 1
            old.moved_out += 1
            if old.connections == 0 and old.moved_out == old.connections_seen:
                del self._entries[old.identity]  # only ever this client before it logged in
        entry = self._entries.get(identity)
        if entry is None:
            self._make_room(now)
            entry = self._entries[identity] = ClientEntry(identity, conn.listener, now, now)
        else:
            self._entries.move_to_end(identity)
        entry.connections += 1
        entry.connections_seen += 1
        for key, versions in conn.apis.items():
            entry.apis.setdefault(key, set()).update(versions)
        entry.transactional_produce.update(conn.transactional_produce)
        conn.key = identity
        return entry

    def _make_room(self, now: float) -> None:
        if len(self._entries) < self.max_entries:
            return
        self.expire(now)
        if len(self._entries) < self.max_entries:
            return
        victim = next(
            (k for k, e in self._entries.items() if e.connections <= 0),
            next(iter(self._entries)),
        )
        del self._entries[victim]
        self.dropped += 1

    def expire(self, now: float) -> None:
        """Drop the clients without an open connection since `expiry_s`."""
        cutoff = now - self.expiry_s
        gone = [k for k, e in self._entries.items() if e.connections <= 0 and e.last_seen <= cutoff]
        for k in gone:
            del self._entries[k]
        self.expired += len(gone)

    # -- views ---------------------------------------------------------------------------

    def snapshot(self, now: float) -> list[dict]:
        """Every client kept, most recently seen first, as GET /api/v1/clients shows it."""
        self.expire(now)
        return [self._describe(e, now) for e in reversed(self._entries.values())]

    def by_software(self, now: float) -> Counter[tuple[str, str]]:
        """Clients kept per (software name, version), for the metrics; ("unknown", "")
        for those that did not say (ApiVersions below v3)."""
        self.expire(now)
        return Counter(
            (e.identity[0] or "unknown", e.identity[1] or "") for e in self._entries.values()
        )

    def _describe(self, e: ClientEntry, now: float) -> dict:
        name, version, client_id, principal, host = e.identity
        apis = {k: sorted(v) for k, v in sorted(e.apis.items())}
        txn_produce = sorted(e.transactional_produce)
        return {
            "software": impact.software_label(name, version, e.api_versions_version),
            "software_name": name,
            "software_version": version,
            "api_versions_version": e.api_versions_version,
            "client_id": client_id,
            "principal": principal,
            "host": host,
            "listener": e.listener,
            "connections": max(e.connections, 0),
            "connections_seen": e.connections_seen - e.moved_out,
            "first_seen_ms": int(e.first_seen * 1000),
            "last_seen_ms": int((now if e.connections > 0 else e.last_seen) * 1000),
            "apis": [{"api_key": k, "name": api_name(k), "versions": v} for k, v in apis.items()],
            "transactional_produce": txn_produce,
            "group_protocols": impact.group_protocols(apis),
            "transaction_versions": impact.transaction_versions(apis, txn_produce),
            "roles": impact.roles(apis, client_id),
        }


def api_name(api_key: int) -> str:
    """Kafka's name of an API key: ConsumerGroupHeartbeat for 68."""
    known = impact.API_NAMES.get(api_key)
    if known is not None:
        return known
    snake = api_key_map.get(api_key)
    return "".join(w.capitalize() for w in snake.split("_")) if snake else f"api {api_key}"
