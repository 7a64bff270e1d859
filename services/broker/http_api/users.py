"""SCRAM users and ACL bindings over HTTP: what AlterUserScramCredentials,
DescribeUserScramCredentials, CreateAcls, DescribeAcls and DeleteAcls do on the Kafka
listener, for clients that speak HTTP (the operator's `User` resources).

- `GET /api/v1/users`, `GET /api/v1/users/{name}`: the users' mechanisms and iterations
  (never a salt or key).
- `PUT /api/v1/users/{name}` `{"mechanism": "SCRAM-SHA-512", "password": "...",
  "iterations": 4096}`: the broker salts the password (a new random salt each time) and
  the controller keeps StoredKey and ServerKey, as AlterUserScramCredentials; the
  password itself is never stored or logged. Other mechanisms of the user stay.
- `DELETE /api/v1/users/{name}[?mechanism=SCRAM-SHA-256]`: one mechanism, or all of them.
- `GET /api/v1/acls[?principal=User:x]`: the bindings, by name.
- `POST /api/v1/acls` `{"create": [binding, ...], "delete": [binding, ...]}`: one metadata
  change. A binding is `{"resource_type": "TOPIC", "resource_name": "orders",
  "pattern_type": "LITERAL", "principal": "User:app", "host": "*", "operation": "WRITE",
  "permission": "ALLOW"}`. Any binding Kafka would refuse (or an operation the resource
  type has no use for, e.g. READ on the cluster) refuses the whole request with a 400
  that names it; deleting a binding that does not exist is not an error.

- `GET /api/v1/quotas[?user=alice][&client-id=app]`: client quotas, every entity that
  names the given user / client id (`<default>` for the default), as DescribeClientQuotas.
- `POST /api/v1/quotas` `{"entries": [{"entity": {"user": "alice"}, "quotas":
  {"producer_byte_rate": 1048576, "consumer_byte_rate": null}}], "validate_only": false}`:
  as AlterClientQuotas (null removes a key); an invalid entry (unknown key, a value that
  is not a non-negative number) refuses the whole request with a 400 that says why.

As in Kafka, changing users or ACLs needs ALTER on the cluster and reading them DESCRIBE;
quotas ALTER_CONFIGS and DESCRIBE_CONFIGS (straitmq/security/http_security.py).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from kio.schema.errors import ErrorCode
from straitmq.metadata.quotas import QuotaError, check_entity, check_ops, matches

from straitmq.errors import KafkaError
from straitmq.security.acls import ALL, SUPPORTED_OPERATIONS, AclBinding, validate_binding
from straitmq.security.scram import MAX_ITERATIONS, MECHANISMS, MIN_ITERATIONS, credential_record
from straitmq.security.scram import salted_password as salt_password

from ..metadata_view import MetadataView
from .common import _body, _controller_error, _error, _json


@dataclass(frozen=True, slots=True)
class UsersDeps:
    metadata: MetadataView


RESOURCE_TYPES = {"TOPIC": 2, "GROUP": 3, "CLUSTER": 4, "TRANSACTIONAL_ID": 5}
PATTERN_TYPES = {"LITERAL": 3, "PREFIXED": 4}
OPERATIONS = {
    "ALL": 2,
    "READ": 3,
    "WRITE": 4,
    "CREATE": 5,
    "DELETE": 6,
    "ALTER": 7,
    "DESCRIBE": 8,
    "CLUSTER_ACTION": 9,
    "DESCRIBE_CONFIGS": 10,
    "ALTER_CONFIGS": 11,
    "IDEMPOTENT_WRITE": 12,
}
PERMISSIONS = {"DENY": 2, "ALLOW": 3}
_NAMES = {
    "resource_type": {v: k for k, v in RESOURCE_TYPES.items()},
    "pattern_type": {v: k for k, v in PATTERN_TYPES.items()},
    "operation": {v: k for k, v in OPERATIONS.items()},
    "permission": {v: k for k, v in PERMISSIONS.items()},
}
DEFAULT_ITERATIONS = 4096


def binding_json(b: AclBinding) -> dict[str, Any]:
    out: dict[str, Any] = b.as_record()
    for key, names in _NAMES.items():
        out[key] = names.get(out[key], out[key])
    return out


def parse_binding(raw: Any) -> AclBinding | str:
    """The binding, or why it is refused (a sentence naming it)."""
    if not isinstance(raw, dict):
        return "each binding must be an object"
    codes: dict[str, int] = {}
    for key, table in (
        ("resource_type", RESOURCE_TYPES),
        ("pattern_type", PATTERN_TYPES),
        ("operation", OPERATIONS),
        ("permission", PERMISSIONS),
    ):
        value = raw.get(key, "LITERAL" if key == "pattern_type" else None)
        code = table.get(str(value).upper()) if value is not None else None
        if code is None:
            return f"{key} {value!r} is not one of {', '.join(table)}"
        codes[key] = code
    name, principal, host = raw.get("resource_name"), raw.get("principal"), raw.get("host", "*")
    if not (isinstance(name, str) and isinstance(principal, str) and isinstance(host, str)):
        return "resource_name, principal and host must be strings"
    b = AclBinding(
        codes["resource_type"],
        name,
        codes["pattern_type"],
        principal,
        host,
        codes["operation"],
        codes["permission"],
    )
    why = validate_binding(b)
    if (
        why is None
        and b.operation != ALL
        and b.operation not in SUPPORTED_OPERATIONS.get(b.resource_type, ())
    ):
        rtype = _NAMES["resource_type"][b.resource_type]
        allowed = ", ".join(_NAMES["operation"][o] for o in SUPPORTED_OPERATIONS[b.resource_type])
        why = (
            f"operation {_NAMES['operation'][b.operation]} does not apply to a {rtype} "
            f"resource (it takes ALL, {allowed})"
        )
    if why is not None:
        return f"{why}: {binding_json(b)}"
    return b


def _user_view(name: str, creds: dict[str, dict]) -> dict[str, Any]:
    return {
        "name": name,
        "mechanisms": [
            {"mechanism": m, "iterations": c["iterations"]} for m, c in sorted(creds.items())
        ],
    }


class _UsersRoutes:
    """/api/v1/users[/{name}], /api/v1/acls"""

    def __init__(self, deps: UsersDeps) -> None:
        self.deps = deps

    async def list_users(self, request: web.Request) -> web.Response:
        creds = self.deps.metadata.image.scram_credentials
        return _json({"users": [_user_view(u, c) for u, c in sorted(creds.items()) if c]})

    async def describe_user(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        creds = self.deps.metadata.image.scram_credentials.get(name)
        if not creds:
            return _error(
                404, f"user {name!r} has no SCRAM credential", ErrorCode.resource_not_found
            )
        return _json(_user_view(name, creds))

    async def upsert_user(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await _body(request)
        mechanism = body.get("mechanism")
        password = body.get("password")
        iterations = body.get("iterations", DEFAULT_ITERATIONS)
        if mechanism not in MECHANISMS:
            return _error(
                400,
                f"'mechanism' must be one of {', '.join(MECHANISMS)}",
                ErrorCode.unsupported_sasl_mechanism,
            )
        if not isinstance(password, str) or not password:
            return _error(
                400,
                "'password' (a non-empty string) is required",
                ErrorCode.unacceptable_credential,
            )
        if not isinstance(iterations, int) or not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            return _error(
                400,
                f"'iterations' must be {MIN_ITERATIONS}..{MAX_ITERATIONS}",
                ErrorCode.unacceptable_credential,
            )
        salt = secrets.token_bytes(32)
        salted = salt_password(mechanism, password, salt, iterations)
        record = credential_record(name, mechanism, salt, iterations, salted)
        try:
            await self.deps.metadata.control("alter_scram_credentials", {"upsertions": [record]})
        except KafkaError as e:
            return _controller_error(e)
        return _json(_user_view(name, self.deps.metadata.image.scram_credentials.get(name, {})))

    async def delete_user(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        have = self.deps.metadata.image.scram_credentials.get(name) or {}
        asked = request.query.get("mechanism")
        if asked is not None and asked not in MECHANISMS:
            return _error(
                400,
                f"'mechanism' must be one of {', '.join(MECHANISMS)}",
                ErrorCode.unsupported_sasl_mechanism,
            )
        doomed = [m for m in have if asked is None or m == asked]
        if not doomed:
            return _error(
                404, f"user {name!r} has no such SCRAM credential", ErrorCode.resource_not_found
            )
        deletions = [{"name": name, "mechanism": m} for m in doomed]
        try:
            await self.deps.metadata.control("alter_scram_credentials", {"deletions": deletions})
        except KafkaError as e:
            return _controller_error(e)
        return _json({"deleted": name, "mechanisms": sorted(doomed)})

    async def list_acls(self, request: web.Request) -> web.Response:
        principal = request.query.get("principal")
        bindings = [AclBinding(*t) for t in self.deps.metadata.image.acls]
        return _json(
            {
                "acls": [
                    binding_json(b)
                    for b in bindings
                    if principal is None or b.principal == principal
                ]
            }
        )

    async def alter_acls(self, request: web.Request) -> web.Response:
        body = await _body(request)
        parsed: dict[str, list[list]] = {"create": [], "delete": []}
        for key in parsed:
            raw = body.get(key, [])
            if not isinstance(raw, list):
                return _error(400, f"'{key}' must be a list of bindings")
            for item in raw:
                b = parse_binding(item)
                if isinstance(b, str):
                    return _error(400, b, ErrorCode.invalid_request)
                parsed[key].append(list(b))
        created = sum(1 for b in parsed["create"] if tuple(b) not in self.deps.metadata.image.acls)
        deleted = sum(1 for b in parsed["delete"] if tuple(b) in self.deps.metadata.image.acls)
        if parsed["create"] or parsed["delete"]:  # the controller skips what is done
            try:
                await self.deps.metadata.control(
                    "alter_acls", {"creations": parsed["create"], "deletions": parsed["delete"]}
                )
            except KafkaError as e:
                return _controller_error(e)
        return _json({"created": created, "deleted": deleted})

    async def list_quotas(self, request: web.Request) -> web.Response:
        exact = {
            kind: None if value == DEFAULT_ENTITY else value
            for kind in ("user", "client-id")
            if (value := request.query.get(kind)) is not None
        }
        return _json(
            {
                "quotas": [
                    {"entity": _entity_json(entity), "quotas": dict(values)}
                    for entity, values in self.deps.metadata.image.client_quotas.items()
                    if matches(entity, exact, set(), False)
                ]
            }
        )

    async def alter_quotas(self, request: web.Request) -> web.Response:
        body = await _body(request)
        raw = body.get("entries")
        if not isinstance(raw, list) or not raw:
            return _error(400, "'entries' must be a non-empty list", ErrorCode.invalid_request)
        entries = []
        for item in raw:
            try:
                if not isinstance(item, dict) or not isinstance(item.get("entity"), dict):
                    raise QuotaError("each entry needs an 'entity' object")
                if not isinstance(item.get("quotas"), dict):
                    raise QuotaError("each entry needs a 'quotas' object")
                pairs = [
                    (str(k), None if v in (None, DEFAULT_ENTITY) else str(v))
                    for k, v in item["entity"].items()
                ]
                entity = check_entity(pairs)
                ops = check_ops(item["quotas"], entity)
            except QuotaError as e:
                return _error(400, f"{item!r}: {e}", ErrorCode.invalid_request)
            entries.append({"entity": [list(p) for p in pairs], "ops": ops})
        try:
            reply = await self.deps.metadata.control(
                "alter_client_quotas",
                {"entries": entries, "validate_only": bool(body.get("validate_only"))},
            )
        except KafkaError as e:
            return _controller_error(e)
        if reply.get("errors"):
            i, why = next(iter(reply["errors"].items()))
            return _error(400, f"{raw[int(i)]!r}: {why}", ErrorCode.invalid_request)
        return _json({"altered": len(entries)})


def add_routes(app: web.Application, deps: UsersDeps) -> None:
    """/api/v1/users[/{name}], /api/v1/acls"""
    r = _UsersRoutes(deps)
    table = [
        web.get("/api/v1/users", r.list_users),
        web.get("/api/v1/users/{name}", r.describe_user),
        web.put("/api/v1/users/{name}", r.upsert_user),
        web.delete("/api/v1/users/{name}", r.delete_user),
        web.get("/api/v1/acls", r.list_acls),
        web.post("/api/v1/acls", r.alter_acls),
        web.get("/api/v1/quotas", r.list_quotas),
        web.post("/api/v1/quotas", r.alter_quotas),
    ]
    app.add_routes(table)


DEFAULT_ENTITY = "<default>"  # kafka-configs' name of a default entity


def _entity_json(entity: tuple) -> dict[str, str]:
    return {kind: DEFAULT_ENTITY if name is None else name for kind, name in entity}
