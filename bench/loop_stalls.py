"""Event-loop stalls of one StraitMQ broker through the work that used to hold its loop:
the first requests of each API version, retention deleting segments, topic deletion
(issue 31, item 2; not a pytest test).

    python -m bench.loop_stalls [--strait NAME=PYTHON ...] [--mb 200]

Each broker (one per --strait, default this checkout's interpreter) runs under
bench/stallwatch (a 10 ms heartbeat on its loop, 5 ms sampling) with
log.retention.check.interval.ms=1000. Phases, one after the other, each system in turn:

  first requests  right after the broker is ready: a librdkafka admin (create a topic,
                  describe it, its configs, the cluster, groups), producer (acks=all) and
                  group consumer (subscribe, consume, commit), then Kafka 4.4's
                  ProducerPerformance (1,000 records) and EndToEndLatency (100): the
                  first request of every API version both clients use
  fill            --mb MB of 1 KiB records (librdkafka, acks=1) into a topic of one
                  partition with 1 MiB segments (not reported: the load itself)
  retention       retention.bytes set to 1 MiB on it: wait until the retention check
                  has deleted all but the last segments (ListOffsets earliest moves)
  delete          the same amount into a second topic, which is then deleted: wait
                  until its folder is gone from the data folder

For each phase, the histogram of heartbeat lateness in it (beats per bucket from 5 ms
up: all late beats, then those where the main thread was on CPU for at least half the
lateness, i.e. our own work held the loop) and the phase's logged stalls over 5 ms with
their most frequent stacks. Output: markdown and a JSON dump (default
.cache/bench/loop-stalls-<timestamp>.json).
"""

from __future__ import annotations

import argparse
import collections
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # allow `python bench/loop_stalls.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from bench.javatools import END_TO_END_LATENCY, PERF_JVM_ARGS, PRODUCER_PERF, REPO_ROOT, java_cmd
from bench.latency import StraitNode, stallwatch_env
from bench.throughput import send_all

HOST = "127.0.0.1"
BUCKETS = ("<10", "<20", "<50", "<100", "<200", "<500", "<1000", ">=1000")
PHASES = ("first requests", "retention", "delete")
SEGMENT_BYTES = 1 << 20


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Broker(StraitNode):
    """One StraitMQ broker under stallwatch."""

    def __init__(self, name: str, python: str, workdir: Path) -> None:
        self.stall_dir = workdir / "stallwatch"
        env = {**stallwatch_env(self.stall_dir), "PYTHONDONTWRITEBYTECODE": "1"}
        super().__init__(name, python, workdir, ("--retention-check-interval-ms", "1000"), env)

    def snapshot(self) -> tuple[dict[str, dict[str, int]], int]:
        """The histogram as stallwatch last wrote it (after a fresh write), and the size
        of its stall log."""
        hist = self.stall_dir / f"{self.ref.pid()}.hist.json"
        stamp = hist.stat().st_mtime if hist.exists() else 0.0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # written every second
            if hist.exists() and hist.stat().st_mtime > stamp:
                break
            time.sleep(0.1)
        stalls = self.stall_dir / f"{self.ref.pid()}.log"
        return json.loads(hist.read_text()), stalls.stat().st_size if stalls.exists() else 0

    def stalls_since(self, offset: int) -> list[str]:
        with open(self.stall_dir / f"{self.ref.pid()}.log") as f:
            f.seek(offset)
            return f.read().splitlines()


def diff(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict:
    return {
        k: {
            b: n - before.get(k, {}).get(b, 0)
            for b, n in v.items()
            if n - before.get(k, {}).get(b, 0)
        }
        for k, v in after.items()
    }


# -- the phases ------------------------------------------------------------------------


def run_java(main_class: str, args: list[Any], timeout: float) -> str:
    cmd = java_cmd(main_class, args, jvm_args=PERF_JVM_ARGS, include_classes=False, jars="4.4")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{main_class} exited {p.returncode}: {p.stderr[-1500:]}")
    return p.stdout


def measured(b: Broker, phase: Callable[[], float]) -> dict:
    """Run a phase (returning its seconds): the stallwatch histogram of it and the stalls
    logged during it."""
    h0, off = b.snapshot()
    took = phase()
    h1, _ = b.snapshot()
    return {"hist": diff(h1, h0), "seconds": took, "stalls": b.stalls_since(off)}


def first_requests(b: Broker) -> float:
    t0 = time.monotonic()
    conf = {"bootstrap.servers": b.bootstrap, "log_level": 2}
    admin = AdminClient(conf)
    topic = f"first-{uuid.uuid4().hex[:6]}"
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    admin.list_topics(topic, timeout=10)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin.describe_configs([res])[res].result(30)
    admin.describe_cluster().result(30)
    admin.list_consumer_groups().result(30)
    p = Producer({**conf, "acks": "all", "linger.ms": 5})
    payload = os.urandom(1024)
    _dt_s, left = send_all(p, topic, payload, 1000, 60, None)
    if left:
        raise RuntimeError(f"first requests: {left} undelivered")
    group = f"g-{uuid.uuid4().hex[:6]}"
    c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got, deadline = 0, time.monotonic() + 60
    while got < 1000 and time.monotonic() < deadline:
        got += sum(m.error() is None for m in c.consume(500, 0.5))
    c.commit(asynchronous=False)
    c.close()
    admin.describe_consumer_groups([group])[group].result(30)
    run_java(
        PRODUCER_PERF,
        [
            "--topic",
            topic,
            "--num-records",
            1000,
            "--record-size",
            1024,
            "--throughput",
            -1,
            "--producer-props",
            f"bootstrap.servers={b.bootstrap}",
            "acks=all",
        ],
        timeout=120,
    )
    run_java(END_TO_END_LATENCY, [b.bootstrap, topic, 100, "all", 1024], timeout=120)
    return time.monotonic() - t0


def fill(b: Broker, topic: str, mb: int) -> None:
    conf = {"bootstrap.servers": b.bootstrap, "log_level": 2}
    admin = AdminClient(conf)
    nt = NewTopic(topic, 1, 1, config={"segment.bytes": str(SEGMENT_BYTES)})
    admin.create_topics([nt])[topic].result(30)
    p = Producer({**conf, "acks": "1", "linger.ms": 5})
    _dt_s, left = send_all(p, topic, os.urandom(1024), mb * 1024, 300, None)
    if left:
        raise RuntimeError(f"fill: {left} undelivered")


def retention(b: Broker, topic: str) -> float:
    admin = AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 2})
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(
                "retention.bytes", str(SEGMENT_BYTES), incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    t0 = time.monotonic()
    admin.incremental_alter_configs([res])[res].result(30)
    c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "w", "log_level": 2})
    try:
        _lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            lo, _ = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
            if lo >= hi - 3 * SEGMENT_BYTES // 1024:  # all but the last few segments gone
                return time.monotonic() - t0
            time.sleep(0.2)
        raise TimeoutError("retention did not delete the segments in 120 s")
    finally:
        c.close()


def delete(b: Broker, topic: str) -> float:
    admin = AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 2})
    t0 = time.monotonic()
    admin.delete_topics([topic], operation_timeout=30)[topic].result(60)
    data = b.workdir / "data"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if not any(n.startswith(f"{topic}-") for n in os.listdir(data)):
            return time.monotonic() - t0
        time.sleep(0.1)
    raise TimeoutError(f"{topic}'s folder still there after 120 s")


# -- report ----------------------------------------------------------------------------


def report(results: dict[str, dict[str, dict]]) -> str:
    lines = [
        "| phase | system | beats | late 5-10 ms | 10-20 | 20-50 | 50-100 | 100-200 | 200-500 "
        "| 500-1000 | >= 1000 | of which on-CPU (5-10, 10-20, 20-50, 50+) |",
        "|---|---|---:|" + "---:|" * 8 + "---|",
    ]
    for phase in PHASES:
        for name, by_phase in results.items():
            r = by_phase.get(phase)
            if r is None:
                continue
            late, on = r["hist"].get("late", {}), r["hist"].get("on_cpu", {})
            beats = sum(late.values())
            big = sum(on.get(k, 0) for k in BUCKETS[3:])
            on_cells = ", ".join(str(on.get(k, 0)) for k in BUCKETS[:3]) + f", {big}"
            lines.append(
                f"| {phase} | {name} | {beats} | "
                + " | ".join(str(late.get(k, 0)) for k in BUCKETS)
                + f" | {on_cells} |"
            )
    return "\n".join(lines)


def top_stacks(stalls: list[str], n: int = 3) -> list[str]:
    """The phase's longest logged stalls with their first stack line."""
    out: list[tuple[float, str]] = []
    for i, line in enumerate(stalls):
        if line.startswith("STALL "):
            secs = float(line.split()[1].rstrip("s"))
            stack = stalls[i + 1].strip() if i + 1 < len(stalls) else ""
            out.append(
                (secs, f"{secs * 1000:.0f} ms: {line.split('(', 1)[1][:-1]} | {stack[:400]}")
            )
    return [s for _, s in sorted(out, reverse=True)[:n]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strait", action="append", default=[], metavar="NAME=PYTHON")
    ap.add_argument("--mb", type=int, default=200, help="MB per filled topic")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    pythons = dict(s.partition("=")[::2] for s in a.strait) or {"straitmq": sys.executable}
    work = Path(tempfile.mkdtemp(prefix="loop-stalls-"))
    results: dict[str, dict[str, dict]] = collections.defaultdict(dict)
    try:
        for name, python in pythons.items():
            (work / name).mkdir()
            b = Broker(name, python, work / name)
            b.start()
            try:
                log(f"{name}: ready at {b.bootstrap}")
                results[name]["first requests"] = measured(b, partial(first_requests, b))
                big = f"big-{uuid.uuid4().hex[:6]}"
                fill(b, big, a.mb)
                results[name]["retention"] = measured(b, partial(retention, b, big))
                big2 = f"gone-{uuid.uuid4().hex[:6]}"
                fill(b, big2, a.mb)
                results[name]["delete"] = measured(b, partial(delete, b, big2))
                for phase in PHASES:
                    log(f"  {name} {phase}: {results[name][phase]['hist']}")
            finally:
                b.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(report(results))
    for name, by_phase in results.items():
        for phase, r in by_phase.items():
            for s in top_stacks(r["stalls"]):
                print(f"- {name}, {phase}: {s}")
    path = (
        Path(a.json)
        if a.json
        else REPO_ROOT / ".cache" / "bench" / f"loop-stalls-{_dt.datetime.now():%Y%m%d-%H%M%S}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"args": vars(a), "results": results}))
    log(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
