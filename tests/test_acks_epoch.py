"""An acks=all wait belongs to the leader epoch its write was appended in.

Found by tests/test_txn_history.py: a Produce was appended by a leader, which lost the
leadership before its answer started waiting. Its log was cut, the partition refilled
by the new leader; the broker led again, its high watermark passed the offset, and the
wait said "replicated" for a record that was gone (the client went on with the next
sequence: OUT_OF_ORDER_SEQUENCE_NUMBER, and a committed transaction lost a record).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from conftest import record_batch
from straitmq.broker.partitions import Partition
from straitmq.broker.records import validate_batches
from straitmq.broker.storage.log import LogConfig, PartitionLog
from straitmq.metadata.image import PartitionImage


def _image(leader: int, epoch: int) -> PartitionImage:
    return PartitionImage(replicas=[1, 2], isr=[1, 2], leader=leader, leader_epoch=epoch)


def _leader(tmp_path: Path) -> Partition:
    part = Partition("t", 0, PartitionLog(str(tmp_path / "t-0"), LogConfig()), node_id=1)
    assert part.update(_image(1, 3), min_isr=1) == "leader"
    return part


def _append(part: Partition, value: bytes) -> int:
    """As the leader; the log end after it."""
    view = memoryview(record_batch([value]))
    part.append(view, validate_batches(view, 1 << 20))
    return part.log.log_end_offset


def test_a_wait_that_starts_after_the_epoch_moved_on_fails(tmp_path: Path) -> None:
    part = _leader(tmp_path)
    end = _append(part, b"a")  # appended in epoch 3; not replicated yet
    # Before the answer waits: broker 2 leads (epoch 4), this one follows, then leads
    # again (epoch 5) and its follower fetches past the offset.
    assert part.update(_image(2, 4), min_isr=1) == "follower"
    assert part.update(_image(1, 5), min_isr=1) == "leader"
    _append(part, b"b")
    part.on_follower_fetch(2, part.log.log_end_offset)
    assert part.high_watermark >= end

    async def run() -> tuple[bool, bool]:
        return (
            await part.wait_for_hw(end, 1.0, leader_epoch=3),
            await part.wait_for_hw(end, 1.0, leader_epoch=5),
        )

    assert asyncio.run(run()) == (False, True)


def test_a_wait_ends_when_its_broker_leads_again_in_a_new_epoch(tmp_path: Path) -> None:
    part = _leader(tmp_path)
    end = _append(part, b"a")

    async def run() -> bool:
        waiting = asyncio.ensure_future(part.wait_for_hw(end, 5.0, leader_epoch=3))
        await asyncio.sleep(0)
        # Straight to leading in epoch 5 (the metadata of epoch 4 applied with it):
        # the wait of epoch 3 is over, and a high watermark moving later cannot end it
        # with True.
        assert part.update(_image(1, 5), min_isr=1) == "leader"
        part.on_follower_fetch(2, part.log.log_end_offset)
        return await asyncio.wait_for(waiting, 1.0)

    assert asyncio.run(run()) is False


def test_a_follower_never_vouches_for_a_write(tmp_path: Path) -> None:
    part = _leader(tmp_path)
    end = _append(part, b"a")
    assert part.update(_image(2, 4), min_isr=1) == "follower"
    part.set_follower_hw(end)  # the new leader's high watermark passed the offset

    async def run() -> bool:
        return await part.wait_for_hw(end, 1.0)

    assert asyncio.run(run()) is False
