"""SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677): the server side of the exchange
and the credential a user's password turns into.

A stored credential is (salt, iterations, StoredKey, ServerKey): enough to check a
client's proof and to prove the server knows it, never enough to log in as the user.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from straitmq.protocol.sasl_client import scram_keys

# name -> (hashlib name, Kafka's ScramMechanism id in AlterUserScramCredentials)
MECHANISMS: dict[str, tuple[str, int]] = {
    "SCRAM-SHA-256": ("sha256", 1),
    "SCRAM-SHA-512": ("sha512", 2),
}
BY_ID = {mid: name for name, (_, mid) in MECHANISMS.items()}
MIN_ITERATIONS = 4096  # Kafka's bounds
MAX_ITERATIONS = 16384


class ScramError(Exception):
    """The exchange failed; the message is what the client is told."""


def _h(mechanism: str) -> str:
    return MECHANISMS[mechanism][0]


def keys_from_salted_password(mechanism: str, salted: bytes) -> tuple[bytes, bytes]:
    """(StoredKey, ServerKey) from SaltedPassword = Hi(password, salt, i)."""
    _, stored_key, server_key = scram_keys(_h(mechanism), salted)
    return stored_key, server_key


def credential_record(
    user: str, mechanism: str, salt: bytes, iterations: int, salted: bytes
) -> dict:
    stored_key, server_key = keys_from_salted_password(mechanism, salted)
    return {
        "name": user,
        "mechanism": mechanism,
        "salt": base64.b64encode(salt).decode(),
        "iterations": iterations,
        "stored_key": base64.b64encode(stored_key).decode(),
        "server_key": base64.b64encode(server_key).decode(),
    }


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(_h(mechanism), password.encode(), salt, iterations)


def _attributes(message: str) -> list[tuple[str, str]]:
    out = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ScramError(f"malformed SCRAM message: attribute {part[:20]!r}")
        out.append((part[0], part[2:]))
    return out


def _saslname(value: str) -> str:
    if "=" in value.replace("=2C", "").replace("=3D", ""):
        raise ScramError("malformed SCRAM message: bad escape in the user name")
    return value.replace("=2C", ",").replace("=3D", "=")


@dataclass
class ScramServer:
    """One exchange: client-first -> server-first, client-final -> server-final."""

    mechanism: str
    lookup: Callable[[str, str], dict | None]  # (user, mechanism) -> stored credential
    user: str | None = None
    done: bool = False
    _gs2_header: str = ""
    _client_first_bare: str = ""
    _server_first: str = ""
    _nonce: str = ""
    _cred: dict | None = None

    def step(self, token: bytes) -> bytes:
        try:
            message = token.decode()
        except UnicodeDecodeError:
            raise ScramError("malformed SCRAM message: not UTF-8") from None
        if self._cred is None:
            return self._first(message)
        return self._final(message)

    def _first(self, message: str) -> bytes:
        # gs2-header: "n,," (or "y,,"; "p=" asks for channel binding, which we lack)
        flag, sep1, rest = message.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not sep1 or not sep2 or flag not in ("n", "y"):
            raise ScramError("malformed SCRAM client-first message (channel binding unsupported)")
        attrs = _attributes(bare)
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r" or not attrs[1][1]:
            raise ScramError("malformed SCRAM client-first message: needs n=user,r=nonce")
        user = _saslname(attrs[0][1])
        if authzid and (not authzid.startswith("a=") or _saslname(authzid[2:]) != user):
            raise ScramError("the authorization id differs from the user name")
        cred = self.lookup(user, self.mechanism)
        if cred is None:
            raise ScramError("invalid credentials")
        self.user, self._cred = user, cred
        self._gs2_header = f"{flag},{authzid},"
        self._client_first_bare = bare
        self._nonce = attrs[1][1] + base64.b64encode(secrets.token_bytes(18)).decode()
        self._server_first = f"r={self._nonce},s={cred['salt']},i={cred['iterations']}"
        return self._server_first.encode()

    def _final(self, message: str) -> bytes:
        if self.done:
            raise ScramError("SCRAM exchange already complete")
        assert self._cred is not None
        attrs = _attributes(message)
        if len(attrs) < 3 or attrs[0][0] != "c" or attrs[1][0] != "r" or attrs[-1][0] != "p":
            raise ScramError("malformed SCRAM client-final message: needs c=,r=,...,p=")
        if attrs[0][1] != base64.b64encode(self._gs2_header.encode()).decode():
            raise ScramError("channel binding does not match")
        if attrs[1][1] != self._nonce:
            raise ScramError("nonce does not match")
        try:
            proof = base64.b64decode(attrs[-1][1], validate=True)
        except ValueError:
            raise ScramError("malformed SCRAM client-final message: proof is not base64") from None
        without_proof = message[: message.rindex(",p=")]
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        h = _h(self.mechanism)
        stored_key = base64.b64decode(self._cred["stored_key"])
        signature = hmac.digest(stored_key, auth_message, h)
        if len(proof) != len(signature):
            raise ScramError("invalid credentials")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.new(h, client_key).digest(), stored_key):
            raise ScramError("invalid credentials")
        server_key = base64.b64decode(self._cred["server_key"])
        self.done = True
        return b"v=" + base64.b64encode(hmac.digest(server_key, auth_message, h))
