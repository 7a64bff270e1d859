"""controller_mutation_rate, enforced by the active controller, sans-IO.

Kafka with KRaft: the brokers forward CreateTopics, CreatePartitions and DeleteTopics to
the active controller, and its ControllerApis charges the partitions each topic creates
or deletes to the forwarded request's principal and client id
(`quotas.controllerMutation.newQuotaFor(request, strictSinceVersion)`,
ControllerMutationQuotaManager), in ReplicationControlManager after the topic passed its
checks (`context.applyPartitionChangeQuota`). So the allowance is one for the whole
cluster, not one per broker. The brokers send the principal's user name and the client
id with the change (`client` in the control request); the throttle comes back in the
answer, and the broker puts it in the response and mutes the client's connection that
long (RequestHandlerHelper.sendForwardedResponse).

- The allowance is Kafka's TokenBucket: it starts full at samples x window x quota
  partitions, refills at quota per second and may go below zero by one recording.
- Strict (CreateTopics v6+, DeleteTopics v5+, CreatePartitions v3+:
  StrictControllerMutationQuota): a topic is refused THROTTLING_QUOTA_EXCEEDED when the
  bucket is already below zero (checkQuotas before the record), with the time until it
  is back at zero; the topic that overdraws it goes through, unthrottled.
- Permissive (older versions: PermissiveControllerMutationQuota): every topic goes
  through; once the bucket is below zero the answer carries the time until it is back.

Which entity's quota applies is straitmq.metadata.quotas.precedence, as on the brokers.
"""

from __future__ import annotations

from dataclasses import dataclass

from straitmq.metadata.image import MetadataImage
from straitmq.metadata.quotas import CONTROLLER_MUTATION_RATE, EntityKey, precedence

QUOTA_WINDOW_NUM = 11  # quota.window.num
QUOTA_WINDOW_SIZE_S = 1  # quota.window.size.seconds
INACTIVE_S = 3600.0  # Kafka's InactiveSensorExpirationTimeSeconds
MAX_BUCKETS = 10_000
# Errors.THROTTLING_QUOTA_EXCEEDED.message, what Kafka's answer says per topic.
THROTTLED = "The throttling quota has been exceeded."


class TokenBucket:
    """Kafka's TokenBucket: starts full at samples * window * quota, refills at quota
    per second, and may go below zero by one recording (the request that overdraws)."""

    __slots__ = ("burst_s", "last_ms", "tokens")

    def __init__(self, now_ms: float, burst_s: float) -> None:
        self.tokens = float("inf")
        self.last_ms = now_ms
        self.burst_s = burst_s

    def level(self, quota: float, now_ms: float) -> float:
        burst = quota * self.burst_s
        self.tokens = min(burst, self.tokens + quota * (now_ms - self.last_ms) / 1000.0)
        self.last_ms = now_ms
        return self.tokens

    def record(self, value: float, quota: float, now_ms: float) -> None:
        self.level(quota, now_ms)
        self.tokens -= value

    def throttle_ms(self, quota: float, now_ms: float) -> int:
        """ControllerMutationQuotaManager.throttleTimeMs: -tokens / quota, 0 at or
        above zero."""
        tokens = self.level(quota, now_ms)
        if tokens >= 0:
            return 0
        return round(-tokens / quota * 1000.0) if quota > 0 else round(self.burst_s * 1000)


@dataclass(slots=True)
class Allowance:
    """One shared controller_mutation_rate allowance: whose quota it is, its bucket."""

    user: str  # Kafka's metric tags: "" where the quota is not per user / per client
    client_id: str
    entity: EntityKey
    quota: float
    bucket: TokenBucket
    last_ms: float = 0.0
    recorded: float = 0.0  # partitions charged
    throttled: int = 0  # topics refused or answers throttled
    throttle_ms_total: float = 0.0


class MutationQuotas:
    """The active controller's controller_mutation_rate allowances."""

    def __init__(
        self, samples: int = QUOTA_WINDOW_NUM, window_s: float = QUOTA_WINDOW_SIZE_S
    ) -> None:
        self.burst_s = samples * window_s
        self.allowances: dict[tuple[str, str], Allowance] = {}
        self._version = -1
        self._expired_at = 0.0

    def allowance(
        self, image: MetadataImage, user: str, client_id: str, now_ms: float
    ) -> Allowance | None:
        """The allowance a client's mutations are charged to, or None without a quota."""
        quotas = image.client_quotas
        if not quotas:
            return None
        if image.quotas_version != self._version:
            # A quota may have moved to another entity: keep only the buckets whose
            # entity still has one.
            self._version = image.quotas_version
            self.allowances = {
                k: a
                for k, a in self.allowances.items()
                if CONTROLLER_MUTATION_RATE in quotas.get(a.entity, ())
            }
        if now_ms - self._expired_at > 60_000.0 or len(self.allowances) >= MAX_BUCKETS:
            self._expired_at = now_ms
            cutoff = now_ms - INACTIVE_S * 1000.0
            self.allowances = {k: a for k, a in self.allowances.items() if a.last_ms > cutoff}
        for entity, tag_user, tag_client in precedence(user, client_id):
            values = quotas.get(entity)
            if values is None or CONTROLLER_MUTATION_RATE not in values:
                continue
            key = (tag_user, tag_client)
            a = self.allowances.get(key)
            quota = values[CONTROLLER_MUTATION_RATE]
            if a is None or a.entity != entity:
                if len(self.allowances) >= MAX_BUCKETS:
                    self.allowances.clear()
                bucket = TokenBucket(now_ms, self.burst_s)
                a = Allowance(tag_user, tag_client, entity, quota, bucket)
                self.allowances[key] = a
            a.quota = quota
            return a
        return None

    @staticmethod
    def charge(a: Allowance, partitions: int, strict: bool, now_ms: float) -> tuple[bool, int]:
        """Charge one topic's `partitions`: (refused, throttle ms). Strict refuses once
        the bucket is below zero and never throttles what it lets through; permissive
        lets everything through and throttles once the bucket is below zero."""
        a.last_ms = now_ms
        if strict:
            ms = a.bucket.throttle_ms(a.quota, now_ms)  # Sensor.checkQuotas
            if ms:
                a.throttled += 1
                a.throttle_ms_total += ms
                return True, ms
            a.bucket.record(partitions, a.quota, now_ms)
            a.recorded += partitions
            return False, 0
        a.bucket.record(partitions, a.quota, now_ms)
        a.recorded += partitions
        ms = a.bucket.throttle_ms(a.quota, now_ms)
        if ms:
            a.throttled += 1
            a.throttle_ms_total += ms
        return False, ms
