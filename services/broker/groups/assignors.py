"""Server-side partition assignors for KIP-848 consumer groups (ConsumerGroupHeartbeat).

Pure functions: (member subscriptions, the subscribed topics' partition counts, the
current assignment) -> the target assignment. The names are Kafka's
(`group.consumer.assignors`): `uniform` (balanced and sticky: a member keeps what it
has as long as the balance allows) and `range` (per topic, consecutive ranges over the
members subscribed to it, in member id order).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

TopicPartition = tuple[uuid.UUID, int]
Assignment = dict[str, frozenset[TopicPartition]]
# (subscriptions: member id -> topic ids, partitions per topic id, current assignment)
Assignor = Callable[
    [Mapping[str, frozenset[uuid.UUID]], Mapping[uuid.UUID, int], Mapping[str, frozenset]],
    Assignment,
]


def _order(tp: TopicPartition) -> tuple[str, int]:
    return str(tp[0]), tp[1]


def uniform(
    subscriptions: Mapping[str, frozenset[uuid.UUID]],
    partitions: Mapping[uuid.UUID, int],
    current: Mapping[str, frozenset[TopicPartition]],
) -> Assignment:
    """Every partition to a member subscribed to its topic, the counts as even as the
    subscriptions allow, and as few partitions moved as that permits."""
    members = sorted(subscriptions)
    out: dict[str, set[TopicPartition]] = {m: set() for m in members}
    all_tps = sorted(((t, p) for t, n in partitions.items() for p in range(n)), key=_order)
    eligible = {tp: [m for m in members if tp[0] in subscriptions[m]] for tp in all_tps}
    assignable = [tp for tp in all_tps if eligible[tp]]
    # The fair share if every member could take every partition (`base`, and one more for
    # `extra` of them); with mixed subscriptions a member may end up above it when
    # nobody else can take the rest.
    base, extra = divmod(len(assignable), len(members)) if members else (0, 0)
    # Stickiness first: members keep current partitions up to `base`, then up to `extra`
    # of them one more. (Keeping up to base + 1 each would leave new members nothing:
    # 6 partitions held 2 each by 3 members, and 2 more join.)
    taken: set[TopicPartition] = set()
    for limit in (base, base + 1):
        for m in members:
            for tp in sorted(current.get(m, ()), key=_order):
                if limit > base and extra == 0:
                    break
                if m in eligible.get(tp, ()) and tp not in taken and len(out[m]) < limit:
                    out[m].add(tp)
                    taken.add(tp)
                    if limit > base:
                        extra -= 1
    # The rest to the least loaded eligible member (ties by member id).
    for tp in assignable:
        if tp in taken:
            continue
        m = min(eligible[tp], key=lambda x: (len(out[x]), x))
        out[m].add(tp)
    return {m: frozenset(s) for m, s in out.items()}


def range_(
    subscriptions: Mapping[str, frozenset[uuid.UUID]],
    partitions: Mapping[uuid.UUID, int],
    current: Mapping[str, frozenset[TopicPartition]],
) -> Assignment:
    out: dict[str, set[TopicPartition]] = {m: set() for m in subscriptions}
    for topic, count in sorted(partitions.items(), key=lambda kv: str(kv[0])):
        subs = sorted(m for m, topics in subscriptions.items() if topic in topics)
        if not subs:
            continue
        per, extra = divmod(count, len(subs))
        start = 0
        for i, m in enumerate(subs):
            n = per + (1 if i < extra else 0)
            out[m].update((topic, p) for p in range(start, start + n))
            start += n
    return {m: frozenset(s) for m, s in out.items()}


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_}
DEFAULT_ASSIGNOR = "uniform"
