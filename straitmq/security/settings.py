"""Security settings by their Kafka names, per listener.

They come from `--properties FILE` (a Kafka-style `key=value` file) and `--override
key=value`. A listener's own value (`listener.name.<name>.<key>`, the name in lower case
as Kafka writes it) wins over the broker-wide one (`<key>`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# Where a key may be given. ACL and HTTP keys are broker-wide only (as in Kafka) and a
# controller takes them too; LISTENER keys are broker-wide or per listener; PEER keys say
# how this node calls the other brokers and the controllers.
ACL, HTTP, LISTENER, PEER = "acl", "http", "listener", "peer"


@dataclass(frozen=True, slots=True)
class Key:
    """One security setting, declared once: its default (None: unset; what unset means
    is the reader's help), where it may be given, and whether a controller takes it."""

    default: str | None
    where: str
    help: str
    controller: bool = False


# Every other key is refused: a typo must not silently leave a listener open.
KEYS: dict[str, Key] = {
    # ACLs (acls.py)
    "authorizer.class.name": Key("", ACL, "any value turns the ACL authorizer on", True),
    "super.users": Key("", ACL, "User:name;User:other: allowed everything", True),
    "allow.everyone.if.no.acl.found": Key(
        "false", ACL, "true: a resource without any ACL is open to all", True
    ),
    # The HTTP port (http_security.py)
    "http.ssl.keystore.location": Key(None, HTTP, "PEM key and certificate chain", True),
    "http.ssl.key.password": Key(None, HTTP, "the key's password", True),
    "http.ssl.truststore.location": Key(None, HTTP, "PEM CA certificates", True),
    "http.ssl.client.auth": Key("none", HTTP, "none, requested or required", True),
    "http.ssl.reload.interval.ms": Key(
        "10000", HTTP, "how often rotated certificate files are looked for", True
    ),
    "http.authentication": Key("none", HTTP, "none, or a comma list of basic, mtls", True),
    "http.metrics.require.authentication": Key(
        "false", HTTP, "true: /metrics asks for credentials too", True
    ),
    # Kafka listeners (tls.py, straitmq.broker.security)
    "ssl.keystore.type": Key("PEM", LISTENER, "only PEM"),
    "ssl.keystore.location": Key(None, LISTENER, "PEM key and certificate chain"),
    "ssl.key.password": Key(None, LISTENER, "the key's password"),
    "ssl.truststore.type": Key(None, LISTENER, "only PEM"),
    "ssl.truststore.location": Key(None, LISTENER, "PEM CA certificates", True),
    "ssl.client.auth": Key("none", LISTENER, "none, requested or required"),
    "ssl.reload.interval.ms": Key(
        "10000", LISTENER, "how often rotated certificate files are looked for"
    ),
    "sasl.enabled.mechanisms": Key(
        None, LISTENER, "default: PLAIN (when it has users) and every SCRAM mechanism"
    ),
    "plain.sasl.jaas.config": Key(None, LISTENER, "the PLAIN users (user_<name>=...)"),
    "connections.max.reauth.ms": Key(None, LISTENER, "default: the broker's own setting"),
    # How this node calls the others (inter_broker.py, http_security.py)
    "sasl.mechanism.inter.broker.protocol": Key(None, PEER, "the replicas' SASL mechanism"),
    "sasl.jaas.config": Key(None, PEER, "the replicas' SASL user"),
    "scram-sha-256.sasl.jaas.config": Key(None, PEER, "the replicas' SCRAM-SHA-256 user"),
    "scram-sha-512.sasl.jaas.config": Key(None, PEER, "the replicas' SCRAM-SHA-512 user"),
    "ssl.endpoint.identification.algorithm": Key(
        "https", PEER, "https: check the peer's host name; empty: do not", True
    ),
    "controller.http.ssl.enabled": Key("false", PEER, "true: call the controllers over https"),
}
ACL_KEYS = frozenset(k for k, v in KEYS.items() if v.where == ACL)
HTTP_KEYS = frozenset(k for k, v in KEYS.items() if v.where == HTTP)
SECURITY_KEYS = frozenset(KEYS)
# A controller's HTTP port, and how it checks the voters and brokers calling it.
CONTROLLER_KEYS = frozenset(k for k, v in KEYS.items() if v.controller)


def default(key: str) -> str:
    """The declared default of a key that has one."""
    value = KEYS[key].default
    if value is None:
        raise KeyError(f"{key} has no default")
    return value


def check_keys(props: dict[str, str], fields: Iterable[str] = ()) -> None:
    """Refuse a key that is neither a security key nor one of `fields` (the Kafka names
    of the process's own settings a properties file may set too)."""
    fields = tuple(fields)
    for key in props:
        base = key
        if key.startswith("listener.name."):
            base = key[len("listener.name.") :].partition(".")[2]
        if key not in fields and base not in SECURITY_KEYS:
            raise ValueError(
                f"unknown setting {key!r}: --properties/--override take {', '.join(fields)} "
                f"and, broker-wide or as listener.name.<name>.<key>, "
                f"{', '.join(sorted(SECURITY_KEYS))}"
            )


def listener_value(props: dict[str, str], listener: str, key: str) -> str | None:
    for name in (listener.lower(), listener):  # Kafka writes the name in lower case
        own = props.get(f"listener.name.{name}.{key}")
        if own is not None:
            return own
    return props.get(key)
