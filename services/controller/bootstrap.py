"""Records written once, when the cluster's metadata log is first created: Kafka's
`kafka-storage format --add-scram 'SCRAM-SHA-512=[name=broker,password=broker-secret]'`.

This is how the brokers' own SCRAM user exists before any broker could create it: with
replication on a SASL listener, nobody can log in until a user is there. The credential
is salted and hashed here; the password never reaches the metadata log. Give every
controller the same flags (as every `kafka-storage format` gets them): whichever becomes
the first active controller writes them, together with the cluster id, and never again.
"""

from __future__ import annotations

import re
import secrets

from straitmq.security.scram import (
    MAX_ITERATIONS,
    MECHANISMS,
    MIN_ITERATIONS,
    credential_record,
    salted_password,
)

_ADD_SCRAM = re.compile(r"^\s*(SCRAM-SHA-(?:256|512))\s*=\s*\[(.*)\]\s*$", re.IGNORECASE)
_FIELD = re.compile(r'\s*(\w+)\s*=\s*("(?:[^"\\]|\\.)*"|[^,]*)\s*(?:,|$)')


def parse_add_scram(value: str) -> dict:
    """`SCRAM-SHA-512=[name=alice,password=alice-secret(,iterations=8192)]` -> the
    user_scram_credential record (ValueError saying what is wrong)."""
    m = _ADD_SCRAM.match(value)
    if m is None:
        raise ValueError(
            f"--add-scram {value!r}: expected SCRAM-SHA-256=[name=...,password=...] or "
            "SCRAM-SHA-512=[...] (iterations=N optional)"
        )
    mechanism = m.group(1).upper()
    fields: dict[str, str] = {}
    body = m.group(2)
    pos = 0
    while pos < len(body):
        f = _FIELD.match(body, pos)
        if f is None or f.end() == pos:
            raise ValueError(f"--add-scram {value!r}: cannot read {body[pos:]!r}")
        raw = f.group(2)
        fields[f.group(1).lower()] = raw[1:-1].replace('\\"', '"') if raw[:1] == '"' else raw
        pos = f.end()
    name, password = fields.get("name"), fields.get("password")
    if not name or password is None:
        raise ValueError(f"--add-scram {value!r}: needs name= and password=")
    iterations = int(fields.get("iterations", MIN_ITERATIONS))
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(
            f"--add-scram {value!r}: iterations must be {MIN_ITERATIONS}-{MAX_ITERATIONS}"
        )
    assert mechanism in MECHANISMS
    salt = secrets.token_bytes(32)
    salted = salted_password(mechanism, password, salt, iterations)
    return {
        "type": "user_scram_credential",
        **credential_record(name, mechanism, salt, iterations, salted),
    }
