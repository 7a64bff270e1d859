"""The image built from our Dockerfile, run by a real kubelet (tests/real_node_support.py):
probes executed by the kubelet, names found through CoreDNS and kube-proxy, the chart's
operator in a pod with in-cluster credentials, an MQCluster of real pods.

Run: `.venv/bin/python -m pytest -m realnode tests/test_real_node.py` as root. The
session fixture runs scripts/node-up.sh (which builds what is missing) and
scripts/node-down.sh; a machine that cannot run the node fails, it never skips.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from real_node_support import (
    APP_IMAGE,
    CLIENT_IMAGE,
    IMAGE_REPOSITORY,
    LOCAL_PATH_PROVISIONER,
    NODE_IFACE,
    NODE_IP,
    SHARED_STORAGE_CLASS,
    SPARK_JOBS_IMAGE,
    STORAGE_CLASS,
    BackgroundProducer,
    ClientPod,
    NodeHandle,
    app_version,
    assert_exactly_once,
    consume_on_host,
    node_fixture,
    release_images,
)
from straitmq.metadata.features import LATEST
from straitmq.metadata.features import STRAITMQ as STRAITMQ_LEVEL
from straitmq.operator.user import CLIENT_SETTINGS
from waiting import wait_for

from bench.releases import metadata_level

LATEST_LEVEL = LATEST[STRAITMQ_LEVEL]

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def node() -> Iterator[NodeHandle]:
    yield from node_fixture()


@pytest.mark.timeout(2400)  # first: the node fixture builds what .cache/ lacks (cold: ~5 min)
def test_node_is_a_real_kubelet_on_containerd(node: NodeHandle) -> None:
    n = node.get("node", "straitmq-node")
    info = n["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert info["kubeletVersion"] == "v1.33.13"
    addresses = {a["type"]: a["address"] for a in n["status"]["addresses"]}
    assert addresses["InternalIP"] == NODE_IP
    conditions = {c["type"]: c["status"] for c in n["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    dns = node.get("deployment", "coredns", "-n", "kube-system")
    assert dns["status"].get("readyReplicas") == 1
    print(f"node up in {node.startup_seconds}s: {node.timings}")


BROKER = """
apiVersion: v1
kind: Service
metadata: {name: single}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector: {app: single}
  ports: [{name: kafka, port: 9092}, {name: http, port: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: single-http}
spec:
  selector: {app: single}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: single}
spec:
  serviceName: single
  replicas: 1
  selector: {matchLabels: {app: single}}
  template:
    metadata: {labels: {app: single}}
    spec:
      securityContext: {runAsNonRoot: true, runAsUser: 10001, fsGroup: 10001}
      terminationGracePeriodSeconds: 5
      containers:
      - name: broker
        image: IMAGE
        imagePullPolicy: Never
        env:
        - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
        command: [strait-broker, --data-dir, /data, --listen, "0.0.0.0:9092",
                  --http, "0.0.0.0:8080",
                  --advertise, "$(POD_NAME).single.NS.svc.cluster.local:9092"]
        readinessProbe: {httpGet: {path: /readyz, port: 8080}, periodSeconds: 2}
        livenessProbe:
          httpGet: {path: /healthz, port: 8080}
          periodSeconds: 2
          timeoutSeconds: 1
          failureThreshold: 2
        securityContext: {readOnlyRootFilesystem: true, allowPrivilegeEscalation: false}
        volumeMounts: [{name: data, mountPath: /data}]
      volumes: [{name: data, emptyDir: {}}]
"""


def test_combined_broker_pod_probes_and_cluster_dns(node: NodeHandle) -> None:
    ns = "single"
    node.kubectl("create", "namespace", ns)
    node.kubectl(
        "apply", "-n", ns, "-f", "-", input=BROKER.replace("IMAGE", APP_IMAGE).replace("NS", ns)
    )
    node.kubectl(
        "wait", "-n", ns, "--for=condition=Ready", "pod/single-0", "--timeout=120s", timeout=150
    )
    # The pod's Ready condition comes from the kubelet's readiness probe.
    pod = node.get("pod", "single-0", "-n", ns)
    assert pod["status"]["containerStatuses"][0]["ready"] is True

    # From another pod: the headless name (pod DNS), the Service's short name (search
    # path) and the ClusterIP Service through kube-proxy, all answered by CoreDNS.
    script = (
        "import socket, urllib.request\n"
        f"a = socket.getaddrinfo('single-0.single.{ns}.svc.cluster.local', 9092)[0][4][0]\n"
        "b = socket.getaddrinfo('single', 9092)[0][4][0]\n"
        "assert a == b, (a, b)\n"
        f"r = urllib.request.urlopen('http://single-0.single.{ns}.svc:8080/healthz', timeout=5)\n"
        "assert r.status == 200\n"
        "r = urllib.request.urlopen('http://single-http/readyz', timeout=5)\n"
        "assert r.status == 200\n"
        "print('OK', a)\n"
    )
    out = node.run_pod("dns-client", ns, ["python", "-c", script])
    assert out.startswith("OK "), out
    assert out.split()[1] == pod["status"]["podIP"]

    # Freeze the broker from the host: the kubelet's liveness probe fails and the
    # kubelet restarts the container.
    pid = node.container_pid(ns, "single-0", "broker")
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    wait_for(
        lambda: (
            node.get("pod", "single-0", "-n", ns)["status"]["containerStatuses"][0]["restartCount"]
            >= 1
        ),
        60,
        "the kubelet to restart the frozen broker",
        every=0.5,
        ignore=(RuntimeError, KeyError, IndexError),
    )
    restarted = time.monotonic() - t0
    node.kubectl(
        "wait", "-n", ns, "--for=condition=Ready", "pod/single-0", "--timeout=60s", timeout=90
    )
    events = node.kubectl("get", "events", "-n", ns, "-o", "json").stdout
    assert "Liveness probe failed" in events
    print(f"frozen broker restarted by the kubelet after {restarted:.1f}s")
    node.kubectl("delete", "namespace", ns, "--wait=false")


# ----------------------------------------------------------------- the MQCluster of examples/

NS = "demo"
BOOTSTRAP = "demo-bootstrap:9092,demo-broker-0.demo-broker:9092,demo-broker-1.demo-broker:9092"
BROKERS = "app.kubernetes.io/instance=demo,app.kubernetes.io/component=broker"
CONTROLLERS = "app.kubernetes.io/instance=demo,app.kubernetes.io/component=controller"
TOPIC = "orders"
RETRY = (RuntimeError, KeyError, IndexError, OSError, ValueError, StopIteration)


@pytest.fixture(scope="module")
def chart(node: NodeHandle) -> float:
    """The chart's operator, installed and Ready (the seconds it took)."""
    return install_chart(node)


@pytest.fixture(scope="module")
def demo(node: NodeHandle, chart: float) -> dict[str, float]:
    return install_demo(node, operator_ready=chart)


def install_chart(node: NodeHandle) -> float:
    """helm install of the chart (the operator, image.repository localhost/straitmq: the
    repository spec.version names an image in) with --wait; returns the seconds it took."""
    node.kubectl("create", "namespace", "straitmq-system")
    t0 = time.monotonic()
    node.helm(
        "install",
        "smq",
        str(ROOT / "charts" / "straitmq"),
        "-n",
        "straitmq-system",
        "--set",
        "image.repository=" + APP_IMAGE.rsplit(":", 1)[0],
        "--set",
        "image.tag=" + APP_IMAGE.rsplit(":", 1)[1],
        "--set",
        "image.pullPolicy=Never",
        "--wait",
        "--timeout",
        "180s",
        timeout=240,
    )
    return time.monotonic() - t0


def install_demo(node: NodeHandle, operator_ready: float | None = None) -> dict[str, float]:
    """helm install of the chart (unless done already: `operator_ready` its seconds),
    examples/open/mqcluster.yaml and its topic.yaml, all Ready; returns how long each took
    (bench/real_node.py uses it too)."""
    if operator_ready is None:
        operator_ready = install_chart(node)
    t0 = time.monotonic() - operator_ready
    cluster = yaml.safe_load((ROOT / "examples" / "open" / "mqcluster.yaml").read_text())
    cluster["spec"]["image"] = APP_IMAGE  # built here; the example names a user's build
    cluster["spec"]["imagePullPolicy"] = "Never"
    node.kubectl("create", "namespace", NS)
    t1 = time.monotonic()
    node.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(cluster))
    wait_cluster_ready(node, 300)
    ready_at = time.monotonic()
    node.kubectl("apply", "-n", NS, "-f", str(ROOT / "examples" / "open" / "topic.yaml"))
    t2 = time.monotonic()
    node.kubectl(
        "wait", "-n", NS, "--for=condition=Ready", f"topic/{TOPIC}", "--timeout=120s", timeout=150
    )
    return {
        "helm_install_to_operator_ready": operator_ready,
        "apply_to_mqcluster_ready": ready_at - t1,
        "helm_install_to_mqcluster_ready": ready_at - t0,
        "topic_ready": time.monotonic() - t2,
    }


@pytest.fixture(scope="module")
def client(node: NodeHandle, demo: dict[str, float]) -> ClientPod:
    return ClientPod(node, NS)


def wait_cluster_ready(node: NodeHandle, timeout: float, brokers: int = 3) -> None:
    def ready() -> bool:
        st = node.get("mqcluster", "demo", "-n", NS).get("status", {})
        return st.get("phase") == "Ready" and (st.get("brokers") or {}).get("ready") == brokers

    wait_for(
        ready,
        timeout,
        f"MQCluster demo Ready with {brokers} brokers",
        every=1,
        ignore=RETRY,
        detail=lambda: json.dumps(node.get("mqcluster", "demo", "-n", NS).get("status")),
    )


def partitions(node: NodeHandle) -> list[dict]:
    return node.admin(NS, f"/api/v1/topics/{TOPIC}", BROKERS)["partitions"]


def isr_full(node: NodeHandle, brokers: set[int] | None = None) -> bool:
    """Every partition's ISR holds all its replicas (and, given, only `brokers`)."""
    parts = partitions(node)
    return all(
        sorted(p["isr"]) == sorted(p["replicas"])
        and not p["adding"]
        and not p["removing"]
        and (brokers is None or set(p["replicas"]) <= brokers)
        for p in parts
    )


def claim_uid(node: NodeHandle, pod: str) -> str:
    return node.get("pvc", f"data-{pod}", "-n", NS)["metadata"]["uid"]


def provisioned_volume(node: NodeHandle, claim: dict) -> tuple[str, Path]:
    """The PV bound to `claim` and its directory on this machine, checking that
    local-path-provisioner made it for that claim."""
    assert claim["status"]["phase"] == "Bound", claim["status"]
    assert claim["spec"]["storageClassName"] == STORAGE_CLASS, claim["spec"]
    pv = node.get("pv", claim["spec"]["volumeName"])
    by = pv["metadata"].get("annotations", {}).get("pv.kubernetes.io/provisioned-by")
    assert by == LOCAL_PATH_PROVISIONER, pv["metadata"]
    assert pv["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
    path = Path(pv["spec"]["hostPath"]["path"])
    assert path.parent == node.volume_root and path.is_dir(), path
    return pv["metadata"]["name"], path


def volume_files(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}


def pod_ready(
    node: NodeHandle, pod: str, not_uid: str | None = None, min_restarts: int | None = None
) -> bool:
    p = node.get("pod", pod, "-n", NS)
    if p["metadata"].get("deletionTimestamp") or (not_uid and p["metadata"]["uid"] == not_uid):
        return False
    st = p.get("status", {})
    if (
        min_restarts is not None
        and sum(c.get("restartCount", 0) for c in st.get("containerStatuses", [])) < min_restarts
    ):
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions", []))


def test_helm_operator_runs_mqcluster_as_real_pods(
    node: NodeHandle, demo: dict[str, float]
) -> None:
    pods = node.get("pods", "-n", "straitmq-system")["items"]
    assert len(pods) == 1 and pods[0]["spec"]["serviceAccountName"].endswith("operator")
    # In-cluster credentials: the projected service-account token, no kubeconfig.
    volumes = [v.get("projected", {}) for v in pods[0]["spec"].get("volumes", [])]
    assert any("serviceAccountToken" in str(v) for v in volumes), pods[0]["spec"]["volumes"]
    pods = node.get("pods", "-n", NS)["items"]
    assert len(pods) == 6
    assert all(
        c["type"] != "Ready" or c["status"] == "True"
        for p in pods
        for c in p["status"]["conditions"]
    )
    # Each claim bound to a volume local-path-provisioner made for it, a directory that
    # the pod's non-root user filled.
    claims = node.get("pvc", "-n", NS)["items"]
    assert len(claims) == 6
    for claim in claims:
        _, path = provisioned_volume(node, claim)
        assert volume_files(path), f"{path} is empty"
    # Brokers found the quorum through the controllers' headless-Service names.
    quorum = node.admin(NS, "/api/v1/quorum", BROKERS)
    assert quorum["leader_id"] in (1000, 1001, 1002), quorum
    assert isr_full(node)
    # Produce through the bootstrap Service's DNS name, one partition per request: a broker
    # that does not lead the partition answers 307 with the leader's headless-Service
    # name, which the pod resolves and follows.
    script = (
        "import json, urllib.request, urllib.error\n"
        "for p in range(3):\n"
        "    url = 'http://demo-bootstrap:8080/api/v1/topics/orders/records'\n"
        "    recs = [{'partition': p, 'value': f'v{i}'} for i in range(10)]\n"
        "    body = json.dumps({'records': recs}).encode()\n"
        "    for _ in range(3):\n"
        "        req = urllib.request.Request(url, data=body, method='POST',\n"
        "                                     headers={'Content-Type': 'application/json'})\n"
        "        try:\n"
        "            print(urllib.request.urlopen(req, timeout=10).read().decode()); break\n"
        "        except urllib.error.HTTPError as e:\n"
        "            assert e.code == 307, (e.code, e.read())\n"
        "            url = e.headers['Location']\n"
        "    else:\n"
        "        raise SystemExit(f'partition {p}: no leader accepted the records')\n"
    )
    out = node.run_pod("producer", NS, ["python", "-c", script])
    assert out.count('"offsets"') == 3, out
    print(f"timings: {json.dumps({k: round(v, 1) for k, v in demo.items()})}")


def test_kafka_idempotent_producer_and_consumer_group_in_cluster(
    node: NodeHandle, client: ClientPod
) -> None:
    producer = client.producer(BOOTSTRAP, TOPIC, "basic", rate=200)
    producer.wait_for_acks(500, 120, "steady producing")
    print(producer.stop())
    assert not producer.errors, producer.errors[:5]
    records = client.consume(BOOTSTRAP, TOPIC, "verify-basic")
    assert_exactly_once(producer.acked, records, "basic")
    assert {p for p, _, _ in records} == {0, 1, 2}
    # The group committed its offsets: the broker knows the group and its position.
    group = node.admin(NS, "/api/v1/groups/verify-basic", BROKERS)
    assert "verify-basic" in json.dumps(group)


# A consumer that starts past the log end of partition 0 and reports the error it gets.
STRAY_CONSUMER = r"""
import sys, time
from confluent_kafka import Consumer, TopicPartition
bootstrap, topic = sys.argv[1:3]
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "stray",
              "auto.offset.reset": "error", "enable.auto.commit": False})
c.assign([TopicPartition(topic, 0, 10**9)])
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    m = c.poll(1.0)
    if m is not None and m.error():
        print("ERROR", m.error().name(), flush=True)
        break
c.close()
"""


def test_metrics_scraped_through_services_carry_the_dashboards_metrics(
    node: NodeHandle, client: ClientPod
) -> None:
    from test_metrics import check_served, dashboards

    def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
        text = client.python(
            "import sys, urllib.request\n"
            "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())",
            url,
        )
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, []).append((s.labels, s.value))
        return out

    def merge(*scrapes: dict) -> dict[str, list[tuple[dict[str, str], float]]]:
        out: dict[str, list[tuple[dict[str, str], float]]] = {}
        for one in scrapes:
            for name, samples in one.items():
                out.setdefault(name, []).extend(samples)
        return out

    # What a Prometheus that scrapes every pod sees: brokers through the bootstrap Service
    # (ClusterIP, kube-proxy) and their headless names, controllers through their headless
    # Service (only the active controller serves the cluster-wide gauges), the operator
    # through the chart's metrics Service.
    through_service = scrape("http://demo-bootstrap:8080/metrics")
    assert "straitmq_broker_request_duration_seconds_count" in through_service or any(
        k.startswith("straitmq_broker_") for k in through_service
    ), sorted(through_service)[:20]
    # A consumer group with committed offsets, for the lag panels.
    client.consume(BOOTSTRAP, TOPIC, "metrics-lag")

    def broker_scrapes() -> list[dict] | None:
        got = [scrape(f"http://demo-broker-{i}.demo-broker:8080/metrics") for i in range(3)]
        lag = [ls for one in got for ls, _ in one.get("straitmq_consumer_group_lag", [])]
        return got if any(ls.get("messaging_consumer_group_name") for ls in lag) else None

    # An error as a user meets one: a consumer asks for an offset past the log end. The
    # leader answers OFFSET_OUT_OF_RANGE, which the error panels count by code (the
    # counter has no series before its first error).
    out = client.python(STRAY_CONSUMER, BOOTSTRAP, TOPIC, timeout=90)
    assert "ERROR _AUTO_OFFSET_RESET" in out, out
    leader = next(p["leader"] for p in partitions(node) if p["partition"] == 0)

    def counted() -> dict | None:
        got = scrape(f"http://demo-broker-{leader}.demo-broker:8080/metrics")
        errors = got.get("straitmq_broker_request_errors_total", [])
        return (
            got
            if any(
                ls.get("kafka_api_name") == "Fetch"
                and ls.get("error_type") == "OFFSET_OUT_OF_RANGE"
                and v >= 1
                for ls, v in errors
            )
            else None
        )

    erred = wait_for(counted, 30, f"OFFSET_OUT_OF_RANGE counted by broker {leader}", every=1)
    brokers = wait_for(broker_scrapes, 60, "the group's lag in a broker's metrics", every=2)
    controllers = [
        scrape(f"http://demo-controller-{i}.demo-controller:9093/metrics") for i in range(3)
    ]
    cluster = merge(through_service, erred, *brokers, *controllers)
    svc = next(
        s
        for s in node.get("services", "-n", "straitmq-system")["items"]
        if s["metadata"]["name"].endswith("-metrics")
    )
    port = svc["spec"]["ports"][0]["port"]
    operator = scrape(f"http://{svc['metadata']['name']}.straitmq-system:{port}/metrics")
    # The operator's error counters exist at zero before any error: a healthy install's
    # error panels show 0, not "No data".
    kinds = {
        ls["straitmq_resource_kind"]
        for ls, _ in operator.get("straitmq_operator_reconcile_errors_total", [])
    }
    assert kinds == {"MQCluster", "Topic", "User"}, sorted(operator)
    for name, board in dashboards().items():
        if name == "operator":
            check_served(board, operator, "the operator pod (its metrics Service)")
        elif name != "quotas":  # its series exist once a client has a quota (test_quotas.py)
            check_served(board, cluster, "the broker and controller pods")


def test_a_broker_pod_kept_down_fires_the_under_replicated_alert_in_prometheus(
    node: NodeHandle, client: ClientPod, tmp_path: Path
) -> None:
    """The chart's alert rules in a real Prometheus (run on this host) that finds the pods
    through the API server (kubernetes_sd with the node's kubeconfig) and scrapes them
    over the pod network, as a cluster's Prometheus does: a broker pod deleted and kept
    from coming back (the single node cordoned) for longer than the rule's `for:` makes
    StraitMQUnderReplicatedPartitions fire; uncordoned, the pod returns and it resolves.
    The rules' `for:` is shortened to LIVE_FOR as in tests/test_alert_rules.py (the
    shipped 2m would only add two minutes); deletion → firing is reported."""
    from real_node_support import NODE_NAME
    from test_alert_rules import LIVE_FOR, Prometheus

    urp = "StraitMQUnderReplicatedPartitions"
    scrapes = [
        {
            "job_name": "pods",
            "scrape_timeout": "1s",
            "kubernetes_sd_configs": [
                {
                    "role": "pod",
                    "kubeconfig_file": node.kubeconfig,
                    "namespaces": {"names": [NS]},
                }
            ],
            "relabel_configs": [
                # Each StraitMQ pod's http port (its /metrics), one job per component.
                {
                    "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                    "regex": "true",
                    "action": "keep",
                },
                {
                    "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                    "regex": "http",
                    "action": "keep",
                },
                {
                    "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
                    "regex": "(broker|controller)",
                    "replacement": "straitmq-${1}s",
                    "target_label": "job",
                },
                {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            ],
        }
    ]
    prom = Prometheus(tmp_path, scrapes)
    cordoned = False
    try:

        def scraping() -> bool:
            up = [t for t in prom.get("/api/v1/targets")["activeTargets"] if t["health"] == "up"]
            series = prom.get("/api/v1/query?query=straitmq_broker_partitions_under_replicated")
            return len(up) == 6 and len(series["result"]) == 3

        wait_for(scraping, 120, "Prometheus scraping the six pods", every=1, ignore=RETRY)
        wait_for(lambda: isr_full(node), 120, "every ISR full", every=1, ignore=RETRY)
        assert prom.alerts(urp) == []
        victim = "demo-broker-2"
        uid = node.get("pod", victim, "-n", NS)["metadata"]["uid"]
        node.kubectl("cordon", NODE_NAME)
        cordoned = True
        t_delete = time.monotonic()
        node.kubectl("delete", "pod", victim, "-n", NS, "--wait=false")
        wait_for(lambda: prom.alerts(urp), 120, f"{urp} pending", check=prom.alive, every=0.5)
        to_pending = time.monotonic() - t_delete
        wait_for(lambda: prom.firing(urp), 120, f"{urp} firing", check=prom.alive, every=0.5)
        to_firing = time.monotonic() - t_delete
        firing = [a for a in prom.alerts(urp) if a["state"] == "firing"]
        assert {(a["labels"]["namespace"], a["labels"]["job"]) for a in firing} == {
            (NS, "straitmq-brokers")
        }, firing
        # Still down: the pod cannot be scheduled on the cordoned node.
        assert not pod_ready(node, victim, not_uid=uid)
        node.kubectl("uncordon", NODE_NAME)
        cordoned = False
        t_back = time.monotonic()
        wait_for(
            lambda: pod_ready(node, victim, not_uid=uid),
            180,
            f"{victim} back",
            every=1,
            ignore=RETRY,
        )
        wait_for(
            lambda: prom.alerts(urp) == [], 180, f"{urp} resolved", check=prom.alive, every=0.5
        )
        to_resolved = time.monotonic() - t_back
        print(
            f"\n[alert figures, real node] {urp} (for: {LIVE_FOR} here, 2m shipped; scrape "
            f"and evaluation every 1s): pod deleted -> pending {to_pending:.1f} s, -> firing "
            f"{to_firing:.1f} s; uncordoned -> resolved {to_resolved:.1f} s",
            flush=True,
        )
    finally:
        if cordoned:
            node.kubectl("uncordon", NODE_NAME)
        prom.stop()
    wait_cluster_ready(node, 180)


def test_broker_pod_faults_while_producing(node: NodeHandle, client: ClientPod) -> None:
    """Graceful delete, forced delete, SIGKILL from the host, SIGSTOP until the liveness
    probe fails: each time the pod returns on its PVC and rejoins every ISR, and no
    acknowledged record is lost or duplicated."""
    producer = client.producer(BOOTSTRAP, TOPIC, "faults", rate=40)
    producer.wait_for_acks(100, 120, "before the faults")
    timings: dict[str, float] = {}

    def fault(name: str, pod: str, do, restart: bool) -> None:
        uid = claim_uid(node, pod)
        volume, path = provisioned_volume(node, node.get("pvc", f"data-{pod}", "-n", NS))
        segments = {f for f in volume_files(path) if f.endswith(".log")}
        before = node.get("pod", pod, "-n", NS)
        restarts = sum(c.get("restartCount", 0) for c in before["status"]["containerStatuses"])
        t0 = time.monotonic()
        do(pod)
        if restart:  # the same pod, its container restarted by the kubelet
            wait_for(
                lambda: pod_ready(node, pod, min_restarts=restarts + 1),
                240,
                f"{pod} restarted and Ready ({name})",
                every=0.5,
                ignore=RETRY,
                check=producer.check,
            )
        else:  # a new pod from the StatefulSet
            wait_for(
                lambda: pod_ready(node, pod, not_uid=before["metadata"]["uid"]),
                240,
                f"{pod} replaced and Ready ({name})",
                every=0.5,
                ignore=RETRY,
                check=producer.check,
            )
        assert claim_uid(node, pod) == uid, f"{pod} came back on another PVC ({name})"
        # The same volume, and what the broker had written is still there.
        assert provisioned_volume(node, node.get("pvc", f"data-{pod}", "-n", NS)) == (
            volume,
            path,
        ), f"{pod} came back on another volume ({name})"
        assert segments and segments <= volume_files(path), (name, segments, volume_files(path))
        wait_for(
            lambda: isr_full(node),
            180,
            f"{pod} back in every ISR ({name})",
            every=0.5,
            ignore=RETRY,
            check=producer.check,
            detail=lambda: json.dumps([(p["partition"], p["isr"]) for p in partitions(node)]),
        )
        timings[name] = round(time.monotonic() - t0, 1)
        producer.wait_for_acks(100, 120, f"after {name}")

    fault(
        "delete",
        "demo-broker-1",
        lambda pod: node.kubectl("delete", "pod", pod, "-n", NS, "--wait=false"),
        False,
    )
    fault(
        "force delete",
        "demo-broker-2",
        lambda pod: node.kubectl(
            "delete", "pod", pod, "-n", NS, "--grace-period=0", "--force", "--wait=false"
        ),
        False,
    )
    fault(
        "SIGKILL",
        "demo-broker-0",
        lambda pod: os.kill(node.container_pid(NS, pod, "broker"), signal.SIGKILL),
        True,
    )
    fault(
        "SIGSTOP",
        "demo-broker-1",
        lambda pod: os.kill(node.container_pid(NS, pod, "broker"), signal.SIGSTOP),
        True,
    )
    events = node.kubectl("get", "events", "-n", NS, "-o", "json").stdout
    assert "Liveness probe failed" in events
    print(producer.stop())
    records = client.consume(BOOTSTRAP, TOPIC, "verify-faults")
    assert_exactly_once(producer.acked, records, "faults")
    print(
        f"back in the ISR after (s): {timings}; acked {len(producer.acked)}, "
        f"delivery errors {len(producer.errors)}"
    )


def test_active_controller_pod_killed_while_producing(node: NodeHandle, client: ClientPod) -> None:
    producer = client.producer(BOOTSTRAP, TOPIC, "ctrl", rate=40)
    producer.wait_for_acks(100, 120, "before the controller fault")
    old = node.admin(NS, "/api/v1/quorum", BROKERS)["leader_id"]
    pod = f"demo-controller-{old - 1000}"
    t0 = time.monotonic()
    node.kubectl("delete", "pod", pod, "-n", NS, "--grace-period=0", "--force", "--wait=false")

    def new_active() -> int | None:
        q = node.admin(NS, "/api/v1/quorum", BROKERS)
        lead = q.get("leader_id")
        return lead if lead is not None and lead != old and q.get("active_controller") else None

    lead = wait_for(
        new_active, 60, "a new active controller", every=0.2, ignore=RETRY, check=producer.check
    )
    elected = time.monotonic() - t0
    producer.wait_for_acks(200, 120, "after the controller fault")
    wait_for(lambda: pod_ready(node, pod), 180, f"{pod} back", every=0.5, ignore=RETRY)
    print(producer.stop())
    records = client.consume(BOOTSTRAP, TOPIC, "verify-ctrl")
    assert_exactly_once(producer.acked, records, "ctrl")
    print(f"active controller {old} -> {lead} in {elected:.1f}s")
    assert elected < 30, f"a new active controller took {elected:.1f}s"


# What the operator writes into every User Secret and the README recommends to clients:
# a broker connection refused for a while is tried again within 1 s, not after up to
# 10 s (librdkafka's default backoff), and a connect that gets no answer is given up
# after 3 s, not 30 s (kube-proxy's race below).
README_CLIENT = CLIENT_SETTINGS
SETUP_TIMEOUT_MS = int(README_CLIENT["socket.connection.setup.timeout.ms"])


def test_all_broker_pods_deleted_client_of_the_bootstrap_service_resumes(
    node: NodeHandle, client: ClientPod
) -> None:
    """Issue 27: every broker pod deleted at once (graceful) while idempotent acks=all
    producers know only the `demo-bootstrap:9092` Service the docs name. It used to
    produce again only after 31-33 s: a connect hung until librdkafka's 30 s connect
    timeout. Two causes. One: a connect sent to a deleted pod's address (a pod DNS name
    cached from before the deletion; a terminating endpoint still routed to): now a
    leaving broker is seen unready by its readiness probe before its address goes, and
    the brokers advertise their own ClusterIP Services, not their pod DNS names. Two
    (2 of 9 runs, on the bootstrap Service, as the new pods turned Ready): kube-proxy's
    iptables mode drops a Service's REJECT rule (filter table) a moment before it adds
    its DNAT rules (nat table) when the Service gets its first ready endpoint; a SYN
    sent in between is conntracked un-NATed to the ClusterIP, nothing answers there, and
    its retransmits follow that entry (seen with `conntrack -E`: the hung connects' entries
    had the ClusterIP as their reply source, made during kube-proxy's restore;
    kubernetes/kubernetes#48719). No Service setting avoids it (the transition happens
    whenever every broker was down); a client gives up such a connect and the next one
    is NATed. So one producer has the settings the operator puts in User Secrets and the
    README recommends (README_CLIENT: 3 s connection setup timeout, 1 s reconnect
    backoff): it produces again soon after a second broker is Ready (acks=all,
    min.insync.replicas=2: the first moment a write can succeed), asserted under 12 s and
    measured against the issue's 5 s. One with librdkafka's defaults (30 s connect
    timeout, 10 s backoff) is measured and reported, its hung connects with it. Nothing
    is lost or duplicated."""
    default = client.producer("demo-bootstrap:9092", TOPIC, "allgone", rate=40)
    tuned = BackgroundProducer(
        node, NS, client.name, "demo-bootstrap:9092", TOPIC, "tuned", 40, README_CLIENT
    )
    wait_for(tuned.started.is_set, 60, "producer tuned to start", check=tuned.check)
    producers = (default, tuned)

    def check() -> None:
        for p in producers:
            p.check()

    for p in producers:
        p.wait_for_acks(100, 120, "before deleting every broker pod")
    old = {p["metadata"]["uid"] for p in node.pods(NS, BROKERS)}
    t0 = time.monotonic()
    node.kubectl("delete", "pod", "-n", NS, *[f"demo-broker-{i}" for i in range(3)], "--wait=false")

    seen_ready: dict[str, float] = {}  # new pod -> when it was first seen Ready

    def first_ready() -> float | None:
        for p in node.pods(NS, BROKERS):
            if p["metadata"]["uid"] not in old and pod_ready_now(p):
                seen_ready.setdefault(p["metadata"]["name"], time.monotonic())
        return min(seen_ready.values()) if seen_ready else None

    ready_at = wait_for(
        first_ready, 180, "a new broker pod Ready", every=0.2, ignore=RETRY, check=check
    )

    def ready_count() -> int:
        first_ready()
        return len(seen_ready)

    # acks=all with min.insync.replicas=2 needs a second broker back in the ISR too.
    wait_for(
        lambda: ready_count() >= 2,
        180,
        "a second new broker pod Ready",
        every=0.2,
        ignore=RETRY,
        check=check,
    )
    second_at = sorted(seen_ready.values())[1]
    # A partition whose in-sync replicas all left leads again only from the last of them
    # (no unclean election): when that broker is the third back, writes wait for it.
    wait_for(
        lambda: ready_count() >= 3,
        180,
        "every new broker pod Ready",
        every=0.2,
        ignore=RETRY,
        check=check,
    )
    last_at = max(seen_ready.values())
    gaps: dict[str, tuple[float, float]] = {}  # producer -> (no acks for, resumed after Ready)
    for p in producers:
        # Producing again: acks after the outage (the longest pause since the deletion).
        p.wait_for_acks(50, 60, f"{p.prefix}, after the first broker is Ready")
        times = [t for t in p.ack_times if t >= t0 - 1]
        pause = max(range(1, len(times)), key=lambda i: times[i] - times[i - 1])
        gaps[p.prefix] = (times[pause] - times[pause - 1], times[pause] - ready_at)
    wait_cluster_ready(node, 300)
    wait_for(lambda: isr_full(node), 180, "every ISR whole again", ignore=RETRY)
    for p in producers:
        print(p.stop())
    records = client.consume(BOOTSTRAP, TOPIC, "verify-allgone")
    readies = sorted(round(t - t0, 1) for t in seen_ready.values())
    # librdkafka logs each connection setup that timed out (kube-proxy's race above).
    hung = {p.prefix: [x for x in p.other if "Connection setup timed out" in x] for p in producers}
    print(
        f"all broker pods deleted: first broker Ready {ready_at - t0:.1f}s after the "
        f"deletion, the second {second_at - t0:.1f}s (new pods Ready at {readies}s); "
        + "; ".join(
            f"{p.prefix}: no acks for {gaps[p.prefix][0]:.1f}s, producing again "
            f"{gaps[p.prefix][1]:+.1f}s after the first Ready, acked {len(p.acked)}, "
            f"delivery errors {len(p.errors)}, connects timed out {len(hung[p.prefix])}"
            for p in producers
        )
    )
    for p in producers:
        assert_exactly_once(p.acked, records, p.prefix)
        for line in hung[p.prefix]:
            print(f"[{p.prefix}] {line}")
    # Each of the tuned producer's gave up after its 3 s, not librdkafka's 30 s. It
    # checks the timeout on its 1 s broker timer, which a loaded node delays further
    # (4.4 s seen in CI): "well short of 30 s" is the claim, so the bound is 3 times 3 s.
    waited = [int(m.group(1)) for x in hung["tuned"] if (m := re.search(r"after (\d+)ms", x))]
    assert len(waited) == len(hung["tuned"]), hung["tuned"]
    assert all(ms < 3 * SETUP_TIMEOUT_MS for ms in waited), hung["tuned"]
    # acks=all with min.insync.replicas=2: no write can succeed before a second broker
    # is back, so the 5 s count from then (the pods' own start spread, 0-2 s here, is
    # not the clients' to win back). A partition may wait for the third one too (the
    # last of its in-sync replicas to leave): the bound asserted counts from whichever
    # of the two came later for the writes.
    gap = gaps["tuned"][1] - (second_at - ready_at)
    after_all = gaps["tuned"][1] - (last_at - ready_at)
    # The goal is 5 s. Printed against the goal; the bound asserted is what tells
    # a reconnect from a client left to its own timeouts (30 s connect, 10 s backoff).
    print(
        f"[reconnect] tuned producer again {gap:.1f}s after a second broker Ready (goal 5 s), "
        f"{after_all:.1f}s after the last"
    )
    assert after_all < 12, (
        f"producing resumed {gap:.1f}s after a second broker was Ready, "
        f"{after_all:.1f}s after the last"
    )


def pod_ready_now(pod: dict) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


# ---------------------------------------------------------- external listeners (issue 27)

EXT_PORT, LB_PORT, ING_PORT = 9094, 9095, 9096
EXT_USER = "outside"
# No cloud load balancer runs here: LoadBalancerStandIn plays its part. It gives each
# LoadBalancer Service of the `lb` listener an address of its own (bootstrap .40, broker
# b .41+b), adds that address to the node's interface, and writes it into the Service's
# status.loadBalancer, as a cloud controller would. kube-proxy then forwards what
# reaches that address and port to the Service's pods (its rules for load balancer
# ingress IPs), exactly as on a cloud node; the brokers advertise it.
LB_BASE = "172.31.255."
LB_INGRESS = {
    "name": "ing",
    "type": "ingress",
    "port": ING_PORT,
    "tls": True,
    "configuration": {
        "bootstrap": {"host": "kafka.demo.example"},
        "brokers": [{"broker": b, "host": f"kafka-{b}.demo.example"} for b in range(5)],
    },
}


class LoadBalancerStandIn:
    def __init__(self, node: NodeHandle) -> None:
        self.node = node
        self.added: list[str] = []
        self.assigned: dict[str, str] = {}
        self.stopping = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @staticmethod
    def address(service: str) -> str:
        last = service.rsplit("-", 1)[1]
        return LB_BASE + str(40 if last == "bootstrap" else 41 + int(last))

    def _run(self) -> None:
        while not self.stopping.wait(0.5):
            try:
                self._assign()
            except RETRY as e:
                self.errors.append(str(e))

    def _assign(self) -> None:
        found = self.node.get("svc", "-n", NS, "-l", "straitmq.io/listener=lb")["items"]
        for svc in found:
            name = svc["metadata"]["name"]
            if svc["spec"]["type"] != "LoadBalancer":
                continue
            ip = self.address(name)
            if ip not in self.added:
                subprocess.run(["ip", "addr", "add", f"{ip}/32", "dev", NODE_IFACE], check=True)
                self.added.append(ip)
            if (svc.get("status") or {}).get("loadBalancer", {}).get("ingress"):
                continue
            status = {"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}}
            patch = ["--subresource=status", "--type=merge", "-p", json.dumps(status)]
            self.node.kubectl("patch", "svc", name, "-n", NS, *patch)
            self.assigned[name] = ip

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)
        for ip in self.added:
            subprocess.run(["ip", "addr", "del", f"{ip}/32", "dev", NODE_IFACE], check=False)


@dataclass
class External:
    ca: Path
    scram: dict[str, str]  # librdkafka settings of the SCRAM User over TLS
    lb: LoadBalancerStandIn

    def bootstrap(self, node: NodeHandle, listener: str) -> str:
        st = node.get("mqcluster", "demo", "-n", NS)["status"]
        (found,) = [x for x in st["listeners"] if x["name"] == listener]
        return found["bootstrapServers"]


@pytest.fixture(scope="module")
def external(node: NodeHandle, demo: dict[str, float]) -> Iterator[External]:
    """The demo cluster with three external listeners: `ext` (NodePort, TLS + SCRAM),
    `lb` (LoadBalancer, plain) and `ing` (ingress, TLS passthrough), and a SCRAM User."""
    lb = LoadBalancerStandIn(node)
    t0 = time.monotonic()
    listeners = [
        {
            "name": "ext",
            "type": "nodeport",
            "port": EXT_PORT,
            "tls": True,
            "authentication": {"type": "scram-sha-512"},
        },
        {"name": "lb", "type": "loadbalancer", "port": LB_PORT},
        LB_INGRESS,
    ]
    patch = {"spec": {"listeners": {"external": listeners}}}
    node.kubectl("patch", "mqcluster", "demo", "-n", NS, "--type=merge", "-p", json.dumps(patch))
    user = {
        "apiVersion": "straitmq.io/v1alpha1",
        "kind": "User",
        "metadata": {"name": EXT_USER, "namespace": NS},
        "spec": {"cluster": "demo", "authentication": {"type": "scram-sha-512"}},
    }
    node.kubectl("apply", "-f", "-", input=json.dumps(user))

    def advertising() -> bool:
        """Every broker registered with the addresses status.listeners gives."""
        st = node.get("mqcluster", "demo", "-n", NS)["status"]
        if st.get("phase") != "Ready" or len(st.get("listeners") or []) != 3:
            return False
        want = {x["name"]: x["addresses"] for x in st["listeners"]}
        brokers = node.admin(NS, "/api/v1/cluster", BROKERS)["brokers"]
        got = {
            name: [":".join(map(str, b["endpoints"][f"EXT_{name.upper()}"])) for b in brokers]
            for name in want
            if all(f"EXT_{name.upper()}" in (b.get("endpoints") or {}) for b in brokers)
        }
        return len(brokers) == 3 and got == want

    wait_for(
        advertising,
        600,
        "every broker advertising its external addresses",
        every=1,
        ignore=RETRY,
        detail=lambda: json.dumps(node.get("mqcluster", "demo", "-n", NS).get("status")),
    )
    print(f"external listeners added, brokers rolled in {time.monotonic() - t0:.0f}s")
    node.kubectl(
        "wait", "-n", NS, "--for=condition=Ready", f"user/{EXT_USER}", "--timeout=120s", timeout=150
    )
    secret = node.get("secret", EXT_USER, "-n", NS)["data"]
    ca = node.get("secret", "demo-cluster-ca-cert", "-n", NS)["data"]["ca.crt"]
    ca_file = node.work_dir / "demo-ca.crt"
    ca_file.write_bytes(base64.b64decode(ca))
    scram = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": EXT_USER,
        "sasl.password": base64.b64decode(secret["password"]).decode(),
        "ssl.ca.location": str(ca_file),  # host names (and IPs) checked: the default
    }
    try:
        yield External(ca_file, scram, lb)
    finally:
        lb.stop()


def test_nodeport_listener_over_tls_and_scram_from_the_host(
    node: NodeHandle, external: External
) -> None:
    """A client on the host, outside the pod network, knowing only the node's address
    and the bootstrap node port: it bootstraps, is given each broker at NODE_IP and its
    own node port, checks the brokers' certificates (they carry NODE_IP), logs in with
    SCRAM, produces with acks=all and consumes."""
    bootstrap = external.bootstrap(node, "ext")
    assert bootstrap.startswith(f"{NODE_IP}:"), bootstrap
    ports = {
        i: node.get("svc", f"demo-ext-{i}", "-n", NS)["spec"]["ports"][0]["nodePort"]
        for i in range(3)
    }
    producer = BackgroundProducer(
        node, NS, None, bootstrap, TOPIC, "nodeport", rate=40, config=external.scram
    )
    producer.wait_for_acks(200, 120, "through the node port")
    print(producer.stop())
    brokers, records = consume_on_host(bootstrap, TOPIC, "verify-nodeport", external.scram)
    assert sorted(brokers) == sorted(f"{NODE_IP}:{p}" for p in ports.values()), (brokers, ports)
    assert_exactly_once(producer.acked, records, "nodeport")
    # SCRAM is enforced on the listener: a wrong password gets no metadata.
    bad = {**external.scram, "sasl.password": "wrong", "bootstrap.servers": bootstrap}
    script = (
        "import json, sys\n"
        "from confluent_kafka.admin import AdminClient\n"
        "a = AdminClient(json.loads(sys.argv[1]))\n"
        "try:\n"
        "    a.list_topics(timeout=8)\n"
        "except Exception as e:\n"
        "    print('REFUSED', e)\n"
    )
    wrong = subprocess.run(
        [sys.executable, "-c", script, json.dumps(bad)], capture_output=True, text=True, timeout=60
    )
    assert "REFUSED" in wrong.stdout, wrong.stdout[-500:] + wrong.stderr[-500:]
    # librdkafka logs why: "SASL authentication error: Authentication failed ...".
    assert "authentication failed" in wrong.stderr.lower(), wrong.stderr[-500:]


def test_loadbalancer_listener_reached_at_the_address_written_into_its_status(
    node: NodeHandle, external: External
) -> None:
    """The LoadBalancer listener: the addresses LoadBalancerStandIn wrote into the
    Services' status are what the brokers advertise, and a client on the host reaches
    every broker through them (kube-proxy forwards load balancer ingress IPs)."""
    bootstrap = external.bootstrap(node, "lb")
    assert bootstrap == f"{LB_BASE}40:{LB_PORT}", bootstrap
    producer = BackgroundProducer(node, NS, None, bootstrap, TOPIC, "lb", rate=40)
    producer.wait_for_acks(100, 120, "through the load balancer addresses")
    print(producer.stop())
    brokers, records = consume_on_host(bootstrap, TOPIC, "verify-lb", {})
    assert sorted(brokers) == [f"{LB_BASE}{41 + b}:{LB_PORT}" for b in range(3)], brokers
    assert_exactly_once(producer.acked, records, "lb")


def test_ingress_listener_rendered_and_accepted_by_the_api_server(
    node: NodeHandle, external: External
) -> None:
    """No ingress controller runs here. Exercised: the operator's Ingresses (one per
    broker and a bootstrap one, TLS passthrough) pass the API server's validation, each
    routes its host to a Service that selects exactly its broker, and that broker's
    listener answers TLS for the host (SNI) with a certificate from the cluster CA that
    names it. Not exercised: ingress-nginx's SNI routing itself, and advertised
    addresses resolving through DNS to a controller."""
    ings = {
        i["metadata"]["name"]: i
        for i in node.get("ingress", "-n", NS, "-l", "straitmq.io/listener=ing")["items"]
    }
    assert set(ings) == {"demo-ing-bootstrap", "demo-ing-0", "demo-ing-1", "demo-ing-2"}
    st = node.get("mqcluster", "demo", "-n", NS)["status"]
    (ing,) = [x for x in st["listeners"] if x["name"] == "ing"]
    assert ing["bootstrapServers"] == "kafka.demo.example:443"
    assert ing["addresses"] == [f"kafka-{b}.demo.example:443" for b in range(3)]
    ctx = ssl.create_default_context(cafile=str(external.ca))
    for b in range(3):
        i = ings[f"demo-ing-{b}"]
        annotations = i["metadata"]["annotations"]
        assert annotations["nginx.ingress.kubernetes.io/ssl-passthrough"] == "true"
        assert i["spec"]["ingressClassName"] == "nginx"
        (rule,) = i["spec"]["rules"]
        host = f"kafka-{b}.demo.example"
        assert rule["host"] == host
        backend = rule["http"]["paths"][0]["backend"]["service"]
        assert backend == {"name": f"demo-ing-{b}", "port": {"number": ING_PORT}}
        svc = node.get("svc", f"demo-ing-{b}", "-n", NS)
        slices = node.get(
            "endpointslices", "-n", NS, "-l", f"kubernetes.io/service-name=demo-ing-{b}"
        )["items"]
        ips = {a for sl in slices for e in sl.get("endpoints") or [] for a in e["addresses"]}
        pod_ip = node.get("pod", f"demo-broker-{b}", "-n", NS)["status"]["podIP"]
        assert ips == {pod_ip}, (b, ips, pod_ip)
        # What ingress-nginx would pass through: TLS to the backend, SNI the host.
        with socket.create_connection((svc["spec"]["clusterIP"], ING_PORT), timeout=10) as raw:
            with ctx.wrap_socket(raw, server_hostname=host) as tls:
                assert tls.version() in ("TLSv1.2", "TLSv1.3")
    print("ingress listener: 4 Ingresses accepted, TLS for each broker's host checked")


def test_controller_quorum_3_5_3_while_producing(node: NodeHandle, client: ClientPod) -> None:
    """spec.controllers.replicas 3 -> 5 -> 3 on real pods (issue 28): the operator adds
    the two new controllers as voters one at a time once each caught up, then removes
    them (never the active one first), the StatefulSet following; a producer through the
    bootstrap Service keeps going, every record exactly once. Then a follower
    controller's PVC and pod are deleted: it comes back on a new volume with a new
    directory id, and the operator replaces the voter."""
    producer = client.producer(BOOTSTRAP, TOPIC, "quorum", rate=40)
    producer.wait_for_acks(100, 120, "before the quorum changes")

    def quorum() -> dict:
        return node.admin(NS, "/api/v1/quorum", BROKERS)

    def voters() -> set[int]:
        return {v["node_id"] for v in quorum()["voters"]}

    first = voters()
    assert len(first) == 3, quorum()

    def settled(n: int) -> bool:
        q = quorum()
        sts = node.get("statefulset", "demo-controller", "-n", NS)
        return (
            len(q["voters"]) == n
            and not q["voter_change_pending"]
            and sts["spec"]["replicas"] == n
            and sts["status"].get("readyReplicas") == n
        )

    def patch(n: int) -> None:
        body = json.dumps({"spec": {"controllers": {"replicas": n}}})
        node.kubectl("patch", "mqcluster", "demo", "-n", NS, "--type=merge", "-p", body)

    t0 = time.monotonic()
    patch(5)
    wait_for(lambda: settled(5), 600, "five voters", every=2, ignore=RETRY, check=producer.check)
    up = time.monotonic() - t0
    assert first < voters()
    producer.wait_for_acks(100, 120, "with five voters")
    t1 = time.monotonic()
    patch(3)
    wait_for(lambda: settled(3), 600, "three voters", every=2, ignore=RETRY, check=producer.check)
    down = time.monotonic() - t1
    assert voters() == first, quorum()
    reasons = {
        e["reason"]
        for e in node.get("events", "-n", NS)["items"]
        if e["involvedObject"]["kind"] == "MQCluster"
    }
    assert {"VoterAdded", "VoterRemoved"} <= reasons, reasons
    producer.wait_for_acks(100, 120, "after the quorum changes")

    # A lost volume: a follower controller's PVC and pod deleted. Its pod comes back on a
    # new, empty volume with a new directory id; the operator replaces the voter.
    q = quorum()
    dirs = {v["node_id"]: v["directory_id"] for v in q["voters"]}
    assert all(dirs.values()), q  # every change above pinned the voters' directories
    victim = max(v for v in dirs if v != q["leader_id"])
    pod = f"demo-controller-{victim - 1000}"  # the operator's CONTROLLER_ID_BASE
    claim = node.get("pvc", f"data-{pod}", "-n", NS)["metadata"]["uid"]
    t2 = time.monotonic()
    node.kubectl("delete", "pvc", f"data-{pod}", "-n", NS, "--wait=false")
    node.kubectl("delete", "pod", pod, "-n", NS, "--wait=false")

    def replaced() -> bool:
        # The StatefulSet may recreate the pod while the old claim is still terminating:
        # that pod waits on a claim that goes away, so it is deleted again (as a person
        # replacing a volume does).
        try:
            now = node.get("pvc", f"data-{pod}", "-n", NS)["metadata"]
        except RuntimeError:  # gone, not made again yet
            now = None
        p = node.get("pod", pod, "-n", NS) if now is None or now["uid"] == claim else None
        if p is not None and p["status"].get("phase") == "Pending":
            if not p["metadata"].get("deletionTimestamp"):
                node.kubectl("delete", "pod", pod, "-n", NS, "--wait=false")
            return False
        q = quorum()
        now_dirs = {v["node_id"]: v["directory_id"] for v in q["voters"]}
        return (
            set(now_dirs) == set(dirs)
            and now_dirs[victim] not in (None, dirs[victim])
            and not q["voter_change_pending"]
            and settled(3)
        )

    wait_for(replaced, 600, f"voter {victim} replaced", every=2, ignore=RETRY, check=producer.check)
    heal = time.monotonic() - t2
    assert node.get("pvc", f"data-{pod}", "-n", NS)["metadata"]["uid"] != claim
    others = {v["node_id"]: v["directory_id"] for v in quorum()["voters"] if v["node_id"] != victim}
    assert others == {k: d for k, d in dirs.items() if k != victim}
    producer.wait_for_acks(100, 120, "after the voter's replacement")
    print(producer.stop())
    assert_exactly_once(producer.acked, client.consume(BOOTSTRAP, TOPIC, "verify-quorum"), "quorum")
    wait_cluster_ready(node, 300)
    print(
        f"\n[quorum figures, real node] controllers 3->5 {up:.0f} s, 5->3 {down:.0f} s, "
        f"a lost volume replaced {heal:.0f} s"
    )


def test_scale_brokers_3_5_3_and_rolling_restart(
    node: NodeHandle, client: ClientPod, external: External
) -> None:
    """Scaling and a rolling restart under an in-cluster producer and, through the
    NodePort listener, a producer on the host (the same client throughout): brokers 3
    and 4 get their own listener Services and addresses, which go again with them."""
    producer = client.producer(BOOTSTRAP, TOPIC, "scale", rate=40)
    producer.wait_for_acks(100, 120, "before scaling")
    outside = BackgroundProducer(
        node, NS, None, external.bootstrap(node, "ext"), TOPIC, "outside", 20, external.scram
    )
    outside.wait_for_acks(50, 120, "the host's producer, before scaling")
    t0 = time.monotonic()
    node.kubectl("scale", "mqcluster", "demo", "-n", NS, "--replicas=5")
    wait_for(lambda: len(node.pods(NS, BROKERS)) == 5, 60, "5 broker pods", ignore=RETRY)
    wait_cluster_ready(node, 600, brokers=5)
    on_new = wait_for(
        lambda: {b for p in partitions(node) for b in p["replicas"]} & {3, 4},
        120,
        "partitions spread onto brokers 3 and 4",
        ignore=RETRY,
    )
    up = time.monotonic() - t0
    producer.wait_for_acks(100, 120, "after scaling up")
    outside.wait_for_acks(50, 120, "the host's producer, after scaling up")
    st = node.get("mqcluster", "demo", "-n", NS)["status"]
    (ext,) = [x for x in st["listeners"] if x["name"] == "ext"]
    assert len(ext["addresses"]) == 5 and all(a.startswith(NODE_IP) for a in ext["addresses"])
    for svc in ("demo-ext-3", "demo-ext-4", "demo-lb-3", "demo-lb-4", "demo-ing-4"):
        assert node.kubectl("get", "svc", svc, "-n", NS, check=False).returncode == 0, svc
    new_volumes = {
        c: provisioned_volume(node, node.get("pvc", c, "-n", NS))
        for c in ("data-demo-broker-3", "data-demo-broker-4")
    }
    t1 = time.monotonic()
    node.kubectl("scale", "mqcluster", "demo", "-n", NS, "--replicas=3")
    # Drained before the shrink: whenever the StatefulSet is seen below 5 replicas, no
    # partition has a replica on broker 3 or 4 any more.
    early: list[str] = []

    def shrunk() -> bool:
        sts = node.get("statefulset", "demo-broker", "-n", NS)["spec"]["replicas"]
        if sts < 5:
            on = [p["partition"] for p in partitions(node) if {3, 4} & set(p["replicas"])]
            if on:
                early.append(f"StatefulSet at {sts} with partitions {on} on brokers 3/4")
        return sts == 3 and len(node.pods(NS, BROKERS)) == 3

    wait_for(
        shrunk,
        600,
        "3 broker pods again",
        every=1,
        ignore=RETRY,
        check=producer.check,
    )
    wait_cluster_ready(node, 300, brokers=3)
    # Drained before the shrink: nothing lives on 3 or 4, every ISR is whole.
    wait_for(
        lambda: isr_full(node, brokers={0, 1, 2}), 120, "ISRs on brokers 0-2 only", ignore=RETRY
    )
    down = time.monotonic() - t1
    assert not early, early[:3]
    # The drained brokers' claims go with the shrink (whenScaled: Delete), and with them
    # their volumes: the provisioner deletes the PVs and their directories.
    for claim, (pv, path) in new_volumes.items():
        wait_for(
            lambda claim=claim, pv=pv, path=path: (
                node.kubectl("get", "pvc", claim, "-n", NS, check=False).returncode != 0
                and node.kubectl("get", "pv", pv, check=False).returncode != 0
                and not path.exists()
            ),
            120,
            f"{claim}, its volume {pv} and {path} deleted",
            ignore=RETRY,
        )
    reasons = [
        e["reason"]
        for e in sorted(
            node.get("events", "-n", NS)["items"],
            key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "",
        )
        if e["involvedObject"]["kind"] == "MQCluster"
    ]
    assert "Draining" in reasons and "ScaledDown" in reasons, reasons
    assert reasons.index("Draining") < len(reasons) - reasons[::-1].index("ScaledDown"), reasons
    producer.wait_for_acks(100, 120, "after scaling down")
    outside.wait_for_acks(50, 120, "the host's producer, after scaling down")
    left = node.get("svc", "-n", NS, "-l", "straitmq.io/listener")["items"]
    assert sorted(x["metadata"]["name"] for x in left) == sorted(
        f"demo-{x}-{b}" for x in ("ext", "lb", "ing") for b in ("bootstrap", 0, 1, 2)
    )
    own = node.get("svc", "-n", NS, "-l", "app.kubernetes.io/component=broker-address")
    assert sorted(x["metadata"]["name"] for x in own["items"]) == [
        f"demo-broker-{b}" for b in range(3)
    ]

    # A broker config change restarts the brokers one at a time.
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in node.pods(NS, BROKERS)}
    t2 = time.monotonic()
    node.kubectl(
        "patch",
        "mqcluster",
        "demo",
        "-n",
        NS,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"brokers": {"config": {"log.retention.check.interval.ms": 120000}}}}),
    )

    def rolled() -> bool:
        pods = node.pods(NS, BROKERS)
        return len(pods) == 3 and all(
            uids.get(p["metadata"]["name"]) != p["metadata"]["uid"] for p in pods
        )

    wait_for(rolled, 600, "every broker pod replaced", every=1, ignore=RETRY, check=producer.check)
    wait_cluster_ready(node, 300)
    wait_for(lambda: isr_full(node), 120, "ISRs whole after the roll", ignore=RETRY)
    roll = time.monotonic() - t2
    producer.wait_for_acks(100, 120, "after the rolling restart")
    outside.wait_for_acks(50, 120, "the host's producer, after the rolling restart")
    print(producer.stop())
    print(outside.stop())
    records = client.consume(BOOTSTRAP, TOPIC, "verify-scale")
    assert_exactly_once(producer.acked, records, "scale")
    assert_exactly_once(outside.acked, records, "outside")
    print(
        f"scale 3->5 with replicas on {sorted(on_new)} {up:.0f}s, 5->3 {down:.0f}s, "
        f"rolling restart {roll:.0f}s"
    )


# ----------------------------------------------------------------- Spark on Kubernetes

SPARK_NS = "spark-jobs"
SPARK_TOPIC = "spark-orders"
SPARK_RECORDS = 3000

# Run in the client pod: an idempotent acks=all producer writing `n` records to `topic`,
# one "ACK <value> <partition> <offset>" line per acknowledged record.
PRODUCE_N = r"""
import sys
from confluent_kafka import Producer
bootstrap, topic, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
              "linger.ms": 5})
def report(err, msg):
    if err is None:
        print(f"ACK {msg.value().decode()} {msg.partition()} {msg.offset()}")
    else:
        print(f"ERR {msg.value().decode()} {err}")
for i in range(n):
    p.produce(topic, key=str(i).encode(), value=f"spark-{i}".encode(), on_delivery=report)
    p.poll(0)
assert p.flush(120) == 0
"""


def test_spark_on_kubernetes_reads_a_topic_into_its_volume(
    node: NodeHandle, client: ClientPod
) -> None:
    """spark-jobs/k8s/spark-submit.sh as its README says: spark-submit (the .venv's
    pyspark) against the API server in cluster mode; the driver pod starts an executor pod,
    both read the topic from the brokers' Service and write Parquet to the job's PVC."""
    topic = yaml.safe_load((ROOT / "examples" / "open" / "topic.yaml").read_text())
    topic["metadata"]["name"] = SPARK_TOPIC
    node.kubectl("apply", "-n", NS, "-f", "-", input=json.dumps(topic))
    node.kubectl(
        "wait",
        "-n",
        NS,
        "--for=condition=Ready",
        f"topic/{SPARK_TOPIC}",
        "--timeout=120s",
        timeout=150,
    )
    out = client.python(PRODUCE_N, BOOTSTRAP, SPARK_TOPIC, str(SPARK_RECORDS))
    acked = {}
    for line in out.splitlines():
        words = line.split()
        assert words[0] == "ACK", line
        acked[words[1]] = (int(words[2]), int(words[3]))
    assert len(acked) == SPARK_RECORDS

    node.kubectl("create", "namespace", SPARK_NS)
    node.kubectl("apply", "-n", SPARK_NS, "-f", str(ROOT / "spark-jobs" / "k8s" / "rbac.yaml"))
    claim = yaml.safe_load((ROOT / "spark-jobs" / "k8s" / "storage.yaml").read_text())
    # ReadWriteMany, shared by the driver and the executors: the provisioner's shared class.
    claim["spec"]["storageClassName"] = SHARED_STORAGE_CLASS
    node.kubectl("apply", "-n", SPARK_NS, "-f", "-", input=json.dumps(claim))

    # What a user adds to spark-submit.sh for a small node, through spark-defaults.conf:
    # the locally imported image, small requests, and executor pods kept to be checked.
    conf_dir = node.work_dir / "spark-conf"
    conf_dir.mkdir(exist_ok=True)
    (conf_dir / "spark-defaults.conf").write_text(
        "\n".join(
            [
                "spark.kubernetes.container.image.pullPolicy Never",
                "spark.kubernetes.driver.request.cores 100m",
                "spark.kubernetes.executor.request.cores 100m",
                "spark.driver.memory 512m",
                "spark.executor.memory 512m",
                "spark.kubernetes.executor.deleteOnTermination false",
                "spark.kubernetes.submission.waitAppCompletion true",
                "",
            ]
        )
    )
    # spark-submit authenticates as the job's ServiceAccount (a bound token): its Kubernetes
    # client cannot read the admin kubeconfig's EC client key.
    token = node.kubectl("create", "token", "spark", "-n", SPARK_NS, "--duration=1h").stdout
    cluster = json.loads(Path(node.kubeconfig).read_text())["clusters"][0]
    kubeconfig = node.work_dir / "spark-submit.kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [cluster],
                "users": [{"name": "spark", "user": {"token": token.strip()}}],
                "contexts": [
                    {"name": "spark", "context": {"cluster": cluster["name"], "user": "spark"}}
                ],
                "current-context": "spark",
            }
        )
    )
    env = {
        **node.env,
        "KUBECONFIG": str(kubeconfig),
        "K8S_API": node.server,
        "NAMESPACE": SPARK_NS,
        "IMAGE": SPARK_JOBS_IMAGE,
        "EXECUTORS": "1",
        # The .venv activated: its spark-submit finds Spark through the python on PATH.
        "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{node.env['PATH']}",
        "SPARK_SUBMIT": "spark-submit",
        "SPARK_CONF_DIR": str(conf_dir),
    }
    t0 = time.monotonic()
    submit = subprocess.run(
        [
            str(ROOT / "spark-jobs" / "k8s" / "spark-submit.sh"),
            "topic_to_parquet.py",
            "--bootstrap",
            f"demo-bootstrap.{NS}.svc:9092",
            "--topic",
            SPARK_TOPIC,
            "--out",
            "/data/out/orders.parquet",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    took = time.monotonic() - t0
    drivers = node.pods(SPARK_NS, "spark-role=driver")
    executors = node.pods(SPARK_NS, "spark-role=executor")
    logs = "".join(
        node.kubectl("logs", "-n", SPARK_NS, p["metadata"]["name"], check=False).stdout[-3000:]
        for p in drivers
    )
    said = "\n".join(ln for ln in submit.stderr.splitlines() if not ln.startswith("\tat "))
    assert submit.returncode == 0, f"{said[-4000:]}\ndriver:\n{logs}"
    assert [p["status"]["phase"] for p in drivers] == ["Succeeded"], logs
    assert executors, "no executor pod was started"
    assert f"{SPARK_RECORDS} records in /data/out/orders.parquet" in logs, logs

    # The output, read from the claim's directory on this machine.
    import pyarrow.parquet as pq

    pvc = node.get("pvc", "spark-data", "-n", SPARK_NS)
    pv = node.get("pv", pvc["spec"]["volumeName"])
    assert pv["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"] == (
        LOCAL_PATH_PROVISIONER
    )
    table = pq.read_table(Path(pv["spec"]["hostPath"]["path"]) / "out" / "orders.parquet")
    rows = table.select(["value", "partition", "offset"]).to_pylist()
    got = {r["value"]: (r["partition"], r["offset"]) for r in rows}
    assert len(rows) == len(got) == SPARK_RECORDS
    assert got == acked
    node.kubectl("delete", "namespace", SPARK_NS, "--wait=false")
    print(f"spark-submit to a finished job: {took:.0f}s, {len(executors)} executor pod(s)")


# ------------------------------------------------------ the secured MQCluster of examples/

SECURE_NS = "secure"
SECURE_CLIENT = r"""
import json, ssl, urllib.error, urllib.request
from confluent_kafka import Consumer, Producer

d = "/user/"
secret = {k: open(d + k).read() for k in
          ("bootstrap.servers", "password", "sasl.mechanism", "security.protocol", "ca.crt",
           "socket.connection.setup.timeout.ms", "reconnect.backoff.max.ms")}
conf = {"bootstrap.servers": secret["bootstrap.servers"],
        "security.protocol": secret["security.protocol"],
        "sasl.mechanism": secret["sasl.mechanism"], "sasl.username": "orders-app",
        "sasl.password": secret["password"], "ssl.ca.location": d + "ca.crt",
        # the client settings the Secret carries (CLIENT_SETTINGS), as they are
        "socket.connection.setup.timeout.ms": secret["socket.connection.setup.timeout.ms"],
        "reconnect.backoff.max.ms": secret["reconnect.backoff.max.ms"]}
acked = []
p = Producer({**conf, "acks": "all", "enable.idempotence": True})
for i in range(50):
    p.produce("orders", f"s{i}".encode(),
              on_delivery=lambda e, m: e is None and acked.append(m.value().decode()))
p.flush(60)
c = Consumer({**conf, "group.id": "orders-secure", "auto.offset.reset": "earliest"})
c.subscribe(["orders"])
got = set()
for _ in range(300):
    m = c.poll(0.5)
    if m is not None and m.error() is None:
        got.add(m.value().decode())
    if got >= set(acked):
        break
c.close()
# Without the password: refused, and the topic stays out of reach.
errors = []
bad = Producer({**conf, "sasl.password": "wrong", "message.timeout.ms": 5000,
                "error_cb": lambda e: errors.append(str(e))})
bad.produce("orders", b"x", on_delivery=lambda e, m: errors.append(str(e)))
bad.flush(15)
# The controllers' port: https (the cluster CA), and nothing but probes without a
# certificate of the cluster's own.
ctx = ssl.create_default_context(cafile=d + "ca.crt")
url = "https://secure-controller-0.secure-controller.secure.svc:9093"
health = urllib.request.urlopen(url + "/healthz", context=ctx, timeout=10).status
try:
    urllib.request.urlopen(urllib.request.Request(url + "/controller/describe", data=b"{}",
                           method="POST"), context=ctx, timeout=10)
    refused = None
except urllib.error.HTTPError as e:
    refused = e.code
# The User's quotas (producerByteRate 1 MiB/s): past the burst a new client may make
# (Kafka measures its first rate over the whole window, 11 s), the broker throttles it
# and librdkafka reports the throttle.
throttles = []
q = Producer({**conf, "acks": 1, "linger.ms": 20,
              "throttle_cb": lambda e: throttles.append(e.throttle_time)})
for i in range(160):  # 16 MB
    while True:
        try:
            q.produce("orders", b"q" * 100_000)
            break
        except BufferError:
            q.poll(0.1)
    q.poll(0)
q.flush(120)
print(json.dumps({"acked": sorted(acked), "got": sorted(got), "bad": errors[:3],
                  "health": health, "refused": refused,
                  "throttled_s": sum(t for t in throttles if t > 0)}))
"""


def test_secure_mqcluster_and_a_user_in_real_pods(node: NodeHandle, demo: dict[str, float]) -> None:
    """examples/mqcluster.yaml (1 broker here), topic.yaml and user.yaml on the real
    kubelet: the brokers and the controllers serve TLS with certificates of the
    operator's cluster CA (the kubelet's https probes pass, the voters elect over https,
    the broker registers over https), a client pod with nothing but the User's Secret
    produces and consumes over SASL_SSL, a wrong password is refused, the User's quotas
    throttle its producer, and the controllers' port answers a caller without a cluster
    certificate with 401."""
    node.kubectl("create", "namespace", SECURE_NS)
    cluster = yaml.safe_load((ROOT / "examples" / "mqcluster.yaml").read_text())
    spec = cluster["spec"]
    spec["image"], spec["imagePullPolicy"] = APP_IMAGE, "Never"
    spec["brokers"]["replicas"] = 1
    spec["brokers"]["storage"]["size"] = "1Gi"
    spec["brokers"]["config"].update(
        {"default.replication.factor": 1, "offsets.topic.replication.factor": 1}
    )
    user = yaml.safe_load((ROOT / "examples" / "user.yaml").read_text())
    topic = yaml.safe_load((ROOT / "examples" / "topic.yaml").read_text())
    topic["spec"]["replicationFactor"] = 1
    topic["spec"]["config"]["min.insync.replicas"] = "1"
    for doc in (cluster, topic, user):
        node.kubectl("apply", "-n", SECURE_NS, "-f", "-", input=json.dumps(doc))

    def status() -> str:
        return json.dumps(node.get("mqcluster", "secure", "-n", SECURE_NS).get("status"))

    wait_for(
        lambda: node.get("mqcluster", "secure", "-n", SECURE_NS)["status"]["phase"] == "Ready",
        400,
        "MQCluster secure Ready",
        every=2,
        ignore=RETRY,
        detail=status,
    )
    for kind, name in (("topic", "orders"), ("user", "orders-app")):
        node.kubectl(
            "wait",
            "-n",
            SECURE_NS,
            "--for=condition=Ready",
            f"{kind}/{name}",
            "--timeout=180s",
            timeout=200,
        )
    ctl = node.get("pod", "secure-controller-0", "-n", SECURE_NS)["spec"]["containers"][0]
    assert ctl["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "orders-app", "namespace": SECURE_NS},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
            "containers": [
                {
                    "name": "c",
                    "image": CLIENT_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", "import time; time.sleep(10**9)"],
                    "volumeMounts": [{"name": "user", "mountPath": "/user", "readOnly": True}],
                }
            ],
            "volumes": [{"name": "user", "secret": {"secretName": "orders-app"}}],
        },
    }
    node.kubectl("apply", "-f", "-", input=json.dumps(pod))
    node.kubectl(
        "wait",
        "-n",
        SECURE_NS,
        "--for=condition=Ready",
        "pod/orders-app",
        "--timeout=120s",
        timeout=150,
    )
    out = node.kubectl(
        "exec",
        "-n",
        SECURE_NS,
        "orders-app",
        "--",
        "python",
        "-u",
        "-c",
        SECURE_CLIENT,
        timeout=300,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert len(result["acked"]) == 50 and result["got"] == result["acked"], result
    assert any("Authentication failed" in e for e in result["bad"]), result["bad"]
    assert result["health"] == 200 and result["refused"] == 401, result
    # The User's spec.quotas reached the broker: its producer was throttled.
    assert result["throttled_s"] > 0, result
    node.kubectl("delete", "namespace", SECURE_NS, "--wait=false")


# ----------------------------------------------------------------- a version roll of real pods

UPG_NS = "upgrade"
UPG = "upg"
UPG_PODS = f"app.kubernetes.io/instance={UPG},app.kubernetes.io/component in (controller,broker)"
UPG_BOOTSTRAP = f"{UPG}-bootstrap:9092"  # the bootstrap Service alone, as the docs name it
MISSING_VERSION = "9.9.9"  # no such image on the node (imagePullPolicy Never)


def test_version_roll_from_the_last_release_pauses_on_a_missing_image_and_rolls_back(
    node: NodeHandle, chart: float
) -> None:
    """Issue 37, real pods: an MQCluster made at the `spec.version` of the newest release
    of releases.toml (build-images.sh builds its image from that release's own source
    and Dockerfile) is rolled to this code by setting spec.version, under an idempotent
    acks=all producer that knows only the bootstrap Service: the controllers first (a
    follower first), then brokers 2, 1, 0, one pod at a time, status.version showing the
    progress until Done. Then a version whose image the node does not have: the first pod
    restarted onto it cannot start, the roll pauses (UpgradePaused, saying why) and the
    cluster keeps acknowledging writes; this code's version set back replaces that pod
    alone and the roll ends Done. Every acknowledged record is read back once, at the
    offset its acknowledgement named.
    The module's last test: the demo cluster has served its tests and goes, so that the
    roll has the node's two cores (run alone, only the chart is installed)."""
    old_version = release_images()[-1][0]
    new_version = app_version()
    old_image, new_image = (f"{IMAGE_REPOSITORY}:{v}" for v in (old_version, new_version))
    node.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=false")
    node.kubectl("create", "namespace", UPG_NS)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    cluster = yaml.safe_load((ROOT / "examples" / "open" / "mqcluster.yaml").read_text())
    cluster["metadata"]["name"] = UPG
    spec = cluster["spec"]
    del spec["image"]  # the operator's repository (the chart's image.repository) + version
    spec["version"], spec["imagePullPolicy"] = old_version, "Never"
    spec["upgrade"] = {"stepTimeoutSeconds": 120, "minReadySeconds": 1}
    spec["brokers"]["storage"]["size"] = "1Gi"
    spec["brokers"]["resources"] = {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    topic = yaml.safe_load((ROOT / "examples" / "open" / "topic.yaml").read_text())
    topic["spec"]["cluster"] = UPG
    node.kubectl("apply", "-n", UPG_NS, "-f", "-", input=json.dumps(cluster))
    client = ClientPod(node, UPG_NS)  # while the cluster's pods start

    def mq() -> dict:
        return node.get("mqcluster", UPG, "-n", UPG_NS)

    def condition(m: dict, kind: str) -> dict:
        conds = (m.get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == kind), {})

    def done(m: dict, version: str) -> bool:
        st = m.get("status") or {}
        v = st.get("version") or {}
        return (
            v.get("phase") == "Done"
            and v.get("to") == version
            and st.get("phase") == "Ready"
            and (st.get("brokers") or {}).get("ready") == 3
        )

    def uids() -> dict[str, str]:
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in node.pods(UPG_NS, UPG_PODS)}

    def images() -> dict[str, str]:
        return {
            p["metadata"]["name"]: next(
                c["image"]
                for c in p["spec"]["containers"]
                if c["name"] == p["metadata"]["labels"]["app.kubernetes.io/component"]
            )
            for p in node.pods(UPG_NS, UPG_PODS)
        }

    def patch(change: dict) -> None:
        node.kubectl(
            "patch", "mqcluster", UPG, "-n", UPG_NS, "--type=merge", "-p", json.dumps(change)
        )

    def status() -> str:
        return json.dumps((mq().get("status") or {}).get("version"))

    def on(version: str) -> dict:  # {} until then
        m = mq()
        return m if done(m, version) else {}

    def paused() -> dict:
        m = mq()
        return m if condition(m, "UpgradePaused").get("status") == "True" else {}

    m = wait_for(
        lambda: on(old_version),
        300,
        f"MQCluster {UPG} Ready on {old_version}",
        every=1,
        ignore=RETRY,
        detail=lambda: json.dumps(mq().get("status")),
    )
    assert set(images().values()) == {old_image}, images()
    # Release 0.1.0 has no feature levels to report: it runs at level 1.
    level = metadata_level(old_version)
    assert (m["status"].get("features") or {}).get(STRAITMQ_LEVEL, 1) == level, m["status"]
    node.kubectl("apply", "-n", UPG_NS, "-f", "-", input=json.dumps(topic))
    node.kubectl(
        "wait", "-n", UPG_NS, "--for=condition=Ready", f"topic/{TOPIC}", "--timeout=120s",
        timeout=150,
    )  # fmt: skip
    timings[f"{old_version} cluster and topic Ready"] = time.monotonic() - t0
    producer = BackgroundProducer(
        node, UPG_NS, client.name, UPG_BOOTSTRAP, TOPIC, "upgrade", 40, README_CLIENT
    )
    wait_for(producer.started.is_set, 60, "the producer to start", check=producer.check)
    producer.wait_for_acks(100, 120, f"on {old_version}")

    def roll(
        to: str, before: dict[str, str], timeout: float, what: str
    ) -> tuple[dict, list[str], list[str]]:
        """Waits for a roll to end Done on `to`, noting the pods in the order they were
        replaced and each status.version phase and progress shown on the way."""
        order: list[str] = []
        shown: list[str] = []

        def step() -> dict:
            for name, uid in uids().items():
                if uid != before.get(name) and name not in order:
                    order.append(name)
            m = mq()
            v = (m.get("status") or {}).get("version") or {}
            seen = f"{v.get('phase')} {v.get('progress')}"
            if not shown or shown[-1] != seen:
                shown.append(seen)
            return m if done(m, to) else {}

        m = wait_for(
            step, timeout, what, every=0.5, ignore=RETRY, check=producer.check, detail=status
        )
        return m, order, shown

    # The upgrade: the previous release -> this code.
    active = m["status"]["activeController"]
    before = uids()
    t1 = time.monotonic()
    patch({"spec": {"version": new_version}})
    m, order, shown = roll(new_version, before, 300, f"every pod on {new_version}")
    timings[f"roll {old_version} -> {new_version}"] = time.monotonic() - t1
    print(f"roll to {new_version}: pods replaced {order}; status.version {shown}")
    controllers = [f"{UPG}-controller-{i}" for i in range(3)]
    assert sorted(order[:3]) == controllers, order
    # A follower first, the active controller last, as the operator saw the quorum at each
    # step (leadership may move between the status read above and the first step).
    selector = f"involvedObject.name={UPG},reason=VersionRoll"
    said = [
        e["message"]
        for e in sorted(
            node.get("events", "-n", UPG_NS, "--field-selector", selector)["items"],
            key=lambda e: e.get("firstTimestamp") or e["metadata"]["creationTimestamp"],
        )
        if f"upgrading {UPG}-controller-" in e["message"]
    ]
    assert said and "(a follower of " in said[0], (said, order, active)
    assert order[3:] == [f"{UPG}-broker-{i}" for i in (2, 1, 0)], order
    assert any(s.startswith("Rolling controllers 3/3, brokers 1/3") for s in shown), shown
    v = m["status"]["version"]
    assert (v["from"], v["to"], v["progress"]) == (
        old_version,
        new_version,
        "controllers 3/3, brokers 3/3",
    ), v
    assert set(images().values()) == {new_image}, images()
    # This code on the old release's data, its levels not finalized (spec.upgrade.
    # finalizeFeatures manual): the old release could still run here. The operator says
    # what finalizing would do to the clients every broker has seen (the producer's pod).
    assert m["status"]["features"][STRAITMQ_LEVEL] == level, m["status"]["features"]
    impact = wait_for(
        lambda: condition(mq(), "FinalizeAffectsClients"),
        60,
        "the FinalizeAffectsClients condition",
        ignore=RETRY,
    )
    if level < LATEST_LEVEL:
        assert impact["reason"] == "NoClientAffected", impact
        assert impact["message"].startswith(
            f"finalizing {STRAITMQ_LEVEL} {level} -> {LATEST_LEVEL}: "
        ), impact
        assert "not in this report" not in impact["message"], impact  # every broker asked
        seen = re.search(r"no client is affected \((\d+) clients? seen\)", impact["message"])
        assert seen and int(seen.group(1)) >= 1, impact
    else:
        assert impact["reason"] == "NothingToFinalize", impact
    producer.wait_for_acks(100, 120, f"on {new_version}")
    acked_after_upgrade = producer.acks()

    # A version the node has no image for: one pod changes, then the roll pauses.
    before = uids()
    t2 = time.monotonic()
    patch({"spec": {"version": MISSING_VERSION, "upgrade": {"stepTimeoutSeconds": 10}}})
    m = wait_for(
        paused,
        120,
        "the roll paused",
        every=0.5,
        ignore=RETRY,
        check=producer.check,
        detail=status,
    )
    timings[f"roll to {MISSING_VERSION} paused"] = time.monotonic() - t2
    changed = [name for name, uid in uids().items() if uid != before.get(name)]
    assert len(changed) == 1 and changed[0] in controllers, changed
    stuck = changed[0]
    v, why = m["status"]["version"], condition(m, "UpgradePaused")
    assert v["phase"] == "Paused" and v["to"] == MISSING_VERSION, v
    assert m["status"]["phase"] == "Degraded", m["status"]["phase"]
    # Why: the pod restarted last is not back in service (the pass that paused says
    # PodNotInService; the passes after it hold the roll and keep its message).
    assert why["reason"] in ("PodNotInService", "UpgradePaused"), why
    assert f"waiting for {stuck} to be back in service" in why["message"], why
    selector = f"involvedObject.name={UPG},reason=UpgradePaused"
    events = node.get("events", "-n", UPG_NS, "--field-selector", selector)["items"]
    assert any(
        e["type"] == "Warning" and e["message"].startswith(f"PodNotInService: waiting for {stuck}")
        for e in events
    ), [e["message"] for e in events]
    assert images()[stuck] == f"{IMAGE_REPOSITORY}:{MISSING_VERSION}", images()
    states = node.get("pod", stuck, "-n", UPG_NS)["status"]["containerStatuses"]
    (waiting,) = [s["state"].get("waiting") or {} for s in states if s["name"] == "controller"]
    assert waiting.get("reason") == "ErrImageNeverPull", states
    # The cluster keeps serving (2 of 3 controllers, every broker), and the roll holds.
    producer.wait_for_acks(100, 60, "while the roll is paused")
    assert [n for n, uid in uids().items() if uid != before.get(n)] == [stuck]
    assert mq()["status"]["version"]["phase"] == "Paused"

    # Rollback: this code's version back replaces the pod that could not start, alone.
    before = uids()
    t3 = time.monotonic()
    patch({"spec": {"version": new_version, "upgrade": {"stepTimeoutSeconds": 120}}})
    m, order, shown = roll(new_version, before, 180, f"{stuck} back on {new_version}")
    timings[f"rollback {MISSING_VERSION} -> {new_version}"] = time.monotonic() - t3
    print(f"rollback: pods replaced {order}; status.version {shown}")
    assert order == [stuck], order
    assert condition(m, "UpgradePaused")["status"] == "False", condition(m, "UpgradePaused")
    v = m["status"]["version"]
    assert (v["from"], v["to"]) == (MISSING_VERSION, new_version), v
    assert set(images().values()) == {new_image}, images()
    producer.wait_for_acks(100, 60, "after the rollback")
    print(producer.stop())
    records = client.consume(UPG_BOOTSTRAP, TOPIC, "verify-upgrade")
    assert_exactly_once(producer.acked, records, "upgrade")
    timings["in all"] = time.monotonic() - t0
    print(
        f"version roll, real pods (s): { {k: round(x, 1) for k, x in timings.items()} }; "
        f"acked {len(producer.acked)} ({acked_after_upgrade} by the end of the upgrade), "
        f"delivery errors {len(producer.errors)}"
    )
    node.kubectl("delete", "namespace", UPG_NS, "--wait=false")
