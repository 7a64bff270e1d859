"""Client quota enforcement, sans-IO: rates over samples and the throttle they give.

Kafka's ClientQuotaManager and Rate/SampledStat, fed the time (ms) and the amounts; no
clock, no socket inside. The listener (server.py) asks `produce`, `fetch` and
`request_time` for a throttle after a request was handled. controller_mutation_rate is
the active controller's, for the whole cluster, as in Kafka with KRaft
(straitmq.controller.mutation_quotas); the admin handlers name the client to it.

- A rate is the sum of `samples` windows of `window_ms` over the elapsed time, and
  that time is at least (samples - 1) windows: a new client may burst.
- Over quota, the throttle is (rate - quota) / quota * window: the delay that brings
  the observed rate back to the quota if nothing more is sent (QuotaUtils.throttleTime);
  request_percentage throttles are capped at one window (ClientRequestQuotaManager).

Which entity's quota applies, and so which clients share a rate, is
straitmq.metadata.quotas.precedence. Lookups are cached per (user, client id) and
dropped when the image's quotas change; with no quota in the image, `enabled` is False
and the listener does no quota work at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from straitmq.metadata.image import MetadataImage
from straitmq.metadata.quotas import (
    CONNECTION_CREATION_RATE,
    CONSUMER_BYTE_RATE,
    IP,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    EntityKey,
    ip_address,
    is_ip_entity,
    precedence,
)

QUOTA_WINDOW_NUM = 11  # quota.window.num
QUOTA_WINDOW_SIZE_S = 1  # quota.window.size.seconds
INACTIVE_SENSOR_S = 3600.0  # Kafka's InactiveSensorExpirationTimeSeconds
EXPIRE_EVERY_S = 60.0  # idle rates are looked for at most this often (on a new lookup)
MAX_SENSORS = 10_000  # rates kept at most (a `<default>` quota gives each user one)
_KINDS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE)


class Rate:
    """Kafka's Rate over a SampledStat: windows of `window_ms`, `samples` of them (and
    one more, kept while it overlaps the measured time); a sample with no event for
    `samples` windows no longer counts. The sum, the oldest start and the next time a
    sample may expire are kept up to date, so a measure costs O(1) until then."""

    __slots__ = (
        "current",
        "lasts",
        "next_purge",
        "oldest",
        "samples",
        "starts",
        "total",
        "values",
        "window_ms",
    )

    def __init__(self, now_ms: float, samples: int, window_ms: float) -> None:
        self.starts = [now_ms]
        self.lasts = [now_ms]  # each sample's last event
        self.values = [0.0]
        self.current = 0
        self.samples = samples
        self.window_ms = window_ms
        self.total = 0.0
        self.oldest = now_ms  # min(starts)
        self.next_purge = now_ms + samples * window_ms  # no sample expires before

    def record(self, value: float, now_ms: float) -> None:
        i = self.current
        if now_ms - self.starts[i] >= self.window_ms:
            i = self.current = (i + 1) % (self.samples + 1)
            if i == len(self.starts):
                self.starts.append(now_ms)
                self.lasts.append(now_ms)
                self.values.append(0.0)
            else:
                self.total -= self.values[i]
                self.starts[i] = now_ms
                self.values[i] = 0.0
                self.oldest = min(self.starts)  # once per window, not per event
        self.values[i] += value
        self.total += value
        self.lasts[i] = now_ms

    def unrecord(self, value: float) -> None:
        self.values[self.current] -= value
        self.total -= value

    def _purge(self, now_ms: float) -> None:
        starts, lasts, values = self.starts, self.lasts, self.values
        expire = self.samples * self.window_ms
        for i, last in enumerate(lasts):
            if now_ms - last >= expire:
                starts[i] = lasts[i] = now_ms
                values[i] = 0.0
        self.total = sum(values)
        self.oldest = min(starts)
        self.next_purge = min(lasts) + expire

    def measure(self, now_ms: float) -> tuple[float, float]:
        """(rate per second, the window in ms it is measured over)."""
        if now_ms >= self.next_purge:
            self._purge(now_ms)
        elapsed = now_ms - self.oldest
        full = int(elapsed // self.window_ms)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return self.total * 1000.0 / elapsed, elapsed


def throttle_ms(rate: float, quota: float, window_ms: float) -> int:
    """QuotaUtils.throttleTime: 0 within quota."""
    if rate <= quota:
        return 0
    if quota <= 0:
        return round(window_ms)
    return round((rate - quota) / quota * window_ms)


@dataclass(slots=True)
class Sensor:
    """One shared allowance: the entity whose quota applies, and its measurements."""

    kind: str
    user: str  # Kafka's metric tags: "" where the quota is not per user / per client
    client_id: str
    entity: EntityKey  # whose quota it is
    quota: float
    rate: Rate
    # A recorded total this low is within quota whatever the window (see _charge).
    safe_total: float = 0.0
    last_ms: float = 0.0
    throttle_ms_total: float = 0.0
    throttled: int = 0  # requests throttled
    recorded: float = 0.0  # bytes (or percent-seconds) recorded, for metrics


@dataclass(slots=True)
class ClientQuotas:
    """The broker's quota state; `image` is read for the quota definitions."""

    image: Callable[[], MetadataImage]
    samples: int = QUOTA_WINDOW_NUM
    window_ms: float = QUOTA_WINDOW_SIZE_S * 1000.0
    sensors: dict[tuple[str, str, str], Sensor] = field(default_factory=dict)
    # (user, client id) -> a Sensor or None per kind in _KINDS, for the quotas version.
    _lookup: dict[tuple[str, str], tuple[Sensor | None, ...]] = field(default_factory=dict)
    _version: int = -1
    # Bumped whenever a rate may be dropped: allowances a connection keeps are stale then.
    generation: int = 0
    _expired_at: float = 0.0

    _enabled: bool = False
    _enabled_version: int = -1

    @property
    def enabled(self) -> bool:
        """A client (user or client id) quota exists: ip quotas are ConnectionRates'."""
        image = self.image()
        if image.quotas_version != self._enabled_version:
            self._enabled_version = image.quotas_version
            self._enabled = any(not is_ip_entity(e) for e in image.client_quotas)
        return self._enabled

    def _sensors(self, user: str, client_id: str, now_ms: float) -> tuple[Sensor | None, ...]:
        image = self.image()
        if image.quotas_version != self._version:
            self._refresh(image)
        found = self._lookup.get((user, client_id))
        if found is None:
            if now_ms - self._expired_at > EXPIRE_EVERY_S * 1000.0:
                self._expired_at = now_ms
                self.expire(now_ms)
            found = tuple(self._resolve(image, kind, user, client_id, now_ms) for kind in _KINDS)
            if len(self._lookup) >= MAX_SENSORS:
                self._lookup.clear()
            self._lookup[(user, client_id)] = found
        return found

    def _resolve(
        self, image: MetadataImage, kind: str, user: str, client_id: str, now_ms: float
    ) -> Sensor | None:
        quotas = image.client_quotas
        for entity, tag_user, tag_client in precedence(user, client_id):
            values = quotas.get(entity)
            if values is None or kind not in values:
                continue
            key = (kind, tag_user, tag_client)
            sensor = self.sensors.get(key)
            if sensor is None:
                if len(self.sensors) >= MAX_SENSORS:
                    self.expire(now_ms, 0.0)
                sensor = Sensor(
                    kind,
                    tag_user,
                    tag_client,
                    entity,
                    values[kind],
                    Rate(now_ms, self.samples, self.window_ms),
                )
                self.sensors[key] = sensor
            sensor.quota = values[kind]
            sensor.safe_total = values[kind] * (self.samples - 1) * self.window_ms / 1000.0
            sensor.entity = entity
            return sensor
        return None

    def _refresh(self, image: MetadataImage) -> None:
        """Quotas changed: look every client up again (a quota may have moved to another
        entity) and forget the rates whose quota is gone."""
        self._version = image.quotas_version
        self.generation += 1
        self._lookup.clear()
        quotas = image.client_quotas
        self.sensors = {k: s for k, s in self.sensors.items() if s.kind in quotas.get(s.entity, ())}

    def expire(self, now_ms: float, idle_s: float = INACTIVE_SENSOR_S) -> None:
        """Drop the rates not used for `idle_s` (all the oldest half when full)."""
        cutoff = now_ms - idle_s * 1000.0
        kept = {k: s for k, s in self.sensors.items() if s.last_ms > cutoff}
        if len(kept) >= MAX_SENSORS:
            by_age = sorted(kept.items(), key=lambda kv: kv[1].last_ms)
            kept = dict(by_age[len(by_age) // 2 :])
        self.sensors = kept
        self.generation += 1
        self._lookup.clear()

    def _charge(self, sensor: Sensor, value: float, now_ms: float, cap_ms: float = 0.0) -> int:
        r = sensor.rate
        r.record(value, now_ms)
        sensor.recorded += value
        sensor.last_ms = now_ms
        if r.total <= sensor.safe_total:
            # The measured window is never shorter than samples - 1 windows, and purging
            # only lowers the total: within quota for sure, no need to measure.
            return 0
        rate, window = r.measure(now_ms)
        ms = throttle_ms(rate, sensor.quota, window)
        if ms:
            if cap_ms:
                ms = min(ms, round(cap_ms))
            sensor.throttle_ms_total += ms
            sensor.throttled += 1
        return ms

    def produce(self, user: str, client_id: str, nbytes: int, now_ms: float) -> int:
        """Bytes a Produce request brought in: the throttle in ms (0: within quota)."""
        sensor = self._sensors(user, client_id, now_ms)[0]
        return 0 if sensor is None else self._charge(sensor, nbytes, now_ms)

    def request(
        self, user: str, client_id: str, seconds: float, produced: int, now_ms: float
    ) -> int:
        """One request handled on the Kafka listener: its handling time (and a Produce's
        bytes, `produced`), with one lookup: the throttle in ms."""
        return self.charge(self._sensors(user, client_id, now_ms), seconds, produced, now_ms)

    def lookup(self, user: str, client_id: str, now_ms: float) -> tuple[Sensor | None, ...]:
        """The allowances of a client, per kind; a connection may keep them for its
        next requests while `generation` and the image's quotas_version stay."""
        return self._sensors(user, client_id, now_ms)

    def charge(
        self, found: tuple[Sensor | None, ...], seconds: float, produced: int, now_ms: float
    ) -> int:
        """`request` with the allowances already looked up."""
        ms = 0
        if found[2] is not None:
            ms = self._charge(found[2], seconds * 100.0, now_ms, self.window_ms)
        if produced and found[0] is not None:
            ms = max(ms, self._charge(found[0], produced, now_ms))
        return ms

    def fetch(self, user: str, client_id: str, nbytes: int, now_ms: float) -> int:
        """Bytes a consumer's answer would carry (REST consume): the throttle in ms."""
        return self.charge_fetch(self._sensors(user, client_id, now_ms)[1], nbytes, now_ms)

    def charge_fetch(self, sensor: Sensor | None, nbytes: int, now_ms: float) -> int:
        """Bytes a consumer's Fetch answer would carry, against its consumer_byte_rate
        allowance (if any): the throttle in ms. Over quota the answer goes out empty
        (Kafka's), so the bytes are not counted then."""
        if sensor is None:
            return 0
        ms = self._charge(sensor, nbytes, now_ms)
        if ms:
            sensor.rate.unrecord(nbytes)
            sensor.recorded -= nbytes
        return ms

    def request_time(self, user: str, client_id: str, seconds: float, now_ms: float) -> int:
        """Time spent handling one request, as percent of one thread over the window
        (Kafka's request_percentage): the throttle in ms, at most one window."""
        sensor = self._sensors(user, client_id, now_ms)[2]
        if sensor is None:
            return 0
        return self._charge(sensor, seconds * 100.0, now_ms, self.window_ms)


class ConnectionRates:
    """KIP-612's connection_creation_rate per client address (ip entities, the address's
    own before the ip `<default>`): a new connection past its address's quota is not
    admitted, and the listener closes it once the throttle time has passed, as Kafka's
    acceptor does (ConnectionQuotas: the connection is not counted in the rate then)."""

    def __init__(
        self,
        image: Callable[[], MetadataImage],
        samples: int = QUOTA_WINDOW_NUM,
        window_ms: float = QUOTA_WINDOW_SIZE_S * 1000.0,
        max_addresses: int = MAX_SENSORS,
    ) -> None:
        self.image = image
        self.samples = samples
        self.window_ms = window_ms
        self.max_addresses = max_addresses
        self._version = -1
        # Canonical address (None: the ip <default>) -> its connection rate.
        self._quotas: dict[str | None, float] = {}
        self._rates: dict[str, tuple[float, Rate]] = {}  # address -> (its quota, rate)

    def _refresh(self) -> None:
        image = self.image()
        if image.quotas_version == self._version:
            return
        self._version = image.quotas_version
        self._quotas = {}
        for entity, values in image.client_quotas.items():
            names = dict(entity)
            if CONNECTION_CREATION_RATE in values and IP in names:
                name = names[IP]
                where = None if name is None else ip_address(name) or name
                self._quotas[where] = values[CONNECTION_CREATION_RATE]
        self._rates.clear()  # a quota changed: measured again from here

    def quota(self, address: str) -> float | None:
        self._refresh()
        if not self._quotas:
            return None
        q = self._quotas.get(ip_address(address) or address)
        return self._quotas.get(None) if q is None else q

    def admit(self, address: str, now_ms: float) -> int:
        """0: the new connection from `address` is admitted (and counted); otherwise the
        throttle in ms after which the refused connection is to be closed."""
        q = self.quota(address)
        if q is None:
            return 0
        entry = self._rates.get(address)
        if entry is None or entry[0] != q:
            if len(self._rates) >= self.max_addresses:
                self._rates.pop(next(iter(self._rates)))  # the longest known address
            entry = self._rates[address] = (q, Rate(now_ms, self.samples, self.window_ms))
        rate = entry[1]
        rate.record(1.0, now_ms)
        measured, window = rate.measure(now_ms)
        throttle = throttle_ms(measured, q, window)
        if throttle > 0:
            rate.unrecord(1.0)
        return throttle


def user_of(principal: str) -> str:
    """The quota entity name of a principal: `User:alice` is user `alice`."""
    return principal[5:] if principal.startswith("User:") else principal
