"""`__consumer_offsets` stays bounded and keeps the latest commit of every key."""

from __future__ import annotations

import asyncio

from straitmq.broker import broker as broker_module
from straitmq.broker.config import BrokerConfig
from straitmq.broker.groups.offsets import OFFSETS_TOPIC
from straitmq.node import build_broker


def _config(path: str) -> BrokerConfig:
    return BrokerConfig(data_dir=path, offsets_topic_partitions=2, port=0, http_port=0)


def test_offsets_topic_is_compacted_and_survives_reopen(tmp_path, monkeypatch):
    monkeypatch.setattr(broker_module, "OFFSETS_SEGMENT_BYTES", 4096)

    async def first() -> None:
        b = build_broker(_config(str(tmp_path)))
        await b.start()
        await b.control("create_topic", {"name": "t", "partitions": 4, "replication_factor": 1})
        for round_ in range(300):
            for group in ("g1", "g2", "g3"):
                b.offsets.commit(group, [("t", p, round_ * 10 + p, 0, "m") for p in range(4)])
        b.offsets.delete_group("g3")
        logs = [b.partitions.get(OFFSETS_TOPIC, i).log for i in range(2)]
        assert max(len(plog.segments) for plog in logs) > 2, "the topic should have rolled"
        before = [plog.size_bytes for plog in logs]
        assert await b.cleaner.run_once() > 0
        after = [plog.size_bytes for plog in logs]
        # The latest commit of 8 keys per group is left, plus the active segments.
        assert sum(after) < sum(before) / 20, (before, after)
        await b.stop()

    async def again() -> None:
        b = build_broker(_config(str(tmp_path)))
        await b.start()
        for group in ("g1", "g2"):
            got = {k: c.offset for k, c in b.offsets.fetch(group).items()}
            assert got == {("t", p): 2990 + p for p in range(4)}
        assert not b.offsets.has_group("g3")
        await b.stop()

    asyncio.run(first())
    asyncio.run(again())
