"""The client side of SASL PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802, RFC 7677),
for broker-to-broker connections. Sans-IO: `first()` gives the first token, `step()`
takes each server token and gives the next one (None: the exchange is over).

The SCRAM client checks the server's signature: a server that does not know the user's
ServerKey (a man in the middle, a wrong broker) cannot complete the exchange.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets

SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISMS = ("PLAIN", *SCRAM_HASHES)
# Kafka's client refuses fewer (ScramMechanism.minIterations); a server asking for less
# is weakening the password's hash.
MIN_ITERATIONS = 4096


def scram_keys(hash_name: str, salted: bytes) -> tuple[bytes, bytes, bytes]:
    """(ClientKey, StoredKey, ServerKey) from SaltedPassword (RFC 5802 section 3); the
    broker's server side derives its stored credential with this too."""
    client_key = hmac.digest(salted, b"Client Key", hash_name)
    stored_key = hashlib.new(hash_name, client_key).digest()
    return client_key, stored_key, hmac.digest(salted, b"Server Key", hash_name)


class SaslClientError(Exception):
    """The exchange cannot go on; the message says why."""


class PlainClient:
    def __init__(self, username: str, password: str) -> None:
        self.username, self.password = username, password

    def first(self) -> bytes:
        return b"\0" + self.username.encode() + b"\0" + self.password.encode()

    def step(self, token: bytes) -> bytes | None:
        return None  # PLAIN is one message; the server's answer is empty


def _saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramClient:
    def __init__(self, mechanism: str, username: str, password: str) -> None:
        if mechanism not in SCRAM_HASHES:
            raise SaslClientError(f"not a SCRAM mechanism: {mechanism}")
        self.hash = SCRAM_HASHES[mechanism]
        self.username, self.password = username, password
        self._nonce = base64.b64encode(secrets.token_bytes(24)).decode()
        self._bare = f"n={_saslname(username)},r={self._nonce}"
        self._server_signature: bytes | None = None
        self.done = False

    def first(self) -> bytes:
        return ("n,," + self._bare).encode()

    def step(self, token: bytes) -> bytes | None:
        if self.done:
            raise SaslClientError("SCRAM exchange already complete")
        if self._server_signature is None:
            return self._final(token)
        self._verify(token)
        return None

    def _final(self, token: bytes) -> bytes:
        server_first = token.decode(errors="replace")
        attrs = dict(_attributes(server_first))
        nonce, salt_b64, iters = attrs.get("r", ""), attrs.get("s"), attrs.get("i", "")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise SaslClientError("SCRAM server nonce does not extend ours")
        if salt_b64 is None or not iters.isdigit():
            raise SaslClientError("malformed SCRAM server-first message")
        iterations = int(iters)
        if iterations < MIN_ITERATIONS:
            raise SaslClientError(
                f"SCRAM server asks for {iterations} iterations, fewer than {MIN_ITERATIONS}"
            )
        try:
            salted = _salted_password(self.hash, self.password, salt_b64, iterations)
        except ValueError:
            raise SaslClientError("malformed SCRAM server-first message: salt") from None
        client_key, stored_key, server_key = scram_keys(self.hash, salted)
        without_proof = f"c={base64.b64encode(b'n,,').decode()},r={nonce}"
        auth_message = f"{self._bare},{server_first},{without_proof}".encode()
        signature = hmac.digest(stored_key, auth_message, self.hash)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = hmac.digest(server_key, auth_message, self.hash)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def _verify(self, token: bytes) -> None:
        attrs = dict(_attributes(token.decode(errors="replace")))
        if "e" in attrs:
            raise SaslClientError(f"SCRAM server error: {attrs['e']}")
        assert self._server_signature is not None
        try:
            got = base64.b64decode(attrs.get("v", ""), validate=True)
        except ValueError:
            got = b""
        if not hmac.compare_digest(got, self._server_signature):
            raise SaslClientError(
                "SCRAM server signature does not verify: the server does not hold this "
                "user's credential (wrong broker, or someone in between)"
            )
        self.done = True


@functools.lru_cache(maxsize=32)
def _salted_password(hash_name: str, password: str, salt_b64: str, iterations: int) -> bytes:
    # Up to 10 ms of PBKDF2 on the broker's event loop per login otherwise; a user's salt
    # and iterations only change with its credential, so every re-authentication of every
    # replica fetcher would pay it again for the same answer.
    salt = base64.b64decode(salt_b64)
    return hashlib.pbkdf2_hmac(hash_name, password.encode(), salt, iterations)


def _attributes(message: str) -> list[tuple[str, str]]:
    out = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=":
            raise SaslClientError(f"malformed SCRAM message near {part[:20]!r}")
        out.append((part[0], part[2:]))
    return out


def new_exchange(mechanism: str, username: str, password: str) -> PlainClient | ScramClient:
    if mechanism == "PLAIN":
        return PlainClient(username, password)
    return ScramClient(mechanism, username, password)
