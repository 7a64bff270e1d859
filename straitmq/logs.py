"""Structured logging: one JSON object per line, quiet (WARNING) unless asked."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

import orjson

_STD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}
_SCALARS = (str, int, float, bool, type(None))
MAX_OBJECT_CHARS = 200  # a non-JSON extra is written as its str() only when this short


def _plain(v: object, depth: int = 0) -> bool:
    """JSON as it is: scalars, and small lists and dicts of them."""
    if isinstance(v, _SCALARS):
        return True
    if depth < 2 and isinstance(v, list | tuple):
        return all(_plain(x, depth + 1) for x in v)
    if depth < 2 and isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x, depth + 1) for k, x in v.items())
    return False


class JsonFormatter(logging.Formatter):
    def extras(self, record: logging.LogRecord) -> dict[str, object]:
        """What the caller passed with `extra=`: plain JSON as it is, another object as its
        str() when that is short, else only its type (a library's whole settings object
        must not ride on every line)."""
        out: dict[str, object] = {}
        for k, v in record.__dict__.items():
            if k in _STD:
                continue
            if _plain(v):
                out[k] = v
            else:
                text = str(v)
                out[k] = text if len(text) <= MAX_OBJECT_CHARS else f"<{type(v).__name__}>"
        return out

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(self.extras(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:  # where a broken invariant was found (straitmq.invariants)
            out["stack"] = record.stack_info
        return orjson.dumps(out, default=str).decode()


def setup(level: str = "warning", stream: TextIO = sys.stderr) -> None:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
