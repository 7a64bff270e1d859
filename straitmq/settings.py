"""Settings declared once, for every process: a config is a dataclass whose fields are
`setting(...)`s, each carrying its default, its Kafka name (what DescribeConfigs shows),
its command-line flag and its help. The command line (`add_flags`, `flag_values`) and
`describe()` are built from those declarations, never written a second time.

A bool setting's flag turns it the other way from its default (`--no-...` for a default
of True). A setting without a flag is set another way (a flag shaped differently from the
field, or a properties file) and only documented here.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, field, fields
from typing import Any

# The field annotations a flag can parse (the modules use `from __future__ import
# annotations`, so they are strings).
_TYPES: dict[str, type] = {
    "int": int,
    "int | None": int,
    "float": float,
    "float | None": float,
    "str": str,
    "str | None": str,
    "bool": bool,
}


def setting(
    default: Any,
    kafka: str | None = None,
    flag: str | None = None,
    help: str | None = None,
    *,
    properties: bool = False,
) -> Any:
    """A field with its Kafka name and command-line flag (both optional). `properties`:
    the Kafka name may also be given in a `--properties` file or as `--override`."""
    return field(
        default=default,
        metadata={"kafka": kafka, "flag": flag, "help": help, "properties": properties},
    )


def declared(cls: type) -> list[Field]:
    """The fields of a config class made by `setting(...)`."""
    return [f for f in fields(cls) if "flag" in f.metadata]


def default_of(cls: type, name: str) -> Any:
    """The declared default of one setting: what other classes of the same process take
    as their own default instead of repeating the number."""
    for f in fields(cls):
        if f.name == name and f.default is not MISSING:
            return f.default
    raise KeyError(f"{cls.__name__} declares no default for {name!r}")


def flag_settings(cls: type) -> list[tuple[str, str, type, Any, str | None]]:
    """(field, flag, type, default, help) of every setting with a plain flag."""
    return [
        (f.name, f.metadata["flag"], _TYPES[str(f.type)], f.default, f.metadata["help"])
        for f in declared(cls)
        if f.metadata["flag"]
    ]


def add_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One argument per setting with a flag, with its default and help."""
    for name, flag, kind, default, help_ in flag_settings(cls):
        if kind is bool:
            action = "store_false" if default else "store_true"
            parser.add_argument(flag, dest=name, action=action, help=help_)
        else:
            parser.add_argument(flag, dest=name, type=kind, default=default, help=help_)


def flag_values(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The parsed values of `cls`'s flags, by field name (for `cls(**...)`)."""
    return {name: getattr(args, name) for name, *_ in flag_settings(cls)}


def properties_fields(cls: type) -> dict[str, str]:
    """Kafka name -> field name of the settings a properties file may set."""
    return {f.metadata["kafka"]: f.name for f in declared(cls) if f.metadata["properties"]}


def describe(config: object) -> dict[str, str]:
    """The settings that have a Kafka name, by that name, as DescribeConfigs shows them."""
    out = {}
    for f in declared(type(config)):
        name = f.metadata["kafka"]
        if name:
            value = getattr(config, f.name)
            out[name] = (
                ""
                if value is None
                else str(value).lower()
                if isinstance(value, bool)
                else str(value)
            )
    return out
