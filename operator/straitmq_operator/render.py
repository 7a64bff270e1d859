"""An MQCluster's Kubernetes objects, as plain manifests (pure: spec in, dicts out)."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from . import listeners
from . import names as n
from .listeners import Addresses
from .spec import ClusterSpec, Storage

DATA_DIR = "/data"
RUN_AS = 10001  # the image's non-root user


def owner_reference(spec: ClusterSpec) -> dict[str, Any]:
    return n.owner_reference(spec.name, spec.uid)


def _meta(spec: ClusterSpec, name: str, component: str | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": spec.namespace,
        "labels": n.labels(spec.name, component),
        "ownerReferences": [owner_reference(spec)],
    }


def voters(spec: ClusterSpec) -> str:
    """The quorum's static voters by pod DNS name: 1000@<cluster>-controller-0.<svc>...:9093.

    Always the first voter set (the controllers the cluster was created with), whatever
    spec.controllers.replicas says now: the voter set in force is log data (KIP-853), and
    changing these flags would roll every pod for nothing. A pod beyond them gets its id
    from its ordinal (`--node-id=auto`) and joins as an observer until it is added."""
    return ",".join(
        f"{n.CONTROLLER_ID_BASE + i}@"
        f"{n.pod_dns(spec.name, n.CONTROLLER, i, spec.namespace)}:{spec.controller_port}"
        for i in range(spec.initial_voters)
    )


def config_map(spec: ClusterSpec) -> dict[str, Any]:
    lines = [f"{k}={v}" for k, v in sorted(spec.broker_config.items())]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(spec, n.config_map(spec.name)),
        "data": {
            "STRAIT_CLUSTER_ID": spec.cluster_id,
            "STRAIT_CONTROLLER_VOTERS": voters(spec),
            "broker.properties": "\n".join(lines) + ("\n" if lines else ""),
        },
    }


def config_hash(spec: ClusterSpec, component: str = n.BROKER) -> str:
    """Changes whenever a pod would start differently; pods carry it, so it rolls them.
    The external listeners concern the brokers only: no controller restarts for them."""
    parts: list[Any] = [
        config_map(spec)["data"],
        spec.broker_args(),
        spec.controller_args(),
        spec.otlp_endpoint,
    ]
    if spec.rack_topology_key:  # only then, so clusters without one keep their hash
        parts.append({"rack": spec.rack_topology_key})
    if spec.kafka_tls:  # likewise
        parts.append({"tls": tls_args(spec)})
    if spec.external and component == n.BROKER:  # likewise; the per-pod addresses are
        # not in it (cluster.py restarts only the pod whose address changed)
        parts.append({"listeners": listeners.broker_args(spec)})
    data = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(data).hexdigest()[:16]


def _headless(spec: ClusterSpec, component: str, ports: list[dict]) -> dict[str, Any]:
    name = n.headless_service(spec.name, component)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, name, component),
        "spec": {
            "clusterIP": "None",
            # Pods must resolve each other before they are Ready: the quorum forms, and
            # brokers register, only once they can reach one another.
            "publishNotReadyAddresses": True,
            "selector": n.selector(spec.name, component),
            "ports": ports,
        },
    }


def services(spec: ClusterSpec) -> list[dict[str, Any]]:
    broker_ports = [
        {"name": "kafka", "port": spec.kafka_port, "targetPort": "kafka"},
        {"name": "http", "port": spec.http_port, "targetPort": "http"},
    ]
    # Extra internal listeners are reached like the kafka one: through these Services.
    broker_ports += [
        {"name": x.port_name, "port": x.port, "targetPort": x.port_name}
        for x in spec.external
        if x.type == "internal"
    ]
    bootstrap = {
        "apiVersion": "v1",
        "kind": "Service",
        # Its own component label: scrapers that select by Service would otherwise
        # scrape each broker twice (here and through the headless Service).
        "metadata": _meta(spec, n.bootstrap_service(spec.name), "bootstrap"),
        "spec": {
            "type": "ClusterIP",
            "selector": n.selector(spec.name, n.BROKER),
            "ports": broker_ports,
        },
    }
    return [
        _headless(
            spec,
            n.CONTROLLER,
            [{"name": "http", "port": spec.controller_port, "targetPort": "http"}],
        ),
        _headless(spec, n.BROKER, broker_ports),
        bootstrap,
    ]


def client_ports(spec: ClusterSpec) -> list[dict[str, Any]]:
    """The brokers' client listeners inside the cluster: the kafka one and the internal
    external ones (what a broker advertises at its own Service, broker_services)."""
    return [
        {"name": "kafka", "port": spec.kafka_port, "targetPort": "kafka"},
        *(
            {"name": x.port_name, "port": x.port, "targetPort": x.port_name}
            for x in spec.external
            if x.type == "internal"
        ),
    ]


def broker_services(spec: ClusterSpec, brokers: int) -> list[dict[str, Any]]:
    """One ClusterIP Service per broker 0..brokers-1, named as its pod: what the broker
    advertises to clients on its client listeners (n.broker_address). Its ready pod only:
    a leaving broker turns unready before its address goes (BROKER_READINESS_FAILURES),
    and while a broker has no ready pod kube-proxy refuses a connection to the Service at
    once, so a client tries again within its backoff. A pod DNS name (the headless
    Service, which must publish not-ready pods) may still give a deleted pod's address
    from a resolver's cache, and a connection to that hangs until the client's 30 s
    connect timeout. The brokers' own traffic (replication, the controllers' probes)
    keeps the pod DNS names: it must reach a broker before it is Ready."""
    sts = n.statefulset(spec.name, n.BROKER)
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(spec, n.broker_service(spec.name, b), n.BROKER_SERVICE_COMPONENT),
            "spec": {
                "type": "ClusterIP",
                "selector": {
                    **n.selector(spec.name, n.BROKER),
                    listeners.POD_NAME_LABEL: f"{sts}-{b}",
                },
                "ports": client_ports(spec),
            },
        }
        for b in range(brokers)
    ]


def pdbs(spec: ClusterSpec) -> list[dict[str, Any]]:
    out = []
    for component in (n.CONTROLLER, n.BROKER):
        out.append(
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": _meta(spec, n.pdb(spec.name, component), component),
                "spec": {
                    # One voter, or one broker, at a time: three or five voters keep a
                    # majority and RF>=2 partitions keep a leader. A lone voter may go
                    # too (the metadata pauses until it is back): 0 would block every
                    # node drain for good.
                    "maxUnavailable": 1,
                    "selector": {"matchLabels": n.selector(spec.name, component)},
                },
            }
        )
    return out


def _env(spec: ClusterSpec) -> list[dict[str, Any]]:
    cm = n.config_map(spec.name)
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {
            "name": "STRAIT_CLUSTER_ID",
            "valueFrom": {"configMapKeyRef": {"name": cm, "key": "STRAIT_CLUSTER_ID"}},
        },
        {
            "name": "STRAIT_CONTROLLER_VOTERS",
            "valueFrom": {"configMapKeyRef": {"name": cm, "key": "STRAIT_CONTROLLER_VOTERS"}},
        },
        {"name": "STRAIT_LOG_LEVEL", "value": "info"},
    ]
    if spec.otlp_endpoint:
        env.append({"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": spec.otlp_endpoint})
    return env


# A broker's readiness probe: every second, unready after 2 failures. A stopping broker
# answers 503 and exits only after BROKER_SHUTDOWN_PROBES such answers
# (--shutdown-readiness-probes): by then its pod has been unready for 3 probes, so the
# Services have stopped routing to an address that is about to disappear (a connection
# sent to a deleted pod's address hangs until the client's 30 s connect timeout; one
# sent to a live pod with its listener closed is refused at once, and the client tries
# again). Three probes, not one: the endpoint controller and kube-proxy must both act
# in between, and on a loaded node one second was once not enough (a real-node run
# hung 30 s on the bootstrap Service).
BROKER_READINESS_PERIOD_S = 1
BROKER_READINESS_FAILURES = 2
BROKER_SHUTDOWN_PROBES = BROKER_READINESS_FAILURES + 3


def _probes(
    port: str, scheme: str = "HTTP", period_s: int = 5, failures: int = 3
) -> dict[str, Any]:
    """The kubelet's checks. On an https port (scheme HTTPS) the kubelet shows no client
    certificate and does not verify the server's: the port asks for one without requiring
    it (http.ssl.client.auth=requested), and /healthz and /readyz need no credential."""
    get: dict[str, Any] = {"port": port} if scheme == "HTTP" else {"port": port, "scheme": scheme}
    return {
        "readinessProbe": {
            "httpGet": {"path": "/readyz", **get},
            "periodSeconds": period_s,
            "timeoutSeconds": min(3, period_s),
            "failureThreshold": failures,
        },
        "livenessProbe": {
            "httpGet": {"path": "/healthz", **get},
            "initialDelaySeconds": 15,
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 6,
            # A process that stopped answering will not act on SIGTERM either: kill it
            # after 10 s instead of the pod's whole grace (kept for graceful deletes).
            "terminationGracePeriodSeconds": 10,
        },
    }


def _claim(storage: Storage) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "metadata": {"name": "data"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": storage.size}},
        },
    }
    if storage.storage_class:
        claim["spec"]["storageClassName"] = storage.storage_class
    return claim


_CONTAINER_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}


def _statefulset(
    spec: ClusterSpec,
    component: str,
    replicas: int,
    container: dict[str, Any],
    storage: Storage,
    grace_s: int,
    when_scaled: str,
    metrics_port: int,
    pod_extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    name = n.statefulset(spec.name, component)
    pod_annotations = {n.CONFIG_HASH_ANNOTATION: config_hash(spec, component)}
    if spec.metrics_enabled:
        pod_annotations.update(
            {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(metrics_port),
                "prometheus.io/path": "/metrics",
            }
        )
        if component == n.BROKER and spec.http_secured:  # /metrics open, over https
            pod_annotations["prometheus.io/scheme"] = "https"
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": grace_s,
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS, "fsGroup": RUN_AS},
        "containers": [container],
        "enableServiceLinks": False,
        # Only a rack-aware broker talks to the API server (its init container does).
        "automountServiceAccountToken": False,
        **(pod_extra or {}),
    }
    if spec.rack_topology_key:
        pod_spec["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": spec.rack_topology_key,
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": n.selector(spec.name, component)},
            }
        ]
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(spec, name, component),
        "spec": {
            "serviceName": n.headless_service(spec.name, component),
            "replicas": replicas,
            # Voters must all start to elect a leader; brokers need no order either.
            "podManagementPolicy": "Parallel",
            # The operator restarts pods itself, one at a time, checking min ISR between.
            "updateStrategy": {"type": "OnDelete"},
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": "Retain",
                "whenScaled": when_scaled,
            },
            "selector": {"matchLabels": n.selector(spec.name, component)},
            "template": {
                "metadata": {
                    "labels": n.labels(spec.name, component),
                    "annotations": pod_annotations,
                },
                "spec": pod_spec,
            },
            "volumeClaimTemplates": [_claim(storage)],
        },
    }


def controller_statefulset(spec: ClusterSpec, replicas: int | None = None) -> dict[str, Any]:
    """`replicas`: the pods to run now (the reconciler's choice while voters are added
    or removed one at a time); spec.controllers.replicas when not given."""
    container = {
        "name": n.CONTROLLER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["strait-controller"],
        "args": [
            "--node-id=auto",
            "--voters=$(STRAIT_CONTROLLER_VOTERS)",
            "--cluster-id=$(STRAIT_CLUSTER_ID)",
            f"--data-dir={DATA_DIR}",
            f"--listen=0.0.0.0:{spec.controller_port}",
            *spec.controller_args(),
        ],
        "env": _env(spec),
        "ports": [{"name": "http", "containerPort": spec.controller_port}],
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}],
        "resources": spec.controller_resources,
        "securityContext": _CONTAINER_SECURITY,
        **_probes("http", "HTTPS" if spec.http_secured else "HTTP"),
    }
    pod_extra: dict[str, Any] = {}
    if spec.http_secured:
        container["args"].extend(controller_tls_args(spec))
        container["volumeMounts"].append(
            {"name": n.CERTS_VOLUME, "mountPath": n.CERTS_DIR, "readOnly": True}
        )
        secret = {"secretName": n.controller_certs_secret(spec.name)}
        pod_extra["volumes"] = [{"name": n.CERTS_VOLUME, "secret": secret}]
    return _statefulset(
        spec,
        n.CONTROLLER,
        spec.controllers if replicas is None else replicas,
        container,
        spec.controller_storage,
        30,
        "Retain",
        spec.controller_port,
        pod_extra,
    )


def controller_principal(spec: ClusterSpec) -> str:
    return f"User:CN={spec.name}-controller,O=straitmq"


def controller_tls_args(spec: ClusterSpec) -> list[str]:
    """A secured cluster's quorum port: https with the controller's certificate from the
    cluster CA; every call but the probes needs a client certificate of the cluster's own
    (the other voters, the brokers; the operator's too) with CLUSTER_ACTION, which only
    those principals have (super users). The voters call each other with theirs."""
    supers = [controller_principal(spec), broker_principal(spec), OPERATOR_PRINCIPAL]
    return [
        f"--override=http.ssl.keystore.location={n.CERTS_DIR}/$(POD_NAME).pem",
        f"--override=http.ssl.truststore.location={n.CERTS_DIR}/ca.crt",
        "--override=http.ssl.client.auth=requested",
        "--override=http.authentication=mtls",
        "--override=http.metrics.require.authentication=false",
        f"--override=authorizer.class.name={AUTHORIZER}",
        f"--override=super.users={';'.join(supers)}",
    ]


AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def broker_principal(spec: ClusterSpec) -> str:
    """The principal of the brokers' certificates (pki.issue's subject, RFC 2253)."""
    return f"User:CN={spec.name}-broker,O=straitmq"


# The operator's client certificate for a secured HTTP API (certificates.ensure issues it).
OPERATOR_PRINCIPAL = f"User:CN={n.OPERATOR_CN},O=straitmq"


def http_args(spec: ClusterSpec) -> list[str]:
    """The HTTP port secured (spec.http_secured): https with the broker's certificate, a
    client certificate from the cluster CA asked for (`requested`, not `required`: the
    kubelet's probes show none, and /healthz and /readyz must answer them) and, with
    http.authentication, demanded on every other path but /metrics: mtls (the operator,
    the brokers calling each other), and basic with SCRAM (a User's password)."""
    if not spec.http_secured:
        return []
    methods = "mtls,basic" if spec.kafka_sasl else "mtls"
    return [
        f"--override=http.ssl.keystore.location={n.CERTS_DIR}/$(POD_NAME).pem",
        f"--override=http.ssl.truststore.location={n.CERTS_DIR}/ca.crt",
        "--override=http.ssl.client.auth=requested",
        f"--override=http.authentication={methods}",
        "--override=http.metrics.require.authentication=false",
    ]


# A broker pod's own names, as its args spell them (Kubernetes expands the variables):
# its pod DNS name (brokers and controllers reach it there, Ready or not) and its own
# Service's (clients reach it there, see broker_services).
POD_DNS = "$(POD_NAME).{headless}.$(POD_NAMESPACE).svc"
BROKER_ADDRESS = "$(POD_NAME).$(POD_NAMESPACE).svc"


def plain_args(spec: ClusterSpec) -> list[str]:
    """A broker's listeners when clients get PLAINTEXT (no TLS, no external listener):
    PLAINTEXT on the kafka port, advertised at the broker's own Service, and REPLICATION
    (PLAINTEXT too) for the brokers, advertised at the pod DNS name. The inter-broker
    listener comes first: its address is the one the broker registers (replica fetchers,
    the controllers' liveness probe). A broker of a cluster made before (one listener,
    no endpoints) is reached on its registered address by both (endpoint_for)."""
    repl, plain = n.REPLICATION_LISTENER, n.PLAIN_LISTENER
    return [
        f"--override=listeners={repl}://0.0.0.0:{spec.replication_port},"
        f"{plain}://0.0.0.0:{spec.kafka_port}",
        f"--override=advertised.listeners={repl}://{pod_dns(spec)}:{spec.replication_port},"
        f"{plain}://{BROKER_ADDRESS}:{spec.kafka_port}",
        f"--override=listener.security.protocol.map={repl}:PLAINTEXT,{plain}:PLAINTEXT",
        f"--override=inter.broker.listener.name={repl}",
    ]


def pod_dns(spec: ClusterSpec) -> str:
    return POD_DNS.format(headless=n.headless_service(spec.name, n.BROKER))


def tls_args(spec: ClusterSpec) -> list[str]:
    """A broker's listeners when clients get TLS: CLIENT (the kafka port; SSL, or SASL_SSL
    with listeners.kafka.authentication) and REPLICATION (SSL, between brokers only: each
    shows its certificate from the cluster CA, ssl.client.auth=required). With
    authorization, the StandardAuthorizer, the brokers' principal a super user."""
    repl, client = n.REPLICATION_LISTENER, n.CLIENT_LISTENER
    protocol = "SASL_SSL" if spec.kafka_sasl else "SSL"
    args = [
        f"--override=listeners={repl}://0.0.0.0:{spec.replication_port},"
        f"{client}://0.0.0.0:{spec.kafka_port}",
        f"--override=advertised.listeners={repl}://{pod_dns(spec)}:{spec.replication_port},"
        f"{client}://{BROKER_ADDRESS}:{spec.kafka_port}",
        f"--override=listener.security.protocol.map={repl}:SSL,{client}:{protocol}",
        f"--override=inter.broker.listener.name={repl}",
        f"--override=ssl.keystore.location={n.CERTS_DIR}/$(POD_NAME).pem",
        f"--override=ssl.truststore.location={n.CERTS_DIR}/ca.crt",
        f"--override=listener.name.{repl.lower()}.ssl.client.auth=required",
    ]
    if spec.external:  # listeners.broker_args names every listener, the pod file what
        # each advertises
        args = args[4:]
    if spec.kafka_sasl:
        args.append(
            f"--override=listener.name.{client.lower()}.sasl.enabled.mechanisms={spec.kafka_sasl}"
        )
    if spec.kafka_mtls:  # tls Users: a certificate from the cluster CA, no other way in
        args.append(f"--override=listener.name.{client.lower()}.ssl.client.auth=required")
    args += http_args(spec)
    if spec.http_secured:  # the controllers' port is https too (controller_tls_args)
        args.append("--override=controller.http.ssl.enabled=true")
    if spec.authorization:
        operator = [OPERATOR_PRINCIPAL] if spec.http_secured else []
        supers = ";".join([broker_principal(spec), *operator, *spec.super_users])
        args += [
            f"--override=authorizer.class.name={AUTHORIZER}",
            f"--override=super.users={supers}",
        ]
    return args


def broker_statefulset(spec: ClusterSpec, replicas: int) -> dict[str, Any]:
    # Clients reach the partition leader directly, at its own Service; the brokers each
    # other at their pod DNS names (plain_args, tls_args). With external listeners the
    # pod's properties file says what it advertises on each (listeners.advertised_properties).
    advertise = [] if spec.external or spec.kafka_tls else plain_args(spec)
    container = {
        "name": n.BROKER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["strait-broker"],
        "args": [
            "--node-id=auto",
            "--cluster-id=$(STRAIT_CLUSTER_ID)",
            "--controllers=$(STRAIT_CONTROLLER_VOTERS)",
            f"--data-dir={DATA_DIR}",
            f"--listen=0.0.0.0:{spec.kafka_port}",
            *advertise,
            f"--http=0.0.0.0:{spec.http_port}",
            f"--shutdown-readiness-probes={BROKER_SHUTDOWN_PROBES}",
            *spec.broker_args(),
        ],
        "env": _env(spec) + listeners.broker_env(spec),
        "ports": [
            {"name": "kafka", "containerPort": spec.kafka_port},
            {"name": "http", "containerPort": spec.http_port},
            {"name": "replication", "containerPort": spec.replication_port},
        ],
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}],
        "resources": spec.broker_resources,
        "securityContext": _CONTAINER_SECURITY,
        **_probes(
            "http",
            "HTTPS" if spec.http_secured else "HTTP",
            BROKER_READINESS_PERIOD_S,
            BROKER_READINESS_FAILURES,
        ),
    }
    pod_extra: dict[str, Any] = {"serviceAccountName": n.broker_service_account(spec.name)}
    volumes: list[dict[str, Any]] = []
    if spec.rack_topology_key:
        mount = {"name": n.RACK_VOLUME, "mountPath": n.RACK_DIR}
        container["args"].append(f"--rack-file={n.RACK_FILE}")
        container["volumeMounts"].append({**mount, "readOnly": True})
        pod_extra |= {
            "automountServiceAccountToken": True,
            "initContainers": [rack_init_container(spec, mount)],
        }
        volumes.append({"name": n.RACK_VOLUME, "emptyDir": {"sizeLimit": "1Mi"}})
    if spec.kafka_tls:
        container["args"].extend(tls_args(spec))
    if spec.external:
        container["args"].extend(listeners.broker_args(spec))
        container["ports"] += [
            {"name": x.port_name, "containerPort": x.port} for x in spec.external
        ]
        container["volumeMounts"].append(
            {"name": n.ADVERTISED_VOLUME, "mountPath": n.ADVERTISED_DIR, "readOnly": True}
        )
        cm = {"name": n.advertised_config_map(spec.name)}
        volumes.append({"name": n.ADVERTISED_VOLUME, "configMap": cm})
    if spec.needs_certificates:
        # The mounted Secret follows a renewal; the broker reloads the file
        # (ssl.reload.interval.ms), so no restart.
        container["volumeMounts"].append(
            {"name": n.CERTS_VOLUME, "mountPath": n.CERTS_DIR, "readOnly": True}
        )
        volumes.append(
            {"name": n.CERTS_VOLUME, "secret": {"secretName": n.broker_certs_secret(spec.name)}}
        )
    if volumes:
        pod_extra["volumes"] = volumes
    # A drained broker's volume holds nothing the cluster needs: drop it on scale down.
    return _statefulset(
        spec,
        n.BROKER,
        replicas,
        container,
        spec.broker_storage,
        120,
        "Delete",
        spec.http_port,
        pod_extra,
    )


def rack_init_container(spec: ClusterSpec, mount: dict[str, Any]) -> dict[str, Any]:
    """Reads the pod's Node and leaves its rack label where the broker's --rack-file is."""
    assert spec.rack_topology_key
    return {
        "name": n.RACK_VOLUME,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["strait", "rack-from-node"],
        "args": [f"--label={spec.rack_topology_key}", f"--out={n.RACK_FILE}"],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "volumeMounts": [mount],
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": _CONTAINER_SECURITY,
    }


def broker_service_account(spec: ClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(spec, n.broker_service_account(spec.name), n.BROKER),
        "automountServiceAccountToken": False,
    }


def rack_binding(spec: ClusterSpec, cluster_role: str) -> dict[str, Any]:
    """Lets the broker pods' service account read Nodes (the rack label), nothing else.
    Cluster-scoped: no owner reference; the operator deletes it with the MQCluster."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": n.rack_binding(spec.namespace, spec.name),
            "labels": {**n.labels(spec.name, n.BROKER), n.CLUSTER_NAMESPACE_LABEL: spec.namespace},
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": cluster_role,
        },
        "subjects": [
            {
                "kind": "ServiceAccount",
                "name": n.broker_service_account(spec.name),
                "namespace": spec.namespace,
            }
        ],
    }


def objects(
    spec: ClusterSpec,
    broker_replicas: int,
    addresses: Addresses | None = None,
    advertised_brokers: int | None = None,
    controller_replicas: int | None = None,
) -> list[dict[str, Any]]:
    """Everything an MQCluster owns, in the order to apply it (the external listeners'
    Services and Ingresses aside: cluster.py applies them first, to learn `addresses`).
    The advertised addresses (of advertised_brokers pods: also those being drained)
    come before the StatefulSet: a new pod reads its own. `controller_replicas`: the
    controller pods to run now (spec.controllers.replicas when not given)."""
    count = max(broker_replicas, advertised_brokers or 0)
    advertised = (
        [listeners.advertised_config_map(spec, count, addresses or Addresses())]
        if spec.external
        else []
    )
    return [
        config_map(spec),
        *advertised,
        *services(spec),
        *pdbs(spec),
        broker_service_account(spec),
        controller_statefulset(spec, controller_replicas),
        broker_statefulset(spec, broker_replicas),
    ]
