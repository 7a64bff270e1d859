"""What client quotas cost the broker (issue 29): broker CPU per GB produced and fetched
with 100 principals each under a quota, against quotas off (not a pytest test).

    python -m bench.quotas [--mb 200] [--rounds 2] [--clients 100] [--json PATH]

One StraitMQ broker (a child process), one topic of `--partitions` (10). Each round runs
both modes back to back on the same broker, their order flipped every round:

  off   no client quota in the cluster (the listener does no quota work at all)
  on    `--clients` client ids (c0, c1, ...), each with its own producer_byte_rate,
        consumer_byte_rate and request_percentage, set through the HTTP API (as
        AlterClientQuotas); the quotas are far above what the run sends, so nobody is
        throttled and what is measured is the accounting itself

In each mode `--clients` librdkafka producers (one per client id) send `--mb` MB of
1 KiB records (acks=1, linger 5 ms, batch 64 KiB), then as many consumers (the same
client ids, assign, no group) read it all back, each its share of a partition. The
broker's CPU (utime + stime from /proc, all threads) is read before and after each
phase: CPU seconds per GB (10^9 bytes of record values) produced, and fetched.

Output: a table (median over the rounds, and on/off - 1) and JSON of every run
(`--json`, default .cache/bench/quotas-<timestamp>.json).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from straitmq.admin_client import request_sync

from .strait_ref import StraitRef
from .throughput import process_cpu_s

ROOT = Path(__file__).resolve().parent.parent
VALUE = b"q" * 1024
HUGE = 1e12  # a quota nobody reaches: only the accounting is measured


def set_quotas(http: str, clients: int, on: bool) -> None:
    value = HUGE if on else None
    entries = [
        {
            "entity": {"client-id": f"c{i}"},
            "quotas": {
                "producer_byte_rate": value,
                "consumer_byte_rate": value,
                "request_percentage": value,
            },
        }
        for i in range(clients)
    ]
    request_sync(http, "POST", "/api/v1/quotas", {"entries": entries})
    have = request_sync(http, "GET", "/api/v1/quotas")["quotas"]
    assert len(have) == (clients if on else 0), have


def produce(bootstrap: str, topic: str, a: argparse.Namespace) -> int:
    producers = [
        Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": f"c{i}",
                "acks": 1,
                "linger.ms": 5,
                "batch.size": 65536,
                "queue.buffering.max.kbytes": 8192,
            }
        )
        for i in range(a.clients)
    ]
    records = a.mb * 1_000_000 // len(VALUE)
    for n in range(records):
        i = n % a.clients
        p = producers[i]
        while True:
            try:
                p.produce(topic, VALUE, partition=i % a.partitions)
                break
            except BufferError:
                p.poll(0.005)
        if n % 1000 == 0:
            p.poll(0)
    for p in producers:
        assert p.flush(120) == 0
    return records * len(VALUE)


def consume(bootstrap: str, topic: str, a: argparse.Namespace, ends: dict[int, int]) -> int:
    """Each client id reads its share of one partition, all of them at once."""
    per_partition = a.clients // a.partitions
    consumers, wanted = [], []
    for i in range(a.clients):
        part, share = i % a.partitions, i // a.partitions
        size = ends[part] // per_partition
        start = share * size
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": f"c{i}",
                "group.id": f"bench-{i}",
                "enable.auto.commit": False,
            }
        )
        c.assign([TopicPartition(topic, part, start)])
        consumers.append(c)
        wanted.append(size)
    got = [0] * a.clients
    total = 0
    deadline = time.monotonic() + 600
    while any(g < w for g, w in zip(got, wanted, strict=True)) and time.monotonic() < deadline:
        for i, c in enumerate(consumers):
            if got[i] >= wanted[i]:
                continue
            for m in c.consume(500, 0.01):
                if m.error() is None and got[i] < wanted[i]:
                    got[i] += 1
                    total += len(m.value())
    for c in consumers:
        c.close()
    return total


def run_mode(broker: StraitRef, a: argparse.Namespace, mode: str, rnd: int) -> dict[str, Any]:
    bootstrap, http, pid = broker.bootstrap, broker.http, broker.pid()
    topic = f"quotas-{mode}-{rnd}"
    request_sync(http, "POST", "/api/v1/topics", {"name": topic, "partitions": a.partitions})
    set_quotas(http, a.clients, mode == "on")
    cpu0, t0 = process_cpu_s(pid), time.monotonic()
    produced = produce(bootstrap, topic, a)
    cpu1, t1 = process_cpu_s(pid), time.monotonic()
    ends = {p: produced // len(VALUE) // a.partitions for p in range(a.partitions)}
    fetched = consume(bootstrap, topic, a, ends)
    cpu2, t2 = process_cpu_s(pid), time.monotonic()
    request_sync(http, "DELETE", f"/api/v1/topics/{topic}")
    out = {
        "mode": mode,
        "round": rnd,
        "produced_bytes": produced,
        "fetched_bytes": fetched,
        "produce_cpu_s_per_gb": (cpu1 - cpu0) / (produced / 1e9),
        "fetch_cpu_s_per_gb": (cpu2 - cpu1) / (fetched / 1e9),
        "produce_mb_s": produced / 1e6 / (t1 - t0),
        "fetch_mb_s": fetched / 1e6 / (t2 - t1),
    }
    print(json.dumps(out), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=200, help="MB produced (and fetched) per phase")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--partitions", type=int, default=10)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    if a.clients % a.partitions:
        p.error("--clients must be a multiple of --partitions")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-quotas-") as tmp:
        broker = StraitRef(Path(tmp))
        broker.start(timeout=120)
        try:
            for rnd in range(a.rounds):
                for mode in ("off", "on") if rnd % 2 == 0 else ("on", "off"):
                    runs.append(run_mode(broker, a, mode, rnd))
        finally:
            broker.stop()
    print("\n| metric | off | on | on/off - 1 |\n|---|---:|---:|---:|")
    summary: dict[str, dict[str, float]] = {}
    for metric in ("produce_cpu_s_per_gb", "fetch_cpu_s_per_gb", "produce_mb_s", "fetch_mb_s"):
        off = statistics.median(r[metric] for r in runs if r["mode"] == "off")
        on = statistics.median(r[metric] for r in runs if r["mode"] == "on")
        summary[metric] = {"off": off, "on": on, "change": on / off - 1}
        print(f"| {metric} | {off:.2f} | {on:.2f} | {on / off - 1:+.1%} |")
    path = a.json or ROOT / ".cache" / "bench" / f"quotas-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {"args": vars(a) | {"json": str(path)}, "runs": runs, "summary": summary}, indent=2
        )
    )
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
