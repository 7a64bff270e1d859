"""One StraitMQ broker node: wires metadata, logs, groups and the two listeners."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from straitmq.controller.local_controller import LocalController
from straitmq.metadata.image import MetadataImage
from straitmq.metadata.journal import MetadataJournal

from .config import BrokerConfig
from .groups.coordinator import GroupCoordinator, GroupSettings
from .groups.offsets import OFFSETS_TOPIC, OffsetStore
from .metrics import BrokerMetrics
from .partitions import PartitionManager
from .records import BatchInfo

log = logging.getLogger("straitmq.broker")
OFFSETS_SEGMENT_BYTES = 64 * 1024 * 1024


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.metrics = BrokerMetrics()
        self.connections: set[Any] = set()
        self.stopping = False
        self.ready = False
        self._servers: list[Any] = []
        self._tasks: list[asyncio.Task] = []
        os.makedirs(config.data_dir, exist_ok=True)
        self.topic_defaults = {"max.message.bytes": str(config.message_max_bytes)}
        if config.log_flush_interval_messages:
            self.topic_defaults["flush.messages"] = str(config.log_flush_interval_messages)
        self.journal = MetadataJournal(os.path.join(config.data_dir, "metadata.log"))
        self.controller = LocalController(self.journal)
        self.partitions = PartitionManager(
            os.path.join(config.data_dir, "logs"), self.topic_defaults
        )
        self.controller.listeners.append(self._on_metadata)
        self.offsets = OffsetStore(config.offsets_topic_partitions)
        self.groups = GroupCoordinator(
            self.offsets,
            GroupSettings(
                min_session_timeout_ms=config.group_min_session_timeout_ms,
                max_session_timeout_ms=config.group_max_session_timeout_ms,
                initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            ),
        )

    def _on_metadata(self, records: list[dict]) -> None:
        # Producer-id blocks and the cluster id leave the logs alone; a full sync walks
        # every partition and the data directory.
        if any(r["type"] not in ("producer_ids", "cluster") for r in records):
            self.partitions.sync(self.image)

    @property
    def image(self) -> MetadataImage:
        return self.journal.image

    def _open_storage(self) -> None:
        self.partitions.sync(self.image)
        if OFFSETS_TOPIC not in self.image.topics:
            self.controller.create_topic(
                OFFSETS_TOPIC,
                self.config.offsets_topic_partitions,
                1,
                # Kept forever and compacted by rewriting (see compact_offsets): time-based
                # retention would drop the commits of idle groups.
                {"segment.bytes": str(OFFSETS_SEGMENT_BYTES), "retention.ms": "-1"},
                internal=True,
            )
        self.offsets.partitions_count = self.image.topics[OFFSETS_TOPIC].partitions
        batches = []
        for i in range(self.offsets.partitions_count):
            part = self.partitions.get(OFFSETS_TOPIC, i)
            assert part is not None
            batches += part.log.batches(part.log.log_start_offset, part.log.log_end_offset)
        self.offsets.load(batches)
        self.offsets.bind(self._append_offsets)
        self.compact_offsets()

    def compact_offsets(self) -> int:
        """Keep `__consumer_offsets` small: once a partition has rolled, write its live
        commits again at the head and drop the older segments. A crash in between only
        means the old records are replayed before the new ones, which win."""
        dropped = 0
        for i in range(self.offsets.partitions_count):
            part = self.partitions.get(OFFSETS_TOPIC, i)
            if part is None or len(part.log.segments) < 2:
                continue
            part.log.roll()
            head = part.log.log_end_offset
            self.offsets.rewrite(i)
            dropped += part.log.drop_segments_before(head)
        return dropped

    def _append_offsets(self, index: int, data: memoryview, batches: list[BatchInfo]) -> None:
        part = self.partitions.get(OFFSETS_TOPIC, index)
        assert part is not None, "offsets topic partition missing"
        part.append(data, batches)

    async def start(self) -> None:
        from .http_api import start_http
        from .server import serve

        self._open_storage()
        server = await serve(self, self.config.host, self.config.port)
        self._servers.append(server)
        if self.config.port == 0:
            self.config.port = server.sockets[0].getsockname()[1]
            if self.config.advertised_port == 0:
                self.config.advertised_port = self.config.port
        runner, http_port = await start_http(self, self.config.http_host, self.config.http_port)
        self.config.http_port = http_port
        self._servers.append(runner)
        self._tasks.append(asyncio.get_running_loop().create_task(self._retention_loop()))
        self.ready = True
        log.info("broker started", extra={"port": self.config.port, "http": http_port})

    async def _retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.retention_check_interval_ms / 1000)
            try:
                self.compact_offsets()
                deleted = self.partitions.apply_retention()
                if deleted:
                    log.info("retention deleted segments", extra={"segments": deleted})
            except OSError:
                log.exception("retention check failed")

    async def stop(self) -> None:
        self.stopping = True
        self.ready = False
        for t in self._tasks:
            t.cancel()
        for s in self._servers:
            if hasattr(s, "cleanup"):
                await s.cleanup()
            else:
                s.close()
        for c in list(self.connections):
            c.close()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self.partitions.close()
        self.journal.close()


__all__ = ["Broker", "BrokerConfig"]
