"""Failover times of a 3-controller / 3-broker StraitMQ cluster, and of Apache Kafka run the
same way (not a pytest test).

Two measurements, repeated ``--kills`` times each:

  leader      kill -9 the leader of the test partition (RF 3, min.insync.replicas 2) while a
              librdkafka producer (acks=all, idempotent, linger 5 ms) sends one message every
              ``--interval-ms``. Failover time = delivery-callback time of the first message that
              was produced after the killed process was gone, minus the time of the kill.
              Then the killed broker is restarted and the run waits until the partition's ISR
              is full (3) and acks flow again before the next kill.
  controller  kill -9 the active controller; failover time = until a different controller
              says it is the active one (StraitMQ: GET /api/v1/quorum active_controller=true;
              Kafka: a controller answers DescribeQuorum as the Raft leader, itself). The
              producer keeps running: the longest gap between two acks around the kill is
              reported too (the data path should not notice). Then the controller is restarted
              and the run waits until it has caught up with the leader's high watermark.

At the end the test partition is read back: every acknowledged message must be there once.

Both systems get the same timeouts (broker session 2 s, heartbeat 300 ms, Raft election
500 ms, Raft fetch 1 s, replica lag 3 s) and no automatic preferred-leader rebalancing.
With ``--defaults`` neither gets any timeout override: each runs with its own defaults
(Kafka's: broker session 9 s, heartbeat 2 s, Raft election 1 s, Raft fetch 2 s, replica lag
30 s; StraitMQ's: what LocalCluster starts with no flags, the same values) -- expect ~10 s
leader failovers then.
Kafka (4.4, the reference of bench/kafka_ref.py) runs as 3 dedicated KRaft controllers + 3
brokers, separate JVMs (bench/kafka_ref.py KafkaCluster); StraitMQ as
straitmq.cli.local_cluster.LocalCluster. One target after the other (both clusters are never
up at the same time here).

  python -m bench.failover --kills 10 [--with-kafka] [--no-strait] [--defaults] [--json PATH]

Output: a table of p50 / p99 / min / max per target and a JSON dump (default
.cache/bench/failover-<timestamp>.json). With 10-20 kills, p99 is the maximum.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # allow `python bench/failover.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from straitmq.cli.local_cluster import LocalCluster

from bench.javatools import REPO_ROOT
from bench.kafka_ref import REF_KAFKA as KAFKA_VERSION
from bench.kafka_ref import KafkaCluster

# The timeouts both systems get (ms).
SESSION_TIMEOUT_MS = 2000
HEARTBEAT_INTERVAL_MS = 300
ELECTION_TIMEOUT_MS = 500
FETCH_TIMEOUT_MS = 1000
REPLICA_LAG_MS = 3000

TOPIC = "failover-probe"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def percentile(vals: list[float], q: float) -> float:
    """Nearest-rank percentile (with n <= 100 samples, p99 is the maximum)."""
    s = sorted(vals)
    if not s:
        return float("nan")
    idx = min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))
    return s[idx]


def summary(vals: list[float]) -> dict[str, float]:
    if not vals:
        return {"n": 0}
    return {
        "n": len(vals),
        "p50": statistics.median(vals),
        "p99": percentile(vals, 0.99),
        "min": min(vals),
        "max": max(vals),
        "mean": statistics.fmean(vals),
    }


# ---------------------------------------------------------------- targets


class StraitTarget:
    """A StraitMQ LocalCluster (3 controllers, 3 brokers) in a temp dir."""

    name = "straitmq"

    def __init__(
        self,
        fast_failover: bool = True,
        log_level: str = "warning",
        extra_broker_args: tuple[str, ...] = (),
    ) -> None:
        self.dir = tempfile.mkdtemp(prefix="strait-failover-")
        broker_args = [
            "--default-replication-factor",
            "3",
            "--offsets-topic-replication-factor",
            "3",
            "--group-initial-rebalance-delay-ms",
            "0",
            *extra_broker_args,
        ]
        controller_args = ["--no-auto-leader-rebalance"]
        if fast_failover:
            broker_args += [
                "--heartbeat-interval-ms",
                str(HEARTBEAT_INTERVAL_MS),
                "--replica-lag-time-max-ms",
                str(REPLICA_LAG_MS),
            ]
            controller_args += [
                "--broker-session-timeout-ms",
                str(SESSION_TIMEOUT_MS),
                "--election-timeout-ms",
                str(ELECTION_TIMEOUT_MS),
                "--fetch-timeout-ms",
                str(FETCH_TIMEOUT_MS),
            ]
        self.cluster = LocalCluster(
            self.dir,
            kafka_base=None,
            http_base=None,
            controller_base=None,
            broker_args=broker_args,
            controller_args=controller_args,
            log_level=log_level,
            python=sys.executable,
        )

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def start(self) -> None:
        self.cluster.start(wait_s=120)

    def stop(self, keep_logs: Path | None = None) -> None:
        try:
            self.cluster.stop()
        finally:
            if keep_logs is not None:
                keep_logs.mkdir(parents=True, exist_ok=True)
                for n in self.cluster.nodes():
                    shutil.copy(n.log_path, keep_logs / Path(n.log_path).name)
            shutil.rmtree(self.dir, ignore_errors=True)

    def kill9(self, node_id: int) -> tuple[float, float]:
        """kill -9 broker or controller `node_id`; (time signal sent, time process reaped)."""
        n = self.cluster.brokers.get(node_id) or self.cluster.controllers[node_id]
        t_kill = time.monotonic()
        n.kill9()
        return t_kill, time.monotonic()

    def restart_broker(self, bid: int) -> None:
        self.cluster.brokers[bid].start()
        self.cluster.wait_ready(120, brokers=[bid])

    def active_controller(self, exclude: int | None = None) -> int | None:
        for cid, n in self.cluster.controllers.items():
            if cid == exclude or not n.alive():
                continue
            st = n.get("/api/v1/quorum", timeout=0.5)
            if st and st.get("active_controller"):
                return cid
        return None

    def restart_controller(self, cid: int, timeout: float = 60.0) -> None:
        """Start controller `cid` again and wait until it follows the leader and has caught up
        with the high watermark the leader had when it was restarted."""
        leader = self.active_controller()
        hw = 0
        if leader is not None:
            st = self.cluster.controllers[leader].get("/api/v1/quorum") or {}
            hw = st.get("high_watermark") or 0
        n = self.cluster.controllers[cid]
        n.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = n.get("/api/v1/quorum", timeout=0.5)
            if (
                st
                and st.get("leader_id") is not None
                and st.get("leader_id") != cid
                and (st.get("high_watermark") or 0) >= hw
            ):
                return
            time.sleep(0.1)
        raise TimeoutError(f"controller {cid} did not catch up within {timeout:.0f}s")


class KafkaTarget:
    """Apache Kafka (4.4): 3 KRaft controllers + 3 brokers, separate JVMs (KafkaCluster).

    fast_failover=False: no timeout overrides (Kafka's defaults)."""

    name = "kafka"

    def __init__(self, fast_failover: bool = True) -> None:
        common: dict[str, object] = {"auto.leader.rebalance.enable": "false"}
        if fast_failover:
            common.update(
                {
                    "broker.session.timeout.ms": SESSION_TIMEOUT_MS,
                    "broker.heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
                    "controller.quorum.election.timeout.ms": ELECTION_TIMEOUT_MS,
                    "controller.quorum.fetch.timeout.ms": FETCH_TIMEOUT_MS,
                }
            )
        broker = dict(common)
        if fast_failover:
            broker["replica.lag.time.max.ms"] = REPLICA_LAG_MS
        self.cluster = KafkaCluster(3, 3, broker_config=broker, controller_config=common)

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def start(self) -> None:
        self.cluster.start()

    def stop(self, keep_logs: Path | None = None) -> None:
        if keep_logs is not None:
            keep_logs.mkdir(parents=True, exist_ok=True)
            for n in self.cluster.nodes():
                src = n.dir / "logs" / "server.log"
                if src.exists():
                    shutil.copy(src, keep_logs / f"{n.name}.log")
        self.cluster.stop()

    def kill9(self, node_id: int) -> tuple[float, float]:
        n = self.cluster.node(node_id)
        t_kill = time.monotonic()
        n.kill9()
        return t_kill, time.monotonic()

    def restart_broker(self, bid: int) -> None:
        # Kafka recovers every replica's log after kill -9: minutes with 10,000 of them.
        self.cluster.restart(bid, wait=False)
        self.cluster.wait_ready(600, brokers=[bid])

    def active_controller(self, exclude: int | None = None) -> int | None:
        q = self.cluster.quorum(timeout=0.5)
        if q is None or q["leader_id"] != q["answered_by"] or q["leader_id"] == exclude:
            return None
        return q["leader_id"]

    def restart_controller(self, cid: int, timeout: float = 60.0) -> None:
        q = self.cluster.quorum()
        hw = q["high_watermark"] if q else 0
        self.cluster.node(cid).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            q = self.cluster.quorum()
            if q is not None:
                leo = dict(q["voters"]).get(cid, -1)
                if leo >= hw:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"controller {cid} did not catch up within {timeout:.0f}s")


# ---------------------------------------------------------------- admin helpers


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 5000, "log_level": 2})


def create_topic(
    bootstrap: str, topic: str, partitions: int = 1, rf: int = 3, min_isr: int = 2
) -> None:
    a = admin(bootstrap)
    futs = a.create_topics(
        [
            NewTopic(
                topic,
                num_partitions=partitions,
                replication_factor=rf,
                config={"min.insync.replicas": str(min_isr)},
            )
        ],
        operation_timeout=30,
        request_timeout=30,
    )
    futs[topic].result(60)
    wait_isr(bootstrap, topic, rf, timeout=60, partitions=partitions)


def partition_state(bootstrap: str, topic: str, partition: int = 0) -> tuple[int, list, list]:
    """(leader, replicas, isr) of topic-partition from a fresh Metadata request."""
    md = admin(bootstrap).list_topics(topic, timeout=5)
    p = md.topics[topic].partitions[partition]
    return p.leader, list(p.replicas), list(p.isrs)


def wait_isr(
    bootstrap: str, topic: str, size: int, timeout: float = 60.0, partitions: int = 1
) -> None:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            md = admin(bootstrap).list_topics(topic, timeout=5)
            ps = md.topics[topic].partitions
            last = {i: (p.leader, p.isrs) for i, p in ps.items()}
            if len(ps) == partitions and all(
                p.leader >= 0 and len(p.isrs) >= size for p in ps.values()
            ):
                return
        except Exception as e:  # metadata errors while brokers restart
            last = e
        time.sleep(0.2)
    raise TimeoutError(f"{topic}: ISR not back to {size} within {timeout:.0f}s (last {last})")


# ---------------------------------------------------------------- the probe producer


class ProbeProducer:
    """acks=all idempotent producer thread: one message every `interval` s to partition 0.

    Each value carries (sequence number, monotonic send time); the delivery callback records
    (seq, sent, acked_at, offset) or the error."""

    def __init__(self, bootstrap: str, topic: str, interval: float = 0.005) -> None:
        self.topic = topic
        self.interval = interval
        self.p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
                "client.id": "failover-probe",
                "log_level": 2,  # no connection-refused chatter from the killed broker
            }
        )
        self.acks: list[tuple[int, float, float, int]] = []
        self.errors: list[tuple[int, float, float, str]] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-producer", daemon=True)

    def _cb(self, err, msg) -> None:
        now = time.monotonic()
        seq, sent = struct.unpack(">qd", msg.value())
        if err is None:
            self.acks.append((seq, sent, now, msg.offset()))
        else:
            self.errors.append((seq, sent, now, str(err)))

    def _run(self) -> None:
        seq = 0
        next_send = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_send:
                seq += 1
                try:
                    self.p.produce(
                        self.topic,
                        value=struct.pack(">qd", seq, now),
                        partition=0,
                        on_delivery=self._cb,
                    )
                    self.sent = seq
                except BufferError:
                    seq -= 1
                next_send = now + self.interval
            self.p.poll(max(0.0, min(next_send - time.monotonic(), 0.005)))

    def start(self) -> ProbeProducer:
        self._thread.start()
        return self

    def stop(self, flush_timeout: float = 60.0) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.p.flush(flush_timeout)

    def first_ack_sent_after(
        self, t: float, timeout: float
    ) -> tuple[int, float, float, int] | None:
        """Wait for, and return, the earliest-acked message that was produced after `t`."""
        acks = self.acks  # appended in ack-time order by the producer thread
        i = len(acks)
        while i > 0 and acks[i - 1][2] >= t:  # acks at or after t may be for messages after t
            i -= 1
        deadline = time.monotonic() + timeout
        while True:
            n = len(acks)
            for j in range(i, n):
                if acks[j][1] > t:
                    return acks[j]
            i = n
            if time.monotonic() > deadline:
                return None
            time.sleep(0.005)

    def max_ack_gap(self, t0: float, t1: float) -> float:
        """Longest time without any ack within [t0, t1] (s)."""
        times = sorted(a[2] for a in self.acks if t0 <= a[2] <= t1)
        points = [t0, *times, t1]
        return max(b - a for a, b in itertools.pairwise(points))


class LeaderWatch:
    """Thread asking Metadata every 50 ms until partition 0 has a leader other than `old`;
    the time of that answer tells the controller's part of a failover from the client's."""

    def __init__(self, bootstrap: str, old: int) -> None:
        self.old = old
        self.admin = AdminClient(
            {"bootstrap.servers": bootstrap, "socket.timeout.ms": 1000, "log_level": 2}
        )
        self.admin.list_topics(TOPIC, timeout=5)  # connected before the kill
        self.t_new: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                md = self.admin.list_topics(TOPIC, timeout=1)
                leader = md.topics[TOPIC].partitions[0].leader
                if leader >= 0 and leader != self.old:
                    self.t_new = time.monotonic()
                    return
            except Exception:
                pass
            time.sleep(0.05)

    def start(self) -> LeaderWatch:
        self._thread.start()
        return self

    def wait(self, timeout: float) -> float | None:
        self._thread.join(timeout)
        self._stop.set()
        self._thread.join(2)
        return self.t_new


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f} ms"


def verify_partition(bootstrap: str, topic: str, acked: list) -> dict[str, int]:
    """Read partition 0 from the start: acknowledged sequence numbers missing / duplicated."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "failover-verify",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        _lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        seen: dict[int, int] = {}
        read = 0
        deadline = time.monotonic() + 120
        last_off = -1
        while last_off < hi - 1 and time.monotonic() < deadline:
            for m in c.consume(1000, timeout=1.0):
                if m.error() is not None:
                    continue
                seq, _ = struct.unpack(">qd", m.value())
                seen[seq] = seen.get(seq, 0) + 1
                read += 1
                last_off = m.offset()
    finally:
        c.close()
    acked_seqs = {a[0] for a in acked}
    return {
        "high_watermark": hi,
        "records_read": read,
        "acked": len(acked_seqs),
        "acked_missing": len(acked_seqs - seen.keys()),
        "duplicates": sum(n - 1 for n in seen.values() if n > 1),
    }


# ---------------------------------------------------------------- the runs


def leader_kills(target, prod: ProbeProducer, kills: int, timeout: float) -> list[dict]:
    out = []
    bs = target.bootstrap
    for k in range(kills):
        wait_isr(bs, TOPIC, 3, timeout=120)
        # acks flowing, with a full ISR, before the kill
        t_ok = time.monotonic()
        if prod.first_ack_sent_after(t_ok, 30) is None:
            raise RuntimeError("probe producer gets no acks before the kill")
        time.sleep(0.5)
        leader, _replicas, isr = partition_state(bs, TOPIC)
        watch = LeaderWatch(bs, leader).start()
        t_kill, t_dead = target.kill9(leader)
        first = prod.first_ack_sent_after(t_dead, timeout)
        t_meta = watch.wait(5.0)
        rec: dict[str, Any] = {"kill": k + 1, "killed_broker": leader, "isr_before": isr}
        if first is None:
            rec["failover_ms"] = None
            log(f"  {target.name} leader kill {k + 1}: broker {leader}, NO ack in {timeout:.0f}s")
        else:
            rec["failover_ms"] = (first[2] - t_kill) * 1000
            rec["kill_to_dead_ms"] = (t_dead - t_kill) * 1000
            rec["first_offset"] = first[3]
            rec["metadata_ms"] = None if t_meta is None else (t_meta - t_kill) * 1000
            try:
                rec["new_leader"] = partition_state(bs, TOPIC)[0]
            except Exception:
                rec["new_leader"] = None
            log(
                f"  {target.name} leader kill {k + 1}: broker {leader} -> "
                f"{rec['new_leader']}, first acks=all ack after {rec['failover_ms']:.0f} ms "
                f"(metadata shows a new leader after {_ms(rec['metadata_ms'])})"
            )
        out.append(rec)
        target.restart_broker(leader)
    wait_isr(bs, TOPIC, 3, timeout=120)
    return out


def controller_kills(target, prod: ProbeProducer, kills: int, timeout: float) -> list[dict]:
    out = []
    for k in range(kills):
        wait_isr(target.bootstrap, TOPIC, 3, timeout=120)
        deadline = time.monotonic() + 30
        active = target.active_controller()
        while active is None and time.monotonic() < deadline:
            time.sleep(0.1)
            active = target.active_controller()
        if active is None:
            raise RuntimeError("no active controller before the kill")
        time.sleep(0.5)
        t_kill, _t_dead = target.kill9(active)
        new = None
        t_new = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            new = target.active_controller(exclude=active)
            if new is not None:
                t_new = time.monotonic()
                break
            time.sleep(0.01)
        rec: dict[str, Any] = {"kill": k + 1, "killed_controller": active, "new_active": new}
        if t_new is None:
            rec["failover_ms"] = None
            log(f"  {target.name} controller kill {k + 1}: {active}, none active in {timeout:.0f}s")
        else:
            rec["failover_ms"] = (t_new - t_kill) * 1000
            time.sleep(1.0)
            rec["max_ack_gap_ms"] = prod.max_ack_gap(t_kill, time.monotonic()) * 1000
            log(
                f"  {target.name} controller kill {k + 1}: {active} -> {new} after "
                f"{rec['failover_ms']:.0f} ms (longest produce ack gap "
                f"{rec['max_ack_gap_ms']:.0f} ms)"
            )
        out.append(rec)
        target.restart_controller(active)
    return out


def run_target(target, a: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {"target": target.name}
    t0 = time.monotonic()
    log(f"{target.name}: starting the cluster")
    prod = None
    keep = Path(a.keep_logs) / target.name if a.keep_logs else None
    try:
        target.start()
        res["startup_s"] = time.monotonic() - t0
        log(f"{target.name}: ready in {res['startup_s']:.1f}s at {target.bootstrap}")
        create_topic(target.bootstrap, TOPIC)
        prod = ProbeProducer(target.bootstrap, TOPIC, a.interval_ms / 1000).start()
        if a.kills:
            res["leader"] = leader_kills(target, prod, a.kills, a.timeout)
        if a.controller_kills:
            res["controller"] = controller_kills(target, prod, a.controller_kills, a.timeout)
        left = prod.stop()
        res["producer"] = {
            "sent": prod.sent,
            "acked": len(prod.acks),
            "errors": len(prod.errors),
            "first_errors": sorted({e[3] for e in prod.errors})[:5],
            "undelivered_after_flush": left,
        }
        res["verify"] = verify_partition(target.bootstrap, TOPIC, prod.acks)
        log(f"{target.name}: producer {res['producer']} verify {res['verify']}")
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}"
        log(f"{target.name}: FAILED: {res['error']}")
        if prod is not None:
            prod.stop(1)
    finally:
        target.stop(keep_logs=keep)
    for kind in ("leader", "controller"):
        vals = [r["failover_ms"] for r in res.get(kind, []) if r.get("failover_ms") is not None]
        res[f"{kind}_summary"] = summary(vals)
        res[f"{kind}_timeouts"] = sum(1 for r in res.get(kind, []) if r["failover_ms"] is None)
    meta = [r["metadata_ms"] for r in res.get("leader", []) if r.get("metadata_ms") is not None]
    res["leader_metadata_summary"] = summary(meta)
    gaps = [r["max_ack_gap_ms"] for r in res.get("controller", []) if "max_ack_gap_ms" in r]
    res["controller_ack_gap_summary"] = summary(gaps)
    return res


def print_table(results: list[dict[str, Any]]) -> None:
    rows = [
        ("leader kill -> first acks=all ack", "leader_summary"),
        ("leader kill -> Metadata shows the new leader", "leader_metadata_summary"),
        ("controller kill -> new active controller", "controller_summary"),
        ("longest ack gap during controller kill", "controller_ack_gap_summary"),
    ]
    print()
    print("| measurement (ms) | target | n | p50 | p99 | min | max |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, key in rows:
        for r in results:
            s = r.get(key, {})
            if not s.get("n"):
                continue
            print(
                f"| {label} | {r['target']} | {s['n']} | {s['p50']:.0f} | {s['p99']:.0f} | "
                f"{s['min']:.0f} | {s['max']:.0f} |"
            )
    for r in results:
        print(
            f"\n{r['target']}: producer {r.get('producer')} verify {r.get('verify')}"
            + (f" ERROR {r['error']}" if "error" in r else "")
        )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=10, help="partition leader kills per target")
    ap.add_argument(
        "--controller-kills", type=int, default=None, help="active controller kills (= --kills)"
    )
    ap.add_argument("--with-kafka", action="store_true", help="also run Apache Kafka 4.4")
    ap.add_argument("--no-strait", action="store_true", help="skip StraitMQ")
    ap.add_argument(
        "--defaults",
        action="store_true",
        help="no timeout overrides: both systems run with their default session/heartbeat/"
        "election/fetch/replica-lag timeouts (Kafka: 9 s / 2 s / 1 s / 2 s / 30 s)",
    )
    ap.add_argument("--interval-ms", type=float, default=5.0, help="probe producer send interval")
    ap.add_argument("--timeout", type=float, default=60.0, help="give up on one failover after")
    ap.add_argument("--strait-log-level", default="warning")
    ap.add_argument("--keep-logs", default=None, help="copy node logs to this folder")
    ap.add_argument("--json", default=None, help="result file (default .cache/bench/...)")
    a = ap.parse_args(argv)
    if a.controller_kills is None:
        a.controller_kills = a.kills
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    results = []
    if not a.no_strait:
        results.append(
            run_target(StraitTarget(fast_failover=not a.defaults, log_level=a.strait_log_level), a)
        )
    if a.with_kafka:
        results.append(run_target(KafkaTarget(fast_failover=not a.defaults), a))
    print_table(results)
    path = (
        Path(a.json)
        if a.json
        else (REPO_ROOT / ".cache" / "bench" / f"failover-{_dt.datetime.now():%Y%m%d-%H%M%S}.json")
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    if a.defaults:
        settings: dict[str, Any] = {"timeouts": "defaults", "interval_ms": a.interval_ms}
    else:
        settings = {
            "broker_session_timeout_ms": SESSION_TIMEOUT_MS,
            "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
            "election_timeout_ms": ELECTION_TIMEOUT_MS,
            "fetch_timeout_ms": FETCH_TIMEOUT_MS,
            "replica_lag_time_max_ms": REPLICA_LAG_MS,
            "interval_ms": a.interval_ms,
        }
    settings["kafka_version"] = KAFKA_VERSION
    path.write_text(json.dumps({"settings": settings, "results": results}, indent=1))
    log(f"results written to {path}")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
