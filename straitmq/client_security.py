"""The Java client's security options, as librdkafka takes them.

A Spark user sets `kafka.security.protocol`, `kafka.sasl.mechanism`, `kafka.sasl.jaas.config`
and `kafka.ssl.truststore.location` for Spark's own Kafka source, and a user of Kafka's
tools keeps the same names in a `--command-config` file. The same options work on the
`straitmq` Spark source and on `strait --command-config`: this module maps them onto
librdkafka's names (`sasl.username`, `sasl.password`, `ssl.ca.location`, ...).
librdkafka's own names pass through unchanged. A Java option librdkafka cannot honour (a
JKS truststore, a login module other than PLAIN or SCRAM) is refused with what to use
instead, rather than connecting without it.
"""

from __future__ import annotations

import re


class ClientSecurityError(ValueError):
    """A client security option that cannot be honoured; the message says what to use."""


_LOGIN_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule",
    "org.apache.kafka.common.security.scram.ScramLoginModule",
}
# `key="value"` (quotes optional) pairs of a JAAS entry, after the module and its flag.
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;]+))')
# Java-only names, read here and not handed on (librdkafka would refuse them).
_CONSUMED = {
    "sasl.jaas.config",
    "ssl.truststore.location",
    "ssl.truststore.type",
    "ssl.truststore.password",
    "ssl.truststore.certificates",
    "ssl.keystore.type",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.key.password",
    "ssl.keystore.certificate.chain",
    "ssl.keystore.key",
}


def parse_jaas(text: str, prefix: str = "") -> tuple[str, dict[str, str]]:
    """`Module required key="value" ...;` -> (module, options). `prefix` is how the
    caller's user names the options (`kafka.` for Spark), for the messages."""
    body = text.strip().rstrip(";").strip()
    module, _, rest = body.partition(" ")
    flag, _, rest = rest.strip().partition(" ")
    if not module or flag not in ("required", "requisite", "sufficient", "optional"):
        raise ClientSecurityError(
            f"option '{prefix}sasl.jaas.config' is not a JAAS entry; expected e.g. "
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            'username="alice" password="...";'
        )
    options = {
        m.group(1): (m.group(2).replace('\\"', '"') if m.group(2) is not None else m.group(3))
        for m in _JAAS_OPTION.finditer(rest)
    }
    return module, options


def librdkafka_config(options: dict[str, str], prefix: str = "") -> dict[str, str]:
    """Client options (without any `kafka.` prefix) in librdkafka's names; `prefix` names
    them in the messages as the user wrote them."""
    out = {k: v for k, v in options.items() if k not in _CONSUMED}
    jaas = options.get("sasl.jaas.config")
    if jaas:
        module, entries = parse_jaas(jaas, prefix)
        if module not in _LOGIN_MODULES:
            raise ClientSecurityError(
                f"option '{prefix}sasl.jaas.config' uses {module}: StraitMQ's clients log "
                "in with PLAIN or SCRAM (PlainLoginModule, ScramLoginModule) only"
            )
        if "username" not in entries or "password" not in entries:
            raise ClientSecurityError(
                f'option \'{prefix}sasl.jaas.config\' needs username="..." and password="..."'
            )
        out.setdefault("sasl.username", entries["username"])
        out.setdefault("sasl.password", entries["password"])
    _truststore(options, out, prefix)
    _keystore(options, out, prefix)
    algorithm = out.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None and algorithm.strip() == "":
        out["ssl.endpoint.identification.algorithm"] = "none"  # Java's "" turns it off
    return out


def _truststore(options: dict[str, str], out: dict[str, str], prefix: str) -> None:
    pem = options.get("ssl.truststore.certificates")
    if pem:
        out.setdefault("ssl.ca.pem", pem)
    location = options.get("ssl.truststore.location")
    if not location:
        return
    kind = options.get("ssl.truststore.type", "JKS").upper()
    if kind != "PEM":
        raise ClientSecurityError(
            f"option '{prefix}ssl.truststore.location' is a {kind} truststore, which "
            "StraitMQ's clients cannot read: give the CA certificates as a PEM file with "
            f"{prefix}ssl.truststore.type=PEM (Kafka's Java client reads PEM too)"
        )
    out.setdefault("ssl.ca.location", location)


def _keystore(options: dict[str, str], out: dict[str, str], prefix: str) -> None:
    chain, key = options.get("ssl.keystore.certificate.chain"), options.get("ssl.keystore.key")
    if chain and key:
        out.setdefault("ssl.certificate.pem", chain)
        out.setdefault("ssl.key.pem", key)
    location = options.get("ssl.keystore.location")
    if not location:
        return
    kind = options.get("ssl.keystore.type", "JKS").upper()
    password = options.get("ssl.key.password") or options.get("ssl.keystore.password")
    if kind == "PEM":
        # One file with the certificate chain and the private key, as Kafka's PEM
        # keystore holds them: librdkafka reads each part from it.
        out.setdefault("ssl.certificate.location", location)
        out.setdefault("ssl.key.location", location)
        if password:
            out.setdefault("ssl.key.password", password)
    elif kind == "PKCS12":
        out.setdefault("ssl.keystore.location", location)
        if options.get("ssl.keystore.password"):
            out.setdefault("ssl.keystore.password", options["ssl.keystore.password"])
    else:
        raise ClientSecurityError(
            f"option '{prefix}ssl.keystore.location' is a {kind} keystore, which StraitMQ's "
            f"clients cannot read: use {prefix}ssl.keystore.type=PEM or PKCS12"
        )
