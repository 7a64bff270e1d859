"""Where a StraitMQ broker's CPU goes on the TLS path (issue 31, item 1; not a pytest test).

    python -m bench.tls_profile [--protocol SSL] [--num-records 300000] [--python PYTHON]

Starts one broker (bench/security_throughput.py's three listeners and certificates),
produces --num-records x 1 KiB with librdkafka (acks=1, linger 5 ms, as that bench does)
and reads them back, each phase under `py-spy record --native` (run
`.venv/bin/pip install py-spy` first: a diagnostic, not a project dependency), and
sorts every busy sample (idle: waiting in epoll or on a lock) by its innermost frame:

  openssl       libssl / libcrypto: the ciphers, the record layer, the memory BIOs
  syscalls      read/write/pwritev/preadv...: the kernel's copies to and from sockets
                and files (on loopback the TCP delivery to the peer too)
  copies/alloc  libc's memcpy/memset/malloc
  and else by the innermost frame that names a part: uvloop ssl (its SSL protocol),
  framing (server.py), produce (validation, CRCs, appends), fetch, protocol (parsing,
  kio), uvloop io (the rest of the event loop)

syscalls and copies are also split by the part that called them ("copies/alloc in
uvloop ssl"). Prints the shares per phase and the broker's CPU seconds per GB.
--python runs the broker with another checkout's interpreter (its venv), to compare;
--keep DIR keeps py-spy's raw stacks; --top N lists the busiest innermost frames.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):  # allow `python bench/tls_profile.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka.admin import AdminClient, NewTopic

from bench.security_throughput import Strait, consume, make_certs, produce

SYSCALLS = ("read (", "write (", "pwritev", "preadv", "pread64", "sendfile", "writev", "recv")
# Python-level parts: the first frame from the innermost outwards that matches names it.
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("uvloop ssl", ("SSLProtocol", "sslproto", "SSLObject", "_ssl_", "_ssl.c")),
    ("framing", ("server.py",)),
    (
        "produce",
        ("produce.py", "partition_write.py", "records.py", "/storage/", "producer_state.py"),
    ),
    ("fetch", ("fetch.py", "fetch_sessions.py")),
    ("protocol", ("/protocol/", "kio/")),
    ("uvloop io", ("(loop.c", "UVStream", "uv__", "uvloop")),
]
ORDER = ["openssl", "syscalls", "copies/alloc", *(p for p, _ in PARTS), "other"]


def classify(stack: str) -> tuple[str, str]:
    """(part, where) of one sample (py-spy's raw format: frames ';'-separated, outermost
    first): OpenSSL's own code, a system call (the kernel's copy to or from a socket or
    file), libc's memcpy/memset/malloc (named after the Python-level part that called
    it), or the Python-level part of the innermost frame that names one. Samples
    waiting in epoll or on a lock (an idle worker thread) are "idle", left out."""
    frames = stack.split(";")
    inner = frames[-1] if frames else ""
    if "epoll_wait" in inner or "epoll_pwait" in inner or "PyThread_acquire_lock" in stack:
        return "idle", ""  # the loop waiting for events, a worker thread for work
    if "libcrypto" in inner or "libssl" in inner:
        return "openssl", ""
    if any(inner.startswith(c) for c in SYSCALLS):
        part = "syscalls"
    elif "libc.so" in inner or inner.startswith(("malloc", "free", "brk", "memcpy", "memset")):
        part = "copies/alloc"
    else:
        part = ""
    for frame in reversed(frames):
        for name, marks in PARTS:
            if any(m in frame for m in marks):
                return (part or name), (name if part else "")
    return (part or "other"), ""


def shares(raw: str) -> dict[str, float]:
    """{part: share of the busy samples} from py-spy's raw output ("stack count" lines);
    the copies and system calls also by the part that made them ("syscalls in framing")."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            part, where = classify(stack)
            if part == "idle":
                continue
            counts[part] += int(n)
            if where:
                counts[f"  {part} in {where}"] += int(n)
    total = sum(v for k, v in counts.items() if not k.startswith(" ")) or 1
    return {k: v / total for k, v in counts.items()}


def top_frames(raw: str, n: int = 12) -> list[tuple[str, float]]:
    """The innermost frames that take the most samples, with their share."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, k = line.rpartition(" ")
        if stack and k.isdigit():
            counts[stack.split(";")[-1]] += int(k)
    total = sum(counts.values()) or 1
    return [(frame, c / total) for frame, c in counts.most_common(n)]


def profile(pid: int, out: Path) -> subprocess.Popen:
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    return subprocess.Popen(
        [
            *(pyspy, "record", "--native", "--rate", "100", "--format", "raw"),
            *("-o", str(out), "--pid", str(pid)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--protocol", default="SSL", help="PLAINTEXT, SSL or SASL_SSL")
    ap.add_argument("--num-records", type=int, default=300_000)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--python", default=sys.executable, help="the broker's interpreter")
    ap.add_argument("--top", type=int, default=0, help="also list the N busiest frames")
    ap.add_argument("--keep", type=Path, default=None, help="copy py-spy's raw output here")
    a = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tls-profile-"))
    ca, pem = make_certs(work / "certs")
    (work / "broker").mkdir()
    s = Strait(work / "broker", ca, pem)
    s.python = a.python  # (setting sys.executable, as this did before, changed nothing)
    s.start()
    try:
        s.add_scram_user()
        conf = s.conf(a.protocol)
        topic = f"prof-{uuid.uuid4().hex[:6]}"
        admin = AdminClient(s.conf("PLAINTEXT"))  # kept: its futures die with it
        admin.create_topics([NewTopic(topic, a.partitions, 1)])[topic].result(30)
        produce(conf, topic, 20_000, a.record_size, 120)  # warm-up, then the measured run
        for phase in ("produce", "consume"):
            out = work / f"{phase}.txt"
            spy = profile(s.broker_pids()[0], out)
            time.sleep(1.0)  # py-spy attached before the load starts
            cpu0 = s.cpu_s()
            if phase == "produce":
                dt = produce(conf, topic, a.num_records, a.record_size, 600)
            else:
                dt = consume(conf, topic, a.partitions, a.num_records + 20_000, 600)
            n = a.num_records + (20_000 if phase == "consume" else 0)  # the warm-up's too
            cpu = (s.cpu_s() - cpu0) / (n * a.record_size / 1e9)
            spy.send_signal(2)
            spy.wait(60)
            parts = shares(out.read_text()) if out.exists() else {}
            if a.keep is not None and out.exists():
                a.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(out, a.keep / f"{a.protocol}-{phase}.txt")
            print(f"{a.protocol} {phase}: {dt:.1f}s, broker CPU {cpu:.2f} s/GB")
            for part in ORDER:
                print(f"  {part:34} {parts.get(part, 0.0):6.1%}")
                for sub in sorted(k for k in parts if k.startswith(f"  {part} in ")):
                    print(f"  {sub:34} {parts[sub]:6.1%}")
            if a.top and out.exists():
                print("  innermost frames:")
                for frame, share in top_frames(out.read_text(), a.top):
                    print(f"    {share:6.1%}  {frame[:150]}")
    finally:
        s.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
