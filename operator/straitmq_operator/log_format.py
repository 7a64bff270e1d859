"""The operator's log lines: StraitMQ's JSON lines, without what kopf attaches to them.

kopf logs about an object through a logger adapter whose extras are its whole
`OperatorSettings` object (`settings`), `k8s_skip` and `k8s_ref` (a dict). A formatter that
writes every extra puts about 2 KB of settings on each line. `straitmq.logs` already
writes only small extras; here kopf's are dropped too, and `k8s_ref` becomes
`"object": "Kind/namespace/name"`, as in the operator's own lines.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from straitmq import logs

_KOPF_EXTRAS = {"settings", "k8s_skip", "k8s_ref"}
_HANDLER_SUCCEEDED = re.compile(r"Handler '[^']+' succeeded\.$")


def object_ref(ref: Mapping[str, Any]) -> str:
    """Kind/namespace/name (Kind/name for cluster-scoped objects)."""
    return "/".join(str(ref[k]) for k in ("kind", "namespace", "name") if ref.get(k))


class JsonFormatter(logs.JsonFormatter):
    """StraitMQ's JSON lines without kopf's extras; its object as `object`."""

    def extras(self, record: logging.LogRecord) -> dict[str, object]:
        out = {k: v for k, v in super().extras(record).items() if k not in _KOPF_EXTRAS}
        ref = record.__dict__.get("k8s_ref")
        if isinstance(ref, Mapping) and "object" not in out and object_ref(ref):
            out["object"] = object_ref(ref)
        return out


class QuietWatchSuccess(logging.Filter):
    """kopf's "Handler 'wake' succeeded." at debug level, not info.

    An `on.event` handler runs for every watch event of its objects, the operator's own
    status writes included, so kopf logs that line every few seconds per object. Those
    lines carry `k8s_skip` (kopf never posts them as Events); a change handler's success
    (e.g. a deletion's) stays at info.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.levelno == logging.INFO
            and record.__dict__.get("k8s_skip")
            and _HANDLER_SUCCEEDED.match(record.getMessage())
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def setup(log_format: str, level: str) -> None:
    """`json`: one JSON object per line (StraitMQ's format); `plain`: text lines."""
    if log_format == "json":
        logs.setup(level)
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    else:
        logging.basicConfig(
            level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
    kopf_objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, QuietWatchSuccess) for f in kopf_objects.filters):
        kopf_objects.addFilter(QuietWatchSuccess())
