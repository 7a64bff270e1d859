"""Kafka error codes come from kio's ErrorCode, in one place.

A hand-written table once said UNKNOWN_LEADER_EPOCH = 76, which is Kafka's
UNSUPPORTED_COMPRESSION_TYPE: a client whose metadata was ahead of the broker got a
fatal error instead of a retriable one. No module may define its own error constants.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

from kio.schema.errors import ErrorCode
from test_errors import Raw, code, fetch_partition, kio_module, make, new_topic

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
    m = kio_module("fetch", 12)
    part = make(
        m.FetchPartition,
        partition=0,
        fetch_offset=0,
        partition_max_bytes=1 << 16,
        current_leader_epoch=epoch,
        log_start_offset=-1,
        last_fetched_epoch=-1,
    )
    return make(
        m.FetchRequest,
        replica_id=-1,
        max_wait=datetime.timedelta(0),
        min_bytes=0,
        max_bytes=1 << 16,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(make(m.FetchTopic, topic=topic, partitions=(part,)),),
        forgotten_topics_data=(),
        rack_id="",
    )


def test_fetch_with_a_newer_leader_epoch_is_unknown_leader_epoch(broker) -> None:
    r = Raw(broker)
    try:
        new_topic(r, "epochs")
        assert code(fetch_partition(r.call(_fetch_at_epoch("epochs", 0)))) == 0
        p = fetch_partition(r.call(_fetch_at_epoch("epochs", 7)))
        assert code(p) == ErrorCode.unknown_leader_epoch == 75  # retriable, not 76
    finally:
        r.close()
