"""Helpers for tests against a real multi-process cluster (3 controllers + N brokers).

- `cluster_factory`: the body of a fixture making a `LocalCluster` on free ports with short
  timeouts, optionally with every broker in its own network namespace (`tests/netns.py`);
  everything it starts is stopped (and the namespaces removed) at teardown.
- `Workload`: an idempotent acks=all confluent-kafka producer in a thread, writing unique
  values round-robin over the partitions and recording what was acknowledged, where.
- `consume_all`, `converge`, `replica_logs`, `verify`: the after-healing checks — every
  acknowledged message is there at the offset it was acknowledged at, no duplicates, and
  every replica's log is byte-identical up to the high watermark.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition  # noqa: E402
from straitmq.broker.record_codec import decode_batch  # noqa: E402
from straitmq.broker.storage.log import LogConfig, PartitionLog  # noqa: E402
from straitmq.cli.local_cluster import LocalCluster, Node  # noqa: E402
from waiting import wait_for  # noqa: E402  (also imported from here by tests)

from straitmq.admin_client import request_sync  # noqa: E402

PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv").exists() else sys.executable

SESSION_TIMEOUT_MS = 2000
CONTROLLER_ARGS = [
    "--broker-session-timeout-ms",
    str(SESSION_TIMEOUT_MS),
    "--election-timeout-ms",
    "500",
    "--fetch-timeout-ms",
    "1000",
]
BROKER_ARGS = [
    "--heartbeat-interval-ms",
    "300",
    "--replica-lag-time-max-ms",
    "3000",
    "--default-replication-factor",
    "3",
    "--offsets-topic-replication-factor",
    "3",
    "--group-initial-rebalance-delay-ms",
    "0",
]


# -- the cluster fixture ---------------------------------------------------------------


class Cluster(LocalCluster):
    """A LocalCluster plus the HTTP views the fault tests need."""

    net = None  # a tests.netns.BrokerNetwork when the brokers run in namespaces
    # host:port,... of the clients' listener when it is not --listen's (named listeners)
    client_bootstrap: str | None = None

    @property
    def bootstrap(self) -> str:
        return self.client_bootstrap or LocalCluster.bootstrap.fget(self)  # type: ignore[attr-defined]

    def live_brokers(self, exclude: tuple[int, ...] = ()) -> list[Node]:
        return [n for b, n in self.brokers.items() if n.alive() and b not in exclude]

    def topic(self, name: str, via: int | None = None, exclude: tuple[int, ...] = ()) -> dict:
        """The topic as one broker sees it (`via`, or the first live one that answers)."""
        nodes = [self.brokers[via]] if via is not None else self.live_brokers(exclude)
        for n in nodes:
            t = n.get(f"/api/v1/topics/{name}")
            if t and "partitions" in t:
                return t
        raise RuntimeError(f"no broker answered for topic {name}")

    def create_topic(
        self,
        name: str,
        partitions: int = 3,
        rf: int = 3,
        min_isr: int = 2,
        configs: dict[str, str] | None = None,
        wait: bool = True,
    ) -> None:
        """Create the topic and, with `wait`, wait until every ISR is full (a test whose
        replicas cannot all open waits for what it expects instead: a shrink may come
        before the first look)."""
        body = {
            "name": name,
            "partitions": partitions,
            "replication_factor": rf,
            "configs": {"min.insync.replicas": str(min_isr), **(configs or {})},
        }
        b = self.any_broker()
        request_sync(f"http://{b.host}:{b.http_port}", "POST", "/api/v1/topics", body)
        if wait:
            self.wait_isr(name, rf, timeout=30)

    def wait_isr(
        self, name: str, size: int, timeout: float = 30, exclude: tuple[int, ...] = ()
    ) -> dict:
        """Every partition has a leader and an ISR of `size` (as a live broker sees it)."""

        def ok() -> dict | None:
            try:
                t = self.topic(name, exclude=exclude)
            except RuntimeError:
                return None
            parts = t["partitions"]
            return t if all(p["leader"] >= 0 and len(p["isr"]) == size for p in parts) else None

        return wait_for(ok, timeout, f"{name}: every ISR of size {size}")

    def leader_of(self, name: str, partition: int, exclude: tuple[int, ...] = ()) -> int:
        return self.topic(name, exclude=exclude)["partitions"][partition]["leader"]

    def wait_new_leader(
        self, name: str, partition: int, old: int, timeout: float = 20
    ) -> tuple[int, float]:
        """(new leader, seconds) once a broker other than `old` reports another leader."""
        t0 = time.monotonic()

        def moved() -> int | None:
            try:
                leader = self.leader_of(name, partition, exclude=(old,))
            except RuntimeError:
                return None
            return leader if leader not in (old, -1) else None

        new = wait_for(moved, timeout, f"{name}-{partition}: a leader other than {old}")
        return int(new), time.monotonic() - t0  # type: ignore[arg-type]

    def wait_active_controller(self, exclude: int | None = None, timeout: float = 20) -> Node:
        def active() -> Node | None:
            n = self.active_controller()
            return n if n is not None and n.node_id != exclude else None

        return wait_for(active, timeout, "an active controller")  # type: ignore[return-value]

    def converge(self, name: str, timeout: float = 30) -> dict[int, int]:
        """Wait until every replica of every partition has the same log end offset and the
        leader's high watermark is there too; returns {partition: high watermark}."""

        def same() -> dict[int, int] | None:
            views = {b: n.get(f"/api/v1/topics/{name}") for b, n in self.brokers.items()}
            if not all(v and "partitions" in v for v in views.values()):
                return None
            hws: dict[int, int] = {}
            for p in views[next(iter(views))]["partitions"]:
                i = p["partition"]
                if len(p["isr"]) != len(p["replicas"]):
                    return None
                leos = {views[r]["partitions"][i]["log_end_offset"] for r in p["replicas"]}
                hw = views[p["leader"]]["partitions"][i]["high_watermark"]
                if len(leos) != 1 or hw not in leos:
                    return None
                hws[i] = hw
            return hws

        return wait_for(same, timeout, f"{name}: all replicas at one log end")

    def broker_log_count(self, bid: int, needle: str) -> int:
        try:
            with open(self.brokers[bid].log_path, errors="replace") as f:
                return sum(needle in line for line in f)
        except OSError:
            return 0


def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """The body of a `cluster` fixture: yields `make(brokers=3, netns=False, ...)`; the
    default arguments are the short timeouts above. Use as

        @pytest.fixture
        def cluster(tmp_path):
            yield from cluster_factory(tmp_path)
    """
    made: list[Cluster] = []

    def make(
        brokers: int = 3,
        netns: bool = False,
        log_level: str = "info",
        controller_args: list[str] | None = None,
        broker_args: list[str] | None = None,
        controllers: int = 3,
        node_prefix: dict[str, list[str]] | None = None,
        python: str | None = None,
    ) -> Cluster:
        """`python`: another release's interpreter (tests/test_upgrades.py) for every node."""
        hosts: dict[str, str] = {}
        prefix: dict[str, list[str]] = {}
        net = None
        if netns:
            import netns as nsmod

            nsmod.require_available()
            net = nsmod.BrokerNetwork(brokers)
            net.setup()
            for j in range(3):
                hosts[f"controller-{1001 + j}"] = net.gateway
            for i in range(1, brokers + 1):
                hosts[f"broker-{i}"] = net.host(i)
                prefix[f"broker-{i}"] = net.prefix(i)
        for name, cmd in (node_prefix or {}).items():  # run before the namespace's own
            prefix[name] = [*cmd, *prefix.get(name, [])]
        c = Cluster(
            str(tmp_path / f"cluster{len(made)}"),
            controllers=controllers,
            brokers=brokers,
            kafka_base=None,
            http_base=None,
            controller_base=None,
            broker_args=BROKER_ARGS if broker_args is None else broker_args,
            controller_args=CONTROLLER_ARGS if controller_args is None else controller_args,
            log_level=log_level,
            python=PYTHON,
            node_hosts=hosts,
            node_prefix=prefix,
        )
        c.net = net
        if python is not None:
            for n in c.nodes():
                # -P: this checkout (the working directory) must not shadow the release's
                # installed packages.
                n.args = [python, "-P", *n.args[1:]]
        made.append(c)
        c.start(wait_s=60)
        return c

    yield make
    for c in made:
        if c.net is not None:
            for i in range(1, c.net.brokers + 1):
                c.net.heal(i)
        try:
            c.stop()
        finally:
            if c.net is not None:
                c.net.teardown()


# -- producing -------------------------------------------------------------------------


@dataclass
class Workload:
    """Produces `prefix-<n>` values, partition n % partitions, paced, until stopped."""

    bootstrap: str
    topic: str
    partitions: int = 3
    prefix: str = "m"
    rate: float = 400.0  # messages per second, at most
    limit: int = 50_000
    client: dict[str, str] = field(default_factory=dict)  # security settings, say
    acked: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # value -> (p, offset)
    errors: Counter = field(default_factory=Counter)
    sent: int = 0
    fatal: str | None = None

    def __post_init__(self) -> None:
        from confluent_kafka import Producer

        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 60_000,
                "retry.backoff.ms": 100,
                "topic.metadata.refresh.interval.ms": 1000,
                "error_cb": self._on_error,
                **self.client,
            }
        )
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _on_error(self, err: object) -> None:
        if getattr(err, "fatal", lambda: False)():
            self.fatal = str(err)

    def _on_delivery(self, err: object, msg: object) -> None:
        with self._lock:
            if err is None:
                self.acked[msg.value()] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]
            else:
                self.errors[str(err.name())] += 1  # type: ignore[attr-defined]

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def start(self) -> Workload:
        self.thread.start()
        return self

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set() and self.sent < self.limit and self.fatal is None:
            n = self.sent
            value = f"{self.prefix}-{n}".encode()
            try:
                self.producer.produce(
                    self.topic,
                    value=value,
                    partition=n % self.partitions,
                    on_delivery=self._on_delivery,
                )
            except BufferError:
                self.producer.poll(0.05)
                continue
            self.sent += 1
            self.producer.poll(0)
            ahead = self.sent / self.rate - (time.monotonic() - t0)
            if ahead > 0:
                self.producer.poll(ahead)

    def wait_acked_growth(self, more: int, timeout: float) -> float:
        """Seconds until `more` further messages were acknowledged."""
        t0 = time.monotonic()
        target = self.acked_count() + more
        wait_for(lambda: self.acked_count() >= target, timeout, f"{more} more acks", 0.05)
        return time.monotonic() - t0

    def stop(self, flush_s: float = 60) -> None:
        self._stop.set()
        self.thread.join(10)
        left = self.producer.flush(flush_s)
        self.producer = None  # let librdkafka close its connections now
        assert left == 0, f"{left} messages neither acknowledged nor failed after {flush_s}s"


# -- checking --------------------------------------------------------------------------


def consume_all(
    bootstrap: str, topic: str, group: str, expect: int, timeout: float = 40
) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of everything a fresh group reads from the earliest,
    until `expect` records came or nothing new arrives for a while."""
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    c.subscribe([topic])
    out: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + timeout
    quiet_since = time.monotonic()
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                if len(out) >= expect and time.monotonic() - quiet_since > 2:
                    break
                continue
            out.append((m.partition(), m.offset(), m.value()))
            quiet_since = time.monotonic()
    finally:
        c.close()
    return out


def replica_logs(cluster: Cluster, topic: str, hws: dict[int, int]) -> dict[int, dict[int, list]]:
    """{partition: {broker: [batch bytes up to the HW]}}, read from the data directories
    (call after the cluster stopped)."""
    out: dict[int, dict[int, list]] = {}
    for p, hw in hws.items():
        out[p] = {}
        for bid in cluster.brokers:
            d = os.path.join(cluster.data_dir, f"broker-{bid}", "logs", f"{topic}-{p}")
            if not os.path.isdir(d):
                d = os.path.join(cluster.data_dir, f"broker-{bid}", f"{topic}-{p}")
            if not os.path.isdir(d):
                continue
            plog = PartitionLog(d, LogConfig())
            try:
                out[p][bid] = list(plog.batches(0, hw)) if hw > 0 else []
            finally:
                plog.close()
    return out


@dataclass
class Figures:
    scenario: str
    acked: int = 0
    failed: int = 0
    consumed: int = 0
    lost: int = 0
    duplicates: int = 0
    moved: int = 0  # acknowledged at one offset, found at another
    divergent_offsets: int = 0  # offsets holding different records on different replicas
    replicas_identical: bool = False
    extra: dict = field(default_factory=dict)

    def line(self) -> str:
        ex = " ".join(f"{k}={v}" for k, v in self.extra.items())
        return (
            f"[{self.scenario}] acked={self.acked} failed={self.failed} "
            f"consumed={self.consumed} lost={self.lost} duplicates={self.duplicates} "
            f"acked_offset_changed={self.moved} divergent_offsets={self.divergent_offsets} "
            f"replicas_identical_to_hw={self.replicas_identical} {ex}"
        ).strip()

    def ok(self) -> bool:
        return (
            self.lost == 0
            and self.duplicates == 0
            and self.moved == 0
            and self.divergent_offsets == 0
            and self.replicas_identical
        )


def compare_replicas(cluster: Cluster, topic: str, hws: dict[int, int]) -> tuple[bool, int]:
    """(every replica byte-identical up to the HW, holding each offset below it once;
    how many offsets hold different records on different replicas), from the data
    directories of a stopped cluster."""
    logs = replica_logs(cluster, topic, hws)
    identical = True
    divergent = 0
    for p, by_broker in logs.items():
        if len(by_broker) != len(cluster.brokers):
            identical = False
        batches = list(by_broker.values())
        if any(b != batches[0] for b in batches[1:]):
            identical = False
        # Record level: which offsets hold different values on different replicas.
        per_offset: dict[int, set] = {}
        for bl in batches:
            offsets = []
            for raw in bl:
                for rec in decode_batch(raw):
                    per_offset.setdefault(rec.offset, set()).add(rec.value)
                    offsets.append(rec.offset)
            # Each replica holds every offset below the HW, once (RF 3, no compaction).
            if [o for o in offsets if o < hws[p]] != list(range(hws[p])):
                identical = False
        divergent += sum(1 for vs in per_offset.values() if len(vs) > 1)
    return identical, divergent


def verify(cluster: Cluster, w: Workload, scenario: str, extra: dict | None = None) -> Figures:
    """Read everything back with a fresh group, wait for the replicas to converge, stop
    the cluster cleanly and compare the replicas' files. Prints and returns the figures."""
    f = Figures(scenario, extra=dict(extra or {}))
    f.acked = len(w.acked)
    f.failed = sum(w.errors.values())
    if w.errors:
        f.extra["errors"] = dict(w.errors)
    if w.fatal:
        f.extra["fatal"] = w.fatal
    got = consume_all(cluster.bootstrap, w.topic, f"verify-{scenario}", f.acked)
    f.consumed = len(got)
    values = Counter(v for _, _, v in got)
    f.duplicates = sum(n - 1 for n in values.values() if n > 1)
    f.lost = sum(1 for v in w.acked if v not in values)
    where = {v: (p, o) for p, o, v in got}
    f.moved = sum(1 for v, po in w.acked.items() if v in where and where[v] != po)
    hws = cluster.converge(w.topic)
    f.extra["hw"] = sum(hws.values())
    cluster.stop()
    identical, divergent = compare_replicas(cluster, w.topic, hws)
    f.divergent_offsets = divergent
    f.replicas_identical = identical
    print(f.line(), flush=True)
    return f


# Errors that mean "the partition's leader moved since the client's metadata": a Kafka
# client refreshes its metadata and asks again.
LEADER_MOVED = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError._TRANSPORT,
}


def high_watermark(consumer: Consumer, topic: str, partition: int, timeout: float = 60) -> int:
    """The partition's high watermark, asked again while its leadership moves (brokers
    restarted, the preferred leader taking it back); any other error fails at once."""

    def ask() -> tuple[int] | None:
        try:
            return (consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)[1],)
        except KafkaException as e:
            if e.args[0].code() in LEADER_MOVED:
                return None
            raise

    return wait_for(ask, timeout, f"the high watermark of {topic}-{partition}", 0.3)[0]
