"""KIP-320 on the leader (Fetch v12+): a follower fetch naming the epoch of its last
record is checked against the leader's epoch cache, before the fetch counts. A follower
whose log parted from the leader's gets DIVERGING_EPOCH (the largest epoch of the
leader's log not above the named one, and where it ends) and no records, and its
position is not recorded (it is not caught up). The replication simulation checks the
follower side (tests/test_replication_sim.py, odd seeds truncate on this answer alone).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from conftest import record_batch
from straitmq.broker.api.context import RequestContext
from straitmq.broker.api.fetch import _encode, _FetchPlan
from straitmq.broker.partitions import Partition
from straitmq.broker.records import validate_batches
from straitmq.broker.replication.core import diverging_epoch
from straitmq.broker.replication.simulation import MemoryEpochs
from straitmq.broker.storage.log import LogConfig, PartitionLog
from straitmq.broker.views import LocalReplicas
from straitmq.metadata.image import PartitionImage
from test_fetch_sessions import _no_metadata

from straitmq.protocol.codec import _reader, response_schema


def _leader(tmp_path: Path) -> Partition:
    """Leader of [1, 2] at epoch 3: offsets 0-2 written in epoch 1, 3-4 in epoch 3 (the
    leader of epoch 2 wrote elsewhere: broker 2 may hold that)."""
    plog = PartitionLog(str(tmp_path / "t-0"), LogConfig())
    for epoch, values in ((1, [b"a", b"b", b"c"]), (3, [b"d", b"e"])):
        for v in values:
            view = memoryview(record_batch([v]))
            plog.append(view, validate_batches(view, 1 << 20), epoch)
    part = Partition("t", 0, plog, node_id=1)
    image = PartitionImage(replicas=[1, 2], isr=[1, 2], leader=1, leader_epoch=3)
    assert part.update(image, min_isr=1) == "leader"
    return part


def _collect(part: Partition, replica: int, fetch_offset: int, last_epoch: int) -> Any:
    throttle = SimpleNamespace(allowance=lambda t, i, r, limit: limit, spent=lambda *a: None)
    replicas = LocalReplicas(_no_metadata(), SimpleNamespace(get=lambda t, i: part))
    deps = SimpleNamespace(replicas=replicas, throttle=throttle, incarnation=lambda b: "now")
    ctx = SimpleNamespace(
        version=12,
        cluster_allowed=lambda op: True,
        allowed=lambda op, kind, name: True,
        client_id=f"replica-fetcher-{replica}",  # an older fetcher's: the metadata's process
    )
    req = SimpleNamespace(replica_id=replica, max_bytes=1 << 20, isolation_level=0)
    named = [("t", [(0, fetch_offset, 1 << 20, 3, 0, last_epoch)])]
    plan = _FetchPlan(deps, ctx, req, named, None, incremental=False)
    topics, _, _ = asyncio.run(plan.collect(plan.wanted()))
    return topics


def test_the_core_check_as_kafka() -> None:
    epochs = MemoryEpochs()  # the broker's cache, without its checkpoint file
    epochs.assign(1, 0)
    epochs.assign(3, 3)
    leo = 5
    assert diverging_epoch(epochs, leo, 5, -1) is None  # names no epoch
    assert diverging_epoch(epochs, leo, 5, 3) is None  # the same history
    assert diverging_epoch(epochs, leo, 2, 1) is None  # behind, within epoch 1
    assert diverging_epoch(epochs, leo, 4, 1) == (1, 3)  # epoch 1 ended at 3 here
    assert diverging_epoch(epochs, leo, 6, 2) == (1, 3)  # an epoch this log never had
    assert diverging_epoch(epochs, leo, 7, 3) == (3, 5)  # past the end of epoch 3
    assert diverging_epoch(epochs, leo, 5, 9) == (-1, -1)  # cannot tell: out of range


def test_a_parted_follower_is_told_where_and_not_counted(tmp_path: Path) -> None:
    part = _leader(tmp_path)
    follower = part.followers[2]
    [(name, [answer])] = _collect(part, 2, fetch_offset=6, last_epoch=2)
    index, error, hw, _, records, _, _, _, parted = answer
    assert hw == part.high_watermark
    assert (name, index, error, records, parted) == ("t", 0, 0, None, (1, 3))
    assert follower.log_end_offset == -1  # not recorded: it does not hold the leader's log

    # On the wire, as a v12+ fetcher reads it.
    ctx = RequestContext(
        api_key=1, version=12, correlation_id=7, client_id=None, client_host="/127.0.0.1"
    )
    raw = b"".join(bytes(p) for p in _encode(ctx, _collect(part, 2, 6, 2), 0, 0).pieces)
    # After the size, the correlation id and no header tags.
    resp, _ = _reader(response_schema(1, 12))(memoryview(raw), 4 + 4 + 1)
    r = resp.responses[0].partitions[0]
    assert (r.diverging_epoch.epoch, r.diverging_epoch.end_offset) == (1, 3)
    assert r.records is None or len(r.records) == 0


def test_a_follower_on_the_leaders_history_fetches_as_before(tmp_path: Path) -> None:
    part = _leader(tmp_path)
    [(_, [answer])] = _collect(part, 2, fetch_offset=3, last_epoch=1)
    assert answer[1] == 0 and answer[8] is None and answer[4] is not None
    assert part.followers[2].log_end_offset == 3


def test_consumers_are_not_checked(tmp_path: Path) -> None:
    """Consumers validate their position by OffsetForLeaderEpoch, as before: a
    consumer's fetch is answered with records whatever epoch it names."""
    part = _leader(tmp_path)
    [(_, [answer])] = _collect(part, -1, fetch_offset=3, last_epoch=2)
    assert answer[1] == 0 and answer[8] is None
