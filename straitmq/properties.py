"""Kafka-style settings files: what `--properties FILE` and `--override KEY=VALUE` read
on brokers and controllers, and what Kafka's tools take as `--command-config` (the Spark
jobs' client settings)."""

from __future__ import annotations

from pathlib import Path


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
    return props
