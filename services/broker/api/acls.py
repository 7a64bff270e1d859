"""CreateAcls (30), DescribeAcls (29), DeleteAcls (31), as Kafka answers them.

Bindings are metadata records: creations and deletions go through the active controller
and are applied on every broker. Kafka checks ALTER on the cluster to create or delete
and DESCRIBE on the cluster to describe. A bad binding or filter is that entry's
INVALID_REQUEST with a message; the others in the request still apply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from straitmq.errors import KafkaError
from straitmq.security.acls import ALTER, DESCRIBE, AclBinding, AclFilter, validate_binding

from .context import RequestContext

if TYPE_CHECKING:
    from .deps import AdminDeps

_DENIED = "cluster authorization failed: ALTER on the cluster is needed to change ACLs"


def _binding(c: Any) -> AclBinding:
    return AclBinding(
        int(c.resource_type),
        c.resource_name,
        int(c.resource_pattern_type),
        c.principal,
        c.host,
        int(c.operation),
        int(c.permission_type),
    )


def _filter(f: Any) -> AclFilter:
    return AclFilter(
        int(f.resource_type_filter),
        f.resource_name_filter,
        int(f.pattern_type_filter),
        f.principal_filter,
        f.host_filter,
        int(f.operation),
        int(f.permission_type),
    )


def _bindings(deps: AdminDeps) -> list[AclBinding]:
    return [AclBinding(*t) for t in deps.metadata.image.acls]


async def handle_create_acls(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    if not ctx.cluster_allowed(ALTER):
        code, denied = ErrorCode.cluster_authorization_failed, _DENIED
        return {
            "throttle_time": 0,
            "results": [{"error_code": code, "error_message": denied} for _ in req.creations],
        }
    results: list[dict] = []
    valid: list[list] = []
    for c in req.creations:
        b = _binding(c)
        why = validate_binding(b)
        if why is None:
            valid.append(list(b))
            results.append({"error_code": 0, "error_message": None})
        else:
            results.append({"error_code": ErrorCode.invalid_request, "error_message": why})
    if valid:
        try:
            await deps.control("alter_acls", {"creations": valid})
        except KafkaError as e:
            for r in results:
                if not r["error_code"]:
                    r.update(error_code=e.code, error_message=e.message)
    return {"throttle_time": 0, "results": results}


async def handle_describe_acls(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    def answer(code: int, message: str | None, resources: list[dict]) -> dict:
        return {
            "throttle_time": 0,
            "error_code": code,
            "error_message": message,
            "resources": resources,
        }

    if not ctx.cluster_allowed(DESCRIBE):
        return answer(
            ErrorCode.cluster_authorization_failed,
            "DESCRIBE on the cluster is needed to describe ACLs",
            [],
        )
    flt = _filter(req)
    why = flt.invalid()
    if why is not None:
        return answer(ErrorCode.invalid_request, why, [])
    grouped: dict[tuple[int, str, int], list[dict]] = {}
    for b in _bindings(deps):
        if flt.matches(b):
            grouped.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(
                {
                    "principal": b.principal,
                    "host": b.host,
                    "operation": b.operation,
                    "permission_type": b.permission,
                }
            )
    return answer(
        0,
        None,
        [
            {"resource_type": rt, "resource_name": name, "pattern_type": pt, "acls": acls}
            for (rt, name, pt), acls in grouped.items()
        ],
    )


async def handle_delete_acls(deps: AdminDeps, ctx: RequestContext, req: Any) -> dict:
    if not ctx.cluster_allowed(ALTER):
        return {
            "throttle_time": 0,
            "filter_results": [
                {
                    "error_code": ErrorCode.cluster_authorization_failed,
                    "error_message": _DENIED,
                    "matching_acls": [],
                }
                for _ in req.filters
            ],
        }
    # Read barrier: match the filters against everything committed so far.
    await deps.metadata.catch_up()
    current = _bindings(deps)
    results: list[dict] = []
    doomed: dict[AclBinding, None] = {}
    for f in req.filters:
        flt = _filter(f)
        why = flt.invalid()
        if why is not None:
            results.append(
                {"error_code": ErrorCode.invalid_request, "error_message": why, "matching_acls": []}
            )
            continue
        matched = [b for b in current if flt.matches(b)]
        doomed.update(dict.fromkeys(matched))
        results.append(
            {
                "error_code": 0,
                "error_message": None,
                "matching_acls": [
                    {
                        "error_code": 0,
                        "error_message": None,
                        "resource_type": b.resource_type,
                        "resource_name": b.resource_name,
                        "pattern_type": b.pattern_type,
                        "principal": b.principal,
                        "host": b.host,
                        "operation": b.operation,
                        "permission_type": b.permission,
                    }
                    for b in matched
                ],
            }
        )
    if doomed:
        try:
            await deps.control("alter_acls", {"deletions": [list(b) for b in doomed]})
        except KafkaError as e:
            for r in results:
                if not r["error_code"]:
                    r.update(error_code=e.code, error_message=e.message, matching_acls=[])
    return {"throttle_time": 0, "filter_results": results}
