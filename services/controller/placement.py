"""Replica placement: spread replicas and leaders evenly, across racks when there are racks.

Kafka's scheme: brokers in a rack-alternating order; partition p's first replica (its
preferred leader) is broker (start + p) mod n, and the followers come after it with a
shift that grows every n partitions, so a topic's replicas spread over every pair.
`start` moves with the cluster's partition count so leaders of successive topics do not
all begin on the same broker.
"""

from __future__ import annotations

from collections import defaultdict

from kio.schema.errors import ErrorCode
from straitmq.metadata.image import BrokerImage

from .errors import ControllerError


def rack_alternated(brokers: list[BrokerImage]) -> list[int]:
    """Broker ids ordered r1-b1, r2-b1, r3-b1, r1-b2, ... (ids sorted within a rack)."""
    by_rack: dict[str, list[int]] = defaultdict(list)
    for b in sorted(brokers, key=lambda b: b.id):
        by_rack[b.rack or ""].append(b.id)
    racks = [by_rack[r] for r in sorted(by_rack)]
    out: list[int] = []
    for i in range(max((len(r) for r in racks), default=0)):
        out.extend(r[i] for r in racks if i < len(r))
    return out


def place(
    brokers: list[BrokerImage], partitions: int, rf: int, first: int, start: int
) -> list[list[int]]:
    """Replica lists for partitions first..first+partitions-1 of a topic."""
    if rf < 1:
        raise ControllerError(
            ErrorCode.invalid_replication_factor, "replication factor must be at least 1"
        )
    if rf > len(brokers):
        raise ControllerError(
            ErrorCode.invalid_replication_factor,
            f"replication factor {rf} is larger than the {len(brokers)} available broker(s)",
        )
    ids = rack_alternated(brokers)
    rack_of = {b.id: b.rack or "" for b in brokers}
    racks = len(set(rack_of.values()))
    n = len(ids)
    out = []
    for p in range(first, first + partitions):
        shift = p // n
        head = (start + p) % n
        replicas = [ids[head]]
        if racks <= 1:
            for j in range(rf - 1):
                replicas.append(ids[(head + 1 + (shift + j) % (n - 1)) % n])
        else:
            # Kafka's rack-aware walk: the followers' shift grows by a whole round of
            # racks, and a broker is skipped while its rack (or the broker itself)
            # already holds a replica and some rack (or broker) holds none.
            used_racks = {rack_of[ids[head]]}
            k = 0
            for _ in range(rf - 1):
                while True:
                    b = ids[(head + 1 + (shift * racks + k) % (n - 1)) % n]
                    k += 1
                    if (rack_of[b] not in used_racks or len(used_racks) == racks) and (
                        b not in replicas or len(replicas) == n
                    ):
                        replicas.append(b)
                        used_racks.add(rack_of[b])
                        break
        out.append(replicas)
    return out
