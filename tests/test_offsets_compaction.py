"""`__consumer_offsets` stays bounded and keeps the latest commit of every key."""

from __future__ import annotations

from straitmq.broker import broker as broker_module
from straitmq.broker.broker import Broker
from straitmq.broker.config import BrokerConfig
from straitmq.broker.groups.offsets import OFFSETS_TOPIC


def test_offsets_topic_is_compacted_and_survives_reopen(tmp_path, monkeypatch):
    monkeypatch.setattr(broker_module, "OFFSETS_SEGMENT_BYTES", 4096)
    cfg = BrokerConfig(data_dir=str(tmp_path), offsets_topic_partitions=2)
    b = Broker(cfg)
    b._open_storage()
    b.controller.create_topic("t", 4, 1, {})
    for round_ in range(300):
        for group in ("g1", "g2", "g3"):
            b.offsets.commit(group, [("t", p, round_ * 10 + p, 0, "m") for p in range(4)])
    b.offsets.delete_group("g3")
    sizes_before = [len(b.partitions.get(OFFSETS_TOPIC, i).log.segments) for i in range(2)]
    assert max(sizes_before) > 2, "the tiny segment size should have rolled the topic"
    assert b.compact_offsets() > 0
    for i in range(2):
        assert len(b.partitions.get(OFFSETS_TOPIC, i).log.segments) <= 2
    b.partitions.close()
    b.journal.close()

    again = Broker(BrokerConfig(data_dir=str(tmp_path), offsets_topic_partitions=2))
    again._open_storage()
    for group in ("g1", "g2"):
        got = {k: c.offset for k, c in again.offsets.fetch(group).items()}
        assert got == {("t", p): 2990 + p for p in range(4)}
    assert not again.offsets.has_group("g3")
    again.partitions.close()
    again.journal.close()
