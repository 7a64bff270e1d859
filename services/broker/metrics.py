"""The broker's metrics: cheap counters on the request path, read out at collection.

The request path only adds to plain dicts (`bytes_in[topic] += n`) and records request
latency into a pre-bound `FastHistogram`; everything else (partition state, log sizes,
consumer lag, group states) is read from the broker's own state when Prometheus scrapes
`/metrics` or the OTLP exporter collects, so serving traffic pays nothing for it.

Consumer lag (high watermark - committed offset) is computed by the broker that
coordinates the group, which holds the committed offsets, for the partitions it has a
replica of: the high watermark of the partitions it leads, and for those it follows the
high watermark its leader last sent (at most one replica fetch behind). A (group,
partition) whose coordinator holds no replica of the partition is absent. With
replication factor = broker count (and on a single node) every pair is reported; sum over
brokers to see a group, each pair comes from one broker.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from straitmq.security.tls import TlsListener
from straitmq.telemetry import Telemetry
from straitmq.telemetry import catalog as C
from straitmq.telemetry.histogram import LATENCY_BUCKETS_S, FastHistogram, HistogramFamily
from straitmq.telemetry.kafka_names import FETCH_FOLLOWER, api_name, error_name

from .client_registry import ClientRegistry
from .fetch_sessions import FetchSessions
from .groups.coordinator import GroupCoordinator
from .groups.offsets import OffsetStore
from .log_cleaner import LogCleaner
from .partitions import PartitionManager
from .quotas import ClientQuotas
from .replication.isr import IsrManager
from .share.checkpoints import STATE_GROUP_PREFIX
from .share.coordinator import ShareCoordinator
from .transactions.coordinator import TransactionCoordinator

FOLLOWER_FETCH_KEY = -1  # latency key of Fetch requests from follower replicas
MAX_LAG_SERIES = 10_000  # (group, partition) pairs reported per scrape; the rest dropped
MAX_QUOTA_SERIES = 1000  # clients with a quota reported per scrape: the busiest
BYTE_QUOTAS = ("producer_byte_rate", "consumer_byte_rate")


def _latency_family() -> HistogramFamily:
    inst = C.BROKER_REQUEST_DURATION
    return HistogramFamily(inst.name, inst.unit, inst.description, LATENCY_BUCKETS_S)


@dataclass
class BrokerMetrics:
    requests: Counter = field(default_factory=Counter)  # api key -> count
    request_errors: Counter = field(default_factory=Counter)  # (api key, error code) -> count
    bytes_in: Counter = field(default_factory=Counter)  # topic -> bytes
    bytes_out: Counter = field(default_factory=Counter)  # topic -> bytes sent to consumers
    messages_in: Counter = field(default_factory=Counter)
    messages_out: Counter = field(default_factory=Counter)  # topic -> offsets sent to consumers
    replication_bytes_out: int = 0  # bytes sent to follower replicas
    # Per listener: which one replication and logins really use (e.g. that replica
    # fetchers come in over the TLS/SASL inter-broker listener, as whom, and how often
    # their connections log in again).
    listener_connections: Counter = field(default_factory=Counter)  # listener -> accepted
    follower_fetches: Counter = field(default_factory=Counter)  # (listener, principal) -> n
    sasl_logins: Counter = field(default_factory=Counter)  # (listener, principal) -> n
    # Requests and connections refused at a limit: the limit's name (max.connections,
    # fetch.parked.per.partition, ...) -> how many.
    limit_refusals: Counter = field(default_factory=Counter)
    latency_family: HistogramFamily = field(default_factory=_latency_family)
    latency: dict[int, FastHistogram] = field(default_factory=dict)  # api key -> histogram

    def observe(self, key: int, seconds: float) -> None:
        """One request's duration; `key` is the API key, or FOLLOWER_FETCH_KEY."""
        h = self.latency.get(key)
        if h is None:
            name = FETCH_FOLLOWER if key == FOLLOWER_FETCH_KEY else api_name(key)
            h = self.latency[key] = self.latency_family.bind({C.API: name})
        h.record(seconds)

    def snapshot(self) -> dict:
        return {
            "requests": {str(k): v for k, v in self.requests.items()},
            "request_errors": {f"{k[0]}:{k[1]}": v for k, v in self.request_errors.items()},
            "bytes_in": dict(self.bytes_in),
            "bytes_out": dict(self.bytes_out),
            "messages_in": dict(self.messages_in),
            "messages_out": dict(self.messages_out),
            "replication_bytes_out": self.replication_bytes_out,
            "listener_connections": dict(self.listener_connections),
            "follower_fetches": _by_listener(self.follower_fetches),
            "sasl_logins": _by_listener(self.sasl_logins),
            "limit_refusals": dict(self.limit_refusals),
        }


def _by_listener(counts: Counter) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (listener, principal), n in counts.items():
        out.setdefault(listener, {})[principal] = n
    return out


Points = Iterator[tuple[float, dict[str, Any]]]


def install(  # noqa: PLR0915 (a table: one observer per instrument of catalog.BROKER)
    telemetry: Telemetry,
    m: BrokerMetrics,
    partition_manager: PartitionManager,
    isr: IsrManager,
    sessions: FetchSessions,
    groups: GroupCoordinator,
    offsets: OffsetStore,
    share: ShareCoordinator,
    cleaner: LogCleaner,
    transactions: TransactionCoordinator,
    quotas: ClientQuotas,
) -> None:
    """Register the broker's instruments, read from the subsystems at collection."""
    telemetry.attach_fast_histogram(C.BROKER_REQUEST_DURATION, m.latency_family)

    def topic_io() -> Points:
        for topic, n in list(m.bytes_in.items()):
            yield n, {C.TOPIC: topic, C.DIRECTION: "receive"}
        for topic, n in list(m.bytes_out.items()):
            yield n, {C.TOPIC: topic, C.DIRECTION: "transmit"}

    def topic_messages() -> Points:
        for topic, n in list(m.messages_in.items()):
            yield n, {C.TOPIC: topic, C.DIRECTION: "receive"}
        for topic, n in list(m.messages_out.items()):
            yield n, {C.TOPIC: topic, C.DIRECTION: "transmit"}

    def errors() -> Points:
        for (key, code), n in list(m.request_errors.items()):
            yield n, {C.API: api_name(key), C.ERROR: error_name(code)}

    def partitions() -> list:
        return list(partition_manager.partitions.values())

    def led() -> list:
        return [p for p in partitions() if p.is_leader]

    def log_points(attr: str) -> Points:
        for p in partitions():
            plog = p.log
            value = plog.size_bytes if attr == "size" else len(plog.segments)
            yield value, {C.TOPIC: p.topic, C.PARTITION: str(p.index)}

    def share_groups() -> Any:
        return share.groups.groups

    def kind(gid: str) -> str:
        return groups.group_type(gid) or "classic"

    def lag() -> Points:
        emitted = 0
        for group, committed in list(offsets.offsets.items()):
            # A share group's start offsets are kept as the commits of an internal group.
            if group.startswith(STATE_GROUP_PREFIX):
                labels = {C.GROUP: group[len(STATE_GROUP_PREFIX) :], C.GROUP_TYPE: "share"}
            else:
                labels = {C.GROUP: group, C.GROUP_TYPE: kind(group)}
            for (topic, index), c in list(committed.items()):
                part = partition_manager.get(topic, index)
                if part is None or not part.role:
                    continue
                yield (
                    max(0, part.high_watermark - c.offset),
                    {**labels, C.TOPIC: topic, C.PARTITION: str(index)},
                )
                emitted += 1
                if emitted >= MAX_LAG_SERIES:
                    return

    def group_states() -> Points:
        for gid, _protocol, state in groups.list_groups():
            if gid.startswith(STATE_GROUP_PREFIX):
                continue  # a share group's saved start offsets, not a group of its own
            yield 1, {C.GROUP: gid, C.GROUP_TYPE: kind(gid), C.GROUP_STATE: state}
        for gid, sg in list(share_groups().items()):
            yield 1, {C.GROUP: gid, C.GROUP_TYPE: "share", C.GROUP_STATE: sg.state}

    def group_members() -> Points:
        for gid, g in list(groups.groups.items()):
            yield len(g.members), {C.GROUP: gid, C.GROUP_TYPE: "classic"}
        # KIP-848 groups (ConsumerGroupHeartbeat) are kept apart from the classic ones.
        for gid, cg in list(groups.machine.consumer_groups.items()):
            yield len(cg.members), {C.GROUP: gid, C.GROUP_TYPE: "consumer"}
        for gid, sg in list(share_groups().items()):
            yield len(sg.members), {C.GROUP: gid, C.GROUP_TYPE: "share"}

    t = telemetry
    t.observe(C.BROKER_TOPIC_IO, topic_io)
    t.observe(C.BROKER_TOPIC_MESSAGES, topic_messages)
    t.observe(
        C.BROKER_REPLICATION_IO, lambda: [(m.replication_bytes_out, {C.DIRECTION: "transmit"})]
    )
    t.observe(C.BROKER_REQUEST_ERRORS, errors)
    t.observe(C.BROKER_PARTITIONS, lambda: [(len(partitions()), {})])
    t.observe(C.BROKER_LEADERS, lambda: [(len(led()), {})])
    t.observe(
        C.BROKER_UNDER_REPLICATED,
        lambda: [(sum(len(p.isr) < len(p.replicas) for p in led()), {})],
    )
    t.observe(C.BROKER_UNDER_MIN_ISR, lambda: [(sum(len(p.isr) < p.min_isr for p in led()), {})])
    t.observe(
        C.BROKER_ISR_OPERATIONS,
        lambda: [
            (isr.shrinks, {C.ISR_OPERATION: "shrink"}),
            (isr.expands, {C.ISR_OPERATION: "expand"}),
        ],
    )
    t.observe(C.BROKER_LOG_SIZE, lambda: log_points("size"))
    t.observe(C.BROKER_LOG_SEGMENTS, lambda: log_points("segments"))
    t.observe(C.BROKER_OPEN_SEGMENT_FILES, lambda: [(len(partition_manager.handles), {})])
    t.observe(C.BROKER_STORAGE_UNAVAILABLE, lambda: [(len(partition_manager.unavailable), {})])

    def session_points(count_partitions: bool) -> Points:
        for kind, n in sessions.stats(count_partitions).items():
            yield n, {C.FETCHER_KIND: kind}

    t.observe(C.BROKER_FETCH_SESSIONS, lambda: session_points(False))
    t.observe(C.BROKER_FETCH_SESSION_PARTITIONS, lambda: session_points(True))
    t.observe(C.BROKER_FETCH_SESSION_EVICTIONS, lambda: [(sessions.evictions, {})])
    cs = cleaner.stats
    t.observe(
        C.BROKER_CLEANER_IO,
        lambda: [
            (cs.bytes_read, {C.DIRECTION: "receive"}),
            (cs.bytes_written, {C.DIRECTION: "transmit"}),
        ],
    )
    t.observe(C.BROKER_CLEANER_RECORDS_REMOVED, lambda: [(cs.records_removed, {})])
    t.observe(C.BROKER_CLEANER_CLEANINGS, lambda: [(cs.cleanings, {})])
    t.observe(C.BROKER_CLEANER_ERRORS, lambda: [(cs.errors, {})])
    t.observe(C.BROKER_CLEANER_BUSY, lambda: [(cs.busy_seconds, {})])

    def cleaner_points(what: str) -> Points:
        now = time.time()
        for (topic, index), st in list(cleaner.partition_stats().items()):
            labels = {C.TOPIC: topic, C.PARTITION: str(index)}
            if what == "ratio":
                yield st.dirty_ratio, labels
            else:
                yield (
                    now - (st.last_clean_ms / 1000 if st.last_clean_ms else cleaner.started),
                    labels,
                )

    t.observe(C.BROKER_CLEANER_DIRTY_RATIO, lambda: cleaner_points("ratio"))
    t.observe(C.BROKER_CLEANER_SINCE_LAST, lambda: cleaner_points("since"))
    t.observe(
        C.BROKER_CLEANER_UNCLEANABLE,
        lambda: [(sum(st.uncleanable is not None for st in list(cs.partitions.values())), {})],
    )
    ts = transactions.stats
    t.observe(C.BROKER_TXN_ONGOING, lambda: [(transactions.ongoing(), {})])
    t.observe(C.BROKER_TXN_MARKER_DURATION, lambda: [(ts.marker_seconds, {})])
    t.observe(
        C.BROKER_TXN_COMPLETED,
        lambda: [
            (ts.committed, {C.OUTCOME_TXN: "commit"}),
            (ts.aborted, {C.OUTCOME_TXN: "abort"}),
            (ts.timed_out, {C.OUTCOME_TXN: "timeout"}),
        ],
    )

    def quota_points(what: str) -> Points:
        # Bounded: only clients a quota applies to, the busiest MAX_QUOTA_SERIES.
        sensors = list(quotas.sensors.values())
        if len(sensors) > MAX_QUOTA_SERIES:
            sensors.sort(key=lambda s: s.throttle_ms_total + s.recorded, reverse=True)
            sensors = sensors[:MAX_QUOTA_SERIES]
        for s in sensors:
            labels = {C.QUOTA_TYPE: s.kind, C.QUOTA_USER: s.user, C.QUOTA_CLIENT: s.client_id}
            if what == "throttle":
                yield s.throttle_ms_total / 1000.0, labels
            elif what == "limit":
                yield s.quota, labels
            elif s.kind in BYTE_QUOTAS:
                yield s.recorded, labels

    t.observe(C.BROKER_QUOTA_THROTTLE, lambda: quota_points("throttle"))
    t.observe(C.BROKER_QUOTA_BYTES, lambda: quota_points("bytes"))
    t.observe(C.BROKER_QUOTA_LIMIT, lambda: quota_points("limit"))

    def refusals() -> Points:
        for source in (m.limit_refusals, groups.refusals, share.refusals):
            for limit, n in list(source.items()):
                yield n, {C.LIMIT: limit}

    t.observe(C.BROKER_LIMIT_REFUSALS, refusals)
    t.observe(C.CONSUMER_GROUP_LAG, lag)
    t.observe(C.CONSUMER_GROUP_STATE, group_states)
    t.observe(C.CONSUMER_GROUP_MEMBERS, group_members)


def install_clients(telemetry: Telemetry, registry: ClientRegistry) -> None:
    """Clients seen lately by software name and version (straitmq.broker.client_registry)."""

    def clients() -> Points:
        for (name, version), n in registry.by_software(time.time()).items():
            yield n, {C.CLIENT_SOFTWARE_NAME: name, C.CLIENT_SOFTWARE_VERSION: version}

    telemetry.observe(C.BROKER_CLIENTS, clients)


def install_host(telemetry: Telemetry, log_dir: str, tls: Callable[[], list[TlsListener]]) -> None:
    """The log directory's file system (read with statvfs at collection, as
    DescribeLogDirs does) and the expiry of the certificates the TLS listeners serve."""
    labels = {C.LOG_DIR: os.path.abspath(log_dir)}

    def space(usable: bool) -> Points:
        try:
            st = os.statvfs(log_dir)
        except OSError:  # gone or unreadable: no value (storage_unavailable tells more)
            return
        yield (st.f_bavail if usable else st.f_blocks) * st.f_frsize, labels

    telemetry.observe(C.BROKER_LOG_DIR_USABLE, lambda: space(True))
    telemetry.observe(C.BROKER_LOG_DIR_CAPACITY, lambda: space(False))
    telemetry.observe(
        C.TLS_CERTIFICATE_EXPIRY,
        lambda: [
            (t.not_after, {C.LISTENER: t.settings.listener})
            for t in tls()
            if t.not_after is not None
        ],
    )
