"""Kafka error codes come from kio's ErrorCode, in one place.

A hand-written table once said UNKNOWN_LEADER_EPOCH = 76, which is Kafka's
UNSUPPORTED_COMPRESSION_TYPE: a client whose metadata was ahead of the broker got a
fatal error instead of a retriable one. No module may define its own error constants.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from kio.schema.errors import ErrorCode
from test_errors import Raw, code, fetch, fetch_partition, new_topic

ROOT = Path(__file__).resolve().parent.parent
KAFKA_NAMES = {e.name.upper() for e in ErrorCode}
ASSIGNMENT = re.compile(r"^([A-Z_]+)\s*=\s*-?\d+\s*$", re.M)


def test_no_module_defines_its_own_kafka_error_codes() -> None:
    offenders = []
    for folder in ("services", "straitmq", "operator", "spark-jobs"):
        for path in (ROOT / folder).rglob("*.py"):
            for name in ASSIGNMENT.findall(path.read_text()):
                if name in KAFKA_NAMES:
                    offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert not offenders, "use kio's ErrorCode instead of: " + ", ".join(offenders)


def _fetch_at_epoch(topic: str, epoch: int) -> object:
    """test_errors' Fetch v12, with the client's idea of the leader epoch."""
    req = fetch(12, topic, 0)
    (t,) = req.topics
    (p,) = t.partitions
    p = dataclasses.replace(p, current_leader_epoch=epoch)
    return dataclasses.replace(req, topics=(dataclasses.replace(t, partitions=(p,)),))


def test_fetch_with_a_newer_leader_epoch_is_unknown_leader_epoch(broker) -> None:
    r = Raw(broker)
    try:
        new_topic(r, "epochs")
        assert code(fetch_partition(r.call(_fetch_at_epoch("epochs", 0)))) == 0
        p = fetch_partition(r.call(_fetch_at_epoch("epochs", 7)))
        assert code(p) == ErrorCode.unknown_leader_epoch == 75  # retriable, not 76
    finally:
        r.close()
