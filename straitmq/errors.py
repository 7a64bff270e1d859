"""The one Kafka error type of every process: an error code (kio's ErrorCode) and a message.

Whatever answers a Kafka or HTTP request with an error code raises or catches `KafkaError`:
the broker's handlers, the controller (its `ControllerError` and `NotController` are
subclasses, services/controller/errors.py) and the controller client that carries the
controller's answers to a broker. Catching `KafkaError` catches them all.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode


def error_name(code: int) -> str:
    """The Kafka name of an error code, e.g. 38 -> INVALID_REPLICATION_FACTOR."""
    try:
        return ErrorCode(code).name.upper()
    except ValueError:
        return f"ERROR_{code}"


class KafkaError(Exception):
    """A request refused with Kafka's error `code` (kio's ErrorCode) and a `message`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
