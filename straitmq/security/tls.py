"""TLS on a listener: PEM certificates, client certificates, rotation without a restart.

Settings (Kafka's names, `ssl.keystore.type=PEM` form; per listener as
`listener.name.<name>.ssl.*`):
  ssl.keystore.location    PEM file with the private key and the certificate chain
  ssl.key.password         the key's password, if it is encrypted
  ssl.truststore.location  PEM file of the CAs that client certificates must chain to
  ssl.client.auth          none (default) | requested | required
  ssl.reload.interval.ms   (StraitMQ's) how often the files are checked for rotation,
                           default 10000; new connections get the new certificate

The listening socket keeps one SSLContext for its life (asyncio fixes it at
create_server), so a rotation builds a fresh context from the files and the first
context's SNI callback (run on every ClientHello, with or without SNI) moves each new
connection onto it. A rotation that fails to load (a half-written file) keeps serving
the previous certificate and is retried at the next check.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509

from .settings import default, listener_value

log = logging.getLogger("straitmq.security")
CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
ANONYMOUS = "User:ANONYMOUS"

# getpeercert() attribute names -> the RFC 2253 keywords Java's X500Principal prints.
_RDN_KEYWORDS = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


class TlsConfigError(ValueError):
    """A listener's TLS settings cannot be used; the message says which."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    listener: str
    keystore: str
    key_password: str | None
    truststore: str | None
    client_auth: str
    reload_interval_ms: int

    @classmethod
    def from_properties(cls, props: dict[str, str], listener: str) -> TlsSettings:
        def get(key: str) -> str | None:
            return listener_value(props, listener, key)

        kind = (get("ssl.keystore.type") or default("ssl.keystore.type")).upper()
        if kind != "PEM":
            raise TlsConfigError(f"listener {listener}: ssl.keystore.type {kind}: only PEM files")
        keystore = get("ssl.keystore.location")
        if not keystore:
            raise TlsConfigError(
                f"listener {listener} speaks TLS but has no certificate: set "
                f"listener.name.{listener.lower()}.ssl.keystore.location to a PEM file "
                "holding the private key and certificate chain"
            )
        auth = (get("ssl.client.auth") or default("ssl.client.auth")).lower()
        if auth not in CLIENT_AUTH:
            raise TlsConfigError(f"ssl.client.auth {auth!r}: one of none, requested, required")
        truststore = get("ssl.truststore.location")
        if auth != "none" and not truststore:
            raise TlsConfigError(
                f"listener {listener}: ssl.client.auth={auth} needs ssl.truststore.location "
                "(the CAs client certificates are checked against)"
            )
        return cls(
            listener,
            keystore,
            get("ssl.key.password"),
            truststore,
            auth,
            int(get("ssl.reload.interval.ms") or default("ssl.reload.interval.ms")),
        )

    def files(self) -> list[str]:
        return [f for f in (self.keystore, self.truststore) if f]

    def build(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.keystore, password=self.key_password)
            if self.truststore:
                ctx.load_verify_locations(cafile=self.truststore)
        except (OSError, ssl.SSLError) as e:
            raise TlsConfigError(f"listener {self.listener}: cannot load TLS files: {e}") from e
        ctx.verify_mode = CLIENT_AUTH[self.client_auth]
        return ctx


def certificate_not_after(path: str) -> float | None:
    """When the first certificate of a PEM file (the leaf: a keystore holds the key and
    the chain, leaf first) stops being valid, in Unix seconds; None if it does not read."""
    try:
        cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
    except (OSError, ValueError):
        return None
    return cert.not_valid_after_utc.timestamp()


def file_stamp(files: list[str]) -> tuple:
    """What changes when any of `files` is rewritten or replaced (a rotation)."""
    out: list[tuple] = []
    for f in files:
        try:
            st = os.stat(f)
            out.append((f, st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            out.append((f, None))
    return tuple(out)


class TlsListener:
    """The SSLContext a listening socket serves, swapped to a rebuilt one on rotation."""

    def __init__(self, settings: TlsSettings) -> None:
        self.settings = settings
        self.server_context = settings.build()
        self.current = self.server_context
        self.server_context.sni_callback = self._pick_context
        self._stamp = self._file_stamp()
        self.reloads = 0
        # Of the certificate new connections get (straitmq.tls.certificate.expiry).
        self.not_after = certificate_not_after(settings.keystore)

    def _pick_context(self, sslobj: Any, server_name: str | None, ctx: ssl.SSLContext) -> None:
        if self.current is not ctx:
            sslobj.context = self.current
        return None

    def _file_stamp(self) -> tuple:
        return file_stamp(self.settings.files())

    def check(self) -> bool:
        """Reload when a file changed; True if new connections now get new files."""
        stamp = self._file_stamp()
        if stamp == self._stamp:
            return False
        try:
            fresh = self.settings.build()
        except TlsConfigError as e:
            log.warning(
                "TLS files changed but do not load; keeping the previous ones",
                extra={"listener": self.settings.listener, "reason": str(e)},
            )
            return False
        self._stamp = stamp
        self.current = fresh
        self.not_after = certificate_not_after(self.settings.keystore)
        self.reloads += 1
        log.info("TLS certificate reloaded", extra={"listener": self.settings.listener})
        return True

    async def watch(self) -> None:
        interval = max(self.settings.reload_interval_ms, 50) / 1000
        while True:
            await asyncio.sleep(interval)
            self.check()


def principal_from_cert(peercert: dict | None) -> str | None:
    """`User:<subject DN>` as Kafka's default ssl.principal.mapping.rules gives it: the
    RFC 2253 form, most specific attribute first (getpeercert lists them the other way)."""
    if not peercert or not peercert.get("subject"):
        return None
    rdns = []
    for rdn in reversed(peercert["subject"]):
        rdns.append("+".join(f"{_RDN_KEYWORDS.get(k, k)}={_escape(v)}" for k, v in rdn))
    return "User:" + ",".join(rdns)


def _escape(value: str) -> str:
    out = []
    for i, ch in enumerate(value):
        if ch in ',+"\\<>;' or (ch == "#" and i == 0) or (ch == " " and i in (0, len(value) - 1)):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)
