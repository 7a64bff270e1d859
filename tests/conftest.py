"""Shared fixtures: real broker processes on free loopback ports with throwaway data dirs."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from crc32c import crc32c

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _worker_port_slice() -> None:
    """Under pytest-xdist each worker picks free ports from a slice of its own (inherited
    by the processes it starts): two workers picking the same port before either binds it
    would fail one test at random."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker.startswith("gw") or count < 2:
        return
    from straitmq.cli.local_cluster import port_range

    low, high = port_range()
    width = (high - low) // count
    start = low + int(worker[2:]) * width
    os.environ["STRAITMQ_PORT_RANGE"] = f"{start}-{start + width}"


_worker_port_slice()

from straitmq.broker.record_codec import build_batch  # noqa: E402
from straitmq.cli.local_cluster import free_port  # noqa: E402

from straitmq import invariants  # noqa: E402
from straitmq.admin_client import AdminError, exchange_sync, request_sync  # noqa: E402


def record_batch(
    values: list[bytes],
    producer: tuple[int, int, int] | None = None,
    timestamp_ms: int | None = None,
) -> bytes:
    """A v2 record batch; with (producer id, epoch, base sequence) patched in and the CRC
    (which covers bytes 21..end) recomputed."""
    ts = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    data = bytearray(build_batch([(None, v, []) for v in values], ts))
    if producer is not None:
        pid, epoch, seq = producer
        struct.pack_into(">qhi", data, 43, pid, epoch, seq)
        struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    return bytes(data)


@dataclass
class BrokerProcess:
    data_dir: Path
    port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    fd_limit: int | None = None  # RLIMIT_NOFILE for the process (ulimit -n)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def launch(self) -> BrokerProcess:
        """Start the process and return at once (the startup tests race it)."""
        self.log_path = self.data_dir.parent / f"broker-{self.port}.log"
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "straitmq.broker",
                "--data-dir",
                str(self.data_dir),
                "--listen",
                self.bootstrap,
                "--http",
                f"127.0.0.1:{self.http_port}",
                "--group-initial-rebalance-delay-ms",
                "0",
                "--log-level",
                "info",
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            preexec_fn=None if self.fd_limit is None else self._limit_fds,
        )
        log.close()
        return self

    def _limit_fds(self) -> None:
        import resource

        assert self.fd_limit is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.fd_limit, self.fd_limit))

    # Waits on /readyz: generous, as a broker's start on a loaded CI machine took over 20 s.
    def start(self, timeout: float = 60.0) -> BrokerProcess:
        self.launch()
        assert self.proc is not None and self.log_path is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited: {self.log_path.read_text()[-3000:]}")
            try:
                if exchange_sync(self.http, "GET", "/readyz", timeout_s=1)[0] == 200:
                    return self
            except AdminError:  # not listening yet
                pass
            time.sleep(0.1)
        raise RuntimeError("broker did not become ready")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create a topic through the HTTP admin API."""
        request_sync(self.http, "POST", "/api/v1/topics", {"name": name, "partitions": partitions})

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator:
    started: list[BrokerProcess] = []

    def make(*extra: str) -> BrokerProcess:
        b = BrokerProcess(tmp_path / f"data{len(started)}", extra_args=list(extra))
        started.append(b)
        return b.start()

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def broker(broker_factory) -> BrokerProcess:
    return broker_factory()


@pytest.fixture(autouse=True)
def invariants_raise() -> Iterator[None]:
    """In the test process a broken invariant (straitmq.invariants) raises where it broke
    instead of ending the whole pytest run; one that an except clause swallowed (a
    handler of an in-process broker) still fails the test here. Product processes that
    tests start keep the default: the process stops."""
    with invariants.raising() as seen:
        yield
    assert not seen, f"invariants broken during the test: {seen}"


# --- Kubernetes control plane (tests/kube_support.py) -------------------------------------


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """A real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
    three kwok nodes in zone-a/b/c, 24 static 10Gi volumes) shared by the whole session.
    Missing binaries fail the test loudly; STRAITMQ_K8S_OPTIONAL=1 turns that into a skip."""
    from kube_support import KubeControlPlane, require_available

    require_available()
    cp = KubeControlPlane(tmp_path_factory.mktemp("kube"))
    try:
        yield cp.start()
    finally:
        cp.stop()


# --- running in parallel (pytest-xdist) --------------------------------------------------

# The unit of work is a module (its module fixtures are built once, its tests run in their
# order), except for the groups below: the modules sharing the session's Kubernetes
# control plane run on one worker, one after another, and so do the Spark modules. The
# real node (a machine-wide singleton, its own API server) is one module on another
# worker, beside them: one after the other they were the run's long pole.
_GROUP_OF_MODULE = {
    "test_helm_chart": "kubernetes",
    "test_kube_control_plane": "kubernetes",
    "test_operator_k8s": "kubernetes",
    "test_operator_pki": "kubernetes",
    "test_operator_ux": "kubernetes",
    "test_rack_from_node": "kubernetes",
    "test_real_node": "realnode",
    # Spark's JVMs and Python workers, one module at a time: several at once on two cores
    # made a Python worker miss Spark's connect-back timeout.
    "test_spark_source": "spark",
    "test_spark_pipeline": "spark",
    "test_spark_security": "spark",
    # Kafka Streams, Connect and MirrorMaker 2: several JVMs (an Apache Kafka broker among
    # them) next to three StraitMQ clusters; one module at a time keeps two cores and the
    # memory for the rest of the run.
    "test_streams_connect": "ecosystem",
    "test_mirrormaker2": "ecosystem",
    # Streams exactly_once_v2, the Java transactional clients and kafka-transactions.
    "test_transactions_java": "ecosystem",
    # The Java client tests too: next to the JVMs above, a group of two consumers missed
    # its heartbeats and ended mid-rebalance.
    "test_clients_java": "ecosystem",
}
# The longest units start first, so that none of them begins near the end of the run
# (test.sh passes --no-loadscope-reorder so xdist keeps this order).
_LONG_GROUPS = ["realnode", "kubernetes", "ecosystem", "spark", "test_security_tls_sasl"]


def _group(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return _GROUP_OF_MODULE.get(Path(module).stem, module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    # xdist's own loadgroup cannot be used: it renames nodeids, which pytest 9 ignores.
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return ModuleGroups(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        g = _group(item.nodeid)
        return _LONG_GROUPS.index(g) if g in _LONG_GROUPS else len(_LONG_GROUPS)

    items.sort(key=rank)  # stable: the order inside a module stays


# --- time budget per module (the README's "Time budgets" table) ----------------------------

_module_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # Setup, call and teardown of every test, summed per module (on the xdist controller,
    # from the workers' reports).
    module = report.nodeid.split("::", 1)[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def _budgets() -> dict[str, float]:
    budgets: dict[str, float] = {}
    in_table = False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("#"):
            in_table = line.strip() == "### Time budgets"
        elif in_table and line.startswith("| `tests/"):
            cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
            budgets[cells[0]] = float(cells[1])
    return budgets


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _module_seconds:
        return
    budgets = _budgets()
    tr = terminalreporter
    tr.section("seconds per module (setup + call + teardown; budgets: README, Time budgets)")
    for module, seconds in sorted(_module_seconds.items(), key=lambda kv: -kv[1]):
        budget = budgets.get(module)
        note = "" if budget is None else f"  budget {budget:.0f}"
        if budget is not None and seconds > budget:
            note += "  OVER BUDGET"
        elif budget is None:
            note = "  no budget: add one to the README"
        tr.write_line(f"{seconds:8.1f}  {module}{note}")
    total = sum(_module_seconds.values())
    tr.write_line(f"{total:8.1f}  all modules (summed: with workers the wall time is less)")
