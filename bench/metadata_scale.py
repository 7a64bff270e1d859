"""Metadata at scale on a 3-controller / 3-broker cluster, StraitMQ and Apache Kafka side by
side (not a pytest test; issue 13 point 2).

For each target, one after the other (never both up at once):
  create      `--partitions` partitions, RF 3, in topics of `--per-topic`, through
              librdkafka's AdminClient, `--topics-per-request` topics per CreateTopics
              (what `kafka-topics` or a provisioning script sends); time until every
              request is answered, and partitions/s. Meanwhile ApiVersions every 20 ms
              to broker 1: the longest answer is how long its listener stalled.
  memory      resident memory of the active controller and of a broker before and after,
              per partition.
  failover    kill -9 the active controller; time until another one says it is active,
              and until a CreateTopics is answered again.
  restart     kill -9 broker 1 and start it again; time until it serves (StraitMQ:
              /readyz 200; Kafka: it answers Metadata listing every broker). Meanwhile
              ApiVersions every 20 ms to broker 2, which takes over leaderships from
              broker 1: its longest answer.
  sample      before the failover, one acks=all record (idempotent librdkafka producer)
              to each of `--sample` random partitions; after the restart, every one is
              read back at its acknowledged offset ("lost" must be 0).
For StraitMQ also the metadata snapshot: its size in the on-disk format and the time to
encode and decode it, measured on the image replayed from a controller's own log.

    python -m bench.metadata_scale --partitions 10000 [--with-kafka] [--no-strait]

Prints one JSON line per target after a summary table. Every process runs under
`ulimit -n --fd-limit` (default 1024, the issue's limit; Kafka keeps every segment and
index open, so it gets `--kafka-fd-limit`).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka.admin import AdminClient, NewTopic

from bench.failover import KafkaTarget, StraitTarget


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def create(bootstrap: str, names: list[str], per_topic: int, per_request: int) -> float:
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 60000})
    t0 = time.monotonic()
    for i in range(0, len(names), per_request):
        chunk = [
            NewTopic(n, num_partitions=per_topic, replication_factor=3)
            for n in names[i : i + per_request]
        ]
        futs = admin.create_topics(chunk, operation_timeout=300, request_timeout=300)
        for f in futs.values():
            f.result(600)
    return time.monotonic() - t0


class ListenerProbe(threading.Thread):
    """ApiVersions to one broker every 20 ms on one connection: the longest wait for an
    answer is how long its Kafka listener stalled (applying metadata, opening logs)."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(daemon=True)
        self.addr = (host, port)
        self.latencies: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        client = b"probe"
        body = struct.pack(">hhih", 18, 0, 0, len(client)) + client
        with socket.create_connection(self.addr, timeout=120) as s:
            while not self.stop.is_set():
                t0 = time.monotonic()
                s.sendall(struct.pack(">i", len(body)) + body)
                size = struct.unpack(">i", _read(s, 4))[0]
                _read(s, size)
                self.latencies.append(time.monotonic() - t0)
                self.stop.wait(0.02)

    def figures(self) -> dict:
        lat = sorted(self.latencies)
        return {
            "requests": len(lat),
            "p99_ms": round(lat[int(0.99 * (len(lat) - 1))] * 1000, 1) if lat else None,
            "max_ms": round(lat[-1] * 1000, 1) if lat else None,
        }


def _read(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the broker closed the probe connection")
        buf += chunk
    return buf


def until(cond: Callable[[], object], timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.02)
    raise TimeoutError(what)


def created_again(bootstrap: str, name: str) -> bool:
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000})
    try:
        admin.create_topics([NewTopic(name, 1, 3)], request_timeout=2)[name].result(3)
        return True
    except KafkaException as e:
        # An earlier attempt that timed out on our side may have created it.
        return e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    except Exception:
        return False


def produce_sample(bootstrap: str, partitions: list[tuple[str, int]]) -> tuple[float, dict]:
    """One acks=all record to each partition; (seconds, {(topic, p): (offset, value)})."""
    from confluent_kafka import Producer

    prod = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    acked: dict[tuple[str, int], tuple[int, bytes]] = {}
    failed: list[str] = []

    def done(err: KafkaError | None, msg: Message) -> None:
        if err is None:
            acked[(msg.topic(), msg.partition())] = (msg.offset(), msg.value())
        else:
            failed.append(str(err))

    t0 = time.monotonic()
    for i, (topic, index) in enumerate(partitions):
        prod.produce(topic, value=f"sample-{i}".encode(), partition=index, on_delivery=done)
        prod.poll(0)
    left = prod.flush(300)
    if left or failed:
        raise RuntimeError(f"sample produce: {left} unsent, errors {failed[:3]}")
    return time.monotonic() - t0, acked


def read_sample(bootstrap: str, acked: dict) -> int:
    """How many of the acknowledged records read back at their offsets."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "sample-check", "enable.auto.commit": False}
    )
    c.assign([TopicPartition(t, p, off) for (t, p), (off, _) in acked.items()])
    found = 0
    seen: set[tuple[str, int]] = set()
    deadline = time.monotonic() + 300
    while len(seen) < len(acked) and time.monotonic() < deadline:
        for m in c.consume(500, 1.0):
            key = (m.topic(), m.partition())
            if m.error() is None and key not in seen and acked.get(key) == (m.offset(), m.value()):
                seen.add(key)
                found += 1
    c.close()
    return found


def run(target: StraitTarget | KafkaTarget, a: argparse.Namespace) -> dict:
    names = [f"m{i}" for i in range(a.partitions // a.per_topic)]
    target.start()
    try:
        ctrl = target.active_controller()
        c_proc = _proc(target, ctrl)
        b_proc = _proc(target, 1)
        before = {"controller": rss_mb(c_proc.pid), "broker": rss_mb(b_proc.pid)}
        host, port = target.bootstrap.split(",")[0].rsplit(":", 1)
        probe = ListenerProbe(host, int(port))
        probe.start()
        create_s = create(target.bootstrap, names, a.per_topic, a.topics_per_request)
        probe.stop.set()
        probe.join(30)
        time.sleep(2)  # let replicas open and the ISR settle before measuring memory
        after = {"controller": rss_mb(c_proc.pid), "broker": rss_mb(b_proc.pid)}
        out: dict = {
            "target": target.name,
            "partitions": len(names) * a.per_topic,
            "per_topic": a.per_topic,
            "topics_per_request": a.topics_per_request,
            "create_s": round(create_s, 2),
            "listener_during_create": probe.figures(),
            "partitions_per_s": round(len(names) * a.per_topic / create_s),
            "rss_mb_before": before,
            "rss_mb_after": after,
            "kb_per_partition": {
                k: round((after[k] - before[k]) * 1024 / (len(names) * a.per_topic), 2)
                for k in after
            },
        }
        if target.name == "straitmq":
            out["snapshot"] = snapshot_figures(Path(target.dir) / f"controller-{ctrl}")
        acked: dict = {}
        if a.sample:
            rng = random.Random(a.seed)
            picks = rng.sample(
                range(len(names) * a.per_topic), min(a.sample, len(names) * a.per_topic)
            )
            parts = [(names[i // a.per_topic], i % a.per_topic) for i in picks]
            produce_s, acked = produce_sample(target.bootstrap, parts)
            out["sample"] = {"partitions": len(parts), "produce_s": round(produce_s, 2)}
        # Active controller failover.
        target.kill9(ctrl)
        new = until(
            lambda: target.active_controller(exclude=ctrl) is not None,
            120,
            "a new active controller",
        )
        again = until(
            lambda: created_again(target.bootstrap, "after-failover"),
            120,
            "CreateTopics answered after the failover",
        )
        out["controller_failover_s"] = round(new, 2)
        out["create_after_failover_s"] = round(new + again, 2)
        target.restart_controller(ctrl, timeout=300)
        # Broker restart after kill -9. Meanwhile broker 2 takes over the leadership of
        # broker 1's partitions (a third of them): how long its listener stalls doing so.
        host2, port2 = target.bootstrap.split(",")[1].rsplit(":", 1)
        probe2 = ListenerProbe(host2, int(port2))
        probe2.start()
        target.kill9(1)
        t0 = time.monotonic()
        target.restart_broker(1)
        out["broker_restart_s"] = round(time.monotonic() - t0, 2)
        probe2.stop.set()
        probe2.join(30)
        out["listener_of_broker_2_during_restart"] = probe2.figures()
        if acked:
            found = read_sample(target.bootstrap, acked)
            out["sample"].update(read_back=found, lost=len(acked) - found)
        return out
    finally:
        target.stop()


def _proc(target: StraitTarget, node_id: int) -> subprocess.Popen | None:
    c = target.cluster
    n = c.brokers.get(node_id) or c.controllers[node_id]
    return n.proc


def snapshot_figures(controller_dir: Path) -> dict:
    """Replay this controller's metadata log into an image, then time what a snapshot
    costs: the first encoding (every topic), the next one after a partition change
    (incremental), and loading it back; and its size on disk."""
    import orjson
    from straitmq.metadata.image import MetadataImage
    from straitmq.raft.storage import FileStorage

    storage = FileStorage(str(controller_dir / "metadata-raft"))
    _, _, snap, start, entries = storage.load()
    storage.close()
    image = MetadataImage.from_dict(snap.data) if snap is not None else MetadataImage()
    for offset, e in enumerate(entries, start):
        image.apply_entry(offset, e.data)
    encode = getattr(image, "encoded", lambda: orjson.dumps(image.to_dict()))  # older builds
    t0 = time.perf_counter()
    blob = encode()
    full_s = time.perf_counter() - t0
    name = next(iter(image.topics))
    p = image.topics[name].partitions[0]
    image.apply({"type": "partition_change", "topic": name, "index": 0, "isr": p.isr})
    t0 = time.perf_counter()
    encode()
    incremental_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    MetadataImage.from_dict(orjson.loads(blob))
    load_s = time.perf_counter() - t0
    partitions = sum(len(t.partitions) for t in image.topics.values())
    return {
        "bytes": len(blob),
        "bytes_per_partition": round(len(blob) / max(1, partitions), 1),
        "encode_full_s": round(full_s, 3),
        "encode_incremental_s": round(incremental_s, 4),
        "load_s": round(load_s, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--partitions", type=int, default=10_000)
    p.add_argument("--per-topic", type=int, default=100)
    p.add_argument("--topics-per-request", type=int, default=10)
    p.add_argument("--fd-limit", type=int, default=1024)
    p.add_argument("--kafka-fd-limit", type=int, default=200_000)
    p.add_argument("--with-kafka", action="store_true")
    p.add_argument("--no-strait", action="store_true")
    p.add_argument("--sample", type=int, default=1000, help="partitions to write and read back")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    results = []
    if not a.no_strait:
        os.environ.setdefault("STRAITMQ_LOG_LEVEL", "warning")
        _limit_children(a.fd_limit)
        results.append(run(StraitTarget(fast_failover=False), a))
        print(json.dumps(results[-1]), flush=True)  # kept if a later target fails
    if a.with_kafka:
        _check_kafka_maps(a.partitions)
        _limit_children(a.kafka_fd_limit)
        results.append(run(KafkaTarget(fast_failover=False), a))
    for r in results:
        print(
            f"{r['target']:9} {r['partitions']} partitions: created in {r['create_s']} s "
            f"({r['partitions_per_s']}/s); controller failover {r['controller_failover_s']} s "
            f"(create answered {r['create_after_failover_s']} s); broker restart "
            f"{r['broker_restart_s']} s; listener {r['listener_during_create']}; "
            f"broker 2's listener during the restart {r['listener_of_broker_2_during_restart']}; "
            f"KB/partition {r['kb_per_partition']}"
            + (f"; snapshot {r['snapshot']}" if "snapshot" in r else "")
            + (f"; sample {r['sample']}" if "sample" in r else "")
        )
    for r in results:
        print(json.dumps(r))


def _check_kafka_maps(partitions: int) -> None:
    """Kafka memory-maps two index files per replica; past vm.max_map_count its broker
    dies with an OutOfMemoryError ('Map failed') part-way through creation. Each broker
    here holds a replica of every partition (RF 3 on 3 brokers)."""
    need = 2 * partitions + 20_000  # the JVM's own maps, with room to spare
    have = int(Path("/proc/sys/vm/max_map_count").read_text())
    if have < need:
        sys.exit(
            f"Kafka with {partitions} partitions needs vm.max_map_count >= {need} (now {have}): "
            f"sysctl -w vm.max_map_count={need}"
        )


def _limit_children(n: int) -> None:
    """Children inherit the limit: set it on this process (soft and hard)."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and n > hard:
        try:  # needs CAP_SYS_RESOURCE (root outside a restricted sandbox)
            resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
            return
        except (ValueError, OSError):
            sys.exit(f"--fd-limit {n} is above this shell's hard limit {hard} (not raisable here)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    tempfile.tempdir = tempfile.gettempdir()
    main()
