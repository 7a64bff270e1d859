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
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from straitmq.cli.local_cluster import free_port

from straitmq.admin_client import AdminError, exchange_sync, request_sync


def start(data: Path, port: int, http: int, fd_limit: int) -> subprocess.Popen[bytes]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "straitmq.broker",
            "--data-dir",
            str(data),
            "--listen",
            f"127.0.0.1:{port}",
            "--http",
            f"127.0.0.1:{http}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=limit,
    )


def wait_ready(proc: subprocess.Popen[bytes], http: int, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"the broker exited with {proc.returncode}")
        try:
            if exchange_sync(f"http://127.0.0.1:{http}", "GET", "/readyz", timeout_s=1)[0] == 200:
                return time.monotonic() - t0
        except AdminError:
            pass
        time.sleep(0.05)
    raise SystemExit("the broker did not become ready")


def usage(proc: subprocess.Popen[bytes]) -> dict[str, int]:
    status = Path(f"/proc/{proc.pid}/status").read_text()
    rss_kb = int(status.split("VmRSS:")[1].split()[0])
    return {"fds": len(os.listdir(f"/proc/{proc.pid}/fd")), "rss_mb": rss_kb // 1024}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--partitions", type=int, default=10_000)
    p.add_argument("--per-topic", type=int, default=100)
    p.add_argument("--fd-limit", type=int, default=1024)
    p.add_argument("--sample", type=int, default=97, help="write to every Nth partition")
    a = p.parse_args()
    topics = a.partitions // a.per_topic
    port, http = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="strait-scale-") as tmp:
        data = Path(tmp) / "data"
        proc = start(data, port, http, a.fd_limit)
        try:
            first_ready = wait_ready(proc, http, 60)
            base = f"http://127.0.0.1:{http}"
            t0 = time.monotonic()
            for i in range(topics):
                request_sync(
                    base, "POST", "/api/v1/topics", {"name": f"s{i}", "partitions": a.per_topic}
                )
            create_s = time.monotonic() - t0
            created = usage(proc)
            sample = [
                (f"s{i // a.per_topic}", i % a.per_topic)
                for i in range(0, topics * a.per_topic, a.sample)
            ]
            prod = Producer(
                {
                    "bootstrap.servers": f"127.0.0.1:{port}",
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
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc = start(data, port, http, a.fd_limit)
            restart_s = wait_ready(proc, http, 1800)
            restarted = usage(proc)
            cons = Consumer(
                {
                    "bootstrap.servers": f"127.0.0.1:{port}",
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
            after_read = usage(proc)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
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
