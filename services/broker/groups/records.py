"""The records that persist KIP-848 consumer groups in `__consumer_offsets`.

Kafka's group coordinator writes one record per piece of group state, keyed so that
compaction (and replay) keeps the newest per key; we write the same pieces in our own
compact encoding, in the group's partition of the offsets topic, next to its commits:

    kind  key            value (JSON)                     Kafka's record (ConsumerGroup...)
    cg    group          {"epoch"}                        ...Metadata
    cgp   group          {"topics": {name: [id, count]}}  ...PartitionMetadata
    cgm   group, member  subscriptions, rack, instance    ...MemberMetadata
                         id, client, rebalance timeout,
                         a classic member's session
                         timeout and protocols
    cgta  group          {"epoch"}                        ...TargetAssignmentMetadata
    cgtm  group, member  {"p": partitions}                ...TargetAssignmentMember
    cgc   group, member  member epoch, previous epoch,    ...CurrentMemberAssignment
                         state, assigned, revoking

A member that leaves gets tombstones for its three keys, a deleted group for all.
Classic groups have one record each (`grp`, as Kafka's GroupMetadata; below). A
record key is a JSON object (`{"t": kind, "g": group, "m": member}`), so a replay tells
it apart from a commit's key (a JSON array). Values are plain JSON data, compared as
such to find what changed (`image` / `diff`), and turned back into a ConsumerGroup by
`rebuild`.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterable, Mapping

from .assignors import TopicPartition
from .classic_group import EMPTY, STABLE, ClassicGroup, ClassicMember
from .consumer_group import ClassicInfo, ConsumerGroup, ConsumerMember

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
    meta: dict = {
        "instance": m.instance_id,
        "rack": m.rack_id,
        "client": m.client_id,
        "host": m.client_host,
        "rebalance_ms": m.rebalance_timeout_ms,
        "topics": sorted(m.subscribed),
        "regex": m.subscribed_regex,
        "assignor": m.assignor,
    }
    if m.classic is not None:
        # As Kafka's ClassicMemberMetadata: what a classic member joined with.
        meta["classic"] = {
            "session_ms": m.classic.session_timeout_ms,
            "protocols": [[n, base64.b64encode(b).decode()] for n, b in m.classic.protocols],
        }
    return {
        ("cgm", gid, mid): meta,
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
        if (classic := v.get("classic")) is not None:
            member.classic = ClassicInfo(
                classic["session_ms"],
                tuple((n, base64.b64decode(b)) for n, b in classic["protocols"]),
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


# -- classic groups: one record per group, as Kafka's GroupMetadata ----------------------
#
#   grp   group   protocol type, generation, protocol, leader, members (id, instance id,
#                 client, timeouts, the selected protocol's metadata, the assignment)
#
# written when a generation becomes Stable (the leader's SyncGroup) or the group Empty,
# and when a static member is replaced in a Stable group; deleted with the group.


def classic_key(group_id: str) -> RecordKey:
    return ("grp", group_id, "")


def classic_image(group: ClassicGroup) -> dict:
    proto = group.protocol_name
    return {
        "type": group.protocol_type,
        "generation": group.generation,
        "protocol": proto,
        "leader": group.leader_id,
        "members": [
            {
                "id": m.member_id,
                "instance": m.instance_id,
                "client": m.client_id,
                "host": m.client_host,
                "session_ms": m.session_timeout_ms,
                "rebalance_ms": m.rebalance_timeout_ms,
                "metadata": base64.b64encode(m.metadata_for(proto)).decode(),
                "assignment": base64.b64encode(m.assignment).decode(),
            }
            for m in group.members.values()
        ],
    }


def rebuild_classic(group_id: str, v: Mapping) -> ClassicGroup:
    """The group as its record describes it: Stable with its members, or Empty."""
    group = ClassicGroup(
        group_id,
        generation=v["generation"],
        protocol_type=v["type"],
        protocol_name=v["protocol"],
    )
    for m in v["members"]:
        member = ClassicMember(
            m["id"],
            m["instance"],
            m["client"],
            m["host"],
            m["session_ms"],
            m["rebalance_ms"],
            v["type"] or "",
            ((v["protocol"] or "", base64.b64decode(m["metadata"])),),
            base64.b64decode(m["assignment"]),
        )
        group.members[member.member_id] = member
        if member.instance_id is not None:
            group.static[member.instance_id] = member.member_id
    group.leader_id = v["leader"] if v["leader"] in group.members else None
    group.transition(STABLE if group.members else EMPTY)
    return group
