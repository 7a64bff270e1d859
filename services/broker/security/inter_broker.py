"""How this broker logs in to the other brokers' inter-broker listener (replica fetchers).

Kafka's settings, read for the listener `inter.broker.listener.name` names:
  sasl.mechanism.inter.broker.protocol   PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; default:
                                         the listener's first enabled mechanism
  listener.name.<name>.<mechanism>.sasl.jaas.config
                                         the broker's own user, `username="..."
                                         password="..."` (PlainLoginModule or
                                         ScramLoginModule); `sasl.jaas.config` also works
  ssl.truststore.location                CAs the other brokers' certificates chain to
                                         (default: the system's)
  ssl.keystore.location                  also the client certificate this broker shows
                                         (mTLS: the listener's ssl.client.auth)
  ssl.endpoint.identification.algorithm  https (default): the certificate must name the
                                         host connected to; empty: not checked

Everything is checked at startup, so a missing password or unreadable CA stops the broker
with a message instead of a replica fetcher failing forever.
"""

from __future__ import annotations

import logging
import re
import ssl

from straitmq.protocol.client import ClientSecurity, SaslLogin
from straitmq.protocol.sasl_client import MECHANISMS
from straitmq.security.settings import default, listener_value
from straitmq.security.tls import file_stamp

from .listeners import Listener, ListenerConfigError

log = logging.getLogger("straitmq.security")
_JAAS_FIELD = r'\b{}\s*=\s*"((?:[^"\\]|\\.)*)"'


def _jaas(jaas: str, key: str) -> str | None:
    m = re.search(_JAAS_FIELD.format(key), jaas)
    return m.group(1).replace('\\"', '"') if m else None


def inter_broker_security(listener: Listener, props: dict[str, str]) -> ClientSecurity | None:
    """The ClientSecurity for `listener` (the inter-broker one); None for PLAINTEXT."""
    spec = listener.spec
    if not spec.tls and not spec.sasl:
        return None
    tls = _ClientTls(listener, props) if spec.tls else None
    return ClientSecurity(
        tls=tls.current if tls is not None else None,
        sasl=_sasl_login(listener, props) if spec.sasl else None,
        tls_reload=tls,
    )


def _sasl_login(listener: Listener, props: dict[str, str]) -> SaslLogin:
    name = listener.name
    enabled = listener.sasl.mechanisms if listener.sasl is not None else ()
    mechanism = (props.get("sasl.mechanism.inter.broker.protocol") or "").strip().upper()
    if not mechanism:
        mechanism = enabled[0] if enabled else "PLAIN"
    if mechanism not in MECHANISMS:
        raise ListenerConfigError(
            f"sasl.mechanism.inter.broker.protocol {mechanism}: one of {', '.join(MECHANISMS)}"
        )
    if mechanism not in enabled:
        raise ListenerConfigError(
            f"sasl.mechanism.inter.broker.protocol {mechanism} is not enabled on the "
            f"inter-broker listener {name} (enabled: {', '.join(enabled)})"
        )
    key = f"{mechanism.lower()}.sasl.jaas.config"
    jaas = listener_value(props, name, key) or props.get("sasl.jaas.config") or ""
    username, password = _jaas(jaas, "username"), _jaas(jaas, "password")
    if not username or password is None:
        raise ListenerConfigError(
            f"inter-broker listener {name} uses SASL {mechanism} but this broker has no login "
            f"for it: set listener.name.{name.lower()}.{key} to "
            f'"{_login_module(mechanism)} required username=\\"broker\\" password=\\"...\\";"'
        )
    return SaslLogin(mechanism, username, password)


def _login_module(mechanism: str) -> str:
    if mechanism == "PLAIN":
        return "org.apache.kafka.common.security.plain.PlainLoginModule"
    return "org.apache.kafka.common.security.scram.ScramLoginModule"


class _ClientTls:
    """The replica fetchers' TLS context, rebuilt for new connections when the CA or the
    client certificate file is rotated (as the listeners reload theirs); files that do
    not load keep the previous context, with a warning."""

    def __init__(self, listener: Listener, props: dict[str, str]) -> None:
        self.listener, self.props = listener, props
        self.files = [
            f
            for f in (
                listener_value(props, listener.name, "ssl.truststore.location"),
                listener_value(props, listener.name, "ssl.keystore.location"),
            )
            if f
        ]
        self.current = _tls_context(listener, props)  # startup: a bad file stops the broker
        self.stamp = self._stamp()
        self.reloads = 0

    def _stamp(self) -> tuple:
        return file_stamp(self.files)

    def __call__(self) -> ssl.SSLContext:
        stamp = self._stamp()  # a stat or two per new connection: fetchers reconnect rarely
        if stamp != self.stamp:
            try:
                self.current = _tls_context(self.listener, self.props)
                self.reloads += 1
                log.info("replication TLS files reloaded", extra={"listener": self.listener.name})
            except ListenerConfigError as e:
                log.warning(
                    "replication TLS files changed but do not load; keeping the previous ones",
                    extra={"listener": self.listener.name, "reason": str(e)},
                )
            self.stamp = stamp
        return self.current


def _tls_context(listener: Listener, props: dict[str, str]) -> ssl.SSLContext:
    name = listener.name

    def get(key: str) -> str | None:
        return listener_value(props, name, key)

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    algorithm = (
        (
            get("ssl.endpoint.identification.algorithm")
            or default("ssl.endpoint.identification.algorithm")
        )
        .strip()
        .lower()
    )
    if get("ssl.endpoint.identification.algorithm") == "":
        algorithm = ""
    if algorithm not in ("https", ""):
        raise ListenerConfigError(
            f"ssl.endpoint.identification.algorithm {algorithm!r}: https, or empty for none"
        )
    ctx.check_hostname = algorithm == "https"
    ctx.verify_mode = ssl.CERT_REQUIRED  # the peer's certificate is always checked
    truststore = get("ssl.truststore.location")
    keystore = get("ssl.keystore.location")
    try:
        if truststore:
            ctx.load_verify_locations(cafile=truststore)
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        if keystore:  # shown when the peer asks (ssl.client.auth), as Kafka's brokers do
            ctx.load_cert_chain(keystore, password=get("ssl.key.password"))
    except (OSError, ssl.SSLError) as e:
        raise ListenerConfigError(
            f"inter-broker listener {name}: cannot load TLS files for replication: {e}"
        ) from e
    return ctx
