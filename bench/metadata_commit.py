"""Metadata commit latency and controller throughput on a local 3-controller quorum.

Starts `LocalCluster` (3 controllers, 1 broker, RF 1) and creates topics through the
broker's admin API, `--concurrency` at a time, until `--partitions` partitions exist
(`--per-topic` each). Reports the wall time, partitions/s, and the latency of each
create (a committed metadata change seen by the broker) as p50/p99. Each create is one
Raft entry, so this measures the quorum's commit path: append, fsync, replicate, commit.

    python -m bench.metadata_commit --partitions 10000 --per-topic 10 --concurrency 16

Prints one JSON line (for RESULTS.md) after the human-readable summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time

from straitmq.cli.local_cluster import LocalCluster

from straitmq.admin_client import AdminClient


def percentile(vals: list[float], q: float) -> float:
    s = sorted(vals)
    return s[min(len(s) - 1, int(q * len(s)))]


async def create_all(base: str, topics: int, per_topic: int, concurrency: int) -> list[float]:
    latencies: list[float] = []
    queue = iter(range(topics))
    async with AdminClient(base, timeout_s=60) as admin:

        async def worker() -> None:
            for i in queue:
                body = {"name": f"bench-{i}", "partitions": per_topic, "replication_factor": 1}
                t0 = time.perf_counter()
                await admin.request("POST", "/api/v1/topics", body)
                latencies.append(time.perf_counter() - t0)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--partitions", type=int, default=10_000)
    p.add_argument("--per-topic", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--label", default="")
    a = p.parse_args()
    topics = a.partitions // a.per_topic
    with tempfile.TemporaryDirectory() as d:
        cluster = LocalCluster(
            d,
            brokers=1,
            kafka_base=None,
            http_base=None,
            controller_base=None,
            broker_args=[
                "--default-replication-factor",
                "1",
                "--offsets-topic-replication-factor",
                "1",
            ],
        )
        try:
            cluster.start()
            b = cluster.brokers[1]
            t0 = time.perf_counter()
            lat = asyncio.run(
                create_all(f"http://{b.host}:{b.http_port}", topics, a.per_topic, a.concurrency)
            )
            wall = time.perf_counter() - t0
        finally:
            cluster.stop()
    result = {
        "bench": "metadata_commit",
        "label": a.label,
        "topics": topics,
        "partitions": topics * a.per_topic,
        "concurrency": a.concurrency,
        "wall_s": round(wall, 2),
        "partitions_per_s": round(topics * a.per_topic / wall, 1),
        "create_p50_ms": round(percentile(lat, 0.5) * 1000, 1),
        "create_p99_ms": round(percentile(lat, 0.99) * 1000, 1),
    }
    print(
        f"{result['partitions']} partitions in {wall:.1f} s ({result['partitions_per_s']}/s); "
        f"create p50 {result['create_p50_ms']} ms, p99 {result['create_p99_ms']} ms"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
