"""Topic administration, configs and producer ids, through the controller."""

from __future__ import annotations

from typing import Any

from kio.schema.errors import ErrorCode
from straitmq.controller.errors import ControllerError, check_topic_name
from straitmq.metadata.topic_config import TOPIC_CONFIGS, effective

from .context import RequestContext

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
SOURCE_DEFAULT = 5
SOURCE_TOPIC = 1
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


async def handle_create_topics(ctx: RequestContext, req: Any) -> dict:
    broker = ctx.broker
    results = []
    seen: set[str] = set()
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
        try:
            if t.name in seen:
                raise ControllerError(ErrorCode.invalid_request, f"topic '{t.name}' appears twice")
            seen.add(t.name)
            assignments = None
            if t.assignments:
                ordered = sorted(t.assignments, key=lambda a: a.partition_index)
                if [a.partition_index for a in ordered] != list(range(len(ordered))):
                    raise ControllerError(
                        ErrorCode.invalid_replica_assignment,
                        "assignments must cover partitions 0..n-1",
                    )
                assignments = [list(a.broker_ids) for a in ordered]
                partitions = len(assignments)
                rf = len(assignments[0])
            else:
                partitions = (
                    t.num_partitions if t.num_partitions != -1 else broker.config.num_partitions
                )
                rf = (
                    t.replication_factor
                    if t.replication_factor != -1
                    else broker.config.default_replication_factor
                )
            configs = {c.name: c.value for c in t.configs}
            await broker.control(
                "create_topic",
                {
                    "name": t.name,
                    "partitions": partitions,
                    "replication_factor": rf,
                    "configs": configs,
                    "assignments": assignments,
                    "validate_only": req.validate_only,
                },
            )
            res["num_partitions"] = partitions
            res["replication_factor"] = rf
            topic = broker.image.topics.get(t.name)
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
                for k, v in effective({**broker.topic_defaults, **configs}).items()
            ]
        except ControllerError as e:
            res["error_code"] = e.code
            res["error_message"] = e.message
    return {"throttle_time": 0, "topics": results}


async def handle_delete_topics(ctx: RequestContext, req: Any) -> dict:
    broker = ctx.broker
    names = list(req.topic_names) if hasattr(req, "topic_names") else [t.name for t in req.topics]
    responses = []
    for name in names:
        res = {"name": name, "error_code": 0, "error_message": None}
        try:
            if name.startswith("__"):
                raise ControllerError(
                    ErrorCode.invalid_request, f"internal topic '{name}' cannot be deleted"
                )
            await broker.control("delete_topic", {"name": name})
        except ControllerError as e:
            res["error_code"] = e.code
            res["error_message"] = e.message
        responses.append(res)
    return {"throttle_time": 0, "responses": responses}


async def handle_create_partitions(ctx: RequestContext, req: Any) -> dict:
    results = []
    for t in req.topics:
        res = {"name": t.name, "error_code": 0, "error_message": None}
        try:
            assignments = [list(a.broker_ids) for a in t.assignments] if t.assignments else None
            await ctx.broker.control(
                "create_partitions",
                {
                    "name": t.name,
                    "count": t.count,
                    "assignments": assignments,
                    "validate_only": req.validate_only,
                },
            )
        except ControllerError as e:
            res["error_code"] = e.code
            res["error_message"] = e.message
        results.append(res)
    return {"throttle_time": 0, "results": results}


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


async def handle_describe_configs(ctx: RequestContext, req: Any) -> dict:
    broker = ctx.broker
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
        if r.resource_type == TOPIC_RESOURCE:
            topic = broker.image.topics.get(r.resource_name)
            if topic is None:
                res["error_code"] = ErrorCode.unknown_topic_or_partition
                res["error_message"] = f"topic '{r.resource_name}' does not exist"
            else:
                values = effective({**broker.topic_defaults, **topic.configs})
                res["configs"] = _config_entries(
                    values, set(topic.configs), keys, SOURCE_TOPIC, docs
                )
        elif r.resource_type == BROKER_RESOURCE:
            if r.resource_name not in ("", str(broker.config.node_id)):
                res["error_code"] = ErrorCode.invalid_request
                res["error_message"] = f"broker '{r.resource_name}' is not this broker"
            else:
                values = broker.config.describe()
                res["configs"] = _config_entries(
                    values, set(values), keys, SOURCE_STATIC_BROKER, docs
                )
        else:
            res["error_code"] = ErrorCode.invalid_request
            res["error_message"] = f"resource type {r.resource_type} is not supported"
        results.append(res)
    return {"throttle_time": 0, "results": results}


SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


async def handle_incremental_alter_configs(ctx: RequestContext, req: Any) -> dict:
    broker = ctx.broker
    responses = []
    for r in req.resources:
        res = {
            "error_code": 0,
            "error_message": None,
            "resource_type": r.resource_type,
            "resource_name": r.resource_name,
        }
        responses.append(res)
        if r.resource_type != TOPIC_RESOURCE:
            res["error_code"] = ErrorCode.invalid_request
            res["error_message"] = "only topic configs can be altered at runtime"
            continue
        changes: dict[str, str | None] = {}
        try:
            for c in r.configs:
                if c.config_operation == SET:
                    changes[c.name] = c.value
                elif c.config_operation == DELETE:
                    changes[c.name] = None
                else:
                    raise ControllerError(
                        ErrorCode.invalid_config,
                        f"{c.name}: APPEND/SUBTRACT apply to list configs only",
                    )
            check_topic_name(r.resource_name)
            await broker.control(
                "alter_configs",
                {"name": r.resource_name, "changes": changes, "validate_only": req.validate_only},
            )
        except ControllerError as e:
            res["error_code"] = e.code
            res["error_message"] = e.message
    return {"throttle_time": 0, "responses": responses}


async def handle_init_producer_id(ctx: RequestContext, req: Any) -> dict:
    if req.transactional_id is not None:
        # Transactions are not implemented (and not advertised); be explicit.
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.invalid_request,
            "producer_id": -1,
            "producer_epoch": -1,
        }
    try:
        pid = await ctx.broker.next_producer_id()
    except ControllerError as e:
        return {"throttle_time": 0, "error_code": e.code, "producer_id": -1, "producer_epoch": -1}
    return {"throttle_time": 0, "error_code": 0, "producer_id": pid, "producer_epoch": 0}
