"""The listeners a broker serves, built from its config: each with its TLS and SASL
settings, the inter-broker one also with how this broker connects to the others. Above
both listeners.py and inter_broker.py, which it joins."""

from __future__ import annotations

from ..config import BrokerConfig
from .inter_broker import inter_broker_security
from .listeners import Listener, ListenerConfigError, resolve


def build_listeners(config: BrokerConfig) -> list[Listener]:
    """Every listener of the config, the inter-broker one first (ValueError if unusable)."""
    specs = resolve(config)
    names = {s.name.lower() for s in specs}
    for key in config.security:
        if key.startswith("listener.name."):
            name = key[len("listener.name.") :].partition(".")[0]
            if name.lower() not in names:  # a typo would leave that listener unconfigured
                raise ListenerConfigError(
                    f"{key}: there is no listener {name.upper()} (listeners: "
                    f"{', '.join(s.name for s in specs)})"
                )
    listeners = [Listener(s, config.security, config.connections_max_reauth_ms) for s in specs]
    listeners[0].client = inter_broker_security(listeners[0], config.security)
    return listeners
