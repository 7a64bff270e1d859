"""The reassignment throttle: bytes/s a leader sends to replicas a reassignment is
adding (the cluster config `replication.throttled.rate`; -1 = unthrottled). Replicas
already in the replica set are never throttled, as in Kafka."""

from __future__ import annotations

import time
from collections.abc import Callable

from straitmq.metadata.image import MetadataImage


class ReplicationThrottle:
    def __init__(self, image: Callable[[], MetadataImage]) -> None:
        self._image = image
        self._tokens = 0.0
        self._stamp = time.monotonic()
        self.throttled_bytes = 0

    def _rate(self, topic: str, index: int, replica: int) -> int:
        image = self._image()
        p = image.partition(topic, index)
        # A replica we do not know yet is one a reassignment is adding whose metadata is
        # ahead of ours: throttle it too.
        if p is None or (replica in p.replicas and replica not in p.adding):
            return -1
        return int(image.cluster_configs.get("replication.throttled.rate", "-1"))

    def allowance(self, topic: str, index: int, replica: int, want: int) -> int:
        rate = self._rate(topic, index, replica)
        if rate <= 0:
            return want
        now = time.monotonic()
        self._tokens = min(float(rate), self._tokens + (now - self._stamp) * rate)
        self._stamp = now
        return min(want, int(self._tokens))

    def spent(self, topic: str, index: int, replica: int, size: int) -> None:
        if self._rate(topic, index, replica) > 0:
            self._tokens -= size
            self.throttled_bytes += size
