"""In-process counters the HTTP API reports; the OpenTelemetry export builds on these."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class BrokerMetrics:
    requests: Counter = field(default_factory=Counter)  # api key -> count
    request_errors: Counter = field(default_factory=Counter)  # (api key, error code) -> count
    bytes_in: Counter = field(default_factory=Counter)  # topic -> bytes
    bytes_out: Counter = field(default_factory=Counter)
    messages_in: Counter = field(default_factory=Counter)

    def snapshot(self) -> dict:
        return {
            "requests": {str(k): v for k, v in self.requests.items()},
            "request_errors": {f"{k[0]}:{k[1]}": v for k, v in self.request_errors.items()},
            "bytes_in": dict(self.bytes_in),
            "bytes_out": dict(self.bytes_out),
            "messages_in": dict(self.messages_in),
        }
