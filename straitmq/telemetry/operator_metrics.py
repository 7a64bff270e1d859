"""Instruments for the Kubernetes operator (`straitmq.operator`), ready before it is.

    metrics = OperatorMetrics(Telemetry("straitmq-operator", instance_id=pod_name))
    with metrics.reconcile("Topic"):
        ...  # an exception counts as an error of its `error_type`, then propagates
    metrics.requeued("MQCluster")  # a pass that asked to be retried later

The operator's own HTTP server serves `telemetry.render()` on /metrics. Every counter
series of a known label set exists from the first scrape, at zero: a healthy install's
error panels show 0, not "No data".
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from . import catalog
from .provider import Telemetry

# Reconciles wait on the API server and the controller: milliseconds to a minute.
RECONCILE_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
KINDS = ("MQCluster", "Topic", "User")
# What a reconcile pass can fail with, named by the nearest of these classes an exception
# derives from (`error_type`), which keeps the label's values few and known in advance:
# the Kubernetes client's refusals (every status code and client flavour), the brokers'
# admin API, a Topic or User its cluster cannot serve (on deletion), the API server
# unreachable (urllib3), timeouts and other I/O. Anything else is named by its own class.
ERROR_TYPES = (
    "ApiException",
    "AdminError",
    "TopicProblem",
    "UserProblem",
    "HTTPError",
    "TimeoutError",
    "OSError",
)


def error_type(e: BaseException) -> str:
    for cls in type(e).__mro__:
        if cls.__name__ in ERROR_TYPES:
            return cls.__name__
    return type(e).__name__


class OperatorMetrics:
    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self._reconciles = telemetry.counter(catalog.OPERATOR_RECONCILES)
        self._errors = telemetry.counter(catalog.OPERATOR_RECONCILE_ERRORS)
        self._duration = telemetry.histogram(
            catalog.OPERATOR_RECONCILE_DURATION, RECONCILE_BUCKETS_S
        )
        for kind in KINDS:  # present from the first scrape, at zero
            for outcome in ("success", "error", "requeue"):
                self._reconciles.add(0, self._outcome(kind, outcome))
            for error in ERROR_TYPES:
                self._errors.add(0, self._error(kind, error))

    @staticmethod
    def _outcome(kind: str, outcome: str) -> dict[str, str]:
        return {catalog.RESOURCE_KIND: kind, catalog.OUTCOME: outcome}

    @staticmethod
    def _error(kind: str, error: str) -> dict[str, str]:
        return {catalog.RESOURCE_KIND: kind, catalog.ERROR: error}

    @contextmanager
    def reconcile(self, kind: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        except Exception as e:
            self._errors.add(1, self._error(kind, error_type(e)))
            self._reconciles.add(1, self._outcome(kind, "error"))
            raise
        else:
            self._reconciles.add(1, self._outcome(kind, "success"))
        finally:
            self._duration.record(time.perf_counter() - start, {catalog.RESOURCE_KIND: kind})

    def requeued(self, kind: str) -> None:
        self._reconciles.add(1, self._outcome(kind, "requeue"))
