"""The floor of TLS receive cost on this machine, without a broker (issue 31, item 1: the
event loop's TLS layer against the alternatives; not a pytest test).

    python -m bench.tls_floor [--mb 512] [--rounds 3]

One TLS 1.3 connection over loopback (a throwaway EC P-256 certificate, AES-256-GCM as
negotiated), a sender streaming --mb MB in 1 MiB writes, and the receiving side's CPU
seconds per GB (10^9 bytes) for:

  openssl speed   `openssl speed -evp aes-256-gcm` on 16 KiB blocks: the cipher alone
  plain           recv_into a 1 MiB buffer, no TLS (a thread; its own CPU clock)
  memory BIO      recv_into a 256 KiB buffer, into an ssl.MemoryBIO, SSLObject.read into
                  a 1 MiB buffer: what an event loop's TLS layer does, in its leanest form
  SSLSocket       ssl.SSLSocket.recv_into a 1 MiB buffer: OpenSSL reading the socket
                  itself (no memory BIOs): what a native TLS transport would do
  uvloop TLS      uvloop's create_server(ssl=...) with an asyncio.BufferedProtocol whose
                  buffer is --buffers sizes (1 MiB and 8 KiB by default: a large frame's
                  buffer and the TLS connection's scratch buffer), in a process of its
                  own (its whole CPU counted); and the same without TLS

Rounds alternate the kinds; the table shows each kind's rounds and their minimum.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):  # allow `python bench/tls_floor.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.security_throughput import make_certs

MB = 1 << 20


def contexts(ca: Path, pem: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(pem))
    client = ssl.create_default_context(cafile=str(ca))
    return server, client


def send(sock: socket.socket, total: int, client: ssl.SSLContext | None) -> socket.socket:
    """Stream `total` bytes; returns the (TLS) socket, still open."""
    out: socket.socket = client.wrap_socket(sock, server_hostname="127.0.0.1") if client else sock
    data = os.urandom(MB)
    for _ in range(total // MB):
        out.sendall(data)
    return out


def recv_plain(sock: socket.socket, total: int, _: ssl.SSLContext) -> int:
    """Read `total` bytes into a ring of MB (a TLS socket the same way)."""
    view = memoryview(bytearray(MB))
    got = off = 0
    while got < total:
        n = sock.recv_into(view[off:], MB - off)
        if not n:
            break
        got, off = got + n, (off + n) % MB
    return got


def recv_bio(sock: socket.socket, total: int, server: ssl.SSLContext) -> int:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = server.wrap_bio(incoming, outgoing, server_side=True)
    raw = memoryview(bytearray(256 * 1024))
    while True:  # the handshake
        try:
            obj.do_handshake()
            break
        except ssl.SSLWantReadError:
            if pending := outgoing.read():
                sock.sendall(pending)
            incoming.write(raw[: sock.recv_into(raw)])
    if pending := outgoing.read():
        sock.sendall(pending)
    view = memoryview(bytearray(MB))
    got = off = 0
    while got < total:
        n = sock.recv_into(raw)
        if not n:
            break
        incoming.write(raw[:n])
        while True:
            try:
                k = obj.read(MB - off, view[off:])
            except ssl.SSLWantReadError:
                break
            if not k:
                break
            got, off = got + k, (off + k) % MB
    return got


def recv_sslsocket(sock: socket.socket, total: int, server: ssl.SSLContext) -> int:
    return recv_plain(server.wrap_socket(sock, server_side=True), total, server)


def threaded(kind: str, total: int, server: ssl.SSLContext, client: ssl.SSLContext) -> float:
    """Receiver in this thread (its CPU clock), sender in another."""
    a, b = socket.socketpair()
    tls = kind != "plain"
    sender = threading.Thread(target=lambda: send(b, total, client if tls else None).close())
    sender.start()
    recv = {"plain": recv_plain, "memory BIO": recv_bio, "SSLSocket": recv_sslsocket}[kind]
    t0 = time.thread_time()
    got = recv(a, total, server)
    cpu = time.thread_time() - t0
    sender.join()
    a.close()
    return cpu / (got / 1e9)


UVLOOP_SERVER = r"""
import asyncio, resource, ssl, sys, uvloop
total, size, pem = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

class Sink(asyncio.BufferedProtocol):
    def __init__(self, done):
        self.view, self.done = memoryview(bytearray(size)), done
        self.off, self.got, self.t0 = 0, 0, None
    def get_buffer(self, hint):
        return self.view[self.off:]
    def buffer_updated(self, n):
        if self.t0 is None:
            self.t0 = cpu()
        self.got += n
        self.off = (self.off + n) % size
        if self.got >= total and not self.done.done():
            self.done.set_result((cpu() - self.t0) / (self.got / 1e9))

async def main():
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    ctx = None
    if pem != "-":
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(pem)
    srv = await loop.create_server(lambda: Sink(done), "127.0.0.1", 0, ssl=ctx)
    print(srv.sockets[0].getsockname()[1], flush=True)
    print(f"{await done:.4f}", flush=True)

uvloop.run(main())
"""


def uvloop_run(tls: bool, size: int, total: int, pem: Path, client: ssl.SSLContext) -> float:
    proc = subprocess.Popen(
        [sys.executable, "-c", UVLOOP_SERVER, str(total), str(size), str(pem) if tls else "-"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        # Open until the server has it all: uvloop's TLS drops what it has not decrypted
        # yet when the peer closes without a close_notify.
        out = send(socket.create_connection(("127.0.0.1", port)), total, client if tls else None)
        try:
            return float(proc.stdout.readline())
        finally:
            out.close()
    finally:
        proc.kill()
        proc.wait()


def openssl_speed() -> float | None:
    """AES-256-GCM on 16 KiB blocks, seconds per GB (None if openssl is missing)."""
    try:
        out = subprocess.run(
            ["openssl", "speed", "-seconds", "2", "-bytes", "16384", "-evp", "aes-256-gcm"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"AES-256-GCM\s+([\d.]+)k", out)
    return 1e9 / (float(m.group(1)) * 1000) if m else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=512, help="MB per measurement")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--buffers", default=f"{MB},8192", help="uvloop BufferedProtocol sizes")
    a = ap.parse_args(argv)
    total = a.mb * MB
    with tempfile.TemporaryDirectory(prefix="tls-floor-") as d:
        ca, pem = make_certs(Path(d))
        server, client = contexts(ca, pem)
        sizes = [int(s) for s in a.buffers.split(",") if s]
        kinds = ["plain", "memory BIO", "SSLSocket"]
        kinds += [f"uvloop plain {s}" for s in sizes] + [f"uvloop TLS {s}" for s in sizes]
        results: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(a.rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                if kind.startswith("uvloop"):
                    _, proto, size = kind.split()
                    v = uvloop_run(proto == "TLS", int(size), total, pem, client)
                else:
                    v = threaded(kind, total, server, client)
                results[kind].append(v)
                print(
                    f"[{time.strftime('%H:%M:%S')}] round {r + 1} {kind}: {v:.3f} s/GB",
                    file=sys.stderr,
                )
    speed = openssl_speed()
    print("| receiving side | CPU s/GB per round | min |")
    print("|---|---|---:|")
    if speed is not None:
        print(f"| openssl speed, AES-256-GCM, 16 KiB | - | {speed:.3f} |")
    for kind, vals in results.items():
        label = kind.replace(f" {MB}", " (1 MiB buffer)").replace(" 8192", " (8 KiB buffer)")
        print(f"| {label} | {' '.join(f'{v:.3f}' for v in vals)} | {min(vals):.3f} |")
    load = os.getloadavg()
    print(f"\nload average {load[0]:.1f} {load[1]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
