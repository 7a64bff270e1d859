"""Consumer-group rebalance time and share-group (KIP-932) consume rate: StraitMQ (one broker)
beside Apache Kafka 4.4 (one KRaft combined broker, bench/kafka_ref.py), both up for the whole
run (issue 14; not a pytest test).

    python -m bench.group_rebalance [--repeat 5] [--share-records 200000]
    python -m bench.group_rebalance --quick      # 1 round, no warm-up, 20k share records

Part 1 -- rebalance. One topic of --partitions (24) partitions, RF 1, no records. Members are
librdkafka consumers (confluent_kafka), each in its own thread of this process (no JVMs: 11
JVMs on 2 cores would dominate the measurement), each polling every 100 ms, with each
system's and librdkafka's defaults (heartbeat.interval.ms 3000 and session.timeout.ms 45000
for the classic protocol; for KIP-848 the broker's group.consumer.heartbeat.interval.ms 5000
and group.consumer.session.timeout.ms 45000, on both brokers; group.initial.rebalance.delay.ms
3000 on both, Kafka's default -- it only delays the first join of an empty group, i.e. the
unmeasured set-up). Three modes:

  eager         group.protocol=classic, partition.assignment.strategy=range
  cooperative   group.protocol=classic, partition.assignment.strategy=cooperative-sticky
  consumer      group.protocol=consumer (KIP-848, the broker's default server-side assignor:
                uniform on Kafka 4.4, StraitMQ's own)

Each round and mode, per system: a new group of 10 members starts; once they own every
partition exactly once, each of them at least one, and no callback has fired for --quiet
(2) seconds (not measured), and a random 0..--jitter (5) s more, an 11th member joins; once
stable and quiet again, and another random 0..5 s, that 11th member leaves (close()). The
random waits put the join and the leave at a random phase of the members' heartbeats (all 10
start together, so their heartbeats are in step; without them every round would hit the
same phase); both systems get the same waits in a round and mode.

Ownership is what each member's own rebalance callbacks say: on_assign adds partitions,
on_revoke and on_lost remove them (eager callbacks carry the whole assignment, cooperative
and KIP-848 ones the increments), each stamped with time.monotonic() when the callback
starts. "Stable" is a property of these callback streams merged in time order:

  join    every one of the 11 members' owned sets together hold each partition exactly once
          and the joiner owns >= 1 partition. Join time = the timestamp of the first callback
          after which that holds, minus the instant just before the joiner's subscribe()
          (its Consumer object was created just before; its first JoinGroup or
          ConsumerGroupHeartbeat goes out from there).
  leave   the 10 remaining members' owned sets hold each partition exactly once. Leave time =
          the first callback after which that holds, minus the instant the leaver's close()
          was called.

After the first stable instant the run watches --quiet seconds more; callbacks in that
window are counted ("later callbacks", expected 0). Also reported: partitions revoked from
the 10 original members during the join (eager: all 24; incremental protocols: what moves).
Rounds alternate the system order; medians (and min-max) over --repeat rounds; one
unreported warm-up round first (JVM warm-up, __consumer_offsets creation).

Part 2 -- share groups (KIP-932). A topic with ONE partition; --share-records (200,000)
records of 100 bytes pre-produced with librdkafka (acks=1). Then 1 and 4 KafkaShareConsumers
(kafka-clients 4.4.0; a small harness embedded below, compiled once with javac into the work
folder, run with the java_cmd() client flags: SerialGC, C1 only) in a new share group each
time, with share.auto.offset.reset=earliest set on the group (IncrementalAlterConfigs, GROUP
resource, both brokers). Each JVM starts, builds its consumer and waits; all get "go" at the
same instant (t0); then subscribe, poll (max.poll.records default 500), acknowledge every
record ACCEPT (share.acknowledgement.mode=explicit) and commitSync() after every poll, print
the offsets committed. The end is the instant the last offset not yet acknowledged by
anyone is acknowledged (commitSync returned without error), by the consumers' wall clocks.
records/s = records / (end - t0), t0 including the share-group join; also reported apart:
the time from t0 to the first commitSync that returned (join + first fetch), the rate from
there to the end (records / (end - first ack)), the records each consumer acknowledged (with
4 the first to join may take most: the others join later), and the broker's CPU seconds
(utime+stime from /proc) from t0 until the parent saw the last acknowledgement. Kafka 4.4 needs the
`share.version=1` feature (kafka-features upgrade, done after start) and, on one broker,
share.coordinator.state.topic.replication.factor=1 / min.isr=1; no unstable.api.versions.
StraitMQ runs with its defaults.

The machine has 2 cores: the members, the share-consumer JVMs and the broker measured share
them (the other broker sits idle), so these are figures for a loaded 2-core box, not for
either broker alone. JSON of every round in .cache/bench/group-rebalance-<timestamp>.json;
`--report JSON` prints an earlier run's tables again.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # allow `python bench/group_rebalance.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from bench.javatools import KAFKA44_TOOLS, REPO_ROOT, classpath, ensure_jars, java_cmd
from bench.kafka_ref import KafkaRef
from bench.strait_ref import StraitRef
from bench.throughput import process_cpu_s as cpu_s
from bench.throughput import send_all

MODES = {
    "eager": {"group.protocol": "classic", "partition.assignment.strategy": "range"},
    "cooperative": {
        "group.protocol": "classic",
        "partition.assignment.strategy": "cooperative-sticky",
    },
    "consumer": {"group.protocol": "consumer"},
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the two brokers -------------------------------------------------------------------


class Strait:
    name = "straitmq"

    def __init__(self, workdir: Path):
        self.ref = StraitRef(workdir)
        self.bootstrap = self.ref.bootstrap

    def start(self) -> None:
        self.ref.start()

    def pid(self) -> int:
        return self.ref.pid()

    def stop(self) -> None:
        self.ref.stop()


class Kafka:
    name = "kafka"

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.ref = KafkaRef(
            workdir=workdir,
            log_level="WARN",
            extra_config={
                "group.initial.rebalance.delay.ms": 3000,  # Kafka's default (KafkaRef: 0)
                "share.coordinator.state.topic.replication.factor": 1,  # one broker
                "share.coordinator.state.topic.min.isr": 1,
            },
        )
        self.bootstrap = self.ref.bootstrap

    def start(self) -> None:
        self.ref.start()
        # KIP-932: Kafka 4.4 finalizes share.version 2 on a new cluster (4.1 left it at 0 and
        # needed `upgrade --feature share.version=1`, which 4.4 refuses as a downgrade), so
        # this only checks that share groups are on.
        r = subprocess.run(
            java_cmd(
                KAFKA44_TOOLS["kafka-features"],
                ["--bootstrap-server", self.bootstrap, "describe"],
                include_classes=False,
                jars="4.4",
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        level = re.search(r"Feature: share\.version\s.*FinalizedVersionLevel: (\d+)", r.stdout)
        if r.returncode != 0 or level is None or int(level.group(1)) < 1:
            raise RuntimeError(
                f"share groups are off (kafka-features describe): {r.stdout}{r.stderr}"
            )

    def pid(self) -> int:
        assert self.ref.proc is not None
        return self.ref.proc.pid

    def stop(self) -> None:
        self.ref.stop()


# -- part 1: rebalance -----------------------------------------------------------------


class Member(threading.Thread):
    """One librdkafka consumer in a thread; its rebalance callbacks as (t, member, kind, parts)."""

    def __init__(self, name: str, conf: dict, topic: str, events: list, lock: threading.Lock):
        super().__init__(daemon=True, name=name)
        self.conf, self.topic, self.events, self.lock = conf, topic, events, lock
        self.stop_evt = threading.Event()
        self.t_subscribe: float | None = None
        self.t_close: float | None = None
        self.t_closed: float | None = None
        self.error: str | None = None

    def _cb(self, kind: str):
        def cb(_c, parts) -> None:
            t = time.monotonic()
            with self.lock:
                self.events.append((t, self.name, kind, [p.partition for p in parts]))

        return cb

    def run(self) -> None:
        try:
            c = Consumer(self.conf)
            self.t_subscribe = time.monotonic()
            c.subscribe(
                [self.topic],
                on_assign=self._cb("assigned"),
                on_revoke=self._cb("revoked"),
                on_lost=self._cb("lost"),
            )
            while not self.stop_evt.is_set():
                c.poll(0.1)
            self.t_close = time.monotonic()
            c.close()
            self.t_closed = time.monotonic()
        except Exception as e:  # reported by the orchestrator
            self.error = repr(e)


def owners(events: list, until: float | None = None) -> dict[str, set[int]]:
    held: dict[str, set[int]] = {}
    for t, name, kind, parts in sorted(events):
        if until is not None and t > until:
            break
        s = held.setdefault(name, set())
        if kind == "assigned":
            s |= set(parts)
        else:
            s -= set(parts)
    return held


def covers(held: dict[str, set[int]], names: list[str], n: int, must_own: str | None) -> bool:
    """Each partition owned by exactly one of `names`, and `must_own` owns >= 1 ("*": every
    one of `names` does, the set-up's condition)."""
    sets = [held.get(m, set()) for m in names]
    if sum(len(s) for s in sets) != n or set().union(*sets) != set(range(n)):
        return False
    if must_own == "*":
        return all(sets)
    return must_own is None or bool(held.get(must_own))


def first_stable(
    events: list, t0: float, names: list[str], n: int, must_own: str | None
) -> float | None:
    """Timestamp of the first callback at or after t0 after which `covers` holds."""
    held: dict[str, set[int]] = {}
    for t, name, kind, parts in sorted(events):
        s = held.setdefault(name, set())
        if kind == "assigned":
            s |= set(parts)
        else:
            s -= set(parts)
        if t >= t0 and covers(held, names, n, must_own):
            return t
    return None


def wait_stable(
    events: list,
    lock: threading.Lock,
    t0: float,
    names: list[str],
    n: int,
    must_own: str | None,
    quiet: float,
    timeout: float,
) -> tuple[float, int]:
    """Wait until `covers` holds and no callback came for `quiet` s; (first stable instant,
    callbacks after it). Raises TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        with lock:
            evs = list(events)
        held = owners(evs)
        last = max((e[0] for e in evs), default=0.0)
        if covers(held, names, n, must_own) and time.monotonic() - last >= quiet:
            ts = first_stable(evs, t0, names, n, must_own)
            if ts is not None:
                return ts, sum(1 for e in evs if e[0] > ts and e[3])  # non-empty ones
        if time.monotonic() > deadline:
            raise TimeoutError(f"no stable assignment after {timeout:.0f}s: {held}")
        time.sleep(0.02)


def rebalance_once(
    s: Any, mode: str, topic: str, a: argparse.Namespace, delays: tuple[float, float]
) -> dict[str, float]:
    group = f"rb-{mode}-{uuid.uuid4().hex[:8]}"
    events: list = []
    lock = threading.Lock()
    base = {
        "bootstrap.servers": s.bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "log_level": 3,
        **MODES[mode],
    }
    members: list[Member] = []

    def add(name: str) -> Member:
        m = Member(name, {**base, "client.id": name}, topic, events, lock)
        members.append(m)
        m.start()
        return m

    def check() -> None:
        for m in members:
            if m.error:
                raise RuntimeError(f"{m.name}: {m.error}")

    try:
        olds = [add(f"m{i}") for i in range(a.members)]
        names = [m.name for m in olds]
        t_setup = time.monotonic()
        wait_stable(events, lock, 0.0, names, a.partitions, "*", a.quiet, a.timeout)
        check()
        setup_s = time.monotonic() - t_setup
        # join
        time.sleep(delays[0])  # random heartbeat phase, the same for both systems
        n_before = len(events)
        joiner = add("joiner")
        while joiner.t_subscribe is None and joiner.error is None:
            time.sleep(0.001)
        check()
        t0 = joiner.t_subscribe
        assert t0 is not None
        ts, later_j = wait_stable(
            events, lock, t0, [*names, "joiner"], a.partitions, "joiner", a.quiet, a.timeout
        )
        with lock:
            revoked = sum(
                len(e[3])
                for e in events[n_before:]
                if e[2] != "assigned" and e[1] != "joiner" and e[0] <= ts
            )
            join_cbs = sum(1 for e in events[n_before:] if e[0] <= ts and e[3])
        # leave
        time.sleep(delays[1])
        joiner.stop_evt.set()
        while joiner.t_close is None and joiner.error is None and joiner.is_alive():
            time.sleep(0.001)
        check()
        t1 = joiner.t_close
        assert t1 is not None
        tl, later_l = wait_stable(events, lock, t1, names, a.partitions, None, a.quiet, a.timeout)
        joiner.join(30)
        return {
            "setup_s": setup_s,
            "join_s": ts - t0,
            "join_later_callbacks": later_j,
            "join_revoked_partitions": revoked,
            "join_callbacks": join_cbs,
            "leave_s": tl - t1,
            "leave_later_callbacks": later_l,
            "leaver_close_s": (joiner.t_closed or tl) - t1,
        }
    finally:
        for m in members:
            m.stop_evt.set()
        for m in members:
            m.join(60)


# -- part 2: share groups --------------------------------------------------------------

SHARE_BENCH_JAVA = r"""
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Duration;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.AcknowledgeType;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

// ShareBench BOOTSTRAP GROUP TOPIC NAME [key=value ...]: prints {"ev":"ready"}, waits for
// "go" on stdin, then polls, acknowledges every record ACCEPT and commitSync()s after each
// poll, printing the committed offsets as ranges; "stop" on stdin closes it.
public class ShareBench {
    static synchronized void emit(String s) { System.out.println(s); System.out.flush(); }

    static String ranges(long[] o, int n) {
        Arrays.sort(o, 0, n);
        StringBuilder sb = new StringBuilder();
        int i = 0;
        while (i < n) {
            int j = i;
            while (j + 1 < n && o[j + 1] <= o[j] + 1) j++;
            if (sb.length() > 0) sb.append(',');
            sb.append('[').append(o[i]).append(',').append(o[j]).append(']');
            i = j + 1;
        }
        return sb.toString();
    }

    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        p.put("group.id", args[1]);
        p.put("client.id", args[3]);
        p.put("share.acknowledgement.mode", "explicit");
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        for (int i = 4; i < args.length; i++) {
            String[] kv = args[i].split("=", 2);
            p.put(kv[0], kv[1]);
        }
        KafkaShareConsumer<byte[], byte[]> c = new KafkaShareConsumer<>(p);
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        emit("{\"ev\":\"ready\"}");
        String go = in.readLine();
        if (go == null || !go.trim().equals("go")) { c.close(); return; }
        AtomicBoolean stop = new AtomicBoolean(false);
        Thread t = new Thread(() -> {
            try { String l; while ((l = in.readLine()) != null && !l.trim().equals("stop")) { } }
            catch (java.io.IOException e) { }
            stop.set(true);
            c.wakeup();
        });
        t.setDaemon(true);
        t.start();
        c.subscribe(List.of(args[2]));
        long[] offs = new long[0];
        try {
            while (!stop.get()) {
                ConsumerRecords<byte[], byte[]> recs;
                try { recs = c.poll(Duration.ofMillis(100)); } catch (WakeupException e) { break; }
                if (recs.isEmpty()) continue;
                int n = 0, redelivered = 0;
                if (offs.length < recs.count()) offs = new long[recs.count()];
                for (ConsumerRecord<byte[], byte[]> r : recs) {
                    offs[n++] = r.offset();
                    if (r.deliveryCount().orElse((short) 1) > 1) redelivered++;
                    c.acknowledge(r, AcknowledgeType.ACCEPT);
                }
                Map<TopicIdPartition, Optional<KafkaException>> res;
                try { res = c.commitSync(); } catch (WakeupException e) { break; }
                long ts = System.currentTimeMillis();
                String err = null;
                for (Optional<KafkaException> e : res.values())
                    if (e.isPresent()) err = e.get().toString();
                emit("{\"ev\":\"" + (err == null ? "acked" : "ack_failed") + "\",\"ts\":"
                     + ts + ",\"n\":" + n + ",\"re\":" + redelivered + ",\"r\":["
                     + ranges(offs, n) + "]}");
            }
        } finally {
            c.close();
            emit("{\"ev\":\"closed\",\"ts\":" + System.currentTimeMillis() + "}");
        }
    }
}
"""


def compile_share_bench(work: Path) -> list[str]:
    """javac the harness into work/classes; the java command line prefix to run it."""
    src = work / "ShareBench.java"
    src.write_text(SHARE_BENCH_JAVA)
    cp = classpath(False, "4.4")
    subprocess.run(
        ["javac", "-cp", cp, "-d", str(work / "classes"), str(src)], check=True, timeout=300
    )
    cmd = java_cmd("ShareBench", [], include_classes=False, jars="4.4")
    i = cmd.index("-cp")
    cmd[i + 1] = f"{work / 'classes'}{os.pathsep}{cmd[i + 1]}"
    return cmd


class ShareProc:
    def __init__(self, cmd: list[str], args: list[str], err: Path):
        self.err = open(err, "wb")
        self.proc = subprocess.Popen(
            [*cmd, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            bufsize=1,
        )
        self.lines: list[dict] = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                d = json.loads(line)
                if d["ev"] == "ready":
                    self.ready.set()
                self.lines.append(d)

    def send(self, word: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(word + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def stop(self) -> None:
        self.send("stop")
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.reader.join(10)
        self.err.close()


def produce_share_topic(s: Any, topic: str, n: int) -> None:
    admin = AdminClient({"bootstrap.servers": s.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(60)
    p = Producer(
        {
            "bootstrap.servers": s.bootstrap,
            "acks": "1",
            "linger.ms": 5,
            "compression.type": "none",
            "log_level": 3,
        }
    )
    errors: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    p.list_topics(topic, timeout=30)
    _dt_s, left = send_all(p, topic, b"x" * 100, n, 300, on_delivery)
    if left or errors:
        raise RuntimeError(f"produce: {left} undelivered, {len(errors)} errors {errors[:1]}")


def share_once(
    s: Any, cmd: list[str], topic: str, n: int, k: int, work: Path, timeout: float
) -> dict[str, float]:
    group = f"share-{k}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": s.bootstrap})
    res = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(
                "share.auto.offset.reset",
                "earliest",
                incremental_operation=AlterConfigOpType.SET,
            )
        ],
    )
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)
    procs = [
        ShareProc(cmd, [s.bootstrap, group, topic, f"{group}-c{i}"], work / f"{group}-c{i}.err")
        for i in range(k)
    ]
    try:
        for p in procs:
            if not p.ready.wait(120):
                raise RuntimeError(f"share consumer not ready: {p.err.name}")
        cpu0 = cpu_s(s.pid())
        t0 = time.time()
        for p in procs:
            p.send("go")
        seen: set[int] = set()
        done_at = None
        deadline = time.monotonic() + timeout
        idx = [0] * k
        while done_at is None:
            for i, p in enumerate(procs):
                new = p.lines[idx[i] :]
                idx[i] += len(new)
                for d in new:
                    if d["ev"] == "acked":
                        for a, b in d["r"]:
                            seen.update(range(a, b + 1))
            if len(seen) >= n:
                done_at = time.monotonic()
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"share {k}: {len(seen)} of {n} acknowledged")
            if any(p.proc.poll() is not None for p in procs):
                raise RuntimeError(f"a share consumer exited: {[p.err.name for p in procs]}")
            time.sleep(0.02)
        cpu1 = cpu_s(s.pid())
    finally:
        for p in procs:
            p.send("stop")
        for p in procs:
            p.stop()
    # the end: per offset, when it was first acknowledged (harness wall clock, ms)
    first: dict[int, int] = {}
    delivered = redelivered = failed = 0
    per_consumer = []
    spans = []  # per consumer: (records, first and last acknowledgement in s after t0)
    for p in procs:
        got = 0
        ts = [d["ts"] / 1000 - t0 for d in p.lines if d["ev"] == "acked"]
        spans.append([0, min(ts, default=-1), max(ts, default=-1)])
        for d in p.lines:
            if d["ev"] == "acked":
                delivered += d["n"]
                redelivered += d["re"]
                got += d["n"]
                for a, b in d["r"]:
                    for o in range(a, b + 1):
                        if o not in first or d["ts"] < first[o]:
                            first[o] = d["ts"]
            elif d["ev"] == "ack_failed":
                failed += d["n"]
        per_consumer.append(got)
        spans[-1][0] = got
    end = max(first[o] for o in range(n)) / 1000
    start = min(first.values()) / 1000  # the first commitSync that returned
    return {
        "records_s": n / (end - t0),
        "seconds": end - t0,
        "first_ack_s": start - t0,
        "drain_records_s": n / (end - start) if end > start else float("nan"),
        "broker_cpu_s": cpu1 - cpu0,
        "delivered": delivered,
        "redelivered": redelivered,
        "ack_failed": failed,
        "min_share": min(per_consumer) / n,
        "max_share": max(per_consumer) / n,
        "consumers": spans,
    }


# -- report ----------------------------------------------------------------------------


def stat(vals: list[float], fmt: str = "{:.2f}") -> str:
    if not vals:
        return "-"
    m = fmt.format(statistics.median(vals))
    if len(vals) > 1:
        m += f" ({fmt.format(min(vals))}-{fmt.format(max(vals))})"
    return m


def report(d: dict) -> str:
    names = list(d["rebalance"])
    lines = []
    if any(d["rebalance"][n][m] for n in names for m in MODES):
        lines.append(
            "| mode | "
            + " | ".join(f"{n} {x}" for x in ("join s", "leave s") for n in names)
            + " |"
        )
        lines.append("|---|" + "---:|" * (2 * len(names)))
        for m in MODES:
            cells = [
                stat([r[k] for r in d["rebalance"][n][m]])
                for k in ("join_s", "leave_s")
                for n in names
            ]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        lines.append("")
        heads = [f"{n} {x}" for x in ("revoked", "callbacks", "later cb") for n in names]
        lines.append("| mode | " + " | ".join(heads) + " |")
        lines.append("|---|" + "---:|" * (3 * len(names)))
        for m in MODES:
            cells = [
                stat([r[k] for r in d["rebalance"][n][m]], "{:.0f}")
                for k in ("join_revoked_partitions", "join_callbacks", "join_later_callbacks")
                for n in names
            ]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    if any(d["share"][n][k] for n in names for k in d["share"][n]):
        lines.append("")
        ks = sorted({int(k) for n in names for k in d["share"][n]})
        heads = [
            f"{n} {x}"
            for x in (
                "records/s",
                "s to 1st ack",
                "records/s after 1st ack",
                "broker CPU s",
                "records per consumer (last round)",
            )
            for n in names
        ]
        lines.append("| share consumers | " + " | ".join(heads) + " |")
        lines.append("|---|" + "---:|" * (5 * len(names)))
        for k in ks:
            rs = {n: d["share"][n].get(str(k), []) for n in names}
            cells = [stat([r["records_s"] for r in rs[n]], "{:,.0f}") for n in names]
            cells += [stat([r["first_ack_s"] for r in rs[n]], "{:.1f}") for n in names]
            cells += [stat([r["drain_records_s"] for r in rs[n]], "{:,.0f}") for n in names]
            cells += [stat([r["broker_cpu_s"] for r in rs[n]], "{:.1f}") for n in names]
            cells += [
                " / ".join(f"{c[0]:,}" for c in rs[n][-1]["consumers"]) if rs[n] else "-"
                for n in names
            ]
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="1 round, no warm-up, 20k share records, 1 share round"
    )
    ap.add_argument("--repeat", type=int, default=5, help="rebalance rounds (medians)")
    ap.add_argument("--share-repeat", type=int, default=3)
    ap.add_argument("--members", type=int, default=10)
    ap.add_argument("--partitions", type=int, default=24)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument(
        "--quiet",
        type=float,
        default=2.0,
        help="seconds without callbacks that make an assignment settled",
    )
    ap.add_argument(
        "--jitter",
        type=float,
        default=5.0,
        help="random wait (0..s) before the join and before the leave",
    )
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--share-records", type=int, default=200_000)
    ap.add_argument("--share-consumers", default="1,4")
    ap.add_argument("--parts", default="rebalance,share")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--systems", default="straitmq,kafka")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--report", metavar="JSON", help="print the tables of an earlier run")
    a = ap.parse_args(argv)
    if a.quick:
        a.repeat, a.share_repeat, a.share_records, a.no_warmup = 1, 1, 20_000, True
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.report:
        print(report(json.loads(Path(a.report).read_text())))
        return 0
    ensure_jars()
    work = Path(tempfile.mkdtemp(prefix="rebalance-bench-"))
    classes = {"kafka": Kafka, "straitmq": Strait}
    systems = []
    for name in a.systems.split(","):
        (work / name).mkdir()
        systems.append(classes[name](work / name))
    modes = a.modes.split(",")
    parts = a.parts.split(",")
    ks = [int(k) for k in a.share_consumers.split(",")]
    d: dict[str, Any] = {
        "args": vars(a),
        "loadavg_start": os.getloadavg(),
        "rebalance": {s.name: {m: [] for m in MODES} for s in systems},
        "share": {s.name: {str(k): [] for k in ks} for s in systems},
        "errors": [],
    }
    t_start = time.monotonic()
    started: list = []
    try:
        for s in systems:
            t0 = time.monotonic()
            started.append(s)
            s.start()
            log(f"{s.name}: ready in {time.monotonic() - t0:.1f}s on {s.bootstrap}")
        topic = f"rebalance-{uuid.uuid4().hex[:6]}"
        for s in systems:
            admin = AdminClient({"bootstrap.servers": s.bootstrap})  # held until result()
            admin.create_topics([NewTopic(topic, a.partitions, 1)])[topic].result(60)
        if "rebalance" in parts:
            rounds = ([-1] if not a.no_warmup else []) + list(range(a.repeat))
            for r in rounds:
                order = systems if r % 2 == 0 else systems[::-1]
                for m in modes:
                    rng = random.Random(f"{r}-{m}")
                    delays = (rng.uniform(0, a.jitter), rng.uniform(0, a.jitter))
                    for s in order:
                        try:
                            res = rebalance_once(s, m, topic, a, delays)
                        except Exception as e:
                            d["errors"].append(f"{s.name} {m} round {r + 1}: {e!r}")
                            log(f"  round {r + 1} {s.name} {m}: FAILED {e!r}")
                            continue
                        tag = "warm-up" if r < 0 else f"round {r + 1}"
                        log(
                            f"  {tag} {s.name:8} {m:11} join {res['join_s']:6.2f}s leave "
                            f"{res['leave_s']:6.2f}s revoked {res['join_revoked_partitions']}"
                            f" later {res['join_later_callbacks']}/"
                            f"{res['leave_later_callbacks']} setup {res['setup_s']:.1f}s"
                        )
                        if r >= 0:
                            d["rebalance"][s.name][m].append(res)
        if "share" in parts:
            cmd = compile_share_bench(work)
            stopic = f"share-{uuid.uuid4().hex[:6]}"
            for s in systems:
                t0 = time.monotonic()
                produce_share_topic(s, stopic, a.share_records)
                log(f"{s.name}: {a.share_records} records produced in {time.monotonic() - t0:.1f}s")
            rounds = ([-1] if not a.no_warmup else []) + list(range(a.share_repeat))
            for r in rounds:
                order = systems if r % 2 == 0 else systems[::-1]
                for k in ks:
                    for s in order:
                        try:
                            res = share_once(s, cmd, stopic, a.share_records, k, work, 600)
                        except Exception as e:
                            d["errors"].append(f"{s.name} share {k} round {r + 1}: {e!r}")
                            log(f"  round {r + 1} {s.name} share {k}: FAILED {e!r}")
                            continue
                        tag = "warm-up" if r < 0 else f"round {r + 1}"
                        log(
                            f"  {tag} {s.name:8} share x{k} {res['records_s']:8.0f} rec/s "
                            f"{res['seconds']:.1f}s 1st ack {res['first_ack_s']:.1f}s then "
                            f"{res['drain_records_s']:.0f} rec/s cpu {res['broker_cpu_s']:.1f}s "
                            f"redelivered {res['redelivered']} failed {res['ack_failed']} shares "
                            f"{res['min_share']:.2f}-{res['max_share']:.2f}"
                        )
                        if r >= 0:
                            d["share"][s.name][str(k)].append(res)
    finally:
        for s in started:
            try:
                s.stop()
            except Exception as e:
                log(f"stop {s.name}: {e!r}")
        if a.keep:
            log(f"work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    d["loadavg_end"] = os.getloadavg()
    print(report(d))
    log(f"total {time.monotonic() - t_start:.0f}s")
    if d["errors"]:
        print("\nerrors:\n  " + "\n  ".join(d["errors"]))
    path = (
        Path(a.json)
        if a.json
        else (
            REPO_ROOT
            / ".cache"
            / "bench"
            / f"group-rebalance-{_dt.datetime.now():%Y%m%d-%H%M%S}.json"
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(d))
    log(f"results written to {path}")
    return 1 if d["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
