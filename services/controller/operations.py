"""The active controller's decisions: a request and the current image in, metadata
records out (or a ControllerError). Pure functions, no I/O: the quorum commits the
records and every node applies them to its image.
"""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode
from straitmq.metadata import features
from straitmq.metadata.broker_configs import DYNAMIC_BROKER_CONFIGS
from straitmq.metadata.broker_configs import check_value as check_broker_config
from straitmq.metadata.image import NO_LEADER, MetadataImage, PartitionImage, Record, TopicImage
from straitmq.metadata.quotas import (
    IP_QUOTAS_LEVEL,
    QuotaError,
    check_entity,
    check_ops,
    is_ip_entity,
)
from straitmq.metadata.topic_config import validate_topic_configs

from .election import elect, unclean_allowed
from .errors import ControllerError, check_topic_name
from .placement import place

MAX_PARTITIONS = 10_000
PRODUCER_ID_BLOCK = 1000
CLUSTER_CONFIGS = {
    # bytes/s a leader sends to replicas that a reassignment is adding; -1 = unthrottled
    "replication.throttled.rate": -1,
}


def _topic(image: MetadataImage, name: str) -> TopicImage:
    t = image.topics.get(name)
    if t is None:
        raise ControllerError(
            ErrorCode.unknown_topic_or_partition, f"topic '{name}' does not exist"
        )
    return t


def _partition(image: MetadataImage, name: str, index: int) -> tuple[TopicImage, PartitionImage]:
    t = _topic(image, name)
    if not 0 <= index < len(t.partitions):
        raise ControllerError(
            ErrorCode.unknown_topic_or_partition, f"topic '{name}' has no partition {index}"
        )
    return t, t.partitions[index]


def _placement_start(image: MetadataImage) -> int:
    return sum(len(t.partitions) for t in image.topics.values())


def _partition_records(
    name: str, first: int, assignments: list[list[int]], alive: set[int]
) -> list[Record]:
    out = []
    for i, replicas in enumerate(assignments, start=first):
        isr = [r for r in replicas if r in alive]
        out.append(
            {
                "type": "partition",
                "topic": name,
                "index": i,
                "replicas": replicas,
                "isr": isr,
                "leader": isr[0] if isr else NO_LEADER,
            }
        )
    return out


def _check_assignments(image: MetadataImage, assignments: list[list[int]]) -> None:
    for replicas in assignments:
        if not replicas:
            raise ControllerError(ErrorCode.invalid_replica_assignment, "a replica list is empty")
        if len(set(replicas)) != len(replicas):
            raise ControllerError(
                ErrorCode.invalid_replica_assignment, f"replica list {replicas} repeats a broker"
            )
        for r in replicas:
            if r not in image.brokers:
                raise ControllerError(
                    ErrorCode.invalid_replica_assignment,
                    f"broker {r} does not exist in this cluster",
                )


def create_topic(
    image: MetadataImage,
    name: str,
    partitions: int,
    replication_factor: int,
    configs: dict[str, str | None],
    default_partitions: int = 1,
    default_replication_factor: int = 1,
    assignments: list[list[int]] | None = None,
    internal: bool = False,
) -> list[Record]:
    check_topic_name(name)
    if name in image.topics:
        raise ControllerError(ErrorCode.topic_already_exists, f"topic '{name}' already exists")
    problem = validate_topic_configs(configs)
    if problem:
        raise ControllerError(ErrorCode.invalid_config, problem)
    live = image.live_brokers()
    if assignments:
        _check_assignments(image, assignments)
        if len({len(a) for a in assignments}) != 1:
            raise ControllerError(
                ErrorCode.invalid_replica_assignment,
                "every partition needs the same number of replicas",
            )
    else:
        if partitions == -1:
            partitions = default_partitions
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise ControllerError(
                ErrorCode.invalid_partitions, f"partitions must be between 1 and {MAX_PARTITIONS}"
            )
        if replication_factor == -1:
            replication_factor = default_replication_factor
        assignments = place(live, partitions, replication_factor, 0, _placement_start(image))
    records: list[Record] = [
        {
            "type": "topic",
            "name": name,
            "topic_id": str(uuid.uuid4()),
            "configs": {k: v for k, v in configs.items() if v is not None},
            "internal": internal,
        }
    ]
    return records + _partition_records(name, 0, assignments, {b.id for b in live})


def create_partitions(
    image: MetadataImage, name: str, count: int, assignments: list[list[int]] | None = None
) -> list[Record]:
    t = _topic(image, name)
    have = len(t.partitions)
    if count <= have:
        raise ControllerError(
            ErrorCode.invalid_partitions,
            f"topic '{name}' has {have} partitions; the new count must be larger "
            "(partitions never shrink)",
        )
    if count > MAX_PARTITIONS:
        raise ControllerError(ErrorCode.invalid_partitions, f"at most {MAX_PARTITIONS} partitions")
    live = image.live_brokers()
    if assignments:
        if len(assignments) != count - have:
            raise ControllerError(
                ErrorCode.invalid_replica_assignment,
                f"{count - have} new partitions but {len(assignments)} replica lists",
            )
        _check_assignments(image, assignments)
    else:
        assignments = place(live, count - have, t.replication_factor, have, _placement_start(image))
    return _partition_records(name, have, assignments, {b.id for b in live})


def delete_topic(image: MetadataImage, name: str) -> list[Record]:
    _topic(image, name)
    return [{"type": "remove_topic", "name": name}]


def alter_configs(image: MetadataImage, name: str, changes: dict[str, str | None]) -> list[Record]:
    t = _topic(image, name)
    problem = validate_topic_configs(changes, t.configs)
    if problem:
        raise ControllerError(ErrorCode.invalid_config, problem)
    return [{"type": "config", "name": name, "changes": changes}] if changes else []


def alter_cluster_configs(changes: dict[str, str | None]) -> list[Record]:
    for key, value in changes.items():
        if key.startswith("group:"):
            continue  # a group's config, `group:<id>:<name>` (checked by the broker)
        if key in DYNAMIC_BROKER_CONFIGS:  # log.cleaner.threads, ... (Kafka's names)
            if value is not None and (problem := check_broker_config(key, value)):
                raise ControllerError(ErrorCode.invalid_config, problem)
            continue
        if key not in CLUSTER_CONFIGS:
            raise ControllerError(
                ErrorCode.invalid_config,
                f"unknown cluster config '{key}' (known: "
                f"{', '.join([*CLUSTER_CONFIGS, *DYNAMIC_BROKER_CONFIGS])})",
            )
        if value is not None:
            try:
                n = int(value)
            except ValueError:
                n = -2
            if n < -1 or n == 0:
                raise ControllerError(
                    ErrorCode.invalid_config, f"{key} must be a positive number of bytes/s or -1"
                )
    return [{"type": "cluster_config", "changes": changes}] if changes else []


def alter_scram_credentials(
    image: MetadataImage, upsertions: list[dict], deletions: list[dict]
) -> tuple[list[Record], dict[str, str]]:
    """Records for SCRAM credential changes, and {user: why} for deletions of a
    credential that does not exist (Kafka answers those RESOURCE_NOT_FOUND)."""
    records: list[Record] = []
    missing: dict[str, str] = {}
    for d in deletions:
        if d["mechanism"] not in image.scram_credentials.get(d["name"], {}):
            missing[d["name"]] = (
                f"attempt to delete a {d['mechanism']} credential of user {d['name']!r} "
                "that does not exist"
            )
            continue
        records.append({"type": "remove_user_scram_credential", **d})
    for u in upsertions:
        records.append({"type": "user_scram_credential", **u})
    return records, missing


def alter_acls(image: MetadataImage, creations: list[list], deletions: list[list]) -> list[Record]:
    """Records adding the bindings not there yet and removing those that are (the broker
    validated them and resolved DeleteAcls filters against its image)."""
    records: list[Record] = []
    for b in deletions:
        if tuple(b) in image.acls:
            records.append({"type": "remove_acl", "binding": list(b)})
    for b in creations:
        if tuple(b) not in image.acls:
            records.append({"type": "acl", "binding": list(b)})
    return records


def alter_client_quotas(
    image: MetadataImage, entries: list[dict]
) -> tuple[list[Record], dict[int, str]]:
    """Records for client quota changes ({"entity": [[type, name | null]], "ops": {key:
    value | null}} each), only for what changes, and {entry position: why} for the
    entries refused (Kafka's INVALID_REQUEST per entity); a refused entry writes nothing."""
    records: list[Record] = []
    refused: dict[int, str] = {}
    for i, e in enumerate(entries):
        try:
            entity = check_entity([(str(t), n) for t, n in e["entity"]])
            ops_ = check_ops(e["ops"], entity)
            if is_ip_entity(entity) and any(v is not None for v in ops_.values()):
                level = image.finalized_features()[features.STRAITMQ]
                if level < IP_QUOTAS_LEVEL:
                    raise QuotaError(
                        f"ip quotas need {features.STRAITMQ}={IP_QUOTAS_LEVEL} finalized (this "
                        f"cluster runs at {level}, which release 0.2.0 can still join and would "
                        f"not enforce them): finalize it with `strait features upgrade` first"
                    )
        except QuotaError as why:
            refused[i] = str(why)
            continue
        current = image.client_quotas.get(entity, {})
        for key, value in ops_.items():
            if (value is None and key not in current) or (
                value is not None and current.get(key) == value
            ):
                continue
            records.append(
                {
                    "type": "client_quota",
                    "entity": [list(p) for p in entity],
                    "key": key,
                    "value": value,
                }
            )
    return records, refused


def allocate_producer_ids(image: MetadataImage) -> tuple[int, list[Record]]:
    start = image.next_producer_id
    return start, [{"type": "producer_ids", "next": start + PRODUCER_ID_BLOCK}]


# -- ISR changes and reassignment ------------------------------------------------------


def _finish_if_complete(
    image: MetadataImage, t: TopicImage, p: PartitionImage, isr: list[int], rec: Record
) -> None:
    """A reassignment ends once every target replica is in the ISR: the leaving replicas
    drop out of the replica set and, if one of them led, the leadership moves."""
    if not p.adding and not p.removing:
        return
    target = [r for r in p.replicas if r not in p.removing]
    if not all(r in isr for r in target):
        return
    new_isr = [r for r in isr if r in target]
    rec.update(replicas=target, isr=new_isr, adding=[], removing=[])
    if p.leader not in target:
        alive = {b.id for b in image.live_brokers()}
        shadow = PartitionImage(target, new_isr, p.leader)
        rec["leader"], rec["isr"] = elect(shadow, new_isr, alive, unclean_allowed(t))


def alter_partition(
    image: MetadataImage,
    broker: int,
    name: str,
    index: int,
    leader_epoch: int,
    partition_epoch: int,
    new_isr: list[int],
    incarnations: dict[int, str] | None = None,
) -> list[Record]:
    """A leader's ISR change. `incarnations`: for each joining member, the broker
    registration its caught-up fetches came from (KIP-903's broker epochs); one that
    registered again since (a restart, which may have lost unflushed records) cannot
    join on them. A leader that sends none (an older broker) is not checked."""
    t, p = _partition(image, name, index)
    if p.leader != broker or leader_epoch != p.leader_epoch:
        raise ControllerError(
            ErrorCode.fenced_leader_epoch,
            f"broker {broker} at leader epoch {leader_epoch} is not the leader of "
            f"{name}-{index} (leader {p.leader}, epoch {p.leader_epoch})",
        )
    if partition_epoch != p.partition_epoch:
        raise ControllerError(
            ErrorCode.invalid_update_version,
            f"{name}-{index} is at partition epoch {p.partition_epoch}, not {partition_epoch}",
        )
    if broker not in new_isr or any(r not in p.replicas for r in new_isr):
        raise ControllerError(
            ErrorCode.invalid_request, f"ISR {new_isr} must hold the leader and only replicas"
        )
    alive = {b.id for b in image.live_brokers()}
    for r in new_isr:
        if r not in p.isr and r not in alive:
            raise ControllerError(
                ErrorCode.invalid_request, f"broker {r} is fenced or shutting down; it cannot join"
            )
        if incarnations is not None and r not in p.isr:
            seen = incarnations.get(r)
            if seen != image.brokers[r].incarnation:
                raise ControllerError(
                    ErrorCode.ineligible_replica,
                    f"broker {r} registered again since the fetches that made it caught "
                    f"up ({seen!r}): it joins once its new process caught up",
                )
    rec: Record = {"type": "partition_change", "topic": name, "index": index, "isr": new_isr}
    _finish_if_complete(image, t, p, new_isr, rec)
    return [rec]


def alter_partitions(
    image: MetadataImage, broker: int, items: list[dict]
) -> tuple[list[Record], dict[int, ControllerError]]:
    """Many ISR changes of one leader at once (Kafka's AlterPartition carries many
    partitions): each item ({"topic", "index", "leader_epoch", "partition_epoch", "isr"})
    is judged alone as alter_partition, and a refused one holds back none of the others.
    The records, and the refusals by item position."""
    records: list[Record] = []
    refused: dict[int, ControllerError] = {}
    seen: set[tuple[str, int]] = set()
    for i, it in enumerate(items):
        key = (str(it["topic"]), int(it["index"]))
        if key in seen:  # two changes of one partition would judge the second stale
            refused[i] = ControllerError(
                ErrorCode.invalid_request, f"{key[0]}-{key[1]} is named twice in one request"
            )
            continue
        seen.add(key)
        try:
            records += alter_partition(
                image,
                broker,
                key[0],
                key[1],
                int(it["leader_epoch"]),
                int(it["partition_epoch"]),
                [int(r) for r in it["isr"]],
                incarnations_of(it),
            )
        except ControllerError as e:
            refused[i] = e
    return records, refused


def incarnations_of(req: dict) -> dict[int, str] | None:
    """An ISR change's joining members' incarnations ({"2": "..."} in JSON); None from a
    leader that sends none."""
    got = req.get("incarnations")
    return None if got is None else {int(r): str(i) for r, i in got.items()}


def reassign(image: MetadataImage, name: str, index: int, target: list[int] | None) -> list[Record]:
    """Start (target) or cancel (None) moving a partition to other brokers."""
    t, p = _partition(image, name, index)
    original = [r for r in p.replicas if r not in p.adding]
    rec: Record = {"type": "partition_change", "topic": name, "index": index}
    if target is None:
        if not p.adding and not p.removing:
            raise ControllerError(
                ErrorCode.no_reassignment_in_progress, f"{name}-{index} is not being reassigned"
            )
        isr = [r for r in p.isr if r in original] or p.isr
        rec.update(replicas=original, isr=isr, adding=[], removing=[])
        if p.leader not in original:
            alive = {b.id for b in image.live_brokers()}
            shadow = PartitionImage(original, isr, p.leader)
            rec["leader"], rec["isr"] = elect(shadow, isr, alive, unclean_allowed(t))
        return [rec]
    _check_assignments(image, [target])
    if target == p.replicas and not p.adding and not p.removing:
        return []
    adding = [r for r in target if r not in original]
    removing = [r for r in original if r not in target]
    replicas = list(target) + removing
    # A new target can drop a replica an earlier one was adding: it leaves the ISR too.
    isr = [r for r in p.isr if r in replicas]
    if not isr:
        raise ControllerError(
            ErrorCode.invalid_replica_assignment,
            f"{name}-{index}: no in-sync replica would be left; keep one of {p.isr}",
        )
    rec.update(replicas=replicas, adding=adding, removing=removing)
    if isr != p.isr:
        rec["isr"] = isr
    leader = p.leader
    if leader not in replicas:
        alive = {b.id for b in image.live_brokers()}
        shadow = PartitionImage(replicas, isr, leader, removing=removing)
        leader, isr = elect(shadow, isr, alive, unclean_allowed(t))
        rec["leader"], rec["isr"] = leader, isr
    shadow = PartitionImage(replicas, isr, leader, adding=adding, removing=removing)
    _finish_if_complete(image, t, shadow, isr, rec)
    return [rec]
