"""Partition reassignment and leader election over the Kafka protocol.

AlterPartitionReassignments, ListPartitionReassignments and ElectLeaders map onto the
active controller's `reassign`, `list_reassignments` and `elect_preferred` calls. Any
broker answers them (clients send them to the "controller" that Metadata names, which is
a broker in KRaft clusters). Each partition gets its own error code and message, as
Kafka's admin clients expect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from straitmq.metadata.image import NO_LEADER, MetadataImage

from straitmq.errors import KafkaError
from straitmq.security.acls import ALTER, DESCRIBE

from .context import RequestContext

if TYPE_CHECKING:
    from .deps import AdminDeps

PREFERRED, UNCLEAN = 0, 1


async def handle_alter_partition_reassignments(
    deps: AdminDeps, ctx: RequestContext, req: Any
) -> dict:
    """One controller call per partition, so one bad partition does not fail the others
    (Kafka applies them independently too). `replicas` null cancels."""
    if not ctx.cluster_allowed(ALTER):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "error_message": "ALTER on the cluster is needed",
            "responses": [],
        }
    responses = []
    for t in req.topics:
        results = []
        seen: set[int] = set()
        for p in t.partitions:
            res: dict[str, Any] = {
                "partition_index": p.partition_index,
                "error_code": 0,
                "error_message": None,
            }
            results.append(res)
            try:
                if p.partition_index in seen:
                    raise KafkaError(
                        ErrorCode.invalid_request, f"{t.name}-{p.partition_index} appears twice"
                    )
                seen.add(p.partition_index)
                replicas = list(p.replicas) if p.replicas is not None else None
                await deps.control(
                    "reassign",
                    {
                        "partitions": [
                            {"topic": t.name, "index": p.partition_index, "replicas": replicas}
                        ]
                    },
                )
            except KafkaError as e:
                res["error_code"] = e.code
                res["error_message"] = e.message
        responses.append({"name": t.name, "partitions": results})
    return {"throttle_time": 0, "error_code": 0, "error_message": None, "responses": responses}


async def handle_list_partition_reassignments(
    deps: AdminDeps, ctx: RequestContext, req: Any
) -> dict:
    """Ongoing reassignments, all or of the named partitions (unknown topics and
    partitions that are not moving are left out, as in Kafka)."""
    if not ctx.cluster_allowed(DESCRIBE):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "error_message": "DESCRIBE on the cluster is needed",
            "topics": [],
        }
    try:
        reply = await deps.control("list_reassignments", {})
    except KafkaError as e:
        return {"throttle_time": 0, "error_code": e.code, "error_message": e.message, "topics": []}
    wanted: dict[str, set[int]] | None = None
    if req.topics is not None:
        wanted = {}
        for t in req.topics:
            wanted.setdefault(t.name, set()).update(t.partition_indexes)
    by_topic: dict[str, list[dict]] = {}
    for r in reply["reassignments"]:
        if wanted is not None and r["index"] not in wanted.get(r["topic"], ()):
            continue
        by_topic.setdefault(r["topic"], []).append(
            {
                "partition_index": r["index"],
                "replicas": r["replicas"],
                "adding_replicas": r["adding"],
                "removing_replicas": r["removing"],
            }
        )
    return {
        "throttle_time": 0,
        "error_code": 0,
        "error_message": None,
        "topics": [{"name": n, "partitions": ps} for n, ps in sorted(by_topic.items())],
    }


def _election_check(image: MetadataImage, topic: str, index: int, kind: int) -> tuple[int, str]:
    """(error code, message) before electing; 0 means this partition can move."""
    t = image.topics.get(topic)
    if t is None or not 0 <= index < len(t.partitions):
        return ErrorCode.unknown_topic_or_partition, f"{topic}-{index} does not exist"
    p = t.partitions[index]
    if kind == UNCLEAN:
        if p.leader != NO_LEADER:
            return ErrorCode.election_not_needed, f"{topic}-{index} has a leader ({p.leader})"
        return (
            ErrorCode.invalid_request,
            f"{topic}-{index} has no leader; unclean election on request is not supported: "
            "set unclean.leader.election.enable=true on the topic to let an out-of-sync "
            "replica lead",
        )
    pref = p.preferred_leader
    if p.leader == pref:
        return ErrorCode.election_not_needed, f"broker {pref} already leads {topic}-{index}"
    if pref not in p.isr or not image.broker_alive(pref) or pref in p.removing:
        return (
            ErrorCode.preferred_leader_not_available,
            f"preferred leader {pref} of {topic}-{index} is not alive and in sync (ISR {p.isr})",
        )
    return 0, ""


async def handle_elect_leaders(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    """Preferred-leader election (v0 has no type). The controller moves the eligible
    requested partitions to their preferred leaders in one change; each then reports
    whether it got there."""
    kind = getattr(req, "election_type", PREFERRED)
    if not ctx.cluster_allowed(ALTER):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "replica_election_results": [],
        }
    try:
        await deps.metadata.catch_up()
    except KafkaError:
        pass  # decide on what we have; the controller re-checks eligibility anyway
    image = deps.metadata.image
    all_partitions = req.topic_partitions is None
    if all_partitions:
        asked = [(n, i) for n, t in sorted(image.topics.items()) for i in range(len(t.partitions))]
    else:
        asked = [(t.topic, i) for t in req.topic_partitions for i in t.partitions]
    checks = {tp: _election_check(image, *tp, kind) for tp in asked}
    top_error = 0
    if kind not in (PREFERRED, UNCLEAN):
        top_error = ErrorCode.invalid_request
        checks = {tp: (ErrorCode.invalid_request, f"unknown election type {kind}") for tp in asked}
    elif any(code == 0 for code, _ in checks.values()):
        try:
            eligible = [{"topic": t, "index": i} for (t, i), c in checks.items() if c[0] == 0]
            await deps.control("elect_preferred", {"partitions": eligible})
        except KafkaError as e:
            checks = {tp: (e.code, e.message) if c[0] == 0 else c for tp, c in checks.items()}
        image = deps.metadata.image
        for tp, (code, _) in list(checks.items()):
            if code != 0:
                continue
            p = image.partition(*tp)
            if p is None or p.leader != p.preferred_leader:
                checks[tp] = (
                    ErrorCode.preferred_leader_not_available,
                    f"preferred leader of {tp[0]}-{tp[1]} could not take over; retry",
                )
    by_topic: dict[str, list[dict]] = {}
    for (topic, index), (code, message) in checks.items():
        # Asked for every partition, Kafka leaves out the ones already well led.
        if all_partitions and code == ErrorCode.election_not_needed:
            continue
        by_topic.setdefault(topic, []).append(
            {"partition_id": index, "error_code": code, "error_message": message or None}
        )
    return {
        "throttle_time": 0,
        "error_code": top_error,
        "replica_election_results": [
            {"topic": n, "partition_result": rs} for n, rs in by_topic.items()
        ],
    }
