"""Security settings by their Kafka names, per listener.

They come from `--properties FILE` (a Kafka-style `key=value` file) and `--override
key=value`. A listener's own value (`listener.name.<name>.<key>`, the name in lower case
as Kafka writes it) wins over the broker-wide one (`<key>`).
"""

from __future__ import annotations

from straitmq.properties import read_properties  # noqa: F401  (its old home)

# ACLs (acls.py): broker-wide only, as in Kafka; a controller takes them too.
ACL_KEYS = frozenset({"authorizer.class.name", "super.users", "allow.everyone.if.no.acl.found"})
# The HTTP port (http_security.py): broker-wide only; a controller takes them too.
HTTP_KEYS = frozenset(
    {
        "http.ssl.keystore.location",
        "http.ssl.key.password",
        "http.ssl.truststore.location",
        "http.ssl.client.auth",
        "http.ssl.reload.interval.ms",
        "http.authentication",
        "http.metrics.require.authentication",
    }
)
# Every other key is refused: a typo must not silently leave a listener open.
SECURITY_KEYS = (
    ACL_KEYS
    | HTTP_KEYS
    | frozenset(
        {
            "ssl.keystore.type",
            "ssl.keystore.location",
            "ssl.key.password",
            "ssl.truststore.type",
            "ssl.truststore.location",
            "ssl.client.auth",
            "ssl.reload.interval.ms",
            "sasl.enabled.mechanisms",
            "plain.sasl.jaas.config",
            "connections.max.reauth.ms",
            # the inter-broker listener's client side (inter_broker.py)
            "sasl.mechanism.inter.broker.protocol",
            "sasl.jaas.config",
            "scram-sha-256.sasl.jaas.config",
            "scram-sha-512.sasl.jaas.config",
            "ssl.endpoint.identification.algorithm",
            "controller.http.ssl.enabled",  # the brokers' calls to the controllers
        }
    )
)
# Listener settings that also have a command-line flag (BrokerConfig fields).
FIELDS = {
    "listeners": "listeners",
    "advertised.listeners": "advertised_listeners",
    "listener.security.protocol.map": "listener_security_protocol_map",
    "inter.broker.listener.name": "inter_broker_listener_name",
    "connections.max.reauth.ms": "connections_max_reauth_ms",
}


def check_keys(props: dict[str, str]) -> None:
    for key in props:
        base = key
        if key.startswith("listener.name."):
            base = key[len("listener.name.") :].partition(".")[2]
        if key not in FIELDS and base not in SECURITY_KEYS:
            raise ValueError(
                f"unknown setting {key!r}: --properties/--override take {', '.join(FIELDS)} "
                f"and, broker-wide or as listener.name.<name>.<key>, "
                f"{', '.join(sorted(SECURITY_KEYS))}"
            )


def listener_value(props: dict[str, str], listener: str, key: str) -> str | None:
    for name in (listener.lower(), listener):  # Kafka writes the name in lower case
        own = props.get(f"listener.name.{name}.{key}")
        if own is not None:
            return own
    return props.get(key)
