"""The operator's client of a StraitMQ cluster's HTTP admin API (brokers' /api/v1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson


class AdminError(Exception):
    """The admin API refused a request (4xx/5xx) or could not be reached (status 0)."""

    def __init__(self, status: int, message: str, error_name: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_name = error_name

    @property
    def unreachable(self) -> bool:
        return self.status == 0


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


class AdminClient:
    """One per reconcile pass; every call is bounded by `timeout_s`."""

    def __init__(self, base_url: str, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout_s),
            json_serialize=lambda o: orjson.dumps(o).decode(),
        )

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._session.close()

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        url = self.base_url + path
        try:
            # 307s to the partition or controller leader are followed, body and all.
            async with self._session.request(method, url, json=body) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            why = str(e) or type(e).__name__
            raise AdminError(0, f"admin API at {self.base_url} unreachable: {why}") from None
        try:
            data = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            data = None
        if status >= 400:
            if isinstance(data, dict):
                msg, name = data.get("error"), data.get("error_name")
            else:
                msg, name = raw[:200].decode(errors="replace"), None
            raise AdminError(status, f"{method} {path}: {msg}", name)
        return status, data

    async def cluster(self) -> dict[str, Any]:
        return (await self._call("GET", "/api/v1/cluster"))[1]

    async def quorum(self) -> dict[str, Any]:
        return (await self._call("GET", "/api/v1/quorum"))[1]

    async def topics(self, internal: bool = True) -> list[Topic]:
        path = "/api/v1/topics" + ("?internal=true" if internal else "")
        return [_topic(t) for t in (await self._call("GET", path))[1]["topics"]]

    async def topic(self, name: str) -> Topic | None:
        try:
            return _topic((await self._call("GET", f"/api/v1/topics/{name}"))[1])
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
        return _topic((await self._call("POST", "/api/v1/topics", body))[1])

    async def alter_topic(
        self, name: str, partitions: int | None = None, configs: dict[str, str | None] | None = None
    ) -> Topic:
        body: dict[str, Any] = {}
        if partitions is not None:
            body["partitions"] = partitions
        if configs:
            body["configs"] = configs
        return _topic((await self._call("PATCH", f"/api/v1/topics/{name}", body))[1])

    async def delete_topic(self, name: str) -> bool:
        """False if it was already gone."""
        try:
            await self._call("DELETE", f"/api/v1/topics/{name}")
        except AdminError as e:
            if e.status == 404:
                return False
            raise
        return True

    async def reassignments(self) -> list[dict[str, Any]]:
        return (await self._call("GET", "/api/v1/reassignments"))[1]["reassignments"]

    async def reassign(self, moves: dict[tuple[str, int], list[int]], throttle: int) -> None:
        body = {
            "partitions": [
                {"topic": t, "partition": i, "replicas": r} for (t, i), r in sorted(moves.items())
            ],
            "throttle_bytes_per_sec": throttle,
        }
        await self._call("POST", "/api/v1/reassignments", body)

    async def clear_throttle(self) -> None:
        body = {"configs": {"replication.throttled.rate": None}}
        await self._call("PUT", "/api/v1/cluster/configs", body)
