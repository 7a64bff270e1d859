"""`__consumer_offsets` stays bounded and keeps the latest commit of every key."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from straitmq.broker import broker as broker_module
from straitmq.broker.broker import Broker
from straitmq.broker.cleaner_settings import CleanerSettings
from straitmq.broker.config import BrokerConfig
from straitmq.broker.groups.offsets import OFFSETS_TOPIC
from straitmq.broker.storage.log import LogConfig
from straitmq.node import build_broker


def _config(path: str) -> BrokerConfig:
    return BrokerConfig(data_dir=path, offsets_topic_partitions=2, port=0, http_port=0)


async def _log_config(
    b: Broker, topic: str, check: Callable[[LogConfig], bool], what: str
) -> LogConfig:
    """Partition 0's LogConfig once `check` holds for it (replicas open and change on
    the event loop, after the metadata record): polled, failing after 10 s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while True:
        p = b.partitions.get(topic, 0)
        if p is not None and check(p.log.config):
            return p.log.config
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


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


def test_offsets_topic_is_created_compacted_and_an_older_one_is_set_so(tmp_path: Path) -> None:
    """`__consumer_offsets` is made with cleanup.policy=compact (its replicas' LogConfig
    says so); one made before, without it, gets it when a broker starts."""

    async def run() -> None:
        b = build_broker(_config(str(tmp_path)))
        await b.start()
        configs = b.image.topics[OFFSETS_TOPIC].configs
        assert configs["cleanup.policy"] == "compact" and "retention.ms" not in configs
        cfg = await _log_config(b, OFFSETS_TOPIC, lambda c: c.compact, "a compacted replica")
        assert not cfg.delete
        # As an older broker left it: no policy of its own (the default, delete).
        await b.control(
            "alter_configs", {"name": OFFSETS_TOPIC, "changes": {"cleanup.policy": None}}
        )
        await _log_config(b, OFFSETS_TOPIC, lambda c: not c.compact, "the policy dropped")
        await b.stop()
        b = build_broker(_config(str(tmp_path)))
        await b.start()
        assert b.image.topics[OFFSETS_TOPIC].configs["cleanup.policy"] == "compact"
        await _log_config(b, OFFSETS_TOPIC, lambda c: c.compact, "compact after a restart")
        await b.stop()

    asyncio.run(run())


def test_a_runtime_broker_default_reaches_the_replicas(tmp_path: Path) -> None:
    """log.cleanup.policy and log.cleaner.* set at runtime (a cluster config) become the
    LogConfig of every replica whose topic has no value of its own, at once; deleted,
    the static setting is back."""

    async def run() -> None:
        b = build_broker(_config(str(tmp_path)))
        await b.start()
        for name, configs in (("plain", {}), ("own", {"cleanup.policy": "delete"})):
            await b.control(
                "create_topic",
                {"name": name, "partitions": 1, "replication_factor": 1, "configs": configs},
            )
        for name in ("plain", "own"):
            await _log_config(b, name, lambda c: c.delete, f"{name}'s replica")
        changes = {"log.cleanup.policy": "compact", "log.cleaner.min.cleanable.ratio": "0.2"}
        await b.control("alter_cluster_configs", {"changes": changes})
        plain = await _log_config(b, "plain", lambda c: c.compact, "the new default policy")
        own = b.partitions.get("own", 0).log.config
        assert (plain.compact, plain.delete, plain.min_cleanable_dirty_ratio) == (True, False, 0.2)
        assert (own.compact, own.delete, own.min_cleanable_dirty_ratio) == (False, True, 0.2)
        assert CleanerSettings.of(b.config, b.image.cluster_configs).threads == 1
        await b.control("alter_cluster_configs", {"changes": {"log.cleaner.threads": "2"}})
        assert CleanerSettings.of(b.config, b.image.cluster_configs).threads == 2
        await b.control(
            "alter_cluster_configs",
            {"changes": {"log.cleanup.policy": None, "log.cleaner.min.cleanable.ratio": None}},
        )
        plain = await _log_config(b, "plain", lambda c: c.delete, "the static default back")
        assert (plain.compact, plain.delete, plain.min_cleanable_dirty_ratio) == (False, True, 0.5)
        await b.stop()

    asyncio.run(run())
