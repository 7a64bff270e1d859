"""The log cleaner (issue 25): how fast it compacts, what it costs, and what produce and
fetch lose while it runs. StraitMQ (one broker, its cleaner in a worker process, and
again with it in a thread) beside Apache Kafka 4.4 (one KRaft combined broker,
bench/kafka_ref.py), one system at a time, in one run (not a pytest test).

    python -m bench.cleaner [--records 1000000] [--rounds 3]
                            [--systems kafka,straitmq,straitmq-thread]
    python -m bench.cleaner --profile [--records 300000]   # cProfile of one cleaning

The data set, per dirty topic (1 partition, RF 1, segment.bytes 8 MiB): `--records`
records of 1 KiB JSON-like text (compresses about 2.2x with lz4), keys drawn at random
from `--keys` (10,000) keys, so each key has about records/keys versions; sent by a
librdkafka producer as applications send them (`--codec` lz4, linger 10 ms). 5 x
`--rounds` such topics are loaded with `cleanup.policy=delete` (nothing to clean), then
each is switched to `compact` (IncrementalAlterConfigs) when its cleaning is wanted: one
whole-log cleaning, every key's versions down to one, all of it in closed segments.

Per system, in order:

  warm-up   ProducerPerformance acks=1 (not reported) and one small compacted topic
            cleaned (the JVM's JIT, StraitMQ's worker process start)
  clean     `--rounds` times, one dirty topic switched to compact, the cleaner alone on
            an idle broker: MB/s = the log section cleaned (sizes of the closed
            segments before, MB = 2^20) / the cleaner's own seconds for that cleaning
            (Kafka: its "N MB of log processed in S seconds" log line, whose N is the
            same size; StraitMQ: the delta of log_cleaner_busy_seconds on /metrics), and
            the broker's CPU seconds (utime + stime from /proc, all threads; for
            StraitMQ with its worker processes) per GB (10^9 bytes) of log cleaned,
            from the switch to the end of the cleaning
  rounds    `--rounds` times, each of these idle (cleaner idle) and busy (a fresh dirty
            topic switched to compact once the run has begun: the JVM up and its first
            records on disk, or the first record fetched), idle and busy back to back,
            their order flipped every round:
            acks=1, acks=all   ProducerPerformance, 1 KiB records, batch.size 64 KiB,
                               linger 5 ms, as fast as it goes: MB/s, and p99 (which
                               at saturation is mostly the producer's own queue)
            acks=all fixed     ProducerPerformance at `--fixed-rate` (2000) records/s,
                               acks=all: p99 latency below saturation
            fetch              a librdkafka consumer (assign, no group) reading the
                               acks=all topic from the start, again and again, for the
                               same time: MB/s (bound by the Python client's ~100-200
                               MB/s: a floor on what the broker serves)
            every busy run also says which share of its window the cleaner was busy
            (the overlap with [end of the cleaning - its seconds, end]) and how fast it
            cleaned meanwhile

The produce runs are sized to last about one solo cleaning (at least `--min-seconds`,
3): records = warm-up rate x median cleaning seconds; the same count idle and busy.
Medians over the rounds are reported (every run is in the JSON). Both brokers:
log.cleaner.backoff.ms=500 (a switch is picked up soon), one cleaner thread/worker,
Kafka's other defaults (dedupe buffer 128 MiB: the 10k keys fit in one pass on both).

`straitmq-thread` is the same StraitMQ broker with STRAITMQ_CLEANER_EXECUTOR=thread (the
broker's bench-only switch): the cleaning then holds the GIL against the event loop.

Output: markdown tables (per system, and ratios to Kafka), JSON of everything
(`--json`, default .cache/bench/cleaner-<timestamp>.json; `--report JSON` prints an
earlier run's tables). `--keep` keeps the work folder (both brokers' logs).
"""

from __future__ import annotations

import abc
import argparse
import datetime as _dt
import json
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # allow `python bench/cleaner.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from straitmq.cli.local_cluster import free_port

from bench.javatools import PRODUCER_PERF, REPO_ROOT
from bench.kafka_ref import KafkaRef
from bench.strait_ref import StraitRef
from bench.throughput import PhaseError, parse_producer_perf, run_tool

MB = 1024 * 1024
HOST = "127.0.0.1"
SEGMENT_BYTES = 8 * MB
BACKOFF_MS = 500  # log.cleaner.backoff.ms on both: a switched topic is picked up soon
TICK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- CPU --------------------------------------------------------------------------------


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of `pid`, its live descendants (a cleaner's worker
    processes) and the children it has reaped (cutime, cstime)."""
    total = 0.0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            f = _stat(p)
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += (int(f[11]) + int(f[12])) / TICK
        if p == pid:
            total += (int(f[13]) + int(f[14])) / TICK
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except FileNotFoundError:
            continue
        for t in tasks:
            try:
                stack += [int(c) for c in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except FileNotFoundError:
                pass
    return total


# -- the systems -------------------------------------------------------------------------


class System(abc.ABC):
    name = ""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    @abc.abstractmethod
    def pid(self) -> int: ...

    @abc.abstractmethod
    def log_dir(self, topic: str) -> Path:
        """The folder of partition 0 of `topic`."""

    @abc.abstractmethod
    def mark(self) -> Any:
        """A point to wait for the next cleaning from (before switching a topic)."""

    @abc.abstractmethod
    def cleaned(self, topic: str, mark: Any) -> dict[str, float] | None:
        """The cleaning of `topic` since `mark` once it is done: {"seconds": the
        cleaner's own time, "end": time.time() at its end (approximately)}, or None."""

    def cpu_s(self) -> float:
        return tree_cpu_s(self.pid())


class Strait(System):
    # put before `-m straitmq.broker` (e.g. `-m cProfile -o FILE`: bench/transactions.py)
    interpreter_args: list[str] = []

    def __init__(self, workdir: Path, executor: str) -> None:
        super().__init__(workdir)
        self.executor = executor
        self.name = "straitmq" if executor == "process" else f"straitmq-{executor}"
        self.http = free_port()

    def start(self) -> None:
        self.ref = StraitRef(
            self.workdir,
            port=self.port,
            http_port=self.http,
            interpreter_args=self.interpreter_args,
            broker_args=["--log-cleaner-backoff-ms", str(BACKOFF_MS)],
            env={"STRAITMQ_CLEANER_EXECUTOR": self.executor},
        )
        self.ref.start()

    def stop(self) -> None:
        if getattr(self, "ref", None) is not None:
            self.ref.stop()

    def pid(self) -> int:
        return self.ref.pid()

    def log_dir(self, topic: str) -> Path:
        return self.workdir / "data" / "logs" / f"{topic}-0"

    def metrics(self) -> dict[str, float]:
        """The cleaner's metrics, `name{labels}` -> value."""
        with urllib.request.urlopen(f"http://{HOST}:{self.http}/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("straitmq_broker_log_cleaner"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def mark(self) -> Any:
        m = self.metrics()
        return (time.time(), m["straitmq_broker_log_cleaner_busy_seconds_total"])

    def cleaned(self, topic: str, mark: Any) -> dict[str, float] | None:
        t0, busy0 = mark
        m = self.metrics()
        key = (
            "straitmq_broker_log_cleaner_time_since_last_clean_seconds"
            f'{{messaging_destination_name="{topic}",messaging_destination_partition_id="0"}}'
        )
        since = m.get(key)
        now = time.time()
        if since is None or now - since < t0:
            return None
        # Its worker's seconds (the offsets topic's cleanings, if any, are tiny).
        busy = m["straitmq_broker_log_cleaner_busy_seconds_total"] - busy0
        return {"seconds": busy, "end": now - since}


# Kafka 4.4's LogCleaner stats, logged at INFO after each cleaning:
#   Log cleaner thread 0 cleaned log t-0 (dirty section = [0, 300000])
#   	123.4 MB of log processed in 2.3 seconds (53.6 MB/sec).
KAFKA_CLEANED = re.compile(
    r"cleaned log (?P<log>\S+) \(dirty section = \[(\d+), (\d+)\]\)\s*"
    r"(?P<mb>[\d,.]+) MB of log processed in (?P<s>[\d,.]+) seconds"
)


class Kafka(System):
    name = "kafka"

    def start(self) -> None:
        self.ref = KafkaRef(
            self.port,
            workdir=self.workdir,
            log_level="INFO",
            extra_config={"log.cleaner.backoff.ms": BACKOFF_MS},
        )
        self.ref.start()

    def stop(self) -> None:
        if getattr(self, "ref", None) is not None:
            self.ref.stop()

    def pid(self) -> int:
        assert self.ref.proc is not None
        return self.ref.proc.pid

    def log_dir(self, topic: str) -> Path:
        return self.workdir / "data" / f"{topic}-0"

    def _log_text(self, start: int) -> str:
        with open(self.ref.server_log, "rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")

    def mark(self) -> Any:
        return self.ref.server_log.stat().st_size

    def cleaned(self, topic: str, mark: Any) -> dict[str, float] | None:
        for m in KAFKA_CLEANED.finditer(self._log_text(mark)):
            if m.group("log") == f"{topic}-0":
                return {
                    "seconds": float(m.group("s").replace(",", "")),
                    "kafka_mb": float(m.group("mb").replace(",", "")),
                    "end": time.time(),  # polled every 0.2 s: close enough
                }
        return None


# -- data --------------------------------------------------------------------------------


def make_values(n: int, seed: int = 1) -> list[bytes]:
    """`n` distinct 1 KiB JSON-like values: fields, numbers and words of a small
    vocabulary (about 2.2x with lz4, 3.2x with zstd: application data, not random)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(300)]
    out = []
    for i in range(n):
        d = {
            "id": i,
            "user": f"user-{rng.randrange(10**6):06d}",
            "ts": 1764230000000 + i,
            "amount": round(rng.random() * 1000, 2),
            "tags": rng.sample(words, 4),
        }
        s = json.dumps(d) + ' "text": "'
        while len(s) < 1024:
            s += rng.choice(words) + " "
        out.append(s[:1024].encode())
    return out


def admin(s: System) -> AdminClient:
    return AdminClient({"bootstrap.servers": s.bootstrap, "log_level": 3})


def create_topic(s: System, topic: str, config: dict[str, str]) -> None:
    ad = admin(s)  # kept alive until the answer: a destroyed client fails its futures
    ad.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(60)


def set_config(s: System, topic: str, key: str, value: str) -> None:
    r = ConfigResource(
        "topic",
        topic,
        incremental_configs=[ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)],
    )
    ad = admin(s)
    ad.incremental_alter_configs([r])[r].result(60)


def load(s: System, topics: list[str], records: int, keys: int, codec: str) -> float:
    """Produce `records` keyed records to each topic (interleaved); seconds taken."""
    p = Producer(
        {
            "bootstrap.servers": s.bootstrap,
            "acks": "1",
            "linger.ms": 10,
            "compression.type": codec,
            "log_level": 3,
        }
    )
    values = make_values(4096)
    rng = random.Random(7)
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    t0 = time.perf_counter()
    for i in range(records):
        for t in topics:
            key = b"key-%05d" % rng.randrange(keys)
            v = values[(i * 7 + len(t)) % len(values)]
            while True:
                try:
                    p.produce(t, v, key=key, on_delivery=on_delivery)
                    break
                except BufferError:
                    p.poll(0.05)
        if i & 1023 == 0:
            p.poll(0)
    left = p.flush(300)
    if left or errors:
        raise PhaseError(f"load: {left} undelivered, {len(errors)} errors {errors[:1]}")
    return time.perf_counter() - t0


def closed_bytes(d: Path) -> int:
    """Bytes of the closed segments (all .log files but the newest) of a partition."""
    logs = sorted(d.glob("*.log"))
    return sum(f.stat().st_size for f in logs[:-1])


def wait_cleaned(s: System, topic: str, mark: Any, timeout: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = s.cleaned(topic, mark)
        if r is not None:
            return r
        time.sleep(0.2)
    raise PhaseError(f"{s.name}: {topic} not cleaned within {timeout:.0f}s")


class Cleaning:
    """Switch `topic` to compact now and watch for the end of its cleaning in a thread."""

    def __init__(self, s: System, topic: str, timeout: float) -> None:
        self.s, self.topic = s, topic
        self.size = closed_bytes(s.log_dir(topic))
        self.cpu0 = s.cpu_s()
        mark = s.mark()
        self.switched = time.time()
        set_config(s, topic, "cleanup.policy", "compact")
        self.result: dict[str, float] | None = None
        self.error: Exception | None = None
        self.cpu1 = 0.0

        def watch() -> None:
            try:
                self.result = wait_cleaned(s, topic, mark, timeout)
                self.cpu1 = s.cpu_s()
            except Exception as e:
                self.error = e

        self.thread = threading.Thread(target=watch, daemon=True)
        self.thread.start()

    def join(self) -> dict[str, float]:
        self.thread.join()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        r = dict(self.result)
        r["start"] = r["end"] - r["seconds"]
        r["log_mb"] = self.size / MB
        r["mb_s"] = self.size / MB / r["seconds"] if r["seconds"] else 0.0
        r["wall_s"] = r["end"] - self.switched
        r["cpu_s"] = self.cpu1 - self.cpu0
        r["cpu_s_per_gb"] = r["cpu_s"] / (self.size / 1e9)
        return r


# -- client load -------------------------------------------------------------------------


def producer_perf(
    s: System, topic: str, n: int, acks: str, rate: int, a: argparse.Namespace
) -> dict:
    """ProducerPerformance: n x 1 KiB, at `rate` records/s (-1: as fast as it goes)."""
    args: list[Any] = [
        "--topic",
        topic,
        "--num-records",
        n,
        "--record-size",
        1024,
        "--throughput",
        rate,
        "--producer-props",
        f"bootstrap.servers={s.bootstrap}",
        f"acks={acks}",
        *a.producer_prop,
    ]
    t0 = time.time()
    out, _ = run_tool(PRODUCER_PERF, args, timeout=a.phase_timeout)
    res: dict[str, Any] = parse_producer_perf(out)
    # ProducerPerformance's clock starts after the JVM is up: its window is the last
    # records/rate seconds before it exited.
    t1 = time.time()
    res["window"] = (t1 - res["records"] / res["rec_s"], t1)
    res["start_s"] = t0
    return res


def fetch(s: System, topic: str, seconds: float, started: Any = None) -> dict:
    """Read `topic` with a librdkafka consumer (assign, no group) for `seconds`, from its
    start and again from the start at its end; the clock runs from the first record on,
    when `started()` is called."""
    c = Consumer(
        {
            "bootstrap.servers": s.bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "log_level": 3,
        }
    )
    try:
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        got = nbytes = 0
        t0 = end = 0.0
        deadline = time.monotonic() + 60
        while not t0 or time.time() < end:
            if not t0 and time.monotonic() > deadline:
                raise PhaseError(f"fetch: nothing from {topic}")
            for m in c.consume(num_messages=2000, timeout=0.5):
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        c.seek(TopicPartition(topic, 0, OFFSET_BEGINNING))
                    continue
                if not t0:
                    t0, end = time.time(), time.time() + seconds
                    if started is not None:
                        started()
                    continue
                got += 1
                nbytes += len(m.value() or b"")
        t1 = time.time()
        return {"mb_s": nbytes / MB / (t1 - t0), "records": got, "window": (t0, t1)}
    finally:
        c.close()


def has_data(d: Path) -> bool:
    return any(f.stat().st_size > 0 for f in d.glob("*.log")) if d.is_dir() else False


# phase -> (acks, records/s; -1: as fast as it goes), and the fetch phase
PHASES = {"acks=1": ("1", -1), "acks=all": ("all", -1), "acks=all fixed": ("all", 0), "fetch": None}


def medians(rs: list[dict[str, Any]]) -> dict[str, float]:
    """Per-key median of the numeric values of several runs."""
    return {
        k: statistics.median(r[k] for r in rs)
        for k, v in rs[0].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def load_topic(state: str, phase: str, run: str) -> str:
    return f"load-{state}-{phase.replace(' ', '-').replace('=', '')}-{run}"


def measure(
    s: System,
    state: str,
    phase: str,
    plan: dict,
    dirty: str | None,
    run: str,
    a: argparse.Namespace,
) -> dict[str, Any]:
    """One produce or fetch run; with `dirty`, that topic is switched to compact once
    the run has begun (the JVM up and its first records written, or the first record
    fetched), so that the cleaning overlaps the measured window."""
    box: dict[str, Any] = {}

    def switch() -> None:
        if dirty:
            box["c"] = Cleaning(s, dirty, a.phase_timeout)

    spec = PHASES[phase]
    if spec is None:
        r = fetch(s, load_topic(state, "acks=all", run), plan["fetch_s"], switch)
    else:
        acks, rate = spec
        n = plan["records"] if rate < 0 else plan["fixed_records"]
        topic = load_topic(state, phase, run)
        create_topic(s, topic, {})
        th = threading.Thread(
            target=lambda: box.update(
                r=_catch(producer_perf, s, topic, n, acks, rate or a.fixed_rate, a)
            ),
            daemon=True,
        )
        th.start()
        d = s.log_dir(topic)
        while dirty and th.is_alive() and not has_data(d):
            time.sleep(0.05)
        switch()
        th.join()
        r = box["r"]
        if isinstance(r, Exception):
            raise r
    if "c" in box:
        cr = box["c"].join()
        r["cleaner_busy_share"] = overlap(r["window"], cr)
        r["cleaning"] = cr
    return r


def _catch(f: Any, *args: Any) -> Any:
    try:
        return f(*args)
    except Exception as e:
        return e


def overlap(window: tuple[float, float], c: dict[str, float]) -> float:
    """Share of `window` the cleaner was cleaning."""
    lo, hi = window
    busy = max(0.0, min(hi, c["end"]) - max(lo, c["start"]))
    return busy / (hi - lo) if hi > lo else 0.0


# -- one system --------------------------------------------------------------------------


def run_system(s: System, a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    t = time.monotonic()
    s.start()
    log(f"{s.name}: ready in {time.monotonic() - t:.1f}s on {s.bootstrap}")
    run = uuid.uuid4().hex[:6]
    seg = {"segment.bytes": str(SEGMENT_BYTES)}

    # warm-up: the JIT / the worker process, a small cleaning, a produce run
    warm = f"warm-{run}"
    create_topic(s, warm, {"cleanup.policy": "delete", "segment.bytes": str(1 * MB)})
    load(s, [warm], 20_000, 1000, a.codec)
    Cleaning(s, warm, a.phase_timeout).join()
    create_topic(s, f"wload-{run}", {})
    w = producer_perf(s, f"wload-{run}", a.warmup_records, "1", -1, a)
    log(f"{s.name}: warm-up produce {w['mb_s']:.1f} MB/s")

    rounds = range(a.rounds)
    dirty = [f"dirty{i}-{run}" for i in range(a.rounds * (1 + len(PHASES)))]
    for d in dirty:
        create_topic(s, d, {"cleanup.policy": "delete", **seg})
    dt = load(s, dirty, a.records, a.keys, a.codec)
    sizes = [closed_bytes(s.log_dir(d)) for d in dirty]
    out["load"] = {
        "seconds": dt,
        "raw_mb": len(dirty) * a.records * 1024 / MB,
        "closed_mb_per_topic": [x / MB for x in sizes],
    }
    log(
        f"{s.name}: loaded {len(dirty)} x {a.records} records in {dt:.1f}s,"
        f" {sizes[0] / MB:.0f} MB each"
    )
    dirty.reverse()  # popped from the end: the order they were loaded in

    # the cleaner alone
    cleans = []
    for _ in rounds:
        c = Cleaning(s, dirty.pop(), a.phase_timeout).join()
        cleans.append(c)
        log(
            f"{s.name}: cleaned {c['log_mb']:.0f} MB in {c['seconds']:.2f}s ="
            f" {c['mb_s']:.1f} MB/s, {c['cpu_s_per_gb']:.1f} CPU s/GB (wall {c['wall_s']:.1f}s)"
        )
    out["clean"] = medians(cleans)
    out["clean_rounds"] = cleans
    # Each busy run should last about one cleaning (see the module doc).
    secs = max(out["clean"]["seconds"], a.min_seconds)
    plan = {
        "records": max(a.min_records, min(a.max_records, int(w["rec_s"] * secs))),
        "fixed_records": int(a.fixed_rate * secs),
        "fetch_s": secs,
    }
    out["plan"] = plan
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        st: {ph: [] for ph in PHASES} for st in ("idle", "busy")
    }
    for rnd in rounds:
        for phase in PHASES:
            # idle and busy back to back, their order flipped every round
            for state in ("idle", "busy") if rnd % 2 == 0 else ("busy", "idle"):
                d = dirty.pop() if state == "busy" else None
                r = measure(s, state, phase, plan, d, f"{run}-r{rnd}", a)
                if "cleaning" in r:
                    r["cleaner_mb_s"] = r["cleaning"]["mb_s"]
                runs[state][phase].append(r)
                extra = (
                    f", cleaner busy {r['cleaner_busy_share']:.0%} of it" if "cleaning" in r else ""
                )
                lat = f" p99 {r['p99_ms']:.0f} ms" if "p99_ms" in r else ""
                log(
                    f"{s.name}: round {rnd + 1} {state:4} {phase:14} {r['mb_s']:6.1f} MB/s"
                    f"{lat}{extra}"
                )
    for state, by_phase in runs.items():
        out[state] = {ph: medians(rs) for ph, rs in by_phase.items()}
    out["rounds"] = runs
    return out


# -- profile ---------------------------------------------------------------------------


def profile(a: argparse.Namespace) -> str:
    """cProfile of one StraitMQ cleaning (`storage.compaction.clean`) in this process,
    over a log written like the data set: `--records` records, `--keys` keys, batches of
    `--profile-batch` records in `--codec`. Returns the top functions by own time."""
    import cProfile
    import io
    import pstats

    from straitmq.broker.log_cleaner import cleanable, make_job
    from straitmq.broker.record_codec import build_batch
    from straitmq.broker.records import validate_batches
    from straitmq.broker.storage.batch_filter import (
        CODEC_GZIP,
        CODEC_LZ4,
        CODEC_NONE,
        CODEC_SNAPPY,
        CODEC_ZSTD,
    )
    from straitmq.broker.storage.compaction import clean
    from straitmq.broker.storage.log import LogConfig, PartitionLog

    codec = {
        "none": CODEC_NONE,
        "gzip": CODEC_GZIP,
        "snappy": CODEC_SNAPPY,
        "lz4": CODEC_LZ4,
        "zstd": CODEC_ZSTD,
    }[a.codec]

    @dataclass
    class Settings:  # Kafka's defaults, as CleanerSettings would give them
        threads: int = 1
        io_max_bytes_per_second: float = 0.0
        dedupe_buffer_size: int = 128 * MB
        backoff_ms: int = BACKOFF_MS
        enabled: bool = True

    d = tempfile.mkdtemp(prefix="cleaner-profile-")
    try:
        plog = PartitionLog(d, LogConfig(segment_bytes=SEGMENT_BYTES, compact=True, delete=False))
        values = make_values(4096)
        rng = random.Random(7)
        now = int(time.time() * 1000)
        t0 = time.perf_counter()
        for i in range(0, a.records, a.profile_batch):
            recs = [
                (b"key-%05d" % rng.randrange(a.keys), values[(i + j) % len(values)], [])
                for j in range(a.profile_batch)
            ]
            view = memoryview(build_batch(recs, now, codec))
            plog.append(view, validate_batches(view, 1 << 22), leader_epoch=0)
        size = sum(seg.size for seg in plog.closed_segments())
        log(f"profile: wrote {size / MB:.0f} MB in {time.perf_counter() - t0:.1f}s")
        job = make_job(plog, cleanable(plog, plog.log_end_offset, now), Settings(), now)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        result = clean(job)
        prof.disable()
        dt = time.perf_counter() - t0
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        head = (
            f"one cleaning of {size / MB:.0f} MB ({a.records} records, {a.keys} keys,"
            f" {a.profile_batch} records per {a.codec} batch): {dt:.2f}s under cProfile,"
            f" {result.records_removed} records removed, {result.bytes_written / MB:.1f} MB"
            " written\n"
        )
        plog.close()
        return head + buf.getvalue()
    finally:
        shutil.rmtree(d, ignore_errors=True)


# -- report ------------------------------------------------------------------------------


def table(results: dict[str, dict[str, Any]]) -> str:
    names = list(results)
    rows: list[tuple[str, Any]] = [
        ("log cleaned, MB", lambda r: r["clean"]["log_mb"]),
        ("cleaner MB/s (its own seconds)", lambda r: r["clean"]["mb_s"]),
        ("cleaning seconds", lambda r: r["clean"]["seconds"]),
        ("switch to cleaned, wall s", lambda r: r["clean"]["wall_s"]),
        ("broker CPU s per GB cleaned", lambda r: r["clean"]["cpu_s_per_gb"]),
        ("cleaner MB/s during produce acks=1", _g("busy", "acks=1", "cleaner_mb_s")),
    ]
    for phase in ("acks=1", "acks=all", "acks=all fixed"):
        for state in ("idle", "busy"):
            rows.append((f"produce {phase} MB/s, {state}", _g(state, phase, "mb_s")))
            rows.append((f"produce {phase} p99 ms, {state}", _g(state, phase, "p99_ms")))
        rows.append((f"produce {phase} MB/s busy/idle", _ratio(phase, "mb_s")))
        rows.append((f"produce {phase} p99 busy/idle", _ratio(phase, "p99_ms")))
        rows.append((f"cleaner busy share, {phase}", _g("busy", phase, "cleaner_busy_share")))
    rows.append(("fetch MB/s, idle", _g("idle", "fetch", "mb_s")))
    rows.append(("fetch MB/s, busy", _g("busy", "fetch", "mb_s")))
    rows.append(("fetch MB/s busy/idle", _ratio("fetch", "mb_s")))
    rows.append(("cleaner busy share, fetch", _g("busy", "fetch", "cleaner_busy_share")))
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for label, f in rows:
        cells = []
        for n in names:
            try:
                cells.append(_fmt(f(results[n])))
            except (KeyError, TypeError, ZeroDivisionError):
                cells.append("-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if "kafka" in results and len(names) > 1:
        others = [n for n in names if n != "kafka"]
        lines += ["", "| vs Kafka | " + " | ".join(f"{n}/kafka" for n in others) + " |"]
        lines.append("|---|" + "---:|" * len(others))
        for label, f in rows:
            if "share" in label or "log cleaned" in label:
                continue
            cells = []
            for n in others:
                try:
                    cells.append(f"{f(results[n]) / f(results['kafka']):.2f}")
                except (KeyError, TypeError, ZeroDivisionError):
                    cells.append("-")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _g(state: str, phase: str, key: str) -> Any:
    return lambda r: r[state][phase][key]


def _ratio(phase: str, key: str) -> Any:
    return lambda r: r["busy"][phase][key] / r["idle"][phase][key]


def _fmt(v: float) -> str:
    if isinstance(v, float) and v < 1.5 and v != int(v):
        return f"{v:.2f}"
    return f"{v:,.1f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", default="kafka,straitmq,straitmq-thread")
    ap.add_argument("--records", type=int, default=300_000, help="per dirty topic")
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3, help="medians of this many runs")
    ap.add_argument("--codec", default="lz4", help="the load's compression.type")
    ap.add_argument("--warmup-records", type=int, default=100_000)
    ap.add_argument("--min-records", type=int, default=50_000, help="per produce run")
    ap.add_argument("--max-records", type=int, default=600_000, help="per produce run")
    ap.add_argument(
        "--producer-prop",
        action="append",
        default=["batch.size=65536", "linger.ms=5"],
        help="ProducerPerformance producer property k=v (repeatable)",
    )
    ap.add_argument("--min-seconds", type=float, default=3.0, help="per busy run, at least")
    ap.add_argument(
        "--fixed-rate", type=int, default=2000, help="records/s of the fixed-rate latency run"
    )
    ap.add_argument("--phase-timeout", type=float, default=600)
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--json", default=None)
    ap.add_argument("--report", metavar="JSON", help="print the tables of an earlier run")
    ap.add_argument(
        "--profile", action="store_true", help="profile one StraitMQ cleaning (no brokers)"
    )
    ap.add_argument("--profile-batch", type=int, default=200, help="records per batch")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.report:
        print(table(json.loads(Path(a.report).read_text())["results"]))
        return 0
    if a.profile:
        print(profile(a))
        return 0
    work = Path(tempfile.mkdtemp(prefix="cleaner-bench-"))
    results: dict[str, Any] = {}
    errors: list[str] = []
    t0 = time.monotonic()
    for name in a.systems.split(","):
        d = work / name
        d.mkdir()
        s: System = Kafka(d) if name == "kafka" else Strait(d, name.partition("-")[2] or "process")
        try:
            load0 = os.getloadavg()[0]
            results[name] = run_system(s, a)
            # the machine is shared: how busy it was says how far to trust MB/s
            results[name]["loadavg_1min"] = [load0, os.getloadavg()[0]]
        except Exception as e:
            errors.append(f"{name}: {e!r}")
            log(f"{name}: FAILED {e!r}")
        finally:
            s.stop()
            if not a.keep:
                shutil.rmtree(d, ignore_errors=True)
    if a.keep:
        log(f"work folder kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    log(f"total {time.monotonic() - t0:.0f}s")
    if errors:
        print("\nerrors:\n  " + "\n  ".join(errors))
    path = (
        Path(a.json)
        if a.json
        else REPO_ROOT / ".cache" / "bench" / f"cleaner-{_dt.datetime.now():%Y%m%d-%H%M%S}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"args": vars(a), "results": results, "errors": errors}, indent=1))
    log(f"results written to {path}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
