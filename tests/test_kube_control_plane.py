"""Smoke tests proving the `kube` fixture is a real control plane: the real scheduler,
StatefulSet, PV, EndpointSlice, garbage-collector, disruption and RBAC machinery at work,
with kwok standing in only for the kubelets."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kube_support import ZONES, ComponentDied, KubeControlPlane, require_available


def apply(kube: KubeControlPlane, *objects: dict[str, Any]) -> None:
    kube.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}),
    )


def get(kube: KubeControlPlane, *args: str) -> Any:
    return json.loads(kube.kubectl("get", *args, "-o", "json").stdout)


def statefulset(
    name: str, replicas: int, owner: dict[str, Any] | None = None, spread: bool = False
) -> dict[str, Any]:
    labels = {"app": name}
    pod_spec: dict[str, Any] = {
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/straitmq:never-pulled",  # kwok runs nothing
                "ports": [{"containerPort": 9092, "name": "kafka"}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            }
        ],
    }
    if spread:
        pod_spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": labels},
            }
        ]
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            ],
        },
    }


def headless_service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"app": name},
            "ports": [{"name": "kafka", "port": 9092}],
        },
    }


def ready_replicas(kube: KubeControlPlane, ns: str, name: str) -> int:
    return int(get(kube, "statefulset", name, "-n", ns)["status"].get("readyReplicas", 0))


@pytest.fixture(scope="module")
def web(kube: KubeControlPlane) -> Iterator[str]:
    """Namespace `smoke-web` with a 3-replica StatefulSet `web` spread over the zones and
    its headless Service, all pods Ready."""
    ns = kube.create_namespace("smoke-web")
    objects = [headless_service("web"), statefulset("web", 3, spread=True)]
    for obj in objects:
        obj["metadata"]["namespace"] = ns
    apply(kube, *objects)
    kube.wait_for(
        lambda: ready_replicas(kube, ns, "web") == 3, 180, "3 ready web pods", namespace=ns
    )
    yield ns


def test_statefulset_pods_are_ready_on_kwok_nodes_with_bound_volumes(
    kube: KubeControlPlane, web: str
) -> None:
    nodes = {n["metadata"]["name"]: n for n in get(kube, "nodes")["items"]}
    pods = get(kube, "pods", "-n", web, "-l", "app=web")["items"]
    assert sorted(p["metadata"]["name"] for p in pods) == ["web-0", "web-1", "web-2"]
    zones = set()
    for pod in pods:
        status = pod["status"]
        assert status["phase"] == "Running"
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
        assert status["podIP"].startswith("10.0.")
        node = nodes[pod["spec"]["nodeName"]]  # bound by the real scheduler
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        zones.add(node["metadata"]["labels"]["topology.kubernetes.io/zone"])
    assert zones == set(ZONES)  # the topology spread constraint was honoured

    pvcs = {p["metadata"]["name"]: p for p in get(kube, "pvc", "-n", web)["items"]}
    assert sorted(pvcs) == ["data-web-0", "data-web-1", "data-web-2"]
    for pvc in pvcs.values():
        assert pvc["status"]["phase"] == "Bound"
        assert pvc["spec"]["storageClassName"] == "standard"  # DefaultStorageClass admission
        pv = get(kube, "pv", pvc["spec"]["volumeName"])
        assert pv["status"]["phase"] == "Bound"
        assert pv["spec"]["claimRef"]["name"] == pvc["metadata"]["name"]


def test_headless_service_endpointslices_list_the_pods(kube: KubeControlPlane, web: str) -> None:
    def endpoints() -> dict[str, dict[str, Any]]:
        slices = get(kube, "endpointslices", "-n", web, "-l", "kubernetes.io/service-name=web")
        return {
            ep["targetRef"]["name"]: ep for s in slices["items"] for ep in s.get("endpoints") or []
        }

    eps = kube.wait_for(lambda: len(endpoints()) == 3 and endpoints(), 30, "3 endpoints")
    assert sorted(eps) == ["web-0", "web-1", "web-2"]
    for name, ep in eps.items():
        assert ep["hostname"] == name  # StatefulSet pods get per-pod DNS names
        assert ep["conditions"]["ready"] is True
        assert ep["zone"] in ZONES  # taken from the node's topology label
        assert ep["addresses"][0].startswith("10.0.")


def test_pod_disruption_budget_gets_status(kube: KubeControlPlane, web: str) -> None:
    apply(
        kube,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": web},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}},
        },
    )

    def status() -> dict[str, Any]:
        return get(kube, "pdb", "web", "-n", web).get("status") or {}

    st = kube.wait_for(lambda: status().get("expectedPods") == 3 and status(), 30, "PDB status")
    assert st["currentHealthy"] == 3
    assert st["desiredHealthy"] == 2
    assert st["disruptionsAllowed"] == 1


def test_garbage_collector_deletes_owned_statefulset(kube: KubeControlPlane) -> None:
    ns = kube.create_namespace("smoke-gc")
    kube.kubectl("create", "configmap", "owner", "-n", ns)
    owner = get(kube, "configmap", "owner", "-n", ns)["metadata"]
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["uid"]}
    sts = statefulset("owned", 1, owner=ref)
    sts["metadata"]["namespace"] = ns
    apply(kube, sts)
    kube.wait_for(lambda: ready_replicas(kube, ns, "owned") == 1, 60, "owned-0 ready")

    kube.kubectl("delete", "configmap", "owner", "-n", ns, "--wait=true")
    kube.wait_for(
        lambda: kube.kubectl("get", "statefulset", "owned", "-n", ns, check=False).returncode != 0,
        60,
        "the garbage collector to delete the StatefulSet",
    )
    # Its pod goes too (GC again, then kwok finishes the deletion as a kubelet would).
    kube.wait_for(
        lambda: not get(kube, "pods", "-n", ns)["items"], 60, "the StatefulSet's pod to go"
    )


def test_released_volumes_return_to_the_pool(kube: KubeControlPlane) -> None:
    ns = kube.create_namespace("smoke-pv")
    apply(
        kube,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "claim", "namespace": ns},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    pv_name = kube.wait_for(
        lambda: get(kube, "pvc", "claim", "-n", ns)["spec"].get("volumeName"), 30, "PVC bound"
    )
    kube.kubectl("delete", "pvc", "claim", "-n", ns, "--wait=true")
    kube.wait_for(
        lambda: (
            get(kube, "pv", pv_name)["status"]["phase"] == "Available"
            and not get(kube, "pv", pv_name)["spec"].get("claimRef")
        ),
        30,
        f"{pv_name} Released and back to Available",
    )


def _get_pods_with_token(kube: KubeControlPlane, ns: str, token: str) -> int:
    ctx = ssl.create_default_context(cafile=str(kube.pki / "ca.crt"))
    req = urllib.request.Request(
        f"{kube.server}/api/v1/namespaces/{ns}/pods",
        headers={"Authorization": f"Bearer {token}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        e.close()
        return e.code


def test_rbac_is_enforced(kube: KubeControlPlane) -> None:
    ns = kube.create_namespace("smoke-rbac")
    kube.kubectl("create", "serviceaccount", "nobody", "-n", ns)
    who = f"system:serviceaccount:{ns}:nobody"

    can = kube.kubectl("auth", "can-i", "list", "pods", "-n", ns, f"--as={who}", check=False)
    assert (can.returncode, can.stdout.strip()) == (1, "no")

    # A real request with a real token: the legacy token controller fills this Secret in
    # (proves the serviceaccount-token controller and the signing key pair work).
    apply(
        kube,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/service-account-token",
            "metadata": {
                "name": "nobody-token",
                "namespace": ns,
                "annotations": {"kubernetes.io/service-account.name": "nobody"},
            },
        },
    )
    secret_token = kube.wait_for(
        lambda: get(kube, "secret", "nobody-token", "-n", ns).get("data", {}).get("token"),
        30,
        "the legacy token controller to fill in nobody-token",
    )
    assert _get_pods_with_token(kube, ns, base64.b64decode(secret_token).decode()) == 403

    # Granting the permission makes the same kind of request succeed (a TokenRequest token).
    kube.kubectl("create", "role", "pod-reader", "-n", ns, "--verb=list", "--resource=pods")
    kube.kubectl(
        "create",
        "rolebinding",
        "nobody-reads",
        "-n",
        ns,
        "--role=pod-reader",
        f"--serviceaccount={ns}:nobody",
    )
    token = kube.kubectl("create", "token", "nobody", "-n", ns).stdout.strip()
    kube.wait_for(lambda: _get_pods_with_token(kube, ns, token) == 200, 30, "RBAC to allow")
    can = kube.kubectl("auth", "can-i", "list", "pods", "-n", ns, f"--as={who}", check=False)
    assert can.stdout.strip() == "yes"
    assert _get_pods_with_token(kube, "default", token) == 403  # the Role is namespaced


def test_kubectl_and_helm_talk_to_the_cluster(kube: KubeControlPlane) -> None:
    version = json.loads(kube.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.33.13"
    # The control plane is shared by the session: other tests' releases may be listed.
    assert isinstance(json.loads(kube.helm("list", "--all-namespaces", "-o", "json").stdout), list)
    assert kube.kubectl("get", "storageclass", "standard", "-o", "name").stdout.strip() == (
        "storageclass.storage.k8s.io/standard"
    )


def test_dead_component_fails_startup_with_its_log(tmp_path: Path) -> None:
    require_available()
    cp = KubeControlPlane(tmp_path / "kube")
    with socket.socket() as squatter:  # etcd cannot listen where something already is
        squatter.bind(("127.0.0.1", cp.etcd_port))
        squatter.listen()
        with pytest.raises(ComponentDied, match=r"(?s)etcd exited.*address already in use"):
            cp.start(timeout=60)
    assert (tmp_path / "kube" / "logs" / "etcd.log").exists()
    cp.stop()  # already stopped by start(); a second stop is harmless
