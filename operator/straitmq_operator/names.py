"""Names and labels the operator gives the objects it owns."""

from __future__ import annotations

from typing import Any

GROUP = "straitmq.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CLUSTERS = "mqclusters"
TOPICS = "topics"
USERS = "users"
FIELD_MANAGER = "straitmq-operator"

# Where the operator reaches a cluster's admin API if not at its bootstrap Service, e.g.
# an operator run outside the cluster, or brokers that stand in for the pods in tests.
ADMIN_URL_ANNOTATION = "straitmq.io/admin-url"
# Where the operator reaches each controller pod's own quorum API if not at its pod DNS
# name: JSON {"<ordinal>": "http://host:port"} (an operator outside the cluster, or
# controller processes that stand in for the pods in tests). The URL is also what the
# cluster is asked to add as a voter, so the other voters must reach it there.
CONTROLLER_URLS_ANNOTATION = "straitmq.io/controller-urls"
# The Kafka bootstrap address a User's Secret names, if not the bootstrap Service's.
BOOTSTRAP_ANNOTATION = "straitmq.io/bootstrap-servers"
CONFIG_HASH_ANNOTATION = "straitmq.io/config-hash"
# "true" on an MQCluster, Topic or User: the operator leaves it (and what it renders) as it
# is until the annotation goes (Strimzi's strimzi.io/pause-reconciliation).
PAUSE_ANNOTATION = "straitmq.io/pause-reconciliation"
# "true" on a broker or controller pod: restart it, gated by min ISR like every roll. On
# an MQCluster: every pod of it (the operator moves the annotation onto each pod).
# Strimzi's strimzi.io/manual-rolling-update.
ROLL_ANNOTATION = "straitmq.io/manual-rolling-update"

# Controllers get ids apart from brokers' ordinals: both share the metadata log's id space.
CONTROLLER_ID_BASE = 1000

BROKER = "broker"
CONTROLLER = "controller"

CERTS_VOLUME = "certs"
CERTS_DIR = "/opt/straitmq/certs"
REPLICATION_LISTENER = "REPLICATION"  # brokers' own listener when clients get TLS
CLIENT_LISTENER = "CLIENT"
# The client listener's name when it is plain and external listeners exist: Kafka's
# default name, so brokers still without named listeners (mid-roll) keep serving it.
PLAIN_LISTENER = "PLAINTEXT"

# External listeners (spec.listeners.external): their Services and Ingresses carry the
# listener's name in this label, with this component.
LISTENER_LABEL = "straitmq.io/listener"
LISTENER_COMPONENT = "listener"
# Where broker pods find their own advertised.listeners (<pod>.properties).
ADVERTISED_DIR = "/opt/straitmq/advertised"
ADVERTISED_VOLUME = "advertised"

# Rack awareness: broker pods' init container writes the node's rack label here.
RACK_VOLUME = "rack"
RACK_DIR = "/opt/straitmq/rack"
RACK_FILE = f"{RACK_DIR}/rack"
# Which MQCluster a cluster-scoped object (the rack ClusterRoleBinding) belongs to:
# owner references cannot point from a cluster-scoped object to a namespaced one.
CLUSTER_NAMESPACE_LABEL = "straitmq.io/cluster-namespace"


def owner_reference(cluster: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "MQCluster",
        "name": cluster,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def labels(cluster: str, component: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "straitmq",
        "app.kubernetes.io/instance": cluster,
        "app.kubernetes.io/part-of": "straitmq",
        "app.kubernetes.io/managed-by": "straitmq-operator",
    }
    if component:
        out["app.kubernetes.io/component"] = component
    return out


def selector(cluster: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "straitmq",
        "app.kubernetes.io/instance": cluster,
        "app.kubernetes.io/component": component,
    }


def selector_string(cluster: str, component: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(cluster, component).items())


def statefulset(cluster: str, component: str) -> str:
    return f"{cluster}-{component}"


def headless_service(cluster: str, component: str) -> str:
    return f"{cluster}-{component}"


def bootstrap_service(cluster: str) -> str:
    return f"{cluster}-bootstrap"


def listener_bootstrap(cluster: str, listener: str) -> str:
    """An external listener's bootstrap Service (and Ingress)."""
    return f"{cluster}-{listener}-bootstrap"


def listener_broker(cluster: str, listener: str, ordinal: int) -> str:
    """An external listener's Service (and Ingress) of one broker."""
    return f"{cluster}-{listener}-{ordinal}"


# Each broker's own ClusterIP Service (named as its pod), the address it advertises to
# clients on its client listeners; it has the ready pod only (see render.broker_services).
BROKER_SERVICE_COMPONENT = "broker-address"


def broker_service(cluster: str, ordinal: int) -> str:
    return f"{statefulset(cluster, BROKER)}-{ordinal}"


def broker_address(cluster: str, ordinal: int, namespace: str) -> str:
    """Where clients reach broker `ordinal`: its own Service's DNS name (a stable VIP)."""
    return f"{broker_service(cluster, ordinal)}.{namespace}.svc"


def advertised_config_map(cluster: str) -> str:
    return f"{cluster}-advertised"


# TLS (spec.listeners.kafka.tls): the cluster CA's key and certificate, the certificate
# alone (for clients to trust), and the brokers' keystores, one `<pod>.pem` each.
def cluster_ca_secret(cluster: str) -> str:
    return f"{cluster}-cluster-ca"


def cluster_ca_cert_secret(cluster: str) -> str:
    return f"{cluster}-cluster-ca-cert"


def broker_certs_secret(cluster: str) -> str:
    return f"{cluster}-broker-certs"


# The controllers' keystores (`<pod>.pem`, `ca.crt`), when the cluster is secured: a
# Secret of their own, so that no broker pod mounts a controller's key.
def controller_certs_secret(cluster: str) -> str:
    return f"{cluster}-controller-certs"


# The operator's own client certificate from the cluster CA (`tls.key`, `tls.crt`,
# `ca.crt`), for the admin API of a cluster whose HTTP API is secured.
def operator_certs_secret(cluster: str) -> str:
    return f"{cluster}-operator-certs"


OPERATOR_CN = "straitmq-operator"


def config_map(cluster: str) -> str:
    return f"{cluster}-config"


# Which topics and users the operator made in a cluster (for Topic and User resources),
# so that one deleted while the operator was not running is still removed from the
# cluster: Topics and Users carry no finalizer (see handlers.py).
def managed_config_map(cluster: str) -> str:
    return f"{cluster}-managed"


def pdb(cluster: str, component: str) -> str:
    return f"{cluster}-{component}"


def pod_dns(cluster: str, component: str, ordinal: int, namespace: str) -> str:
    return (
        f"{statefulset(cluster, component)}-{ordinal}."
        f"{headless_service(cluster, component)}.{namespace}.svc"
    )


def broker_service_account(cluster: str) -> str:
    return f"{cluster}-broker"


def rack_binding(namespace: str, cluster: str) -> str:
    """Cluster-scoped, so the namespace is part of the name."""
    return f"straitmq-rack-{namespace}-{cluster}"
