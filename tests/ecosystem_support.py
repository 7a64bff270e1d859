"""Helpers for the stateful Kafka ecosystem tests (Kafka Streams, Kafka Connect and
MirrorMaker 2 from the Apache Kafka 4.4 jars, unchanged): long-running Java programs as
processes, the clusters they run against, and reading back what they wrote with
confluent-kafka.

- `JavaApp`: a Java main class of the 4.4 jar set as a process; its stdout lines are kept
  (the test waits on them), stdout and stderr also go to files next to the test's data;
  `stop()` (SIGTERM), `kill9()`, and `JavaApps`, the fixture-side list that kills what is
  left at teardown.
- `Backend` / `clusters`: a StraitMQ cluster (tests/cluster_support.py), or, with
  ECOSYSTEM_BROKERS=kafka in the environment, Apache Kafka 4.4 (bench/kafka_ref.py): the
  same tests against the reference broker tell a harness fault from StraitMQ's.
- `topic_config`, `create_topics`, `read_partition`, `committed`, `end_offsets`: the
  admin and read side, through librdkafka (a client the programs under test do not share).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from waiting import wait_for

from bench.javatools import ensure_jars, java_cmd

# JVM flags for the long-running programs: a small heap is plenty for a few hundred
# records, and the C1-only JIT starts faster on a loaded two-core machine.
APP_JVM_ARGS = ["-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"]


def _pdeathsig() -> None:  # in the child between fork and exec: die with the test process
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


class JavaApp:
    """One Java program (main class of the 4.4 jars or of .cache/jars/classes-4.4)."""

    def __init__(
        self,
        name: str,
        main_class: str,
        args: Sequence[object],
        logs: Path,
        log_level: str = "INFO",
        jvm_args: Sequence[str] = APP_JVM_ARGS,
    ) -> None:
        self.name = name
        logs.mkdir(parents=True, exist_ok=True)
        self.out_path = logs / f"{name}.out"
        self.err_path = logs / f"{name}.log"
        self._err = open(self.err_path, "ab")
        # Temporary files (RocksDB unpacks its native library there) stay with the test's.
        jvm = [*jvm_args, f"-Djava.io.tmpdir={logs}"]
        cmd = java_cmd(main_class, args, jvm_args=jvm, log_level=log_level, jars="4.4")
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
            # PR_SET_PDEATHSIG fires when the forking *thread* ends: only from the main one
            preexec_fn=_pdeathsig
            if threading.current_thread() is threading.main_thread()
            else None,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.out_path, "a") as out:
            for line in self.proc.stdout:
                out.write(line)
                out.flush()
                self.lines.append(line.rstrip("\n"))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        self._err.flush()
        try:
            err = self.err_path.read_text(errors="replace")
        except OSError:
            err = ""
        # The first errors and their causes say more than the shutdown noise at the end.
        errors = [
            line[:600]
            for line in err.splitlines()
            if " ERROR " in line or line.startswith("Caused by")
        ][:12]
        return (
            f"[{self.name} stdout]\n"
            + "\n".join(self.lines[-30:])
            + f"\n[{self.name} log, {self.err_path}: its first errors]\n"
            + "\n".join(errors)
            + "\n[its end]\n"
            + err[-chars:]
        )

    def check_alive(self) -> None:
        """For wait_for(check=...): fail at once when the program has exited."""
        if self.proc.poll() is not None:
            raise AssertionError(
                f"{self.name} exited with {self.proc.returncode}\n{self.log_tail()}"
            )

    def wait_line(self, pred: Callable[[str], bool], timeout: float, what: str) -> str:
        """The first stdout line for which pred holds (waiting up to timeout)."""

        def found() -> str | None:
            return next((line for line in list(self.lines) if pred(line)), None)

        return wait_for(found, timeout, f"{self.name}: {what}", 0.1, check=self.check_alive)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (the program's own shutdown hook closes it cleanly); its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
                raise AssertionError(
                    f"{self.name} did not stop in {timeout}s\n{self.log_tail()}"
                ) from None
        self._reader.join(10)
        self._err.close()
        return self.proc.returncode

    def kill9(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._reader.join(10)
        self._err.close()


class JavaApps(list):
    """The Java programs a test started; `close()` (the fixture's finalizer) kills any left."""

    def start(self, *args: object, **kwargs: object) -> JavaApp:
        app = JavaApp(*args, **kwargs)  # type: ignore[arg-type]
        self.append(app)
        return app

    def close(self) -> None:
        for app in self:
            app.kill9()


# -- the clusters ------------------------------------------------------------------------

BROKERS_ENV = "ECOSYSTEM_BROKERS"


def backend_kind() -> str:
    """'straitmq' (the default) or 'kafka' (ECOSYSTEM_BROKERS=kafka: Apache Kafka 4.4, to
    check the harness itself)."""
    kind = os.environ.get(BROKERS_ENV, "straitmq")
    if kind not in ("straitmq", "kafka"):
        raise ValueError(f"{BROKERS_ENV} must be 'straitmq' or 'kafka', not {kind!r}")
    return kind


@dataclass
class Backend:
    """A running cluster: its bootstrap, replication factor, where its logs are."""

    name: str
    bootstrap: str
    rf: int
    logs: str
    stop: Callable[[], None]
    cluster: object = None  # the tests.cluster_support.Cluster or bench.kafka_ref.KafkaRef


# The log cleaner looks for work twice a second rather than every 15 s (Kafka's default), so
# that a test can wait for a compacted topic to be cleaned.
CLEANER_BACKOFF_MS = 500


def start_kafka_ref(name: str, workdir: Path) -> Backend:
    from bench.kafka_ref import KafkaRef

    ensure_jars()
    ref = KafkaRef(
        workdir=workdir,
        log_level="INFO",
        extra_config={"num.partitions": 1, "log.cleaner.backoff.ms": CLEANER_BACKOFF_MS},
    )
    ref.start()
    return Backend(name, ref.bootstrap, 1, str(ref.server_log), ref.stop, ref)


def start_straitmq(name: str, make: Callable[..., object], brokers: int) -> Backend:
    """A StraitMQ cluster of `brokers` brokers from cluster_support's `make` (3 controllers),
    replication factor min(3, brokers) by default."""
    from cluster_support import BROKER_ARGS

    rf = min(3, brokers)
    args = [*BROKER_ARGS, "--log-cleaner-backoff-ms", str(CLEANER_BACKOFF_MS)]
    for flag in ("--default-replication-factor", "--offsets-topic-replication-factor"):
        args[args.index(flag) + 1] = str(rf)
    c = make(brokers=brokers, broker_args=args)
    logs = ", ".join(n.log_path for n in c.brokers.values())  # type: ignore[attr-defined]
    return Backend(name, c.bootstrap, rf, logs, c.stop, c)  # type: ignore[attr-defined]


@contextmanager
def clusters(root: Path) -> Iterator[Callable[[str, int], Backend]]:
    """Yields `start(name, brokers)`, which starts a StraitMQ cluster of that many brokers
    (or, with ECOSYSTEM_BROKERS=kafka, one Apache Kafka 4.4 broker); all of them are stopped
    when the block ends."""
    from cluster_support import cluster_factory

    ensure_jars()
    kind = backend_kind()
    factory = cluster_factory(root)
    make = next(factory)
    refs: list[Backend] = []

    def start(name: str, brokers: int) -> Backend:
        if kind == "kafka":
            refs.append(start_kafka_ref(name, root / name))
            return refs[-1]
        return start_straitmq(name, make, brokers)

    try:
        yield start
    finally:
        try:
            for b in refs:
                b.stop()
        finally:
            with suppress(StopIteration):
                next(factory)  # cluster_factory's teardown: stops every StraitMQ cluster


# -- admin and reading back ------------------------------------------------------------


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def create_topics(
    bootstrap: str, topics: dict[str, int], rf: int, config: dict[str, str] | None = None
) -> None:
    a = admin(bootstrap)  # held until the futures are done: they fail when it is freed
    futures = a.create_topics(
        [NewTopic(t, n, rf, config=dict(config or {})) for t, n in topics.items()]
    )
    for f in futures.values():
        f.result(30)


def topic_names(bootstrap: str) -> set[str]:
    return set(admin(bootstrap).list_topics(timeout=10).topics)


def topic_config(bootstrap: str, topic: str) -> dict[str, str]:
    """The topic's configs as DescribeConfigs answers them ({name: value})."""
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    a = admin(bootstrap)
    (fut,) = a.describe_configs([res]).values()
    return {k: v.value for k, v in fut.result(30).items()}


def partitions_of(bootstrap: str, topic: str) -> int:
    md = admin(bootstrap).list_topics(topic, timeout=10)
    t = md.topics[topic]
    if t.error is not None:
        raise KafkaException(t.error)
    return len(t.partitions)


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "ecosystem-probe"})
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions_of(bootstrap, topic))
        }
    finally:
        c.close()


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets on the topic (OffsetFetch; -1001 where none)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        c.close()


@dataclass(frozen=True)
class Rec:
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[tuple[str, bytes], ...] = ()


def read_partition(
    bootstrap: str, topic: str, partition: int, until: int, timeout: float = 30
) -> list[Rec]:
    """Every record of one partition from its start up to offset `until` (exclusive). The
    consumer's position, not the last record, says when it is there: the last offsets may
    be transaction markers (never delivered), or gone to compaction."""
    from confluent_kafka import OFFSET_BEGINNING

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "ecosystem-reader",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    tp = TopicPartition(topic, partition, OFFSET_BEGINNING)
    out: list[Rec] = []
    try:
        c.assign([tp])
        deadline = time.monotonic() + timeout
        while until > 0 and c.position([tp])[0].offset < until:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{topic}-{partition}: read {len(out)} records, the last at "
                    f"{out[-1].offset if out else None}, expected up to {until - 1}"
                )
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                raise KafkaException(m.error())
            headers = tuple(m.headers() or ())
            out.append(Rec(m.offset(), m.key(), m.value(), m.timestamp()[1], headers))
    finally:
        c.close()
    return out


def read_topic(bootstrap: str, topic: str, timeout: float = 30) -> dict[int, list[Rec]]:
    """Every record of every partition, up to the end offsets as they are now."""
    ends = end_offsets(bootstrap, topic)
    return {p: read_partition(bootstrap, topic, p, end, timeout) for p, end in ends.items()}
