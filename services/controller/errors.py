"""Errors the controller returns, each with its Kafka error code (kio's ErrorCode)."""

from __future__ import annotations

import re

from kio.schema.errors import ErrorCode


def error_name(code: int) -> str:
    """The Kafka name of an error code, e.g. 38 -> INVALID_REPLICATION_FACTOR."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"ERROR_{code}"


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
        super().__init__(
            ErrorCode.not_controller, f"not the active controller (leader: {leader_id})"
        )
        self.leader_id = leader_id


def check_topic_name(name: str | None) -> None:
    if not name:
        raise ControllerError(ErrorCode.invalid_topic_exception, "topic name is empty")
    if name in (".", ".."):
        raise ControllerError(ErrorCode.invalid_topic_exception, f"topic name cannot be '{name}'")
    if len(name) > MAX_TOPIC_NAME:
        raise ControllerError(
            ErrorCode.invalid_topic_exception,
            f"topic name is longer than {MAX_TOPIC_NAME} characters",
        )
    if not _LEGAL.match(name):
        raise ControllerError(
            ErrorCode.invalid_topic_exception,
            f"topic name '{name}' has characters other than ASCII letters, digits, '.', '_', '-'",
        )
