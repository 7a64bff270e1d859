"""The operator against a real control plane (kube-apiserver, etcd, controller-manager,
scheduler, kwok nodes), installed with the real `helm`, driven with the real `kubectl`.

kwok fakes the kubelets, so pods become Ready but run nothing. Where a test needs the
pods' processes, `PodStandIns` plays the kubelet: for every broker or controller pod it
runs a local StraitMQ process with that pod's node id, restarts it when the pod is
replaced, and stops it when the pod goes. The operator reaches that cluster's admin
API through the MQCluster's `straitmq.io/admin-url` annotation.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cluster_support import BROKER_ARGS, CONTROLLER_ARGS, PYTHON, Workload, consume_all
from prometheus_client.parser import text_string_to_metric_families
from straitmq.cli.local_cluster import LocalCluster, Node, free_port
from test_metrics import check_served, dashboards
from waiting import wait_for

from straitmq.admin_client import AdminAuth, exchange_sync, request_sync

ROOT = Path(__file__).resolve().parent.parent
NS = "apps"
RELEASE_NS = "straitmq-system"
ZONE = "topology.kubernetes.io/zone"

pytestmark = pytest.mark.timeout(900)


def yaml_doc(obj: dict) -> str:
    return json.dumps(obj)  # JSON is YAML; kubectl reads either


def mqcluster(name: str, replicas: int = 3, annotations: dict | None = None, **spec: Any) -> dict:
    return {
        "apiVersion": "straitmq.io/v1alpha1",
        "kind": "MQCluster",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"image": "straitmq:test", "brokers": {"replicas": replicas}, **spec},
    }


def topic(name: str, cluster: str, partitions: int, rf: int = 3, **spec: Any) -> dict:
    return {
        "apiVersion": "straitmq.io/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": name},
        "spec": {"cluster": cluster, "partitions": partitions, "replicationFactor": rf, **spec},
    }


def get_json(kube: Any, *args: str) -> dict:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


def condition(obj: dict, type_: str) -> dict:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return {}


def http_json(url: str, method: str = "GET", timeout: float = 3.0) -> Any:
    return request_sync(url, method, "", timeout_s=timeout)


def assert_none_lost(
    w: Workload, bootstrap: str, topic: str, group: str, at_least: int = 1
) -> None:
    """Every message the (stopped) producer saw acknowledged is read back."""
    assert not w.fatal, w.fatal
    acked = dict(w.acked)
    got = consume_all(bootstrap, topic, group, len(acked))
    values = {v for _, _, v in got}
    lost = [v for v in acked if v not in values]
    assert len(acked) >= at_least and not lost, f"{len(lost)} of {len(acked)} acked lost"


# --- fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def installed(kube: Any) -> Any:
    """`helm install` of the chart: the CRDs and the operator's Deployment and RBAC."""
    kube.helm(
        "install",
        "straitmq",
        str(ROOT / "charts" / "straitmq"),
        "--namespace",
        RELEASE_NS,
        "--create-namespace",
        "--wait",
        "--timeout",
        "180s",
    )
    return kube


class Operator:
    def __init__(self, kube: Any, log_path: Path, namespace: str = NS) -> None:
        self.kube = kube
        self.namespace = namespace
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.log_path = log_path
        self.start()

    def start(self) -> None:
        """Start the process (again, after stop(): the same ports and log)."""
        kube = self.kube
        env = {
            **kube.env,
            "STRAITMQ_OPERATOR_BUSY_INTERVAL_S": "1",
            "STRAITMQ_OPERATOR_IDLE_INTERVAL_S": "4",
            # The node reader the chart installed, which the Deployment would name.
            "STRAITMQ_RACK_CLUSTER_ROLE": "straitmq-node-reader",
        }
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    PYTHON,
                    "-m",
                    "straitmq.operator",
                    "--namespace",
                    self.namespace,
                    "--metrics-port",
                    str(self.metrics_port),
                    "--health-port",
                    str(self.health_port),
                    "--log-level",
                    "info",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=3) as r:
            return r.read().decode()

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited: {self.log_lines()[-20:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1)
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def operator(installed: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    kube = installed
    kube.create_namespace(NS)
    op = Operator(kube, tmp_path_factory.mktemp("operator") / "operator.log")
    kube.wait_for(op.healthy, 60, "operator /healthz")
    yield op
    op.stop()


class PodStandIns:
    """The kubelet's part for one MQCluster: a local process per pod, by pod uid.

    A broker pod with init containers (rack awareness) gets them run first, as the
    kubelet would: the container's own command from the venv, its env with the downward
    API's spec.nodeName, its volume mounts mapped to a local folder, and a kubeconfig
    holding a token of the pod's ServiceAccount, so the RBAC is the pod's. The broker
    then starts with the --rack-file its container asks for, mapped the same way."""

    def __init__(
        self,
        kube: Any,
        cluster: str,
        data_dir: Path,
        first_controller_id: int = 1001,
        controller_pods: int = 3,
        releases: dict[str, str] | None = None,
    ) -> None:
        """`first_controller_id`: controller pod 0's node id (the operator numbers them
        1000 + ordinal; the older tests' stand-ins 1001 + ordinal, which the operator
        then leaves alone as a voter set it did not make). `controller_pods`: ordinals
        3 and up get a controller outside the static voters (an observer until added).
        `releases`: image tag -> the python of that release (scripts/build-releases.sh):
        each pod's process then runs the release its image names, and a pod whose tag is
        not there never starts (an image that cannot be pulled; kwok still calls the pod
        Ready)."""
        self.releases = releases
        self.kube = kube
        self.cluster = cluster
        self.data_dir = data_dir
        self.base_args: dict[int, list[str]] = {}  # ordinal -> arguments before any pod's
        self._retry_at: dict[str, float] = {}  # pod uid -> when to rerun failed init steps
        self.init_failures: list[tuple[str, str]] = []  # (pod, stderr tail)
        self.local = LocalCluster(
            str(data_dir),
            controllers=3,
            brokers=0,
            kafka_base=None,
            http_base=None,
            controller_base=None,
            broker_args=BROKER_ARGS,
            controller_args=CONTROLLER_ARGS,
            log_level="info",
            python=PYTHON,
            first_controller_id=first_controller_id,
        )
        self.first_controller_id = first_controller_id
        for ordinal in range(3, controller_pods):  # joins with its own --listen
            cid, port = first_controller_id + ordinal, free_port()
            args = [*self.local._controller_cmd(cid), "--listen", f"127.0.0.1:{port}"]
            log = str(data_dir / f"controller-{cid}.log")
            self.local.controllers[cid] = Node("controller", cid, args, log, port)
        # (kind, ordinal) whose storage is lost: wiped before its next start (a new PVC).
        self.lose_storage: set[tuple[str, int]] = set()
        # (kind, ordinal) whose process is not started again until taken out: a pod kept
        # down while kwok calls its replacement Ready at once.
        self.hold: set[tuple[str, int]] = set()
        for ordinal in range(5):  # ports fixed up front: the admin URL names broker 0's
            node = self.local.add_broker(ordinal, free_port(), free_port())
            self.base_args[ordinal] = list(node.args)
        self.running: dict[tuple[str, int], str] = {}  # -> pod uid
        self.history: list[tuple[float, str, str, int]] = []  # (t, start|stop, kind, ordinal)
        self.max_brokers_down = 0
        self.watch_down = False
        self._stop = threading.Event()
        self._api = kube.api_client()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        # A secured HTTP API (the MQCluster's http_secured): https, and who the tests are.
        self.scheme = "http"
        self.auth: AdminAuth | None = None

    @property
    def admin_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.local.brokers[0].http_port}"

    def node(self, kind: str, ordinal: int) -> Node:
        if kind == "controller":
            return self.local.controllers[self.first_controller_id + ordinal]
        return self.local.brokers[ordinal]

    @property
    def controller_urls(self) -> str:
        """The operator's controller-urls annotation: each controller pod's process."""
        return json.dumps(
            {
                str(cid - self.first_controller_id): f"http://127.0.0.1:{node.http_port}"
                for cid, node in self.local.controllers.items()
            }
        )

    def start(self) -> PodStandIns:
        self.thread.start()
        return self

    def _pods(self) -> list[Any]:
        from kubernetes import client

        core = client.CoreV1Api(self._api)
        sel = f"app.kubernetes.io/instance={self.cluster}"
        return core.list_namespaced_pod(NS, label_selector=sel).items

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._step()
                self._stop.wait(0.3)
        except BaseException as e:  # surfaced by check()
            self.error = e

    def _step(self) -> None:
        want: dict[tuple[str, int], str] = {}
        pods: dict[tuple[str, int], Any] = {}
        down = 0
        brokers_seen = 0
        for pod in self._pods():
            kind = pod.metadata.labels.get("app.kubernetes.io/component")
            ordinal = int(pod.metadata.name.rsplit("-", 1)[1])
            if kind == "broker":
                brokers_seen += 1
            if pod.metadata.deletion_timestamp is None:
                want[(kind, ordinal)] = pod.metadata.uid
                pods[(kind, ordinal)] = pod
            if kind == "broker" and (
                pod.metadata.deletion_timestamp is not None
                or not any(
                    c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or [])
                )
            ):
                down += 1
        if self.watch_down:
            sts = self._broker_replicas()
            down += max(0, sts - brokers_seen)  # deleted, not yet recreated
            self.max_brokers_down = max(self.max_brokers_down, down)
        for key, uid in list(self.running.items()):
            if want.get(key) != uid:
                self.node(*key).stop()
                del self.running[key]
                self.history.append((time.monotonic(), "stop", *key))
        for key, uid in want.items():
            if key not in self.running and key not in self.hold:
                if key[0] == "broker" and not self._init(pods[key]):
                    continue  # as a kubelet: the main container waits for its init steps
                if self.releases is not None:
                    (main,) = pods[key].spec.containers
                    python = self.releases.get(main.image.rsplit(":", 1)[-1])
                    if python is None:
                        continue  # no such image: the container never starts
                    self.local.run_as(self.node(*key), python)
                if key in self.lose_storage:  # a new PVC: an empty data directory
                    self.lose_storage.discard(key)
                    kind, ordinal = key
                    nid = self.first_controller_id + ordinal if kind == "controller" else ordinal
                    shutil.rmtree(self.data_dir / f"{kind}-{nid}", ignore_errors=True)
                self.node(*key).start()
                self.running[key] = uid
                self.history.append((time.monotonic(), "start", *key))

    def _mapped(self, ordinal: int, arg: str, mounts: list[Any]) -> str:
        local = self.data_dir / f"pod-volumes-{ordinal}"
        for m in mounts:
            if m.mount_path in arg:
                return arg.replace(m.mount_path, str(local / m.name))
        return arg

    def _init(self, pod: Any) -> bool:
        """Run the pod's init containers; True when the main container may start."""
        ordinal = int(pod.metadata.name.rsplit("-", 1)[1])
        node = self.local.brokers[ordinal]
        (main,) = pod.spec.containers
        extra = [
            self._mapped(ordinal, a, main.volume_mounts or [])
            for a in main.args
            if a.startswith("--rack-file=")
        ]
        node.args = [*self.base_args[ordinal], *extra]
        if not pod.spec.init_containers:
            return True
        if not pod.spec.node_name:
            return False  # not scheduled yet
        if time.monotonic() < self._retry_at.get(pod.metadata.uid, 0.0):
            return False  # back off after a failed init step, as the kubelet does
        cfg = self.data_dir / f"sa-{pod.spec.service_account_name}.kubeconfig"
        if not cfg.exists():
            self.kube.service_account_kubeconfig(NS, pod.spec.service_account_name, cfg)
        for c in pod.spec.init_containers:
            env = {"PATH": os.environ["PATH"], "KUBECONFIG": str(cfg)}
            for e in c.env or []:
                if e.value_from and e.value_from.field_ref:
                    assert e.value_from.field_ref.field_path == "spec.nodeName", e
                    env[e.name] = pod.spec.node_name
                else:
                    env[e.name] = e.value
            command = [str(Path(PYTHON).parent / c.command[0]), *c.command[1:]]
            args = [self._mapped(ordinal, a, c.volume_mounts or []) for a in c.args or []]
            done = subprocess.run(
                [*command, *args], env=env, capture_output=True, text=True, timeout=120
            )
            if done.returncode != 0:
                self.init_failures.append((pod.metadata.name, done.stderr[-500:]))
                self._retry_at[pod.metadata.uid] = time.monotonic() + 3.0
                return False
        return True

    def _broker_replicas(self) -> int:
        from kubernetes import client

        apps = client.AppsV1Api(self._api)
        return apps.read_namespaced_stateful_set(f"{self.cluster}-broker", NS).spec.replicas

    def in_sync(self) -> bool:
        """A process runs for every live pod, the current one (not a step behind, e.g.
        still in a broker pod's init step, when kwok already calls the pod Ready)."""
        live = {
            (
                p.metadata.labels.get("app.kubernetes.io/component"),
                int(p.metadata.name.rsplit("-", 1)[1]),
            ): p.metadata.uid
            for p in self._pods()
            if p.metadata.deletion_timestamp is None
        }
        return live == dict(self.running)

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"pod stand-ins failed: {self.error!r}")

    def topics(self) -> dict[str, dict]:
        for ordinal in (0, 1, 2):
            body = self.local.brokers[ordinal].get("/api/v1/topics?internal=true", timeout=3.0)
            if body is not None:
                return {t["name"]: t for t in body["topics"]}
        raise AssertionError("no broker answers the admin API")

    def replicas_on(self, brokers: set[int]) -> int:
        return sum(
            1
            for t in self.topics().values()
            for p in t["partitions"]
            for r in p["replicas"]
            if r in brokers
        )

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(60)
        self.local.stop()
        self._api.close()


@pytest.fixture(scope="module")
def demo(kube: Any, operator: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """MQCluster `demo` (3 brokers, rack-aware by zone), its pods backed by local StraitMQ
    processes."""
    standins = PodStandIns(kube, "demo", tmp_path_factory.mktemp("demo")).start()
    doc = mqcluster(
        "demo",
        3,
        {"straitmq.io/admin-url": standins.admin_url},
        brokers={"replicas": 3, "rack": {"topologyKey": ZONE}},
    )
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(doc))

    def ready() -> bool:
        standins.check()
        return (
            get_json(kube, "mqcluster", "demo", "-n", NS).get("status", {}).get("phase") == "Ready"
        )

    try:
        try:
            kube.wait_for(ready, 120, "MQCluster demo Ready")
        except TimeoutError as e:
            st = get_json(kube, "mqcluster", "demo", "-n", NS).get("status")
            tail = "\n".join(operator.log_lines()[-15:])
            raise AssertionError(
                f"{e}: status {st}; stand-ins {standins.history}; "
                f"init failures {standins.init_failures[-3:]}; {tail}"
            ) from e
        yield standins
    finally:
        standins.stop()


# --- the chart and the schemas -------------------------------------------------------


def test_helm_install_registers_crds_and_operator_rbac(installed: Any) -> None:
    kube = installed
    names = {
        c["metadata"]["name"]
        for c in get_json(kube, "crd", "-l", "app.kubernetes.io/part-of=straitmq")["items"]
    }
    assert {"mqclusters.straitmq.io", "topics.straitmq.io"} <= names
    for crd in ("mqclusters.straitmq.io", "topics.straitmq.io"):
        kube.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=30s")
    status = kube.helm("status", "straitmq", "-n", RELEASE_NS, "-o", "json")
    assert json.loads(status.stdout)["info"]["status"] == "deployed"
    deploy = get_json(kube, "deployment", "-n", RELEASE_NS, "-l", "app.kubernetes.io/name=straitmq")
    (dep,) = deploy["items"]
    sa = dep["spec"]["template"]["spec"]["serviceAccountName"]
    who = f"system:serviceaccount:{RELEASE_NS}:{sa}"

    def can(*args: str) -> bool:
        out = kube.kubectl("auth", "can-i", *args, f"--as={who}", check=False)
        return out.stdout.strip() == "yes"

    assert can("patch", "statefulsets.apps", "-n", NS)
    assert can("update", "topics.straitmq.io/status", "-n", NS)
    assert can("delete", "pods", "-n", NS)
    assert can("create", "secrets", "-n", NS)  # a User's credentials
    assert not can("list", "secrets", "-n", NS), "Secrets by name only"
    assert can("update", "users.straitmq.io/status", "-n", NS)
    assert not can("delete", "nodes")
    # Rack awareness: it may create bindings, but bind only the node reader to anyone.
    assert can("create", "clusterrolebindings.rbac.authorization.k8s.io")
    assert can("bind", "clusterroles.rbac.authorization.k8s.io/straitmq-node-reader")
    assert not can("bind", "clusterroles.rbac.authorization.k8s.io/cluster-admin")
    assert not can("escalate", "clusterroles.rbac.authorization.k8s.io")


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (mqcluster("two-voters", controllers={"replicas": 2}), "controllers"),
        (mqcluster("no-brokers", 0), "spec.brokers.replicas"),
        (topic("negative", "demo", -1), "spec.partitions"),
        (topic("bad-rf", "demo", 1, rf=0), "spec.replicationFactor"),
        ({**topic("no-cluster", "demo", 1), "spec": {"partitions": 1}}, "spec.cluster"),
        (
            mqcluster("acl-no-tls", authorization={"type": "simple"}),
            "authorization needs listeners.kafka.tls",
        ),
        (
            mqcluster(
                "scram-no-tls",
                listeners={"kafka": {"authentication": {"type": "scram-sha-512"}}},
            ),
            "listeners.kafka.authentication needs listeners.kafka.tls",
        ),
    ],
    ids=[
        "2-controllers",
        "0-brokers",
        "negative-partitions",
        "rf-0",
        "no-cluster",
        "authorization-without-tls",
        "authentication-without-tls",
    ],
)
def test_api_server_rejects_invalid_resources(installed: Any, doc: dict, message: str) -> None:
    out = installed.kubectl("apply", "-n", "default", "-f", "-", input=yaml_doc(doc), check=False)
    assert out.returncode != 0, f"accepted: {doc}"
    assert message in out.stderr, out.stderr


def test_cel_rules_guard_updates(installed: Any) -> None:
    kube = installed
    ns = "default"  # no operator watches it: only the API server's rules act here
    kube.kubectl("apply", "-n", ns, "-f", "-", input=yaml_doc(topic("frozen", "x", 4)))
    for patch, message in [
        ({"spec": {"partitions": 2}}, "partitions may not decrease"),
        ({"spec": {"cluster": "other"}}, "cluster is immutable"),
    ]:
        out = kube.kubectl(
            "patch",
            "topic",
            "frozen",
            "-n",
            ns,
            "--type=merge",
            "-p",
            json.dumps(patch),
            check=False,
        )
        assert out.returncode != 0 and message in out.stderr, out.stderr
    kube.kubectl(
        "patch", "topic", "frozen", "-n", ns, "--type=merge", "-p", '{"spec":{"partitions":8}}'
    )
    kube.kubectl("apply", "-n", ns, "-f", "-", input=yaml_doc(mqcluster("three")))
    out = kube.kubectl(
        "patch",
        "mqcluster",
        "three",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"controllers":{"replicas":4}}}',
        check=False,
    )
    assert out.returncode != 0 and "controllers" in out.stderr
    # 1, 3 or 5 voters: the operator changes the quorum one voter at a time.
    kube.kubectl(
        "patch",
        "mqcluster",
        "three",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"controllers":{"replicas":5}}}',
    )
    scaled = kube.kubectl("scale", "mqcluster", "three", "-n", ns, "--replicas=4")
    assert scaled.returncode == 0
    assert get_json(kube, "mqcluster", "three", "-n", ns)["spec"]["brokers"]["replicas"] == 4
    kube.kubectl("delete", "topic", "frozen", "-n", ns)
    kube.kubectl("delete", "mqcluster", "three", "-n", ns)


# --- what the operator makes ---------------------------------------------------------


def test_mqcluster_becomes_statefulsets_services_and_pdbs(kube: Any, operator: Operator) -> None:
    body = mqcluster(
        "shape",
        3,
        brokers={
            "replicas": 3,
            "storage": {"size": "2Gi"},
            "rack": {"topologyKey": "topology.kubernetes.io/zone"},
            "config": {"num.partitions": 6},
        },
    )
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(body))
    uid = get_json(kube, "mqcluster", "shape", "-n", NS)["metadata"]["uid"]

    def sts(component: str) -> dict:
        return get_json(kube, "statefulset", f"shape-{component}", "-n", NS)

    kube.wait_for(lambda: sts("broker") and sts("controller"), 60, "StatefulSets")
    for kind, name in [
        ("statefulset", "shape-broker"),
        ("statefulset", "shape-controller"),
        ("service", "shape-broker"),
        ("service", "shape-controller"),
        ("service", "shape-bootstrap"),
        ("configmap", "shape-config"),
        ("poddisruptionbudget", "shape-broker"),
        ("poddisruptionbudget", "shape-controller"),
        ("serviceaccount", "shape-broker"),
    ]:
        obj = get_json(kube, kind, name, "-n", NS)
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == uid and ref["kind"] == "MQCluster" and ref["controller"], name
    for svc in ("shape-broker", "shape-controller"):
        spec = get_json(kube, "service", svc, "-n", NS)["spec"]
        assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    voters = get_json(kube, "configmap", "shape-config", "-n", NS)["data"]
    assert voters["STRAIT_CONTROLLER_VOTERS"].startswith(
        f"1000@shape-controller-0.shape-controller.{NS}.svc:9093,"
    )
    broker = sts("broker")["spec"]
    (c,) = broker["template"]["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http", "scheme": "HTTP"}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "--num-partitions=6" in c["args"]
    # Clients get each broker at its own Service, the brokers each other at the pod name.
    assert (
        "--override=advertised.listeners="
        "REPLICATION://$(POD_NAME).shape-broker.$(POD_NAMESPACE).svc:9091,"
        "PLAINTEXT://$(POD_NAME).$(POD_NAMESPACE).svc:9092"
    ) in c["args"]
    for i in range(3):
        own = get_json(kube, "service", f"shape-broker-{i}", "-n", NS)
        assert own["spec"]["type"] == "ClusterIP" and own["spec"]["clusterIP"] != "None"
        assert not own["spec"].get("publishNotReadyAddresses")
        assert own["spec"]["selector"]["statefulset.kubernetes.io/pod-name"] == f"shape-broker-{i}"
        assert own["metadata"]["ownerReferences"][0]["uid"] == uid
    assert broker["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert sts("controller")["spec"]["replicas"] == 3
    # The real StatefulSet controller, scheduler, PV binder and kwok do the rest.
    kube.wait_for(
        lambda: (
            sts("broker").get("status", {}).get("readyReplicas") == 3
            and sts("controller").get("status", {}).get("readyReplicas") == 3
        ),
        120,
        "pods Ready on kwok nodes",
    )
    pods = get_json(kube, "pods", "-n", NS, "-l", "app.kubernetes.io/instance=shape")["items"]
    assert {p["metadata"]["name"] for p in pods} == {
        "shape-broker-0",
        "shape-broker-1",
        "shape-broker-2",
        "shape-controller-0",
        "shape-controller-1",
        "shape-controller-2",
    }
    pvcs = get_json(kube, "pvc", "-n", NS, "-l", "app.kubernetes.io/instance=shape")["items"]
    assert len(pvcs) == 6 and all(p["status"]["phase"] == "Bound" for p in pvcs)
    # Nothing answers at the bootstrap Service's DNS name here: the status says so.
    st = kube.wait_for(
        lambda: (
            (get_json(kube, "mqcluster", "shape", "-n", NS).get("status") or {}).get("conditions")
            and get_json(kube, "mqcluster", "shape", "-n", NS)["status"]
        ),
        30,
        "status",
    )
    assert st["brokers"]["selector"].startswith("app.kubernetes.io/name=straitmq")
    assert condition({"status": st}, "Ready")["status"] == "False"
    printed = kube.kubectl("get", "mqcluster", "shape", "-n", NS).stdout
    assert "BROKERS" in printed and "PHASE" in printed
    crb = f"straitmq-rack-{NS}-shape"  # cluster-scoped: no owner reference can reach it
    assert get_json(kube, "clusterrolebinding", crb)["subjects"][0]["name"] == "shape-broker"
    # Deleting the MQCluster lets the garbage collector remove everything it owns, and the
    # operator removes the rack binding when it sees the MQCluster gone (no finalizer).
    kube.kubectl("delete", "mqcluster", "shape", "-n", NS, "--wait=true", timeout=60)
    kube.wait_for(
        lambda: "NotFound" in kube.kubectl("get", "clusterrolebinding", crb, check=False).stderr,
        30,
        "rack binding deleted",
    )
    kube.wait_for(
        lambda: (
            kube.kubectl(
                "get",
                "statefulset,service,configmap,pdb,serviceaccount",
                "-n",
                NS,
                "-l",
                "app.kubernetes.io/instance=shape",
                "-o",
                "name",
            ).stdout.strip()
            == ""
        ),
        60,
        "owned objects garbage-collected",
    )


def test_controller_quorum_of_five_or_one_and_no_shrink_without_the_voter_set(
    kube: Any, operator: Operator
) -> None:
    """Five controllers: five pods, all five static voters, recorded as the first voter
    set. Asked for three while the quorum cannot be read (nothing answers the admin API
    here: kwok runs no process), the operator keeps all five pods: it shrinks the
    StatefulSet only below voters it has seen removed. One controller: one pod, one voter.
    (The voter changes themselves need running controllers: test_operator_logic's planner
    tests and the real-node tier cover them.)"""
    for name, count in (("quorum5", 5), ("quorum1", 1)):
        doc = mqcluster(name, 1, controllers={"replicas": count})
        kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(doc))

    def ctl(name: str) -> dict:
        return get_json(kube, "statefulset", f"{name}-controller", "-n", NS)

    def status(name: str) -> dict:
        return get_json(kube, "mqcluster", name, "-n", NS).get("status") or {}

    for name, count in (("quorum5", 5), ("quorum1", 1)):
        kube.wait_for(
            lambda name=name, count=count: (
                (status(name).get("controllers") or {}).get("initialVoters") == count
                and ctl(name)["spec"]["replicas"] == count
            ),
            60,
            f"{name}: {count} controllers",
        )
        voters = get_json(kube, "configmap", f"{name}-config", "-n", NS)["data"]
        got = [v.split("@")[0] for v in voters["STRAIT_CONTROLLER_VOTERS"].split(",")]
        assert got == [str(1000 + i) for i in range(count)], got
    kube.wait_for(
        lambda: (ctl("quorum5").get("status") or {}).get("readyReplicas") == 5,
        120,
        "five controller pods Ready on kwok nodes",
    )
    hash_before = ctl("quorum5")["spec"]["template"]["metadata"]["annotations"]
    gen = get_json(kube, "mqcluster", "quorum5", "-n", NS)["metadata"]["generation"]
    kube.kubectl(
        "patch",
        "mqcluster",
        "quorum5",
        "-n",
        NS,
        "--type=merge",
        "-p",
        '{"spec":{"controllers":{"replicas":3}}}',
    )
    st = kube.wait_for(
        lambda: (
            status("quorum5").get("observedGeneration", 0) > gen
            and status("quorum5").get("controllers", {}).get("message")
            and status("quorum5")
        ),
        60,
        "the scale down seen",
    )
    assert "quorum status" in st["controllers"]["message"], st["controllers"]
    assert st["controllers"]["initialVoters"] == 5 and st["controllers"]["replicas"] == 5
    # That pass applied the StatefulSets: still five pods, the same pod template (no
    # roll), the static voters the first set's.
    assert ctl("quorum5")["spec"]["replicas"] == 5
    assert ctl("quorum5")["spec"]["template"]["metadata"]["annotations"] == hash_before
    voters = get_json(kube, "configmap", "quorum5-config", "-n", NS)["data"]
    assert len(voters["STRAIT_CONTROLLER_VOTERS"].split(",")) == 5
    for name in ("quorum5", "quorum1"):
        kube.kubectl("delete", "mqcluster", name, "-n", NS, "--wait=true", timeout=60)
        release_claims(kube, name)


def release_claims(kube: Any, cluster: str) -> None:
    """Delete a deleted MQCluster's volume claims (Retained: no owner removes them), so
    their volumes go back to the test pool for the later tests."""
    kube.kubectl(
        "delete",
        "pvc",
        "-n",
        NS,
        "-l",
        f"app.kubernetes.io/instance={cluster}",
        "--wait=true",
        timeout=120,
    )


def test_operator_grows_shrinks_and_heals_the_controller_quorum(
    kube: Any, operator: Operator, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A controller back on empty storage while the quorum never changed, then 3 -> 5 -> 3
    voters, then a controller back on empty storage again, with local controller
    processes standing in for the controller pods (ids 1000 + ordinal, as the operator
    numbers them; pods 3 and 4 start outside the static voters, as observers). The
    operator scales the StatefulSet, asks each pod's process (the controller-urls
    annotation) and changes the voter set through the broker's admin API, one voter at a
    time. Not here: a real PVC's loss (the stand-in wipes the pod's data directory when
    the pod is replaced) and clients producing throughout (the real-node tier)."""
    standins = PodStandIns(
        kube,
        "quorum",
        tmp_path_factory.mktemp("quorum"),
        first_controller_id=1000,
        controller_pods=5,
    ).start()
    annotations = {
        "straitmq.io/admin-url": standins.admin_url,
        "straitmq.io/controller-urls": standins.controller_urls,
    }
    doc = mqcluster("quorum", 1, annotations, controllers={"replicas": 3})

    def status() -> dict:
        standins.check()
        return get_json(kube, "mqcluster", "quorum", "-n", NS).get("status") or {}

    def voters() -> dict[int, str | None]:
        ctl = status().get("controllers") or {}
        return {v["id"]: v.get("directoryId") for v in ctl.get("voters") or []}

    def settled(ids: set[int]) -> bool:
        st = status()
        ctl = st.get("controllers") or {}
        sts = get_json(kube, "statefulset", "quorum-controller", "-n", NS)["spec"]["replicas"]
        return (
            set(voters()) == ids
            and ctl.get("change") is None
            and sts == len(ids)
            and len(standins_running(standins)) == len(ids)
        )

    def patch(replicas: int) -> None:
        body = json.dumps({"spec": {"controllers": {"replicas": replicas}}})
        kube.kubectl("patch", "mqcluster", "quorum", "-n", NS, "--type=merge", "-p", body)

    def replace_lost_storage(ordinal: int, before: dict[int, str | None]) -> None:
        """The pod's storage is lost: it comes back empty, with a new directory id; the
        operator replaces the voter (remove the old storage, add the new once caught up)."""
        cid = 1000 + ordinal
        standins.lose_storage.add(("controller", ordinal))
        # (not waiting for it to go: the stand-in's termination can be slow under load)
        kube.kubectl("delete", "pod", f"quorum-controller-{ordinal}", "-n", NS, "--wait=false")
        kube.wait_for(
            lambda: voters().get(cid) not in (None, before[cid]) and settled({1000, 1001, 1002}),
            240,
            f"controller {cid} replaced on its new storage",
        )

    def explain(what: str) -> str:
        tail = "\n".join(operator.log_lines()[-10:])
        return f"{what}: status {status()}; stand-ins {standins.history[-6:]}; {tail}"

    try:
        kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(doc))
        try:
            kube.wait_for(
                lambda: status().get("phase") == "Ready" and settled({1000, 1001, 1002}),
                180,
                "three voters",
            )
            # A quorum that never changed (the static voters of the pods' flags): its
            # leader pins the voters' directory ids by itself, so a controller back on
            # empty storage is new storage, replaced as for any voter.
            kube.wait_for(lambda: all(voters().values()), 60, "the static voters pinned")
            first = voters()
            replace_lost_storage(2, first)
            assert voters()[1000] == first[1000] and voters()[1001] == first[1001]
            patch(5)
            kube.wait_for(lambda: settled(set(range(1000, 1005))), 240, "five voters")
            assert status()["controllers"]["initialVoters"] == 3
            patch(3)
            kube.wait_for(lambda: settled({1000, 1001, 1002}), 240, "three voters again")
            # Every change pinned the voters' storage: each has its directory id now.
            old = voters()
            assert all(old.values()), old
            # Controller 1's storage is lost: its pod comes back empty, with a new
            # directory id; the operator replaces the voter (remove the old storage, add
            # the new once it has caught up).
            replace_lost_storage(1, old)
        except TimeoutError as e:
            raise AssertionError(explain(str(e))) from e
        assert voters()[1000] == old[1000] and voters()[1002] == old[1002]
        reasons = [
            e["reason"]
            for e in get_json(kube, "events", "-n", NS)["items"]
            if e["involvedObject"]["name"] == "quorum"
        ]
        assert "VoterAdded" in reasons and "VoterRemoved" in reasons, reasons
        # The quorum still commits metadata.
        body = {"name": "after-quorum-changes", "partitions": 1, "replication_factor": 1}
        request_sync(standins.admin_url, "POST", "/api/v1/topics", body, 30)
    finally:
        kube.kubectl("delete", "mqcluster", "quorum", "-n", NS, "--wait=true", timeout=60)
        standins.stop()
        release_claims(kube, "quorum")


def standins_running(standins: PodStandIns) -> list[tuple[str, int]]:
    return [key for key in list(standins.running) if key[0] == "controller"]


def test_spec_the_schema_allows_but_the_operator_cannot_run_is_a_condition(
    kube: Any, operator: Operator
) -> None:
    body = mqcluster("typo", brokers={"replicas": 3, "config": {"log.dirz": "/x"}})
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(body))

    def degraded() -> dict | None:
        c = condition(get_json(kube, "mqcluster", "typo", "-n", NS), "Degraded")
        return c if c.get("reason") == "InvalidSpec" else None

    c = kube.wait_for(degraded, 60, "InvalidSpec condition")
    assert c["status"] == "True" and "log.dirz is not a broker config" in c["message"]
    events = kube.kubectl(
        "get", "events", "-n", NS, "--field-selector", "involvedObject.name=typo"
    ).stdout
    assert "InvalidSpec" in events
    out = kube.kubectl("get", "statefulset", "typo-broker", "-n", NS, check=False)
    assert out.returncode != 0, "nothing is created from a spec the operator refused"
    kube.kubectl("delete", "mqcluster", "typo", "-n", NS)


# --- a real StraitMQ cluster behind the pods -----------------------------------------


def test_topic_from_examples_is_created_and_listed(kube: Any, demo: PodStandIns) -> None:
    kube.kubectl("apply", "-n", NS, "-f", str(ROOT / "examples" / "open" / "topic.yaml"))
    spec = get_json(kube, "topic", "orders", "-n", NS)["spec"]

    def ready() -> dict | None:
        demo.check()
        t = get_json(kube, "topic", "orders", "-n", NS)
        return t if condition(t, "Ready").get("status") == "True" else None

    kube.wait_for(ready, 60, "Topic orders Ready")
    made = demo.topics()["orders"]
    assert len(made["partitions"]) == spec["partitions"]
    assert made["replication_factor"] == spec["replicationFactor"]
    for k, v in (spec.get("config") or {}).items():
        assert made["configs"][k] == str(v)
    listed = kube.kubectl("get", "topics", "-n", NS).stdout.splitlines()
    row = next(line.split() for line in listed if line.startswith("orders "))
    header = listed[0].split()
    assert row[header.index("READY")] == "True"
    assert row[header.index("PARTITIONS")] == str(spec["partitions"])
    # ISR health, from the cluster's metadata at the operator's last pass.
    assert row[header.index("URP")] == "0" and row[header.index("UNDERMINISR")] == "0"
    wide = kube.kubectl("get", "topic", "orders", "-n", NS, "-o", "wide").stdout.splitlines()
    assert wide[1].split()[wide[0].split().index("MINISR")] == "2"


def test_brokers_take_their_rack_from_their_node(kube: Any, demo: PodStandIns) -> None:
    """Each broker registered the zone of the node its pod was scheduled on, read by the
    pod's init step with the pod's own ServiceAccount through the binding the operator
    made; the pods were spread over the zones."""
    zones = {
        x["metadata"]["name"]: x["metadata"]["labels"][ZONE]
        for x in get_json(kube, "nodes")["items"]
    }
    sel = "app.kubernetes.io/instance=demo,app.kubernetes.io/component=broker"
    pods = get_json(kube, "pods", "-n", NS, "-l", sel)["items"]
    want = {
        int(p["metadata"]["name"].rsplit("-", 1)[1]): zones[p["spec"]["nodeName"]] for p in pods
    }
    assert sorted(want) == [0, 1, 2] and sorted(want.values()) == sorted(set(zones.values()))
    for p in pods:
        assert [c["name"] for c in p["spec"]["initContainers"]] == ["rack"]
        assert p["spec"]["serviceAccountName"] == "demo-broker"

    def registered() -> dict | None:
        brokers = http_json(f"{demo.admin_url}/api/v1/cluster")["brokers"]
        got = {b["id"]: b["rack"] for b in brokers if b["id"] in want}
        return got if got == want else None

    kube.wait_for(registered, 30, f"brokers registered with racks {want}")
    assert not demo.init_failures, demo.init_failures
    crb = get_json(kube, "clusterrolebinding", f"straitmq-rack-{NS}-demo")
    assert crb["roleRef"]["name"] == "straitmq-node-reader"
    sa = get_json(kube, "serviceaccount", "demo-broker", "-n", NS)
    assert sa["metadata"]["ownerReferences"][0]["kind"] == "MQCluster"


def test_scale_up_then_down_moves_partitions_and_loses_nothing(
    kube: Any, demo: PodStandIns
) -> None:
    parts = len(demo.topics()["orders"]["partitions"])
    bootstrap = ",".join(f"127.0.0.1:{demo.local.brokers[i].kafka_port}" for i in range(3))
    w = Workload(bootstrap, "orders", partitions=parts, rate=150).start()
    try:
        kube.wait_for(lambda: w.acked_count() > 200, 60, "first acks")
        # 3 -> 5: the StatefulSet grows; once brokers 3 and 4 serve, partitions move.
        kube.kubectl("scale", "mqcluster", "demo", "-n", NS, "--replicas=5")

        def spread() -> bool:
            demo.check()
            st = get_json(kube, "mqcluster", "demo", "-n", NS).get("status") or {}
            return (
                st.get("phase") == "Ready"
                and not st.get("scaling")
                and demo.replicas_on({3}) > 0
                and demo.replicas_on({4}) > 0
            )

        kube.wait_for(spread, 180, "partitions spread onto brokers 3 and 4")
        assert get_json(kube, "statefulset", "demo-broker", "-n", NS)["spec"]["replicas"] == 5
        events = kube.kubectl(
            "get", "events", "-n", NS, "--field-selector", "involvedObject.name=demo"
        ).stdout
        assert "Rebalancing" in events and "ScaledUp" in events

        # 5 -> 2 would leave `orders` (RF 3) short of brokers: refused, with the reason.
        kube.kubectl("scale", "mqcluster", "demo", "-n", NS, "--replicas=2")
        generation = get_json(kube, "mqcluster", "demo", "-n", NS)["metadata"]["generation"]

        def refused() -> dict | None:
            c = condition(get_json(kube, "mqcluster", "demo", "-n", NS), "Degraded")
            # observedGeneration: the pass that saw replicas=2, not an older condition.
            ok = c.get("reason") == "ScaleDownRefused" and c.get("observedGeneration") == generation
            return c if ok else None

        c = kube.wait_for(refused, 60, "ScaleDownRefused")
        assert c["status"] == "True" and "'orders'" in c["message"] and "3" in c["message"]

        # The refusing pass left the StatefulSet at 5; so must the passes after it. Each
        # pass that refuses posts an Event: watch the StatefulSet until two more have.
        def refusals() -> int:
            events = get_json(
                kube,
                "events",
                "-n",
                NS,
                "--field-selector",
                "involvedObject.kind=MQCluster,involvedObject.name=demo,reason=ScaleDownRefused",
            )["items"]
            return sum(e.get("count") or 1 for e in events)

        def still_five() -> None:
            demo.check()
            replicas = get_json(kube, "statefulset", "demo-broker", "-n", NS)["spec"]["replicas"]
            assert replicas == 5, f"a refused scale-down changed the StatefulSet to {replicas}"

        before = refusals()
        wait_for(
            lambda: refusals() >= before + 2,
            30,
            "two more passes refusing the scale-down",
            0.25,
            check=still_five,
        )
        still_five()

        # 5 -> 3: brokers 4 and 3 are drained first; only then does the StatefulSet shrink.
        kube.kubectl("scale", "mqcluster", "demo", "-n", NS, "--replicas=3")

        def shrunk() -> bool:
            demo.check()
            replicas = get_json(kube, "statefulset", "demo-broker", "-n", NS)["spec"]["replicas"]
            if replicas == 3:
                assert demo.replicas_on({3, 4}) == 0, "shrank before brokers 3, 4 were drained"
                return True
            assert replicas == 5, replicas
            return False

        def stuck() -> str:
            status = get_json(kube, "mqcluster", "demo", "-n", NS).get("status")
            try:
                moving = http_json(f"{demo.admin_url}/api/v1/reassignments")
            except Exception as e:  # only a detail for the message
                moving = repr(e)
            return f"status {status}; reassignments {moving}; stand-ins {demo.history[-8:]}"

        # Not kube.wait_for: that one retries on exceptions, these assertions must fail.
        wait_for(
            shrunk, 180, "the StatefulSet to shrink to 3", 0.2, check=kube.check_alive, detail=stuck
        )
        kube.wait_for(
            lambda: get_json(kube, "mqcluster", "demo", "-n", NS)["status"].get("phase") == "Ready",
            120,
            "Ready at 3 brokers",
        )
        kube.wait_for(
            lambda: (
                {3, 4}
                <= {o for _, what, kind, o in demo.history if what == "stop" and kind == "broker"}
            ),
            60,
            "the processes behind pods 3 and 4 stopped",
        )
    finally:
        w.stop()
    assert_none_lost(w, bootstrap, "orders", "verify-scale", at_least=500)


def test_topic_partitions_config_drift_and_delete(kube: Any, demo: PodStandIns) -> None:
    patch = {"spec": {"partitions": 6, "config": {"retention.ms": "3600000"}}}
    kube.kubectl("patch", "topic", "orders", "-n", NS, "--type=merge", "-p", json.dumps(patch))
    kube.wait_for(
        lambda: (
            len(demo.topics()["orders"]["partitions"]) == 6
            and demo.topics()["orders"]["configs"].get("retention.ms") == "3600000"
        ),
        60,
        "orders at 6 partitions with the new retention",
    )
    kube.wait_for(
        lambda: get_json(kube, "topic", "orders", "-n", NS)["status"].get("partitions") == 6,
        30,
        "status.partitions 6",
    )
    # Drift: a topic deleted behind the operator's back comes back on the next pass.
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(topic("audit", "demo", 2)))
    kube.wait_for(lambda: "audit" in demo.topics(), 60, "audit created")
    http_json(f"{demo.admin_url}/api/v1/topics/audit", method="DELETE")
    kube.wait_for(lambda: "audit" in demo.topics(), 60, "audit re-created after drift")
    # kubectl delete: the resource goes at once (no finalizer); the MQCluster's pass,
    # woken by the deletion, deletes the topic from StraitMQ.
    kube.kubectl("delete", "topic", "audit", "-n", NS, "--wait=true", timeout=60)
    kube.wait_for(lambda: "audit" not in demo.topics(), 30, "audit deleted")
    out = kube.kubectl("get", "topic", "audit", "-n", NS, check=False)
    assert out.returncode != 0 and "NotFound" in out.stderr


@pytest.mark.parametrize(
    ("doc", "reason", "words"),
    [
        (topic("too-wide", "demo", 1, rf=7), "InvalidReplicationFactor", "replication factor"),
        (topic("orphan", "nowhere", 1), "ClusterNotFound", "nowhere"),
    ],
    ids=["rf-above-brokers", "unknown-cluster"],
)
def test_impossible_topic_gets_a_condition_and_an_event(
    kube: Any, demo: PodStandIns, doc: dict, reason: str, words: str
) -> None:
    name = doc["metadata"]["name"]
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(doc))

    def failed() -> dict | None:
        c = condition(get_json(kube, "topic", name, "-n", NS), "Ready")
        return c if c.get("reason") == reason else None

    c = kube.wait_for(failed, 60, f"{name}: {reason}")
    assert c["status"] == "False" and words in c["message"].lower(), c
    events = kube.kubectl(
        "get", "events", "-n", NS, "--field-selector", f"involvedObject.name={name}"
    ).stdout
    assert reason in events
    assert name not in demo.topics()
    kube.kubectl("delete", "topic", name, "-n", NS, "--wait=true", timeout=60)


def test_replication_factor_change_moves_replicas_and_loses_nothing(
    kube: Any, demo: PodStandIns
) -> None:
    """RF 2 -> 3 under an acks=all producer adds a replica to each partition (throttled
    reassignment, rack-aware); RF 4 (above the 3 brokers) and RF 1 (below min ISR 2) are
    refused with their reasons; RF 3 -> 2 drops a replica and keeps every leader."""
    doc = topic("rf", "demo", 3, rf=2, config={"min.insync.replicas": 2})
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(doc))

    def status() -> dict:
        return get_json(kube, "topic", "rf", "-n", NS).get("status") or {}

    def settled(rf: int) -> dict | None:
        demo.check()
        t = demo.topics().get("rf")
        st = status()
        if t is None or condition({"status": st}, "Progressing").get("status") == "True":
            return None
        ok = all(
            len(p["replicas"]) == rf
            and len(p["isr"]) == rf
            and not p.get("adding")
            and not p.get("removing")
            for p in t["partitions"]
        )
        return t if ok and st.get("reassigningPartitions") == 0 else None

    kube.wait_for(lambda: settled(2), 60, "rf created with 2 replicas")
    bootstrap = ",".join(f"127.0.0.1:{demo.local.brokers[i].kafka_port}" for i in range(3))
    w = Workload(bootstrap, "rf", partitions=3, rate=150).start()
    try:
        kube.wait_for(lambda: w.acked_count() > 150, 60, "first acks")
        kube.kubectl(
            "patch",
            "topic",
            "rf",
            "-n",
            NS,
            "--type=merge",
            "-p",
            '{"spec":{"replicationFactor":3}}',
        )
        t = kube.wait_for(lambda: settled(3), 120, "every partition at 3 in-sync replicas")
        for p in t["partitions"]:  # one replica per zone: brokers 0-2 sit in zones a-c
            assert sorted(p["replicas"]) == [0, 1, 2], p
        assert status()["replicationFactor"] == 3
        events = kube.kubectl(
            "get", "events", "-n", NS, "--field-selector", "involvedObject.name=rf"
        ).stdout
        assert "ReplicationFactorChanging" in events and "ReplicationFactorChanged" in events

        for rf, reason in ((4, "InvalidReplicationFactor"), (1, "ReplicationFactorBelowMinInsync")):
            kube.kubectl(
                "patch",
                "topic",
                "rf",
                "-n",
                NS,
                "--type=merge",
                "-p",
                json.dumps({"spec": {"replicationFactor": rf}}),
            )
            c = kube.wait_for(
                lambda r=reason: (
                    (c := condition(get_json(kube, "topic", "rf", "-n", NS), "Ready")).get("reason")
                    == r
                    and c
                ),
                60,
                reason,
            )
            assert c["status"] == "False", c
            assert all(len(p["replicas"]) == 3 for p in demo.topics()["rf"]["partitions"])

        leaders = {p["partition"]: p["leader"] for p in demo.topics()["rf"]["partitions"]}
        kube.kubectl(
            "patch",
            "topic",
            "rf",
            "-n",
            NS,
            "--type=merge",
            "-p",
            '{"spec":{"replicationFactor":2}}',
        )
        t = kube.wait_for(lambda: settled(2), 120, "back to 2 replicas")
        assert {p["partition"]: p["leader"] for p in t["partitions"]} == leaders
        assert condition({"status": status()}, "Ready")["status"] == "True"
    finally:
        w.stop()
    assert_none_lost(w, bootstrap, "rf", "verify-rf", at_least=150)
    kube.kubectl("delete", "topic", "rf", "-n", NS, "--wait=true", timeout=60)


def test_config_change_rolls_one_pod_at_a_time(kube: Any, demo: PodStandIns) -> None:
    parts = len(demo.topics()["orders"]["partitions"])
    bootstrap = ",".join(f"127.0.0.1:{demo.local.brokers[i].kafka_port}" for i in range(3))
    before = {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in get_json(kube, "pods", "-n", NS, "-l", "app.kubernetes.io/instance=demo")["items"]
    }
    w = Workload(bootstrap, "orders", partitions=parts, prefix="roll", rate=150).start()
    t0 = time.monotonic()
    try:
        kube.wait_for(lambda: w.acked_count() > 100, 60, "acks before the roll")
        demo.watch_down = True
        patch = {"spec": {"brokers": {"config": {"message.max.bytes": 2000000}}}}
        kube.kubectl(
            "patch", "mqcluster", "demo", "-n", NS, "--type=merge", "-p", json.dumps(patch)
        )

        def rolled() -> bool:
            demo.check()
            pods = get_json(kube, "pods", "-n", NS, "-l", "app.kubernetes.io/instance=demo")
            uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods["items"]}
            st = get_json(kube, "mqcluster", "demo", "-n", NS)["status"]
            return (
                len(uids) == 6
                and all(uids[n] != before[n] for n in before)
                and st.get("phase") == "Ready"
            )

        try:
            kube.wait_for(rolled, 300, "every pod replaced and the cluster Ready")
        except TimeoutError as e:  # say where it stuck
            st = get_json(kube, "mqcluster", "demo", "-n", NS).get("status")
            raise AssertionError(f"{e}: status {st}; stand-ins {demo.history[-12:]}") from e
    finally:
        demo.watch_down = False
        w.stop()
    restarts = sorted(
        (t, kind, o) for t, what, kind, o in demo.history if what == "start" and t > t0
    )
    kinds = [kind for _, kind, _ in restarts]
    # Controllers first, then brokers, every pod at least once (`rolled` saw new uids).
    # Not "exactly once": a stand-in's restart the roll did not ask for is not the
    # operator's doing; the order and the one-broker-down bound are.
    seen = f"restarts {[(round(t - t0, 1), k, o) for t, k, o in restarts]}"
    assert kinds == sorted(kinds, key=lambda k: k != "controller"), seen
    assert {(k, o) for _, k, o in restarts} == {
        (k, o) for k in ("controller", "broker") for o in range(3)
    }, seen
    assert demo.max_brokers_down <= 1, f"{demo.max_brokers_down} brokers down at once"
    sts = get_json(kube, "statefulset", "demo-broker", "-n", NS)["spec"]
    (c,) = sts["template"]["spec"]["containers"]
    assert "--message-max-bytes=2000000" in c["args"]
    assert_none_lost(w, bootstrap, "orders", "verify-roll")


PAUSE = "straitmq.io/pause-reconciliation"
ROLL = "straitmq.io/manual-rolling-update"


class StatusWatch:
    """Every status the operator writes on one MQCluster, from a watch (no polling gap):
    (phase, Ready condition's status, Degraded condition's reason when True)."""

    def __init__(self, kube: Any, name: str) -> None:
        self.name = name
        self.seen: list[tuple[str | None, str | None, str | None]] = []
        self._api = kube.api_client()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from kubernetes import client, watch

        custom = client.CustomObjectsApi(self._api)
        while not self._stop.is_set():
            w = watch.Watch()
            for ev in w.stream(
                custom.list_namespaced_custom_object,
                "straitmq.io",
                "v1alpha1",
                NS,
                "mqclusters",
                field_selector=f"metadata.name={self.name}",
                timeout_seconds=5,
            ):
                obj = ev["object"]
                degraded = condition(obj, "Degraded")
                self.seen.append(
                    (
                        (obj.get("status") or {}).get("phase"),
                        condition(obj, "Ready").get("status"),
                        degraded.get("reason") if degraded.get("status") == "True" else None,
                    )
                )
                if self._stop.is_set():
                    w.stop()

    def stop(self) -> list[tuple[str | None, str | None, str | None]]:
        self._stop.set()
        self.thread.join(30)
        self._api.close()
        return self.seen


def pod_uids(kube: Any, cluster: str) -> dict[str, str]:
    pods = get_json(kube, "pods", "-n", NS, "-l", f"app.kubernetes.io/instance={cluster}")
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in pods["items"]
        if not p["metadata"].get("deletionTimestamp")
    }


def wait_ready(kube: Any, demo: PodStandIns, what: str, timeout: float = 300) -> None:
    def ready() -> bool:
        demo.check()
        phase = get_json(kube, "mqcluster", "demo", "-n", NS)["status"].get("phase")
        return phase == "Ready" and demo.in_sync()

    try:
        kube.wait_for(ready, timeout, what)
    except TimeoutError as e:
        st = get_json(kube, "mqcluster", "demo", "-n", NS).get("status")
        raise AssertionError(f"{e}: status {st}; stand-ins {demo.history[-12:]}") from e


def test_paused_cluster_ignores_a_spec_change_until_unpaused(kube: Any, demo: PodStandIns) -> None:
    kube.kubectl("annotate", "mqcluster", "demo", "-n", NS, f"{PAUSE}=true")

    def paused() -> dict | None:
        mq = get_json(kube, "mqcluster", "demo", "-n", NS)
        c = condition(mq, "ReconciliationPaused")
        return mq if mq["status"].get("phase") == "Paused" and c.get("status") == "True" else None

    kube.wait_for(paused, 60, "MQCluster demo Paused")
    before = get_json(kube, "statefulset", "demo-broker", "-n", NS)
    uids = pod_uids(kube, "demo")
    patch = {"spec": {"brokers": {"config": {"message.max.bytes": 3000000}}}}
    kube.kubectl("patch", "mqcluster", "demo", "-n", NS, "--type=merge", "-p", json.dumps(patch))
    gen = get_json(kube, "mqcluster", "demo", "-n", NS)["metadata"]["generation"]

    # The operator has seen the new generation, and left it: its condition says which.
    def seen_paused() -> dict | None:
        mq = paused()
        c = condition(mq, "ReconciliationPaused") if mq else {}
        return mq if c.get("observedGeneration") == gen else None

    mq = kube.wait_for(seen_paused, 60, "the paused pass over the new generation")
    assert mq["status"]["observedGeneration"] < gen
    assert f"generation {gen} not applied" in condition(mq, "ReconciliationPaused")["message"]
    after = get_json(kube, "statefulset", "demo-broker", "-n", NS)
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    (c,) = after["spec"]["template"]["spec"]["containers"]
    assert "--message-max-bytes=3000000" not in c["args"]
    assert pod_uids(kube, "demo") == uids

    # Unpaused: the change is applied, as a roll that shows `Rolling` (never Degraded
    # PodsNotReady) until its last pod is back.
    watch = StatusWatch(kube, "demo")
    demo.watch_down = True
    demo.max_brokers_down = 0
    try:
        kube.kubectl("annotate", "mqcluster", "demo", "-n", NS, f"{PAUSE}-")

        def applied() -> bool:
            now = pod_uids(kube, "demo")
            return len(now) == 6 and all(now[n] != uids[n] for n in uids)

        kube.wait_for(applied, 300, "every pod replaced after unpausing")
        wait_ready(kube, demo, "MQCluster demo Ready after the roll")
    finally:
        demo.watch_down = False
        seen = watch.stop()
    mq = get_json(kube, "mqcluster", "demo", "-n", NS)
    assert mq["status"]["observedGeneration"] == gen
    assert condition(mq, "ReconciliationPaused") == {}
    (c,) = get_json(kube, "statefulset", "demo-broker", "-n", NS)["spec"]["template"]["spec"][
        "containers"
    ]
    assert "--message-max-bytes=3000000" in c["args"]
    phases = [p for p, _, _ in seen]
    assert "Rolling" in phases, seen
    assert not [s for s in seen if s[2] == "PodsNotReady"], seen
    assert demo.max_brokers_down <= 1


def test_paused_topic_is_not_created_until_unpaused(kube: Any, demo: PodStandIns) -> None:
    doc = topic("held", "demo", 1)
    doc["metadata"]["annotations"] = {PAUSE: "true"}
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(doc))

    def paused() -> bool:
        t = get_json(kube, "topic", "held", "-n", NS)
        return condition(t, "ReconciliationPaused").get("status") == "True"

    kube.wait_for(paused, 60, "Topic held paused")
    assert "held" not in demo.topics()
    kube.kubectl("annotate", "topic", "held", "-n", NS, f"{PAUSE}-")
    kube.wait_for(lambda: "held" in demo.topics(), 60, "held created once unpaused")

    def ready() -> dict | None:
        t = get_json(kube, "topic", "held", "-n", NS)
        return t if condition(t, "Ready").get("status") == "True" else None

    t = kube.wait_for(ready, 60, "Topic held Ready")
    assert condition(t, "ReconciliationPaused") == {}
    kube.kubectl("delete", "topic", "held", "-n", NS, "--wait=true", timeout=60)
    kube.wait_for(lambda: "held" not in demo.topics(), 60, "held deleted")


def test_manual_rolling_update_of_one_pod_then_of_all(kube: Any, demo: PodStandIns) -> None:
    before = pod_uids(kube, "demo")
    kube.kubectl("annotate", "pod", "demo-broker-1", "-n", NS, f"{ROLL}=true")
    kube.wait_for(
        lambda: pod_uids(kube, "demo").get("demo-broker-1") not in (None, before["demo-broker-1"]),
        120,
        "demo-broker-1 restarted",
    )
    wait_ready(kube, demo, "MQCluster demo Ready after one pod's restart")
    now = pod_uids(kube, "demo")
    assert {k: v for k, v in now.items() if k != "demo-broker-1"} == {
        k: v for k, v in before.items() if k != "demo-broker-1"
    }
    pod = get_json(kube, "pod", "demo-broker-1", "-n", NS)
    assert ROLL not in (pod["metadata"].get("annotations") or {})

    # All pods: one at a time, controllers first, at most one broker down.
    t0 = time.monotonic()
    before = now
    demo.watch_down = True
    demo.max_brokers_down = 0
    try:
        kube.kubectl("annotate", "mqcluster", "demo", "-n", NS, f"{ROLL}=true")

        def rolled() -> bool:
            now = pod_uids(kube, "demo")
            return len(now) == 6 and all(now[n] != before[n] for n in before)

        kube.wait_for(rolled, 300, "every pod restarted")
        wait_ready(kube, demo, "MQCluster demo Ready after the manual roll")
    finally:
        demo.watch_down = False
    mq = get_json(kube, "mqcluster", "demo", "-n", NS)
    assert ROLL not in (mq["metadata"].get("annotations") or {})
    for p in get_json(kube, "pods", "-n", NS, "-l", "app.kubernetes.io/instance=demo")["items"]:
        assert ROLL not in (p["metadata"].get("annotations") or {}), p["metadata"]["name"]
    restarts = sorted(
        (t, kind, o) for t, what, kind, o in demo.history if what == "start" and t > t0
    )
    kinds = [kind for _, kind, _ in restarts]
    assert kinds == sorted(kinds, key=lambda k: k != "controller"), restarts
    assert demo.max_brokers_down <= 1, f"{demo.max_brokers_down} brokers down at once"


def test_all_brokers_down_is_not_ready(kube: Any, demo: PodStandIns) -> None:
    watch = StatusWatch(kube, "demo")
    brokers = {("broker", i) for i in range(3)}
    # Kept down until the status says so: kwok calls the new pods Ready at once, and a
    # pass that came after the processes were back would see nothing wrong.
    demo.hold |= brokers
    try:
        kube.kubectl(
            "delete",
            "pods",
            "-n",
            NS,
            "-l",
            "app.kubernetes.io/instance=demo,app.kubernetes.io/component=broker",
            "--wait=false",
        )
        # The pods' deletion wakes the operator at once (not at its 30 s timer).
        kube.wait_for(lambda: any(r != "True" for _, r, _ in watch.seen), 60, "status not Ready")
        demo.hold -= brokers
        wait_ready(kube, demo, "MQCluster demo Ready again", timeout=180)
    finally:
        demo.hold -= brokers
        seen = watch.stop()
    down = [s for s in seen if s[1] != "True"]
    assert down and all(p != "Ready" for p, _, _ in down), seen


def test_topic_deleted_while_the_operator_is_away_is_removed_when_it_is_back(
    kube: Any, demo: PodStandIns, operator: Operator
) -> None:
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(topic("swept", "demo", 1)))
    kube.wait_for(lambda: "swept" in demo.topics(), 60, "swept created")
    record = lambda: get_json(kube, "configmap", "demo-managed", "-n", NS).get("data") or {}  # noqa: E731
    assert record().get("topic.swept") == "swept"
    assert not get_json(kube, "topic", "swept", "-n", NS)["metadata"].get("finalizers")
    operator.stop()
    try:
        # No finalizer: the resource goes at once, with nobody to remove the topic.
        kube.kubectl("delete", "topic", "swept", "-n", NS, "--wait=true", timeout=30)
        assert "swept" in demo.topics()
    finally:
        operator.start()
        kube.wait_for(operator.healthy, 60, "operator /healthz again")
    kube.wait_for(lambda: "swept" not in demo.topics(), 60, "swept deleted by the sweep")
    kube.wait_for(lambda: "topic.swept" not in record(), 30, "record entry dropped")
    assert "topic.orders" in record()


def test_namespace_deletion_needs_no_operator(
    kube: Any, installed: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Topics, Users and an MQCluster the operator has handled: with the operator stopped,
    the MQCluster deleted first and then the namespace, the namespace goes."""
    ns = "doomed"
    kube.create_namespace(ns)
    op = Operator(kube, tmp_path_factory.mktemp("doomed") / "operator.log", namespace=ns)
    try:
        kube.wait_for(op.healthy, 60, "second operator /healthz")
        # Nothing answers there: the operator's passes fail fast, with conditions.
        doc = mqcluster("gone", 3, {"straitmq.io/admin-url": "http://127.0.0.1:1"})
        docs = [doc, topic("t1", "gone", 1), topic("t2", "gone", 1)]
        docs += [user_doc(u, [write_acl("t1")], cluster="gone") for u in ("u1", "u2")]
        for d in docs:
            kube.kubectl("apply", "-n", ns, "-f", "-", input=yaml_doc(d))

        def handled() -> bool:
            for kind, name in (("topic", "t1"), ("topic", "t2"), ("user", "u1"), ("user", "u2")):
                if not (get_json(kube, kind, name, "-n", ns).get("status") or {}).get("conditions"):
                    return False
            return bool(get_json(kube, "mqcluster", "gone", "-n", ns).get("status"))

        kube.wait_for(handled, 60, "every resource reconciled once")
        for kind in ("mqclusters", "topics", "users"):
            for item in get_json(kube, kind, "-n", ns)["items"]:
                assert not item["metadata"].get("finalizers"), item["metadata"]
    finally:
        op.stop()
    kube.kubectl("delete", "mqcluster", "gone", "-n", ns, "--wait=true", timeout=30)
    kube.kubectl("delete", "namespace", ns, "--wait=false")

    def gone() -> bool:
        return kube.kubectl("get", "namespace", ns, check=False).returncode != 0

    try:
        kube.wait_for(gone, 120, f"namespace {ns} deleted")
    except TimeoutError as e:
        left = kube.kubectl("get", "topics,users,mqclusters", "-n", ns, "-o", "yaml", check=False)
        raise AssertionError(f"{e}: {left.stdout[-2000:]}") from e


def test_operator_logs_are_structured_and_metrics_count_reconciles(
    demo: PodStandIns, operator: Operator
) -> None:
    lines = [line for line in operator.log_lines() if line.strip()]
    assert lines
    for line in lines[-200:]:
        rec = json.loads(line)  # every line is one JSON object
        assert {"ts", "level", "logger", "msg"} <= rec.keys()
    text = operator.metrics()
    served: dict = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            served.setdefault(sample.name, []).append((sample.labels, sample.value))
    board = dashboards()["operator"]
    # Error series appear with the first error, which a healthy run may never have;
    # test_metrics checks those panels against an in-process failure.
    board = {
        **board,
        "panels": [
            p for p in board["panels"] if "reconcile_errors" not in json.dumps(p.get("targets"))
        ],
    }
    assert board["panels"]
    check_served(board, served, "the running operator")
    ok = [
        line
        for line in text.splitlines()
        if line.startswith("straitmq_operator_reconciles_total{")
        and 'success"' in line
        and 'MQCluster"' in line
    ]
    assert ok and float(ok[0].rsplit(" ", 1)[1]) > 0, text[:2000]


# --- User resources: SCRAM credentials and ACLs --------------------------------------

AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def user_doc(name: str, acls: list[dict], cluster: str = "authn", **auth: Any) -> dict:
    return {
        "apiVersion": "straitmq.io/v1alpha1",
        "kind": "User",
        "metadata": {"name": name},
        "spec": {
            "cluster": cluster,
            "authentication": {"type": "scram-sha-512", **auth},
            "authorization": {"acls": acls},
        },
    }


def write_acl(topic_name: str) -> dict:
    return {"resource": {"type": "topic", "name": topic_name}, "operations": ["Write"]}


def user_secret(kube: Any, name: str) -> dict[str, str]:
    import base64

    data = get_json(kube, "secret", name, "-n", NS)["data"]
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def sasl_conf(secret: dict[str, str], password: str | None = None) -> dict[str, str]:
    return {
        "bootstrap.servers": secret["bootstrap.servers"],
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": secret["sasl.mechanism"],
        "sasl.username": secret["username"],
        "sasl.password": password if password is not None else secret["password"],
    }


def produce_outcome(conf: dict) -> Any:
    """Per topic: None if one record was delivered, else the delivery error's code."""
    from confluent_kafka import Producer

    def one(topic_name: str) -> Any:
        outcome: list[Any] = []
        p = Producer({**conf, "message.timeout.ms": 10000})
        p.produce(topic_name, value=b"v", on_delivery=lambda err, msg: outcome.append(err))
        p.flush(20)
        assert outcome, "no delivery report"
        return None if outcome[0] is None else outcome[0].code()

    return one


def tls_user_client(secret: dict[str, str], folder: Path) -> dict[str, str]:
    """A tls User's Secret (user.crt, user.key, ca.crt) as files in `folder`, and the
    client settings that use them on the stand-in's mTLS listener."""
    files = {}
    for key in ("user.crt", "user.key", "ca.crt"):
        files[key] = folder / key
        files[key].write_text(secret[key])
    return {
        "security.protocol": "SSL",
        "ssl.ca.location": str(files["ca.crt"]),
        "ssl.certificate.location": str(files["user.crt"]),
        "ssl.key.location": str(files["user.key"]),
        "ssl.endpoint.identification.algorithm": "none",  # the stand-in listens on 127.0.0.1
    }


def logs_in(conf: dict) -> bool:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient(conf).list_topics(timeout=4)
    except KafkaException:
        return False
    return True


def _secret_files(kube: Any, name: str, folder: Path) -> dict[str, Path]:
    """A Secret's keys as files in `folder` (as its volume would mount them)."""
    import base64

    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, value in get_json(kube, "secret", name, "-n", NS)["data"].items():
        (folder / key).write_bytes(base64.b64decode(value))
        out[key] = folder / key
    return out


@pytest.fixture(scope="module")
def authn(kube: Any, operator: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """MQCluster `authn` (1 broker; kafka.tls, SCRAM, authorization): the operator makes
    its CA, the broker's and its own certificates and renders a secured HTTP API. The
    stand-in broker runs with the rendered http.* settings and super users (and the
    mounted Secret's files); its Kafka side is a SASL_PLAINTEXT (SCRAM) listener for
    clients and a PLAINTEXT one for replication, whose ANONYMOUS principal is added to
    the super users (a pod's REPLICATION listener takes certificates instead), and an SSL
    one that requires a client certificate from the cluster CA (what a tls User holds;
    `standins.mtls_port`). The tests call the admin API with the operator's certificate.
    Topics `payments` and `audit`."""
    standins = PodStandIns(kube, "authn", tmp_path_factory.mktemp("authn"))
    standins.scheme = "https"
    sasl = {ordinal: free_port() for ordinal in standins.local.brokers}
    mtls = {ordinal: free_port() for ordinal in standins.local.brokers}
    standins.mtls_port = mtls[0]
    annotations = {
        "straitmq.io/admin-url": standins.admin_url,
        "straitmq.io/bootstrap-servers": f"127.0.0.1:{sasl[0]}",
    }
    kafka = {"tls": True, "authentication": {"type": "scram-sha-512"}}
    doc = mqcluster(
        "authn", 1, annotations, listeners={"kafka": kafka}, authorization={"type": "simple"}
    )
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(doc))
    try:
        kube.wait_for(
            lambda: get_json(kube, "statefulset", "authn-broker", "-n", NS),
            60,
            "authn's broker StatefulSet",
        )
        kube.wait_for(
            lambda: get_json(kube, "secret", "authn-operator-certs", "-n", NS),
            60,
            "the operator's certificate for authn",
        )
        certs = standins.data_dir / "pod-volumes" / "certs"
        _secret_files(kube, "authn-broker-certs", certs)
        mine = _secret_files(kube, "authn-operator-certs", standins.data_dir / "operator")
        standins.auth = AdminAuth(
            ca_file=str(mine["ca.crt"]),
            cert_file=str(mine["tls.crt"]),
            key_file=str(mine["tls.key"]),
            check_hostname=False,
        )
        sts = get_json(kube, "statefulset", "authn-broker", "-n", NS)
        (container,) = sts["spec"]["template"]["spec"]["containers"]
        rendered = [
            a.removeprefix("--override=")
            for a in container["args"]
            if a.startswith(
                ("--override=http.", "--override=super.users=", "--override=authorizer.class.name=")
            )
        ]
        assert any(r.startswith("http.authentication=") for r in rendered), container["args"]
        for ordinal, node in standins.local.brokers.items():
            pod = f"authn-broker-{ordinal}"
            props = []
            for r in rendered:
                r = r.replace("/opt/straitmq/certs", str(certs)).replace("$(POD_NAME)", pod)
                if r.startswith("super.users="):
                    r += ";User:ANONYMOUS"
                props += ["--override", r]
            listeners = (
                f"REPL://127.0.0.1:{node.kafka_port},SASL://127.0.0.1:{sasl[ordinal]},"
                f"MTLS://127.0.0.1:{mtls[ordinal]}"
            )
            standins.base_args[ordinal] += [
                "--listeners",
                listeners,
                "--listener-security-protocol-map",
                "REPL:PLAINTEXT,SASL:SASL_PLAINTEXT,MTLS:SSL",
                "--inter-broker-listener-name",
                "REPL",
                "--override",
                "listener.name.sasl.sasl.enabled.mechanisms=SCRAM-SHA-512",
                "--override",
                f"ssl.keystore.location={certs}/{pod}.pem",
                "--override",
                f"ssl.truststore.location={certs}/ca.crt",
                "--override",
                "listener.name.mtls.ssl.client.auth=required",
                *props,
            ]
        standins.start()

        def made(name: str) -> bool:
            standins.check()
            body = {"name": name, "partitions": 1, "replication_factor": 1}
            try:
                request_sync(
                    standins.admin_url,
                    "POST",
                    "/api/v1/topics",
                    body,
                    timeout_s=5,
                    auth=standins.auth,
                )
            except Exception as e:  # not serving yet, or made by an earlier try
                if "already exists" not in str(e):
                    raise
            return True

        for name in ("payments", "audit"):
            kube.wait_for(lambda name=name: made(name), 120, f"topic {name} on authn")
        yield standins
    finally:
        # While the brokers still answer: the MQCluster's pass removes their credentials.
        kube.kubectl("delete", "users", "--all", "-n", NS, "--timeout=60s", check=False)
        standins.stop()


def as_operator(standins: PodStandIns, path: str) -> Any:
    return request_sync(standins.admin_url, "GET", path, timeout_s=10, auth=standins.auth)


def test_secured_cluster_http_api_refuses_anonymous_calls_but_not_the_operator(
    kube: Any, authn: PodStandIns
) -> None:
    """spec.authorization: the brokers' admin API (users, ACLs, topics) needs a client
    certificate from the cluster CA (or a User's password); the kubelet's probes and
    Prometheus need none; the operator, with its own certificate, still manages Topics."""
    import ssl

    from straitmq.admin_client import AdminError

    assert authn.auth is not None and authn.auth.ca_file
    url = authn.admin_url
    assert url.startswith("https://")
    anonymous = AdminAuth(ca_file=authn.auth.ca_file, check_hostname=False)
    for method, path, body in (
        ("GET", "/api/v1/topics", None),
        ("GET", "/api/v1/acls", None),
        ("PUT", "/api/v1/users/intruder", {"mechanism": "SCRAM-SHA-512", "password": "x"}),
        ("POST", "/api/v1/topics", {"name": "intruder", "partitions": 1}),
        ("DELETE", "/api/v1/topics/payments", None),
    ):
        status, answer = exchange_sync(url, method, path, body, timeout_s=5, auth=anonymous)
        assert status == 401, (method, path, status, answer)
    with pytest.raises(AdminError):  # plain http on the port: no answer
        request_sync(url.replace("https://", "http://"), "GET", "/api/v1/topics", timeout_s=3)
    # As the kubelet's probes with scheme HTTPS: no certificate shown, none verified.
    kubelet = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    kubelet.check_hostname, kubelet.verify_mode = False, ssl.CERT_NONE
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (
            exchange_sync(url, "GET", path, timeout_s=5, auth=AdminAuth(ssl_context=kubelet))[0]
            == 200
        ), path
    sts = get_json(kube, "statefulset", "authn-broker", "-n", NS)["spec"]["template"]
    probe = sts["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    assert probe == {"path": "/readyz", "port": "http", "scheme": "HTTPS"}
    assert "intruder" not in {t["name"] for t in as_operator(authn, "/api/v1/topics")["topics"]}

    # The operator reconciles a Topic there with its certificate.
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(topic("ledger", "authn", 2, 1)))

    def ready() -> dict | None:
        authn.check()
        t = get_json(kube, "topic", "ledger", "-n", NS)
        return t if condition(t, "Ready").get("status") == "True" else None

    kube.wait_for(ready, 60, "Topic ledger on authn Ready")
    assert len(as_operator(authn, "/api/v1/topics/ledger")["partitions"]) == 2
    kube.kubectl("delete", "topic", "ledger", "-n", NS, "--timeout=60s")
    kube.wait_for(
        lambda: "ledger" not in {t["name"] for t in as_operator(authn, "/api/v1/topics")["topics"]},
        60,
        "topic ledger deleted by the operator",
    )


def user_ready(kube: Any, name: str, generation: bool = True) -> dict | None:
    obj = get_json(kube, "user", name, "-n", NS)
    c = condition(obj, "Ready")
    if generation and c.get("observedGeneration") != obj["metadata"]["generation"]:
        return None
    return c or None


def test_user_gets_a_secret_and_exactly_its_acls(kube: Any, authn: PodStandIns) -> None:
    acls = [
        {"resource": {"type": "topic", "name": "payments"}, "operations": ["Write", "Describe"]}
    ]
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(user_doc("billing", acls)))
    c = kube.wait_for(
        lambda: (r := user_ready(kube, "billing")) and r["status"] == "True" and r,
        60,
        "User billing Ready",
    )
    assert c["reason"] == "Reconciled"
    status = get_json(kube, "user", "billing", "-n", NS)["status"]
    assert (status["username"], status["secret"], status["acls"]) == ("billing", "billing", 2)
    secret = user_secret(kube, "billing")
    assert secret["username"] == "billing" and len(secret["password"]) >= 24
    assert secret["sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="billing" password="{secret["password"]}";'
    )
    owner = get_json(kube, "secret", "billing", "-n", NS)["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"]) for o in owner] == [("User", "billing")]
    # The broker keeps a salted credential and the bindings, one per operation.
    assert as_operator(authn, "/api/v1/users/billing")["mechanisms"] == [
        {"mechanism": "SCRAM-SHA-512", "iterations": 4096}
    ]
    bound = as_operator(authn, "/api/v1/acls?principal=User:billing")["acls"]
    assert sorted(b["operation"] for b in bound) == ["DESCRIBE", "WRITE"]

    from confluent_kafka import KafkaError

    conf = sasl_conf(secret)
    produce = produce_outcome(conf)
    assert produce("payments") is None
    assert produce("audit") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert not logs_in(sasl_conf(secret, "not-the-password"))

    # Editing the ACLs changes what it may do: now audit only (payments' bindings go).
    kube.kubectl(
        "apply", "-n", NS, "-f", "-", input=yaml_doc(user_doc("billing", [write_acl("audit")]))
    )

    def swapped() -> bool:
        return produce("audit") is None and (
            produce("payments") == KafkaError.TOPIC_AUTHORIZATION_FAILED
        )

    kube.wait_for(swapped, 60, "billing may write audit and not payments")
    bound = as_operator(authn, "/api/v1/acls?principal=User:billing")["acls"]
    assert [(b["resource_name"], b["operation"]) for b in bound] == [("audit", "WRITE")]
    assert user_secret(kube, "billing")["password"] == secret["password"]  # kept

    # spec.quotas become the user's own client quotas (Kafka's keys); the schema refuses
    # a negative one before the operator sees it.
    quoted = user_doc("billing", [write_acl("audit")])
    quoted["spec"]["quotas"] = {"producerByteRate": 1048576, "controllerMutationRate": 2.5}
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(quoted))

    def billing_quotas() -> Any:
        return as_operator(authn, "/api/v1/quotas?user=billing")["quotas"]

    want = [
        {
            "entity": {"user": "billing"},
            "quotas": {"producer_byte_rate": 1048576.0, "controller_mutation_rate": 2.5},
        }
    ]
    kube.wait_for(lambda: billing_quotas() == want, 60, "billing's quotas set")
    quoted["spec"]["quotas"] = {"producerByteRate": -1}
    refused = kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(quoted), check=False)
    assert refused.returncode != 0 and "producerByteRate" in refused.stderr, refused.stderr

    # A binding the broker refuses (READ means nothing on the cluster): a condition with
    # the broker's reason, and the ACLs stay as they were.
    bad = {"resource": {"type": "cluster"}, "operations": ["Read"]}
    kube.kubectl(
        "apply", "-n", NS, "-f", "-", input=yaml_doc(user_doc("billing", [write_acl("audit"), bad]))
    )
    c = kube.wait_for(
        lambda: (r := user_ready(kube, "billing")) and r["status"] == "False" and r,
        60,
        "User billing refused",
    )
    assert c["reason"] == "InvalidAcl"
    assert "operation READ does not apply to a CLUSTER resource" in c["message"], c
    assert produce("audit") is None
    events = kube.kubectl(
        "get", "events", "-n", NS, "--field-selector", "involvedObject.name=billing"
    ).stdout
    assert "InvalidAcl" in events

    # Deleting the User: its login fails, its bindings and its Secret are gone.
    kube.kubectl("delete", "user", "billing", "-n", NS, "--timeout=60s")
    kube.wait_for(lambda: not logs_in(conf), 30, "billing's login refused")
    assert as_operator(authn, "/api/v1/acls?principal=User:billing") == {"acls": []}
    kube.wait_for(lambda: billing_quotas() == [], 30, "billing's quotas removed")

    def secret_gone() -> bool:
        out = kube.kubectl("get", "secret", "billing", "-n", NS, check=False)
        return out.returncode != 0 and "NotFound" in out.stderr

    kube.wait_for(secret_gone, 60, "billing's Secret collected with its owner")


def test_tls_user_gets_a_certificate_and_exactly_its_acls(
    kube: Any, authn: PodStandIns, tmp_path: Path
) -> None:
    from confluent_kafka import KafkaError
    from straitmq.operator import pki

    doc = user_doc("shipping", [write_acl("payments")], type="tls")
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(doc))
    kube.wait_for(
        lambda: (r := user_ready(kube, "shipping")) and r["status"] == "True",
        60,
        "User shipping Ready",
    )
    status = get_json(kube, "user", "shipping", "-n", NS)["status"]
    assert (status["username"], status["acls"]) == ("CN=shipping", 1)
    secret = user_secret(kube, "shipping")
    assert "password" not in secret and secret["security.protocol"] == "SSL"
    leaf = pki.certificate(secret["user.crt"])
    # Its CN alone: the cluster's own certificates say O=straitmq, no user passes for them.
    assert leaf.subject.rfc4514_string() == "CN=shipping"
    assert pki.signed_by(leaf, secret["ca.crt"])
    bound = as_operator(authn, "/api/v1/acls?principal=User:CN=shipping")["acls"]
    assert [(b["resource_name"], b["operation"]) for b in bound] == [("payments", "WRITE")]
    conf = {
        "bootstrap.servers": f"127.0.0.1:{authn.mtls_port}",
        **tls_user_client(secret, tmp_path),
    }
    produce = produce_outcome(conf)
    assert produce("payments") is None
    assert produce("audit") == KafkaError.TOPIC_AUTHORIZATION_FAILED
    no_cert = {k: v for k, v in conf.items() if not k.startswith(("ssl.certificate", "ssl.key"))}
    assert not logs_in(no_cert)
    # Deleting the User takes its bindings: the certificate still shakes hands, but may
    # write nothing.
    kube.kubectl("delete", "user", "shipping", "-n", NS, "--timeout=60s")
    kube.wait_for(
        lambda: produce("payments") == KafkaError.TOPIC_AUTHORIZATION_FAILED,
        60,
        "shipping may write nothing once deleted",
    )


def _served_serial(port: int, client: dict[str, str]) -> int:
    """The serial number of the certificate the broker's mTLS listener shows now."""
    import socket
    import ssl

    from cryptography import x509

    ctx = ssl.create_default_context(cafile=client["ssl.ca.location"])
    ctx.check_hostname = False  # the stand-in listens on 127.0.0.1, not the pod's name
    ctx.load_cert_chain(client["ssl.certificate.location"], client["ssl.key.location"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw) as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _read_partitions(
    bootstrap: str,
    topic_name: str,
    partitions: int,
    client: dict[str, str],
    expect: set[bytes],
    timeout: float,
) -> set[bytes]:
    """The topic's values from offset 0 until all of `expect` are read (other records may
    be there too), read without a group (the stand-ins ask for 3 replicas of the offsets
    topic, and `authn` has one broker)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"{topic_name}-reader",
            "enable.auto.commit": False,
            **client,
        }
    )
    c.assign([TopicPartition(topic_name, p, OFFSET_BEGINNING) for p in range(partitions)])
    got: set[bytes] = set()
    deadline = time.monotonic() + timeout
    try:
        while not expect <= got and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                # librdkafka looks for the group's coordinator even with no group in use.
                if m.error() is not None:
                    assert m.error().code() == KafkaError.COORDINATOR_NOT_AVAILABLE, m.error()
                    continue
                got.add(m.value())
    finally:
        c.close()
    return got


def test_broker_certificate_renewal_under_load_loses_no_acknowledged_record(
    kube: Any, authn: PodStandIns, tmp_path: Path
) -> None:
    """The operator renews a broker certificate that is due (here: the Secret's one swapped
    for a certificate with 25 days left), the pod's mounted file follows the Secret (the
    kubelet's part, played here), and the broker serves the new certificate to new
    connections without a restart, while an idempotent acks=all producer of a tls User
    writes through it on the mTLS listener: a client that trusts only the cluster CA
    connects afterwards too, and every acknowledged record is read back."""
    import base64
    from datetime import UTC, datetime, timedelta

    from straitmq.operator import pki

    topic_name, pod = "renewals", "authn-broker-0"
    body = {"name": topic_name, "partitions": 2, "replication_factor": 1}
    request_sync(authn.admin_url, "POST", "/api/v1/topics", body, timeout_s=10, auth=authn.auth)
    acls = [
        {"resource": {"type": "topic", "name": topic_name}, "operations": ["Write", "Read"]},
        {"resource": {"type": "group", "name": f"{topic_name}-reader"}, "operations": ["Read"]},
    ]
    kube.kubectl(
        "apply", "-n", NS, "-f", "-", input=yaml_doc(user_doc("renewer", acls, type="tls"))
    )
    kube.wait_for(
        lambda: (r := user_ready(kube, "renewer")) and r["status"] == "True",
        60,
        "User renewer Ready",
    )
    secret = user_secret(kube, "renewer")
    client = tls_user_client(secret, tmp_path)
    bootstrap = f"127.0.0.1:{authn.mtls_port}"
    before = _served_serial(authn.mtls_port, client)
    pid = authn.node("broker", 0).proc.pid
    w = Workload(
        bootstrap, topic_name, partitions=2, prefix="renew", rate=150, client=client
    ).start()
    try:
        w.wait_acked_growth(100, 60)
        # A keystore that is due, as a year-old one would be: the operator must renew it.
        ca = user_secret(kube, "authn-cluster-ca")
        served = user_secret(kube, "authn-broker-certs")[f"{pod}.pem"]
        names = pki.dns_names(pki.certificate(served))
        old = datetime.now(UTC) - timedelta(days=340)
        key, crt = pki.issue(ca["ca.key"], ca["ca.crt"], "authn-broker", names, old)
        due = pki.keystore(key, crt, ca["ca.crt"])
        patch = {"data": {f"{pod}.pem": base64.b64encode(due.encode()).decode()}}
        kube.kubectl(
            "patch",
            "secret",
            "authn-broker-certs",
            "-n",
            NS,
            "--type",
            "merge",
            "-p",
            json.dumps(patch),
        )

        def renewed() -> str | None:
            authn.check()
            pem = user_secret(kube, "authn-broker-certs")[f"{pod}.pem"]
            return pem if pem not in (due, served) else None

        fresh = kube.wait_for(renewed, 90, "the operator renews the due certificate")
        leaf = pki.certificate(fresh)
        assert pki.signed_by(leaf, ca["ca.crt"]) and sorted(pki.dns_names(leaf)) == sorted(names)
        assert not pki.due(leaf)
        # The kubelet updates the mounted Secret file; the broker picks it up.
        mounted = authn.data_dir / "pod-volumes" / "certs" / f"{pod}.pem"
        mounted.write_text(fresh)
        kube.wait_for(
            lambda: _served_serial(authn.mtls_port, client) == leaf.serial_number,
            60,
            "the broker serves the renewed certificate",
        )
        assert before != leaf.serial_number
        w.wait_acked_growth(100, 60)
        # A client connecting now shakes hands with the renewed certificate.
        assert produce_outcome({"bootstrap.servers": bootstrap, **client})(topic_name) is None
    finally:
        w.stop()
    assert not w.fatal and not w.errors, (w.fatal, dict(w.errors))
    acked = dict(w.acked)
    # Counting would not do: the probe producer above wrote one more record.
    got = _read_partitions(bootstrap, topic_name, 2, client, set(acked), 60)
    lost = [v for v in acked if v not in got]
    assert len(acked) >= 200 and not lost, f"{len(lost)} of {len(acked)} acknowledged lost"
    # The same process all along: a renewal needs no restart.
    assert authn.node("broker", 0).proc.pid == pid


def test_user_password_from_a_secret_rotates(kube: Any, authn: PodStandIns) -> None:
    kube.kubectl(
        "create", "secret", "generic", "ledger-pw", "-n", NS, "--from-literal=pw=first-password"
    )
    ref = {"password": {"valueFrom": {"secretKeyRef": {"name": "ledger-pw", "key": "pw"}}}}
    doc = user_doc("ledger", [write_acl("payments")], **ref)
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(doc))
    kube.wait_for(
        lambda: (r := user_ready(kube, "ledger")) and r["status"] == "True", 60, "User ledger Ready"
    )
    secret = user_secret(kube, "ledger")
    assert secret["password"] == "first-password"
    assert produce_outcome(sasl_conf(secret))("payments") is None

    new = kube.kubectl(
        "create",
        "secret",
        "generic",
        "ledger-pw",
        "-n",
        NS,
        "--from-literal=pw=second-password",
        "--dry-run=client",
        "-o",
        "json",
    ).stdout
    kube.kubectl("apply", "-n", NS, "-f", "-", input=new)
    kube.wait_for(
        lambda: logs_in(sasl_conf(secret, "second-password")), 60, "the rotated password logs in"
    )
    assert not logs_in(sasl_conf(secret, "first-password"))
    assert user_secret(kube, "ledger")["password"] == "second-password"


def test_user_problems_are_conditions_or_refused_by_the_api_server(
    kube: Any, authn: PodStandIns
) -> None:
    kube.kubectl(
        "apply", "-n", NS, "-f", "-", input=yaml_doc(user_doc("orphan", [], cluster="nowhere"))
    )
    c = kube.wait_for(
        lambda: (r := user_ready(kube, "orphan")) and r["status"] == "False" and r,
        60,
        "User orphan NotReady",
    )
    assert c["reason"] == "ClusterNotFound" and "'nowhere'" in c["message"]
    kube.kubectl("delete", "user", "orphan", "-n", NS, "--timeout=60s")  # nothing to clean

    for acl, message in (
        (
            {"resource": {"type": "cluster", "name": "x"}, "operations": ["Alter"]},
            "the cluster resource has no name",
        ),
        ({"resource": {"type": "topic"}, "operations": ["Read"]}, "needs a name"),
        ({"resource": {"type": "topic", "name": "t"}, "operations": ["Fly"]}, "Unsupported value"),
        (
            {
                "resource": {"type": "topic", "name": "t", "patternType": "match"},
                "operations": ["Read"],
            },
            "Unsupported value",
        ),
    ):
        out = kube.kubectl(
            "apply", "-n", NS, "-f", "-", input=yaml_doc(user_doc("bad", [acl])), check=False
        )
        assert out.returncode != 0 and message in out.stderr, out.stderr


# --- TLS: the cluster CA and the brokers' certificates --------------------------------


def test_tls_cluster_gets_a_ca_and_broker_certificates(kube: Any, operator: Operator) -> None:
    import base64

    from straitmq.operator import pki

    kafka = {"tls": True, "authentication": {"type": "scram-sha-512"}}
    body = mqcluster(
        "sealed",
        2,
        listeners={"kafka": kafka},
        authorization={"type": "simple", "superUsers": ["User:ops"]},
    )
    kube.kubectl("apply", "-n", NS, "-f", "-", input=yaml_doc(body))

    def secret(name: str) -> dict[str, str]:
        data = get_json(kube, "secret", name, "-n", NS)["data"]
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    certs = kube.wait_for(lambda: secret("sealed-broker-certs"), 60, "broker certificates")
    ca = secret("sealed-cluster-ca")
    assert sorted(ca) == ["ca.crt", "ca.key"]
    assert secret("sealed-cluster-ca-cert") == {"ca.crt": ca["ca.crt"]}
    assert sorted(certs) == ["ca.crt", "sealed-broker-0.pem", "sealed-broker-1.pem"]
    for i in (0, 1):
        leaf = pki.certificate(certs[f"sealed-broker-{i}.pem"])
        assert pki.signed_by(leaf, ca["ca.crt"])
        assert f"sealed-broker-{i}.sealed-broker.{NS}.svc" in pki.dns_names(leaf)
    owner = get_json(kube, "secret", "sealed-cluster-ca", "-n", NS)["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"]) for o in owner] == [("MQCluster", "sealed")]
    sts = kube.wait_for(
        lambda: get_json(kube, "statefulset", "sealed-broker", "-n", NS), 60, "broker StatefulSet"
    )
    pod = sts["spec"]["template"]["spec"]
    volume = {"name": "certs", "secret": {"secretName": "sealed-broker-certs", "defaultMode": 420}}
    assert volume in pod["volumes"]
    args = " ".join(pod["containers"][0]["args"])
    assert "listener.security.protocol.map=REPLICATION:SSL,CLIENT:SASL_SSL" in args
    supers = "User:CN=sealed-broker,O=straitmq;User:CN=straitmq-operator,O=straitmq;User:ops"
    assert f"super.users={supers}" in args
    assert "http.authentication=mtls,basic" in args
    mine = kube.wait_for(lambda: secret("sealed-operator-certs"), 60, "the operator's certificate")
    assert sorted(mine) == ["ca.crt", "tls.crt", "tls.key"]
    leaf = pki.certificate(mine["tls.crt"])
    assert pki.signed_by(leaf, ca["ca.crt"])
    assert leaf.subject.rfc4514_string() == "CN=straitmq-operator,O=straitmq"
    assert "ssl.keystore.location=/opt/straitmq/certs/$(POD_NAME).pem" in args
    assert "controller.http.ssl.enabled=true" in args
    # The controllers get theirs, in a Secret of their own, and serve https.
    ctl_certs = kube.wait_for(
        lambda: secret("sealed-controller-certs"), 60, "controller certificates"
    )
    assert sorted(ctl_certs) == ["ca.crt", *(f"sealed-controller-{i}.pem" for i in range(3))]
    for i in range(3):
        leaf = pki.certificate(ctl_certs[f"sealed-controller-{i}.pem"])
        assert pki.signed_by(leaf, ca["ca.crt"])
        assert f"sealed-controller-{i}.sealed-controller.{NS}.svc" in pki.dns_names(leaf)
        assert leaf.subject.rfc4514_string() == "CN=sealed-controller,O=straitmq"
    ctl = get_json(kube, "statefulset", "sealed-controller", "-n", NS)["spec"]["template"]["spec"]
    ctl_secret = {"secretName": "sealed-controller-certs", "defaultMode": 420}
    assert ctl["volumes"] == [{"name": "certs", "secret": ctl_secret}]
    assert "http.authentication=mtls" in " ".join(ctl["containers"][0]["args"])

    # Scaling up issues the new pod's certificate and leaves the others alone.
    kube.kubectl("scale", "mqcluster/sealed", "-n", NS, "--replicas=3")
    grown = kube.wait_for(
        lambda: (s := secret("sealed-broker-certs")) and len(s) == 4 and s,
        60,
        "a third certificate",
    )
    assert grown["sealed-broker-0.pem"] == certs["sealed-broker-0.pem"]
    assert secret("sealed-cluster-ca") == ca
    kube.kubectl("delete", "mqcluster", "sealed", "-n", NS, "--wait=false")
