"""Build kio response entities of any version from plain dicts.

Handlers describe a response once, as nested dicts with the field names Kafka's
schemas use; `build` fits them to the exact version's dataclasses: fields that the
version lacks are dropped, missing ones take the schema default, millisecond ints
become the timedeltas kio expects, and ints become ErrorCodes.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
from functools import cache
from typing import Any, cast

from kio.schema.errors import ErrorCode

_SIMPLE = 0
_NESTED = 1
_NESTED_TUPLE = 2
_TIMEDELTA = 3
_ERROR = 4
_DATETIME = 5


def _entity_of(tp: Any) -> type | None:
    """The dataclass inside `X`, `X | None` or `tuple[X, ...]`, if any."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            found = _entity_of(arg)
            if found is not None:
                return found
        return None
    if origin is tuple:
        return _entity_of(typing.get_args(tp)[0])
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return tp
    return None


def _is_tuple(tp: Any) -> bool:
    """`tuple[X, ...]`, also when nullable (`tuple[X, ...] | None`)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return any(_is_tuple(arg) for arg in typing.get_args(tp))
    return typing.get_origin(tp) is tuple


@cache
def _plan(schema: type) -> tuple[tuple[str, int, type | None, bool], ...]:
    hints = typing.get_type_hints(schema)
    plan = []
    for f in dataclasses.fields(schema):
        tp = hints[f.name]
        kafka_type = f.metadata.get("kafka_type", "")
        nested = _entity_of(tp)
        has_default = f.default is not dataclasses.MISSING or (
            f.default_factory is not dataclasses.MISSING
        )
        if nested is not None:
            kind = _NESTED_TUPLE if _is_tuple(tp) else _NESTED
        elif kafka_type.startswith("timedelta"):
            kind = _TIMEDELTA
        elif kafka_type.startswith("datetime"):
            kind = _DATETIME
        elif kafka_type == "error_code":
            kind = _ERROR
        else:
            kind = _SIMPLE
        plan.append((f.name, kind, nested, has_default))
    return tuple(plan)


def nested_schema(schema: type, field_name: str) -> type:
    """The entity class of one of `schema`'s nested fields (e.g. a response's topics)."""
    for name, _, nested, _ in _plan(schema):
        if name == field_name and nested is not None:
            return nested
    raise KeyError(f"{schema.__qualname__} has no nested field {field_name!r}")


_ZERO_DEFAULTS = {_TIMEDELTA: 0, _ERROR: 0, _NESTED_TUPLE: ()}


def build(schema: type, data: dict[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for name, kind, nested, has_default in _plan(schema):
        if name in data:
            value = data[name]
        elif has_default:
            continue
        elif kind in _ZERO_DEFAULTS:
            value = _ZERO_DEFAULTS[kind]
        else:
            raise KeyError(f"{schema.__qualname__}.{name} has no value and no default")
        if value is None:
            kwargs[name] = None
        elif kind == _SIMPLE:
            kwargs[name] = value
        elif kind == _ERROR:
            kwargs[name] = ErrorCode(value)
        elif kind == _TIMEDELTA:
            kwargs[name] = datetime.timedelta(milliseconds=value)
        elif kind == _NESTED_TUPLE:
            entity = cast(type, nested)  # the plan gives every nested kind its class
            kwargs[name] = tuple(
                v if dataclasses.is_dataclass(v) else build(entity, v) for v in value
            )
        elif kind == _NESTED:
            entity = cast(type, nested)  # as above
            kwargs[name] = value if dataclasses.is_dataclass(value) else build(entity, value)
        elif kind == _DATETIME:
            kwargs[name] = datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
    return schema(**kwargs)
