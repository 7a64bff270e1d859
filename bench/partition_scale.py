"""Partitions on one node under a small descriptor limit: create, restart, read back.

Starts a combined single node (`strait-broker`, as `strait up --single` does) with
`ulimit -n` set to `--fd-limit`, creates `--partitions` partitions in topics of
`--per-topic`, writes one record to every `--sample`-th partition, kills the process
with SIGKILL and restarts it. Reports the create time, the restart time (to /readyz),
the broker's descriptors and resident memory at the end of creation and after the
restart, and whether every sampled record read back.

    python -m bench.partition_scale --partitions 100000 --fd-limit 1024

Prints one JSON line (for RESULTS.md) after the human-readable summary.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # allow `python bench/partition_scale.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.strait_ref import StraitRef
from straitmq.admin_client import request_sync


def usage(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = int(status.split("VmRSS:")[1].split()[0])
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "rss_mb": rss_kb // 1024}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--partitions", type=int, default=10_000)
    p.add_argument("--per-topic", type=int, default=100)
    p.add_argument("--fd-limit", type=int, default=1024)
    p.add_argument("--sample", type=int, default=97, help="write to every Nth partition")
    a = p.parse_args()
    topics = a.partitions // a.per_topic

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (a.fd_limit, a.fd_limit))

    with tempfile.TemporaryDirectory(prefix="strait-scale-") as tmp:
        broker = StraitRef(Path(tmp), log_level=None, log=False, preexec_fn=limit)
        base = broker.http
        try:
            first_ready = broker.start(timeout=60)
            t0 = time.monotonic()
            for i in range(topics):
                request_sync(
                    base, "POST", "/api/v1/topics", {"name": f"s{i}", "partitions": a.per_topic}
                )
            create_s = time.monotonic() - t0
            created = usage(broker.pid())
            sample = [
                (f"s{i // a.per_topic}", i % a.per_topic)
                for i in range(0, topics * a.per_topic, a.sample)
            ]
            prod = Producer(
                {
                    "bootstrap.servers": broker.bootstrap,
                    "acks": "all",
                    "enable.idempotence": True,
                    "linger.ms": 20,
                }
            )
            t0 = time.monotonic()
            for topic, part in sample:
                prod.produce(topic, value=f"{topic}/{part}".encode(), partition=part)
            unsent = prod.flush(120)
            produce_s = time.monotonic() - t0
            broker.kill()
            restart_s = broker.start(timeout=1800)
            restarted = usage(broker.pid())
            cons = Consumer(
                {
                    "bootstrap.servers": broker.bootstrap,
                    "group.id": "scale",
                    "enable.auto.commit": False,
                }
            )
            cons.assign([TopicPartition(t, part, 0) for t, part in sample])
            got: set[bytes] = set()
            deadline = time.monotonic() + 300
            while len(got) < len(sample) and time.monotonic() < deadline:
                for m in cons.consume(1000, 1.0):
                    if m.error() is None:
                        got.add(m.value())
            cons.close()
            after_read = usage(broker.pid())
        finally:
            broker.stop(grace_s=120)
    result = {
        "bench": "partition_scale",
        "partitions": topics * a.per_topic,
        "per_topic": a.per_topic,
        "fd_limit": a.fd_limit,
        "first_ready_s": round(first_ready, 2),
        "create_s": round(create_s, 1),
        "partitions_per_s": round(topics * a.per_topic / create_s),
        "after_create": created,
        "sample_writes": len(sample),
        "unsent": unsent,
        "produce_sample_s": round(produce_s, 1),
        "restart_after_kill9_s": round(restart_s, 1),
        "after_restart": restarted,
        "after_reading_sample": after_read,
        "sample_read_back": len(got),
    }
    print(
        f"{result['partitions']} partitions under ulimit -n {a.fd_limit}: created in "
        f"{create_s:.1f} s, restarted after kill -9 in {restart_s:.1f} s, "
        f"{len(got)}/{len(sample)} sampled records read back; {created}, {restarted}"
    )
    print(json.dumps(result))
    if unsent or len(got) != len(sample):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
