"""A local StraitMQ cluster of separate processes: controllers and brokers.

Used by `strait up` (in the foreground), by the fault tests and by the benchmarks.
Each process has its own data folder under `data_dir` and its own log file; broker
`i` (1-based) listens for Kafka on `kafka_base + i - 1` and HTTP on `http_base + i - 1`,
controller `1000 + j` on `controller_base + j - 1`.

Every node binds 127.0.0.1 unless told otherwise: `node_hosts` maps a node name
("broker-1", "controller-1001") to the address it binds and advertises, and `node_prefix`
to a command prefix (e.g. `["ip", "netns", "exec", "ns1"]` to run it in a network
namespace, as the network partition tests do).
"""

from __future__ import annotations

import collections
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field

from straitmq.admin_client import AdminError, request_sync

CONTROLLER_ID_BASE = 1000


def port_range() -> tuple[int, int]:
    """The ports [low, high) free_port picks from: STRAITMQ_PORT_RANGE ("low-high"), which
    gives each parallel test worker a slice of its own, else 20,000 up to the kernel's
    ephemeral range."""
    spec = os.environ.get("STRAITMQ_PORT_RANGE")
    if spec:
        low, _, high = spec.partition("-")
        return int(low), int(high)
    return 20_000, _ephemeral_low()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_handed_out: set[int] = set()
_handed_order: collections.deque[int] = collections.deque()
_REMEMBERED = 2000  # long bound or given up on by then; the range holds ~12,000


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago, picked below the kernel's ephemeral range: a
    port the kernel hands out (port 0) can be taken by any outgoing connection's source
    port before the server that was meant to get it binds. Never one this process was
    given before: ports picked up front (a cluster's, then its listeners') are not bound
    until later, so a second pick could otherwise land on the first."""
    return free_port_run(1, host)


def free_port_run(n: int, host: str = "127.0.0.1") -> int:
    """The first of n consecutive ports, each as free_port gives one (all n are handed
    out: a later pick landing on the second of them took a controller's port once)."""
    low, high = port_range()
    own_range = high - low > 1_000
    if n > 1 and not own_range:
        raise OSError(f"a run of ports needs a range of our own, not [{low}, {high})")
    for _ in range(200):
        if own_range:
            base = random.randrange(low, high - n + 1)
            run = list(range(base, base + n))
            if any(p in _handed_out for p in run) or not all(_bindable(host, p) for p in run):
                continue
        else:  # the kernel's pick
            with socket.socket() as s:
                s.bind((host, 0))
                run = [s.getsockname()[1]]
            if run[0] in _handed_out:
                continue
        for p in run:
            _handed_out.add(p)
            _handed_order.append(p)
        while len(_handed_order) > _REMEMBERED:
            _handed_out.discard(_handed_order.popleft())
        return run[0]
    raise OSError(f"no run of {n} free ports found on {host}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class Node:
    kind: str  # "broker" | "controller"
    node_id: int
    args: list[str]
    log_path: str
    http_port: int
    kafka_port: int = 0
    proc: subprocess.Popen | None = None
    stopped: bool = field(default=False)
    host: str = "127.0.0.1"
    prefix: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.node_id}"

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*self.prefix, *self.args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.stopped = False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 40.0) -> None:
        if self.proc is None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stopped = True

    def kill9(self) -> None:
        if self.proc is not None:
            self.signal(signal.SIGKILL)
            self.proc.wait()
        self.stopped = True

    def get(self, path: str, timeout: float = 2.0) -> dict | None:
        """The node's JSON answer to GET `path`, or None if it refuses or is not up."""
        try:
            return request_sync(
                f"http://{self.host}:{self.http_port}", "GET", path, timeout_s=timeout
            )
        except AdminError:
            return None


class LocalCluster:
    def __init__(
        self,
        data_dir: str,
        controllers: int = 3,
        brokers: int = 3,
        kafka_base: int | None = 9092,
        http_base: int | None = 8080,
        controller_base: int | None = 9191,
        broker_args: list[str] | None = None,
        controller_args: list[str] | None = None,
        log_level: str = "warning",
        python: str = sys.executable,
        node_hosts: dict[str, str] | None = None,
        node_prefix: dict[str, list[str]] | None = None,
        first_controller_id: int = CONTROLLER_ID_BASE + 1,
    ) -> None:
        self.data_dir = os.path.abspath(data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        self.cluster_id = self._cluster_id()
        self.python = python
        self.log_level = log_level
        self.broker_args = broker_args or []
        self.controller_args = controller_args or []
        self.controllers: dict[int, Node] = {}
        self.brokers: dict[int, Node] = {}
        self.node_hosts = node_hosts or {}
        self.node_prefix = node_prefix or {}
        chosts = [
            self.node_hosts.get(f"controller-{first_controller_id + j}", "127.0.0.1")
            for j in range(controllers)
        ]
        cports = [
            controller_base + j if controller_base else free_port() for j in range(controllers)
        ]
        self.voters = ",".join(
            f"{first_controller_id + j}@{chosts[j]}:{cports[j]}" for j in range(controllers)
        )
        for j in range(controllers):
            cid = first_controller_id + j
            self.controllers[cid] = Node(
                "controller",
                cid,
                self._controller_cmd(cid),
                os.path.join(self.data_dir, f"controller-{cid}.log"),
                cports[j],
                host=chosts[j],
                prefix=list(self.node_prefix.get(f"controller-{cid}", [])),
            )
        for i in range(1, brokers + 1):
            self.add_broker(
                i,
                kafka_base + i - 1 if kafka_base else free_port(),
                http_base + i - 1 if http_base else free_port(),
            )

    def _cluster_id(self) -> str:
        path = os.path.join(self.data_dir, "cluster-id")
        if os.path.exists(path):
            with open(path) as f:
                return f.read().strip()
        cid = uuid.uuid4().hex[:22]
        with open(path, "w") as f:
            f.write(cid)
        return cid

    def _controller_cmd(self, cid: int) -> list[str]:
        return [
            self.python,
            "-m",
            "straitmq.controller",
            "--node-id",
            str(cid),
            "--voters",
            self.voters,
            "--cluster-id",
            self.cluster_id,
            "--data-dir",
            os.path.join(self.data_dir, f"controller-{cid}"),
            "--log-level",
            self.log_level,
            *self.controller_args,
        ]

    def add_broker(
        self, bid: int, kafka_port: int, http_port: int, rack: str | None = None
    ) -> Node:
        host = self.node_hosts.get(f"broker-{bid}", "127.0.0.1")
        args = [
            self.python,
            "-m",
            "straitmq.broker",
            "--node-id",
            str(bid),
            "--cluster-id",
            self.cluster_id,
            "--controllers",
            self.voters,
            "--data-dir",
            os.path.join(self.data_dir, f"broker-{bid}"),
            "--listen",
            f"{host}:{kafka_port}",
            "--http",
            f"{host}:{http_port}",
            "--log-level",
            self.log_level,
            *(["--rack", rack] if rack else []),
            *self.broker_args,
        ]
        node = Node(
            "broker",
            bid,
            args,
            os.path.join(self.data_dir, f"broker-{bid}.log"),
            http_port,
            kafka_port,
            host=host,
            prefix=list(self.node_prefix.get(f"broker-{bid}", [])),
        )
        self.brokers[bid] = node
        return node

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{b.host}:{b.kafka_port}" for b in self.brokers.values())

    def nodes(self) -> list[Node]:
        return [*self.controllers.values(), *self.brokers.values()]

    def start(self, wait_s: float = 60.0) -> None:
        for n in self.controllers.values():
            n.start()
        for n in self.brokers.values():
            n.start()
        self.wait_ready(wait_s)

    def wait_ready(self, wait_s: float = 60.0, brokers: list[int] | None = None) -> None:
        deadline = time.monotonic() + wait_s
        want = (
            brokers
            if brokers is not None
            else [b for b, n in self.brokers.items() if not n.stopped]
        )
        while time.monotonic() < deadline:
            for n in self.nodes():
                if not n.stopped and n.proc is not None and n.proc.poll() is not None:
                    raise RuntimeError(f"{n.name} exited with {n.proc.returncode}: {self.tail(n)}")
            if all(self.brokers[b].get("/readyz", 1.0) for b in want):
                return
            time.sleep(0.1)
        raise TimeoutError(f"brokers {want} not ready after {wait_s}s")

    def tail(self, n: Node, size: int = 1500) -> str:
        try:
            with open(n.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - size))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def quorum(self) -> dict | None:
        for n in self.controllers.values():
            if n.alive():
                st = n.get("/api/v1/quorum")
                if st and st.get("leader_id") is not None:
                    return st
        return None

    def active_controller(self) -> Node | None:
        for n in self.controllers.values():
            if n.alive():
                st = n.get("/api/v1/quorum")
                if st and st.get("active_controller"):
                    return n
        return None

    def any_broker(self) -> Node:
        for n in self.brokers.values():
            if n.alive() and n.get("/readyz", 1.0):
                return n
        raise RuntimeError("no broker is ready")

    # -- rolling a node onto another release (upgrades, rollbacks) -------------------------

    def run_as(self, node: Node, python: str) -> None:
        """Run `node` with another release's interpreter from its next start. `-P`: the
        working directory (a checkout) must not shadow that release's installed packages."""
        rest = node.args[1:]
        if rest and rest[0] == "-P":
            rest = rest[1:]
        node.args = [python, "-P", *rest]

    def roll_order(self, backwards: bool = False) -> list[Node]:
        """An upgrade's order: controllers first (followers, then the active one), then
        brokers; a rollback the other way round."""
        active = self.active_controller()
        controllers = sorted(self.controllers.values(), key=lambda n: n is active)
        brokers = list(self.brokers.values())
        return [*brokers[::-1], *controllers] if backwards else [*controllers, *brokers]

    def roll(self, node: Node, python: str, wait_s: float = 60.0) -> None:
        """Restart one node on `python`'s release and return once it is back in service:
        a controller caught up with the quorum's leader, a broker ready with no partition
        under-replicated (the gate of every roll: one node at a time, never below min ISR)."""
        node.stop()
        self.run_as(node, python)
        node.start()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if node.proc is not None and node.proc.poll() is not None:
                raise RuntimeError(
                    f"{node.name} exited with {node.proc.returncode}: {self.tail(node)}"
                )
            if self._back_in_service(node):
                return
            time.sleep(0.2)
        raise TimeoutError(f"{node.name} not back in service after {wait_s}s: {self.tail(node)}")

    def _back_in_service(self, node: Node) -> bool:
        try:
            b = self.any_broker()
        except RuntimeError:
            return False
        if node.kind == "controller":
            q = b.get("/api/v1/quorum")  # every voter's status and lag, as the leader sees it
            me = next(
                (v for v in (q or {}).get("voters", []) if v["node_id"] == node.node_id), None
            )
            return bool(me and me.get("reachable") and me.get("lag") == 0) and (
                self.active_controller() is not None
            )
        if node.get("/readyz", 1.0) is None:
            return False
        c = b.get("/api/v1/cluster") or {}
        return c.get("under_replicated_partitions") == 0 and c.get("offline_partitions") == 0

    def stop(self) -> None:
        """Brokers first (a controlled shutdown needs the controllers), then controllers;
        if anything fails on the way, whatever is still alive is killed."""
        try:
            for n in self.brokers.values():
                n.signal(signal.SIGCONT)
                n.signal(signal.SIGTERM)
            for n in self.brokers.values():
                n.stop()
            for n in self.controllers.values():
                n.stop()
        finally:
            for n in self.nodes():
                if n.alive():
                    n.kill9()
