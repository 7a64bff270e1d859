"""Named listeners as Kafka names them.

`listeners=CLIENT://127.0.0.1:9092,REPLICATION://127.0.0.1:9192` binds one socket per
name; `listener.security.protocol.map=CLIENT:SASL_SSL,REPLICATION:PLAINTEXT` says what
each speaks (a name that is itself a protocol maps to it by default, as in Kafka);
`advertised.listeners` what clients are told; `inter.broker.listener.name` the one the
other brokers' replica fetchers connect to, with any security protocol (inter_broker.py
says how they log in).

Each broker registers every advertised endpoint; Metadata, DescribeCluster and
FindCoordinator answer a client with the endpoints of the listener it connected to, and
leave out brokers that lack that listener (Kafka does the same).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from straitmq.security.tls import TlsListener, TlsSettings

from .sasl import SaslSettings

if TYPE_CHECKING:
    from straitmq.metadata.image import BrokerImage

    from straitmq.protocol.client import ClientSecurity

    from ..config import BrokerConfig

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
DEFAULT_LISTENER = "PLAINTEXT"


class ListenerConfigError(ValueError):
    """A listener setting that cannot work; the message says which and why."""


@dataclass(slots=True)
class ListenerSpec:
    name: str
    protocol: str
    host: str
    port: int
    advertised_host: str
    advertised_port: int

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")


def parse_endpoints(value: str, setting: str) -> list[tuple[str, str, int]]:
    """`NAME://host:port,...` -> [(NAME, host, port)]; `[::1]` brackets are removed."""
    out: list[tuple[str, str, int]] = []
    for item in (v.strip() for v in value.split(",")):
        if not item:
            continue
        name, sep, rest = item.partition("://")
        host, colon, port = rest.rpartition(":")
        if not sep or not colon or not name or not port.isdigit():
            raise ListenerConfigError(
                f"{setting}: {item!r} is not NAME://host:port (e.g. CLIENT://127.0.0.1:9092)"
            )
        name = name.upper()
        if any(n == name for n, _, _ in out):
            raise ListenerConfigError(f"{setting}: listener {name} is named twice")
        out.append((name, host.strip("[]"), int(port)))
    if not out:
        raise ListenerConfigError(f"{setting}: no listener given")
    return out


def parse_protocol_map(value: str | None) -> dict[str, str]:
    protocols = {p: p for p in PROTOCOLS}
    for item in (v.strip() for v in (value or "").split(",")):
        if not item:
            continue
        name, sep, proto = item.partition(":")
        if not sep or proto.upper() not in PROTOCOLS:
            raise ListenerConfigError(
                f"listener.security.protocol.map: {item!r} is not NAME:PROTOCOL with "
                f"PROTOCOL one of {', '.join(PROTOCOLS)}"
            )
        protocols[name.strip().upper()] = proto.upper()
    return protocols


def resolve(config: BrokerConfig) -> list[ListenerSpec]:
    """The listeners the config describes, the inter-broker one first."""
    if not config.listeners:
        if config.advertised_listeners or config.inter_broker_listener_name:
            raise ListenerConfigError(
                "advertised.listeners and inter.broker.listener.name need listeners"
            )
        return [
            ListenerSpec(
                DEFAULT_LISTENER,
                "PLAINTEXT",
                config.host,
                config.port,
                config.advertised_host,
                config.advertised_port,
            )
        ]
    protocols = parse_protocol_map(config.listener_security_protocol_map)
    bound = parse_endpoints(config.listeners, "listeners")
    advertised = (
        {
            n: (h, p)
            for n, h, p in parse_endpoints(
                config.advertised_listeners or "", "advertised.listeners"
            )
        }
        if config.advertised_listeners
        else {}
    )
    names = [n for n, _, _ in bound]
    for n in advertised:
        if n not in names:
            raise ListenerConfigError(f"advertised.listeners: {n} is not in listeners")
    specs = []
    for name, host, port in bound:
        if name not in protocols:
            raise ListenerConfigError(
                f"listener {name} has no security protocol: add {name}:PLAINTEXT (or SSL, "
                "SASL_PLAINTEXT, SASL_SSL) to listener.security.protocol.map"
            )
        adv_host, adv_port = advertised.get(name, (host, port))
        if adv_host in ("", "0.0.0.0", "::"):
            adv_host = socket.getfqdn()  # as Kafka advertises a wildcard listener
        specs.append(ListenerSpec(name, protocols[name], host, port, adv_host, adv_port))
    inter = (config.inter_broker_listener_name or "").upper()
    if not inter:
        plain = [s.name for s in specs if s.protocol == "PLAINTEXT"]
        if not plain:
            raise ListenerConfigError(
                "no PLAINTEXT listener for replication: set inter.broker.listener.name to "
                "the listener the brokers replicate over (any security protocol)"
            )
        inter = plain[0]
    first = next((s for s in specs if s.name == inter), None)
    if first is None:
        raise ListenerConfigError(f"inter.broker.listener.name: {inter} is not in listeners")
    return [first, *(s for s in specs if s is not first)]


def endpoint_for(b: BrokerImage, listener: str) -> tuple[str, int] | None:
    """Where a client of `listener` reaches broker `b`; None when `b` lacks that listener.
    A broker without named listeners has one endpoint, its PLAINTEXT listener."""
    if not listener:
        return b.host, b.port
    if not b.endpoints:
        return (b.host, b.port) if listener == DEFAULT_LISTENER else None
    ep = b.endpoints.get(listener)
    return (ep[0], ep[1]) if ep is not None else None


class Listener:
    """A listener as served: its endpoint, its TLS context (SSL, SASL_SSL) and its SASL
    settings (SASL_PLAINTEXT, SASL_SSL), built from the config at startup so a bad
    certificate or mechanism stops the broker with a message instead of a client error."""

    def __init__(self, spec: ListenerSpec, props: dict[str, str], reauth_ms: int) -> None:
        self.spec = spec
        self.tls = TlsListener(TlsSettings.from_properties(props, spec.name)) if spec.tls else None
        self.sasl = SaslSettings.from_properties(props, spec.name, reauth_ms) if spec.sasl else None
        # On the inter-broker listener: how this broker connects to the others' (TLS
        # context, SASL login); None for PLAINTEXT (see inter_broker.py).
        self.client: ClientSecurity | None = None

    @property
    def name(self) -> str:
        return self.spec.name


def bind_listeners(
    config: BrokerConfig,
    listeners: list[Listener],
    bind: Callable[[str, int], list[socket.socket]],
) -> list[tuple[Listener, list[socket.socket]]]:
    """Bind every listener (port 0 becomes the port it got, advertised too) and make the
    config's host/port the inter-broker listener's: that is the address the broker
    registers for replica fetchers and the controller's liveness probe."""
    bound: list[tuple[Listener, list[socket.socket]]] = []
    try:
        for listener in listeners:
            spec = listener.spec
            socks = bind(spec.host, spec.port)
            bound.append((listener, socks))
            if spec.port == 0:
                spec.port = socks[0].getsockname()[1]
                if spec.advertised_port == 0:
                    spec.advertised_port = spec.port
    except OSError:
        for _, socks in bound:
            for s in socks:
                s.close()
        raise
    first = listeners[0].spec
    config.host, config.port = first.host, first.port
    config.advertised_host, config.advertised_port = first.advertised_host, first.advertised_port
    return bound
