"""The single-node controller: validates metadata changes and commits them to the journal.

It has the shape the Raft-backed active controller will have: requests in, metadata
records out, changes visible once committed. Errors carry Kafka error codes.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable

from straitmq.metadata.image import MetadataImage, Record
from straitmq.metadata.journal import MetadataJournal
from straitmq.metadata.topic_config import validate_topic_configs

UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC_EXCEPTION = 17
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_CONFIG = 40
INVALID_REQUEST = 42

_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249
MAX_PARTITIONS = 10_000
PRODUCER_ID_BLOCK = 1000


class ControllerError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_topic_name(name: str | None) -> None:
    if not name:
        raise ControllerError(INVALID_TOPIC_EXCEPTION, "topic name is empty")
    if name in (".", ".."):
        raise ControllerError(INVALID_TOPIC_EXCEPTION, f"topic name cannot be '{name}'")
    if len(name) > MAX_TOPIC_NAME:
        raise ControllerError(
            INVALID_TOPIC_EXCEPTION, f"topic name is longer than {MAX_TOPIC_NAME} characters"
        )
    if not _LEGAL.match(name):
        raise ControllerError(
            INVALID_TOPIC_EXCEPTION,
            f"topic name '{name}' has characters other than ASCII letters, digits, '.', '_', '-'",
        )


class LocalController:
    def __init__(self, journal: MetadataJournal, live_brokers: int = 1) -> None:
        self.journal = journal
        self.live_brokers = live_brokers
        self.listeners: list[Callable[[list[Record]], None]] = []
        self._producer_id_limit = journal.image.next_producer_id
        self._next_producer_id = journal.image.next_producer_id
        if not journal.image.cluster_id:
            self._commit([{"type": "cluster", "cluster_id": _new_cluster_id()}])

    @property
    def image(self) -> MetadataImage:
        return self.journal.image

    def _commit(self, records: list[Record]) -> None:
        self.journal.append(records)
        for listener in self.listeners:
            listener(records)

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: dict[str, str | None],
        validate_only: bool = False,
        internal: bool = False,
    ) -> None:
        check_topic_name(name)
        if name in self.image.topics:
            raise ControllerError(TOPIC_ALREADY_EXISTS, f"topic '{name}' already exists")
        if partitions == -1:
            partitions = 1
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ControllerError(
                INVALID_PARTITIONS, f"partitions must be between 1 and {MAX_PARTITIONS}"
            )
        if replication_factor == -1:
            replication_factor = 1
        if replication_factor < 1 or replication_factor > self.live_brokers:
            raise ControllerError(
                INVALID_REPLICATION_FACTOR,
                f"replication factor {replication_factor} is larger than the "
                f"{self.live_brokers} available broker(s)"
                if replication_factor > 0
                else "replication factor must be at least 1",
            )
        problem = validate_topic_configs(configs)
        if problem:
            raise ControllerError(INVALID_CONFIG, problem)
        if validate_only:
            return
        self._commit(
            [
                {
                    "type": "topic",
                    "name": name,
                    "topic_id": str(uuid.uuid4()),
                    "partitions": partitions,
                    "replication_factor": replication_factor,
                    "configs": {k: v for k, v in configs.items() if v is not None},
                    "internal": internal,
                }
            ]
        )

    def delete_topic(self, name: str) -> None:
        if name not in self.image.topics:
            raise ControllerError(UNKNOWN_TOPIC_OR_PARTITION, f"topic '{name}' does not exist")
        self._commit([{"type": "remove_topic", "name": name}])

    def create_partitions(self, name: str, count: int, validate_only: bool = False) -> None:
        topic = self.image.topics.get(name)
        if topic is None:
            raise ControllerError(UNKNOWN_TOPIC_OR_PARTITION, f"topic '{name}' does not exist")
        if count <= topic.partitions:
            raise ControllerError(
                INVALID_PARTITIONS,
                f"topic '{name}' has {topic.partitions} partitions; the new count must be "
                "larger (partitions never shrink)",
            )
        if count > MAX_PARTITIONS:
            raise ControllerError(INVALID_PARTITIONS, f"at most {MAX_PARTITIONS} partitions")
        if not validate_only:
            self._commit([{"type": "partitions", "name": name, "count": count}])

    def alter_configs(
        self, name: str, changes: dict[str, str | None], validate_only: bool = False
    ) -> None:
        if name not in self.image.topics:
            raise ControllerError(UNKNOWN_TOPIC_OR_PARTITION, f"topic '{name}' does not exist")
        problem = validate_topic_configs(changes)
        if problem:
            raise ControllerError(INVALID_CONFIG, problem)
        if not validate_only and changes:
            self._commit([{"type": "config", "name": name, "changes": changes}])

    def allocate_producer_id(self) -> int:
        """Producer ids come in blocks so the journal sees one write per thousand ids."""
        if self._next_producer_id >= self._producer_id_limit:
            self._producer_id_limit = self._next_producer_id + PRODUCER_ID_BLOCK
            self._commit([{"type": "producer_ids", "next": self._producer_id_limit}])
        pid = self._next_producer_id
        self._next_producer_id += 1
        return pid


def _new_cluster_id() -> str:
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
