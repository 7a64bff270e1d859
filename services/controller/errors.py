"""Errors the controller returns, each with its Kafka error code (kio's ErrorCode).

`ControllerError` is the controller's name for the one Kafka error type of every process
(straitmq.errors.KafkaError): the broker catches `KafkaError`, which catches these too.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode
from straitmq.metadata.topic_config import topic_name_problem

from straitmq.errors import KafkaError


class ControllerError(KafkaError):
    """A request the controller refuses, with its Kafka error code."""


class NotController(ControllerError):
    """This node is not the active controller; `leader_id` says who is, if known."""

    def __init__(self, leader_id: int | None) -> None:
        super().__init__(
            ErrorCode.not_controller, f"not the active controller (leader: {leader_id})"
        )
        self.leader_id = leader_id


def check_topic_name(name: str | None) -> None:
    problem = topic_name_problem(name)
    if problem is not None:
        raise ControllerError(ErrorCode.invalid_topic_exception, problem)
