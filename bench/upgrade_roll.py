"""A rolling upgrade of 3 controllers + 3 brokers, as a client sees it (issue 37; not a
pytest test).

StraitMQ is started on the previous release (releases.toml, built by
scripts/build-releases.sh) and rolled node by node onto this checkout the way the README's
"Upgrading" section says (controllers first, the active one last, each caught up; then
brokers, each back with no partition under-replicated before the next; a graceful stop,
so each broker's leaderships move off first). Beside it, Apache Kafka 4.4 (bench/kafka_ref.py
KafkaCluster) gets the same rolling restart: one version only is on this machine, so it is
the cost of Kafka's roll itself, the same procedure and gates.

Both get the same timeouts (bench/failover.py's: broker session 2 s, heartbeat 300 ms,
election 500 ms, Raft fetch 1 s, replica lag 3 s) and a topic of 6 partitions, RF 3,
min.insync.replicas 2. A librdkafka producer (acks=all, idempotent, linger 5 ms) sends
`--rate` records/s of 100 bytes round-robin over the partitions through the whole run.

Figures per system:
  roll_s            from the first node's stop to the last gate passed
  gap_ms            per partition, the longest time between two acknowledgements during
                    the roll (the partition's unavailability as a producer sees it); the
                    worst partition and the median partition
  p50/p99 steady    produce latency (librdkafka's per-message latency) in the `--steady` s
                    before the roll
  p50/p99 roll      the same for records produced during the roll
  failed            records that were not acknowledged (must be 0)

    python -m bench.upgrade_roll [--rate 1000] [--steady 20] [--no-kafka] [--json PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from straitmq.cli.local_cluster import LocalCluster

from bench.failover import (
    KafkaTarget,
    StraitTarget,
    create_topic,
    percentile,
    wait_isr,
)
from bench.releases import previous_release, release_python

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "roll-probe"
PARTITIONS = 6


def log(msg: str) -> None:
    print(f"[upgrade_roll] {msg}", file=sys.stderr, flush=True)


class Probe:
    """The producer: records each acknowledgement's time, partition and latency."""

    def __init__(self, bootstrap: str, rate: float) -> None:
        self.rate = rate
        self.acks: list[tuple[float, int, float]] = []  # (acked at, partition, latency s)
        self.failed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
                "topic.metadata.refresh.interval.ms": 1000,
                "log_level": 2,
            }
        )
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _done(self, err: Any, msg: Any) -> None:
        now = time.monotonic()
        with self._lock:
            if err is None:
                self.acks.append((now, msg.partition(), msg.latency() or 0.0))
            else:
                self.failed += 1

    def _run(self) -> None:
        t0, n = time.monotonic(), 0
        value = b"x" * 100
        while not self._stop.is_set():
            try:
                self.producer.produce(
                    TOPIC, value=value, partition=n % PARTITIONS, on_delivery=self._done
                )
            except BufferError:
                self.producer.poll(0.05)
                continue
            n += 1
            ahead = n / self.rate - (time.monotonic() - t0)
            self.producer.poll(max(ahead, 0))

    def start(self) -> Probe:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)
        left = self.producer.flush(120)
        self.failed += left

    def window(self, t0: float, t1: float) -> list[tuple[float, int, float]]:
        with self._lock:
            return [a for a in self.acks if t0 <= a[0] - a[2] < t1]  # produced inside


def figures(probe: Probe, steady: tuple[float, float], roll: tuple[float, float]) -> dict:
    def lat(w: list) -> dict[str, float]:
        ms = [a[2] * 1000 for a in w]
        return {"p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99), "n": len(ms)}

    gaps = []
    with probe._lock:
        acks = [a for a in probe.acks if roll[0] <= a[0] <= roll[1] + 5]
    for p in range(PARTITIONS):
        times = [roll[0], *sorted(a[0] for a in acks if a[1] == p)]
        gaps.append(max((b - a for a, b in itertools.pairwise(times)), default=0))
    return {
        "roll_s": round(roll[1] - roll[0], 1),
        "gap_ms_worst": round(max(gaps) * 1000),
        "gap_ms_median": round(statistics.median(gaps) * 1000),
        "gap_ms_per_partition": [round(g * 1000) for g in gaps],
        "steady": lat(probe.window(*steady)),
        "roll": lat(probe.window(*roll)),
        "failed": probe.failed,
    }


def strait_cluster(old_python: str) -> LocalCluster:
    """bench/failover.py's cluster (the same timeouts as Kafka's below), on `old_python`."""
    c = StraitTarget().cluster
    for n in c.nodes():
        c.run_as(n, old_python)
    return c


def run_strait(a: argparse.Namespace) -> dict:
    version = previous_release()
    old = release_python(version)
    log(f"StraitMQ {version} -> this checkout")
    c = strait_cluster(old)
    c.start(wait_s=120)
    try:
        create_topic(c.bootstrap, TOPIC, PARTITIONS)
        probe = Probe(c.bootstrap, a.rate).start()
        t0 = time.monotonic()
        time.sleep(a.steady)  # the steady-state window, by definition a span of time
        r0 = time.monotonic()
        for node in c.roll_order():
            c.roll(node, sys.executable, wait_s=120)
            log(f"  {node.name} rolled at {time.monotonic() - r0:.1f}s")
        r1 = time.monotonic()
        probe.stop()
        return {"system": f"straitmq {version}->HEAD", **figures(probe, (t0, r0), (r0, r1))}
    finally:
        c.stop()


def run_kafka(a: argparse.Namespace) -> dict:
    log("Apache Kafka 4.4 rolling restart")
    k = KafkaTarget()
    k.start()
    kc = k.cluster
    try:
        create_topic(kc.bootstrap, TOPIC, PARTITIONS)
        probe = Probe(kc.bootstrap, a.rate).start()
        t0 = time.monotonic()
        time.sleep(a.steady)
        r0 = time.monotonic()
        active = k.active_controller()
        for cid in sorted(kc.controllers, key=lambda c: c == active):
            kc.node(cid).stop()
            k.restart_controller(cid, timeout=120)
        for bid in kc.brokers:
            kc.node(bid).stop()
            kc.restart(bid)
            wait_isr(kc.bootstrap, TOPIC, 3, timeout=120, partitions=PARTITIONS)
        r1 = time.monotonic()
        probe.stop()
        return {"system": "kafka 4.4 (restart)", **figures(probe, (t0, r0), (r0, r1))}
    finally:
        k.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=1000.0, help="records/s")
    p.add_argument("--steady", type=float, default=20.0, help="seconds of steady state first")
    p.add_argument("--no-kafka", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    results = [run_strait(a)]
    if not a.no_kafka:
        results.append(run_kafka(a))
    print(
        f"{'system':28} {'roll s':>7} {'worst gap ms':>12} {'median gap':>10} "
        f"{'p50/p99 steady ms':>18} {'p50/p99 roll ms':>16} {'failed':>6}"
    )
    for r in results:
        print(
            f"{r['system']:28} {r['roll_s']:>7} {r['gap_ms_worst']:>12} {r['gap_ms_median']:>10} "
            f"{r['steady']['p50']:>8.1f}/{r['steady']['p99']:<9.1f} "
            f"{r['roll']['p50']:>7.1f}/{r['roll']['p99']:<8.1f} {r['failed']:>6}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0 if all(r["failed"] == 0 for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
