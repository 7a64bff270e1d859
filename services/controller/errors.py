"""Errors the controller returns, with the Kafka error code each one maps to."""

from __future__ import annotations

import re

UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
STALE_BROKER_EPOCH = 77
INVALID_TOPIC_EXCEPTION = 17
NOT_ENOUGH_REPLICAS = 19
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
NOT_CONTROLLER = 41
INVALID_REQUEST = 42
BROKER_NOT_AVAILABLE = 8
FENCED_LEADER_EPOCH = 74
NO_REASSIGNMENT_IN_PROGRESS = 85
INVALID_UPDATE_VERSION = 95
DUPLICATE_BROKER_REGISTRATION = 101
INCONSISTENT_CLUSTER_ID = 104
REQUEST_TIMED_OUT = 7

_NAMES = {v: k for k, v in dict(globals()).items() if k.isupper() and isinstance(v, int)}


def error_name(code: int) -> str:
    """The Kafka name of an error code, e.g. 38 -> INVALID_REPLICATION_FACTOR."""
    return _NAMES.get(code, f"ERROR_{code}")


_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249


class ControllerError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class NotController(ControllerError):
    """This node is not the active controller; `leader_id` says who is, if known."""

    def __init__(self, leader_id: int | None) -> None:
        super().__init__(NOT_CONTROLLER, f"not the active controller (leader: {leader_id})")
        self.leader_id = leader_id


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
