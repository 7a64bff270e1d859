"""Kafka-style settings files: what `--properties FILE` and `--override KEY=VALUE` read
on brokers and controllers, and what Kafka's tools take as `--command-config` (the Spark
jobs' client settings)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

# Kafka's config providers (KIP-297; the environment's, KIP-887): `${env:NAME}` in a
# value is the environment variable NAME once `config.providers=env` declares `env`
# with this class. The operator uses it for what a broker learns only in its pod (the
# address of the node it runs on).
ENV_PROVIDER = "org.apache.kafka.common.config.provider.EnvVarConfigProvider"
_REFERENCE = re.compile(r"\$\{([^}:]+):(?:([^}:]*):)?([^}]*)\}")


def read_properties(path: str) -> dict[str, str]:
    """A Java properties file, the simple form Kafka's docs use: `key=value` (or
    `key: value`) lines, `#`/`!` comments, and a trailing backslash continuing a line
    (JAAS configs)."""
    out: dict[str, str] = {}
    pending = ""
    for raw in Path(path).read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


def load_settings(path: str | None, overrides: list[str]) -> dict[str, str]:
    """`--properties path` then each `--override KEY=VALUE` over it. Raises OSError for
    an unreadable file and ValueError for an override without `=`."""
    props = read_properties(path) if path else {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--override expects KEY=VALUE, got {item!r}")
        props[key.strip()] = value.strip()
    return resolve_providers(props, os.environ)


def resolve_providers(props: dict[str, str], env: Mapping[str, str]) -> dict[str, str]:
    """Each `${provider:key}` of a declared provider replaced by its value, as Kafka's
    ConfigTransformer does. Only the environment provider is known here: another class,
    or a variable the environment lacks, is a ValueError naming it (a broker must not
    advertise `${env:HOST_IP}` to its clients). The declarations themselves are left
    out of what it returns."""
    declared = [p.strip() for p in props.get("config.providers", "").split(",") if p.strip()]
    if not declared:
        return props
    for name in declared:
        cls = props.get(f"config.providers.{name}.class")
        if cls != ENV_PROVIDER:
            raise ValueError(
                f"config provider {name!r}: class {cls!r} is not supported "
                f"(StraitMQ knows {ENV_PROVIDER} only)"
            )

    def value(m: re.Match[str]) -> str:
        provider, _path, key = m.groups()
        if provider not in declared:
            return m.group(0)  # not a reference to a provider: kept as written
        if key not in env:
            raise ValueError(f"{m.group(0)}: the environment has no {key}")
        return env[key]

    # The declarations are used up here: the settings are what they resolved.
    return {
        k: _REFERENCE.sub(value, v)
        for k, v in props.items()
        if k != "config.providers" and not k.startswith("config.providers.")
    }
