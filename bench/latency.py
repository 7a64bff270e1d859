"""Produce latency at a fixed rate, and end-to-end latency: StraitMQ beside Apache Kafka 4.4,
both up for the whole run, rounds alternating (issue 31, item 3; not a pytest test).

    python -m bench.latency [--rounds 3] [--rates 5000,20000] [--rf 3]

For each round, each system (order flipped every round) and each rate (order flipped too):

  produce    Kafka's ProducerPerformance (REF_KAFKA, the newest release) at the rate for
             --warmup-s (10) then --seconds (30), in ONE JVM: the first part is its
             --warmup-records, left out of the steady-state line reported here. 1 KiB
             records, acks=all, linger.ms=0: p50/p95/p99/p99.9 and max latency (ms, from
             send to acknowledgement), the rate reached, and the brokers' CPU (user +
             system, all broker processes, /proc) as a share of one core, from the end of
             the warm-up. Neither the client's JVM nor a JVM broker is measured cold.
             (Until 2026-11-27 evening the warm-up was a separate JVM, so the measured
             client started cold: its first seconds of class loading and JIT were in the
             p99 of both systems.)
  e2e        one message at a time, produce acks=all and wait until a consumer has it
             (--e2e-messages), its p50/p99/p99.9 in µs: tools/java/kafka-4.4/apps/
             E2eLatency.java, Kafka's EndToEndLatency method with --e2e-warmup messages
             first in the same JVM, not counted (Kafka's tool has no warm-up, so until
             2026-11-28 its cold JVM's first messages were in both systems' p99)

each on a new topic of --partitions partitions (1), deleted afterwards. --rf 1 (default)
runs one node of each: a combined StraitMQ node (`python -m straitmq.broker`) and a KRaft
combined Kafka (bench/kafka_ref.py). --rf 3 runs 3 controllers + 3 brokers of each
(bench/failover.py's targets, default timeouts), topics with min.insync.replicas 2.

--strait NAME=PYTHON adds a StraitMQ run with another checkout's interpreter (its venv's
python, whose editable install points at that checkout), to compare two versions in one
run: `--strait before=/work/wt/base/.venv/bin/python --strait after=.venv/bin/python`.
--stallwatch runs StraitMQ's brokers under bench/stallwatch (5 ms sampling) and prints each
broker's histogram of event-loop lateness at the end.

Output: a markdown table of medians over the rounds (min-max of p99 beside it), the ratios
StraitMQ/Kafka, and a JSON dump (default .cache/bench/latency-<timestamp>.json);
`--report JSON` prints an earlier run's table again.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # allow `python bench/latency.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka.admin import AdminClient, NewTopic
from straitmq.cli.local_cluster import LocalCluster, free_port

from bench.failover import KafkaTarget
from bench.javatools import (
    PERF_JVM_ARGS,
    PRODUCER_PERF,
    REF_KAFKA,
    REPO_ROOT,
    java_cmd,
)
from bench.kafka_ref import KafkaRef
from bench.strait_ref import StraitRef
from bench.throughput import PP_FINAL, parse_producer_perf, process_cpu_s

HOST = "127.0.0.1"
PRODUCE_BUCKET = 'straitmq_broker_request_duration_seconds_bucket{kafka_api_name="Produce",'
STALLWATCH_DIR = REPO_ROOT / "bench" / "stallwatch"
# E2eLatency's summary lines: EndToEndLatency's average, then percentiles in µs.
E2E_LATENCY = "E2eLatency"  # tools/java/kafka-4.4/apps/E2eLatency.java
E2E_AVG = re.compile(r"Avg latency: ([\d.]+) ms")
E2E_PCT = re.compile(r"Percentiles us: 50th = (\d+), 99th = (\d+), 99\.9th = (\d+)")
# ProducerPerformance's steady-state line with --warmup-records (Kafka 4.2+, KIP-1052):
# "N steady state records sent, ...".
PP_STEADY = re.compile(PP_FINAL.pattern.replace(" records sent", " steady state records sent"))
PRODUCE_KEYS = ("p50_ms", "p95_ms", "p99_ms", "p999_ms", "max_lat_ms", "rec_s", "broker_cpu")
E2E_KEYS = ("e2e_avg_ms", "e2e_p50_ms", "e2e_p99_ms", "e2e_p999_ms")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_e2e(out: str) -> dict[str, float]:
    avg, pct = E2E_AVG.search(out), E2E_PCT.search(out)
    if avg is None or pct is None:
        raise RuntimeError(f"no summary in E2eLatency output: {out[-500:]!r}")
    p50, p99, p999 = (int(v) / 1000 for v in pct.groups())
    return {
        "e2e_avg_ms": float(avg.group(1)),
        "e2e_p50_ms": p50,
        "e2e_p99_ms": p99,
        "e2e_p999_ms": p999,
    }


# -- systems ---------------------------------------------------------------------------


class System(ABC):
    """A broker (rf 1) or a 3 + 3 cluster (rf 3) of one kind, up for the whole run;
    StraitMQ's and Kafka's say how they start, stop and which processes are brokers."""

    name = ""
    bootstrap = ""

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None: ...

    @abstractmethod
    def broker_pids(self) -> list[int]: ...

    def http_bases(self) -> list[str]:
        """The brokers' HTTP APIs (StraitMQ's: their Produce time histograms); none for
        Kafka."""
        return []

    def produce_buckets(self) -> dict[float, float]:
        """The brokers' Produce handling times so far, summed: cumulative count per
        bucket bound in seconds (straitmq.broker.request.duration)."""
        total: dict[float, float] = {}
        for base in self.http_bases():
            for le, n in produce_buckets(base).items():
                total[le] = total.get(le, 0.0) + n
        return total

    def cpu_s(self) -> float:
        total = 0.0
        for pid in self.broker_pids():
            try:
                total += process_cpu_s(pid)
            except OSError:
                pass
        return total


def stallwatch_env(stall_dir: Path) -> dict[str, str]:
    """What a process needs in its environment to run under bench/stallwatch (5 ms
    heartbeat lateness buckets, 5 ms sampling), writing into `stall_dir`."""
    return {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(STALLWATCH_DIR), os.environ.get("PYTHONPATH")])
        ),
        "STALLWATCH": "1",
        "STALLWATCH_DIR": str(stall_dir),
        "STALLWATCH_MS": "5",
        "STALLWATCH_SAMPLE_MS": "5",
    }


class StraitNode(System):
    """One StraitMQ broker (combined with its controller); `extra_args` go after the
    defaults, `env` over this process's environment."""

    def __init__(
        self,
        name: str,
        python: str,
        workdir: Path,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.name, self.workdir = name, workdir
        self.ref = StraitRef(workdir, python=python, broker_args=extra_args, env=env)
        self.bootstrap = self.ref.bootstrap

    def start(self) -> None:
        self.ref.start(timeout=90)

    def stop(self) -> None:
        self.ref.stop()

    def broker_pids(self) -> list[int]:
        return self.ref.pids()

    def http_bases(self) -> list[str]:
        return [self.ref.http]


class StraitCluster(System):
    def __init__(self, name: str, python: str, workdir: Path) -> None:
        self.name = name
        self.cluster = LocalCluster(
            str(workdir),
            kafka_base=None,
            http_base=None,
            controller_base=None,
            broker_args=["--default-replication-factor", "3"],
            controller_args=["--no-auto-leader-rebalance"],
            python=python,
        )
        self.bootstrap = self.cluster.bootstrap

    def start(self) -> None:
        self.cluster.start(wait_s=180)

    def stop(self) -> None:
        self.cluster.stop()

    def broker_pids(self) -> list[int]:
        return [n.proc.pid for n in self.cluster.brokers.values() if n.alive() and n.proc]

    def http_bases(self) -> list[str]:
        return [f"http://{n.host}:{n.http_port}" for n in self.cluster.brokers.values()]


class KafkaNode(System):
    name = "kafka"

    def __init__(self, workdir: Path) -> None:
        self.ref = KafkaRef(free_port(), workdir=workdir, log_level="WARN")
        self.bootstrap = self.ref.bootstrap

    def start(self) -> None:
        self.ref.start()

    def stop(self) -> None:
        self.ref.stop()

    def broker_pids(self) -> list[int]:
        return [self.ref.proc.pid] if self.ref.proc is not None else []


class KafkaCluster3(System):
    name = "kafka"

    def __init__(self) -> None:
        self.target = KafkaTarget(fast_failover=False)
        self.bootstrap = self.target.bootstrap

    def start(self) -> None:
        self.target.start()

    def stop(self) -> None:
        self.target.stop()

    def broker_pids(self) -> list[int]:
        nodes = self.target.cluster.brokers.values()
        return [n.proc.pid for n in nodes if n.proc is not None and n.proc.poll() is None]


# -- measurements ----------------------------------------------------------------------


def java_proc(main_class: str, args: list[Any], ours: bool = False) -> subprocess.Popen[str]:
    """A Kafka tool (REF_KAFKA's jars), or with `ours` one of tools/java/kafka-4.4/apps."""
    cmd = java_cmd(main_class, args, jvm_args=PERF_JVM_ARGS, include_classes=ours, jars=REF_KAFKA)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def java_output(main_class: str, proc: subprocess.Popen[str], timeout: float) -> str:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"{main_class} exited {proc.returncode}: {err[-1500:]}")
    return out


def run_java(main_class: str, args: list[Any], timeout: float, ours: bool = False) -> str:
    return java_output(main_class, java_proc(main_class, args, ours), timeout)


def create_topic(s: System, topic: str, a: argparse.Namespace) -> None:
    config = {"min.insync.replicas": "2"} if a.rf > 1 else {}
    admin = AdminClient({"bootstrap.servers": s.bootstrap, "log_level": 2})
    nt = NewTopic(topic, num_partitions=a.partitions, replication_factor=a.rf, config=config)
    admin.create_topics([nt], operation_timeout=30)[topic].result(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # led, with its full ISR
        md = admin.list_topics(topic, timeout=10).topics.get(topic)
        parts = md.partitions.values() if md is not None else []
        if len(parts) == a.partitions and all(p.leader >= 0 and len(p.isrs) == a.rf for p in parts):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{topic} not ready after 60 s")


def delete_topic(s: System, topic: str) -> None:
    try:
        admin = AdminClient({"bootstrap.servers": s.bootstrap, "log_level": 2})
        admin.delete_topics([topic], operation_timeout=30)[topic].result(60)
    except Exception as e:  # best effort
        log(f"  delete {topic}: {e}")


def producer_perf_args(s: System, topic: str, rate: int, a: argparse.Namespace) -> list[Any]:
    warmup = int(rate * a.warmup_s)
    return [
        "--topic",
        topic,
        "--num-records",
        warmup + int(rate * a.seconds),
        *(["--warmup-records", warmup] if warmup > 0 else []),
        "--record-size",
        a.record_size,
        "--throughput",
        rate,
        "--producer-props",
        f"bootstrap.servers={s.bootstrap}",
        "acks=all",
        "linger.ms=0",
    ]


def parse_steady(out: str) -> dict[str, float]:
    """The steady-state summary (after the warm-up records), else the only summary."""
    steady = [ln for ln in out.splitlines() if PP_STEADY.search(ln)]
    return parse_producer_perf(steady[-1].replace(" steady state", "") if steady else out)


def measure(s: System, rate: int, a: argparse.Namespace) -> dict[str, float]:
    topic = f"lat-{rate}-{uuid.uuid4().hex[:6]}"
    create_topic(s, topic, a)
    try:
        proc = java_proc(PRODUCER_PERF, producer_perf_args(s, topic, rate, a))
        # The broker's CPU and Produce times from the end of the warm-up records (the
        # client sends at the fixed rate from its start; its JVM starts in well under 1 s).
        try:
            proc.wait(timeout=a.warmup_s)
        except subprocess.TimeoutExpired:
            pass
        cpu0, t0, before = s.cpu_s(), time.monotonic(), s.produce_buckets()
        res = parse_steady(java_output(PRODUCER_PERF, proc, (a.warmup_s + a.seconds) * 4 + 120))
        res["broker_cpu"] = (s.cpu_s() - cpu0) / (time.monotonic() - t0)
        # The broker's own share of the tail: its Produce handling time (from taking a
        # request up to writing its answer), p99 as the histogram bucket bound it is in.
        p99 = bucket_quantile(before, s.produce_buckets(), 0.99)
        if p99 is not None:
            res["broker_p99_ms"] = p99 * 1000
    finally:
        delete_topic(s, topic)
    return res


def e2e(s: System, a: argparse.Namespace) -> dict[str, float]:
    topic = f"e2e-{uuid.uuid4().hex[:6]}"
    create_topic(s, topic, a)
    try:
        n = a.e2e_warmup + a.e2e_messages
        out = run_java(
            E2E_LATENCY,
            [s.bootstrap, topic, a.e2e_warmup, a.e2e_messages, "all", a.record_size],
            timeout=n * 0.5 + 120,
            ours=True,
        )
        return parse_e2e(out)
    finally:
        delete_topic(s, topic)


def produce_buckets(http: str) -> dict[float, float]:
    """One StraitMQ broker's Produce handling-time histogram from its /metrics."""
    with urllib.request.urlopen(f"{http}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(PRODUCE_BUCKET):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def bucket_quantile(
    before: dict[float, float], after: dict[float, float], q: float
) -> float | None:
    """The bucket bound the q-quantile of what was recorded between the two cumulative
    histograms falls in (an upper bound: the buckets are 1, 2.5, 5, 10, 25 ms...)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    for bound, n in zip(bounds, counts, strict=True):
        if n >= q * counts[-1]:
            return bound
    return None


# -- summary ---------------------------------------------------------------------------

Rounds = dict[str, dict[str, list[dict[str, float]]]]  # system -> test -> one dict per round


def medians(rounds: Rounds) -> dict[str, dict[str, dict[str, float]]]:
    """{system: {test: {metric: median over the rounds that have it}}}"""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name, tests in rounds.items():
        for test, rs in tests.items():
            keys = sorted({k for r in rs for k in r})
            if keys:
                out.setdefault(name, {})[test] = {
                    k: statistics.median(r[k] for r in rs if k in r) for k in keys
                }
    return out


def report(rounds: Rounds, baseline: str = "kafka") -> str:
    """Markdown: one row per (test, system), medians; p99's min-max over the rounds; then
    each other system's p99 / the baseline's."""
    med = medians(rounds)
    lines = [
        "| test | system | rounds | p50 ms | p95 ms | p99 ms (min-max) | p99.9 ms | max ms "
        "| rate reached | broker CPU | broker p99 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    tests = sorted({t for ts in rounds.values() for t in ts}, key=_test_order)
    for test in tests:
        for name in rounds:
            rs = rounds[name].get(test, [])
            m = med.get(name, {}).get(test)
            if not m:
                continue
            if test == "e2e":
                p99s = [r["e2e_p99_ms"] for r in rs]
                lines.append(
                    f"| e2e | {name} | {len(rs)} | {m['e2e_p50_ms']:.1f} | - | "
                    f"{m['e2e_p99_ms']:.1f} ({min(p99s):.1f}-{max(p99s):.1f}) | "
                    f"{m['e2e_p999_ms']:.1f} | - | - | - | - |"
                )
                continue
            p99s = [r["p99_ms"] for r in rs]
            lines.append(
                f"| {test} | {name} | {len(rs)} | {m['p50_ms']:.0f} | {m['p95_ms']:.0f} | "
                f"{m['p99_ms']:.0f} ({min(p99s):.0f}-{max(p99s):.0f}) | {m['p999_ms']:.0f} | "
                f"{m['max_lat_ms']:.0f} | {m['rec_s']:,.0f}/s | {m['broker_cpu']:.0%} | "
                + (f"≤ {m['broker_p99_ms']:g} |" if "broker_p99_ms" in m else "- |")
            )
    if baseline in med:
        lines += ["", f"| p99 / {baseline} p99 | " + " | ".join(tests) + " |"]
        lines.append("|---|" + "---:|" * len(tests))
        for name in med:
            if name == baseline:
                continue
            cells = []
            for test in tests:
                key = "e2e_p99_ms" if test == "e2e" else "p99_ms"
                v = med[name].get(test, {}).get(key)
                b = med[baseline].get(test, {}).get(key)
                cells.append(f"{v / b:.2f}" if v is not None and b else "-")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _test_order(test: str) -> tuple[int, str]:
    return (1, test) if test == "e2e" else (0, f"{int(test.split('/')[0]):09d}")


def stall_histograms(directory: Path, names: dict[int, str]) -> dict[str, dict]:
    """Each stallwatch histogram in `directory` (one per broker process), by the name of
    its system (`names`: pid -> system) and pid."""
    out = {}
    for path in sorted(directory.glob("*.hist.json")):
        pid = int(path.name.split(".")[0])
        out[f"{names.get(pid, '?')} pid {pid}"] = json.loads(path.read_text())
    return out


# -- main ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds (medians reported)")
    ap.add_argument("--rates", default="5000,20000", help="records/s, comma list")
    ap.add_argument("--seconds", type=float, default=30, help="measured seconds per rate")
    ap.add_argument("--warmup-s", type=float, default=10, help="unreported seconds first")
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--rf", type=int, choices=(1, 3), default=1, help="3: 3+3 clusters")
    ap.add_argument("--e2e-messages", type=int, default=2000, help="0: no e2e test")
    ap.add_argument("--e2e-warmup", type=int, default=1000, help="e2e messages not counted")
    ap.add_argument("--systems", default="kafka,straitmq", help="comma list: kafka,straitmq")
    ap.add_argument(
        "--strait",
        action="append",
        default=[],
        metavar="NAME=PYTHON",
        help="a StraitMQ run with this interpreter (repeatable; default straitmq=this one)",
    )
    ap.add_argument("--stallwatch", action="store_true", help="StraitMQ under bench/stallwatch")
    ap.add_argument("--json", default=None)
    ap.add_argument("--report", metavar="JSON", help="print the table of an earlier run's JSON")
    a = ap.parse_args(argv)
    try:
        a.rates = [int(r) for r in a.rates.split(",") if r]
    except ValueError:
        ap.error(f"--rates: not a comma list of integers: {a.rates!r}")
    stray = set(a.systems.split(",")) - {"kafka", "straitmq", ""}
    if stray:
        ap.error(f"--systems: unknown {sorted(stray)}")
    pythons: dict[str, str] = {}
    for spec in a.strait:
        name, sep, python = spec.partition("=")
        if not sep or not name or not python:
            ap.error(f"--strait wants NAME=PYTHON, not {spec!r}")
        pythons[name] = python
    if not pythons and "straitmq" in a.systems.split(","):
        pythons["straitmq"] = sys.executable
    a.pythons = pythons
    a.kafka = "kafka" in a.systems.split(",")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.report:
        d = json.loads(Path(a.report).read_text())
        print(report(d["rounds"]))
        return 0
    work = Path(tempfile.mkdtemp(prefix="lat-bench-"))
    stall_dir = work / "stallwatch"
    if a.stallwatch:
        os.environ.update(stallwatch_env(stall_dir))
    systems: list[System] = []
    if a.kafka:
        (work / "kafka").mkdir()
        systems.append(KafkaCluster3() if a.rf > 1 else KafkaNode(work / "kafka"))
    for name, python in a.pythons.items():
        (work / name).mkdir()
        cls = StraitCluster if a.rf > 1 else StraitNode
        systems.append(cls(name, python, work / name))
    tests = [f"{r}/s" for r in a.rates] + (["e2e"] if a.e2e_messages else [])
    rounds: Rounds = {s.name: {t: [] for t in tests} for s in systems}
    errors: list[str] = []
    started: list[System] = []
    pids: dict[int, str] = {}
    try:
        for s in systems:
            t0 = time.monotonic()
            started.append(s)
            s.start()
            pids.update(dict.fromkeys(s.broker_pids(), s.name))
            log(f"{s.name}: ready in {time.monotonic() - t0:.0f}s at {s.bootstrap}")
        for r in range(a.rounds):
            order = systems if r % 2 == 0 else systems[::-1]
            rates = a.rates if r % 2 == 0 else a.rates[::-1]
            for s in order:
                for rate in rates:
                    try:
                        res = measure(s, rate, a)
                    except Exception as e:
                        errors.append(f"{s.name} {rate}/s round {r + 1}: {e!r}")
                        log(f"  round {r + 1} {s.name} {rate}/s: FAILED {e!r}")
                        continue
                    rounds[s.name][f"{rate}/s"].append(res)
                    log(
                        f"  round {r + 1} {s.name:10} {rate:6}/s: p50 {res['p50_ms']:.0f} "
                        f"p95 {res['p95_ms']:.0f} p99 {res['p99_ms']:.0f} ms, "
                        f"{res['rec_s']:.0f} rec/s, broker CPU {res['broker_cpu']:.0%}"
                    )
                if a.e2e_messages:
                    try:
                        res = e2e(s, a)
                    except Exception as e:
                        errors.append(f"{s.name} e2e round {r + 1}: {e!r}")
                        log(f"  round {r + 1} {s.name} e2e: FAILED {e!r}")
                        continue
                    rounds[s.name]["e2e"].append(res)
                    log(
                        f"  round {r + 1} {s.name:10} e2e: p50 {res['e2e_p50_ms']:.0f} "
                        f"p99 {res['e2e_p99_ms']:.0f} ms"
                    )
    finally:
        for s in started:
            try:
                s.stop()
            except Exception as e:
                log(f"stopping {s.name}: {e!r}")
    print(report(rounds))
    hist = stall_histograms(stall_dir, pids) if a.stallwatch else {}
    if hist:
        print("\nevent-loop lateness per broker process (stallwatch, ms buckets):")
        for name, h in hist.items():
            print(f"{name}: {json.dumps(h, sort_keys=True)}")
    if errors:
        print("\nerrors:\n  " + "\n  ".join(errors))
    path = (
        Path(a.json)
        if a.json
        else REPO_ROOT / ".cache" / "bench" / f"latency-{_dt.datetime.now():%Y%m%d-%H%M%S}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    args = {k: v for k, v in vars(a).items()}
    path.write_text(
        json.dumps(
            {
                "args": args,
                "rounds": rounds,
                "median": medians(rounds),
                "stalls": hist,
                "errors": errors,
            }
        )
    )
    log(f"results written to {path}")
    if a.stallwatch:
        log(f"stall logs: {stall_dir}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
