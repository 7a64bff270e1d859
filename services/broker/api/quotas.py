"""DescribeClientQuotas and AlterClientQuotas: client quotas kept as metadata records.

Alterations go to the active controller, which writes `client_quota` records; every
broker's image then holds them (straitmq.metadata.quotas has the rules, Kafka's). The
answer waits until this broker's image shows the change, so a describe right after an
alter sees it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode
from straitmq.metadata.quotas import (
    QuotaError,
    check_entity,
    check_ops,
    matches,
    parse_filter,
)

from straitmq.errors import KafkaError
from straitmq.security.acls import ALTER_CONFIGS, DESCRIBE_CONFIGS

from .context import RequestContext

if TYPE_CHECKING:
    from .deps import AdminDeps


async def handle_describe_client_quotas(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    if not ctx.cluster_allowed(DESCRIBE_CONFIGS):
        return _describe_error(
            ErrorCode.cluster_authorization_failed, "DESCRIBE_CONFIGS on the cluster is needed"
        )
    try:
        exact, specified = parse_filter(
            [(c.entity_type, c.match_type, c.match) for c in req.components]
        )
    except QuotaError as e:
        return _describe_error(ErrorCode.invalid_request, str(e))
    entries = [
        {
            "entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
            "values": [{"key": k, "value": v} for k, v in sorted(values.items())],
        }
        for entity, values in deps.metadata.image.client_quotas.items()
        if matches(entity, exact, specified, req.strict)
    ]
    return {"throttle_time": 0, "error_code": 0, "error_message": None, "entries": entries}


def _describe_error(code: int, message: str) -> dict:
    return {"throttle_time": 0, "error_code": code, "error_message": message, "entries": None}


async def handle_alter_client_quotas(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    results: list[dict] = []
    valid: list[dict] = []
    positions: list[int] = []  # result index of each valid entry
    allowed = ctx.cluster_allowed(ALTER_CONFIGS)
    for entry in req.entries:
        pairs = [(e.entity_type, e.entity_name) for e in entry.entity]
        res: dict = {
            "error_code": 0,
            "error_message": None,
            "entity": [{"entity_type": t, "entity_name": n} for t, n in pairs],
        }
        results.append(res)
        if not allowed:
            res["error_code"] = ErrorCode.cluster_authorization_failed
            res["error_message"] = "ALTER_CONFIGS on the cluster is needed"
            continue
        try:
            entity = check_entity(pairs)
            keys = [op.key for op in entry.ops]
            if len(set(keys)) != len(keys):
                raise QuotaError("a quota key may appear once per entity")
            ops = check_ops({op.key: None if op.remove else op.value for op in entry.ops}, entity)
        except QuotaError as e:
            res["error_code"] = ErrorCode.invalid_request
            res["error_message"] = str(e)
            continue
        valid.append({"entity": [list(p) for p in pairs], "ops": ops})
        positions.append(len(results) - 1)
    if valid:
        body = {"entries": valid, "validate_only": req.validate_only}
        try:
            reply = await deps.control("alter_client_quotas", body)
        except KafkaError as e:
            for i in positions:
                results[i]["error_code"], results[i]["error_message"] = e.code, e.message
        else:
            for i, why in reply.get("errors", {}).items():
                res = results[positions[int(i)]]
                res["error_code"], res["error_message"] = ErrorCode.invalid_request, why
    return {"throttle_time": 0, "entries": results}
