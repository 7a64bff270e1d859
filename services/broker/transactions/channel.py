"""Requests from this broker to another over the inter-broker listener: the coordinator's
WriteTxnMarkers to partition leaders, and a partition leader's AddPartitionsToTxn to a
transaction's coordinator. One connection per broker address, one request on it at a
time (the answers of a pipelined connection would have to be matched up)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from straitmq.protocol.client import ConnectionClosed, KafkaConnection

from ..metadata_view import MetadataView
from ..security.listeners import Listener, endpoint_for

log = logging.getLogger("straitmq.transactions")


class InterBrokerChannel:
    def __init__(self, node_id: int, metadata: MetadataView, listener: Listener, name: str):
        self.node_id = node_id
        self.metadata = metadata
        self.listener = listener
        self._name = name
        self._conns: dict[tuple[str, int], KafkaConnection] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}

    async def call(
        self, broker: int, api_key: int, version: int, req: Any, timeout_s: float = 10.0
    ) -> Any:
        """The answer, or None when the broker is not alive or not reachable."""
        b = self.metadata.image.brokers.get(broker)
        if b is None or not b.alive:
            return None
        addr = endpoint_for(b, self.listener.name) or (b.host, b.port)
        conn = self._conns.get(addr)
        if conn is None:
            conn = self._conns[addr] = KafkaConnection(
                addr[0], addr[1], f"{self._name}-{self.node_id}", self.listener.client
            )
        lock = self._locks.setdefault(addr, asyncio.Lock())
        async with lock:
            try:
                return await conn.request(api_key, version, req, timeout_s)
            except (ConnectionClosed, OSError, TimeoutError) as e:
                log.info("%s: broker %s unreachable: %s", self._name, broker, e)
                conn.close()
                if self._conns.get(addr) is conn:
                    del self._conns[addr]
                return None

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
