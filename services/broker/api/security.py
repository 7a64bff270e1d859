"""SASL and user-credential APIs: SaslHandshake, SaslAuthenticate,
DescribeUserScramCredentials and AlterUserScramCredentials (client quotas are in
quotas.py).

The exchange itself is services/broker/security/sasl.py; these only translate. An
answer that ends the connection (a failed authentication) sets `close_after_reply` on
the connection's security state: the client reads the error, then the socket closes.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from straitmq.errors import KafkaError
from straitmq.security.acls import ALTER, DESCRIBE
from straitmq.security.scram import (
    BY_ID,
    MAX_ITERATIONS,
    MECHANISMS,
    MIN_ITERATIONS,
    credential_record,
)

from .context import RequestContext

if TYPE_CHECKING:
    from .deps import AdminDeps

FAILED_AUTH_DELAY_S = 0.1


async def handle_sasl_handshake(ctx: RequestContext, req: Any) -> dict:
    sec = ctx.security
    if sec is None or sec.sasl is None:
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}
    outcome = sec.handshake(ctx.version, req.mechanism)
    sec.close_after_reply = outcome.close
    return {"error_code": outcome.error_code, "mechanisms": list(sec.sasl.mechanisms)}


async def handle_sasl_authenticate(ctx: RequestContext, req: Any) -> dict:
    sec = ctx.security
    if sec is None or sec.sasl is None:
        return {
            "error_code": ErrorCode.illegal_sasl_state,
            "error_message": "this listener does not use SASL",
            "auth_bytes": b"",
            "session_lifetime": 0,
        }
    outcome = sec.authenticate(bytes(req.auth_bytes))
    sec.close_after_reply = outcome.close
    if outcome.error_code == ErrorCode.sasl_authentication_failed:
        # Kafka's connection.failed.authentication.delay.ms: a password guesser gets
        # its answer late, other connections are served meanwhile.
        await asyncio.sleep(FAILED_AUTH_DELAY_S)
    return {
        "error_code": outcome.error_code,
        "error_message": outcome.message,
        "auth_bytes": outcome.auth_bytes,
        "session_lifetime": outcome.session_lifetime_ms,
    }


async def handle_describe_user_scram_credentials(
    deps: AdminDeps, ctx: RequestContext, req: Any
) -> dict:
    if not ctx.cluster_allowed(DESCRIBE):
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.cluster_authorization_failed,
            "error_message": "DESCRIBE on the cluster is needed",
            "results": [],
        }
    creds = deps.metadata.image.scram_credentials
    if req.users is None or len(req.users) == 0:
        names = sorted(creds)
        asked = False
    else:
        names = [u.name for u in req.users]
        asked = True
    results = []
    seen: set[str] = set()
    for name in names:
        if name in seen:
            results.append(
                _user_error(name, ErrorCode.duplicate_resource, f"user {name!r} is asked for twice")
            )
            continue
        seen.add(name)
        mine = creds.get(name)
        if not mine:
            if asked:
                why = f"attempt to describe a user credential that does not exist: {name}"
                results.append(_user_error(name, ErrorCode.resource_not_found, why))
            continue
        results.append(
            {
                "user": name,
                "error_code": 0,
                "error_message": None,
                "credential_infos": [
                    {"mechanism": MECHANISMS[m][1], "iterations": c["iterations"]}
                    for m, c in sorted(mine.items())
                ],
            }
        )
    return {"throttle_time": 0, "error_code": 0, "error_message": None, "results": results}


def _user_error(user: str, code: int, message: str) -> dict:
    return {"user": user, "error_code": code, "error_message": message, "credential_infos": []}


async def handle_alter_user_scram_credentials(
    deps: AdminDeps, ctx: RequestContext, req: Any
) -> dict:
    """The client sends SaltedPassword (the password never crosses the wire); the broker
    keeps only StoredKey and ServerKey, through the metadata log on every broker."""
    if not ctx.cluster_allowed(ALTER):
        names = dict.fromkeys(u.name for u in (*req.deletions, *req.upsertions))
        return {
            "throttle_time": 0,
            "results": [
                {
                    "user": n,
                    "error_code": ErrorCode.cluster_authorization_failed,
                    "error_message": "ALTER on the cluster is needed",
                }
                for n in names
            ],
        }
    errors: dict[str, tuple[int, str]] = {}
    users: list[str] = []
    for item in (*req.deletions, *req.upsertions):
        if item.name not in users:
            users.append(item.name)
    touched: dict[str, int] = {}
    for item in (*req.deletions, *req.upsertions):
        key = f"{item.name}\0{item.mechanism}"
        touched[key] = touched.get(key, 0) + 1
        if touched[key] > 1:
            errors.setdefault(
                item.name,
                (ErrorCode.duplicate_resource, "a user's mechanism may appear once per request"),
            )
    upsertions, deletions = [], []
    for d in req.deletions:
        if not d.name:
            errors.setdefault(d.name, (ErrorCode.unacceptable_credential, "empty user name"))
        elif d.mechanism not in BY_ID:
            errors.setdefault(
                d.name,
                (ErrorCode.unsupported_sasl_mechanism, f"unknown SCRAM mechanism id {d.mechanism}"),
            )
        else:
            deletions.append({"name": d.name, "mechanism": BY_ID[d.mechanism]})
    for u in req.upsertions:
        if not u.name:
            errors.setdefault(u.name, (ErrorCode.unacceptable_credential, "empty user name"))
        elif u.mechanism not in BY_ID:
            errors.setdefault(
                u.name,
                (ErrorCode.unsupported_sasl_mechanism, f"unknown SCRAM mechanism id {u.mechanism}"),
            )
        elif not MIN_ITERATIONS <= u.iterations <= MAX_ITERATIONS:
            errors.setdefault(
                u.name,
                (
                    ErrorCode.unacceptable_credential,
                    f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}, got {u.iterations}",
                ),
            )
        elif not u.salt or not u.salted_password:
            errors.setdefault(
                u.name,
                (ErrorCode.unacceptable_credential, "salt and salted password must not be empty"),
            )
        else:
            mech = BY_ID[u.mechanism]
            upsertions.append(
                credential_record(
                    u.name, mech, bytes(u.salt), u.iterations, bytes(u.salted_password)
                )
            )
    body = {
        "upsertions": [u for u in upsertions if u["name"] not in errors],
        "deletions": [d for d in deletions if d["name"] not in errors],
    }
    if body["upsertions"] or body["deletions"]:
        try:
            reply = await deps.control("alter_scram_credentials", body)
        except KafkaError as e:
            for name in users:
                errors.setdefault(name, (e.code, e.message))
        else:
            for name, why in reply.get("errors", {}).items():
                errors.setdefault(name, (ErrorCode.resource_not_found, why))
    return {
        "throttle_time": 0,
        "results": [
            {
                "user": name,
                "error_code": errors.get(name, (0, None))[0],
                "error_message": errors.get(name, (0, None))[1],
            }
            for name in users
        ],
    }
