"""The controller's metrics, read from the quorum and the active controller at collection.

Cluster-wide counts (brokers, topics, partitions, offline and under-replicated
partitions) come from the metadata image every voter holds; only the active controller
reports them, as Kafka does, so a `sum()` across controllers counts each once. Follower
lag is reported by the quorum leader, for every voter (itself at 0) and observer, and
so is how many voters it hears from. A standalone controller process also reports its
event-loop stalls and its HTTP certificate's expiry (`install_process`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from straitmq.telemetry import catalog as C

if TYPE_CHECKING:
    from straitmq.security.tls import TlsListener
    from straitmq.telemetry import Telemetry

    from .active import ActiveController
    from .quorum import Quorum

# Metadata commits take a few fsyncs and a round trip: sub-millisecond to seconds.
COMMIT_BUCKETS_S = (
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
)

Points = Iterator[tuple[float, dict[str, Any]]]
MAX_QUOTA_SERIES = 1000  # controller_mutation_rate allowances reported per scrape


def install(telemetry: Telemetry, quorum: Quorum, active: ActiveController) -> None:
    commit = telemetry.histogram(C.QUORUM_COMMIT_DURATION, COMMIT_BUCKETS_S)
    quorum.commit_latency = commit.record

    def serving() -> bool:
        return active.active and quorum.is_leader

    def follower_lag() -> Points:
        st = quorum.status()
        for kind, key in (("voter", "voters"), ("observer", "observers")):
            for r in st.get(key, ()):
                yield r["lag"], {C.NODE: str(r["node_id"]), C.REPLICA_KIND: kind}

    def voters() -> Points:
        counts = quorum.node.voters_reachable()
        if counts is not None:
            yield counts[0], {C.VOTER_STATE: "reachable"}
            yield counts[1], {C.VOTER_STATE: "unreachable"}

    def brokers() -> Points:
        if not serving():
            return
        counts = {"active": 0, "fenced": 0, "shutting_down": 0}
        for b in list(quorum.image.brokers.values()):
            state = "fenced" if b.fenced else "shutting_down" if b.shutting_down else "active"
            counts[state] += 1
        for state, n in counts.items():
            yield n, {C.BROKER_STATE: state}

    def image_partitions() -> list:
        return [p for t in list(quorum.image.topics.values()) for p in t.partitions]

    def when_active(count: Any) -> Any:
        return lambda: [(count(), {})] if serving() else []

    t = telemetry
    t.observe(C.CONTROLLER_ACTIVE, lambda: [(1 if serving() else 0, {})])
    t.observe(C.QUORUM_EPOCH, lambda: [(quorum.node.epoch, {})])
    t.observe(C.QUORUM_HIGH_WATERMARK, lambda: [(quorum.status()["high_watermark"], {})])
    t.observe(C.QUORUM_FOLLOWER_LAG, follower_lag)
    t.observe(C.QUORUM_VOTERS, voters)
    t.observe(
        C.CONTROLLER_FENCINGS,
        lambda: [
            (active.fencings, {C.FENCE_REASON: "session_expired"}),
            (active.fast_fencings, {C.FENCE_REASON: "process_gone"}),
        ],
    )
    t.observe(C.CONTROLLER_BROKERS, brokers)
    t.observe(C.CONTROLLER_TOPICS, when_active(lambda: len(quorum.image.topics)))
    t.observe(C.CONTROLLER_PARTITIONS, when_active(lambda: len(image_partitions())))
    t.observe(
        C.CONTROLLER_OFFLINE,
        when_active(lambda: sum(p.leader < 0 for p in image_partitions())),
    )

    def quota_points(what: str) -> Points:
        # Bounded: the allowances kept (MAX_BUCKETS), the busiest MAX_QUOTA_SERIES.
        allowances = list(active.mutation_quotas.allowances.values())
        if len(allowances) > MAX_QUOTA_SERIES:
            allowances.sort(key=lambda a: a.throttle_ms_total + a.recorded, reverse=True)
            allowances = allowances[:MAX_QUOTA_SERIES]
        for a in allowances:
            labels = {C.QUOTA_USER: a.user, C.QUOTA_CLIENT: a.client_id}
            if what == "throttle":
                yield a.throttle_ms_total / 1000.0, labels
            elif what == "mutations":
                yield a.recorded, labels
            else:
                yield a.throttled, labels

    t.observe(C.CONTROLLER_QUOTA_THROTTLE, lambda: quota_points("throttle"))
    t.observe(C.CONTROLLER_QUOTA_MUTATIONS, lambda: quota_points("mutations"))
    t.observe(C.CONTROLLER_QUOTA_REFUSED, lambda: quota_points("throttled"))
    t.observe(
        C.CONTROLLER_UNDER_REPLICATED,
        when_active(
            lambda: sum(p.leader >= 0 and len(p.isr) < len(p.replicas) for p in image_partitions())
        ),
    )


def install_process(telemetry: Telemetry, tls: TlsListener | None) -> None:
    """A standalone controller's certificate expiry (a combined node's broker reports
    its own, the voter port's included)."""
    telemetry.observe(
        C.TLS_CERTIFICATE_EXPIRY,
        lambda: (
            [(tls.not_after, {C.LISTENER: tls.settings.listener})]
            if tls is not None and tls.not_after is not None
            else []
        ),
    )
