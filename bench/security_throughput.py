"""Produce and consume throughput and broker CPU per GB over PLAINTEXT, SSL and SASL_SSL:
StraitMQ (one broker) beside Apache Kafka 4.4 (one KRaft combined broker, bench/kafka_ref.py),
both configured the same way and both up for the whole run (issue 15; not a pytest test).

    python -m bench.security_throughput [--repeat 3] [--num-records 1000000] [--rf 3]

Each broker has three listeners on 127.0.0.1, one per protocol:

  PLAINTEXT   no encryption, no authentication
  SSL         TLS (server certificate only, no client certificates)
  SASL_SSL    TLS + SASL SCRAM-SHA-512 (user "bench", 8192 iterations, created with
              AlterUserScramCredentials through confluent_kafka's AdminClient)

Both use the same certificates, made with the openssl CLI in a temporary folder: a
self-signed CA and a server certificate for 127.0.0.1/localhost, both EC P-256 (ECDSA; a PEM
file with the PKCS#8 key and the certificate: StraitMQ's ssl.keystore.location, Kafka's
ssl.keystore.type=PEM). The cipher suite is whatever OpenSSL (librdkafka's and the broker's)
and the JVM negotiate by default: TLS 1.3 with AES-GCM on both in practice.

--rf 3 runs 3 controllers + 3 brokers of each instead (StraitMQ: straitmq.cli.local_cluster;
Kafka: bench.kafka_ref.KafkaCluster, KRaft), every broker with the three listeners and
replicating over its SSL listener (inter.broker.listener.name=SSL, the same CA as
truststore), topics with min.insync.replicas 2 and the producer at acks=all; the CPU is the
three brokers' together (controllers left out, as on both they are idle in a steady load).

For each system x protocol (each round a new topic of --partitions partitions (default 3),
RF --rf, created over PLAINTEXT and deleted afterwards):

  produce   librdkafka (confluent_kafka) producer, N x 1 KiB random records, acks=1 (--acks),
            linger 5 ms, no compression, as fast as it goes (until every record is acknowledged)
  consume   a librdkafka consumer reads them back from the beginning (assign(), no group join)

reporting MB/s (MB = 2^20 bytes) and the broker process's CPU seconds (user + system, from
/proc/<pid>/stat, all threads) per GB (10^9 bytes of record values) for each phase; the client
process's CPU per GB too (it shares the machine). Rounds interleave the systems (order flipped
every round) and the protocols (order rotated every round), so background noise hits both
alike; the table shows per-metric medians, then the ratios SSL/PLAINTEXT and
SASL_SSL/PLAINTEXT within each system and StraitMQ/Kafka per protocol. Each system first gets
an unreported warm-up over every protocol (a JVM broker must not be measured cold).

Output: the table (markdown; MB/s cells show the rounds' min-max too, to show the noise) and
a JSON dump of every round (default .cache/bench/security-throughput-<timestamp>.json);
`--report JSON` prints an earlier run's table again. Exit code 0 when every phase ran.
"""

from __future__ import annotations

import abc
import argparse
import datetime as _dt
import json
import os
import resource
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # allow `python bench/security_throughput.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from straitmq.cli.local_cluster import LocalCluster, free_port

from bench.javatools import REPO_ROOT
from bench.kafka_ref import KafkaCluster, KafkaNode, KafkaRef
from bench.latency import create_topic, delete_topic
from bench.strait_ref import StraitRef
from bench.throughput import process_cpu_s, send_all

MB = 1024 * 1024
PROTOCOLS = ["PLAINTEXT", "SSL", "SASL_SSL"]
USER, PASSWORD, ITERATIONS = "bench", "bench-secret", 8192
HOST = "127.0.0.1"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- certificates ----------------------------------------------------------------------


def _openssl(cwd: Path, *args: str) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"openssl {' '.join(args)}: {r.stderr}")


def make_certs(d: Path) -> tuple[Path, Path]:
    """ca.pem (self-signed) and server.pem (PKCS#8 key + certificate for 127.0.0.1 and
    localhost, signed by ca), both EC P-256. Returns (ca.pem, server.pem)."""
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        d,
        "req",
        "-x509",
        "-new",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=bench-ca",
    )
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        d,
        "req",
        "-new",
        *ec,
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    )
    _openssl(
        d,
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    )
    pem = d / "server.pem"
    pem.write_text((d / "server.key").read_text() + (d / "server.crt").read_text())
    return d / "ca.pem", pem


# -- the two systems -------------------------------------------------------------------


class System(abc.ABC):
    """One broker (rf 1) or three (rf 3), each with a PLAINTEXT, an SSL and a SASL_SSL
    listener (the kinds below say how to run each)."""

    name = ""

    def __init__(self, workdir: Path, ca: Path, server_pem: Path, brokers: int = 1) -> None:
        self.workdir, self.ca, self.server_pem = workdir, ca, server_pem
        # one {protocol: port} per broker
        self.ports = [{p: free_port() for p in PROTOCOLS} for _ in range(brokers)]

    @abc.abstractmethod
    def broker_pids(self) -> list[int]: ...

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    def listeners(self, broker: int = 0) -> str:
        return ",".join(f"{p}://{HOST}:{port}" for p, port in self.ports[broker].items())

    def servers(self, protocol: str) -> str:
        return ",".join(f"{HOST}:{ports[protocol]}" for ports in self.ports)

    @property
    def bootstrap(self) -> str:
        """PLAINTEXT bootstrap (topic admin: bench.latency's create_topic/delete_topic)."""
        return self.servers("PLAINTEXT")

    def conf(self, protocol: str) -> dict[str, Any]:
        c: dict[str, Any] = {
            "bootstrap.servers": self.servers(protocol),
            "security.protocol": protocol,
            "log_level": 3,
        }
        if "SSL" in protocol:
            c["ssl.ca.location"] = str(self.ca)
        if protocol.startswith("SASL"):
            c.update(
                {
                    "sasl.mechanism": "SCRAM-SHA-512",
                    "sasl.username": USER,
                    "sasl.password": PASSWORD,
                }
            )
        return c

    def cpu_s(self) -> float:
        return sum(process_cpu_s(pid) for pid in self.broker_pids())

    def tls_session(self) -> str:
        """The TLS version and cipher the SSL listener negotiates with Python's ssl module
        (OpenSSL 3, default client context): what a default client gets."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        with socket.create_connection((HOST, self.ports[0]["SSL"]), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname=HOST) as t:
                cipher = t.cipher()
                return f"{t.version()} {cipher[0] if cipher else '?'}"

    def add_scram_user(self) -> None:
        """Create the SCRAM-SHA-512 user over PLAINTEXT (no authorizer on either broker),
        then wait until a SASL_SSL client logs in with it."""
        admin = AdminClient(self.conf("PLAINTEXT"))
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, ITERATIONS)
        for f in admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(USER, info, PASSWORD.encode())]
        ).values():
            f.result(timeout=30)
        deadline = time.monotonic() + 60
        while True:
            try:
                AdminClient(self.conf("SASL_SSL")).list_topics(timeout=5)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise


class Strait(System):
    name = "straitmq"
    python = sys.executable  # --strait NAME=PYTHON: another checkout's venv

    def properties(self, broker: int, inter_broker: str) -> Path:
        props = [
            f"listeners={self.listeners(broker)}",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL",
            f"inter.broker.listener.name={inter_broker}",
            f"ssl.keystore.location={self.server_pem}",
            # the replica fetchers' trust (a client of the other brokers' SSL listener)
            f"ssl.truststore.location={self.ca}",
            "listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512",
        ]
        path = self.workdir / f"server-{broker + 1}.properties"
        path.write_text("\n".join(props) + "\n")
        return path

    def start(self) -> None:
        self.ref = StraitRef(
            self.workdir,
            python=self.python,
            port=self.ports[0]["PLAINTEXT"],
            broker_args=["--properties", str(self.properties(0, "PLAINTEXT"))],
        )
        self.ref.start()

    def broker_pids(self) -> list[int]:
        return self.ref.pids()

    def stop(self) -> None:
        if getattr(self, "ref", None) is not None:
            self.ref.stop()


class StraitCluster(Strait):
    """3 controllers + 3 brokers (straitmq.cli.local_cluster, as bench.latency --rf 3),
    replicating over the SSL listener."""

    def start(self) -> None:
        self.cluster = LocalCluster(
            str(self.workdir / "cluster"),
            brokers=0,
            kafka_base=None,
            http_base=None,
            controller_base=None,
            controller_args=["--no-auto-leader-rebalance"],
            python=self.python,
        )
        for i in range(len(self.ports)):  # each broker its own listeners file
            self.cluster.broker_args = [
                "--default-replication-factor",
                "3",
                "--properties",
                str(self.properties(i, "SSL")),
            ]
            self.cluster.add_broker(i + 1, self.ports[i]["PLAINTEXT"], free_port())
        self.cluster.start(wait_s=180)

    def broker_pids(self) -> list[int]:
        return [n.proc.pid for n in self.cluster.brokers.values() if n.alive() and n.proc]

    def stop(self) -> None:
        if getattr(self, "cluster", None) is not None:
            self.cluster.stop()


class Kafka(System):
    name = "kafka"

    def tls_config(self, inter_broker: str) -> dict[str, object]:
        return {
            "listener.security.protocol.map": (
                "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL"
            ),
            "inter.broker.listener.name": inter_broker,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.server_pem),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
            "listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
        }

    def start(self) -> None:
        controller = free_port()
        self.ref = KafkaRef(
            self.ports[0]["PLAINTEXT"],
            controller,
            workdir=self.workdir,
            log_level="WARN",
            extra_config={  # KafkaRef's PLAINTEXT + CONTROLLER, plus SSL and SASL_SSL
                "listeners": f"{self.listeners()},CONTROLLER://{HOST}:{controller}",
                "advertised.listeners": self.listeners(),
                **self.tls_config("PLAINTEXT"),
            },
        )
        self.ref.start()

    def broker_pids(self) -> list[int]:
        assert self.ref.proc is not None
        return [self.ref.proc.pid]

    def stop(self) -> None:
        if getattr(self, "ref", None) is not None:
            self.ref.stop()


class KafkaCluster3(Kafka):
    """3 KRaft controllers + 3 brokers (bench.kafka_ref.KafkaCluster, Kafka's default
    timeouts), replicating over the SSL listener."""

    def start(self) -> None:
        def own_listeners(node: KafkaNode) -> dict[str, object]:
            i = node.node_id - 1
            self.ports[i]["PLAINTEXT"] = node.port  # the cluster's readiness probe's port
            return {"listeners": self.listeners(i), "advertised.listeners": self.listeners(i)}

        self.cluster = KafkaCluster(
            3,
            3,
            broker_config={"auto.leader.rebalance.enable": "false", **self.tls_config("SSL")},
            controller_config={"auto.leader.rebalance.enable": "false"},
            broker_config_for=own_listeners,
            workdir=self.workdir / "cluster",
            log_level="WARN",
        )
        self.cluster.start()

    def broker_pids(self) -> list[int]:
        nodes = self.cluster.brokers.values()
        return [n.proc.pid for n in nodes if n.proc is not None and n.proc.poll() is None]

    def stop(self) -> None:
        if getattr(self, "cluster", None) is not None:
            self.cluster.stop()


# -- measurements ----------------------------------------------------------------------


def client_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def produce(conf: dict, topic: str, n: int, size: int, timeout: float, acks: str = "1") -> float:
    """Produce n records of `size` random bytes; seconds until all acknowledged."""
    p = Producer(
        {
            **conf,
            "acks": acks,
            "linger.ms": 5,
            "compression.type": "none",
            "client.id": "bench-security",
        }
    )
    payload = os.urandom(size)
    errors: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    p.list_topics(topic, timeout=30)  # connect (TLS handshake, SASL) before the clock starts
    dt, left = send_all(p, topic, payload, n, timeout, on_delivery)
    if left or errors:
        raise RuntimeError(f"produce: {left} undelivered, {len(errors)} errors {errors[:1]}")
    return dt


def consume(conf: dict, topic: str, partitions: int, n: int, timeout: float) -> float:
    """Read n records back from the beginning (assign, no group); seconds taken."""
    c = Consumer(
        {
            **conf,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "client.id": "bench-security",
        }
    )
    try:
        c.list_topics(topic, timeout=30)  # connect before the clock starts
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got = 0
        deadline = time.monotonic() + timeout
        t0 = time.perf_counter()
        while got < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"consume: {got} of {n} records")
            for m in c.consume(num_messages=min(1000, n - got), timeout=0.5):
                if m.error() is None:
                    got += 1
        return time.perf_counter() - t0
    finally:
        c.close()


def measure(s: System, protocol: str, a: argparse.Namespace, n: int) -> dict[str, float]:
    topic = f"sec-{protocol.lower()}-{uuid.uuid4().hex[:6]}"
    create_topic(s, topic, a)  # rf 3: min.insync.replicas 2, led with its full ISR
    gb = n * a.record_size / 1e9
    mb = n * a.record_size / MB
    conf = s.conf(protocol)
    try:
        out: dict[str, float] = {}
        for phase in ("produce", "consume"):
            b0, c0 = s.cpu_s(), client_cpu_s()
            if phase == "produce":
                dt = produce(conf, topic, n, a.record_size, a.phase_timeout, a.acks)
            else:
                dt = consume(conf, topic, a.partitions, n, a.phase_timeout)
            out[f"{phase}_mb_s"] = mb / dt
            out[f"{phase}_broker_cpu_s_per_gb"] = (s.cpu_s() - b0) / gb
            out[f"{phase}_client_cpu_s_per_gb"] = (client_cpu_s() - c0) / gb
        return out
    finally:
        delete_topic(s, topic)


# -- report ----------------------------------------------------------------------------

ROWS = [
    ("produce_mb_s", "produce MB/s"),
    ("consume_mb_s", "consume MB/s"),
    ("produce_broker_cpu_s_per_gb", "produce broker CPU s/GB"),
    ("consume_broker_cpu_s_per_gb", "consume broker CPU s/GB"),
    ("produce_client_cpu_s_per_gb", "produce client CPU s/GB"),
    ("consume_client_cpu_s_per_gb", "consume client CPU s/GB"),
]


def medians(raw: dict[str, dict[str, list[dict[str, float]]]]) -> dict:
    """{system: {protocol: {metric: median over the rounds}}}"""
    return {
        n: {
            p: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            for p, rs in by_p.items()
            if rs
        }
        for n, by_p in raw.items()
    }


def report(raw: dict[str, dict[str, list[dict[str, float]]]], names: list[str]) -> str:
    """Markdown: medians (MB/s with the rounds' min-max, the noise), then the ratios."""
    med = medians(raw)

    def g(sysname: str, proto: str, key: str) -> float | None:
        return med.get(sysname, {}).get(proto, {}).get(key)

    lines = []
    cols = [(n, p) for n in names for p in PROTOCOLS]
    lines.append("| | " + " | ".join(f"{n} {p}" for n, p in cols) + " |")
    lines.append("|---|" + "---:|" * len(cols))
    for key, label in ROWS:
        cells = []
        for n, p in cols:
            v = g(n, p, key)
            cell = "-" if v is None else f"{v:,.1f}"
            if v is not None and key.endswith("mb_s") and len(raw[n][p]) > 1:
                vals = [r[key] for r in raw[n][p]]
                cell += f" ({min(vals):.0f}-{max(vals):.0f})"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    # ratios within each system (the cost of TLS and of SASL on top of it)
    lines.append(
        "| ratio | " + " | ".join(f"{n} {p}/PLAINTEXT" for n in names for p in PROTOCOLS[1:]) + " |"
    )
    lines.append("|---|" + "---:|" * (len(names) * 2))
    for key, label in ROWS[:4]:
        cells = []
        for n in names:
            for p in PROTOCOLS[1:]:
                v, base = g(n, p, key), g(n, "PLAINTEXT", key)
                cells.append(f"{v / base:.2f}" if v and base else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for strait in (n for n in names if n != "kafka" and "kafka" in names):
        lines.append("")
        lines.append(f"| {strait}/Kafka | " + " | ".join(PROTOCOLS) + " |")
        lines.append("|---|" + "---:|" * len(PROTOCOLS))
        for key, label in ROWS[:4]:
            cells = []
            for p in PROTOCOLS:
                v, k = g(strait, p, key), g("kafka", p, key)
                cells.append(f"{v / k:.2f}" if v and k else "-")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds (medians reported)")
    ap.add_argument("--num-records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument(
        "--acks", default=None, choices=("1", "all"), help="the producer's acks (1; rf 3: all)"
    )
    ap.add_argument(
        "--rf",
        type=int,
        choices=(1, 3),
        default=1,
        help="3: 3 controllers + 3 brokers of each, replicating over TLS, min.insync.replicas 2",
    )
    ap.add_argument("--warmup-records", type=int, default=200_000, help="per protocol, 0: none")
    ap.add_argument("--systems", default="kafka,straitmq", help="comma list: kafka,straitmq")
    ap.add_argument(
        "--strait",
        action="append",
        default=[],
        metavar="NAME=PYTHON",
        help="also run StraitMQ as NAME with this interpreter (another checkout's venv), "
        "to compare two versions in one run (repeatable)",
    )
    ap.add_argument("--phase-timeout", type=float, default=300)
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs, certs)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--report", metavar="JSON", help="print the table of an earlier run's JSON")
    a = ap.parse_args(argv)
    if a.acks is None:
        a.acks = "all" if a.rf > 1 else "1"
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.report:
        d = json.loads(Path(a.report).read_text())
        print(report(d["raw"], list(d["raw"])))
        return 0
    work = Path(tempfile.mkdtemp(prefix="sec-bench-"))
    ca, server_pem = make_certs(work / "certs")
    classes: dict[str, type[System]] = (
        {"kafka": KafkaCluster3, "straitmq": StraitCluster}
        if a.rf > 1
        else {"kafka": Kafka, "straitmq": Strait}
    )
    systems: list[System] = []
    for name in a.systems.split(","):
        (work / name).mkdir()
        systems.append(classes[name](work / name, ca, server_pem, a.rf))
    for spec in a.strait:
        name, _, python = spec.partition("=")
        (work / name).mkdir()
        strait = classes["straitmq"](work / name, ca, server_pem, a.rf)
        assert isinstance(strait, Strait)
        strait.name, strait.python = name, python
        systems.append(strait)
    raw: dict[str, dict[str, list[dict[str, float]]]] = {
        s.name: {p: [] for p in PROTOCOLS} for s in systems
    }
    errors: list[str] = []
    t_start = time.monotonic()
    started: list[System] = []
    tls: dict[str, str] = {}
    try:
        for s in systems:
            t0 = time.monotonic()
            started.append(s)
            s.start()
            s.add_scram_user()
            tls[s.name] = s.tls_session()
            log(f"{s.name}: ready in {time.monotonic() - t0:.1f}s, ports {s.ports}, {tls[s.name]}")
        if a.warmup_records:
            for s in systems:
                log(f"{s.name}: warm-up")
                for p in PROTOCOLS:
                    measure(s, p, a, a.warmup_records)
        for r in range(a.repeat):
            order = systems if r % 2 == 0 else systems[::-1]
            protos = PROTOCOLS[r % 3 :] + PROTOCOLS[: r % 3]
            for p in protos:
                for s in order:
                    try:
                        res = measure(s, p, a, a.num_records)
                    except Exception as e:
                        errors.append(f"{s.name} {p} round {r + 1}: {e!r}")
                        log(f"  round {r + 1} {s.name} {p}: FAILED {e!r}")
                        continue
                    raw[s.name][p].append(res)
                    log(
                        f"  round {r + 1} {s.name:8} {p:9} produce {res['produce_mb_s']:6.1f}"
                        f" MB/s {res['produce_broker_cpu_s_per_gb']:5.1f} s/GB, consume"
                        f" {res['consume_mb_s']:6.1f} MB/s"
                        f" {res['consume_broker_cpu_s_per_gb']:5.1f} s/GB"
                    )
    finally:
        for s in started:
            s.stop()
        if a.keep:
            log(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    med = medians(raw)
    print(report(raw, [s.name for s in systems]))
    print("\nTLS negotiated: " + ", ".join(f"{n} {v}" for n, v in tls.items()))
    log(f"total {time.monotonic() - t_start:.0f}s")
    if errors:
        print("\nerrors:\n  " + "\n  ".join(errors))
    path = (
        Path(a.json)
        if a.json
        else (
            REPO_ROOT
            / ".cache"
            / "bench"
            / f"security-throughput-{_dt.datetime.now():%Y%m%d-%H%M%S}.json"
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"args": vars(a), "tls": tls, "raw": raw, "median": med, "errors": errors})
    )
    log(f"results written to {path}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
