"""StraitMQ vs Apache Kafka throughput / latency benchmark (not a pytest test).

Runs the same workload against each target broker, one target after the other:

  java-produce     Kafka's own org.apache.kafka.tools.ProducerPerformance
                   (--record-size 1024 --throughput -1, --num-records N), acks=1 then acks=all
  java-consume     org.apache.kafka.tools.ConsumerPerformance reading the acks=all topic back
  rdkafka-produce  librdkafka (confluent_kafka) producer, N x 1 KiB messages, as fast as possible
  rdkafka-consume  librdkafka consumer reading them back (assign(), no group join)
  latency          librdkafka end-to-end latency at a fixed rate (default 2000 msg/s for 10 s):
                   send time (perf_counter_ns) embedded in the value, consumer thread in the same
                   process records now - sent; p50/p90/p99/p99.9/max

Examples (from the repo root):
  python -m bench.throughput --with-kafka --strait 127.0.0.1:9092
  python -m bench.throughput --with-kafka --num-records 20000 --latency-seconds 3
  python -m bench.throughput --kafka 127.0.0.1:19092 --strait 127.0.0.1:9092 --partitions 3
  python -m bench.throughput --target a=127.0.0.1:9092 --target b=127.0.0.1:9093

--repeat N alternates the targets over N rounds and reports per-metric medians.

Output: one table (metric | value per target | ratio of each target to the baseline: the "kafka"
target when there is one, else the first) and a JSON dump (--json PATH, default
.cache/bench/throughput-<timestamp>.json). Exit code 0 when every phase ran without error.

Topics (bench-<run>-<target>-<phase>) are created with the Java AdminClient (StraitClient
admin create-topic) before each phase, and deleted at the end unless --keep-topics.
Python imports: the standard library and confluent_kafka (rdkafka phases are skipped without it).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import statistics
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # allow `python bench/throughput.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.javatools import (
    CONSUMER_PERF,
    PERF_JVM_ARGS,
    PRODUCER_PERF,
    REPO_ROOT,
    java_cmd,
    straitclient,
)
from bench.kafka_ref import REF_KAFKA, KafkaRef, wait_for_broker

try:
    import confluent_kafka
except ImportError:  # pragma: no cover
    confluent_kafka = None

MB = 1024 * 1024  # Kafka's perf tools report MB = 2^20 bytes

ALL_PHASES = ["java-produce", "java-consume", "rdkafka-produce", "rdkafka-consume", "latency"]

# metric name -> (unit, higher_is_better)
METRICS: dict[str, tuple[str, bool]] = {
    "java_produce_acks1_mb_s": ("MB/s", True),
    "java_produce_acks1_rec_s": ("rec/s", True),
    "java_produce_acks1_avg_lat_ms": ("ms", False),
    "java_produce_acks1_p99_lat_ms": ("ms", False),
    "java_produce_acksall_mb_s": ("MB/s", True),
    "java_produce_acksall_rec_s": ("rec/s", True),
    "java_produce_acksall_avg_lat_ms": ("ms", False),
    "java_produce_acksall_p99_lat_ms": ("ms", False),
    "java_consume_mb_s": ("MB/s", True),
    "java_consume_rec_s": ("rec/s", True),
    "java_consume_fetch_mb_s": ("MB/s", True),
    "java_consume_rebalance_ms": ("ms", False),
    "rdkafka_produce_mb_s": ("MB/s", True),
    "rdkafka_produce_rec_s": ("rec/s", True),
    "rdkafka_consume_mb_s": ("MB/s", True),
    "rdkafka_consume_rec_s": ("rec/s", True),
    "e2e_latency_p50_ms": ("ms", False),
    "e2e_latency_p90_ms": ("ms", False),
    "e2e_latency_p99_ms": ("ms", False),
    "e2e_latency_p999_ms": ("ms", False),
    "e2e_latency_max_ms": ("ms", False),
    "e2e_latency_mean_ms": ("ms", False),
    "e2e_rate_msg_s": ("msg/s", True),
    "e2e_lost": ("msgs", False),
}


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class PhaseError(RuntimeError):
    pass


# ---------------------------------------------------------------- Java tools


def run_tool(
    main_class: str, args: list[Any], timeout: float, jars: str = "3.9"
) -> tuple[str, str]:
    """Run a Kafka tool to its end; `jars="4.4"` runs it from the Kafka 4.4 jars."""
    cmd = java_cmd(main_class, args, jvm_args=PERF_JVM_ARGS, include_classes=False, jars=jars)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise PhaseError(f"{main_class} timed out after {timeout:.0f}s") from e
    if p.returncode != 0:
        raise PhaseError(f"{main_class} exited {p.returncode}: {p.stderr[-2000:]}")
    return p.stdout, p.stderr


# e.g. "200000 records sent, 95238.095238 records/sec (93.01 MB/sec), 150.23 ms avg latency,
#       400.00 ms max latency, 120 ms 50th, 300 ms 95th, 390 ms 99th, 399 ms 99.9th."
PP_FINAL = re.compile(
    r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
    r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99\.9th"
)


def parse_producer_perf(out: str) -> dict[str, float]:
    m = None
    for line in out.splitlines():
        mm = PP_FINAL.search(line)
        if mm:
            m = mm
    if m is None:
        raise PhaseError(f"no final summary in ProducerPerformance output: {out[-500:]!r}")
    keys = [
        "records",
        "rec_s",
        "mb_s",
        "avg_lat_ms",
        "max_lat_ms",
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "p999_ms",
    ]
    return {k: float(v) for k, v in zip(keys, m.groups(), strict=False)}


def parse_consumer_perf(out: str) -> dict[str, str]:
    """Header 'start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec,
    rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec' then one line of values."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if ln.startswith("start.time") and i + 1 < len(lines):
            keys = [k.strip() for k in ln.split(",")]
            vals = [v.strip() for v in lines[i + 1].split(",")]
            if len(keys) == len(vals):
                return dict(zip(keys, vals, strict=False))
    raise PhaseError(f"cannot parse ConsumerPerformance output: {out[-500:]!r}")


def create_topic(bootstrap: str, topic: str, partitions: int, rf: int) -> None:
    r = straitclient(
        [
            "admin",
            "--bootstrap",
            bootstrap,
            "create-topic",
            topic,
            partitions,
            rf,
            "--if-not-exists",
        ],
        timeout=120,
    )
    if r.returncode != 0:
        raise PhaseError(f"create-topic {topic} failed: {r.stdout.strip()} {r.stderr[-1000:]}")


def delete_topic(bootstrap: str, topic: str) -> None:
    try:
        straitclient(["admin", "--bootstrap", bootstrap, "delete-topic", topic], timeout=60)
    except Exception as e:  # best effort
        log(f"  delete-topic {topic}: {e}")


def producer_perf(bootstrap: str, topic: str, a: argparse.Namespace, acks: str) -> dict[str, float]:
    args: list[Any] = [
        "--topic",
        topic,
        "--num-records",
        a.num_records,
        "--record-size",
        a.record_size,
        "--throughput",
        -1,
        "--producer-props",
        f"bootstrap.servers={bootstrap}",
        f"acks={acks}",
        *a.producer_prop,
    ]
    out, _ = run_tool(PRODUCER_PERF, args, timeout=a.phase_timeout)
    res = parse_producer_perf(out)
    if int(res["records"]) != a.num_records:
        raise PhaseError(f"ProducerPerformance sent {res['records']:.0f} of {a.num_records}")
    return res


def consumer_perf(bootstrap: str, topic: str, a: argparse.Namespace, group: str) -> dict[str, str]:
    args = [
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--messages",
        a.num_records,
        "--timeout",
        30000,
        "--group",
        group,
    ]
    out, _ = run_tool(CONSUMER_PERF, args, timeout=a.phase_timeout)
    res = parse_consumer_perf(out)
    if int(res["data.consumed.in.nMsg"]) < a.num_records:
        raise PhaseError(
            f"ConsumerPerformance read {res['data.consumed.in.nMsg']} of {a.num_records}"
        )
    return res


# ---------------------------------------------------------------- librdkafka


def send_all(
    p: Any, topic: str, payload: bytes, n: int, timeout: float, on_delivery: Any
) -> tuple[float, int]:
    """Produce `payload` n times as fast as librdkafka's queue takes it, then flush:
    (seconds from the first produce to the flush, records left undelivered). Raises
    TimeoutError if the queue stays full past `timeout`."""
    deadline = time.monotonic() + timeout
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, payload, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.05)
                if time.monotonic() > deadline:
                    raise TimeoutError("produce: queue full until the phase timeout") from None
        if i & 1023 == 0:
            p.poll(0)
    remaining = p.flush(max(1.0, deadline - time.monotonic()))
    return time.perf_counter() - t0, remaining


def rdkafka_produce(bootstrap: str, topic: str, a: argparse.Namespace) -> dict[str, float]:
    ck = confluent_kafka
    conf = {
        "bootstrap.servers": bootstrap,
        "acks": a.rdkafka_acks,
        "client.id": "bench-rdkafka",
        "linger.ms": a.rdkafka_linger_ms,
        "compression.type": "none",
    }
    p = ck.Producer(conf)
    n = a.num_records
    payload = os.urandom(a.record_size)
    state = {"ok": 0, "err": 0, "first_err": None}

    def on_delivery(err, msg):
        if err is None:
            state["ok"] += 1
        else:
            state["err"] += 1
            if state["first_err"] is None:
                state["first_err"] = str(err)

    # warm the connection / metadata so it is not timed
    p.list_topics(topic, timeout=30)
    try:
        dt, remaining = send_all(p, topic, payload, n, a.phase_timeout, on_delivery)
    except TimeoutError:
        raise PhaseError("rdkafka produce timed out (queue full)") from None
    if remaining or state["err"]:
        raise PhaseError(
            f"rdkafka produce: {remaining} undelivered, {state['err']} errors "
            f"(first: {state['first_err']})"
        )
    return {"records": n, "seconds": dt, "rec_s": n / dt, "mb_s": n * a.record_size / MB / dt}


def rdkafka_consume(
    bootstrap: str, topic: str, a: argparse.Namespace, expected: int
) -> dict[str, float]:
    ck = confluent_kafka
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-rdc-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "client.id": "bench-rdkafka-consumer",
        }
    )
    try:
        md = c.list_topics(topic, timeout=30)
        parts = sorted(md.topics[topic].partitions)
        c.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in parts])
        got = nbytes = 0
        deadline = time.monotonic() + a.phase_timeout
        last_msg = time.monotonic()
        t0 = time.perf_counter()
        while got < expected and time.monotonic() < deadline:
            msgs = c.consume(num_messages=min(1000, expected - got), timeout=0.5)
            if not msgs:
                if time.monotonic() - last_msg > 30:
                    break
                continue
            last_msg = time.monotonic()
            for m in msgs:
                if m.error() is None:
                    got += 1
                    nbytes += len(m.value() or b"")
        dt = time.perf_counter() - t0
    finally:
        c.close()
    if got < expected:
        raise PhaseError(f"rdkafka consume read {got} of {expected}")
    return {"records": got, "seconds": dt, "rec_s": got / dt, "mb_s": nbytes / MB / dt}


def percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return float("nan")
    idx = min(len(sorted_vals) - 1, max(0, round(q * len(sorted_vals) + 0.5) - 1))
    return sorted_vals[idx]


def e2e_latency(bootstrap: str, topic: str, a: argparse.Namespace) -> dict[str, float]:
    """Fixed-rate producer (main thread) + consumer thread in the same process.

    value = 8-byte seq | 8-byte send perf_counter_ns | 1-byte warmup flag | padding."""
    ck = confluent_kafka
    rate = a.latency_rate
    n = int(rate * a.latency_seconds)
    size = max(17, a.latency_record_size)
    pad = b"x" * (size - 17)
    p = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": a.latency_acks,
            "linger.ms": 0,
            "client.id": "bench-e2e-producer",
        }
    )
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-e2e-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 500,
            "fetch.min.bytes": 1,
            "client.id": "bench-e2e-consumer",
        }
    )
    md = c.list_topics(topic, timeout=30)
    parts = sorted(md.topics[topic].partitions)
    c.assign([ck.TopicPartition(topic, pp, ck.OFFSET_BEGINNING) for pp in parts])
    p.list_topics(topic, timeout=30)

    lat_ns: list[int] = []
    seen = {"warm": 0, "measured": 0}
    warm_parts: set[int] = set()
    warm_lat: list[float] = []  # ms, warm-up messages, in arrival order
    stop = threading.Event()
    errors: list[str] = []

    def consumer_loop() -> None:
        while not stop.is_set():
            # poll() returns as soon as one message is there; then drain what is already
            # fetched without waiting (consume(n, timeout>0) would wait for n messages)
            first = c.poll(0.1)
            if first is None:
                continue
            now = time.perf_counter_ns()
            msgs = [first, *c.consume(num_messages=1000, timeout=0)]
            for m in msgs:
                if m.error() is not None:
                    errors.append(str(m.error()))
                    continue
                v = m.value()
                _seq, sent = struct.unpack_from(">qq", v, 0)
                if v[16]:
                    seen["warm"] += 1
                    warm_parts.add(m.partition())
                    warm_lat.append((now - sent) / 1e6)
                else:
                    seen["measured"] += 1
                    lat_ns.append(now - sent)

    th = threading.Thread(target=consumer_loop, name="e2e-consumer", daemon=True)
    th.start()
    try:
        # Warm-up: send (flagged) at the same rate until the consumer has received from every
        # partition (a fresh topic's partitions do not all become fetchable at once), then for
        # at least --latency-warmup s and until the latency has settled: the p99 of the last
        # 1-s window is <= max(1.25 x the best window so far, 5 ms), the consumer keeping up;
        # at most --latency-warmup-max s. A JVM broker needs that (JIT): cold, Kafka's p50 is
        # in the hundreds of ms at 2000 single-message produce requests/s.
        interval = 1.0 / rate
        t_warm = time.monotonic()
        min_end = max_end = next_check = None
        windows: list[tuple[int, float]] = []  # (messages, p99 ms) per 1-s window
        idx = 0
        seq = 0
        t_next = time.perf_counter()
        while True:
            now_m = time.monotonic()
            if min_end is None:
                if len(warm_parts) == len(parts):
                    min_end = now_m + a.latency_warmup
                    max_end = now_m + max(a.latency_warmup, a.latency_warmup_max)
                    next_check = now_m + 1.0
                    idx = len(warm_lat)
                elif now_m - t_warm > 20:
                    raise PhaseError(
                        f"latency: during 20 s of warm-up the consumer received from "
                        f"partitions {sorted(warm_parts)} only, of {parts}"
                    )
            elif now_m >= next_check:
                chunk = sorted(warm_lat[idx:])
                idx += len(chunk)
                windows.append((len(chunk), percentile(chunk, 0.99) if chunk else float("inf")))
                next_check += 1.0
                best = min(w[1] for w in windows)
                settled = (
                    len(windows) >= 2
                    and windows[-1][0] >= 0.5 * rate
                    and windows[-1][1] <= max(1.25 * best, 5.0)
                )
                if (now_m >= min_end and settled) or now_m >= max_end:
                    break
            _sleep_until(t_next)
            p.produce(topic, struct.pack(">qqB", seq, time.perf_counter_ns(), 1) + pad)
            p.poll(0)
            seq += 1
            t_next += interval
        warm_secs = time.monotonic() - t_warm
        # measured phase
        t_start = time.perf_counter()
        t_next = t_start
        for i in range(n):
            _sleep_until(t_next)
            p.produce(topic, struct.pack(">qqB", i, time.perf_counter_ns(), 0) + pad)
            p.poll(0)
            t_next += interval
        send_secs = time.perf_counter() - t_start
        p.flush(30)
        wait_end = time.monotonic() + 30
        while seen["measured"] < n and time.monotonic() < wait_end:
            time.sleep(0.05)
    finally:
        stop.set()
        th.join(10)
        c.close()
    vals = sorted(x / 1e6 for x in lat_ns)
    res = {
        "sent": n,
        "received": len(vals),
        "lost": n - len(vals),
        "rate_msg_s": n / send_secs,
        "p50_ms": percentile(vals, 0.50),
        "p90_ms": percentile(vals, 0.90),
        "p99_ms": percentile(vals, 0.99),
        "p999_ms": percentile(vals, 0.999),
        "max_ms": vals[-1] if vals else float("nan"),
        "mean_ms": statistics.fmean(vals) if vals else float("nan"),
        "consumer_errors": errors[:5],
        "warmup_seconds": round(warm_secs, 1),
        "warmup_window_p99_ms": [round(w[1], 2) for w in windows],
    }
    return res


def _sleep_until(t: float) -> None:
    # plain sleep (no busy-wait: spinning would hold the GIL and delay the consumer thread)
    d = t - time.perf_counter()
    if d > 0:
        time.sleep(d)


# ---------------------------------------------------------------- driver


def run_target(
    name: str, bootstrap: str, a: argparse.Namespace, run_id: str, rep: int = 0
) -> tuple[dict, dict, dict]:
    host, port = bootstrap.rsplit(":", 1)
    log(
        f"== target {name} ({bootstrap})"
        + (f", round {rep + 1}/{a.repeat}" if a.repeat > 1 else "")
    )
    wait_for_broker(host, int(port), timeout=a.connect_timeout)
    metrics: dict[str, float] = {}
    raw: dict[str, Any] = {}
    errors: dict[str, str] = {}
    topics: list[str] = []
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)

    def topic(phase: str) -> str:
        t = f"bench-{run_id}-{safe}-r{rep}-{phase}"
        create_topic(bootstrap, t, a.partitions, a.replication_factor)
        topics.append(t)
        return t

    def phase(label: str, fn) -> None:
        log(f"  {label} ...")
        t0 = time.monotonic()
        try:
            fn()
            log(f"  {label} done in {time.monotonic() - t0:.1f}s")
        except Exception as e:  # keep going with the other phases
            errors[label] = f"{type(e).__name__}: {e}"
            log(f"  {label} FAILED: {errors[label]}")

    ph = set(a.phases)
    pp_all_topic: list[str] = []

    if a.warmup_records > 0 and rep == 0:

        def warmup() -> None:
            t = topic("warmup")
            w = argparse.Namespace(**{**vars(a), "num_records": a.warmup_records})
            raw["warmup"] = producer_perf(bootstrap, t, w, "1")
            consumer_perf(bootstrap, t, w, group=f"bench-warmup-{run_id}")

        phase(f"warm-up ({a.warmup_records} records, not reported)", warmup)

    if "java-produce" in ph or "java-consume" in ph:

        def java_produce() -> None:
            for acks, tag in (("1", "acks1"), ("all", "acksall")):
                if "java-produce" not in ph and acks == "1":
                    continue
                t = topic(f"pp{tag}")
                r = producer_perf(bootstrap, t, a, acks)
                raw[f"java_produce_{tag}"] = r
                if "java-produce" in ph:
                    metrics[f"java_produce_{tag}_mb_s"] = r["mb_s"]
                    metrics[f"java_produce_{tag}_rec_s"] = r["rec_s"]
                    metrics[f"java_produce_{tag}_avg_lat_ms"] = r["avg_lat_ms"]
                    metrics[f"java_produce_{tag}_p99_lat_ms"] = r["p99_ms"]
                if acks == "all":
                    pp_all_topic.append(t)

        phase("java-produce (ProducerPerformance acks=1, acks=all)", java_produce)

    if "java-consume" in ph:

        def java_consume() -> None:
            if not pp_all_topic:
                raise PhaseError("no data: the acks=all ProducerPerformance run failed")
            r = consumer_perf(bootstrap, pp_all_topic[0], a, group=f"bench-cp-{run_id}-{rep}")
            raw["java_consume"] = r
            metrics["java_consume_mb_s"] = float(r["MB.sec"])
            metrics["java_consume_rec_s"] = float(r["nMsg.sec"])
            metrics["java_consume_fetch_mb_s"] = float(r["fetch.MB.sec"])
            metrics["java_consume_rebalance_ms"] = float(r["rebalance.time.ms"])

        phase("java-consume (ConsumerPerformance)", java_consume)

    rd_topic: list[str] = []
    need_rd = {"rdkafka-produce", "rdkafka-consume", "latency"} & ph
    if need_rd and confluent_kafka is None:
        errors["rdkafka"] = "confluent_kafka is not installed (pip install confluent-kafka)"
        log("  rdkafka phases skipped: confluent_kafka is not installed")
    else:
        if "rdkafka-produce" in ph or "rdkafka-consume" in ph:

            def rd_produce() -> None:
                t = topic("rd")
                r = rdkafka_produce(bootstrap, t, a)
                raw["rdkafka_produce"] = r
                rd_topic.append(t)
                if "rdkafka-produce" in ph:
                    metrics["rdkafka_produce_mb_s"] = r["mb_s"]
                    metrics["rdkafka_produce_rec_s"] = r["rec_s"]

            phase("rdkafka-produce", rd_produce)
        if "rdkafka-consume" in ph:

            def rd_consume() -> None:
                if not rd_topic:
                    raise PhaseError("no data: rdkafka-produce failed")
                r = rdkafka_consume(bootstrap, rd_topic[0], a, a.num_records)
                raw["rdkafka_consume"] = r
                metrics["rdkafka_consume_mb_s"] = r["mb_s"]
                metrics["rdkafka_consume_rec_s"] = r["rec_s"]

            phase("rdkafka-consume", rd_consume)
        if "latency" in ph:

            def latency() -> None:
                r = e2e_latency(bootstrap, topic("lat"), a)
                raw["e2e_latency"] = r
                for k in ("p50", "p90", "p99", "p999", "max", "mean"):
                    metrics[f"e2e_latency_{k}_ms"] = r[f"{k}_ms"]
                metrics["e2e_rate_msg_s"] = r["rate_msg_s"]
                metrics["e2e_lost"] = r["lost"]
                if r["lost"]:
                    raise PhaseError(f"{r['lost']} of {r['sent']} latency messages not received")

            phase(f"latency ({a.latency_rate} msg/s for {a.latency_seconds}s)", latency)

    if not a.keep_topics:
        for t in topics:
            delete_topic(bootstrap, t)
    return metrics, raw, errors


def _kafka_version() -> str | None:
    try:
        pom = (REPO_ROOT / "tools" / "java" / "pom.xml").read_text()
        m = re.search(r"<kafka.version>([^<]+)</kafka.version>", pom)
        return m.group(1) if m else None
    except OSError:
        return None


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v != v:
        return "nan"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.1f}"
    return f"{v:.2f}"


def ratios(results: dict[str, dict[str, float]], baseline: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    base = results.get(baseline, {})
    for name, m in results.items():
        if name == baseline:
            continue
        out[name] = {}
        for k, v in m.items():
            b = base.get(k)
            if b not in (None, 0) and v is not None and b == b and v == v:
                out[name][k] = v / b
    return out


def print_table(
    results: dict[str, dict[str, float]], baseline: str, rat: dict[str, dict[str, float]]
) -> None:
    names = list(results)
    others = [n for n in names if n != baseline]
    header = ["metric", "unit"] + names + [f"{n}/{baseline}" for n in others]
    rows = []
    for metric, (unit, higher) in METRICS.items():
        if not any(metric in results[n] for n in names):
            continue
        row = [metric, unit + (" ↑" if higher else " ↓")]
        row += [fmt(results[n].get(metric)) for n in names]
        row += [(f"{rat[n][metric]:.2f}x" if metric in rat.get(n, {}) else "-") for n in others]
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(
        h.ljust(w) if i < 2 else h.rjust(w)
        for i, (h, w) in enumerate(zip(header, widths, strict=False))
    )
    print(line)
    print("-" * len(line))
    for r in rows:
        print(
            "  ".join(
                c.ljust(w) if i < 2 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=False))
            )
        )
    print("(↑ higher is better, ↓ lower is better; ratio = target value / baseline value)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="[NAME=]HOST:PORT",
        help="a broker to benchmark (repeatable)",
    )
    ap.add_argument(
        "--strait",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="same as --target straitmq=HOST:PORT",
    )
    ap.add_argument(
        "--kafka",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="same as --target kafka=HOST:PORT (an already running Kafka)",
    )
    ap.add_argument(
        "--with-kafka",
        action="store_true",
        help="start a reference Apache Kafka 4.4 (bench.kafka_ref.KafkaRef) as target 'kafka'",
    )
    ap.add_argument(
        "--kafka-port", type=int, default=None, help="port for --with-kafka (default: free)"
    )
    ap.add_argument(
        "--baseline",
        default=None,
        help="target the ratios are computed against "
        "(default: 'kafka' if present, else the first target)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds; targets alternate each round, metrics are medians (default 1)",
    )
    ap.add_argument("--num-records", type=int, default=200_000)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument(
        "--warmup-records",
        type=int,
        default=20_000,
        help="unreported ProducerPerformance + ConsumerPerformance run against each "
        "target first, so a JVM broker is not measured cold (0: none)",
    )
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--replication-factor", type=int, default=1)
    ap.add_argument(
        "--phases",
        default=",".join(ALL_PHASES),
        help=f"comma list out of {','.join(ALL_PHASES)} (default: all)",
    )
    ap.add_argument(
        "--producer-prop",
        action="append",
        default=[],
        metavar="K=V",
        help="extra ProducerPerformance --producer-props entries (both runs)",
    )
    ap.add_argument("--rdkafka-acks", default="all", help="acks for rdkafka-produce (default all)")
    ap.add_argument(
        "--rdkafka-linger-ms", type=float, default=5, help="librdkafka linger.ms (default 5)"
    )
    ap.add_argument("--latency-rate", type=float, default=2000, help="msg/s (default 2000)")
    ap.add_argument("--latency-seconds", type=float, default=10)
    ap.add_argument(
        "--latency-warmup",
        type=float,
        default=5.0,
        help="seconds of unmeasured traffic at the same rate first (default 5: a JVM "
        "broker needs several seconds of this traffic before its latency settles)",
    )
    ap.add_argument(
        "--latency-warmup-max",
        type=float,
        default=30.0,
        help="warm-up goes on past --latency-warmup until the p99 of 1-s windows "
        "settles, for at most this many seconds (default 30)",
    )
    ap.add_argument("--latency-record-size", type=int, default=1024)
    ap.add_argument("--latency-acks", default="all")
    ap.add_argument(
        "--phase-timeout", type=float, default=900, help="seconds per tool run (default 900)"
    )
    ap.add_argument(
        "--connect-timeout",
        type=float,
        default=30,
        help="seconds to wait for a target to answer Metadata (default 30)",
    )
    ap.add_argument("--keep-topics", action="store_true", help="do not delete the bench topics")
    ap.add_argument(
        "--json",
        default=None,
        help="where to write the JSON dump (default .cache/bench/throughput-<timestamp>.json)",
    )
    a = ap.parse_args(argv)
    a.phases = [p.strip() for p in a.phases.split(",") if p.strip()]
    bad = set(a.phases) - set(ALL_PHASES)
    if bad:
        ap.error(f"unknown phases: {', '.join(sorted(bad))}")
    targets: list[tuple[str, str]] = []
    for i, t in enumerate(a.target):
        name, _, addr = t.rpartition("=")
        targets.append((name or f"target{i + 1}", addr))
    targets += [
        ("straitmq" if len(a.strait) == 1 else f"straitmq{i + 1}", t)
        for i, t in enumerate(a.strait)
    ]
    targets += [
        ("kafka" if len(a.kafka) == 1 else f"kafka{i + 1}", t) for i, t in enumerate(a.kafka)
    ]
    if not targets and not a.with_kafka:
        ap.error("no target: give --strait, --kafka, --target and/or --with-kafka")
    names = [n for n, _ in targets] + (["kafka"] if a.with_kafka else [])
    if len(set(names)) != len(names):
        ap.error(f"duplicate target names: {names}")
    for _, addr in targets:
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit():
            ap.error(f"bad HOST:PORT {addr!r}")
    a.targets = targets
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    run_id = uuid.uuid4().hex[:6]
    started = _dt.datetime.now().astimezone()
    results: dict[str, dict[str, float]] = {}
    raw: dict[str, dict] = {}
    errors: dict[str, dict] = {}
    bootstraps: dict[str, str] = {}
    kafka_ref: KafkaRef | None = None
    targets = list(a.targets)
    samples: dict[str, list[dict[str, float]]] = {}
    try:
        if a.with_kafka:
            log(f"starting reference Kafka {REF_KAFKA} (KafkaRef) ...")
            kafka_ref = KafkaRef(a.kafka_port).start()
            log(f"Kafka {kafka_ref.kafka_version} ready on {kafka_ref.bootstrap}")
            targets.insert(0, ("kafka", kafka_ref.bootstrap))
        # rounds alternate the targets (A B A B ...) so that drift and JIT warm-up do not all
        # land on one side; each metric is the median over the rounds
        samples.update({n: [] for n, _ in targets})
        for rep in range(a.repeat):
            for name, bootstrap in targets:
                bootstraps[name] = bootstrap
                if "target" in errors.get(name, {}):
                    continue
                try:
                    m, r, e = run_target(name, bootstrap, a, run_id, rep)
                except Exception as ex:
                    log(f"target {name} failed: {type(ex).__name__}: {ex}")
                    m, r, e = {}, {}, {"target": f"{type(ex).__name__}: {ex}"}
                samples[name].append(m)
                raw.setdefault(name, {}).update(
                    {k if rep == 0 else f"{k}#{rep + 1}": v for k, v in r.items()}
                )
                errors.setdefault(name, {}).update(
                    {k if rep == 0 else f"{k}#{rep + 1}": v for k, v in e.items()}
                )
        for name, ss in samples.items():
            keys = [k for k in METRICS if any(k in s for s in ss)]
            results[name] = {k: statistics.median([s[k] for s in ss if k in s]) for k in keys}
    finally:
        if kafka_ref is not None:
            log("stopping reference Kafka ...")
            kafka_ref.stop()

    baseline = a.baseline or ("kafka" if "kafka" in results else next(iter(results)))
    rat = ratios(results, baseline)
    print()
    print(
        f"StraitMQ benchmark {started:%Y-%m-%d %H:%M:%S}: "
        f"{a.num_records} x {a.record_size} B records, "
        f"{a.partitions} partition(s), latency {a.latency_rate:g} msg/s x {a.latency_seconds:g} s"
    )
    print("targets: " + ", ".join(f"{n}={b}" for n, b in bootstraps.items()))
    print()
    print_table(results, baseline, rat)
    errs = {n: e for n, e in errors.items() if e}
    if errs:
        print("\nerrors:")
        for n, e in errs.items():
            for ph, msg in e.items():
                print(f"  {n} / {ph}: {msg}")

    dump = {
        "started": started.isoformat(),
        "settings": {k: v for k, v in vars(a).items() if k not in ("targets",)},
        "targets": bootstraps,
        "baseline": baseline,
        "metrics": {k: {"unit": u, "higher_is_better": h} for k, (u, h) in METRICS.items()},
        "results": results,
        "ratios": rat,
        "rounds": samples,
        "raw": raw,
        "errors": errors,
        "versions": {
            "confluent_kafka": confluent_kafka.version()[0] if confluent_kafka else None,
            "librdkafka": confluent_kafka.libversion()[0] if confluent_kafka else None,
            "kafka_java": _kafka_version(),
        },
    }
    path = (
        Path(a.json)
        if a.json
        else REPO_ROOT / ".cache" / "bench" / f"throughput-{started:%Y%m%d-%H%M%S}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dump, indent=2, default=str, allow_nan=True) + "\n")
    print(f"\nJSON: {path}")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
