"""The operator's typed calls on a StraitMQ cluster's HTTP admin API (brokers' /api/v1),
through the shared admin client (straitmq.admin_client)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from straitmq.admin_client import DEFAULT_TIMEOUT_S, AdminAuth, AdminError
from straitmq.admin_client import AdminClient as BaseAdminClient

__all__ = ["AdminClient", "AdminError", "Partition", "Topic"]


@dataclass(frozen=True)
class Partition:
    topic: str
    index: int
    replicas: list[int]
    isr: list[int]
    leader: int
    adding: list[int]
    removing: list[int]


@dataclass(frozen=True)
class Topic:
    name: str
    topic_id: str
    internal: bool
    replication_factor: int
    configs: dict[str, str]
    min_insync: int
    partitions: list[Partition]


def _topic(raw: dict[str, Any]) -> Topic:
    name = raw["name"]
    effective = raw.get("effective_configs") or {}
    return Topic(
        name=name,
        topic_id=raw.get("topic_id", ""),
        internal=bool(raw.get("internal")),
        replication_factor=int(raw.get("replication_factor", 0)),
        configs={k: str(v) for k, v in (raw.get("configs") or {}).items()},
        min_insync=int(effective.get("min.insync.replicas", 1)),
        partitions=[
            Partition(
                topic=name,
                index=p["partition"],
                replicas=list(p["replicas"]),
                isr=list(p["isr"]),
                leader=p["leader"],
                adding=list(p.get("adding") or []),
                removing=list(p.get("removing") or []),
            )
            for p in raw.get("partitions", [])
        ],
    )


class AdminClient(BaseAdminClient):
    """The admin calls the operator makes, typed; one per reconcile pass, every call
    bounded by `timeout_s`. A secured admin API (https, client certificate, Basic) is
    reached with the operator's $STRAIT_CA_FILE, $STRAIT_CERT, $STRAIT_KEY, $STRAIT_USER
    and $STRAIT_PASSWORD (e.g. from a mounted Secret), the https URL from the
    `straitmq.io/admin-url` annotation."""

    def __init__(
        self,
        base_url: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        auth: AdminAuth | None = None,
    ) -> None:
        super().__init__(base_url, timeout_s, auth if auth is not None else AdminAuth.from_env())

    async def cluster(self) -> dict[str, Any]:
        return await self.get("/api/v1/cluster")

    async def quorum(self) -> dict[str, Any]:
        return await self.get("/api/v1/quorum")

    async def add_voter(self, controller_url: str, timeout_s: float) -> dict[str, Any]:
        """Make the controller at `controller_url` a voter (the cluster asks it for its id
        and directory id); answered once committed, or refused with the reason."""
        body = {"controller_url": controller_url, "timeout_s": timeout_s}
        return await self.request("POST", "/api/v1/quorum/voters", body)

    async def remove_voter(
        self, node_id: int, directory_id: str | None, timeout_s: float
    ) -> dict[str, Any]:
        """Remove voter (node_id, directory_id); answered once committed."""
        query = f"?timeout_s={timeout_s:g}"
        if directory_id:
            query += f"&directory_id={quote(directory_id, safe='')}"
        return await self.request("DELETE", f"/api/v1/quorum/voters/{node_id}{query}")

    async def features(self) -> dict[str, Any]:
        """Each feature's supported range and finalized level (GET /api/v1/features)."""
        return await self.get("/api/v1/features")

    async def update_features(self, updates: dict[str, int]) -> dict[str, Any]:
        """Finalize levels (all or nothing); refused with the reason (which node cannot)."""
        return await self.request("POST", "/api/v1/features", {"updates": updates})

    async def topics(self, internal: bool = True) -> list[Topic]:
        path = "/api/v1/topics" + ("?internal=true" if internal else "")
        return [_topic(t) for t in (await self.get(path))["topics"]]

    async def topic(self, name: str) -> Topic | None:
        try:
            return _topic(await self.get(f"/api/v1/topics/{name}"))
        except AdminError as e:
            if e.status == 404:
                return None
            raise

    async def create_topic(
        self, name: str, partitions: int, replication_factor: int, configs: dict[str, str]
    ) -> Topic:
        body = {
            "name": name,
            "partitions": partitions,
            "replication_factor": replication_factor,
            "configs": configs,
        }
        return _topic(await self.request("POST", "/api/v1/topics", body))

    async def alter_topic(
        self, name: str, partitions: int | None = None, configs: dict[str, str | None] | None = None
    ) -> Topic:
        body: dict[str, Any] = {}
        if partitions is not None:
            body["partitions"] = partitions
        if configs:
            body["configs"] = configs
        return _topic(await self.request("PATCH", f"/api/v1/topics/{name}", body))

    async def delete_topic(self, name: str) -> bool:
        """False if it was already gone."""
        try:
            await self.request("DELETE", f"/api/v1/topics/{name}")
        except AdminError as e:
            if e.status == 404:
                return False
            raise
        return True

    async def reassignments(self) -> list[dict[str, Any]]:
        return (await self.get("/api/v1/reassignments"))["reassignments"]

    async def reassign(self, moves: dict[tuple[str, int], list[int]], throttle: int) -> None:
        body = {
            "partitions": [
                {"topic": t, "partition": i, "replicas": r} for (t, i), r in sorted(moves.items())
            ],
            "throttle_bytes_per_sec": throttle,
        }
        await self.request("POST", "/api/v1/reassignments", body)

    async def clear_throttle(self) -> None:
        body = {"configs": {"replication.throttled.rate": None}}
        await self.request("PUT", "/api/v1/cluster/configs", body)

    # -- SCRAM users and ACLs (the broker's /api/v1/users and /api/v1/acls) ---------------

    async def user(self, name: str) -> dict[str, Any] | None:
        """The user's mechanisms ({"name", "mechanisms": [{"mechanism", "iterations"}]}),
        or None if it has no SCRAM credential."""
        try:
            return await self.get(f"/api/v1/users/{quote(name, safe='')}")
        except AdminError as e:
            if e.status == 404:
                return None
            raise

    async def put_user(self, name: str, mechanism: str, password: str) -> None:
        """Create or replace the user's credential for `mechanism`; the broker salts it."""
        body = {"mechanism": mechanism, "password": password}
        await self.request("PUT", f"/api/v1/users/{quote(name, safe='')}", body)

    async def delete_user(self, name: str, mechanism: str | None = None) -> bool:
        """Remove one mechanism (or all) of the user's credentials; False if none was there."""
        path = f"/api/v1/users/{quote(name, safe='')}"
        if mechanism:
            path += f"?mechanism={quote(mechanism)}"
        try:
            await self.request("DELETE", path)
        except AdminError as e:
            if e.status == 404:
                return False
            raise
        return True

    async def acls(self, principal: str) -> list[dict[str, Any]]:
        return (await self.get(f"/api/v1/acls?principal={quote(principal, safe='')}"))["acls"]

    async def alter_acls(
        self, create: list[dict[str, Any]], delete: list[dict[str, Any]]
    ) -> dict[str, Any]:
        return await self.request("POST", "/api/v1/acls", {"create": create, "delete": delete})

    async def user_quotas(self, user: str) -> dict[str, float]:
        """The client quotas of the user's own entity (user=<user>, no client id)."""
        got = await self.get(f"/api/v1/quotas?user={quote(user, safe='')}")
        for q in got["quotas"]:
            if q["entity"] == {"user": user}:
                return dict(q["quotas"])
        return {}

    async def alter_user_quotas(self, user: str, quotas: dict[str, float | None]) -> None:
        """Set (a number) or remove (None) quota keys of the user's own entity, as
        AlterClientQuotas."""
        entry = {"entity": {"user": user}, "quotas": quotas}
        await self.request("POST", "/api/v1/quotas", {"entries": [entry]})
