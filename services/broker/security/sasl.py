"""SASL on a listener: which mechanisms, who PLAIN users are, and each connection's state.

Settings (Kafka's names; per listener as `listener.name.<name>.<key>`):
  sasl.enabled.mechanisms   default SCRAM-SHA-256,SCRAM-SHA-512, plus PLAIN when PLAIN
                            users are configured
  plain.sasl.jaas.config    (per listener: listener.name.<name>.plain.sasl.jaas.config)
                            Kafka's PlainLoginModule line; its user_<name>="<password>"
                            entries are the PLAIN users
  connections.max.reauth.ms the session lifetime (KIP-368), 0 = none

SCRAM users live in the metadata log (AlterUserScramCredentials), so every broker knows
them. A connection on a SASL listener is served nothing but ApiVersions, SaslHandshake
and SaslAuthenticate until it authenticates; anything else closes it (as Kafka does),
so a client that skips the handshake gets a closed connection, never a hang.
"""

from __future__ import annotations

import hmac
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from straitmq.security.scram import MECHANISMS, ScramError, ScramServer
from straitmq.security.settings import listener_value
from straitmq.security.tls import ANONYMOUS

log = logging.getLogger("straitmq.security")
PRE_AUTH_APIS = frozenset({17, 18, 36})  # SaslHandshake, ApiVersions, SaslAuthenticate
SUPPORTED = ("PLAIN", *MECHANISMS)
_JAAS_USER = re.compile(r'\buser_([^\s=]+)\s*=\s*"((?:[^"\\]|\\.)*)"')


class SaslConfigError(ValueError):
    """A listener's SASL settings cannot be used; the message says which."""


@dataclass(frozen=True, slots=True)
class SaslSettings:
    listener: str
    mechanisms: tuple[str, ...]
    plain_users: dict[str, str] = field(default_factory=dict)
    reauth_ms: int = 0

    @classmethod
    def from_properties(cls, props: dict[str, str], listener: str, reauth_ms: int) -> SaslSettings:
        jaas = listener_value(props, listener, "plain.sasl.jaas.config") or ""
        users = {m.group(1): m.group(2).replace('\\"', '"') for m in _JAAS_USER.finditer(jaas)}
        raw = listener_value(props, listener, "sasl.enabled.mechanisms")
        if raw is None:
            mechs = tuple(["PLAIN"] if users else []) + tuple(MECHANISMS)
        else:
            mechs = tuple(m.strip().upper() for m in raw.split(",") if m.strip())
        for m in mechs:
            if m not in SUPPORTED:
                raise SaslConfigError(
                    f"listener {listener}: SASL mechanism {m} is not supported "
                    f"(supported: {', '.join(SUPPORTED)})"
                )
        if not mechs:
            raise SaslConfigError(f"listener {listener}: sasl.enabled.mechanisms is empty")
        if "PLAIN" in mechs and not users:
            raise SaslConfigError(
                f"listener {listener}: PLAIN is enabled but has no users: set "
                f"listener.name.{listener.lower()}.plain.sasl.jaas.config to "
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                'user_alice="alice-secret";'
            )
        own = listener_value(props, listener, "connections.max.reauth.ms")
        return cls(listener, mechs, users, int(own) if own is not None else reauth_ms)


class PlainServer:
    """RFC 4616: one message, authzid NUL authcid NUL password."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users = users
        self.user: str | None = None
        self.done = False

    def step(self, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise ScramError("malformed PLAIN message: expected authzid NUL user NUL password")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise ScramError("malformed PLAIN message: not UTF-8") from None
        if authzid and authzid != user:
            raise ScramError("the authorization id differs from the user name")
        expected = self.users.get(user)
        # compare_digest on both paths: timing does not tell which users exist.
        ok = hmac.compare_digest(password.encode(), (expected or "\0" + password).encode())
        if expected is None or not ok:
            raise ScramError("invalid credentials")
        self.user, self.done = user, True
        return b""


@dataclass
class SaslOutcome:
    """A SaslHandshake/SaslAuthenticate answer, and whether the connection ends after it."""

    error_code: int
    message: str | None = None
    auth_bytes: bytes = b""
    session_lifetime_ms: int = 0
    close: bool = False


class ConnectionSecurity:
    """Who is on this connection, and what it may ask before authenticating."""

    def __init__(
        self,
        sasl: SaslSettings | None,
        lookup: Callable[[str, str], dict | None],
        principal: str | None = None,
    ) -> None:
        self.sasl = sasl
        self.lookup = lookup
        self.principal = principal or ANONYMOUS
        self.authenticated = sasl is None
        self.mechanism: str | None = None
        self.exchange: PlainServer | ScramServer | None = None
        self.handshake_version = 1
        self.raw_tokens = False  # SaslHandshake v0: the tokens come unframed
        self.expires_at: float | None = None
        # Set by an answer that ends the connection: a failed SASL login, a refused
        # acks=0 produce (nothing to answer it with).
        self.close_after_reply = False

    def refusal(self, api_key: int) -> str | None:
        """Why this request closes the connection, or None to serve it."""
        if self.sasl is None or api_key in PRE_AUTH_APIS:
            return None
        if not self.authenticated:
            return "request before SASL authentication"
        if self.expires_at is not None and time.monotonic() > self.expires_at:
            return "SASL session expired (connections.max.reauth.ms) without re-authentication"
        return None

    def handshake(self, version: int, mechanism: str) -> SaslOutcome:
        sasl = self.sasl
        if sasl is None:
            return SaslOutcome(
                ErrorCode.illegal_sasl_state, "this listener does not use SASL", close=False
            )
        if self.exchange is not None and not self.exchange.done:
            return SaslOutcome(
                ErrorCode.illegal_sasl_state, "SaslHandshake during an exchange", close=True
            )
        if self.authenticated and version == 0:
            return SaslOutcome(
                ErrorCode.illegal_sasl_state, "re-authentication needs SaslHandshake v1", close=True
            )
        if mechanism not in sasl.mechanisms:
            return SaslOutcome(
                ErrorCode.unsupported_sasl_mechanism,
                f"mechanism {mechanism} is not enabled on this listener",
                close=True,
            )
        self.mechanism = mechanism
        self.handshake_version = version
        self.raw_tokens = version == 0
        self.exchange = (
            PlainServer(sasl.plain_users)
            if mechanism == "PLAIN"
            else ScramServer(mechanism, self.lookup)
        )
        return SaslOutcome(0)

    def authenticate(self, token: bytes) -> SaslOutcome:
        exchange = self.exchange
        if self.sasl is None or exchange is None or exchange.done:
            return SaslOutcome(
                ErrorCode.illegal_sasl_state,
                "SaslAuthenticate without a SaslHandshake before it",
                close=True,
            )
        try:
            reply = exchange.step(token)
        except ScramError as e:
            log.info(
                "SASL authentication failed", extra={"mechanism": self.mechanism, "reason": str(e)}
            )
            self.exchange = None
            return SaslOutcome(
                ErrorCode.sasl_authentication_failed,
                f"Authentication failed with SASL mechanism {self.mechanism}: {e}",
                close=True,
            )
        if not exchange.done:
            return SaslOutcome(0, auth_bytes=reply)
        principal = f"User:{exchange.user}"
        if self.authenticated and self.principal != principal:
            return SaslOutcome(
                ErrorCode.sasl_authentication_failed,
                f"re-authentication as {principal} on a connection of {self.principal}",
                close=True,
            )
        self.principal = principal
        self.authenticated = True
        self.raw_tokens = False
        lifetime = self.sasl.reauth_ms
        self.expires_at = time.monotonic() + lifetime / 1000 if lifetime > 0 else None
        log.debug("SASL authenticated", extra={"principal": principal})
        return SaslOutcome(0, auth_bytes=reply, session_lifetime_ms=lifetime)
