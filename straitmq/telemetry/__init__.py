"""Metrics for every StraitMQ process: OpenTelemetry SDK, Prometheus `/metrics`, OTLP.

`catalog` declares every instrument; `provider.Telemetry` is one process's meter
provider and registry; `http.add_metrics_route` serves it from aiohttp; `operator_metrics`
holds the operator's instruments. The broker's and controller's callbacks live next to
the state they read (`straitmq.broker.metrics`, `straitmq.controller.metrics`).
"""

from .catalog import Instrument
from .histogram import LATENCY_BUCKETS_S, FastHistogram, HistogramFamily
from .http import add_metrics_route
from .provider import Telemetry

__all__ = [
    "LATENCY_BUCKETS_S",
    "FastHistogram",
    "HistogramFamily",
    "Instrument",
    "Telemetry",
    "add_metrics_route",
]
