"""Topic administration, configs and producer ids, through the controller."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from straitmq.metadata.broker_configs import DYNAMIC_BROKER_CONFIGS, check_together
from straitmq.metadata.broker_configs import check_value as check_broker_config
from straitmq.metadata.quotas import CONTROLLER_MUTATION_RATE
from straitmq.metadata.topic_config import (
    TOPIC_CONFIGS,
    effective,
    list_items,
    topic_name_problem,
)

from straitmq.errors import KafkaError
from straitmq.security.acls import (
    ALTER,
    ALTER_CONFIGS,
    CREATE,
    DESCRIBE,
    DESCRIBE_CONFIGS,
    GROUP,
    IDEMPOTENT_WRITE,
    TOPIC,
    WRITE,
)
from straitmq.security.acls import DELETE as ACL_DELETE

from ..dynamic_configs import effective_values, static_values
from ..quotas import user_of
from ..share import group_configs
from .context import RequestContext

if TYPE_CHECKING:
    from .deps import AdminDeps

log = logging.getLogger("straitmq.broker")

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
SOURCE_DEFAULT = 5
SOURCE_TOPIC = 1
SOURCE_DYNAMIC_BROKER = 2
SOURCE_DYNAMIC_DEFAULT_BROKER = 3
SOURCE_STATIC_BROKER = 4
_TYPE_CODES = {
    "boolean": 1,
    "string": 2,
    "int": 3,
    "short": 4,
    "long": 5,
    "double": 6,
    "list": 7,
    "class": 8,
    "password": 9,
}


class _MutationQuota:
    """A CreateTopics / CreatePartitions / DeleteTopics request's controller_mutation_rate
    client. Kafka enforces that quota at the active controller, for the whole cluster
    (ControllerApis charges the forwarded request's principal and client id: see
    straitmq.controller.mutation_quotas), so each topic's change names the client to the
    controller, which answers its throttle, or THROTTLING_QUOTA_EXCEEDED for a topic of a
    strict request (`strict`: CreateTopics v6+, DeleteTopics v5+, CreatePartitions v3+)
    once the allowance is spent. The request's throttle is the last one the controller
    gave (AbstractControllerMutationQuota.throttleTime); the listener mutes the
    connection that long (RequestHandlerHelper.sendForwardedResponse). The topics go to
    the controller one after the other, in the request's order, as Kafka's controller
    takes them."""

    __slots__ = ("at", "client", "last_ms")

    def __init__(self, client: dict) -> None:
        self.client = client
        self.last_ms = 0
        self.at = 0.0

    @property
    def throttle_ms(self) -> int:
        """The last throttle less the time since it was given (throttleTime)."""
        if not self.last_ms:
            return 0
        return max(0, self.last_ms - round((time.monotonic() - self.at) * 1000.0))

    def answered(self, reply: Any, res: dict) -> bool:
        """The controller's answer to one topic's change: True if it refused it (the
        topic's error is set)."""
        if not isinstance(reply, dict):
            return False
        if reply.get("throttle_ms"):
            self.last_ms, self.at = int(reply["throttle_ms"]), time.monotonic()
        if reply.get("error_code"):
            res["error_code"] = reply["error_code"]
            res["error_message"] = reply.get("message")
            return True
        return False


def _mutation_quota(deps: AdminDeps, ctx: RequestContext, strict: bool) -> _MutationQuota | None:
    """The request's client for the controller's controller_mutation_rate accounting, or
    None where the listener looked no quota up (no quota in the cluster, the exempt
    inter-broker listener, an in-process caller) or no controller_mutation_rate is set."""
    if ctx.quotas is None or ctx.security is None:
        return None
    quotas = deps.metadata.image.client_quotas.values()
    if not any(CONTROLLER_MUTATION_RATE in q for q in quotas):
        return None
    user = user_of(ctx.security.principal)
    return _MutationQuota({"user": user, "client_id": ctx.client_id or "", "strict": strict})


async def _mutate(
    deps: AdminDeps, quota: _MutationQuota | None, op: str, body: dict, res: dict
) -> bool:
    """One topic's change at the controller, naming the quota's client when one is
    charged; True if the controller refused it for the quota (`res` says so)."""
    if quota is None:
        await deps.control(op, body)
        return False
    return quota.answered(await deps.control(op, {**body, "client": quota.client}), res)


async def _in_order(pending: list, quota: _MutationQuota | None) -> None:
    """The topics' changes: all at once (they commit together), or one after the other
    when a quota is charged (the controller judges them in the request's order)."""
    if quota is None:
        await asyncio.gather(*pending)
        return
    for change in pending:
        await change


async def handle_create_topics(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    results = []
    seen: set[str] = set()
    quota = None if req.validate_only else _mutation_quota(deps, ctx, ctx.version >= 6)

    async def create(t: Any, res: dict) -> None:
        try:
            assignments = None
            if t.assignments:
                ordered = sorted(t.assignments, key=lambda a: a.partition_index)
                if [a.partition_index for a in ordered] != list(range(len(ordered))):
                    raise KafkaError(
                        ErrorCode.invalid_replica_assignment,
                        "assignments must cover partitions 0..n-1",
                    )
                assignments = [list(a.broker_ids) for a in ordered]
                partitions = len(assignments)
                rf = len(assignments[0])
            else:
                partitions = (
                    t.num_partitions if t.num_partitions != -1 else deps.config.num_partitions
                )
                rf = (
                    t.replication_factor
                    if t.replication_factor != -1
                    else deps.config.default_replication_factor
                )
            configs = {c.name: c.value for c in t.configs}
            body = {
                "name": t.name,
                "partitions": partitions,
                "replication_factor": rf,
                "configs": configs,
                "assignments": assignments,
                "validate_only": req.validate_only,
            }
            if await _mutate(deps, quota, "create_topic", body, res):
                return
            res["num_partitions"] = partitions
            res["replication_factor"] = rf
            topic = deps.metadata.image.topics.get(t.name)
            if topic is not None:
                res["topic_id"] = topic.topic_id
            res["configs"] = [
                {
                    "name": k,
                    "value": v,
                    "read_only": False,
                    "config_source": SOURCE_DEFAULT,
                    "is_sensitive": False,
                }
                for k, v in effective({**deps.topic_defaults, **configs}).items()
            ]
        except KafkaError as e:
            res["error_code"] = e.code
            res["error_message"] = e.message

    # Every topic's change goes to the controller at once: they commit together.
    pending = []
    for t in req.topics:
        res = {
            "name": t.name,
            "topic_id": None,
            "error_code": 0,
            "error_message": None,
            "num_partitions": -1,
            "replication_factor": -1,
            "configs": [],
        }
        results.append(res)
        if t.name in seen:
            res["error_code"] = ErrorCode.invalid_request
            res["error_message"] = f"topic '{t.name}' appears twice"
            continue
        seen.add(t.name)
        # Kafka: CREATE on the cluster, or on the topic (a literal or prefixed binding).
        if not ctx.cluster_allowed(CREATE) and not ctx.allowed(CREATE, TOPIC, t.name):
            res["error_code"] = ErrorCode.topic_authorization_failed
            res["error_message"] = "Authorization failed."
            continue
        pending.append(create(t, res))
    await _in_order(pending, quota)
    return {"throttle_time": quota.throttle_ms if quota else 0, "topics": results}


async def handle_delete_topics(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    names = list(req.topic_names) if hasattr(req, "topic_names") else [t.name for t in req.topics]
    responses = []

    async def delete(name: str, res: dict) -> None:
        try:
            if name.startswith("__"):
                raise KafkaError(
                    ErrorCode.invalid_request, f"internal topic '{name}' cannot be deleted"
                )
            await _mutate(deps, quota, "delete_topic", {"name": name}, res)
        except KafkaError as e:
            res["error_code"] = e.code
            res["error_message"] = e.message

    pending = []
    quota = _mutation_quota(deps, ctx, ctx.version >= 5)
    for name in names:
        res = {"name": name, "error_code": 0, "error_message": None}
        responses.append(res)
        if not ctx.allowed(ACL_DELETE, TOPIC, name):
            res["error_code"] = ErrorCode.topic_authorization_failed
            res["error_message"] = "Authorization failed."
            continue
        pending.append(delete(name, res))
    await _in_order(pending, quota)
    return {"throttle_time": quota.throttle_ms if quota else 0, "responses": responses}


async def handle_create_partitions(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    results = []

    async def grow(t: Any, res: dict) -> None:
        try:
            assignments = [list(a.broker_ids) for a in t.assignments] if t.assignments else None
            body = {
                "name": t.name,
                "count": t.count,
                "assignments": assignments,
                "validate_only": req.validate_only,
            }
            await _mutate(deps, quota, "create_partitions", body, res)
        except KafkaError as e:
            res["error_code"] = e.code
            res["error_message"] = e.message

    pending = []
    quota = None if req.validate_only else _mutation_quota(deps, ctx, ctx.version >= 3)
    for t in req.topics:
        res = {"name": t.name, "error_code": 0, "error_message": None}
        results.append(res)
        if not ctx.allowed(ALTER, TOPIC, t.name):
            res["error_code"] = ErrorCode.topic_authorization_failed
            res["error_message"] = "Authorization failed."
            continue
        pending.append(grow(t, res))
    await _in_order(pending, quota)
    return {"throttle_time": quota.throttle_ms if quota else 0, "results": results}


def _config_entries(
    values: dict[str, str], explicit: set[str], keys: Any, source_explicit: int, docs: bool
) -> list[dict]:
    out = []
    for name, value in sorted(values.items()):
        if keys and name not in keys:
            continue
        d = TOPIC_CONFIGS.get(name)
        out.append(
            {
                "name": name,
                "value": value,
                "read_only": False,
                "config_source": source_explicit if name in explicit else SOURCE_DEFAULT,
                "is_default": name not in explicit,
                "is_sensitive": False,
                "synonyms": [],
                "config_type": _TYPE_CODES.get(d.type, 0) if d else 2,
                "documentation": (d.doc if d else None) if docs else None,
            }
        )
    return out


async def handle_describe_configs(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    results = []
    docs = getattr(req, "include_documentation", False)
    for r in req.resources:
        res = {
            "error_code": 0,
            "error_message": None,
            "resource_type": r.resource_type,
            "resource_name": r.resource_name,
            "configs": [],
        }
        keys = set(r.configuration_keys) if r.configuration_keys else None
        if denied := _config_denied(ctx, r.resource_type, r.resource_name, DESCRIBE_CONFIGS):
            res["error_code"] = denied
            res["error_message"] = "Authorization failed."
        elif r.resource_type == TOPIC_RESOURCE:
            topic = deps.metadata.image.topics.get(r.resource_name)
            if topic is None:
                res["error_code"] = ErrorCode.unknown_topic_or_partition
                res["error_message"] = f"topic '{r.resource_name}' does not exist"
            else:
                values = effective({**deps.topic_defaults, **topic.configs})
                res["configs"] = _config_entries(
                    values, set(topic.configs), keys, SOURCE_TOPIC, docs
                )
        elif r.resource_type == group_configs.GROUP_RESOURCE:
            res["configs"] = group_configs.describe_entries(
                deps.metadata.image, r.resource_name, keys, docs
            )
        elif r.resource_type == BROKER_RESOURCE:
            if r.resource_name not in ("", str(deps.config.node_id)):
                res["error_code"] = ErrorCode.invalid_request
                res["error_message"] = f"broker '{r.resource_name}' is not this broker"
            else:
                res["configs"] = _broker_entries(deps, r.resource_name, keys, docs)
                res["configs"] += _throttle_entries(deps, r.resource_name, keys)
        else:
            res["error_code"] = ErrorCode.invalid_request
            res["error_message"] = f"resource type {r.resource_type} is not supported"
        results.append(res)
    return {"throttle_time": 0, "results": results}


SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


CLIENT_METRICS_RESOURCE = 16
# What ListConfigResources v1 lists when asked for no type in particular (Kafka's
# default set minus BROKER_LOGGER, which has no configs here).
LISTED_RESOURCE_TYPES = (
    TOPIC_RESOURCE,
    BROKER_RESOURCE,
    CLIENT_METRICS_RESOURCE,
    group_configs.GROUP_RESOURCE,
)


async def handle_list_config_resources(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    """ListConfigResources (KIP-1142; v0 was ListClientMetricsResources): the resources
    that have configs, those the principal may describe. Client metrics subscriptions
    (KIP-714) are not supported, so there are none to list; a type this broker has no
    configs for is refused at once (INVALID_REQUEST), not answered as empty."""
    if ctx.version >= 1:
        wanted = tuple(req.resource_types) or LISTED_RESOURCE_TYPES
    else:
        wanted = (CLIENT_METRICS_RESOURCE,)
    if not set(wanted) <= set(LISTED_RESOURCE_TYPES):
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_request, "config_resources": []}
    image = deps.metadata.image

    def names(rtype: int) -> list[str]:  # only the types asked for are listed
        if rtype == TOPIC_RESOURCE:
            return sorted(image.topics)
        if rtype == BROKER_RESOURCE:
            return [str(b) for b in sorted(image.brokers)]
        if rtype == group_configs.GROUP_RESOURCE:
            return sorted(group_configs.configured_groups(image))
        return []  # CLIENT_METRICS: none

    listed = [
        {"resource_name": name, "resource_type": rtype}
        for rtype in wanted
        for name in names(rtype)
        if not _config_denied(ctx, rtype, name, DESCRIBE_CONFIGS)
    ]
    return {"throttle_time": 0, "error_code": 0, "config_resources": listed}


def _config_denied(ctx: RequestContext, rtype: int, name: str, operation: int) -> int:
    """Kafka: a topic's configs need the operation on the topic, a broker's on the
    cluster; 0 when allowed."""
    if rtype == TOPIC_RESOURCE:
        return 0 if ctx.allowed(operation, TOPIC, name) else ErrorCode.topic_authorization_failed
    if rtype == BROKER_RESOURCE:
        return 0 if ctx.cluster_allowed(operation) else ErrorCode.cluster_authorization_failed
    if rtype == group_configs.GROUP_RESOURCE:
        return 0 if ctx.allowed(operation, GROUP, name) else ErrorCode.group_authorization_failed
    return 0


async def handle_incremental_alter_configs(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    responses = []
    for r in req.resources:
        res = {
            "error_code": 0,
            "error_message": None,
            "resource_type": r.resource_type,
            "resource_name": r.resource_name,
        }
        responses.append(res)
        if denied := _config_denied(ctx, r.resource_type, r.resource_name, ALTER_CONFIGS):
            res["error_code"] = denied
            res["error_message"] = "Authorization failed."
            continue
        if r.resource_type == BROKER_RESOURCE:
            await _alter_broker_configs(deps, r, req.validate_only, res)
            continue
        if r.resource_type == group_configs.GROUP_RESOURCE:  # share.auto.offset.reset
            await group_configs.alter(
                deps.metadata, r.resource_name, r.configs, req.validate_only, res
            )
            continue
        if r.resource_type == CLIENT_METRICS_RESOURCE:
            res["error_code"] = ErrorCode.invalid_request
            res["error_message"] = "client metrics subscriptions (KIP-714) are not supported"
            continue
        if r.resource_type != TOPIC_RESOURCE:
            res["error_code"] = ErrorCode.invalid_request
            res["error_message"] = "only topic, broker and group configs can be altered"
            continue
        changes: dict[str, str | None] = {}
        try:
            for c in r.configs:
                if c.config_operation == SET:
                    changes[c.name] = c.value
                elif c.config_operation == DELETE:
                    changes[c.name] = None
                else:
                    changes[c.name] = _list_operation(deps, r.resource_name, c, changes)
            problem = topic_name_problem(r.resource_name)
            if problem is not None:
                raise KafkaError(ErrorCode.invalid_topic_exception, problem)
            await deps.control(
                "alter_configs",
                {"name": r.resource_name, "changes": changes, "validate_only": req.validate_only},
            )
        except KafkaError as e:
            res["error_code"] = e.code
            res["error_message"] = e.message
    return {"throttle_time": 0, "responses": responses}


def _list_operation(deps: AdminDeps, topic_name: str, c: Any, changes: dict) -> str:
    """APPEND or SUBTRACT on a LIST topic config (`cleanup.policy`): the entries added to
    or taken from its current value (this request's earlier change, the topic's own
    value, or the default), as Kafka's controller applies them."""
    if c.config_operation not in (APPEND, SUBTRACT):
        raise KafkaError(
            ErrorCode.invalid_request, f"{c.name}: unknown operation {c.config_operation}"
        )
    d = TOPIC_CONFIGS.get(c.name)
    if d is None or d.type != "list":
        raise KafkaError(
            ErrorCode.invalid_config, f"{c.name}: APPEND/SUBTRACT apply to list configs only"
        )
    topic = deps.metadata.image.topics.get(topic_name)
    if topic is None:
        raise KafkaError(
            ErrorCode.unknown_topic_or_partition, f"topic '{topic_name}' does not exist"
        )
    current = changes.get(c.name)
    if current is None:
        current = effective({**deps.topic_defaults, **topic.configs})[c.name]
    items = list_items(current)
    given = list_items(c.value or "")
    if c.config_operation == APPEND:
        items += [i for i in given if i not in items]
    else:
        items = [i for i in items if i not in given]
    return ",".join(items)


# Kafka's per-broker reassignment throttles; StraitMQ has one cluster-wide rate.
BROKER_THROTTLES = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")


def _throttle_entries(deps: AdminDeps, resource_name: str, keys: Any) -> list[dict]:
    """The cluster's replication throttle, shown as the broker-level keys that set it, as
    dynamic configs: `kafka-configs --delete-config` only deletes keys it sees there."""
    rate = deps.metadata.image.cluster_configs.get("replication.throttled.rate", "-1")
    if rate == "-1":
        return []
    source = SOURCE_DYNAMIC_BROKER if resource_name else SOURCE_DYNAMIC_DEFAULT_BROKER
    return [
        {
            "name": name,
            "value": rate,
            "read_only": False,
            "config_source": source,
            "is_default": False,
            "is_sensitive": False,
            "synonyms": [],
            "config_type": _TYPE_CODES["long"],
            "documentation": None,
        }
        for name in BROKER_THROTTLES
        if not keys or name in keys
    ]


def _broker_entries(deps: AdminDeps, resource_name: str, keys: Any, docs: bool) -> list[dict]:
    """This broker's configs: the static settings, and the runtime-changeable ones with
    the cluster's dynamic value where one is set (shown as a dynamic config of the broker
    asked about, or of the cluster default for resource "", as Kafka shows them: what
    `kafka-configs --describe` lists and `--delete-config` checks)."""
    static = deps.config.describe()
    dynamic = deps.metadata.image.cluster_configs
    dynamic_source = SOURCE_DYNAMIC_BROKER if resource_name else SOURCE_DYNAMIC_DEFAULT_BROKER
    out = []
    for name in sorted(set(static) | set(DYNAMIC_BROKER_CONFIGS)):
        if keys and name not in keys:
            continue
        d = DYNAMIC_BROKER_CONFIGS.get(name) or TOPIC_CONFIGS.get(name)
        if name in DYNAMIC_BROKER_CONFIGS and name in dynamic:
            value, source = dynamic[name], dynamic_source
        elif name in static:
            value, source = static[name], SOURCE_STATIC_BROKER
        else:  # runtime-changeable, no static setting here: Kafka's default
            value, source = DYNAMIC_BROKER_CONFIGS[name].default, SOURCE_DEFAULT
        out.append(
            {
                "name": name,
                "value": value,
                "read_only": name not in DYNAMIC_BROKER_CONFIGS,
                "config_source": source,
                "is_default": source == SOURCE_DEFAULT,
                "is_sensitive": False,
                "synonyms": [],
                "config_type": _TYPE_CODES.get(d.type, 0) if d else 2,
                "documentation": (d.doc if d else None) if docs else None,
            }
        )
    return out


RUNTIME_BROKER_CONFIGS = (*BROKER_THROTTLES, *DYNAMIC_BROKER_CONFIGS)


async def _alter_broker_configs(deps: AdminDeps, r: Any, validate_only: bool, res: dict) -> None:
    """The broker configs Kafka changes at runtime that matter here (the log cleaner's,
    the compaction topic defaults, the reassignment quotas), checked as Kafka checks them
    and stored cluster-wide: a broker id and the cluster default ("") set the same value,
    for every broker. A broker's leader/follower replication throttle (what
    `kafka-reassign-partitions --throttle` sets and `--verify` clears) becomes the
    cluster's one replication throttle, `replication.throttled.rate`. Every other broker
    config is static."""
    changes: dict[str, str | None] = {}
    try:
        if r.resource_name and not r.resource_name.isdigit():
            raise KafkaError(ErrorCode.invalid_request, f"'{r.resource_name}' is no broker id")
        if r.resource_name and int(r.resource_name) not in deps.metadata.image.brokers:
            raise KafkaError(ErrorCode.invalid_request, f"no broker {r.resource_name}")
        for c in r.configs:
            if c.config_operation not in (SET, DELETE):
                raise KafkaError(ErrorCode.invalid_config, f"{c.name}: SET or DELETE only")
            value = c.value if c.config_operation == SET else None
            if c.name in BROKER_THROTTLES:
                if c.config_operation == SET and (value is None or not value.isdigit()):
                    raise KafkaError(ErrorCode.invalid_config, f"{c.name} must be bytes per second")
                changes["replication.throttled.rate"] = value
            elif c.name in DYNAMIC_BROKER_CONFIGS:
                if c.config_operation == SET:
                    problem = check_broker_config(c.name, value or "")
                    if problem:
                        raise KafkaError(ErrorCode.invalid_config, problem)
                changes[c.name] = value
            else:
                raise KafkaError(
                    ErrorCode.invalid_config,
                    f"broker config {c.name} cannot be altered at runtime; these can: "
                    f"{', '.join(RUNTIME_BROKER_CONFIGS)} (the leader/follower throttles set "
                    "the cluster-wide replication.throttled.rate)",
                )
        current = effective_values(deps.config, deps.metadata.image.cluster_configs)
        static = static_values(deps.config)
        after = dict(current)
        for name, value in changes.items():
            if name in DYNAMIC_BROKER_CONFIGS:
                after[name] = static[name] if value is None else value
        if problem := check_together(current, after):
            raise KafkaError(ErrorCode.invalid_config, problem)
        if not validate_only and changes:
            await deps.control("alter_cluster_configs", {"changes": changes})
    except KafkaError as e:
        res["error_code"] = e.code
        res["error_message"] = e.message


async def handle_init_producer_id(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    """An idempotent producer's id (a transactional one's: api/transactions.py)."""
    # Kafka 3+: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic (KIP-679).
    if not ctx.cluster_allowed(IDEMPOTENT_WRITE) and not _writes_some_topic(ctx):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "producer_id": -1,
            "producer_epoch": -1,
        }
    try:
        pid = await deps.next_producer_id()
    except KafkaError as e:
        return {"throttle_time": 0, "error_code": e.code, "producer_id": -1, "producer_epoch": -1}
    return {"throttle_time": 0, "error_code": 0, "producer_id": pid, "producer_epoch": 0}


def _writes_some_topic(ctx: RequestContext) -> bool:
    a, sec = ctx.authorizer, ctx.security
    return sec is None or a is None or a.authorize_any_topic(sec.principal, ctx.acl_host, WRITE)


async def handle_describe_log_dirs(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    """DescribeLogDirs (`kafka-log-dirs --describe`): this broker's one log directory,
    the size of each replica it holds and how far its log end is behind the high
    watermark; v4 adds the volume's total and usable bytes."""
    if not ctx.cluster_allowed(DESCRIBE):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "results": [],
        }
    pm = deps.partitions
    wanted = None if req.topics is None else {t.topic: set(t.partitions) for t in req.topics}
    topics: dict[str, list[dict]] = {}
    for (name, index), p in sorted(pm.partitions.items()):
        if wanted is not None and index not in wanted.get(name, ()):
            continue
        topics.setdefault(name, []).append(
            {
                "partition_index": index,
                "partition_size": p.log.size_bytes,
                "offset_lag": max(0, p.high_watermark - p.log.log_end_offset),
                "is_future_key": False,
            }
        )
    result: dict[str, Any] = {
        "error_code": 0,
        "log_dir": os.path.abspath(pm.data_dir),
        "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()],
    }
    try:
        st = os.statvfs(pm.data_dir)
        result["total_bytes"] = st.f_blocks * st.f_frsize
        result["usable_bytes"] = st.f_bavail * st.f_frsize
    except OSError as e:  # the directory is gone or unreadable: say so for this dir
        result["error_code"] = ErrorCode.kafka_storage_error
        log.warning("describe log dirs: %s", e)
    return {"throttle_time": 0, "error_code": 0, "results": [result]}
