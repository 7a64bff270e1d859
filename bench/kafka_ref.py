"""A real Apache Kafka broker (4.4 by default) for reference runs (tests and benchmarks).

    from bench.kafka_ref import KafkaRef
    with KafkaRef(19092) as k:          # or KafkaRef() for a free port
        print(k.bootstrap)              # "127.0.0.1:19092"

The broker runs from the jars fetched by scripts/fetch-jars.sh (.cache/jars/kafka-4.4/; with
kafka_version="3.9" from .cache/jars/kafka-3.9/), in KRaft combined mode
(process.roles=broker,controller, node.id=1, one static voter), listening on 127.0.0.1 only,
with its data and logs in a temporary folder that is removed at the end (keep=True keeps it).
`KafkaBroker` is another name for `KafkaRef`.

Main classes used (same names in the 3.9 and 4.4 jars, kafka_2.13):
  kafka.tools.StorageTool   `kafka-storage.sh format -t <cluster-id> -c server.properties`
  kafka.Kafka               `kafka-server-start.sh server.properties`
JVM flags mirror bin/kafka-server-start.sh + kafka-run-class.sh: -Xmx1g -Xms1g, G1 with
MaxGCPauseMillis=20, InitiatingHeapOccupancyPercent=35, ExplicitGCInvokesConcurrent.
Logging: Kafka 4 logs through Log4j 2 (a log4j2.xml written next to server.properties, passed
with -Dlog4j2.configurationFile); Kafka 3.9 through log4j 1 / reload4j (log4j.properties).
Both write logs/server.log (and logs/kafka-request.log with request_log=True).

The quorum is static (controller.quorum.voters + `format --cluster-id`), which Kafka 4.4 still
supports next to the dynamic quorum of KIP-853 (--standalone / --initial-controllers): every
node is formatted alike, and a voter set fixed in the config is what bench/failover.py kills
and restarts controllers against.

Readiness: the port accepts TCP connections AND a Metadata (v1) request answers with >= 1 broker.
Standard library only (the readiness probe speaks the Kafka protocol over a raw socket).

Command line (for manual runs):  python -m bench.kafka_ref [--port 19092] [--keep] [--version 3.9]

KafkaCluster (further down) runs a multi-node KRaft cluster the same way: 3 dedicated
controllers + N brokers, separate JVMs, with kill9()/restart() per node and active_controller()
from a raw DescribeQuorum request (describe_quorum_probe) -- used by bench/failover.py and
bench/cluster_throughput.py.
"""

from __future__ import annotations

import atexit
import base64
import ctypes
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from xml.sax.saxutils import quoteattr

from straitmq.cli.local_cluster import free_port

from bench.javatools import (
    JAR_SETS,
    KAFKA_JVM_PERFORMANCE_OPTS,
    KAFKA_MAIN,
    REF_KAFKA,
    STORAGE_TOOL,
    java_cmd,
)

BROKER_JVM_ARGS = ["-Xmx1g", "-Xms1g", *KAFKA_JVM_PERFORMANCE_OPTS]

_LOG4J = """\
log4j.rootLogger={level}, kafkaAppender
log4j.appender.kafkaAppender=org.apache.log4j.FileAppender
log4j.appender.kafkaAppender.File={logdir}/server.log
log4j.appender.kafkaAppender.layout=org.apache.log4j.PatternLayout
log4j.appender.kafkaAppender.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger={request_level}, requestAppender
log4j.additivity.kafka.request.logger=false
log4j.appender.requestAppender=org.apache.log4j.FileAppender
log4j.appender.requestAppender.File={logdir}/kafka-request.log
log4j.appender.requestAppender.layout=org.apache.log4j.PatternLayout
log4j.appender.requestAppender.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.org.apache.kafka.raft=WARN
log4j.logger.org.apache.kafka.controller=INFO
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.log.LogCleaner=WARN
"""

# Kafka 4.x: Log4j 2 (the same loggers and files as _LOG4J above; no console output)
_LOG4J2 = """\
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <File name="kafkaAppender" fileName={server_log}>
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
    <File name="requestAppender" fileName={request_log} createOnDemand="true">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </File>
  </Appenders>
  <Loggers>
    <Root level="{level}">
      <AppenderRef ref="kafkaAppender"/>
    </Root>
    <Logger name="kafka.request.logger" level="{request_level}" additivity="false">
      <AppenderRef ref="requestAppender"/>
    </Logger>
    <Logger name="org.apache.kafka.raft" level="WARN"/>
    <Logger name="org.apache.kafka.controller" level="INFO"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="kafka.log.LogCleaner" level="WARN"/>
  </Loggers>
</Configuration>
"""


def _check_version(kafka_version: str) -> str:
    if kafka_version not in JAR_SETS:
        raise ValueError(f"kafka_version must be one of {sorted(JAR_SETS)}, not {kafka_version!r}")
    return kafka_version


def write_log_config(
    folder: Path, logdir: Path, kafka_version: str, level: str, request_level: str
) -> list[str]:
    """Write the logging configuration of one Kafka process into `folder` (log4j.properties
    for 3.9, log4j2.xml for 4.x) and return the JVM flags that make Kafka use it."""
    if kafka_version == "3.9":
        f = folder / "log4j.properties"
        f.write_text(_LOG4J.format(level=level, logdir=logdir, request_level=request_level))
        return [f"-Dlog4j.configuration=file:{f}", f"-Dkafka.logs.dir={logdir}"]
    f = folder / "log4j2.xml"
    f.write_text(
        _LOG4J2.format(
            level=level,
            request_level=request_level,
            server_log=quoteattr(str(logdir / "server.log")),
            request_log=quoteattr(str(logdir / "kafka-request.log")),
        )
    )
    return [f"-Dlog4j2.configurationFile={f}", f"-Dkafka.logs.dir={logdir}"]


def random_cluster_id() -> str:
    """Kafka Uuid text form: URL-safe base64 of 16 random bytes without padding (22 chars).

    Like Kafka's Uuid.randomUuid(), never starts with '-' (a command line would take it for an
    option)."""
    while True:
        s = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not s.startswith("-"):
            return s


def metadata_probe(host: str, port: int, timeout: float = 2.0) -> list[tuple[int, str, int]]:
    """Send a Metadata v1 request (no topics) and return the brokers [(node_id, host, port)].

    Raises OSError / ValueError when the broker does not answer properly.
    """
    client_id = b"straitmq-probe"
    corr = 0x5EED
    # request header v1: api_key=3 (Metadata), api_version=1, correlation_id, client_id
    # body v1: topics = empty array (0 topics; -1 would mean "all topics")
    body = struct.pack(">hhih", 3, 1, corr, len(client_id)) + client_id + struct.pack(">i", 0)
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", _recv_exact(s, 4))[0]
        if size < 8 or size > 10_000_000:
            raise ValueError(f"bad response size {size}")
        data = _recv_exact(s, size)
    got_corr, n = struct.unpack_from(">ii", data, 0)
    if got_corr != corr:
        raise ValueError(f"correlation id mismatch {got_corr} != {corr}")
    pos = 8
    brokers = []
    for _ in range(n):
        node_id, hlen = struct.unpack_from(">ih", data, pos)
        pos += 6
        bhost = data[pos : pos + hlen].decode()
        pos += hlen
        (bport,) = struct.unpack_from(">i", data, pos)
        pos += 4
        (rlen,) = struct.unpack_from(">h", data, pos)  # rack (nullable string)
        pos += 2 + max(rlen, 0)
        brokers.append((node_id, bhost, bport))
    return brokers


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return bytes(buf)


def wait_for_broker(
    host: str, port: int, timeout: float = 60.0, proc: subprocess.Popen | None = None
) -> list[tuple[int, str, int]]:
    """Wait (bounded) until ``host:port`` answers a Metadata request listing >= 1 broker."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"broker process exited with code {proc.returncode}")
        try:
            brokers = metadata_probe(host, port, timeout=2.0)
            if brokers:
                return brokers
            last = ValueError("metadata lists no broker yet")
        except (OSError, ValueError, struct.error) as e:
            last = e
        time.sleep(0.2)
    raise TimeoutError(f"{host}:{port} not ready after {timeout:.0f}s (last error: {last!r})")


def stop_process(proc: subprocess.Popen | None, grace_s: float = 30) -> None:
    """SIGTERM, then SIGKILL after `grace_s`: a broker a benchmark or test started."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: die with the parent
    except Exception:
        pass


# Single brokers and clusters still running; stopped if the interpreter exits first.
_live: weakref.WeakSet[KafkaRef | KafkaCluster] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for k in list(_live):
        try:
            k.stop()
        except Exception:
            pass


class KafkaRef:
    """Apache Kafka broker (KRaft combined mode) on 127.0.0.1, as a context manager.

    Kafka 4.4 (REF_KAFKA) unless kafka_version="3.9".

    port:            client listener port (None: a free port)
    controller_port: KRaft controller listener port (None: a free port)
    extra_config:    server.properties overrides, e.g. {"num.partitions": "3"}
    workdir:         where data/ and logs/ go (None: a new temp dir, removed on stop unless keep)
    request_log:     log every request (header with api key/version, timings) at DEBUG into
                     logs/kafka-request.log, see request_versions(): what real clients send
    kafka_version:   "4.4" (default: .cache/jars/kafka-4.4) or "3.9" (.cache/jars/kafka-3.9)
    """

    def __init__(
        self,
        port: int | None = None,
        controller_port: int | None = None,
        *,
        host: str = "127.0.0.1",
        extra_config: Mapping[str, object] | None = None,
        workdir: str | os.PathLike | None = None,
        keep: bool = False,
        jvm_args: list[str] | None = None,
        log_level: str = "INFO",
        request_log: bool = False,
        startup_timeout: float = 120.0,
        stop_timeout: float = 30.0,
        kafka_version: str = REF_KAFKA,
    ):
        self.kafka_version = _check_version(kafka_version)
        self.host = host
        self.port = port or free_port(host)
        self.controller_port = controller_port or free_port(host)
        while self.controller_port == self.port:
            self.controller_port = free_port(host)
        self.extra_config = dict(extra_config or {})
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else None
        self.keep = keep
        self.jvm_args = list(jvm_args or BROKER_JVM_ARGS)
        self.log_level = log_level
        self.request_log = request_log
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.cluster_id = random_cluster_id()
        self.proc: subprocess.Popen | None = None
        self._stdout = None

    # -- info ---------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def server_log(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "logs" / "server.log"

    def log_tail(self, n: int = 60) -> str:
        out = []
        for f in (self.workdir / "logs" / "stdout.log", self.server_log) if self.workdir else ():
            try:
                lines = f.read_text(errors="replace").splitlines()[-n:]
                out.append(f"--- {f} (last {len(lines)} lines)\n" + "\n".join(lines))
            except OSError:
                pass
        return "\n".join(out)

    def request_versions(self) -> dict[int, set[int]]:
        """With request_log=True: {api_key: {api versions seen}} of every request so far."""
        assert self.workdir is not None
        seen: dict[int, set[int]] = {}
        try:
            text = (self.workdir / "logs" / "kafka-request.log").read_text(errors="replace")
        except OSError:
            return seen
        for m in re.finditer(r'"requestApiKey":(\d+),"requestApiVersion":(\d+)', text):
            seen.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
        return seen

    def server_properties(self) -> dict[str, str]:
        assert self.workdir is not None
        h, p, c = self.host, self.port, self.controller_port
        props: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@{h}:{c}",
            "listeners": f"PLAINTEXT://{h}:{p},CONTROLLER://{h}:{c}",
            "advertised.listeners": f"PLAINTEXT://{h}:{p}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.workdir / "data"),
            "num.network.threads": 3,
            "num.io.threads": 8,
            "num.partitions": 1,
            "default.replication.factor": 1,
            "offsets.topic.replication.factor": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            "auto.create.topics.enable": "true",
            "log.retention.hours": 168,
            "log.segment.bytes": 1073741824,
        }
        props.update(self.extra_config)
        return {k: str(v) for k, v in props.items()}

    # -- lifecycle ----------------------------------------------------------
    def start(self) -> KafkaRef:
        if self.proc is not None:
            return self
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="kafka-ref-"))
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        (self.workdir / "data").mkdir(exist_ok=True)
        cfg = self.workdir / "server.properties"
        cfg.write_text("".join(f"{k}={v}\n" for k, v in self.server_properties().items()))
        log_args = write_log_config(
            self.workdir,
            logs,
            self.kafka_version,
            level=self.log_level,
            request_level="DEBUG" if self.request_log else "WARN",
        )

        # 1. format the storage (kafka-storage.sh format)
        fmt = java_cmd(
            STORAGE_TOOL,
            ["format", f"--cluster-id={self.cluster_id}", "--config", str(cfg)],
            jvm_args=["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", *log_args],
            include_classes=False,
            jars=self.kafka_version,
        )
        r = subprocess.run(
            fmt, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120
        )
        if r.returncode != 0:
            self.stop()
            raise RuntimeError(f"StorageTool format failed ({r.returncode}):\n{r.stdout[-3000:]}")

        # 2. start the broker
        cmd = java_cmd(
            KAFKA_MAIN,
            [str(cfg)],
            jvm_args=[*self.jvm_args, *log_args],
            include_classes=False,
            jars=self.kafka_version,
        )
        self._stdout = open(logs / "stdout.log", "wb")
        in_main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._stdout,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
            preexec_fn=_pdeathsig if in_main and sys.platform == "linux" else None,
        )
        _live.add(self)
        try:
            wait_for_broker(self.host, self.port, timeout=self.startup_timeout, proc=self.proc)
        except Exception as e:
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"Kafka did not start on {self.bootstrap}: {e}\n{tail}") from e
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        stop_process(proc, self.stop_timeout)  # SIGTERM: Kafka's controlled shutdown
        if self._stdout is not None:
            self._stdout.close()
            self._stdout = None
        _live.discard(self)
        if self._own_workdir and not self.keep and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> KafkaRef:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.proc is not None and self.proc.poll() is None else "stopped"
        return f"KafkaRef({self.kafka_version}, {self.bootstrap}, {state}, workdir={self.workdir})"


KafkaBroker = KafkaRef  # the name bench docs use for the single-node reference broker


# ---------------------------------------------------------------- multi-node cluster


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    shift = n = 0
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7


def _skip_tagged(data: bytes, pos: int) -> int:
    count, pos = _read_uvarint(data, pos)
    for _ in range(count):
        _tag, pos = _read_uvarint(data, pos)
        size, pos = _read_uvarint(data, pos)
        pos += size
    return pos


def describe_quorum_probe(host: str, port: int, timeout: float = 1.0) -> dict:
    """Send DescribeQuorum v0 (api key 55) for __cluster_metadata-0 to a KRaft controller.

    Returns {"error_code", "leader_id", "leader_epoch", "high_watermark",
    "voters": [(replica_id, log_end_offset)]}. Only the Raft leader answers with error 0;
    the other voters answer NOT_LEADER_OR_FOLLOWER (6). Raises OSError / ValueError when the
    node does not answer.
    """
    corr = 0x5EEE
    client_id = b"straitmq-quorum-probe"
    topic = b"__cluster_metadata"
    header = struct.pack(">hhih", 55, 0, corr, len(client_id)) + client_id + b"\x00"
    body = (
        _uvarint(2)  # topics: compact array of 1
        + _uvarint(len(topic) + 1)
        + topic
        + _uvarint(2)  # partitions: compact array of 1
        + struct.pack(">i", 0)
        + b"\x00"  # partition tagged fields
        + b"\x00"  # topic tagged fields
        + b"\x00"  # request tagged fields
    )
    req = header + body
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(struct.pack(">i", len(req)) + req)
        size = struct.unpack(">i", _recv_exact(s, 4))[0]
        if size < 6 or size > 1_000_000:
            raise ValueError(f"bad response size {size}")
        data = _recv_exact(s, size)
    (got_corr,) = struct.unpack_from(">i", data, 0)
    if got_corr != corr:
        raise ValueError(f"correlation id mismatch {got_corr} != {corr}")
    pos = _skip_tagged(data, 4)  # response header v1
    (err,) = struct.unpack_from(">h", data, pos)
    pos += 2
    res: dict = {"error_code": err, "leader_id": -1, "leader_epoch": -1, "voters": []}
    if err:
        return res
    ntopics, pos = _read_uvarint(data, pos)
    if ntopics < 2:
        return res
    nlen, pos = _read_uvarint(data, pos)
    pos += nlen - 1
    nparts, pos = _read_uvarint(data, pos)
    if nparts < 2:
        return res
    _pidx, perr, leader, epoch, hw = struct.unpack_from(">ihiiq", data, pos)
    pos += 22
    res.update(error_code=perr, leader_id=leader, leader_epoch=epoch, high_watermark=hw)
    if perr:
        return res
    nvoters, pos = _read_uvarint(data, pos)
    for _ in range(nvoters - 1):
        rid, leo = struct.unpack_from(">iq", data, pos)
        pos += 12
        pos = _skip_tagged(data, pos)
        res["voters"].append((rid, leo))
    return res


CLUSTER_BROKER_JVM_ARGS = ["-Xmx512m", "-Xms512m", *KAFKA_JVM_PERFORMANCE_OPTS]
CLUSTER_CONTROLLER_JVM_ARGS = ["-Xmx384m", "-Xms384m", *KAFKA_JVM_PERFORMANCE_OPTS]


class KafkaNode:
    """One process of a KafkaCluster (a broker or a controller), with its own folder."""

    def __init__(self, cluster: KafkaCluster, node_id: int, role: str, port: int):
        self.cluster = cluster
        self.node_id = node_id
        self.role = role  # "broker" | "controller"
        self.port = port  # client listener (broker) or CONTROLLER listener (controller)
        self.dir = cluster.workdir / f"{role}-{node_id}"
        self._log_jvm_args: list[str] = []
        self.proc: subprocess.Popen | None = None
        self._stdout = None

    @property
    def name(self) -> str:
        return f"{self.role}-{self.node_id}"

    @property
    def config_path(self) -> Path:
        return self.dir / "server.properties"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def write_config(self) -> None:
        c = self.cluster
        (self.dir / "logs").mkdir(parents=True, exist_ok=True)
        (self.dir / "data").mkdir(exist_ok=True)
        props: dict[str, object] = {
            "node.id": self.node_id,
            "controller.quorum.voters": c.voters,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.dir / "data"),
            "num.network.threads": 3,
            "num.io.threads": 8,
        }
        if self.role == "controller":
            props.update(
                {
                    "process.roles": "controller",
                    "listeners": f"CONTROLLER://{c.host}:{self.port}",
                }
            )
            props.update(c.controller_config)
        else:
            props.update(
                {
                    "process.roles": "broker",
                    "listeners": f"PLAINTEXT://{c.host}:{self.port}",
                    "advertised.listeners": f"PLAINTEXT://{c.host}:{self.port}",
                    "inter.broker.listener.name": "PLAINTEXT",
                    "num.partitions": 1,
                    "default.replication.factor": min(3, len(c.brokers) or 3),
                    "offsets.topic.replication.factor": min(3, len(c.brokers) or 3),
                    "transaction.state.log.replication.factor": min(3, len(c.brokers) or 3),
                    "transaction.state.log.min.isr": 1,
                    "group.initial.rebalance.delay.ms": 0,
                    "auto.create.topics.enable": "true",
                    "log.segment.bytes": 1073741824,
                }
            )
            props.update(c.broker_config)
            if c.broker_config_for is not None:
                props.update(c.broker_config_for(self))
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        self._log_jvm_args = write_log_config(
            self.dir, self.dir / "logs", c.kafka_version, level=c.log_level, request_level="WARN"
        )

    def _log_args(self) -> list[str]:
        return list(self._log_jvm_args)

    def format_cmd(self) -> list[str]:
        return java_cmd(
            STORAGE_TOOL,
            ["format", f"--cluster-id={self.cluster.cluster_id}", "--config", self.config_path],
            jvm_args=["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", *self._log_args()],
            include_classes=False,
            jars=self.cluster.kafka_version,
        )

    def start(self) -> None:
        """Start the process (the storage must be formatted already); does not wait."""
        if self.alive():
            return
        jvm = (
            self.cluster.controller_jvm_args
            if self.role == "controller"
            else (self.cluster.broker_jvm_args)
        )
        cmd = java_cmd(
            KAFKA_MAIN,
            [self.config_path],
            jvm_args=[*jvm, *self._log_args()],
            include_classes=False,
            jars=self.cluster.kafka_version,
        )
        if self._stdout is not None:
            self._stdout.close()
        self._stdout = open(self.dir / "logs" / "stdout.log", "ab")
        in_main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._stdout,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.dir,
            preexec_fn=_pdeathsig if in_main and sys.platform == "linux" else None,
        )

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self, timeout: float = 30.0) -> None:
        stop_process(self.proc, timeout)
        if self._stdout is not None:
            self._stdout.close()
            self._stdout = None

    def log_tail(self, n: int = 40) -> str:
        out = []
        for f in (self.dir / "logs" / "stdout.log", self.dir / "logs" / "server.log"):
            try:
                lines = f.read_text(errors="replace").splitlines()[-n:]
                out.append(f"--- {f} (last {len(lines)} lines)\n" + "\n".join(lines))
            except OSError:
                pass
        return "\n".join(out)


class KafkaCluster:
    """Apache Kafka (4.4 by default, kafka_version="3.9" for the old one) in KRaft mode as
    separate processes: `controllers` dedicated controllers (node ids 1001, 1002, ...;
    process.roles=controller, static voters in controller.quorum.voters, every node formatted
    with the same --cluster-id) and `brokers` brokers (node ids 1, 2, ...), each with its own
    folder under one temp dir.

        with KafkaCluster(broker_config={"broker.heartbeat.interval.ms": 300}) as kc:
            kc.bootstrap                  # "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
            kc.active_controller()        # node id of the Raft leader (active controller)
            kc.brokers[2].kill9(); kc.restart(2)

    broker_config / controller_config: server.properties overrides per role (broker_config_for:
    per broker, called with its KafkaNode, applied last); with none, every
    timeout is Kafka's default (broker.session.timeout.ms 9000, broker.heartbeat.interval.ms
    2000, controller.quorum.election.timeout.ms 1000, controller.quorum.fetch.timeout.ms 2000,
    replica.lag.time.max.ms 30000).
    """

    CONTROLLER_ID_BASE = 1000

    def __init__(
        self,
        controllers: int = 3,
        brokers: int = 3,
        *,
        host: str = "127.0.0.1",
        broker_config: Mapping[str, object] | None = None,
        controller_config: Mapping[str, object] | None = None,
        workdir: str | os.PathLike | None = None,
        keep: bool = False,
        broker_jvm_args: list[str] | None = None,
        controller_jvm_args: list[str] | None = None,
        log_level: str = "INFO",
        startup_timeout: float = 180.0,
        kafka_version: str = REF_KAFKA,
        broker_config_for: Callable[[KafkaNode], Mapping[str, object]] | None = None,
    ):
        self.kafka_version = _check_version(kafka_version)
        self.host = host
        self.broker_config = dict(broker_config or {})
        # per-broker overrides on top of broker_config (each broker's own listener ports)
        self.broker_config_for = broker_config_for
        self.controller_config = dict(controller_config or {})
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="kafka-cluster-"))
        self.keep = keep
        self.broker_jvm_args = list(broker_jvm_args or CLUSTER_BROKER_JVM_ARGS)
        self.controller_jvm_args = list(controller_jvm_args or CLUSTER_CONTROLLER_JVM_ARGS)
        self.log_level = log_level
        self.startup_timeout = startup_timeout
        self.cluster_id = random_cluster_id()
        used: set[int] = set()

        def port() -> int:
            while True:
                p = free_port(host)
                if p not in used:
                    used.add(p)
                    return p

        self.controllers: dict[int, KafkaNode] = {}
        self.brokers: dict[int, KafkaNode] = {}
        for j in range(controllers):
            nid = self.CONTROLLER_ID_BASE + j + 1
            self.controllers[nid] = KafkaNode(self, nid, "controller", port())
        for i in range(1, brokers + 1):
            self.brokers[i] = KafkaNode(self, i, "broker", port())
        self.voters = ",".join(f"{n.node_id}@{host}:{n.port}" for n in self.controllers.values())

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.host}:{b.port}" for b in self.brokers.values())

    def nodes(self) -> list[KafkaNode]:
        return [*self.controllers.values(), *self.brokers.values()]

    def node(self, node_id: int) -> KafkaNode:
        return self.brokers.get(node_id) or self.controllers[node_id]

    def start(self) -> KafkaCluster:
        _live.add(self)
        try:
            for n in self.nodes():
                n.write_config()
            fmts = [
                subprocess.Popen(
                    n.format_cmd(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                )
                for n in self.nodes()
            ]
            for n, f in zip(self.nodes(), fmts, strict=True):
                out, _ = f.communicate(timeout=180)
                if f.returncode != 0:
                    raise RuntimeError(f"StorageTool format of {n.name} failed:\n{out[-3000:]}")
            for n in self.nodes():
                n.start()
            self.wait_ready()
        except BaseException:
            tails = "\n".join(n.log_tail(20) for n in self.nodes())
            self.stop()
            raise RuntimeError(f"Kafka cluster did not start:\n{tails[-6000:]}") from None
        return self

    def wait_ready(self, timeout: float | None = None, brokers: list[int] | None = None) -> None:
        """Wait until every (listed) broker answers Metadata listing all live brokers."""
        deadline = time.monotonic() + (timeout or self.startup_timeout)
        want = brokers if brokers is not None else list(self.brokers)
        live = [b for b, n in self.brokers.items() if n.alive()]
        while True:
            for n in self.nodes():
                if (
                    n.proc is not None
                    and n.proc.poll() is not None
                    and n.node_id in (*want, *self.controllers)
                ):
                    raise RuntimeError(f"{n.name} exited with {n.proc.returncode}")
            ok = True
            for b in want:
                try:
                    seen = metadata_probe(self.host, self.brokers[b].port, timeout=2.0)
                except (OSError, ValueError, struct.error):
                    ok = False
                    break
                if not set(live) <= {nid for nid, _h, _p in seen}:
                    ok = False
                    break
            if ok:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kafka brokers {want} not ready")
            time.sleep(0.2)

    def restart(self, node_id: int, wait: bool = True) -> None:
        n = self.node(node_id)
        n.start()
        if wait and n.role == "broker":
            self.wait_ready(brokers=[node_id])

    def quorum(self, timeout: float = 0.5) -> dict | None:
        """DescribeQuorum answer of the Raft leader among the live controllers (None: none)."""
        for n in self.controllers.values():
            if not n.alive():
                continue
            try:
                r = describe_quorum_probe(self.host, n.port, timeout=timeout)
            except (OSError, ValueError, struct.error, IndexError):
                continue
            if r["error_code"] == 0:
                r["answered_by"] = n.node_id
                return r
        return None

    def active_controller(self, timeout: float = 0.5) -> int | None:
        """Node id of the active controller (the Raft leader that says so itself)."""
        q = self.quorum(timeout)
        if q is not None and q["leader_id"] == q["answered_by"]:
            return q["leader_id"]
        return None

    def stop(self) -> None:
        for n in self.brokers.values():
            if n.alive():
                n.proc.terminate()
        for n in self.brokers.values():
            n.stop()
        for n in self.controllers.values():
            n.stop()
        _live.discard(self)
        if self._own_workdir and not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        description="Run a reference Apache Kafka broker (default 4.4) until Ctrl-C."
    )
    ap.add_argument("--version", default=REF_KAFKA, choices=sorted(JAR_SETS))
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--controller-port", type=int, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work dir (data and logs)")
    ap.add_argument(
        "--seconds", type=float, default=3600, help="stop after this long (default 1 h)"
    )
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    with KafkaRef(a.port, a.controller_port, keep=a.keep, kafka_version=a.version) as k:
        print(
            f"Kafka {k.kafka_version} ready on {k.bootstrap} in {time.monotonic() - t0:.1f}s "
            f"(workdir {k.workdir})",
            file=sys.stderr,
            flush=True,
        )
        print(k.bootstrap, flush=True)
        try:
            time.sleep(a.seconds)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
