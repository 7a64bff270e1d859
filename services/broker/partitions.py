"""The partitions this broker holds, kept in step with the metadata image.

Single node: this broker leads every partition and its high watermark is the log end.
Long-polling fetches park a future on each partition they read; an append wakes them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil

from straitmq.metadata.image import MetadataImage, TopicImage
from straitmq.metadata.topic_config import effective

from .records import BatchInfo
from .storage.log import LogConfig, PartitionLog

log = logging.getLogger("straitmq.broker")


def log_config_for(topic: TopicImage, broker_defaults: dict[str, str]) -> LogConfig:
    c = effective({**broker_defaults, **topic.configs})
    return LogConfig(
        segment_bytes=int(c["segment.bytes"]),
        segment_ms=int(c["segment.ms"]),
        retention_ms=int(c["retention.ms"]),
        retention_bytes=int(c["retention.bytes"]),
        max_message_bytes=int(c["max.message.bytes"]),
        index_interval_bytes=int(c["index.interval.bytes"]),
        flush_messages=int(c["flush.messages"]),
        flush_ms=int(c["flush.ms"]),
    )


class Partition:
    __slots__ = ("index", "leader_epoch", "log", "topic", "waiters")

    def __init__(self, topic: str, index: int, plog: PartitionLog) -> None:
        self.topic = topic
        self.index = index
        self.log = plog
        self.leader_epoch = 0
        self.waiters: set[asyncio.Future[None]] = set()

    @property
    def high_watermark(self) -> int:
        return self.log.log_end_offset

    def append(self, data: memoryview, batches: list[BatchInfo]) -> int:
        base = self.log.append(data, batches, self.leader_epoch)
        if self.waiters:
            for fut in self.waiters:
                if not fut.done():
                    fut.set_result(None)
            self.waiters.clear()
        return base


class PartitionManager:
    def __init__(self, data_dir: str, broker_defaults: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.broker_defaults = broker_defaults
        self.partitions: dict[tuple[str, int], Partition] = {}
        self.topic_ids: dict[str, object] = {}
        os.makedirs(data_dir, exist_ok=True)

    @staticmethod
    def dir_name(topic: str, index: int) -> str:
        return f"{topic}-{index}"

    def get(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def sync(self, image: MetadataImage) -> None:
        """Open, configure and delete logs so they match the image."""
        for (topic, index), part in list(self.partitions.items()):
            t = image.topics.get(topic)
            if t is None or t.topic_id != self.topic_ids.get(topic):
                part.log.close()
                shutil.rmtree(part.log.directory, ignore_errors=True)
                del self.partitions[(topic, index)]
        wanted = set()
        for t in image.topics.values():
            self.topic_ids[t.name] = t.topic_id
            cfg = log_config_for(t, self.broker_defaults)
            for i in range(t.partitions):
                wanted.add(self.dir_name(t.name, i))
                part = self.partitions.get((t.name, i))
                if part is None:
                    path = os.path.join(self.data_dir, self.dir_name(t.name, i))
                    self._check_owner(path, str(t.topic_id))
                    part = Partition(t.name, i, PartitionLog(path, cfg))
                    self.partitions[(t.name, i)] = part
                else:
                    part.log.config = cfg
        for name in os.listdir(self.data_dir):
            path = os.path.join(self.data_dir, name)
            if (
                os.path.isdir(path)
                and name not in wanted
                and os.path.exists(os.path.join(path, ".topic-id"))
            ):
                shutil.rmtree(path, ignore_errors=True)

    @staticmethod
    def _check_owner(path: str, topic_id: str) -> None:
        """A directory left by a deleted topic of the same name must not be reused."""
        marker = os.path.join(path, ".topic-id")
        if os.path.exists(marker):
            with open(marker) as f:
                if f.read().strip() != topic_id:
                    shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path, exist_ok=True)
        if not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(topic_id)

    def apply_retention(self) -> int:
        return sum(p.log.apply_retention() for p in self.partitions.values())

    def close(self) -> None:
        for p in self.partitions.values():
            p.log.close()
