"""Fault runs at scale (issue 30): hundreds of faulted runs over real processes, each
checked like a Jepsen history. Not a pytest test: it takes an hour or more.

One cluster per fault kind (3 controllers + 3 brokers, the short timeouts of
tests/cluster_support.py, every broker in its own network namespace for the network
faults). A run is one fault on a fresh topic (3 partitions, RF 3, min.insync.replicas 2)
while an idempotent acks=all producer writes unique values into it:

    produce until 100 acks, fault a broker for a seeded 0.5-6 s (the leader of a seeded
    partition), heal, produce until 100 more acks, stop the producer, read everything
    back with a fresh consumer group.

Fault kinds:
    kill9      SIGKILL, then the broker restarted (unflushed data lost: fsync is off)
    sigstop    SIGSTOP, then SIGCONT (a paused process: GC, a stuck disk, a VM pause)
    isolate    the broker's network cut from everyone, controllers included (the
               controllers' majority is on the other side)
    split      the broker cut from the other brokers only (blackhole routes in its
               namespace): it still reaches the controllers
    diskfull   the broker's data dir (its own small ext4, a sparse image loop-mounted
               with no root reserve, set up here and unmounted at the end) filled by a
               filler file, then the filler deleted; topics of this kind roll a segment
               every 16 KiB so that rolls, index writes and producer snapshots meet the
               full disk too. A broker that cannot write its metadata log stops itself
               (exit 74, as Kafka's broker stops when its metadata log directory fails):
               restarted at the heal, recorded as `victim_exit`. `fault_hits`: the
               Produce answers KAFKA_STORAGE_ERROR the victim gave in the run
    clock      the wall clock of one process (the seeded partition's leader, or in a
               third of the runs the active controller) jumped by a seeded +-1 s to
               +-5 min, then back to true time at the heal (two jumps a run). Every
               process runs under libfaketime (Debian package `faketime`) reading its
               own offset file; CLOCK_MONOTONIC is not faked (FAKETIME_DONT_FAKE_MONOTONIC):
               Linux steps only CLOCK_REALTIME (NTP, date -s), monotonic time never jumps.
               The jump is seen from outside: the process's HTTP Date header, read
               right after the jump, against this machine's clock (`seen_jump_s`)
    clockmono  as clock, CLOCK_MONOTONIC jumped too (no real clock does that: a
               backward jump stalls the process's timers for the fault, a forward one
               fires them at once; a stress of the timeouts, not a real-world fault)

After every run: lost (acknowledged, not read back), duplicated (a value read twice),
moved (read at another offset than acknowledged), out of order (a partition's values not
in the order the producer sent them). Every `--file-check-every` runs, and after the last,
the cluster is stopped and every replica of every topic of those runs is compared byte
for byte up to the high watermark (divergent offsets, missing offsets), then restarted.

    python -m bench.fault_runs --kinds kill9,sigstop,isolate,split,diskfull,clock \
        --runs 100 --seed 1 --json bench/results-faults.json

`--workload txn`: the same faults over transactions instead (a run is one workload or
the other: each has its own cluster and its own table, and a run stays ~10 s). Two
topics a run (3 partitions each, RF 3, min.insync.replicas 2), the transaction state log
RF 3. A transactional producer (confluent-kafka, transactional.id per run) writes
transactions of a seeded 1-10 values over the six partitions, ~30% aborted (seeded; an
aborted one is flushed first, so its values are in the log): 30 transactions ended,
fault (a seeded partition's leader, or in a third of the runs the coordinator of the
transactional.id), heal, 30 more, stop. Each transaction's outcome is recorded by
confluent-kafka's rules: commit_transaction returned (committed); abort_transaction
returned (aborted); commit raised retriable (commit again), txn_requires_abort (abort:
aborted) or fatal (a new producer, whose init_transactions fences the old one: unknown).
Then: every partition's last stable offset must reach its high watermark within
HANGING_BOUND_S (else `hanging`: a transaction left open), a read_committed consumer
reads everything and a read_uncommitted one too (`aborted_written`: the aborted values
were there, so the check could fail). Checked (txn_history): no value of an aborted
transaction read (`aborted_reads`); every committed value read once (`lost`,
`duplicated`) where it was delivered (`moved`); every transaction all or nothing
(`partial`; unknown ones read whole count as `unknown_committed`); per partition, send
order (`out_of_order`); nothing read that was not sent (`strays`). Beside it, across
the same fault, an exactly-once consume-transform-produce leg (EosLeg): a read_committed
consumer of both topics and a second transactional producer writing `out:<value>` to a
third topic, the consumer's positions committed in each transaction
(send_offsets_to_transaction), restarted from the committed offsets on an error; once
it committed the inputs' ends, every committed input value must be in the output
exactly once (`eos_lost`, `eos_duplicated`) and nothing else (`eos_strays`: an aborted
input processed). The file checks cover the three topics (control batches included).
A bad run's whole history is written to <work>/<kind>/histories/<topic>.json.

    python -m bench.fault_runs --workload txn --kinds kill9 --runs 100 --seed 1 \
        --json bench/results-faults-txn.json

diskfull and clock need root (mount) and libfaketime; the harness says which is missing.
"""

from __future__ import annotations

import argparse
import email.utils
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from cluster_support import (  # noqa: E402
    BROKER_ARGS,
    Cluster,
    Workload,
    cluster_factory,
    compare_replicas,
    consume_all,
    wait_for,
)
from confluent_kafka import (  # noqa: E402
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from straitmq.broker.transactions.coordinator import partition_for  # noqa: E402

from straitmq.admin_client import AdminError  # noqa: E402

KINDS = ("kill9", "sigstop", "isolate", "split", "diskfull", "clock", "clockmono")
NETWORK_KINDS = ("isolate", "split")
CLOCK_KINDS = ("clock", "clockmono")
DISK_MB = 512  # each broker's data filesystem (sparse: costs what is written)
FAKETIME_LIBS = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
)
# Topics of the disk-full kind: small segments, so that a fault meets rolls (index
# flush, producer snapshot, new segment file) and not only appends.
DISKFULL_TOPIC = {"segment.bytes": "16384"}


@dataclass
class Run:
    kind: str
    run: int
    seed: int
    victim: int
    hold_s: float
    acked: int = 0
    failed: int = 0
    consumed: int = 0
    lost: int = 0
    duplicates: int = 0
    moved: int = 0
    out_of_order: int = 0
    divergent_offsets: int = 0
    replicas_identical: bool | None = None  # None until its file check
    errors: dict = field(default_factory=dict)
    stalled: str | None = None  # the run could not finish (no progress after healing)
    seconds: float = 0.0
    # diskfull: the Produce answers with KAFKA_STORAGE_ERROR the victim gave during the
    # run (the fault reached it); clock: the jump in seconds and the process jumped
    fault_hits: int | None = None
    jump_s: int | None = None
    jumped: str | None = None
    victim_exit: int | None = None  # the victim stopped itself during the fault (its code)
    seen_jump_s: int | None = None  # clock: the jumped process's Date header minus ours
    # --workload txn (txn_history): acked/lost/duplicates/moved/out_of_order count the
    # values of committed transactions; the rest is below
    workload: str = "idem"
    victim_role: str | None = None  # txn: "leader" (of a partition) or "coordinator"
    txns: int = 0
    committed_txns: int = 0
    aborted_txns: int = 0
    unknown_txns: int = 0  # a commit that failed fatally: the outcome is the log's
    unknown_committed: int = 0  # of those, read back whole
    aborted_reads: int = 0  # values of aborted transactions read by read_committed
    partial: int = 0  # transactions read in part
    strays: int = 0  # values read that no transaction sent
    hanging: int = 0  # partitions whose LSO stayed below the HW after the heal
    aborted_written: int = 0  # aborted values read_uncommitted saw (were there to find)
    producers: int = 0  # transactional producers made (1 + one per fatal error)
    txn_log: list = field(default_factory=list)  # transactions that met an error
    # the exactly-once consume-transform-produce leg (EosLeg, eos_history)
    eos_in: int = 0  # committed input values
    eos_out: int = 0  # output values read (read_committed)
    eos_lost: int = 0
    eos_duplicated: int = 0
    eos_strays: int = 0
    eos_txns: int = 0
    eos_restarts: int = 0
    eos_errors: dict = field(default_factory=dict)
    eos_stuck: list = field(default_factory=list)  # librdkafka calls hung (EosLeg._watch)
    eos_offset_only_txns: int = 0  # positions past markers committed alone (EosLeg._idle)

    def ok(self) -> bool:
        return (
            self.stalled is None
            and self.lost == self.duplicates == self.moved == self.out_of_order == 0
            and self.aborted_reads == self.partial == self.strays == self.hanging == 0
            and self.eos_lost == self.eos_duplicated == self.eos_strays == 0
            and self.divergent_offsets == 0
            and self.replicas_identical is not False
        )


def history(w: Workload, got: list[tuple[int, int, bytes]], r: Run) -> None:
    """The read-back history against the acknowledgements."""
    r.acked = len(w.acked)
    r.failed = sum(w.errors.values())
    r.errors = dict(w.errors)
    r.consumed = len(got)
    values = Counter(v for _, _, v in got)
    r.duplicates = sum(n - 1 for n in values.values() if n > 1)
    r.lost = sum(1 for v in w.acked if v not in values)
    where = {v: (p, o) for p, o, v in got}
    r.moved = sum(1 for v, po in w.acked.items() if v in where and where[v] != po)
    # Per partition, the producer's sequence numbers must come back increasing.
    last: dict[int, int] = {}
    for p, _o, v in sorted(got):
        n = int(v.rsplit(b"-", 1)[1])
        if n < last.get(p, -1):
            r.out_of_order += 1
        last[p] = n


def faketime_lib() -> str | None:
    return next((p for p in FAKETIME_LIBS if os.path.exists(p)), None)


def sh(*args: str) -> None:
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stderr.strip()}")


class Disks:
    """Each broker's data dir on its own small ext4: a sparse image, loop-mounted before
    the cluster starts (the cluster's folder layout is LocalCluster's:
    <cluster>/broker-<id>), no blocks reserved for root (the broker runs as root)."""

    def __init__(self, cluster_dir: Path, brokers: int) -> None:
        self.dirs = {i: cluster_dir / f"broker-{i}" for i in range(1, brokers + 1)}
        self.images = {i: cluster_dir.parent / f"broker-{i}.img" for i in self.dirs}
        self.mounted: list[int] = []

    def setup(self) -> None:
        for i, d in self.dirs.items():
            img = self.images[i]
            img.unlink(missing_ok=True)
            with open(img, "wb") as f:
                f.truncate(DISK_MB << 20)
            sh("mkfs.ext4", "-q", "-F", "-m", "0", str(img))
            d.mkdir(parents=True, exist_ok=True)
            sh("mount", "-o", "loop", str(img), str(d))
            self.mounted.append(i)

    def fill(self, i: int) -> int:
        """Take every free block of broker i's disk; returns the bytes taken."""
        path = self.dirs[i] / "filler"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        taken = 0
        try:
            st = os.statvfs(self.dirs[i])
            chunk = st.f_bavail * st.f_frsize
            while chunk >= 512:  # fallocate what fits, halving on ENOSPC
                try:
                    os.posix_fallocate(fd, taken, chunk)
                    taken += chunk
                except OSError:
                    chunk //= 2
            block = b"\0" * 512
            while True:  # and the last partial blocks
                try:
                    taken += os.pwrite(fd, block, taken)
                except OSError:
                    break
        finally:
            os.close(fd)
        return taken

    def free(self, i: int) -> None:
        (self.dirs[i] / "filler").unlink(missing_ok=True)

    def teardown(self) -> None:
        for i in self.mounted:
            self.free(i)
            r = subprocess.run(["umount", str(self.dirs[i])], capture_output=True)
            if r.returncode != 0:
                subprocess.run(["umount", "-l", str(self.dirs[i])], capture_output=True)
            self.images[i].unlink(missing_ok=True)
        self.mounted.clear()


class Clocks:
    """Every process under libfaketime, each with its own offset file ("+0" is true
    time), read again at every wall-clock call (FAKETIME_NO_CACHE: libfaketime 0.9.10
    with FAKETIME_CACHE_DURATION did not see a replaced file; the read costs ~5 us per
    time.time(), monotonic calls are not faked and cost nothing)."""

    def __init__(
        self, work: Path, lib: str, controllers: int, brokers: int, monotonic: bool = False
    ) -> None:
        self.lib = lib
        self.monotonic = monotonic
        names = [f"controller-{1001 + j}" for j in range(controllers)]
        names += [f"broker-{i}" for i in range(1, brokers + 1)]
        self.files = {n: work / f"faketime-{n}" for n in names}
        for f in self.files.values():
            f.write_text("+0\n")

    def prefixes(self) -> dict[str, list[str]]:
        return {
            n: [
                "env",
                f"LD_PRELOAD={self.lib}",
                f"FAKETIME_TIMESTAMP_FILE={f}",
                "FAKETIME_NO_CACHE=1",
                *([] if self.monotonic else ["FAKETIME_DONT_FAKE_MONOTONIC=1"]),
            ]
            for n, f in self.files.items()
        }

    def set(self, name: str, offset_s: int) -> None:
        tmp = self.files[name].with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+d}\n")
        os.replace(tmp, self.files[name])  # never a half-written offset


class Faults:
    def __init__(
        self, c: Cluster, disks: Disks | None = None, clocks: Clocks | None = None
    ) -> None:
        self.c = c
        self.disks = disks
        self.clocks = clocks
        self.exits: list[int] = []  # exit codes of victims found stopped at a heal

    def inject(self, kind: str, victim: int) -> None:
        node = self.c.brokers[victim]
        if kind == "kill9":
            node.kill9()
        elif kind == "sigstop":
            node.signal(signal.SIGSTOP)
        elif kind == "isolate":
            self.c.net.isolate(victim)
        elif kind == "split":
            for other in self.c.brokers:
                if other != victim:
                    self._ns(victim, "route", "add", "blackhole", f"{self.c.net.host(other)}/32")
        elif kind == "diskfull":
            assert self.disks is not None
            self.disks.fill(victim)
        else:
            raise ValueError(kind)

    def heal(self, kind: str, victim: int) -> None:
        node = self.c.brokers[victim]
        if kind == "kill9":
            node.start()
        elif kind == "sigstop":
            node.signal(signal.SIGCONT)
        elif kind == "isolate":
            self.c.net.heal(victim)
        elif kind == "split":
            for other in self.c.brokers:
                if other != victim:
                    self._ns(victim, "route", "del", "blackhole", f"{self.c.net.host(other)}/32")
        elif kind == "diskfull":
            assert self.disks is not None
            self.disks.free(victim)
            if node.proc is not None and node.proc.poll() is not None:
                # A broker that could not write its metadata log stops (exit 74), as
                # Kafka's does when its log directory fails: restarted once space is back.
                self.exits.append(node.proc.returncode)
                node.start()

    def _ns(self, i: int, *args: str) -> None:
        subprocess.run(["ip", "-n", self.c.net.ns(i), *args], check=True, capture_output=True)


def http_clock_skew(c: Cluster, name: str) -> int | None:
    """The process's wall clock as its HTTP Date header shows it (whole seconds) minus
    this machine's, or None if it did not answer."""
    kind, node_id = name.rsplit("-", 1)
    node = (c.controllers if kind == "controller" else c.brokers)[int(node_id)]
    url = f"http://{node.host}:{node.http_port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            date = resp.headers.get("Date")
    except urllib.error.HTTPError as e:  # not ready: its answer still has the header
        date = e.headers.get("Date")
    except OSError:
        return None
    if not date:
        return None
    return round(email.utils.parsedate_to_datetime(date).timestamp() - time.time())


def storage_errors(c: Cluster, victim: int) -> int:
    """Produce answers with KAFKA_STORAGE_ERROR (56) the broker gave so far."""
    view = c.brokers[victim].get("/api/v1/cluster") or {}
    return int(view.get("metrics", {}).get("request_errors", {}).get("0:56", 0))


def create_topic(c: Cluster, topic: str, configs: dict[str, str] | None) -> None:
    """Created once all three brokers are unfenced: on a loaded machine (other work on
    it) a broker can miss its 2 s session between runs and is back a moment later."""

    def attempt() -> bool | None:
        try:
            c.create_topic(topic, partitions=3, rf=3, min_isr=2, configs=configs)
        except AdminError as e:
            if "already exists" in str(e):
                return True
            if "available broker" in str(e):
                return None
            raise
        return True

    wait_for(attempt, 60, f"{topic}: created on three unfenced brokers", every=0.5)


def hold_fault(c: Cluster, faults: Faults, kind: str, victim: int, jumped: str, r: Run) -> None:
    """Inject the run's fault (a clock kind: jump `jumped`'s clock), hold it for the
    seeded r.hold_s, and heal it, whatever happened meanwhile."""
    if kind in CLOCK_KINDS:
        assert faults.clocks is not None and r.jump_s is not None
        faults.clocks.set(jumped, r.jump_s)
        r.seen_jump_s = http_clock_skew(c, jumped)
    else:
        faults.inject(kind, victim)
    try:
        time.sleep(r.hold_s)  # the fault's seeded duration (not a wait for a condition)
    finally:
        if kind in CLOCK_KINDS:
            assert faults.clocks is not None
            faults.clocks.set(jumped, 0)
        else:
            faults.heal(kind, victim)


def one_run(c: Cluster, faults: Faults, kind: str, i: int, seed: int) -> Run:
    rng = random.Random(seed)
    topic = f"{kind}-{i}"
    create_topic(c, topic, DISKFULL_TOPIC if kind == "diskfull" else None)
    c.wait_isr(topic, 3)
    victim = c.leader_of(topic, rng.randrange(3))
    r = Run(kind, i, seed, victim, round(rng.uniform(0.5, 6.0), 2))
    jumped = f"broker-{victim}"
    if kind in CLOCK_KINDS:
        # Either way, by 1 s to 5 min; a third of the runs jump the active controller.
        r.jump_s = rng.choice((-1, 1)) * rng.choice((1, 2, 5, 10, 30, 60, 120, 300))
        if rng.random() < 1 / 3:
            ctl = c.wait_active_controller()
            jumped = ctl.name
        r.jumped = jumped
    hits0 = storage_errors(c, victim) if kind == "diskfull" else 0
    exits0 = len(faults.exits)
    t0 = time.monotonic()
    w = Workload(c.bootstrap, topic, prefix=f"{topic}", rate=300).start()
    try:
        w.wait_acked_growth(100, 60)
        hold_fault(c, faults, kind, victim, jumped, r)
        w.wait_acked_growth(100, 90)
    except Exception as e:  # recorded, and the history still checked
        r.stalled = f"{type(e).__name__}: {e}"
    finally:
        try:
            w.stop(flush_s=90)
        except AssertionError as e:
            r.stalled = r.stalled or str(e)
    if len(faults.exits) > exits0:
        r.victim_exit = faults.exits[-1]
        hits0 = 0  # a restarted broker counts from zero
    c.wait_ready(brokers=[victim])
    got = consume_all(c.bootstrap, topic, f"check-{topic}", len(w.acked))
    history(w, got, r)
    if kind == "diskfull":
        r.fault_hits = storage_errors(c, victim) - hits0
    r.seconds = round(time.monotonic() - t0, 1)
    return r


# -- the transactional workload (--workload txn) -------------------------------------

# The txn workload's brokers: the transaction state log replicated 3 ways (a coordinator
# on one replica would lose its transactions with its broker) and open transactions
# past their timeout looked for every second (Kafka: 10 s), so that a transaction the
# harness could not end is aborted well inside the hanging bound.
TXN_BROKER_ARGS = [
    "--transaction-state-log-replication-factor",
    "3",
    "--transaction-abort-check-interval-ms",
    "1000",
]
TXN_TIMEOUT_MS = 20_000  # the producer's transaction.timeout.ms
HANGING_BOUND_S = 60.0  # after the heal: TXN_TIMEOUT_MS, the abort check, a failover
TXN_GROWTH = 30  # transactions ended before the fault, and again after the heal
TXN_STATE_PARTITIONS = 50  # transaction.state.log.num.partitions (the default)

Rec = tuple[str, int, int, bytes]  # (topic, partition, offset, value) as read back


@dataclass
class Txn:
    """One transaction of the history: its values in send order, what became of it."""

    n: int
    values: list[tuple[str, int, bytes]]  # (topic, partition, value), in send order
    abort: bool = False  # the plan: abort it rather than commit
    # committed (commit_transaction returned), aborted (abort_transaction returned, or
    # it failed before a commit was asked), unknown (a commit was asked and failed
    # fatally: a new producer fenced the old one), open (never ended: the thread died)
    outcome: str = "open"
    offsets: dict[bytes, tuple[str, int, int]] = field(default_factory=dict)  # reports
    error: str | None = None  # the error that decided an aborted or unknown outcome


class TxnWorkload:
    """A transactional producer in a thread: transactions of a seeded 1-10 values over
    every partition of `topics`, each committed or aborted at random (seeded), the
    outcome of each recorded by confluent-kafka's rules for a failed commit: retriable,
    commit again; txn_requires_abort, abort (aborted); fatal, a new producer with the
    same transactional.id, whose init_transactions fences the old one and ends its
    transaction either way (unknown). Values are `<prefix>-<txn>-<seq>`, seq counting
    every value sent, so a partition's values must come back with seq increasing."""

    def __init__(
        self,
        bootstrap: str,
        topics: list[str],
        partitions: int,
        tid: str,
        seed: int,
        prefix: str,
        abort_ratio: float = 0.3,
    ) -> None:
        self.bootstrap = bootstrap
        self.topics = topics
        self.partitions = partitions
        self.tid = tid
        self.rng = random.Random(seed)
        self.prefix = prefix
        self.abort_ratio = abort_ratio
        self.txns: list[Txn] = []
        self.errors: Counter = Counter()  # failed deliveries and raised errors, by name
        self.producers = 0  # producers made: 1 + one per fatal error
        self.failure: str | None = None  # the thread stopped on an unexpected error
        self.seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    # -- the thread --

    def start(self) -> TxnWorkload:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            p = self._new_producer()
            while not self._stop.is_set():
                p = self._one(p, self._plan())
        except Exception as e:  # recorded: the run is stalled, its history still checked
            self.failure = f"{type(e).__name__}: {e}"

    def _plan(self) -> Txn:
        t = Txn(len(self.txns), [], abort=self.rng.random() < self.abort_ratio)
        for _ in range(self.rng.randint(1, 10)):
            topic = self.rng.choice(self.topics)
            part = self.rng.randrange(self.partitions)
            t.values.append((topic, part, f"{self.prefix}-{t.n}-{self.seq}".encode()))
            self.seq += 1
        with self._lock:
            self.txns.append(t)
        return t

    def _new_producer(self) -> Producer:
        self.producers += 1
        p = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": self.tid,
                "transaction.timeout.ms": TXN_TIMEOUT_MS,
                "linger.ms": 5,
                "retry.backoff.ms": 100,
                "topic.metadata.refresh.interval.ms": 1000,
                "log_level": 2,  # its errors are counted here, not printed
            }
        )
        deadline = time.monotonic() + 120
        while True:  # retriable (a timeout, the coordinator moving): call it again
            try:
                p.init_transactions(30)
                return p
            except KafkaException as e:
                err = e.args[0]
                self.errors[f"init:{err.name()}"] += 1
                if not err.retriable() or time.monotonic() > deadline:
                    raise

    def _one(self, p: Producer, t: Txn) -> Producer:
        committing = False
        try:
            p.begin_transaction()
            for topic, part, value in t.values:
                self._produce(p, t, topic, part, value)
            if t.abort:
                p.flush(60)  # delivered before the abort: read_uncommitted must see them
                return self._abort(p, t, "aborted")
            committing = True
            return self._commit(p, t)
        except SystemError as e:
            # confluent-kafka 2.16 on a fenced producer: flush() "returned NULL without
            # setting an exception", or a delivery callback run with an error pending.
            # The producer is unusable: handled as a fatal error.
            self.errors["txn:SystemError"] += 1
            t.error = f"SystemError: {e}"
            if t.outcome == "open":
                t.outcome = "unknown" if committing else "aborted"
            return self._replace(p)
        except KafkaException as e:
            err = e.args[0]
            self.errors[f"txn:{err.name()}"] += 1
            t.error = err.name()
            if committing or err.fatal():
                # _commit decided it (or a fatal error before any commit was asked:
                # the next producer aborts it)
                if t.outcome == "open":
                    t.outcome = "unknown" if committing else "aborted"
                return self._replace(p)
            return self._abort(p, t, "aborted")

    def _produce(self, p: Producer, t: Txn, topic: str, part: int, value: bytes) -> None:
        def on_delivery(err: Any, msg: Any) -> None:
            if err is None:
                t.offsets[msg.value()] = (msg.topic(), msg.partition(), msg.offset())
            else:
                key = f"delivery:{err.name()}"
                self.errors[key] = self.errors.get(key, 0) + 1

        while True:
            try:
                p.produce(topic, value=value, partition=part, on_delivery=on_delivery)
                p.poll(0)
                return
            except BufferError:
                p.poll(0.05)

    def _commit(self, p: Producer, t: Txn) -> Producer:
        deadline = time.monotonic() + 90
        while True:
            try:
                p.commit_transaction(30)
                t.outcome = "committed"
                return p
            except KafkaException as e:
                err = e.args[0]
                self.errors[f"commit:{err.name()}"] += 1
                t.error = err.name()
                if err.retriable() and time.monotonic() < deadline:
                    continue
                if err.txn_requires_abort():
                    return self._abort(p, t, "unknown")
                t.outcome = "unknown"  # fatal (or retried out): the next producer ends it
                return self._replace(p)

    def _abort(self, p: Producer, t: Txn, if_failed: str) -> Producer:
        """Abort; if that fails fatally, `if_failed` is the outcome (aborted when no
        commit was ever asked for: the next producer can only abort it)."""
        deadline = time.monotonic() + 90
        while True:
            try:
                p.abort_transaction(30)
                t.outcome = "aborted"
                return p
            except KafkaException as e:
                err = e.args[0]
                self.errors[f"abort:{err.name()}"] += 1
                t.error = err.name()
                if err.retriable() and time.monotonic() < deadline:
                    continue
                t.outcome = if_failed
                return self._replace(p)

    def _replace(self, p: Producer) -> Producer:
        del p  # the fenced producer is destroyed before its successor fences it
        return self._new_producer()

    # -- the harness's side --

    def ended(self) -> int:
        with self._lock:
            return sum(t.outcome != "open" for t in self.txns)

    def wait_growth(self, more: int, timeout: float) -> None:
        target = self.ended() + more
        wait_for(
            lambda: self.ended() >= target or self.failure,
            timeout,
            f"{more} more transactions ended",
            0.05,
        )
        if self.failure:
            raise RuntimeError(self.failure)

    def stop(self, timeout: float = 240) -> None:
        """Let the transaction under way end (its retries are bounded), then stop."""
        self._stop.set()
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"the transactional producer still busy after {timeout}s")
        if self.failure:
            raise AssertionError(f"the transactional producer stopped: {self.failure}")


def stable_ends(
    bootstrap: str, tps: list[tuple[str, int]], bound: float
) -> tuple[dict[tuple[str, int], tuple[int, int]], int]:
    """{(topic, partition): (last stable offset, high watermark)} once every LSO reached
    its high watermark (no transaction left open), or after `bound` seconds; and how
    many partitions were still short then (`hanging`). ListOffsets(latest) answers the
    LSO to a read_committed client and the high watermark to a read_uncommitted one."""
    clients = {
        iso: Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"ends-{iso}",
                "isolation.level": iso,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        for iso in ("read_committed", "read_uncommitted")
    }
    ends: dict[tuple[str, int], tuple[int, int]] = {}

    def look() -> bool:
        for topic, part in tps:
            tp = TopicPartition(topic, part)
            try:
                _, lso = clients["read_committed"].get_watermark_offsets(tp, 5, cached=False)
                _, hw = clients["read_uncommitted"].get_watermark_offsets(tp, 5, cached=False)
            except KafkaException:
                continue  # a leader moving: asked again
            ends[(topic, part)] = (lso, hw)
        return len(ends) == len(tps) and all(lso == hw for lso, hw in ends.values())

    try:
        try:
            wait_for(look, bound, "every last stable offset at its high watermark", 0.5)
        except TimeoutError:
            pass
    finally:
        for c in clients.values():
            c.close()
    hanging = sum(1 for tp in tps if tp not in ends or ends[tp][0] != ends[tp][1])
    return ends, hanging


def read_back(
    bootstrap: str, tps: list[tuple[str, int]], isolation: str, timeout: float = 60
) -> tuple[list[Rec], int]:
    """Every record a consumer of `isolation` reads from the start of each partition to
    the end it sees (read_committed: the LSO), by assignment (no group to join); and how
    many partitions it did not reach the end of within `timeout`."""
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{isolation}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    out: list[Rec] = []
    eof: set[tuple[str, int]] = set()
    try:
        c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in tps])
        deadline = time.monotonic() + timeout
        while len(eof) < len(tps) and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    eof.add((m.topic(), m.partition()))
                continue  # a leader moving: the consumer fetches again
            eof.discard((m.topic(), m.partition()))
            out.append((m.topic(), m.partition(), m.offset(), m.value()))
    finally:
        c.close()
    return out, len(tps) - len(eof)


def txn_history(
    txns: list[Txn], committed: list[Rec], uncommitted: list[Rec] | None, r: Run
) -> None:
    """The transactional history against what read_committed (and read_uncommitted)
    consumers read back:
      aborted_reads  values of an aborted transaction read by read_committed
      lost           values of a committed transaction not read
      duplicates     a value read more than once
      partial        transactions of which some values were read and some not (of any
                     outcome: an unknown one must be all or nothing too)
      moved          committed values read at another place than their delivery report
      out_of_order   per partition, values not in the order the producer sent them
      strays         values read that no transaction sent
    unknown_committed: unknown outcomes read whole (they were committed after all);
    aborted_written: aborted values read_uncommitted saw (they were written, so the
    aborted-read check had something to find)."""
    r.txns = len(txns)
    r.committed_txns = sum(t.outcome == "committed" for t in txns)
    r.aborted_txns = sum(t.outcome == "aborted" for t in txns)
    r.unknown_txns = sum(t.outcome in ("unknown", "open") for t in txns)
    r.acked = sum(len(t.values) for t in txns if t.outcome == "committed")
    r.consumed = len(committed)
    read = Counter(v for *_, v in committed)
    where = {v: (topic, p, o) for topic, p, o, v in committed}
    r.duplicates = sum(n - 1 for n in read.values() if n > 1)
    sent = {v for t in txns for *_, v in t.values}
    r.strays = sum(1 for v in read if v not in sent)
    for t in txns:
        seen = sum(1 for *_, v in t.values if v in read)
        if t.outcome == "committed":
            r.lost += len(t.values) - seen
            r.moved += sum(1 for v, at in t.offsets.items() if v in where and where[v] != at)
        elif t.outcome == "aborted":
            r.aborted_reads += seen
        elif seen == len(t.values):
            r.unknown_committed += 1
        if 0 < seen < len(t.values):
            r.partial += 1
    last: dict[tuple[str, int], int] = {}
    for topic, p, _o, v in sorted(committed):
        if v not in sent:
            continue  # a stray: counted above, it has no place in the order
        n = int(v.rsplit(b"-", 1)[1])
        if n < last.get((topic, p), -1):
            r.out_of_order += 1
        last[(topic, p)] = n
    if uncommitted is not None:
        aborted = {v for t in txns if t.outcome == "aborted" for *_, v in t.values}
        r.aborted_written = len({v for *_, v in uncommitted} & aborted)


class _Abandoned(Exception):
    """This generation of the exactly-once leg was replaced while it was blocked."""


EOS_STUCK_S = 45.0  # a librdkafka call this long past a 30 s timeout is hung


class EosLeg:
    """Consume-transform-produce, exactly once (KIP-98/447): a read_committed consumer of
    the input topics (assigned, group `group` for the offsets) and a transactional
    producer that writes `out:<value>` to `output` (same partition number) and commits
    the consumer's positions in the same transaction (send_offsets_to_transaction). On
    an abortable error: abort, and seek back to the committed offsets; on a fatal one: a
    new producer (fencing the old) and a new consumer from the committed offsets. Runs
    until drain() finds its committed offsets at the inputs' ends.

    A librdkafka call can block for good past its timeout (send_offsets_to_transaction
    while the group coordinator is away: librdkafka issues 5456 and 5511); drain() then
    records where (`stuck`: the call, the thread's stack) and starts a new generation of
    clients, whose init_transactions fences the blocked producer (its transaction is
    aborted), as a restarted application would."""

    def __init__(
        self, bootstrap: str, inputs: list[str], output: str, partitions: int, name: str
    ) -> None:
        self.bootstrap = bootstrap
        self.tps = [TopicPartition(t, p) for t in inputs for p in range(partitions)]
        self.output = output
        self.group = f"eos-{name}"
        self.tid = f"eos-{name}"
        self.errors: Counter = Counter()
        self.txns = 0  # committed
        self.restarts = 0  # fatal errors: new producer and consumer
        self.stuck: list[dict[str, Any]] = []
        self.offset_only_txns = 0
        self.last_seen: dict[str, tuple[int, int | None]] = {}  # committed, position
        self.failure: str | None = None
        self.ends: dict[tuple[str, int], int] | None = None  # set by drain()
        self.done = threading.Event()
        self._stop = threading.Event()
        self.gen = 0
        self.call: tuple[int, str, float] | None = None  # (generation, call, since)
        self.thread = self._spawn()

    def _spawn(self) -> threading.Thread:
        self.gen += 1
        return threading.Thread(target=self._run, args=(self.gen,), daemon=True)

    def start(self) -> EosLeg:
        self.thread.start()
        return self

    def _call(self, gen: int, what: str, fn: Any, *args: Any) -> Any:
        """A blocking librdkafka call, watched by drain(); a replaced generation stops."""
        if gen != self.gen:
            raise _Abandoned
        self.call = (gen, what, time.monotonic())
        try:
            return fn(*args)
        finally:
            if gen == self.gen:
                self.call = None
            else:
                raise _Abandoned

    def _clients(self, gen: int) -> tuple[Consumer, Producer]:
        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "topic.metadata.refresh.interval.ms": 1000,
                "log_level": 2,
            }
        )
        p = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": self.tid,
                "transaction.timeout.ms": TXN_TIMEOUT_MS,
                "linger.ms": 5,
                "topic.metadata.refresh.interval.ms": 1000,
                "log_level": 2,
            }
        )
        deadline = time.monotonic() + 120
        while True:
            try:
                # first: ends the fenced producer's transaction
                self._call(gen, "init_transactions", p.init_transactions, 30)
                break
            except KafkaException as e:
                err = e.args[0]
                self.errors[f"init:{err.name()}"] += 1
                if not err.retriable() or time.monotonic() > deadline:
                    raise
        c.assign(self._committed(gen, c))
        return c, p

    def _committed(self, gen: int, c: Consumer) -> list[TopicPartition]:
        """The group's committed offsets (stable ones: read_committed asks with
        require_stable, KIP-447), retried while the coordinator moves."""
        deadline = time.monotonic() + 120
        while True:
            try:
                got = self._call(gen, "committed", c.committed, self.tps, 10)
                return [
                    TopicPartition(tp.topic, tp.partition, tp.offset)
                    if tp.offset >= 0
                    else TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING)
                    for tp in got
                ]
            except KafkaException as e:
                self.errors[f"committed:{e.args[0].name()}"] += 1
                if time.monotonic() > deadline:
                    raise
                # A moving coordinator answers at once: back off as a client does
                # (retry.backoff.ms) instead of asking it in a tight loop.
                self._stop.wait(0.1)

    def _run(self, gen: int) -> None:
        try:
            c, p = self._clients(gen)
            while not self._stop.is_set() and gen == self.gen:
                msgs = [m for m in c.consume(100, 0.2) if not m.error()]
                if not msgs:
                    if self.ends is not None:
                        c, p, done = self._idle(gen, c, p)
                        if done:
                            self.done.set()
                            return
                    continue
                c, p = self._one(gen, c, p, msgs)
        except _Abandoned:
            return  # a newer generation runs (its producer fenced this one)
        except Exception as e:  # recorded: the run is stalled
            if gen == self.gen:
                self.failure = f"{type(e).__name__}: {e}"
        if gen == self.gen:
            self.done.set()

    def _idle(self, gen: int, c: Consumer, p: Producer) -> tuple[Consumer, Producer, bool]:
        """Nothing to process, and drain() gave the inputs' ends: done once the
        committed offsets reach them. A position past the committed offset with nothing
        to process (the consumer read only markers or aborted records since its last
        transaction) is committed by a transaction of offsets alone, as Kafka Streams
        commits its positions."""
        assert self.ends is not None
        committed = self._committed(gen, c)
        pos = {(tp.topic, tp.partition): tp.offset for tp in c.position(c.assignment())}
        self.last_seen = {
            f"{tp.topic}:{tp.partition}": (tp.offset, pos.get((tp.topic, tp.partition)))
            for tp in committed
        }
        if all(tp.offset >= self.ends[(tp.topic, tp.partition)] for tp in committed):
            return c, p, True
        if any(pos.get((tp.topic, tp.partition), -1) > tp.offset for tp in committed):
            c, p = self._one(gen, c, p, [])
            self.offset_only_txns += 1
        return c, p, False

    def _one(
        self, gen: int, c: Consumer, p: Producer, msgs: list[Any]
    ) -> tuple[Consumer, Producer]:
        try:
            p.begin_transaction()
            for m in msgs:
                while True:
                    try:
                        p.produce(self.output, b"out:" + m.value(), partition=m.partition())
                        break
                    except BufferError:
                        p.poll(0.05)
            self._call(
                gen,
                "send_offsets_to_transaction",
                p.send_offsets_to_transaction,
                c.position(c.assignment()),
                c.consumer_group_metadata(),
                30,
            )
            deadline = time.monotonic() + 90
            while True:
                try:
                    self._call(gen, "commit_transaction", p.commit_transaction, 30)
                    self.txns += 1
                    return c, p
                except KafkaException as e:
                    err = e.args[0]
                    if err.retriable() and time.monotonic() < deadline:
                        self.errors[f"commit:{err.name()}"] += 1
                        continue
                    raise
        except SystemError:  # as in TxnWorkload._one: the producer is unusable
            self.errors["txn:SystemError"] += 1
            self.restarts += 1
            c.close()
            del p
            return self._clients(gen)
        except KafkaException as e:
            err = e.args[0]
            self.errors[f"txn:{err.name()}"] += 1
            if err.txn_requires_abort():
                try:
                    self._call(gen, "abort_transaction", p.abort_transaction, 30)
                    for tp in self._committed(gen, c):  # back to what the group committed
                        c.seek(tp)
                    return c, p
                except KafkaException as e2:
                    self.errors[f"abort:{e2.args[0].name()}"] += 1
            # fatal (or the abort failed): start over from the committed offsets
            self.restarts += 1
            c.close()
            del p
            return self._clients(gen)

    def _watch(self) -> None:
        """A call blocked EOS_STUCK_S: record it, start the next generation."""
        call = self.call
        if call is None or time.monotonic() - call[2] < EOS_STUCK_S:
            return
        gen, what, since = call
        frame = sys._current_frames().get(self.thread.ident or -1)
        self.stuck.append(
            {
                "call": what,
                "generation": gen,
                "blocked_s": round(time.monotonic() - since, 1),
                "stack": traceback.format_stack(frame)[-3:] if frame else None,
            }
        )
        self.call = None
        self.thread = self._spawn()
        self.thread.start()

    def drain(self, ends: dict[tuple[str, int], int], timeout: float) -> None:
        """Run on until the group's committed offsets reach `ends` (the inputs' LSOs,
        once the input producer stopped), or fail after `timeout`."""
        self.ends = ends
        deadline = time.monotonic() + timeout
        while not self.done.wait(1) and time.monotonic() < deadline:
            self._watch()
        finished = self.done.is_set()
        self._stop.set()
        self.thread.join(30)
        if self.failure:
            raise AssertionError(f"the exactly-once leg stopped: {self.failure}")
        if not finished:
            raise AssertionError(
                f"the exactly-once leg not at the inputs' ends in {timeout}s: "
                f"(committed, position) {self.last_seen}, ends {self.ends}"
            )


def eos_history(inputs: list[Rec], outputs: list[Rec], r: Run) -> None:
    """Every input value (as read_committed read it) in the output exactly once, and
    nothing else: eos_lost, eos_duplicated, eos_strays (an output whose input is not a
    committed input value: an aborted one read, or invented)."""
    want = {v for *_, v in inputs}
    got = Counter(v for *_, v in outputs)
    r.eos_in = len(want)
    r.eos_out = len(outputs)
    r.eos_duplicated = sum(n - 1 for n in got.values() if n > 1)
    r.eos_lost = sum(1 for v in want if b"out:" + v not in got)
    r.eos_strays = sum(1 for v in got if not v.startswith(b"out:") or v[4:] not in want)


def topics_of(r: Run) -> list[str]:
    base = f"{r.kind}-{r.run}"
    return [base, f"{base}-b", f"{base}-out"] if r.workload == "txn" else [base]


def one_txn_run(
    c: Cluster, faults: Faults, kind: str, i: int, seed: int, keep: Path | None = None
) -> Run:
    """one_run with the transactional workload: two topics, transactions ended until
    TXN_GROWTH more, fault, heal, TXN_GROWTH more, stop; then the hanging check and the
    read-back by a read_committed and a read_uncommitted consumer. The victim is the
    leader of a seeded partition of the first topic or, in a third of the runs, the
    transaction coordinator of the run's transactional.id (the leader of its partition
    of __transaction_state, known once the producer found it)."""
    rng = random.Random(seed)
    topic = f"{kind}-{i}"
    topics = [topic, f"{topic}-b"]
    output = f"{topic}-out"
    tid = f"txn-{topic}"
    for t in [*topics, output]:
        create_topic(c, t, DISKFULL_TOPIC if kind == "diskfull" else None)
    for t in [*topics, output]:
        c.wait_isr(t, 3)
    part = rng.randrange(3)
    r = Run(kind, i, seed, -1, round(rng.uniform(0.5, 6.0), 2), workload="txn")
    r.victim_role = "coordinator" if rng.random() < 1 / 3 else "leader"
    jump_controller = False
    if kind in CLOCK_KINDS:
        r.jump_s = rng.choice((-1, 1)) * rng.choice((1, 2, 5, 10, 30, 60, 120, 300))
        jump_controller = rng.random() < 1 / 3
    exits0 = len(faults.exits)
    t0 = time.monotonic()
    w = TxnWorkload(c.bootstrap, topics, 3, tid, rng.randrange(1 << 30), topic)
    w.start()
    eos = EosLeg(c.bootstrap, topics, output, 3, topic).start()
    hits0 = 0
    try:
        w.wait_growth(TXN_GROWTH, 90)
        if r.victim_role == "coordinator":
            state = partition_for(tid, TXN_STATE_PARTITIONS)
            r.victim = c.leader_of("__transaction_state", state)
        else:
            r.victim = c.leader_of(topic, part)
        victim = r.victim
        jumped = f"broker-{victim}"
        if jump_controller:
            jumped = c.wait_active_controller().name
        if kind in CLOCK_KINDS:
            r.jumped = jumped
        hits0 = storage_errors(c, victim) if kind == "diskfull" else 0
        hold_fault(c, faults, kind, victim, jumped, r)
        w.wait_growth(TXN_GROWTH, 120)
    except Exception as e:  # recorded, and the history still checked
        r.stalled = f"{type(e).__name__}: {e}"
    finally:
        try:
            w.stop()
        except AssertionError as e:
            r.stalled = r.stalled or str(e)
    if len(faults.exits) > exits0:
        r.victim_exit = faults.exits[-1]
        hits0 = 0
    c.wait_ready(brokers=[r.victim] if r.victim > 0 else None)
    tps = [(t, p) for t in topics for p in range(3)]
    _ends, r.hanging = stable_ends(c.bootstrap, tps, HANGING_BOUND_S)
    try:
        eos.drain({tp: lso for tp, (lso, _hw) in _ends.items()}, 180)
    except AssertionError as e:
        r.stalled = r.stalled or str(e)
    committed, short_c = read_back(c.bootstrap, tps, "read_committed")
    uncommitted, short_u = read_back(c.bootstrap, tps, "read_uncommitted")
    outputs, short_o = read_back(c.bootstrap, [(output, p) for p in range(3)], "read_committed")
    if short_c or short_u or short_o:
        r.stalled = r.stalled or (
            f"read back short of the end: {short_c} partitions read_committed, "
            f"{short_u} read_uncommitted, {short_o} of the output"
        )
    eos_history(committed, outputs, r)
    r.eos_txns, r.eos_restarts, r.eos_errors = eos.txns, eos.restarts, dict(eos.errors)
    r.eos_stuck, r.eos_offset_only_txns = eos.stuck, eos.offset_only_txns
    with w._lock:
        txns = list(w.txns)
    txn_history(txns, committed, uncommitted, r)
    r.failed = sum(n for k, n in w.errors.items() if k.startswith("delivery:"))
    r.errors = dict(w.errors)
    r.producers = w.producers
    if kind == "diskfull" and r.victim > 0:
        r.fault_hits = storage_errors(c, r.victim) - hits0
    r.seconds = round(time.monotonic() - t0, 1)
    r.txn_log = [
        {"n": t.n, "outcome": t.outcome, "values": len(t.values), "error": t.error}
        for t in txns
        if t.outcome not in ("committed", "aborted") or t.error
    ]
    if keep is not None and not r.ok():  # the whole history of a bad run, to replay
        keep.mkdir(parents=True, exist_ok=True)
        dump = {
            "run": asdict(r),
            "ends": {f"{t}:{p}": v for (t, p), v in _ends.items()},
            "txns": [
                {
                    **asdict(t),
                    "values": [[tp, p, v.decode()] for tp, p, v in t.values],
                    "offsets": {v.decode(): at for v, at in t.offsets.items()},
                }
                for t in txns
            ],
            "read_committed": [[t, p, o, v.decode()] for t, p, o, v in committed],
            "read_uncommitted": [[t, p, o, v.decode()] for t, p, o, v in uncommitted],
        }
        (keep / f"{topic}.json").write_text(json.dumps(dump))
    return r


def txn_line(r: Run) -> str:
    stuck = [x["call"] for x in r.eos_stuck]
    return (
        f"({r.victim_role}) txns={r.committed_txns}/{r.aborted_txns}/{r.unknown_txns} "
        f"aborted_reads={r.aborted_reads} partial={r.partial} strays={r.strays} "
        f"hanging={r.hanging} aborted_written={r.aborted_written} producers={r.producers} "
        f"eos={r.eos_in}->{r.eos_out} lost={r.eos_lost} dup={r.eos_duplicated} "
        f"strays={r.eos_strays} restarts={r.eos_restarts} "
        f"{f'eos_stuck={stuck} ' if stuck else ''}"
    )


def views(c: Cluster, topic: str) -> dict[int, Any]:
    """Each broker's view of a topic's partitions (leader, ISR, log end, HW)."""
    out: dict[int, Any] = {}
    for b, n in c.brokers.items():
        v = n.get(f"/api/v1/topics/{topic}") or {}
        out[b] = [
            {k: p.get(k) for k in ("partition", "leader", "leader_epoch", "isr", "local")}
            | {"leo": p.get("log_end_offset"), "hw": p.get("high_watermark")}
            for p in v.get("partitions", [])
        ]
    return out


def file_check(c: Cluster, runs: list[Run]) -> None:
    """Stop the cluster, compare every replica of these runs' topics, start it again. A
    topic whose replicas do not come to one log end is a finding: its views are kept."""
    hws: dict[str, dict[int, int]] = {}
    for r in runs:
        for topic in topics_of(r):
            try:
                hws[topic] = c.converge(topic, timeout=60)
            except TimeoutError:
                r.replicas_identical = False
                r.stalled = f"replicas never at one log end: {json.dumps(views(c, topic))}"
    c.stop()
    try:
        for r in runs:
            for topic in topics_of(r):
                if topic in hws and r.replicas_identical is not False:
                    same, divergent = compare_replicas(c, topic, hws[topic])
                    r.replicas_identical = same
                    r.divergent_offsets += divergent
    finally:
        c.start(wait_s=60)


def summarize(runs: list[Run]) -> list[dict[str, Any]]:
    rows = []
    for workload, kind in dict.fromkeys((r.workload, r.kind) for r in runs):
        mine = [r for r in runs if r.kind == kind and r.workload == workload]
        row: dict[str, Any] = {
            "kind": kind,
            "workload": workload,
            "runs": len(mine),
            "acked": sum(r.acked for r in mine),
            "lost": sum(r.lost for r in mine),
            "duplicated": sum(r.duplicates for r in mine),
            "moved": sum(r.moved for r in mine),
            "out_of_order": sum(r.out_of_order for r in mine),
            "divergent_offsets": sum(r.divergent_offsets for r in mine),
            "replicas_not_identical": sum(r.replicas_identical is False for r in mine),
            "failed_sends": sum(r.failed for r in mine),
            "stalled": sum(r.stalled is not None for r in mine),
            "bad_runs": [r.run for r in mine if not r.ok()],
        }
        if workload == "txn":
            for k in TXN_COUNTERS:
                row[k] = sum(getattr(r, k) for r in mine)
        rows.append(row)
    return rows


# Summed over a kind's runs for --workload txn (Run's fields of the same names).
TXN_COUNTERS = (
    "txns",
    "committed_txns",
    "aborted_txns",
    "unknown_txns",
    "unknown_committed",
    "aborted_reads",
    "partial",
    "strays",
    "hanging",
    "aborted_written",
    "eos_in",
    "eos_lost",
    "eos_duplicated",
    "eos_strays",
)


def table(rows: list[dict[str, Any]]) -> str:
    out = []
    idem = [r for r in rows if r.get("workload", "idem") == "idem"]
    txn = [r for r in rows if r.get("workload") == "txn"]
    if idem:
        out.append(
            "| fault | runs | acked | lost | duplicated | moved | out of order | divergent "
            "offsets | replicas differ | failed sends | stalled |"
        )
        out.append("|---|" + "---:|" * 10)
        for r in idem:
            out.append(
                f"| {r['kind']} | {r['runs']} | {r['acked']} | {r['lost']} | "
                f"{r['duplicated']} | {r['moved']} | {r['out_of_order']} | "
                f"{r['divergent_offsets']} | {r['replicas_not_identical']} | "
                f"{r['failed_sends']} | {r['stalled']} |"
            )
    if txn:
        if out:
            out.append("")
        out.append(
            "| fault (txn) | runs | txns | committed / aborted / unknown (read whole) | "
            "committed values | aborted values written | aborted reads | lost | "
            "duplicated | partial | moved | out of order | strays | hanging | divergent "
            "offsets | replicas differ | stalled | EOS inputs | EOS lost / dup / strays |"
        )
        out.append("|---|" + "---:|" * 18)
        for r in txn:
            out.append(
                f"| {r['kind']} | {r['runs']} | {r['txns']} | {r['committed_txns']} / "
                f"{r['aborted_txns']} / {r['unknown_txns']} ({r['unknown_committed']}) | "
                f"{r['acked']} | {r['aborted_written']} | {r['aborted_reads']} | "
                f"{r['lost']} | {r['duplicated']} | {r['partial']} | {r['moved']} | "
                f"{r['out_of_order']} | {r['strays']} | {r['hanging']} | "
                f"{r['divergent_offsets']} | {r['replicas_not_identical']} | "
                f"{r['stalled']} | {r['eos_in']} | {r['eos_lost']} / "
                f"{r['eos_duplicated']} / {r['eos_strays']} |"
            )
    return "\n".join(out)


def write_json(path: str, runs: list[Run]) -> None:
    data = {"summary": summarize(runs), "runs": [asdict(r) for r in runs]}
    Path(path).write_text(json.dumps(data, indent=1))


def _stop_runs(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--runs", type=int, default=100, help="faulted runs per kind")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--file-check-every", type=int, default=10)
    ap.add_argument(
        "--workload",
        choices=("idem", "txn"),
        default="idem",
        help="idem: the idempotent producer; txn: transactions, committed or aborted",
    )
    ap.add_argument("--work", help="default /tmp/straitmq-fault-runs[-txn]")
    ap.add_argument("--json", help="write every run and the summary here")
    args = ap.parse_args(argv)
    # SIGTERM (and SIGINT, ignored in a background job) stop the runs through the
    # `finally`s: the clusters stopped, the namespaces and disks removed.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop_runs)
    kinds = [k for k in args.kinds.split(",") if k]
    if unknown := set(kinds) - set(KINDS):
        ap.error(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    if os.geteuid() != 0 and set(kinds) & {*NETWORK_KINDS, "diskfull"}:
        ap.error("the network and disk faults need root (network namespaces, mount)")
    if set(kinds) & set(CLOCK_KINDS) and faketime_lib() is None:
        ap.error(
            "the clock fault needs libfaketime, which is not installed (Debian: "
            f"apt-get install faketime; looked for {', '.join(FAKETIME_LIBS)})"
        )
    txn = args.workload == "txn"
    base = args.work or f"/tmp/straitmq-fault-runs{'-txn' if txn else ''}"
    runs: list[Run] = []
    started = time.monotonic()
    for kind in kinds:
        work = Path(base) / kind
        if (work / "cluster0").exists():  # its controllers would remember other brokers
            ap.error(f"{work} holds an earlier cluster: give a fresh --work")
        work.mkdir(parents=True, exist_ok=True)
        gen = cluster_factory(work)
        make = next(gen)
        disks = Disks(work / "cluster0", 3) if kind == "diskfull" else None  # make's folder
        lib = faketime_lib()
        clocks = None
        if kind in CLOCK_KINDS and lib:
            clocks = Clocks(work, lib, 3, 3, monotonic=kind == "clockmono")
        try:
            if disks is not None:
                disks.setup()
            c = make(
                brokers=3,
                netns=kind in NETWORK_KINDS,
                node_prefix=clocks.prefixes() if clocks is not None else None,
                broker_args=[*BROKER_ARGS, *TXN_BROKER_ARGS] if txn else None,
            )
            faults = Faults(c, disks, clocks)
            batch: list[Run] = []
            for i in range(args.runs):
                seed = args.seed * 1_000_003 + KINDS.index(kind) * 10_007 + i
                if txn:
                    r = one_txn_run(c, faults, kind, i, seed, work / "histories")
                else:
                    r = one_run(c, faults, kind, i, seed)
                runs.append(r)
                batch.append(r)
                if len(batch) == args.file_check_every or i == args.runs - 1:
                    file_check(c, batch)
                    batch = []
                print(
                    f"[{time.strftime('%H:%M:%S')}] {kind} #{i} seed={seed} victim={r.victim} "
                    f"hold={r.hold_s}s acked={r.acked} lost={r.lost} dup={r.duplicates} "
                    f"moved={r.moved} ooo={r.out_of_order} "
                    f"{txn_line(r) if txn else ''}files="
                    f"{'-' if r.replicas_identical is None else r.replicas_identical} "
                    f"{'' if r.fault_hits is None else f'storage_errors={r.fault_hits} '}"
                    f"{'' if r.jump_s is None else f'jump={r.jump_s:+d}s@{r.jumped} '}"
                    f"{'' if r.seen_jump_s is None else f'seen={r.seen_jump_s:+d}s '}"
                    f"{'' if r.victim_exit is None else f'victim_exit={r.victim_exit} '}"
                    f"{'OK' if r.ok() else 'BAD'} ({r.seconds}s)",
                    flush=True,
                )
                if args.json:  # after every run: a long batch stopped early keeps its runs
                    write_json(args.json, runs)
        finally:
            for _ in gen:  # the factory's teardown: stop, remove the namespaces
                pass
            if disks is not None:
                disks.teardown()
    rows = summarize(runs)
    print(table(rows))
    print(f"total {time.monotonic() - started:.0f}s")
    if args.json:
        write_json(args.json, runs)
    return 0 if all(not row["bad_runs"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
