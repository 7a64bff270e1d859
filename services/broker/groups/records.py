"""The records that persist KIP-848 consumer groups in `__consumer_offsets`.

Kafka's group coordinator writes one record per piece of group state, keyed so that
compaction (and replay) keeps the newest per key; we write the same pieces in our own
compact encoding, in the group's partition of the offsets topic, next to its commits:

    kind  key            value (JSON)                     Kafka's record (ConsumerGroup...)
    cg    group          {"epoch"}                        ...Metadata
    cgp   group          {"topics": {name: [id, count]}}  ...PartitionMetadata
    cgm   group, member  subscriptions, rack, instance    ...MemberMetadata
                         id, client, rebalance timeout
    cgta  group          {"epoch"}                        ...TargetAssignmentMetadata
    cgtm  group, member  {"p": partitions}                ...TargetAssignmentMember
    cgc   group, member  member epoch, previous epoch,    ...CurrentMemberAssignment
                         state, assigned, revoking

A member that leaves gets tombstones for its three keys, a deleted group for all. A
record key is a JSON object (`{"t": kind, "g": group, "m": member}`), so a replay tells
it apart from a commit's key (a JSON array). Values are plain JSON data, compared as
such to find what changed (`image` / `diff`), and turned back into a ConsumerGroup by
`rebuild`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping

from .assignors import TopicPartition
from .consumer_group import ConsumerGroup, ConsumerMember

# (kind, group id, member id or ""): what a record is about.
RecordKey = tuple[str, str, str]
# None: a tombstone.
Record = tuple[RecordKey, dict | None]

GROUP_KINDS = ("cg", "cgp", "cgta")
MEMBER_KINDS = ("cgm", "cgtm", "cgc")


def encode_key(key: RecordKey) -> dict:
    kind, group, member = key
    return {"t": kind, "g": group, "m": member} if member else {"t": kind, "g": group}


def decode_key(obj: dict) -> RecordKey:
    return obj["t"], obj["g"], obj.get("m", "")


def _parts(tps: Iterable[TopicPartition]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for t, p in tps:
        out.setdefault(str(t), []).append(p)
    return {t: sorted(ps) for t, ps in sorted(out.items())}


def _tps(parts: Mapping[str, list[int]]) -> frozenset[TopicPartition]:
    return frozenset((uuid.UUID(t), p) for t, ps in parts.items() for p in ps)


def group_image(group: ConsumerGroup) -> dict[RecordKey, dict]:
    """The group-level records."""
    gid = group.group_id
    return {
        ("cg", gid, ""): {"epoch": group.epoch},
        ("cgp", gid, ""): {
            "topics": {n: [str(i), c] for n, (i, c) in sorted(group.topics.items())}
        },
        ("cgta", gid, ""): {"epoch": group.assignment_epoch},
    }


def member_image(group: ConsumerGroup, m: ConsumerMember) -> dict[RecordKey, dict]:
    """One member's records."""
    gid, mid = group.group_id, m.member_id
    return {
        ("cgm", gid, mid): {
            "instance": m.instance_id,
            "rack": m.rack_id,
            "client": m.client_id,
            "host": m.client_host,
            "rebalance_ms": m.rebalance_timeout_ms,
            "topics": sorted(m.subscribed),
            "regex": m.subscribed_regex,
            "assignor": m.assignor,
        },
        ("cgtm", gid, mid): {"p": _parts(group.target.get(mid, frozenset()))},
        ("cgc", gid, mid): {
            "epoch": m.epoch,
            "prev": m.previous_epoch,
            "state": m.state,
            "assigned": _parts(m.assigned),
            "revoking": _parts(m.pending_revocation),
        },
    }


def member_keys(group_id: str, member_id: str) -> list[RecordKey]:
    return [(kind, group_id, member_id) for kind in MEMBER_KINDS]


def rebuild(group_id: str, records: Mapping[RecordKey, dict]) -> ConsumerGroup | None:
    """The group as its newest records describe it (None: no group record)."""
    meta = records.get(("cg", group_id, ""))
    if meta is None:
        return None
    group = ConsumerGroup(group_id, epoch=meta["epoch"])
    ta = records.get(("cgta", group_id, ""))
    group.assignment_epoch = ta["epoch"] if ta is not None else 0
    parts = records.get(("cgp", group_id, ""))
    if parts is not None:
        group.topics = {n: (uuid.UUID(i), c) for n, (i, c) in parts["topics"].items()}
    for (kind, _, mid), v in sorted(records.items()):
        if kind != "cgm":
            continue
        member = ConsumerMember(
            mid,
            v["instance"],
            v["rack"],
            v["client"],
            v["host"],
            v["rebalance_ms"],
            frozenset(v["topics"]),
            v["assignor"],
            v["regex"],
        )
        current = records.get(("cgc", group_id, mid))
        if current is not None:
            member.epoch = current["epoch"]
            member.previous_epoch = current["prev"]
            member.state = current["state"]
            member.assigned = _tps(current["assigned"])
            member.pending_revocation = _tps(current["revoking"])
        target = records.get(("cgtm", group_id, mid))
        if target is not None:
            group.target[mid] = _tps(target["p"])
        group.members[mid] = member
        if member.instance_id is not None:
            group.static[member.instance_id] = mid
    return group
