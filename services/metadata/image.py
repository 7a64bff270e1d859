"""The metadata image: what the metadata log says the cluster looks like right now.

Every change is a record (a plain dict with a "type") applied by `apply`; the broker
reads the image, never the log. The single-node journal (journal.py) and, later, the
Raft quorum both feed records through the same function.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

Record = dict[str, Any]


@dataclass(slots=True)
class TopicImage:
    name: str
    topic_id: uuid.UUID
    partitions: int
    replication_factor: int
    configs: dict[str, str] = field(default_factory=dict)
    internal: bool = False


@dataclass(slots=True)
class MetadataImage:
    cluster_id: str = ""
    topics: dict[str, TopicImage] = field(default_factory=dict)
    next_producer_id: int = 0
    offset: int = -1  # of the last applied record

    def apply(self, record: Record) -> None:
        kind = record["type"]
        if kind == "cluster":
            self.cluster_id = record["cluster_id"]
        elif kind == "topic":
            self.topics[record["name"]] = TopicImage(
                record["name"],
                uuid.UUID(record["topic_id"]),
                record["partitions"],
                record.get("replication_factor", 1),
                dict(record.get("configs", {})),
                record.get("internal", False),
            )
        elif kind == "partitions":
            self.topics[record["name"]].partitions = record["count"]
        elif kind == "config":
            configs = self.topics[record["name"]].configs
            for key, value in record["changes"].items():
                if value is None:
                    configs.pop(key, None)
                else:
                    configs[key] = value
        elif kind == "remove_topic":
            self.topics.pop(record["name"], None)
        elif kind == "producer_ids":
            self.next_producer_id = record["next"]
        else:
            raise ValueError(f"unknown metadata record type {kind!r}")
        self.offset += 1
