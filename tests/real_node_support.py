"""A real single-node Kubernetes on this machine: the control plane of kube_support.py
plus containerd + runc, a kubelet, a CNI bridge pod network, kube-proxy (iptables) and
CoreDNS in a pod. Pods run the images scripts/build-images.sh makes (no registry).

    scripts/node-up.sh    installs packages, builds binaries and images, then runs
                          `python tests/real_node_support.py serve` in the background
    scripts/node-down.sh  `python tests/real_node_support.py down`: stops everything and
                          removes containers, mounts, interfaces and iptables rules

Layout: everything volatile under RUN_DIR (/run/straitmq-node: sockets, containerd state,
kubelet root, CNI state, control-plane work dir, logs in RUN_DIR/work/logs); containerd's
content store (imported images) persists under .cache/node/containerd.

Addresses (all on this machine): the node IP is NODE_IP on one end of a local veth pair
(this kernel has no dummy driver) and the API server listens there; pods get POD_CIDR on
the bridge BRIDGE, Services SERVICE_CIDR.
Nothing forwards DNS or traffic off the machine: CoreDNS answers cluster.local only and
the bridge does no masquerading.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kube_support import (
    BIN_DIR,
    ROOT,
    SERVICE_CIDR,
    KubeControlPlane,
    _terminate,
    free_port,
)

RUN_DIR = Path(os.environ.get("STRAITMQ_NODE_RUN", "/run/straitmq-node"))
# resolved: .cache/node links to the user's cache (scripts/bootstrap.sh), and mounts are
# listed by their real paths
CACHE_DIR = (ROOT / ".cache" / "node").resolve()
IMAGES_DIR = (ROOT / ".cache" / "images").resolve()
NODE_NAME = "straitmq-node"
NODE_IP = "172.31.255.1"
NODE_IFACE = "straitnode0"  # holds NODE_IP: one end of a veth pair
NODE_PEER = "straitnode0p"
BRIDGE = "straitcni0"
POD_CIDR = "10.244.0.0/24"
CLUSTER_DNS = "10.96.0.10"
PAUSE_IMAGE = "localhost/pause:3.10"
COREDNS_IMAGE = "localhost/coredns:1.12.4"
APP_IMAGE = "localhost/straitmq:dev"
IMAGE_REPOSITORY = APP_IMAGE.rsplit(":", 1)[0]  # the chart's image.repository here
CLIENT_IMAGE = "localhost/straitmq-client:dev"  # the base + confluent-kafka (client pods)
BASE_IMAGE = "localhost/straitmq-python:3.11"  # Debian + python: the provisioner's helper pods
LOCAL_PATH_IMAGE = "localhost/local-path-provisioner:v0.0.30"
LOCAL_PATH_PROVISIONER = "rancher.io/local-path"
LOCAL_PATH_NS = "local-path-storage"
STORAGE_CLASS = "local-path"
# ReadWriteMany for pods that share a volume (Spark's driver and executors): one node's
# directory is what every node sees, so the provisioner's shared-filesystem mode is true.
SHARED_STORAGE_CLASS = "local-path-shared"
SPARK_JOBS_IMAGE = "localhost/straitmq-spark-jobs:dev"  # spark-jobs/k8s/Dockerfile
NODE_BINARIES = ("kubelet", "kube-proxy", "coredns", "local-path-provisioner")
HOST_TOOLS = (
    "containerd",
    "containerd-shim-runc-v2",
    "runc",
    "ctr",
    "ip",
    "iptables",
    "iptables-save",
    "ip6tables",
    "ip6tables-save",
    "mount",
    "umount",
)
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
CNI_DIR = Path("/usr/lib/cni")


def app_version() -> str:
    """This code's version (straitmq.__version__): build-images.sh tags the app image
    `localhost/straitmq:<it>` too, what an MQCluster with `spec.version: <it>` runs."""
    m = re.search(r'^__version__ = "(.*)"$', (ROOT / "straitmq" / "__init__.py").read_text(), re.M)
    assert m, "no __version__ in straitmq/__init__.py"
    return m.group(1)


def release_images() -> list[tuple[str, str, str]]:
    """(version, tar, image) of each release of releases.toml that build-images.sh builds
    from its own source (all but one whose version is this code's)."""
    with open(ROOT / "releases.toml", "rb") as f:
        versions = list(tomllib.load(f)["releases"])
    return [
        (v, f"straitmq-{v}.tar", f"{IMAGE_REPOSITORY}:{v}") for v in versions if v != app_version()
    ]


def why_not() -> str | None:
    """None when this machine can run the real node, else why not."""
    if os.geteuid() != 0:
        return "the real node needs root (kubelet, containerd, network interfaces, iptables)"
    if (
        not Path("/sys/fs/cgroup/memory").is_dir()
        and not Path("/sys/fs/cgroup/cgroup.controllers").is_file()
    ):
        return "no cgroups mounted at /sys/fs/cgroup (no memory controller, no cgroup2)"
    missing = [b for b in NODE_BINARIES if not os.access(BIN_DIR / b, os.X_OK)]
    if missing:
        return f"missing from {BIN_DIR}: {', '.join(missing)} (scripts/fetch-k8s.sh --node)"
    tools = [t for t in HOST_TOOLS if shutil.which(t) is None]
    if tools:
        return f"not on PATH: {', '.join(tools)} (scripts/node-up.sh installs them)"
    plugins = [p for p in CNI_PLUGINS if not (CNI_DIR / p).is_file()]
    if plugins:
        return f"CNI plugins missing from {CNI_DIR}: {', '.join(plugins)}"
    for tar in (
        "pause-3.10.tar",
        "coredns-1.12.4.tar",
        "straitmq-client-dev.tar",
        "straitmq-python-3.11.tar",
        "local-path-provisioner-v0.0.30.tar",
        "straitmq-spark-jobs-dev.tar",
        *(tar for _, tar, _ in release_images()),
    ):
        if not (IMAGES_DIR / tar).is_file():
            return f"{IMAGES_DIR / tar} is missing (scripts/build-images.sh)"
    return None


def _sh(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


class RealNode(KubeControlPlane):
    """KubeControlPlane with the API server on NODE_IP and, instead of kwok, a real node."""

    def __init__(self, run_dir: Path = RUN_DIR) -> None:
        self.run_dir = run_dir
        # No static volumes: local-path-provisioner makes one per claim under volume_root.
        super().__init__(run_dir / "work", nodes=0, volumes=0)
        self.volume_root = run_dir / "local-path"
        self.server = f"https://{NODE_IP}:{self.apiserver_port}"
        self.node_names = [NODE_NAME]
        self.ctr_sock = run_dir / "containerd" / "containerd.sock"
        self.kubelet_root = run_dir / "kubelet"
        self.ctr_root = CACHE_DIR / "containerd"

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 240.0) -> RealNode:
        reason = why_not()
        if reason:
            raise RuntimeError(reason)
        t0 = time.monotonic()
        deadline = t0 + timeout
        last = [t0]

        def mark(step: str) -> None:
            now = time.monotonic()
            self.timings[step] = round(now - last[0], 2)
            last[0] = now
            print(f"real-node: {step} {self.timings[step]}s", file=sys.stderr, flush=True)

        try:
            self._network_up()
            mark("network")
            self._make_pki()
            self._make_node_pki()
            mark("pki")
            self._start_etcd()
            self._wait_until(deadline, "etcd /health", self._etcd_healthy)
            mark("etcd")
            self._start_apiserver()
            self._start_containerd()
            self._wait_until(deadline, "kube-apiserver /readyz", self._apiserver_ready)
            mark("apiserver")
            self._start_controller_manager()
            self._start_scheduler()
            self._wait_until(deadline, "containerd socket", self._containerd_ready)
            mark("containerd")
            self._import_images()
            mark("images")
            self._start_kubelet()
            self._start_kube_proxy()
            self._create_cluster_objects()
            from kubernetes import client

            with self.api_client() as api:
                core = client.CoreV1Api(api)
                self._wait_until(deadline, "node Ready", lambda: self._nodes_ready(core))
                mark("node Ready")
                self._wait_until(
                    deadline, "CoreDNS Ready", lambda: self._deployment_ready("coredns")
                )
                mark("coredns")
                self._wait_until(
                    deadline,
                    "local-path-provisioner Ready",
                    lambda: self._deployment_ready("local-path-provisioner", LOCAL_PATH_NS),
                )
                mark("provisioner")
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = round(time.monotonic() - t0, 2)
        return self

    def stop(self) -> None:
        """Node first (kubelet, kube-proxy, then the pods' containers while containerd
        still answers), then the control plane, then host leftovers."""
        with self._lock:
            node = [c for c in self._components if c.name in ("kubelet", "kube-proxy")]
            self._components = [c for c in self._components if c not in node]
        _terminate(node)
        remove_containers(self.ctr_sock)
        with self._lock:
            ctrd = [c for c in self._components if c.name == "containerd"]
            self._components = [c for c in self._components if c not in ctrd]
        _terminate(ctrd)
        super().stop()
        cleanup_host(self.run_dir)

    # ------------------------------------------------------------------ pieces

    def _network_up(self) -> None:
        if _sh("ip", "link", "show", NODE_IFACE, check=False).returncode != 0:
            # A veth pair, not a dummy: this kernel has no dummy driver. Nothing is
            # plugged into the peer; the address is simply this machine's own.
            _sh("ip", "link", "add", NODE_IFACE, "type", "veth", "peer", "name", NODE_PEER)
        _sh("ip", "addr", "replace", f"{NODE_IP}/32", "dev", NODE_IFACE)
        _sh("ip", "link", "set", NODE_PEER, "up")
        _sh("ip", "link", "set", NODE_IFACE, "up")
        # Pod-to-Service traffic answered across the bridge must pass conntrack.
        nf = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
        if nf.exists() and nf.read_text().strip() != "1":
            nf.write_text("1")
        fwd = Path("/proc/sys/net/ipv4/ip_forward")
        if fwd.read_text().strip() != "1":
            fwd.write_text("1")

    def _make_pki(self) -> None:
        super()._make_pki()  # the kube_support SANs cover 127.0.0.1; add the node IP
        cnf = self.pki / "openssl.cnf"
        text = cnf.read_text().replace("IP:127.0.0.1,", f"IP:127.0.0.1,IP:{NODE_IP},", 1)
        cnf.write_text(text)
        self._issue_cert("apiserver", "server", "/CN=kube-apiserver")

    def _make_node_pki(self) -> None:
        leafs = {
            "kubelet": f"/O=system:nodes/CN=system:node:{NODE_NAME}",
            "kube-proxy": "/CN=system:kube-proxy",
            "apiserver-kubelet-client": "/O=system:masters/CN=kube-apiserver-kubelet-client",
        }
        for name, subj in leafs.items():
            self._issue_cert(name, "client", subj)
        for user in ("kubelet", "kube-proxy"):
            self._write_kubeconfig(str(self.pki / f"{user}.kubeconfig"), user)

    def _start_apiserver(self) -> None:
        p = self.pki
        self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                f"--bind-address={NODE_IP}",
                f"--secure-port={self.apiserver_port}",
                f"--advertise-address={NODE_IP}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP",
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

    def _start_kwok(self) -> None:  # a real kubelet instead
        pass

    def _start_containerd(self) -> None:
        run = self.run_dir
        cni_conf = run / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-straitmq.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "straitmq",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": BRIDGE,
                            "isGateway": True,
                            "ipMasq": False,  # pods talk to this machine only
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_CIDR}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(run / "cni" / "ipam"),
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                }
            )
        )
        self.ctr_root.mkdir(parents=True, exist_ok=True)
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""version = 2
root = "{self.ctr_root}"
state = "{run / "containerd" / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{self.ctr_sock}"
[ttrpc]
  address = "{self.ctr_sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.ctr_root / "opt"}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # root here lacks CAP_SYS_RESOURCE: a negative oom_score_adj cannot be written
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{run / "runc"}"
  BinaryName = "{shutil.which("runc")}"
[{cri}.cni]
  bin_dir = "{CNI_DIR}"
  conf_dir = "{cni_conf}"
"""
        path = run / "containerd" / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config)
        self._spawn("containerd", ["containerd", "--config", str(path)])

    def _containerd_ready(self) -> bool:
        return self._ctr("version", check=False).returncode == 0

    def _ctr(self, *args: str, check: bool = True, timeout: float = 300) -> Any:
        return _sh(
            "ctr",
            "--address",
            str(self.ctr_sock),
            "-n",
            "k8s.io",
            *args,
            check=check,
            timeout=timeout,
        )

    def _import_images(self) -> None:
        have = set(self._ctr("images", "ls", "-q").stdout.split())
        version_image = f"{IMAGE_REPOSITORY}:{app_version()}"
        for tar, ref in (
            ("pause-3.10.tar", PAUSE_IMAGE),
            ("coredns-1.12.4.tar", COREDNS_IMAGE),
            ("straitmq-dev.tar", APP_IMAGE),
            ("straitmq-client-dev.tar", CLIENT_IMAGE),
            ("straitmq-python-3.11.tar", BASE_IMAGE),
            ("local-path-provisioner-v0.0.30.tar", LOCAL_PATH_IMAGE),
            ("straitmq-spark-jobs-dev.tar", SPARK_JOBS_IMAGE),
            *((tar, ref) for _, tar, ref in release_images()),
        ):
            path = IMAGES_DIR / tar
            stamp = CACHE_DIR / f"{tar}.imported"
            fresh = (
                stamp.is_file() and stamp.read_text() == str(path.stat().st_mtime_ns)
                if path.is_file()
                else True
            )
            if not path.is_file() or (ref in have and fresh):
                continue
            self._import(path)
            stamp.write_text(str(path.stat().st_mtime_ns))
            if ref == APP_IMAGE:
                have.discard(version_image)
        # The app tar names :dev only (one name per docker-archive); spec.version of this
        # code runs the same image as <repository>:<version>.
        if version_image not in have:
            self._ctr("images", "tag", "--force", APP_IMAGE, version_image)

    def _import(self, path: Path, attempts: int = 3) -> None:
        # containerd 1.6 can lose an import to its own garbage collector: the import
        # re-points the image's name first and unpacks after, so snapshots the old image
        # shared are briefly unreferenced, and a collection then fails the unpack with
        # "parent snapshot ... does not exist" (containerd#3787). The content is kept, so
        # importing again re-creates what was collected.
        for attempt in range(1, attempts + 1):
            proc = self._ctr("images", "import", str(path), check=False)
            if proc.returncode == 0:
                return
            err = proc.stderr.strip()
            print(f"real-node: import {path.name} attempt {attempt}: {err}", file=sys.stderr)
        raise RuntimeError(f"ctr images import {path} failed {attempts} times: {err}")

    def _start_kubelet(self) -> None:
        p = self.pki
        self.kubelet_root.mkdir(parents=True, exist_ok=True)
        cfg = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.ctr_sock}",
            "address": NODE_IP,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 0,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(p / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [CLUSTER_DNS],
            "clusterDomain": "cluster.local",
            "resolvConf": "",  # pods see cluster DNS only, never the host's resolver
            "podCIDR": POD_CIDR,
            "maxPods": 110,
            "serializeImagePulls": False,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "5s",
        }
        path = self.run_dir / "kubelet-config.yaml"
        path.write_text(json.dumps(cfg, indent=1))
        self._spawn(
            "kubelet",
            [
                str(self.bin_dir / "kubelet"),
                f"--config={path}",
                f"--kubeconfig={p / 'kubelet.kubeconfig'}",
                f"--root-dir={self.kubelet_root}",
                f"--cert-dir={self.kubelet_root / 'pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                "--node-labels=topology.kubernetes.io/zone=zone-a,topology.kubernetes.io/region=local",
                "--v=1",
            ],
        )

    def _start_kube_proxy(self) -> None:
        cfg = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.pki / "kube-proxy.kubeconfig")},
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "hostnameOverride": NODE_NAME,
            "bindAddress": NODE_IP,
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            "nodePortAddresses": [f"{NODE_IP}/32"],
            # Leave the host's conntrack and route_localnet sysctls alone.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "iptables": {"localhostNodePorts": False, "syncPeriod": "10s", "minSyncPeriod": "0s"},
        }
        path = self.run_dir / "kube-proxy-config.yaml"
        path.write_text(json.dumps(cfg, indent=1))
        self._spawn("kube-proxy", [str(self.bin_dir / "kube-proxy"), f"--config={path}", "--v=1"])

    def _cluster_objects(self) -> list[dict[str, Any]]:
        # kube_support's no-provisioner StorageClass goes: the provisioner's is the default.
        objects = [
            o for o in super()._cluster_objects() if o["kind"] not in ("Node", "StorageClass")
        ]
        return coredns_objects() + local_path_objects(self.volume_root) + objects

    def _deployment_ready(self, name: str, ns: str = "kube-system") -> bool:
        out = self.kubectl("get", "deployment", name, "-n", ns, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        status = json.loads(out.stdout).get("status", {})
        return bool(status.get("readyReplicas", 0) >= 1)

    def write_pids(self) -> None:
        """For node-down: the processes this node started, by name."""
        with self._lock:
            pids = {c.name: c.proc.pid for c in self._components}
        (self.run_dir / "pids.json").write_text(json.dumps(pids))


def local_path_objects(volume_root: Path) -> list[dict[str, Any]]:
    """rancher/local-path-provisioner as its deploy/local-path-storage.yaml installs it, with
    the locally built images and its volumes under `volume_root`: the default StorageClass,
    bound when a pod is scheduled, a claim's directory deleted with it."""
    meta = {"namespace": LOCAL_PATH_NS}
    sa = "local-path-provisioner-service-account"
    labels = {"app": "local-path-provisioner"}
    config = {
        "storageClassConfigs": {
            STORAGE_CLASS: {
                "nodePathMap": [
                    {"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [str(volume_root)]}
                ]
            },
            SHARED_STORAGE_CLASS: {"sharedFileSystemPath": str(volume_root / "shared")},
        }
    }
    # The helper pod creates and deletes a volume's directory on the node. 0777: fsGroup
    # does not reach hostPath volumes, and our images run as uid 10001.
    helper = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            "priorityClassName": "system-node-critical",
            "containers": [{"name": "helper-pod", "image": BASE_IMAGE, "imagePullPolicy": "Never"}],
        },
    }
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LOCAL_PATH_NS}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, **meta}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "local-path-provisioner-role", **meta},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods"],
                    "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "local-path-provisioner-role"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": [
                        "nodes",
                        "persistentvolumeclaims",
                        "configmaps",
                        "pods",
                        "pods/log",
                    ],
                    "verbs": ["get", "list", "watch"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["persistentvolumes"],
                    "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"],
                },
                {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
                {
                    "apiGroups": ["storage.k8s.io"],
                    "resources": ["storageclasses"],
                    "verbs": ["get", "list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "local-path-provisioner-bind", **meta},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "local-path-provisioner-role",
            },
            "subjects": [{"kind": "ServiceAccount", "name": sa, **meta}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "local-path-provisioner-bind"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "local-path-provisioner-role",
            },
            "subjects": [{"kind": "ServiceAccount", "name": sa, **meta}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "local-path-config", **meta},
            "data": {
                "config.json": json.dumps(config),
                "setup": '#!/bin/sh\nset -eu\nmkdir -m 0777 -p "$VOL_DIR"\n',
                "teardown": '#!/bin/sh\nset -eu\nrm -rf "$VOL_DIR"\n',
                "helperPod.yaml": json.dumps(helper),  # JSON is YAML
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "local-path-provisioner", **meta, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": sa,
                        "priorityClassName": "system-cluster-critical",
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [
                            {
                                "name": "local-path-provisioner",
                                "image": LOCAL_PATH_IMAGE,
                                "imagePullPolicy": "Never",
                                "command": [
                                    "local-path-provisioner",
                                    "--debug",
                                    "start",
                                    "--config",
                                    "/etc/config/config.json",
                                    f"--helper-image={BASE_IMAGE}",
                                ],
                                "env": [
                                    {
                                        "name": "POD_NAMESPACE",
                                        "valueFrom": {
                                            "fieldRef": {"fieldPath": "metadata.namespace"}
                                        },
                                    },
                                    {"name": "CONFIG_MOUNT_PATH", "value": "/etc/config/"},
                                ],
                                "volumeMounts": [
                                    {"name": "config-volume", "mountPath": "/etc/config/"}
                                ],
                                "securityContext": {"readOnlyRootFilesystem": True},
                            }
                        ],
                        "volumes": [
                            {"name": "config-volume", "configMap": {"name": "local-path-config"}}
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": LOCAL_PATH_PROVISIONER,
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": SHARED_STORAGE_CLASS},
            "provisioner": LOCAL_PATH_PROVISIONER,
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
        },
    ]


def coredns_objects() -> list[dict[str, Any]]:
    labels = {"k8s-app": "kube-dns"}
    corefile = """.:53 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
    loop
}
"""
    meta = {"namespace": "kube-system"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", **meta}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", **meta}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", **meta},
            "data": {"Corefile": corefile},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", **meta, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "priorityClassName": "system-cluster-critical",
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [
                            {
                                "name": "coredns",
                                "image": COREDNS_IMAGE,
                                "imagePullPolicy": "Never",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                                ],
                                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                                "livenessProbe": {
                                    "httpGet": {"path": "/health", "port": 8080},
                                    "periodSeconds": 10,
                                },
                                "readinessProbe": {
                                    "httpGet": {"path": "/ready", "port": 8181},
                                    "periodSeconds": 2,
                                },
                                "securityContext": {"readOnlyRootFilesystem": True},
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", **meta, "labels": labels},
            "spec": {
                "clusterIP": CLUSTER_DNS,
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                ],
            },
        },
    ]


# ---------------------------------------------------------------------- tear-down


def remove_containers(ctr_sock: Path) -> None:
    """Kill and delete every container and task in containerd's k8s.io namespace (only
    this node's containerd: its own socket)."""
    if not ctr_sock.is_socket():
        return

    def ctr(*args: str) -> subprocess.CompletedProcess[str]:
        return _sh(
            "ctr", "--address", str(ctr_sock), "-n", "k8s.io", *args, check=False, timeout=60
        )

    if ctr("version").returncode != 0:
        return
    for line in ctr("tasks", "ls", "-q").stdout.split():
        ctr("tasks", "kill", "-s", "SIGKILL", line)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        left = ctr("tasks", "ls", "-q").stdout.split()
        for task in left:
            ctr("tasks", "delete", "-f", task)
        if not left:
            break
        time.sleep(0.5)
    for c in ctr("containers", "ls", "-q").stdout.split():
        ctr("containers", "delete", c)


def _our_mounts(run_dir: Path) -> list[str]:
    prefixes = (str(run_dir) + "/", str(CACHE_DIR / "containerd") + "/")
    targets = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            target = line.split()[4].replace("\\040", " ")
            if target.startswith(prefixes) or target == str(run_dir):
                targets.append(target)
    return sorted(set(targets), key=lambda t: t.count("/"), reverse=True)


def _our_pids(run_dir: Path) -> list[int]:
    """Processes started for this node: the recorded ones, and containerd shims that serve
    this node's containerd (their command line names its socket)."""
    pids: list[int] = []
    with contextlib.suppress(OSError, ValueError):
        pids += [int(p) for p in json.loads((run_dir / "pids.json").read_text()).values()]
    ours = {
        str(BIN_DIR / b)
        for b in (
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            *NODE_BINARIES,
        )
    }
    ours.add(shutil.which("containerd") or "containerd")

    def is_ours(pid: int) -> bool:  # a recorded pid may since have been reused
        with contextlib.suppress(OSError):
            return os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)") in ours
        return False

    pids = [p for p in pids if is_ours(p)]
    sock = str(run_dir / "containerd" / "containerd.sock")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and sock.encode() in cmd:
                pids.append(int(proc.name))
    return pids


def _kill(pids: list[int]) -> None:
    alive = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            alive.append(pid)
    deadline = time.monotonic() + 10
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if Path(f"/proc/{p}").exists() and not _zombie(p)]
        time.sleep(0.2)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _iptables_cleanup() -> None:
    """Delete every rule and chain kube-proxy, the kubelet and the CNI portmap plugin made
    (KUBE-*, CNI-*), in both address families; leaves everything else alone."""
    ours = ("KUBE-", "CNI-")
    for save, cmd in (("iptables-save", "iptables"), ("ip6tables-save", "ip6tables")):
        out = _sh(save, check=False).stdout
        table = ""
        rules: list[tuple[str, list[str]]] = []
        chains: list[tuple[str, str]] = []
        for line in out.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":") and line[1:].startswith(ours):
                chains.append((table, line[1:].split()[0]))
            elif line.startswith("-A "):
                words = shlex.split(line)
                if words[1].startswith(ours) or any(w.startswith(ours) for w in words[2:]):
                    rules.append((table, words))
        for table, words in rules:
            if not words[1].startswith(ours):  # rules in built-in chains: delete one by one
                _sh(cmd, "-t", table, "-D", *words[1:], check=False)
        for table, chain in chains:
            _sh(cmd, "-t", table, "-F", chain, check=False)
        for table, chain in chains:
            _sh(cmd, "-t", table, "-X", chain, check=False)
    # kube-proxy's own nftables tables, if this kube-proxy version made any.
    if shutil.which("nft"):
        for family in ("ip", "ip6"):
            _sh("nft", "delete", "table", family, "kube-proxy", check=False)


def cleanup_host(run_dir: Path = RUN_DIR) -> list[str]:
    """Remove whatever the node left on the host; returns what is still there (empty when
    clean). Idempotent, and works after a crash of the process that ran the node."""
    _kill(_our_pids(run_dir))
    for target in _our_mounts(run_dir):
        if _sh("umount", target, check=False).returncode != 0:
            _sh("umount", "-l", target, check=False)
    for link in (BRIDGE, NODE_IFACE):
        _sh("ip", "link", "del", link, check=False)
    # veths of pods whose netns is gone vanish with it; any left on the bridge go too.
    _iptables_cleanup()
    # containerd 1.6's shims always put their sockets under /run/containerd/s: drop the
    # directories if they are empty (they are not, while another containerd runs).
    for d in (
        "/run/containerd/s",
        "/run/containerd/runc/k8s.io",
        "/run/containerd/runc",
        "/run/containerd",
    ):
        with contextlib.suppress(OSError):
            os.rmdir(d)
    _remove_orphaned_etcd_dirs()
    logs = run_dir / "work" / "logs"
    if logs.is_dir():  # kept for a post-mortem: .cache/node/logs
        shutil.rmtree(CACHE_DIR / "logs", ignore_errors=True)
        shutil.copytree(logs, CACHE_DIR / "logs", dirs_exist_ok=True)
    shutil.rmtree(run_dir, ignore_errors=True)
    return leftovers(run_dir)


def _remove_orphaned_etcd_dirs() -> None:
    from kube_support import _remove_orphaned_etcd_dirs as remove

    shm = Path("/dev/shm")
    if shm.is_dir():
        remove(shm)


def leftovers(run_dir: Path = RUN_DIR) -> list[str]:
    """What of the node is still on this machine (for tear-down checks)."""
    found: list[str] = []
    for link in (BRIDGE, NODE_IFACE):
        if _sh("ip", "link", "show", link, check=False).returncode == 0:
            found.append(f"interface {link}")
    found += [f"mount {m}" for m in _our_mounts(run_dir)]
    with open("/proc/self/mountinfo") as f:
        found += [f"mount {line.split()[4]}" for line in f if str(run_dir / "kubelet") in line]
    for save in ("iptables-save", "ip6tables-save"):
        for line in _sh(save, check=False).stdout.splitlines():
            if "KUBE-" in line or "CNI-" in line:
                found.append(f"{save}: {line}")
    found += [
        f"process {p}" for p in _our_pids(run_dir) if Path(f"/proc/{p}").exists() and not _zombie(p)
    ]
    if run_dir.exists():
        found.append(f"directory {run_dir}")
    return sorted(set(found))


# ---------------------------------------------------------------------- CLI


def serve(run_dir: Path) -> int:
    """Start the node, write RUN_DIR/ready.json (kubeconfig, timings), run until SIGTERM."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    node = RealNode(run_dir)
    try:
        node.start()
        node.write_pids()
        (run_dir / "ready.json").write_text(
            json.dumps(
                {
                    "kubeconfig": node.kubeconfig,
                    "server": node.server,
                    "volume_root": str(node.volume_root),
                    "timings": node.timings,
                    "seconds": node.startup_seconds,
                }
            )
        )
        while not stop.wait(1.0):
            node.check_alive()
    except BaseException as e:
        (run_dir.parent / f"{run_dir.name}.failed").write_text(f"{type(e).__name__}: {e}\n")
        raise
    finally:
        node.stop()
    return 0


def down(run_dir: Path) -> int:
    pid_file = run_dir.parent / f"{run_dir.name}.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text())
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)  # serve() stops the node in order
            deadline = time.monotonic() + 90
            while Path(f"/proc/{pid}").exists() and not _zombie(pid):
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    break
                time.sleep(0.5)
    remove_containers(run_dir / "containerd" / "containerd.sock")
    left = cleanup_host(run_dir)
    pid_file.unlink(missing_ok=True)
    if left:
        print("left behind:\n  " + "\n  ".join(left), file=sys.stderr)
        return 1
    print("real node torn down: no interfaces, mounts, iptables rules or processes left")
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="A real single-node Kubernetes (see module doc).")
    ap.add_argument("command", choices=["serve", "down", "leftovers", "check"])
    ap.add_argument("--run-dir", default=str(RUN_DIR))
    args = ap.parse_args(argv)
    run_dir = Path(args.run_dir)
    if args.command == "check":
        reason = why_not()
        print(reason or "ok")
        return 1 if reason else 0
    if args.command == "serve":
        return serve(run_dir)
    if args.command == "down":
        return down(run_dir)
    left = leftovers(run_dir)
    print("\n".join(left) or "nothing left")
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())


# ---------------------------------------------------------------------- pytest


class NodeHandle:
    """What the tests get: kubectl/helm against the running node, and pod helpers."""

    def __init__(self, ready: dict[str, Any]) -> None:
        self.kubeconfig = ready["kubeconfig"]
        self.timings = ready["timings"]
        self.startup_seconds = ready["seconds"]
        self.work_dir = Path(self.kubeconfig).parent
        self.volume_root = Path(ready["volume_root"])  # local-path-provisioner's directories
        self.server = ready["server"]  # the API server, as spark-submit k8s:// names it
        self.env = {
            **os.environ,
            "KUBECONFIG": self.kubeconfig,
            "HELM_CACHE_HOME": str(self.work_dir / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(self.work_dir / "helm" / "config"),
            "HELM_DATA_HOME": str(self.work_dir / "helm" / "data"),
        }

    def run(
        self, cmd: list[str], input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            cmd,
            input=input,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            cwd=ROOT,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{shlex.join(cmd)} exited {proc.returncode}: "
                f"{(proc.stderr or proc.stdout)[-3000:]}"
            )
        return proc

    def kubectl(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run(["kubectl", *args], **kw)

    def helm(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run([str(BIN_DIR / "helm"), *args], **kw)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def run_pod(self, name: str, ns: str, command: list[str], timeout: float = 90) -> str:
        """A one-shot pod of the StraitMQ image; returns its logs, fails unless it exits 0."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "c",
                        "image": APP_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": command,
                    }
                ],
            },
        }
        self.kubectl("apply", "-f", "-", input=json.dumps(pod))
        deadline = time.monotonic() + timeout
        phase = ""
        while time.monotonic() < deadline:
            phase = self.get("pod", name, "-n", ns).get("status", {}).get("phase", "")
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(0.5)
        logs = self.kubectl("logs", name, "-n", ns, check=False).stdout
        self.kubectl("delete", "pod", name, "-n", ns, "--wait=false", check=False)
        if phase != "Succeeded":
            raise AssertionError(f"pod {ns}/{name} ended {phase or 'never'}: {logs[-3000:]}")
        return logs

    def pods(self, ns: str, selector: str) -> list[dict[str, Any]]:
        return self.get("pods", "-n", ns, "-l", selector)["items"]

    def http_json(self, url: str, timeout: float = 5) -> Any:
        """GET from this machine (pod IPs are on its bridge); JSON body."""
        import urllib.request

        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())

    def admin(self, ns: str, path: str, selector: str, port: int = 8080) -> Any:
        """GET `path` from the HTTP API of the first Ready pod matching `selector`."""
        for pod in self.pods(ns, selector):
            ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in pod.get("status", {}).get("conditions", [])
            )
            ip = pod.get("status", {}).get("podIP")
            if ready and ip and not pod["metadata"].get("deletionTimestamp"):
                return self.http_json(f"http://{ip}:{port}{path}")
        raise RuntimeError(f"no Ready pod in {ns} matches {selector}")

    def container_pid(self, ns: str, pod: str, container: str) -> int:
        """The host PID of a pod's container's main process (through containerd)."""
        status = self.get("pod", pod, "-n", ns)["status"]
        cid = next(
            s["containerID"] for s in status["containerStatuses"] if s["name"] == container
        ).split("://", 1)[1]
        out = _sh(
            "ctr",
            "--address",
            str(RUN_DIR / "containerd" / "containerd.sock"),
            "-n",
            "k8s.io",
            "tasks",
            "ls",
        ).stdout
        for line in out.splitlines()[1:]:
            task, pid, *_ = line.split()
            if task == cid:
                return int(pid)
        raise AssertionError(f"no task for container {cid}: {out}")


def node_fixture() -> Iterator[NodeHandle]:
    """Body of the session fixture: node-up.sh, then node-down.sh, which must leave
    nothing behind. A machine that cannot run the node fails the tests (never skips)."""
    import pytest

    up = subprocess.run(
        [str(ROOT / "scripts" / "node-up.sh")],
        capture_output=True,
        text=True,
        timeout=1800,
        stdin=subprocess.DEVNULL,
    )
    sys.stderr.write(up.stderr[-4000:])
    if up.returncode != 0:
        pytest.fail(
            f"scripts/node-up.sh exited {up.returncode}:\n{up.stderr[-6000:]}", pytrace=False
        )
    try:
        yield NodeHandle(json.loads((RUN_DIR / "ready.json").read_text()))
    finally:
        down = subprocess.run(
            [str(ROOT / "scripts" / "node-down.sh")],
            capture_output=True,
            text=True,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        if down.returncode != 0:
            pytest.fail(
                f"scripts/node-down.sh left things behind:\n{down.stdout}{down.stderr}",
                pytrace=False,
            )


# ---------------------------------------------------------------------- Kafka clients in pods

# Run in a client pod (CLIENT_IMAGE): an idempotent acks=all producer that writes until
# STOP_FILE exists, one line per delivery report: "ACK <value> <partition> <offset>" or
# "ERR <value> <error>"; "FATAL <error>" for a fatal (idempotence) error; "DONE ..." last.
PRODUCER = r"""
import json, os, sys, time
from confluent_kafka import Producer
bootstrap, topic, prefix, rate, stop_file = sys.argv[1:6]
extra = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {}  # security settings
def on_error(err):
    print(f"{'FATAL' if err.fatal() else 'WARN'} {err}", flush=True)
p = Producer({
    "bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
    "message.timeout.ms": 300000, "linger.ms": 5, "client.id": prefix,
    "error_cb": on_error, **extra,
})
sent = failed = 0
def report(err, msg):
    global failed
    if err is None:
        print(f"ACK {msg.value().decode()} {msg.partition()} {msg.offset()}", flush=True)
    else:
        failed += 1
        print(f"ERR {msg.value().decode()} {err}", flush=True)
print("STARTED", flush=True)
while not os.path.exists(stop_file):
    value = f"{prefix}-{sent}"
    p.produce(topic, value=value.encode(), key=str(sent).encode(), on_delivery=report)
    sent += 1
    p.poll(0)
    time.sleep(1.0 / float(rate))
left = p.flush(240)
print(f"DONE sent={sent} failed={failed} unflushed={left}", flush=True)
"""

# A consumer group member that reads the topic from the start up to the high watermarks
# it sees when it starts, commits, and prints "V <partition> <offset> <value>" lines.
CONSUMER = r"""
import json, sys, time
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
bootstrap, topic, group, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}  # security settings
c = Consumer({
    "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
    "enable.auto.commit": False, "enable.partition.eof": True, **extra,
})
print("BROKERS " + " ".join(sorted(
    f"{b.host}:{b.port}" for b in c.list_topics(timeout=30).brokers.values())), flush=True)
parts = sorted(c.list_topics(topic, timeout=30).topics[topic].partitions)
def high_watermark(p):
    # A leader that moved since the metadata (brokers just rolled, the preferred leader
    # taking its partitions back) answers NOT_LEADER: a Kafka client asks again.
    deadline = time.monotonic() + 60
    while True:
        try:
            return c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
        except KafkaException as e:
            if e.args[0].code() not in MOVED or time.monotonic() > deadline:
                raise
            print(f"RETRY {p} {e}", flush=True)
            time.sleep(0.5)
MOVED = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
         KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TRANSPORT}
high = {p: high_watermark(p) for p in parts}
print(f"HIGH {high}", flush=True)
c.subscribe([topic])
pos = {p: 0 for p in parts}
deadline = time.monotonic() + timeout
n = 0
while any(pos[p] < high[p] for p in parts):
    if time.monotonic() > deadline:
        sys.exit(f"timed out: positions {pos}, high watermarks {high}")
    m = c.poll(1.0)
    if m is None:
        continue
    if m.error():
        if m.error().code() != KafkaError._PARTITION_EOF:
            print(f"ERROR {m.error()}", flush=True)
        continue
    print(f"V {m.partition()} {m.offset()} {m.value().decode()}")
    pos[m.partition()] = m.offset() + 1
    n += 1
c.commit(asynchronous=False)
c.close()
print(f"END {n}", flush=True)
"""


class BackgroundProducer:
    """PRODUCER running in a client pod through `kubectl exec`; the delivery reports are
    read as they come. `stop()` lets it flush and returns once it has said DONE."""

    def __init__(
        self,
        node: NodeHandle,
        ns: str,
        pod: str | None,
        bootstrap: str,
        topic: str,
        prefix: str,
        rate: float = 40,
        config: dict[str, str] | None = None,
    ) -> None:
        """pod None: the producer runs on the host, outside the pod network (clients of
        the external listeners); `config`: more librdkafka settings (security)."""
        self.node, self.ns, self.pod, self.prefix = node, ns, pod, prefix
        self.stop_file = f"/tmp/stop-{prefix}" if pod else str(node.work_dir / f"stop-{prefix}")
        if pod is None:
            Path(self.stop_file).unlink(missing_ok=True)
        self.acked: dict[str, tuple[int, int]] = {}
        self.ack_times: list[float] = []
        self.errors: list[str] = []
        self.fatal: list[str] = []
        self.other: list[str] = []
        self.done: str | None = None
        self.started = threading.Event()
        where = ["kubectl", "exec", "-n", ns, pod, "--", "python"] if pod else [sys.executable]
        args = [bootstrap, topic, prefix, str(rate), self.stop_file]
        self.proc = subprocess.Popen(
            [*where, "-u", "-c", PRODUCER, *args, *([json.dumps(config)] if config else [])],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=node.env,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            words = line.split()
            if not words:
                continue
            if words[0] == "ACK" and len(words) == 4:
                self.acked[words[1]] = (int(words[2]), int(words[3]))
                self.ack_times.append(time.monotonic())
            elif words[0] == "ERR":
                self.errors.append(line.strip())
            elif words[0] == "FATAL":
                self.fatal.append(line.strip())
            elif words[0] == "DONE":
                self.done = line.strip()
            elif words[0] == "STARTED":
                self.started.set()
            else:
                self.other.append(line.rstrip())

    def check(self) -> None:
        """Fails at once on a fatal producer error or a producer that exited early."""
        if self.fatal:
            raise AssertionError(f"producer {self.prefix}: fatal error: {self.fatal}")
        if self.proc.poll() is not None and self.done is None:
            raise AssertionError(
                f"producer {self.prefix} exited {self.proc.returncode} early: "
                + "\n".join(self.other[-30:])
            )

    def acks(self) -> int:
        return len(self.ack_times)

    def wait_for_acks(self, more: int, timeout: float, what: str) -> float:
        """Waits for `more` acknowledgements beyond the ones so far; returns seconds taken."""
        from waiting import wait_for

        t0 = time.monotonic()
        goal = self.acks() + more
        wait_for(
            lambda: self.acks() >= goal,
            timeout,
            f"{more} more acks ({what})",
            check=self.check,
            detail=lambda: f"{self.acks()}/{goal} acks, errors {self.errors[-3:]}",
        )
        return time.monotonic() - t0

    def stop(self, timeout: float = 300) -> str:
        if self.pod is None:
            Path(self.stop_file).touch()
        else:
            self.node.kubectl("exec", "-n", self.ns, self.pod, "--", "touch", self.stop_file)
        self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        if self.done is None:
            raise AssertionError(
                f"producer {self.prefix} exited {self.proc.returncode} without DONE: "
                + "\n".join(self.other[-30:])
            )
        self.check()
        return self.done


class ClientPod:
    """A long-lived pod of CLIENT_IMAGE in which the Kafka clients run (kubectl exec)."""

    def __init__(self, node: NodeHandle, ns: str, name: str = "kafka-client") -> None:
        self.node, self.ns, self.name = node, ns, name
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
                "containers": [
                    {
                        "name": "c",
                        "image": CLIENT_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["python", "-c", "import time; time.sleep(10**9)"],
                    }
                ],
            },
        }
        node.kubectl("apply", "-f", "-", input=json.dumps(pod))
        node.kubectl(
            "wait", "-n", ns, "--for=condition=Ready", f"pod/{name}", "--timeout=120s", timeout=150
        )

    def python(self, script: str, *args: str, timeout: float = 300) -> str:
        return self.node.kubectl(
            "exec",
            "-n",
            self.ns,
            self.name,
            "--",
            "python",
            "-u",
            "-c",
            script,
            *args,
            timeout=timeout,
        ).stdout

    def producer(
        self, bootstrap: str, topic: str, prefix: str, rate: float = 40
    ) -> BackgroundProducer:
        p = BackgroundProducer(self.node, self.ns, self.name, bootstrap, topic, prefix, rate)
        from waiting import wait_for

        wait_for(p.started.is_set, 60, f"producer {prefix} to start", check=p.check)
        return p

    def consume(
        self, bootstrap: str, topic: str, group: str, timeout: float = 240
    ) -> list[tuple[int, int, str]]:
        """(partition, offset, value) of every record up to the high watermarks."""
        out = self.python(CONSUMER, bootstrap, topic, group, str(timeout), timeout=timeout + 60)
        records = []
        for line in out.splitlines():
            if line.startswith("V "):
                _, p, o, v = line.split(" ", 3)
                records.append((int(p), int(o), v))
            elif line.startswith("ERROR"):
                print(f"consumer {group}: {line}", file=sys.stderr)
        assert out.rstrip().splitlines()[-1].startswith("END "), out[-2000:]
        return records


def consume_on_host(
    bootstrap: str, topic: str, group: str, config: dict[str, str], timeout: float = 240
) -> tuple[list[str], list[tuple[int, int, str]]]:
    """CONSUMER run on the host (an external listener's client): the brokers the
    metadata named, and (partition, offset, value) of every record."""
    args = [bootstrap, topic, group, str(timeout), json.dumps(config)]
    out = subprocess.run(
        [sys.executable, "-u", "-c", CONSUMER, *args],
        capture_output=True,
        text=True,
        timeout=timeout + 60,
    )
    assert out.returncode == 0 and out.stdout.rstrip().splitlines()[-1].startswith("END "), (
        out.stdout[-2000:] + out.stderr[-2000:]
    )
    brokers: list[str] = []
    records = []
    for line in out.stdout.splitlines():
        if line.startswith("BROKERS "):
            brokers = line.split()[1:]
        elif line.startswith("V "):
            _, p, o, v = line.split(" ", 3)
            records.append((int(p), int(o), v))
    return brokers, records


def assert_exactly_once(
    acked: dict[str, tuple[int, int]], records: list[tuple[int, int, str]], prefix: str
) -> None:
    """Every acknowledged value of `prefix` was read, at the partition and offset the
    acknowledgement named, and no value of `prefix` was read twice."""
    from collections import Counter

    ours = [(p, o, v) for p, o, v in records if v.startswith(prefix + "-")]
    counts = Counter(v for _, _, v in ours)
    dups = sorted(v for v, c in counts.items() if c > 1)
    where = {v: (p, o) for p, o, v in ours}
    lost = sorted(v for v in acked if v not in where)
    moved = sorted(v for v, po in acked.items() if v in where and where[v] != po)
    assert not lost, f"{len(lost)} acknowledged records lost, e.g. {lost[:10]}"
    assert not dups, f"{len(dups)} records duplicated, e.g. {dups[:10]}"
    assert not moved, (
        f"{len(moved)} records read at another offset than acknowledged, e.g. "
        f"{[(v, acked[v], where[v]) for v in moved[:5]]}"
    )
