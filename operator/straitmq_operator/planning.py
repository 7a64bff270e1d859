"""Partition moves for scaling: which replicas go where (pure functions, no I/O).

Moves keep each replica's position in the list, so when a partition's first
(preferred-leader) replica moves, leadership moves with it and stays spread.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .admin import Partition, Topic

Moves = dict[tuple[str, int], list[int]]


def replica_counts(partitions: Iterable[Partition], brokers: Iterable[int]) -> Counter[int]:
    counts: Counter[int] = Counter({b: 0 for b in brokers})
    for p in partitions:
        counts.update(p.replicas)
    return counts


def all_partitions(topics: Iterable[Topic]) -> list[Partition]:
    return [p for t in topics for p in t.partitions]


def blocking_topic(topics: Iterable[Topic], brokers: int) -> Topic | None:
    """A topic whose replication factor is above `brokers`, if any: a user's topic
    before an internal one (that is the one to name), then the highest factor."""
    over = [t for t in topics if t.replication_factor > brokers]
    key = lambda t: (not t.internal, t.replication_factor, t.name)  # noqa: E731
    return max(over, key=key) if over else None


def drain(partitions: list[Partition], removing: set[int], staying: list[int]) -> Moves:
    """Replace every replica on `removing` with the least-loaded staying broker."""
    counts = replica_counts(partitions, staying)
    moves: Moves = {}
    for p in sorted(partitions, key=lambda p: (p.topic, p.index)):
        if not removing.intersection(p.replicas):
            continue
        target = list(p.replicas)
        for pos, b in enumerate(target):
            if b not in removing:
                continue
            choices = [s for s in staying if s not in target]
            if not choices:
                raise ValueError(
                    f"{p.topic}-{p.index} has {len(p.replicas)} replicas but only "
                    f"{len(staying)} brokers would stay"
                )
            best = min(choices, key=lambda s: (counts[s], s))
            counts[best] += 1
            target[pos] = best
        moves[(p.topic, p.index)] = target
    return moves


def spread_onto(partitions: list[Partition], new: set[int], brokers: list[int]) -> Moves:
    """Move replicas from the most loaded brokers onto `new` ones until each new broker
    holds its fair share (floor of the average). Nothing moves if they already do."""
    counts = replica_counts(partitions, brokers)
    total = sum(counts[b] for b in brokers)
    fair = total // len(brokers) if brokers else 0
    moves: Moves = {}
    for target_broker in sorted(new):
        while counts[target_broker] < fair:
            # A partition may give up several replicas, one per new broker.
            current = {
                (p.topic, p.index): moves.get((p.topic, p.index), p.replicas) for p in partitions
            }
            candidates = [
                (key, b)
                for key, reps in sorted(current.items())
                if target_broker not in reps
                for b in reps
                if b not in new and counts[b] > fair
            ]
            if not candidates:
                break
            # Take from the busiest broker; among its partitions, prefer moving a
            # leader position so leadership spreads too.
            key, b = max(
                candidates,
                key=lambda c: (counts[c[1]], current[c[0]][0] == c[1], -c[0][1], c[0][0]),
            )
            target = list(current[key])
            target[target.index(b)] = target_broker
            moves[key] = target
            counts[b] -= 1
            counts[target_broker] += 1
    return moves


def restart_would_break_min_isr(topics: Iterable[Topic], broker: int) -> Topic | None:
    """A topic with a partition that restarting `broker` would take below min ISR.

    Partitions that cannot keep min ISR through any single restart (RF <= min ISR) do
    not block: they lose availability whichever broker restarts."""
    for t in topics:
        if t.replication_factor <= t.min_insync:
            continue
        for p in t.partitions:
            if broker in p.isr and len(p.isr) - 1 < t.min_insync:
                return t
    return None


def under_min_isr(topics: Iterable[Topic]) -> int:
    return sum(1 for t in topics for p in t.partitions if len(p.isr) < t.min_insync)


def isr_health(topic: Topic) -> dict[str, int]:
    """A topic's replication health for its status (and `kubectl get topics`): partitions
    with a replica out of the ISR, with fewer in sync than min.insync.replicas (acks=all
    writes fail there), and without a leader."""
    parts = topic.partitions
    return {
        "minInSyncReplicas": topic.min_insync,
        "underReplicatedPartitions": sum(1 for p in parts if len(p.isr) < len(p.replicas)),
        "underMinIsrPartitions": sum(1 for p in parts if len(p.isr) < topic.min_insync),
        "offlinePartitions": sum(1 for p in parts if p.leader < 0),
    }


def change_replication(
    partitions: list[Partition],
    rf: int,
    racks: dict[int, str | None],
    load: Counter[int],
) -> Moves:
    """Targets that give each partition `rf` replicas (a topic's replication factor change).

    Growing appends live brokers (`racks`' keys), on racks the partition lacks first, then
    the least loaded. Shrinking drops out-of-sync replicas first, then from the end, never
    the preferred (first) replica or the current leader, so leadership does not move.
    """
    load = Counter(load)
    moves: Moves = {}
    for p in sorted(partitions, key=lambda p: (p.topic, p.index)):
        replicas = list(p.replicas)
        if len(replicas) < rf:
            while len(replicas) < rf:
                used = {racks.get(r) for r in replicas}
                free = [b for b in racks if b not in replicas]
                if not free:
                    break
                pick = min(free, key=lambda b: (racks[b] in used, load[b], b))
                replicas.append(pick)
                load[pick] += 1
        elif len(replicas) > rf:
            # The current leader stays (no leadership move), and with room the preferred.
            lead = p.leader if p.leader in replicas else replicas[0]
            keep = {lead, replicas[0]} if rf >= 2 else {lead}
            order = [r for r in reversed(replicas) if r not in p.isr] + [
                r for r in reversed(replicas) if r in p.isr
            ]
            for r in order:
                if len(replicas) == rf:
                    break
                if r not in keep:
                    replicas.remove(r)
                    load[r] -= 1
        if replicas != p.replicas:
            moves[(p.topic, p.index)] = replicas
    return moves
