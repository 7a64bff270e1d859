"""A real Kubernetes control plane on this machine, for the operator's tests.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler run as plain processes
(no containers: there is no Docker here, so no kind); kwok plays the kubelets of three
fake nodes, so pods that the real scheduler binds to them become Running and Ready
without running anything. Binaries come from scripts/fetch-k8s.sh (.cache/k8s/bin).

Storage is statically provisioned: a default StorageClass `standard` with no provisioner
and hostPath PersistentVolumes under the work dir, which the real PV controller binds to
claims (StatefulSet volumeClaimTemplates included). Released volumes are handed back to
the pool by a small reclaimer thread, the job a local static provisioner does for real.

Run by hand: `scripts/kube-up.sh` (or `python tests/kube_support.py`).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script, tests/ is on sys.path but the repo is not
    sys.path.insert(0, str(ROOT))

from straitmq.cli.local_cluster import free_port  # noqa: E402
from waiting import wait_for  # noqa: E402

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

T = TypeVar("T")

BIN_DIR = Path(os.environ.get("STRAITMQ_K8S_BIN", str(ROOT / ".cache" / "k8s" / "bin")))
KWOK_STAGES = Path(__file__).resolve().parent / "k8s" / "kwok-stages.yaml"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "helm")
ZONES = ("zone-a", "zone-b", "zone-c")
SERVICE_CIDR = "10.96.0.0/16"
# The apiserver publishes this in the `kubernetes` Endpoints; it must not be loopback
# (endpoint validation rejects 127.0.0.0/8) and is never dialled: clients use 127.0.0.1.
ADVERTISE_ADDRESS = "10.255.255.1"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
ETCD_TMPFS_PREFIX = "straitmq-etcd-"


def available() -> str | None:
    """None when everything the control plane needs is installed, else why not."""
    missing = [b for b in BINARIES if not os.access(BIN_DIR / b, os.X_OK)]
    if missing:
        return (
            f"Kubernetes binaries missing from {BIN_DIR}: {', '.join(missing)} "
            "(build them with scripts/fetch-k8s.sh)"
        )
    for tool in ("kubectl", "openssl"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    if not KWOK_STAGES.is_file():
        return f"{KWOK_STAGES} is missing"
    return None


def require_available() -> None:
    """For tests: fail loudly when binaries are missing (CI must not skip silently), or
    skip when STRAITMQ_K8S_OPTIONAL=1."""
    import pytest

    reason = available()
    if reason:
        if os.environ.get("STRAITMQ_K8S_OPTIONAL") == "1":
            pytest.skip(reason)
        pytest.fail(f"{reason} (STRAITMQ_K8S_OPTIONAL=1 skips instead)", pytrace=False)


class ComponentDied(RuntimeError):
    """A control-plane process exited; the message carries the tail of its log."""


class KubeCommandError(subprocess.CalledProcessError):
    """A failed kubectl/helm call; unlike CalledProcessError, str() shows its output."""

    def __str__(self) -> str:
        out = (self.stderr or "").strip() or (self.output or "").strip()
        return f"{' '.join(map(str, self.cmd))} exited {self.returncode}: {out[-3000:]}"


@dataclass
class _Component:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, chars: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - chars))
                return f.read().decode(errors="replace")
        except OSError as e:
            return f"<no log: {e}>"


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL the child if the test process dies without calling stop()
    (strictly: if the thread that started it ends, so start from a long-lived thread)."""
    with contextlib.suppress(Exception):
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# Resolved before any fork: the preexec_fn must not have to look symbols up in the child.
try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _PRCTL = None


# A self-signed (CA) or CA-signed certificate request with a P-256 key: RSA key
# generation is slow on 2 cores.
_CERT_REQ = (
    "req",
    "-x509",
    "-new",
    "-config",
    "openssl.cnf",
    "-days",
    "3650",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
)


class KubeControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok, all on
    127.0.0.1 with free ports, logging to files under `work_dir`.

    `start()` blocks until the API is ready, every node is Ready and schedulable, every
    PersistentVolume is Available and `default/default` ServiceAccount exists. `stop()`
    kills everything; it is idempotent and also registered with atexit."""

    def __init__(
        self,
        work_dir: Path | str,
        *,
        nodes: int = 3,
        volumes: int = 24,
        volume_size: str = "10Gi",
        bin_dir: Path | str = BIN_DIR,
        etcd_on_tmpfs: bool = True,
    ) -> None:
        self.work_dir = Path(work_dir).resolve()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.bin_dir = Path(bin_dir)
        self.node_names = [f"kwok-node-{i}" for i in range(nodes)]
        self.volume_names = [f"pv-{i:03d}" for i in range(volumes)]
        self.volume_size = volume_size
        self.pki = self.work_dir / "pki"
        self.kubeconfig = str(self.work_dir / "kubeconfig")
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.apiserver_port = free_port()
        self.server = f"https://127.0.0.1:{self.apiserver_port}"
        self.startup_seconds: float | None = None
        self.timings: dict[str, float] = {}
        self.env: dict[str, str] = {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            # helm keeps repos/plugins/cache per user; keep the tests' away from ~/.
            "HELM_CACHE_HOME": str(self.work_dir / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(self.work_dir / "helm" / "config"),
            "HELM_DATA_HOME": str(self.work_dir / "helm" / "data"),
        }
        self._components: list[_Component] = []
        self.etcd_on_tmpfs = etcd_on_tmpfs
        self._etcd_data: Path | None = None
        self._etcd_tmpfs: Path | None = None
        self._stop_event = threading.Event()
        self._reclaimer: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 120.0) -> KubeControlPlane:
        reason = available()
        if reason:
            raise RuntimeError(reason)
        atexit.register(self.stop)
        t0 = time.monotonic()
        deadline = t0 + timeout

        def mark(step: str) -> None:
            self.timings[step] = round(time.monotonic() - t0, 2)

        try:
            self._make_pki()
            mark("pki")
            self._start_etcd()
            self._wait_until(deadline, "etcd /health", self._etcd_healthy)
            mark("etcd")
            self._start_apiserver()
            self._wait_until(deadline, "kube-apiserver /readyz", self._apiserver_ready)
            mark("apiserver")
            # All three start together and the nodes are created at once: kwok marks
            # them Ready when its informers sync, node-lifecycle then lifts the taint.
            self._start_kwok()
            self._start_controller_manager()
            self._start_scheduler()
            self._create_cluster_objects()
            mark("objects")
            from kubernetes import client

            with self.api_client() as api:
                core = client.CoreV1Api(api)
                self._wait_until(
                    deadline, "nodes Ready and untainted", lambda: self._nodes_ready(core)
                )
                mark("nodes")
                self._wait_until(
                    deadline, "PersistentVolumes Available", lambda: self._volumes_available(core)
                )
                self._wait_until(
                    deadline,
                    "ServiceAccount default/default",
                    lambda: core.read_namespaced_service_account("default", "default"),
                )
                mark("serviceaccount")
            self._start_reclaimer()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = round(time.monotonic() - t0, 2)
        return self

    def stop(self) -> None:
        """Kill every component (process groups, SIGTERM then SIGKILL). Safe to repeat."""
        with self._lock:
            components, self._components = self._components, []
            self._stop_event.set()
        if self._reclaimer is not None:
            self._reclaimer.join(timeout=10)
            self._reclaimer = None
        # In three waves: the apiserver's shutdown blocks for seconds retrying etcd if
        # etcd is already gone, and the clients only log noise if the apiserver is.
        wave = {"kube-apiserver": 1, "etcd": 2}
        for rank in (0, 1, 2):
            _terminate([c for c in components if wave.get(c.name, 0) == rank])
        if self._etcd_tmpfs is not None:  # tmpfs is RAM; a work_dir data dir can stay
            shutil.rmtree(self._etcd_tmpfs, ignore_errors=True)
            self._etcd_tmpfs = None
        atexit.unregister(self.stop)

    def __enter__(self) -> KubeControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_alive(self) -> None:
        """Raise ComponentDied, with its log tail, if any component has exited."""
        for c in list(self._components):
            rc = c.proc.poll()
            if rc is not None:
                raise ComponentDied(
                    f"{c.name} exited with code {rc}; last lines of {c.log_path}:\n{c.log_tail()}"
                )

    def log_path(self, component: str) -> Path:
        return self.work_dir / "logs" / f"{component}.log"

    # ------------------------------------------------------------------ helpers for tests

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        return self._run(["kubectl", *args], input, check, timeout)

    def helm(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 180
    ) -> subprocess.CompletedProcess[str]:
        return self._run([str(self.bin_dir / "helm"), *args], input, check, timeout)

    def api_client(self) -> ApiClient:
        """A new admin ApiClient (close it, or use it as a context manager)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig)

    def service_account_kubeconfig(self, ns: str, sa: str, path: Path) -> Path:
        """A kubeconfig that authenticates as the ServiceAccount (a bound token), so whatever
        runs with it has exactly that account's RBAC."""
        token = self.kubectl("create", "token", sa, "-n", ns, "--duration=1h").stdout.strip()
        cluster = json.loads(Path(self.kubeconfig).read_text())["clusters"][0]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cluster],
            "users": [{"name": sa, "user": {"token": token}}],
            "contexts": [{"name": sa, "context": {"cluster": cluster["name"], "user": sa}}],
            "current-context": sa,
        }
        path.write_text(json.dumps(config))  # JSON is YAML
        return path

    def wait_for(
        self,
        predicate: Callable[[], T],
        timeout: float,
        what: str,
        interval: float = 0.25,
        namespace: str | None = None,
    ) -> T:
        """Poll `predicate` until it returns something truthy and return that. Exceptions
        count as "not yet" (the last one is reported on timeout); a dead component fails
        at once rather than after the timeout. With `namespace`, a timeout reports the
        state of its pods, claims and events and of the volume pool."""
        detail = (lambda: self.describe_state(namespace)) if namespace else None
        return wait_for(
            predicate,
            timeout,
            what,
            interval,
            check=self.check_alive,
            detail=detail,
            ignore=(Exception,),
        )

    def describe_state(self, namespace: str) -> str:
        """What a person would look at when pods do not come up: the namespace's
        workloads, pods, claims and events, and the cluster's volumes."""
        parts = []
        for args in (
            ("get", "statefulsets,pods,pvc", "-n", namespace, "-o", "wide"),
            ("get", "events", "-n", namespace, "--sort-by=.lastTimestamp"),
            ("get", "pv", "-o", "wide"),
        ):
            out = self.kubectl(*args, check=False)
            parts.append(f"$ kubectl {' '.join(args)}\n{out.stdout}{out.stderr}")
        return "\n".join(parts)

    def create_namespace(self, name: str, timeout: float = 30) -> str:
        """Create a namespace and wait for its `default` ServiceAccount, without which the
        ServiceAccount admission plugin rejects pods."""
        self.kubectl("create", "namespace", name)
        self.wait_for(
            lambda: (
                self.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode
                == 0
            ),
            timeout,
            f"ServiceAccount {name}/default",
        )
        return name

    # ------------------------------------------------------------------ internals

    def _run(
        self, cmd: list[str], input: str | None, check: bool, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            cmd,
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.work_dir,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            raise KubeCommandError(proc.returncode, cmd, proc.stdout, proc.stderr)
        return proc

    def _wait_until(
        self,
        deadline: float,
        what: str,
        predicate: Callable[[], T],
        interval: float = 0.25,
    ) -> T:
        """`wait_for` up to a deadline shared by several waits (the start-up steps)."""
        return self.wait_for(predicate, max(0.0, deadline - time.monotonic()), what, interval)

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        log_path = self.log_path(name)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.work_dir,
                env=env or self.env,
                start_new_session=True,  # own process group, so stop() can kill it whole
                preexec_fn=_die_with_parent if _PRCTL is not None else None,
            )
        with self._lock:
            self._components.append(_Component(name, proc, log_path))

    def _openssl(self, *args: str) -> None:
        subprocess.run(
            ["openssl", *args],
            cwd=self.pki,
            check=True,
            capture_output=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )

    def _issue_cert(self, name: str, extensions: str, subject: str) -> None:
        """`<name>.key` and `<name>.crt` signed by the test CA, with the `[server]` or
        `[client]` extensions of openssl.cnf."""
        self._openssl(
            *_CERT_REQ,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-extensions",
            extensions,
            "-subj",
            subject,
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.crt",
        )

    def _make_pki(self) -> None:
        """A CA, the apiserver's serving cert, client certs (admin in system:masters, the
        controller-manager and scheduler with their bootstrap-RBAC identities) and the
        service-account signing key. P-256 keys: RSA generation is slow on 2 cores."""
        self.pki.mkdir(parents=True, exist_ok=True)
        sans = ",".join(
            [
                "IP:127.0.0.1",
                "IP:10.96.0.1",
                "DNS:localhost",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local",
            ]
        )
        (self.pki / "openssl.cnf").write_text(
            "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\n"
            "[ca]\nbasicConstraints = critical,CA:TRUE\n"
            "keyUsage = critical,keyCertSign,cRLSign,digitalSignature\n"
            "subjectKeyIdentifier = hash\n"
            "[server]\nbasicConstraints = critical,CA:FALSE\n"
            "keyUsage = critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage = serverAuth\nsubjectAltName = {sans}\n"
            "[client]\nbasicConstraints = critical,CA:FALSE\n"
            "keyUsage = critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage = clientAuth\n"
        )
        self._openssl(
            *_CERT_REQ,
            "-extensions",
            "ca",
            "-subj",
            "/CN=straitmq-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        )
        leafs = {
            "apiserver": ("server", "/CN=kube-apiserver"),
            "admin": ("client", "/O=system:masters/CN=straitmq-admin"),
            "controller-manager": ("client", "/CN=system:kube-controller-manager"),
            "scheduler": ("client", "/CN=system:kube-scheduler"),
        }
        for name, (ext, subj) in leafs.items():
            self._issue_cert(name, ext, subj)
        self._openssl(
            "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "sa.key"
        )
        self._openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        for user in ("admin", "controller-manager", "scheduler"):
            path = self.kubeconfig if user == "admin" else str(self.pki / f"{user}.kubeconfig")
            self._write_kubeconfig(path, user)

    def _write_kubeconfig(self, path: str, user: str) -> None:
        def b64(name: str) -> str:
            return base64.b64encode((self.pki / name).read_bytes()).decode()

        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "straitmq-test",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": b64("ca.crt"),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": b64(f"{user}.crt"),
                        "client-key-data": b64(f"{user}.key"),
                    },
                }
            ],
            "contexts": [
                {"name": "straitmq-test", "context": {"cluster": "straitmq-test", "user": user}}
            ],
            "current-context": "straitmq-test",
        }
        Path(path).write_text(json.dumps(cfg, indent=1))  # JSON is valid kubeconfig YAML
        os.chmod(path, 0o600)

    def _start_etcd(self) -> None:
        # Data on tmpfs when there is one: etcd fsyncs every write and the apiserver's
        # bootstrap makes hundreds; etcd 3.4 has no --unsafe-no-fsync.
        shm = Path("/dev/shm")
        if self.etcd_on_tmpfs and shm.is_dir() and os.access(shm, os.W_OK):
            _remove_orphaned_etcd_dirs(shm)
            base = Path(tempfile.mkdtemp(prefix=ETCD_TMPFS_PREFIX, dir=shm))
            (base / "owner.pid").write_text(str(os.getpid()))
            self._etcd_tmpfs = base
            self._etcd_data = base / "etcd"
        else:
            self._etcd_data = self.work_dir / "etcd"
        client_url = f"http://127.0.0.1:{self.etcd_port}"
        peer_url = f"http://127.0.0.1:{self.etcd_peer_port}"
        self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=test",
                f"--data-dir={self._etcd_data}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=test={peer_url}",
                "--initial-cluster-state=new",
                "--quota-backend-bytes=536870912",  # 512 MiB: plenty for tests
                "--snapshot-count=5000",  # 3.4 keeps 100k raft entries in memory by default
                "--auto-compaction-mode=periodic",
                "--auto-compaction-retention=5m",
                "--logger=zap",  # 3.4's default capnslog logger is deprecated and noisy
                "--log-outputs=stderr",
            ],
        )

    def _etcd_healthy(self) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.etcd_port}/health", timeout=2) as r:
            return bool(json.load(r).get("health") == "true")

    def _start_apiserver(self) -> None:
        p = self.pki
        self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.apiserver_port}",
                f"--advertise-address={ADVERTISE_ADDRESS}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                "--allow-privileged=true",
                "--profiling=false",
                "--event-ttl=30m",
            ],
        )

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def _apiserver_ready(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"{self.server}/readyz", timeout=5, context=self._ssl_context()
            ) as r:
                return r.status == 200
        except urllib.error.HTTPError as e:  # 500 while post-start hooks run
            e.close()
            return False

    def _start_controller_manager(self) -> None:
        p = self.pki
        self._spawn(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={p / 'controller-manager.kubeconfig'}",
                "--secure-port=0",  # no metrics/healthz endpoint: one port fewer to find
                "--leader-elect=false",
                "--controllers=*",  # every default controller, as in a real cluster
                "--use-service-account-credentials=true",  # each controller with its own RBAC
                f"--service-account-private-key-file={p / 'sa.key'}",
                f"--root-ca-file={p / 'ca.crt'}",
                f"--cluster-signing-cert-file={p / 'ca.crt'}",
                f"--cluster-signing-key-file={p / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--kube-api-qps=100",
                "--kube-api-burst=200",
            ],
        )

    def _start_scheduler(self) -> None:
        cfg = self.pki / "scheduler-config.yaml"
        cfg.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {
                        "kubeconfig": str(self.pki / "scheduler.kubeconfig"),
                        "qps": 100,
                        "burst": 200,
                    },
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--config={cfg}",
                "--secure-port=0",
                # A pod tried while its Immediate claim was still unbound waits in the
                # unschedulable queue; the claim's binding should requeue it, but the
                # scheduler sometimes misses that, and the fallback flush is 5 minutes
                # (seen twice in full CI runs: web-1 Pending with data-web-1 Bound).
                "--pod-max-in-unschedulable-pods-duration=15s",
            ],
        )

    def _start_kwok(self) -> None:
        kwok_dir = self.work_dir / "kwok"
        kwok_dir.mkdir(exist_ok=True)
        self._spawn(
            "kwok",
            [
                str(self.bin_dir / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={KWOK_STAGES}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--node-lease-duration-seconds=40",
                "--cidr=10.0.0.1/16",  # only for nodes without spec.podCIDR
            ],
            # kwok always also reads $KWOK_WORKDIR/kwok.yaml (default ~/.kwok/kwok.yaml):
            # point it at an empty dir so a developer's own kwok config cannot leak in.
            env={**self.env, "KWOK_WORKDIR": str(kwok_dir)},
        )

    def _cluster_objects(self) -> list[dict[str, Any]]:
        objects: list[dict[str, Any]] = []
        for i, name in enumerate(self.node_names):
            zone = ZONES[i % len(ZONES)]
            resources = {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"}
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        # kwok manages nodes carrying this annotation (see _start_kwok).
                        "annotations": {
                            KWOK_NODE_ANNOTATION: "fake",
                            "node.alpha.kubernetes.io/ttl": "0",
                        },
                        "labels": {
                            "kubernetes.io/hostname": name,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                            "topology.kubernetes.io/region": "local",
                            "topology.kubernetes.io/zone": zone,
                            "type": "kwok",
                        },
                    },
                    # kwok hands out pod IPs from spec.podCIDR.
                    "spec": {"podCIDR": f"10.0.{i}.0/24", "podCIDRs": [f"10.0.{i}.0/24"]},
                    # Nodes may be created with status (kubelets register that way); kwok
                    # keeps allocatable/capacity/addresses and fills in conditions and nodeInfo.
                    "status": {
                        "allocatable": resources,
                        "capacity": resources,
                        "addresses": [
                            {"type": "InternalIP", "address": f"10.1.0.{i + 1}"},
                            {"type": "Hostname", "address": name},
                        ],
                    },
                }
            )
        objects.append(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {
                    "name": "standard",
                    "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
                },
                "provisioner": "kubernetes.io/no-provisioner",
                "reclaimPolicy": "Retain",
                "volumeBindingMode": "Immediate",
            }
        )
        for name in self.volume_names:
            path = self.work_dir / "volumes" / name
            path.mkdir(parents=True, exist_ok=True)
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolume",
                    "metadata": {"name": name, "labels": {"straitmq.io/test-pool": "true"}},
                    "spec": {
                        "capacity": {"storage": self.volume_size},
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "standard",
                        # Retain, then the reclaimer frees it: the Delete and Recycle
                        # reclaimers would need a real kubelet or a provisioner.
                        "persistentVolumeReclaimPolicy": "Retain",
                        "volumeMode": "Filesystem",
                        "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                    },
                }
            )
        return objects

    def _create_cluster_objects(self) -> None:
        items = self._cluster_objects()
        self.kubectl(
            "create",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )

    def _nodes_ready(self, core: Any) -> bool:
        nodes = {n.metadata.name: n for n in core.list_node().items}
        for name in self.node_names:
            node = nodes.get(name)
            if node is None or node.status is None:
                return False
            conditions = {c.type: c.status for c in node.status.conditions or []}
            if conditions.get("Ready") != "True":
                return False
            # TaintNodesByCondition adds this on create; node-lifecycle lifts it once Ready.
            if any(t.key == NOT_READY_TAINT for t in node.spec.taints or []):
                return False
        return True

    def _volumes_available(self, core: Any) -> bool:
        pvs = core.list_persistent_volume(label_selector="straitmq.io/test-pool=true").items
        phases = [pv.status.phase if pv.status else None for pv in pvs]
        return len(phases) == len(self.volume_names) and all(
            p in ("Available", "Bound") for p in phases
        )

    def _start_reclaimer(self) -> None:
        self._reclaimer = threading.Thread(
            target=self._reclaim_loop, name="kube-pv-reclaimer", daemon=True
        )
        self._reclaimer.start()

    def _reclaim_loop(self) -> None:
        """Return Released pool volumes to Available (wipe the directory, drop the
        claimRef), so tests that delete claims do not drain the pool."""
        from kubernetes import client

        log_path = self.log_path("pv-reclaimer")
        with open(log_path, "a") as log, self.api_client() as api:
            core = client.CoreV1Api(api)
            print(
                f"{time.strftime('%H:%M:%S')} watching {len(self.volume_names)} volumes", file=log
            )
            log.flush()
            while not self._stop_event.wait(1.0):
                try:
                    self._reclaim_once(core, log)
                except Exception as e:  # the apiserver may be going away; keep trying
                    print(f"{time.strftime('%H:%M:%S')} reclaim failed: {e!r}", file=log)
                    log.flush()

    def _reclaim_once(self, core: Any, log: IO[str]) -> None:
        for pv in core.list_persistent_volume(
            label_selector="straitmq.io/test-pool=true", _request_timeout=10
        ).items:
            if pv.status is None or pv.status.phase != "Released":
                continue
            path = Path(pv.spec.host_path.path)
            if path.is_dir():
                for child in path.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child, ignore_errors=True)
                    else:
                        child.unlink(missing_ok=True)
            # The resourceVersion makes this a no-op if the PV changed meanwhile.
            core.patch_persistent_volume(
                pv.metadata.name,
                {
                    "metadata": {"resourceVersion": pv.metadata.resource_version},
                    "spec": {"claimRef": None},
                },
                _request_timeout=10,
            )
            print(f"{time.strftime('%H:%M:%S')} reclaimed {pv.metadata.name}", file=log)
            log.flush()


def _terminate(components: list[_Component], grace: float = 10) -> None:
    for c in components:
        _signal_group(c.proc, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for c in components:
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        _signal_group(c.proc, signal.SIGKILL)  # a straggler, or leftovers in its group
        with contextlib.suppress(subprocess.TimeoutExpired):
            c.proc.wait(timeout=5)


def _remove_orphaned_etcd_dirs(shm: Path) -> None:
    """tmpfs is RAM: drop etcd dirs left by test processes that died without stop()."""
    for d in shm.glob(f"{ETCD_TMPFS_PREFIX}*"):
        try:
            os.kill(int((d / "owner.pid").read_text()), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (OSError, ValueError):  # alive but not ours, or being created right now
            continue


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # pid == pgid: started with start_new_session


@contextlib.contextmanager
def running(work_dir: Path | str, **kwargs: Any) -> Iterator[KubeControlPlane]:
    cp = KubeControlPlane(work_dir, **kwargs)
    try:
        yield cp.start()
    finally:
        cp.stop()


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Run the test Kubernetes control plane by hand.")
    ap.add_argument("--work-dir", help="default: a new temporary directory")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--volumes", type=int, default=24)
    args = ap.parse_args(argv)
    reason = available()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="straitmq-kube-")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cp = KubeControlPlane(work_dir, nodes=args.nodes, volumes=args.volumes)
    print(f"starting control plane in {work_dir} (logs in {work_dir}/logs) ...", flush=True)
    try:
        cp.start()
        print(f"ready in {cp.startup_seconds}s ({cp.timings})")
        print(f"\n  export KUBECONFIG={cp.kubeconfig}\n\nCtrl-C stops it.", flush=True)
        while not stop.wait(1.0):
            cp.check_alive()
    finally:
        print("stopping ...", file=sys.stderr)
        cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
