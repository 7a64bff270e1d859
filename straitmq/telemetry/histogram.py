"""A histogram cheap enough for the request path, exported as an OpenTelemetry histogram.

The SDK's `Histogram.record()` costs about 7 µs in CPython (attribute hashing, locks,
several layers of dispatch); a broker that answers tens of thousands of requests a
second cannot pay that per request. `FastHistogram.record()` is a bisect and three
additions (~0.3 µs). `HistogramFamily` keeps one per attribute set, bound once, and
turns them into the SDK's own `Histogram` data when a reader collects, so Prometheus
and OTLP see an ordinary explicit-bucket histogram.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Mapping, Sequence

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
)

# Seconds. Kafka requests range from tens of microseconds (a metadata lookup) to the
# long-poll wait of a fetch (up to fetch.max.wait.ms, 500 ms by default, 30 s at most).
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class FastHistogram:
    """Explicit-bucket histogram; bucket i counts values in (bounds[i-1], bounds[i]]."""

    __slots__ = ("bounds", "count", "counts", "max", "min", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0
        self.min = math.inf
        self.max = -math.inf

    def record(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value
        if value > self.max:
            self.max = value
        if value < self.min:
            self.min = value


_OVERFLOW = {"otel.metric.overflow": "true"}  # as the SDK names its overflow series
_OVERFLOW_KEY = tuple(_OVERFLOW.items())


class HistogramFamily:
    """One named histogram instrument: a FastHistogram per attribute set."""

    def __init__(
        self, name: str, unit: str, description: str, bounds: Sequence[float], limit: int = 1000
    ) -> None:
        self.name = name
        self.unit = unit
        self.description = description
        self.bounds = tuple(bounds)
        self.limit = limit  # attribute sets; past it everything lands in an overflow series
        self.start_ns = time.time_ns()
        self._series: dict[tuple, tuple[dict, FastHistogram]] = {}

    def bind(self, attributes: Mapping[str, str]) -> FastHistogram:
        """The histogram for these attributes; keep it and call record() on it."""
        key = tuple(sorted(attributes.items()))
        found = self._series.get(key)
        if found is None:
            if len(self._series) >= self.limit:
                key, attributes = _OVERFLOW_KEY, _OVERFLOW
            found = self._series.get(key)
            if found is None:
                found = self._series[key] = (dict(attributes), FastHistogram(self.bounds))
        return found[1]

    def to_metric(self) -> Metric | None:
        now = time.time_ns()
        points = []
        for attributes, h in list(self._series.values()):
            counts = list(h.counts)  # one snapshot, so count and buckets agree
            count = sum(counts)
            if not count:
                continue
            points.append(
                HistogramDataPoint(
                    attributes=attributes,
                    start_time_unix_nano=self.start_ns,
                    time_unix_nano=now,
                    count=count,
                    sum=h.sum,
                    bucket_counts=counts,
                    explicit_bounds=list(self.bounds),
                    min=h.min,
                    max=h.max,
                )
            )
        if not points:
            return None
        return Metric(
            name=self.name,
            description=self.description,
            unit=self.unit,
            data=Histogram(
                data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE
            ),
        )
