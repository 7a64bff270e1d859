"""One process's metrics: an OpenTelemetry MeterProvider with a Prometheus reader on a
registry of its own, and an OTLP/HTTP exporter when an endpoint is configured.

    telemetry = Telemetry("straitmq-broker", instance_id="1")
    telemetry.observe(catalog.BROKER_LEADERS, lambda: [(3, {})])
    latency = telemetry.fast_histogram(catalog.BROKER_REQUEST_DURATION, LATENCY_BUCKETS_S)
    telemetry.render()  # Prometheus text for GET /metrics

OTLP export is on when `otlp_endpoint` is given (`--otlp-endpoint`) or the standard
`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT` variables are set;
the other `OTEL_EXPORTER_OTLP_*` variables (headers, timeout, ...) and
`OTEL_METRIC_EXPORT_INTERVAL` apply as the SDK defines them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider, ObservableCounter, ObservableGauge
from opentelemetry.sdk.metrics.export import (
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from straitmq.version import VERSION, commit

from . import catalog
from .catalog import Instrument
from .histogram import HistogramFamily
from .http import add_metrics_route

log = logging.getLogger("straitmq.telemetry")

# Series per instrument per collection; past it the SDK folds the rest into one
# `otel.metric.overflow` series. Per-partition gauges are the largest: raise it with
# STRAITMQ_METRICS_CARDINALITY_LIMIT for brokers hosting more partitions than this.
DEFAULT_CARDINALITY_LIMIT = 10_000

# What a callback returns: (value, attributes) pairs.
Points = Iterable[tuple[float, Mapping[str, Any]]]


def otlp_enabled(endpoint: str | None) -> bool:
    return bool(
        endpoint
        or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


class Telemetry:
    def __init__(
        self,
        service_name: str,
        instance_id: str,
        otlp_endpoint: str | None = None,
        export_interval_ms: float | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._families: list[tuple[str, HistogramFamily]] = []
        limit = int(os.environ.get("STRAITMQ_METRICS_CARDINALITY_LIMIT", DEFAULT_CARDINALITY_LIMIT))
        limits: Any = {ObservableGauge: limit, ObservableCounter: limit}
        self.resource = Resource.create(
            {
                "service.name": service_name,
                "service.namespace": "straitmq",
                "service.instance.id": instance_id,
                "service.version": VERSION,
            }
        )
        readers: list[Any] = [
            _PrometheusReader(
                self, registry=self.registry, scope_info_enabled=False, cardinality_limits=limits
            )
        ]
        self.otlp = otlp_enabled(otlp_endpoint)
        if self.otlp:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            exporter = OTLPMetricExporter(endpoint=_metrics_url(otlp_endpoint))
            readers.append(
                _OtlpReader(
                    self,
                    exporter,
                    export_interval_millis=export_interval_ms,
                    cardinality_limits=limits,
                )
            )
        self.provider = MeterProvider(resource=self.resource, metric_readers=readers)
        self._meters: dict[str, Meter] = {}
        self.created: dict[str, Any] = {}
        # What every process runs (its version and commit), as Prometheus' build_info.
        build = {catalog.VERSION: VERSION, catalog.COMMIT: commit()}
        self.observe(catalog.BUILD_INFO, lambda: [(1, build)])

    # -- instruments ------------------------------------------------------------------

    def meter(self, scope: str) -> Meter:
        m = self._meters.get(scope)
        if m is None:
            m = self._meters[scope] = self.provider.get_meter(scope, VERSION)
        return m

    def observe(self, inst: Instrument, points: Callable[[], Points]) -> None:
        """An observable counter or gauge whose values `points()` reads at collection.

        Collection runs on the event loop (a scrape) or on the OTLP exporter's thread;
        callbacks only read state, and a read that races a change is skipped, not fatal.
        """

        def callback(_: CallbackOptions) -> Iterable[Observation]:
            try:
                return [Observation(v, dict(a)) for v, a in points()]
            except (RuntimeError, KeyError, AttributeError):  # state changed under us
                log.debug("metric callback skipped", extra={"metric": inst.name})
                return []

        meter = self.meter(inst.scope)
        if inst.kind == catalog.OBSERVABLE_COUNTER:
            self.created[inst.name] = meter.create_observable_counter(
                inst.name, [callback], inst.unit, inst.description
            )
        elif inst.kind == catalog.OBSERVABLE_GAUGE:
            self.created[inst.name] = meter.create_observable_gauge(
                inst.name, [callback], inst.unit, inst.description
            )
        else:
            raise ValueError(f"{inst.name} is a {inst.kind}, not an observable instrument")

    def counter(self, inst: Instrument) -> Any:
        if inst.kind != catalog.COUNTER:
            raise ValueError(f"{inst.name} is a {inst.kind}, not a counter")
        c = self.meter(inst.scope).create_counter(inst.name, inst.unit, inst.description)
        self.created[inst.name] = c
        return c

    def histogram(self, inst: Instrument, bounds: Sequence[float]) -> Any:
        """An SDK histogram, for measurements off the request path."""
        if inst.kind != catalog.HISTOGRAM:
            raise ValueError(f"{inst.name} is a {inst.kind}, not a histogram")
        h = self.meter(inst.scope).create_histogram(
            inst.name, inst.unit, inst.description, explicit_bucket_boundaries_advisory=bounds
        )
        self.created[inst.name] = h
        return h

    def fast_histogram(self, inst: Instrument, bounds: Sequence[float]) -> HistogramFamily:
        """A request-path histogram (see histogram.py); exported like an SDK histogram."""
        family = HistogramFamily(inst.name, inst.unit, inst.description, bounds)
        self.attach_fast_histogram(inst, family)
        return family

    def attach_fast_histogram(self, inst: Instrument, family: HistogramFamily) -> None:
        """Export a HistogramFamily made before this provider (it is collected as is)."""
        if inst.kind != catalog.FAST_HISTOGRAM or family.name != inst.name:
            raise ValueError(f"{inst.name} ({inst.kind}) is not the fast histogram {family.name}")
        self._families.append((inst.scope, family))
        self.created[inst.name] = family

    # -- export -----------------------------------------------------------------------

    def add_routes(self, app: Any) -> None:
        """Serve GET /metrics on an aiohttp application."""
        add_metrics_route(app, self)

    def render(self) -> bytes:
        """The Prometheus text exposition of everything (runs the callbacks)."""
        return generate_latest(self.registry)

    content_type = CONTENT_TYPE_LATEST

    def shutdown(self, timeout_s: float = 3.0) -> None:
        """Stop exporting; a last OTLP export gets at most `timeout_s`."""
        try:
            self.provider.shutdown(timeout_millis=timeout_s * 1000)
        except Exception:  # an unreachable collector must not fail a clean stop
            log.warning("metrics shutdown failed", exc_info=True)

    def _with_fast_histograms(self, data: MetricsData | None) -> MetricsData | None:
        scopes: dict[str, list] = {}
        for scope, family in self._families:
            metric = family.to_metric()
            if metric is not None:
                scopes.setdefault(scope, []).append(metric)
        if not scopes:
            return data
        if data is None or not data.resource_metrics:
            extra = [ScopeMetrics(_scope(name), ms, "") for name, ms in scopes.items()]
            return MetricsData([ResourceMetrics(self.resource, extra, "")])
        first, *rest = data.resource_metrics
        # One ScopeMetrics per scope: the OTLP encoder keys them by scope, so a second
        # one of the same name would replace the first.
        merged = [
            ScopeMetrics(sm.scope, [*sm.metrics, *scopes.pop(sm.scope.name, [])], sm.schema_url)
            for sm in first.scope_metrics
        ]
        merged += [ScopeMetrics(_scope(name), ms, "") for name, ms in scopes.items()]
        return MetricsData([ResourceMetrics(first.resource, merged, first.schema_url), *rest])


def _scope(name: str) -> InstrumentationScope:
    return InstrumentationScope(name, VERSION)


def _metrics_url(endpoint: str | None) -> str | None:
    """`--otlp-endpoint` is a base URL like OTEL_EXPORTER_OTLP_ENDPOINT: add /v1/metrics.
    None lets the exporter read the OTEL_* variables itself."""
    if not endpoint:
        return None
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/metrics") else endpoint + "/v1/metrics"


class _FastHistogramsMixin:
    """Adds the fast histograms to what a reader collects, even when the SDK's own
    instruments had nothing to report (the SDK then skips `_receive_metrics`)."""

    _telemetry: Telemetry
    _received = False

    def collect(self, timeout_millis: float = 10_000) -> None:
        self._received = False
        super().collect(timeout_millis)  # type: ignore[misc]  # a mixin: the reader's collect
        if not self._received:
            self._receive_metrics(MetricsData([]), timeout_millis=timeout_millis)

    def _receive_metrics(self, metrics_data: MetricsData, *a: Any, **kw: Any) -> None:
        self._received = True
        merged = self._telemetry._with_fast_histograms(metrics_data)
        if merged is not None and merged.resource_metrics:
            super()._receive_metrics(merged, *a, **kw)  # type: ignore[misc]  # the reader's, as above


# The SDK marks MetricReader.collect final; the mixin wraps it on purpose (see its doc).
class _PrometheusReader(_FastHistogramsMixin, PrometheusMetricReader):  # type: ignore[misc]
    def __init__(self, telemetry: Telemetry, **kw: Any) -> None:
        self._telemetry = telemetry
        super().__init__(**kw)


class _OtlpReader(_FastHistogramsMixin, PeriodicExportingMetricReader):  # type: ignore[misc]  # as above
    def __init__(self, telemetry: Telemetry, exporter: Any, **kw: Any) -> None:
        self._telemetry = telemetry
        super().__init__(exporter, **kw)
