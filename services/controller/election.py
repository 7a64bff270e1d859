"""Partition leader election and the ISR changes that follow broker loss and return.

Rules (Kafka's): the leader comes from the ISR, preferred replica (first in the replica
list) first; when no ISR member is alive the partition goes offline, unless the topic
sets `unclean.leader.election.enable`, then any live replica leads with ISR = {itself}.
A broker that leaves is dropped from ISRs, except when it is the last member: keeping it
there lets it lead again with no data loss when it returns.
"""

from __future__ import annotations

from straitmq.metadata.image import NO_LEADER, MetadataImage, PartitionImage, Record, TopicImage


def unclean_allowed(topic: TopicImage) -> bool:
    return topic.configs.get("unclean.leader.election.enable", "false") == "true"


def elect(
    p: PartitionImage, isr: list[int], alive: set[int], unclean: bool
) -> tuple[int, list[int]]:
    """(leader, isr) for a partition whose current leader cannot continue."""
    for r in p.replicas:
        if r in isr and r in alive and r not in p.removing:
            return r, isr
    for r in p.replicas:
        if r in isr and r in alive:
            return r, isr
    if unclean:
        for r in p.replicas:
            if r in alive:
                return r, [r]
    return NO_LEADER, isr


def _change(t: TopicImage, i: int, p: PartitionImage, leader: int, isr: list[int]) -> Record:
    rec: Record = {"type": "partition_change", "topic": t.name, "index": i}
    if leader != p.leader:
        rec["leader"] = leader
    if isr != p.isr:
        rec["isr"] = isr
    return rec


def on_broker_leaving(image: MetadataImage, broker: int) -> list[Record]:
    """Move leadership away from `broker` and drop it from ISRs (fencing, shutdown)."""
    alive = {b.id for b in image.live_brokers()} - {broker}
    out = []
    for t in image.topics.values():
        for i, p in enumerate(t.partitions):
            if broker not in p.replicas:
                continue
            isr = [r for r in p.isr if r != broker] or p.isr
            leader = p.leader
            if leader == broker or leader not in alive:
                leader, isr = elect(p, isr, alive, unclean_allowed(t))
            if leader != p.leader or isr != p.isr:
                out.append(_change(t, i, p, leader, isr))
    return out


def on_replicas_offline(
    image: MetadataImage, broker: int, replicas: list[tuple[str, int]]
) -> list[Record]:
    """`broker` is alive but cannot open these replicas' logs (a full disk, no
    descriptors, a failed directory): lead them from another in-sync replica and drop
    the broker from their ISRs, as Kafka does for replicas in an offline log dir. The
    last in-sync copy stays where it is: it leads again once its log opens."""
    alive = {b.id for b in image.live_brokers()} - {broker}
    out = []
    for name, i in replicas:
        t = image.topics.get(name)
        if t is None or not 0 <= i < len(t.partitions):
            continue
        p = t.partitions[i]
        if broker not in p.isr:
            continue
        isr = [r for r in p.isr if r != broker]
        leader = p.leader
        if leader == broker or leader not in alive:
            leader, isr = elect(p, isr, alive, False) if isr else (NO_LEADER, isr)
        if leader == NO_LEADER:
            continue
        out.append(_change(t, i, p, leader, isr))
    return out


def on_broker_returning(image: MetadataImage, broker: int) -> list[Record]:
    """Give offline partitions back a leader once `broker` is alive again."""
    alive = {b.id for b in image.live_brokers()} | {broker}
    out = []
    for t in image.topics.values():
        for i, p in enumerate(t.partitions):
            if p.leader != NO_LEADER or broker not in p.replicas:
                continue
            leader, isr = elect(p, p.isr, alive, unclean_allowed(t))
            if leader != NO_LEADER:
                out.append(_change(t, i, p, leader, isr))
    return out


def leaderless_elections(image: MetadataImage) -> list[Record]:
    """Lead every offline partition that a live replica can lead (what each broker's
    return would have done)."""
    alive = {b.id for b in image.live_brokers()}
    return [
        r for t in image.topics.values() for r in _offline_elections(t, alive, unclean_allowed(t))
    ]


def _offline_elections(t: TopicImage, alive: set[int], unclean: bool) -> list[Record]:
    out = []
    for i, p in enumerate(t.partitions):
        if p.leader == NO_LEADER:
            leader, isr = elect(p, p.isr, alive, unclean)
            if leader != NO_LEADER:
                out.append(_change(t, i, p, leader, isr))
    return out


def preferred_leader_changes(
    image: MetadataImage, only: set[tuple[str, int]] | None = None
) -> list[Record]:
    """Move leadership back to preferred replicas that are alive and in sync."""
    alive = {b.id for b in image.live_brokers()}
    out = []
    for t in image.topics.values():
        for i, p in enumerate(t.partitions):
            if only is not None and (t.name, i) not in only:
                continue
            pref = p.preferred_leader
            if pref != p.leader and pref in p.isr and pref in alive and pref not in p.removing:
                out.append(_change(t, i, p, pref, p.isr))
    return out


def unclean_offline_elections(image: MetadataImage, topic: str) -> list[Record]:
    """A topic just allowed unclean election: lead its offline partitions from any live
    replica now, not at the next broker change."""
    alive = {b.id for b in image.live_brokers()}
    return _offline_elections(image.topics[topic], alive, True)
