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
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from cluster_support import (  # noqa: E402
    Cluster,
    Workload,
    cluster_factory,
    compare_replicas,
    consume_all,
    wait_for,
)

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

    def ok(self) -> bool:
        return (
            self.stalled is None
            and self.lost == self.duplicates == self.moved == self.out_of_order == 0
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
    hws: dict[int, dict[int, int]] = {}
    for r in runs:
        topic = f"{r.kind}-{r.run}"
        try:
            hws[r.run] = c.converge(topic, timeout=60)
        except TimeoutError:
            r.replicas_identical = False
            r.stalled = f"replicas never at one log end: {json.dumps(views(c, topic))}"
    c.stop()
    try:
        for r in runs:
            if r.run in hws:
                r.replicas_identical, r.divergent_offsets = compare_replicas(
                    c, f"{r.kind}-{r.run}", hws[r.run]
                )
    finally:
        c.start(wait_s=60)


def summarize(runs: list[Run]) -> list[dict[str, Any]]:
    rows = []
    for kind in dict.fromkeys(r.kind for r in runs):
        mine = [r for r in runs if r.kind == kind]
        rows.append(
            {
                "kind": kind,
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
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| fault | runs | acked | lost | duplicated | moved | out of order | divergent "
        "offsets | replicas differ | failed sends | stalled |"
    )
    out = [head, "|---|" + "---:|" * 10]
    for r in rows:
        out.append(
            f"| {r['kind']} | {r['runs']} | {r['acked']} | {r['lost']} | {r['duplicated']} | "
            f"{r['moved']} | {r['out_of_order']} | {r['divergent_offsets']} | "
            f"{r['replicas_not_identical']} | {r['failed_sends']} | {r['stalled']} |"
        )
    return "\n".join(out)


def write_json(path: str, runs: list[Run]) -> None:
    data = {"summary": summarize(runs), "runs": [asdict(r) for r in runs]}
    Path(path).write_text(json.dumps(data, indent=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--runs", type=int, default=100, help="faulted runs per kind")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--file-check-every", type=int, default=10)
    ap.add_argument("--work", default="/tmp/straitmq-fault-runs")
    ap.add_argument("--json", help="write every run and the summary here")
    args = ap.parse_args(argv)
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
    runs: list[Run] = []
    started = time.monotonic()
    for kind in kinds:
        work = Path(args.work) / kind
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
            )
            faults = Faults(c, disks, clocks)
            batch: list[Run] = []
            for i in range(args.runs):
                seed = args.seed * 1_000_003 + KINDS.index(kind) * 10_007 + i
                r = one_run(c, faults, kind, i, seed)
                runs.append(r)
                batch.append(r)
                if len(batch) == args.file_check_every or i == args.runs - 1:
                    file_check(c, batch)
                    batch = []
                print(
                    f"[{time.strftime('%H:%M:%S')}] {kind} #{i} seed={seed} victim={r.victim} "
                    f"hold={r.hold_s}s acked={r.acked} lost={r.lost} dup={r.duplicates} "
                    f"moved={r.moved} ooo={r.out_of_order} files="
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
