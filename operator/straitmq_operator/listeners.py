"""External listeners (spec.listeners.external): their Services and Ingresses, the
addresses those get, and what each broker advertises (pure: objects in, dicts out).

As Strimzi does it: the operator renders one Service per broker and a bootstrap Service
per listener, reads the address each got (the node's address and the node port, the
load balancer's IP or host name, the ingress host), and renders that address into the
broker's config, here a per-pod properties file in the `<cluster>-advertised`
ConfigMap that the broker reads when it starts (--properties). A pod whose registered
endpoint differs from the address it should advertise is restarted, alone (cluster.py);
until an address is known (a load balancer not yet provisioned) the broker advertises
its pod DNS name on that listener, and no broker is restarted for the listener.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import names as n
from .spec import INGRESS_PORT, ClusterSpec, ExternalListener

Address = tuple[str, int]

SERVICE_TYPES = {"nodeport": "NodePort", "loadbalancer": "LoadBalancer", "ingress": "ClusterIP"}
# ingress-nginx passes the TLS connection through untouched, routed by its SNI host
# name; the broker terminates TLS itself (the controller needs --enable-ssl-passthrough).
INGRESS_ANNOTATIONS = {
    "nginx.ingress.kubernetes.io/ssl-passthrough": "true",
    "nginx.ingress.kubernetes.io/backend-protocol": "HTTPS",
}
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
HOST_IP_ENV = "HOST_IP"  # the broker container's node address (render: status.hostIP)
HOST_IP_REF = "${env:" + HOST_IP_ENV + "}"
ENV_PROVIDER_LINES = (
    "config.providers=env\n"
    "config.providers.env.class=org.apache.kafka.common.config.provider.EnvVarConfigProvider\n"
)


@dataclass
class Addresses:
    """Where clients of each external listener reach each broker and the bootstrap;
    None: not known yet (a load balancer still being provisioned, a pod not scheduled)."""

    brokers: dict[str, dict[int, Address | None]] = field(default_factory=dict)
    bootstrap: dict[str, Address | None] = field(default_factory=dict)
    # NodePort listeners: each broker's port (its own Service's node port, or its
    # advertisedPort), known as soon as the Service is, before the pod is scheduled.
    node_ports: dict[str, dict[int, int]] = field(default_factory=dict)

    def pending(self, replicas: int) -> list[str]:
        """The listeners some address of which (brokers below `replicas`) is unknown."""
        return [
            name
            for name, per in self.brokers.items()
            if self.bootstrap.get(name) is None or any(per.get(b) is None for b in range(replicas))
        ]


def unknown(addresses: Addresses, brokers: range) -> list[str]:
    """The listeners on which some of these brokers have no address yet."""
    return [
        name for name, per in addresses.brokers.items() if any(per.get(b) is None for b in brokers)
    ]


def _meta(spec: ClusterSpec, name: str, x: ExternalListener) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": spec.namespace,
        "labels": {**n.labels(spec.name, n.LISTENER_COMPONENT), n.LISTENER_LABEL: x.name},
        "ownerReferences": [n.owner_reference(spec.name, spec.uid)],
    }


def _service(
    spec: ClusterSpec,
    x: ExternalListener,
    name: str,
    selector: dict[str, str],
    node_port: int | None,
) -> dict[str, Any]:
    port: dict[str, Any] = {
        "name": x.port_name,
        "port": x.port,
        "targetPort": x.port_name,
        "protocol": "TCP",
    }
    if node_port and x.type == "nodeport":
        port["nodePort"] = node_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(spec, name, x),
        # Ready pods only: a terminating broker leaves the Service before its address
        # goes (see render.BROKER_READINESS_FAILURES), so no connection hangs on it.
        "spec": {"type": SERVICE_TYPES[x.type], "selector": selector, "ports": [port]},
    }


def services(spec: ClusterSpec, brokers: int) -> list[dict[str, Any]]:
    """Per external listener (not internal ones): a bootstrap Service over every broker
    and one Service per broker 0..brokers-1."""
    out = []
    sts = n.statefulset(spec.name, n.BROKER)
    for x in spec.external:
        if x.type == "internal":
            continue
        selector = n.selector(spec.name, n.BROKER)
        out.append(
            _service(
                spec, x, n.listener_bootstrap(spec.name, x.name), selector, x.bootstrap_node_port
            )
        )
        for b in range(brokers):
            o = x.override(b)
            out.append(
                _service(
                    spec,
                    x,
                    n.listener_broker(spec.name, x.name, b),
                    {**selector, POD_NAME_LABEL: f"{sts}-{b}"},
                    o.node_port if o else None,
                )
            )
    return out


def _ingress(
    spec: ClusterSpec, x: ExternalListener, name: str, host: str, service: str
) -> dict[str, Any]:
    meta = _meta(spec, name, x)
    meta["annotations"] = dict(INGRESS_ANNOTATIONS)
    backend = {"service": {"name": service, "port": {"number": x.port}}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": meta,
        "spec": {
            "ingressClassName": x.ingress_class,
            # Names the host for TLS; with passthrough the broker's own certificate
            # (which carries the host) is what clients see, so no secretName.
            "tls": [{"hosts": [host]}],
            "rules": [
                {
                    "host": host,
                    "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]},
                }
            ],
        },
    }


def ingresses(spec: ClusterSpec, brokers: int) -> list[dict[str, Any]]:
    """Per ingress listener: a bootstrap Ingress and one per broker, each its own host."""
    out = []
    for x in spec.external:
        if x.type != "ingress":
            continue
        assert x.bootstrap_host is not None  # spec.parse checks
        boot = n.listener_bootstrap(spec.name, x.name)
        out.append(_ingress(spec, x, boot, x.bootstrap_host, boot))
        for b in range(brokers):
            o = x.override(b)
            if o is None or o.host is None:
                continue  # a broker being removed that no longer has a host
            svc = n.listener_broker(spec.name, x.name, b)
            out.append(_ingress(spec, x, svc, o.host, svc))
    return out


def _lb_address(svc: dict[str, Any] | None) -> str | None:
    for ing in ((svc or {}).get("status") or {}).get("loadBalancer", {}).get("ingress") or []:
        host = ing.get("ip") or ing.get("hostname")
        if host:
            return str(host)
    return None


def _node_port(svc: dict[str, Any] | None) -> int | None:
    for port in ((svc or {}).get("spec") or {}).get("ports") or []:
        if port.get("nodePort"):
            return int(port["nodePort"])
    return None


def resolve(
    spec: ClusterSpec,
    brokers: int,
    stored: dict[str, dict[str, Any]],
    host_ips: dict[int, str],
) -> Addresses:
    """The addresses of brokers 0..brokers-1 and the bootstrap, per external listener.

    `stored`: the listener Services as the API server has them (by name); `host_ips`:
    each scheduled broker pod's status.hostIP (its node's address). A NodePort broker
    is advertised at its own node's address, or, not scheduled yet, at another broker's
    (kube-proxy forwards a node port from every node); advertisedHost/advertisedPort
    override whatever was found."""
    out = Addresses()
    any_node = host_ips[min(host_ips)] if host_ips else None
    for x in spec.external:
        per: dict[int, Address | None] = {}
        for b in range(brokers):
            found: Address | None
            svc = stored.get(n.listener_broker(spec.name, x.name, b))
            o = x.override(b)
            if x.type == "internal":  # at the broker's own Service (render.broker_services)
                found = (n.broker_address(spec.name, b, spec.namespace), x.port)
            elif x.type == "nodeport":
                host, port = host_ips.get(b) or any_node, _node_port(svc)
                found = (host, port) if host and port else None
                own = (o.advertised_port if o else None) or port
                if own and not (o and o.advertised_host):
                    out.node_ports.setdefault(x.name, {})[b] = own
            elif x.type == "loadbalancer":
                lb = _lb_address(svc)
                found = (lb, x.port) if lb else None
            else:
                found = (o.host, INGRESS_PORT) if o and o.host else None
            if o and (o.advertised_host or o.advertised_port):
                base_host, base_port = found or (None, None)
                host = o.advertised_host or base_host
                port = o.advertised_port or base_port
                found = (host, port) if host and port else None
            per[b] = found
        out.brokers[x.name] = per
        boot = stored.get(n.listener_bootstrap(spec.name, x.name))
        bootstrap: Address | None
        if x.type == "internal":
            bootstrap = (f"{n.bootstrap_service(spec.name)}.{spec.namespace}.svc", x.port)
        elif x.type == "nodeport":
            port = _node_port(boot)
            host = x.bootstrap_host or any_node
            bootstrap = (host, port) if host and port else None
        elif x.type == "loadbalancer":
            lb = x.bootstrap_host or _lb_address(boot)
            bootstrap = (lb, x.port) if lb else None
        else:
            bootstrap = (x.bootstrap_host, INGRESS_PORT) if x.bootstrap_host else None
        out.bootstrap[x.name] = bootstrap
    return out


def _internal_advertised(spec: ClusterSpec, b: int) -> list[str]:
    """The brokers' listener at the pod DNS name, the client one at the broker's own
    Service (see render.broker_services)."""
    me = n.pod_dns(spec.name, n.BROKER, b, spec.namespace)
    client = n.CLIENT_LISTENER if spec.kafka_tls else n.PLAIN_LISTENER
    return [
        f"{n.REPLICATION_LISTENER}://{me}:{spec.replication_port}",
        f"{client}://{n.broker_address(spec.name, b, spec.namespace)}:{spec.kafka_port}",
    ]


def advertised(spec: ClusterSpec, b: int, addresses: Addresses) -> dict[str, Address]:
    """What broker `b` advertises on each external listener (its broker listener name):
    its address, or its pod DNS name and the listener's port until that is known. On a
    NodePort listener, the address of the node it runs on, which the broker reads from
    its environment when it starts (HOST_IP, the pod's status.hostIP): known before the
    pod is scheduled, so no broker restarts once it is (Strimzi's init container does
    the same)."""
    me = n.pod_dns(spec.name, n.BROKER, b, spec.namespace)
    out = {}
    for x in spec.external:
        port = addresses.node_ports.get(x.name, {}).get(b)
        if port is not None:
            out[x.broker_listener] = (HOST_IP_REF, port)
        else:
            out[x.broker_listener] = addresses.brokers.get(x.name, {}).get(b) or (me, x.port)
    return out


def broker_env(spec: ClusterSpec) -> list[dict[str, Any]]:
    """The node's address in the broker container, with a NodePort listener (only then:
    another pod template would restart every other cluster's brokers)."""
    if not any(x.type == "nodeport" for x in spec.external):
        return []
    return [{"name": HOST_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]


def advertised_properties(spec: ClusterSpec, brokers: int, addresses: Addresses) -> dict[str, str]:
    """`<pod>.properties` per broker: its advertised.listeners, every listener (and the
    environment config provider, Kafka's KIP-887, where one names the node's address)."""
    sts = n.statefulset(spec.name, n.BROKER)
    out = {}
    for b in range(brokers):
        ext = [f"{name}://{h}:{p}" for name, (h, p) in advertised(spec, b, addresses).items()]
        value = ",".join([*_internal_advertised(spec, b), *ext])
        text = f"advertised.listeners={value}\n"
        if HOST_IP_REF in value:
            text = ENV_PROVIDER_LINES + text
        out[f"{sts}-{b}.properties"] = text
    return out


def advertised_config_map(spec: ClusterSpec, brokers: int, addresses: Addresses) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": n.advertised_config_map(spec.name),
            "namespace": spec.namespace,
            "labels": n.labels(spec.name, n.BROKER),
            "ownerReferences": [n.owner_reference(spec.name, spec.uid)],
        },
        "data": advertised_properties(spec, brokers, addresses),
    }


def broker_args(spec: ClusterSpec) -> list[str]:
    """The brokers' listener settings with external listeners, the same for every pod
    (what differs, advertised.listeners, is in the pod's properties file)."""
    if not spec.external:
        return []
    certs = n.CERTS_DIR
    if spec.kafka_tls:
        internal = [
            (n.REPLICATION_LISTENER, spec.replication_port, "SSL"),
            (n.CLIENT_LISTENER, spec.kafka_port, "SASL_SSL" if spec.kafka_sasl else "SSL"),
        ]
    else:
        internal = [
            (n.REPLICATION_LISTENER, spec.replication_port, "PLAINTEXT"),
            (n.PLAIN_LISTENER, spec.kafka_port, "PLAINTEXT"),
        ]
    inter = n.REPLICATION_LISTENER
    every = [*internal, *((x.broker_listener, x.port, x.protocol) for x in spec.external)]
    args = [
        f"--properties={n.ADVERTISED_DIR}/$(POD_NAME).properties",
        "--override=listeners=" + ",".join(f"{name}://0.0.0.0:{port}" for name, port, _ in every),
        "--override=listener.security.protocol.map="
        + ",".join(f"{name}:{proto}" for name, _, proto in every),
        f"--override=inter.broker.listener.name={inter}",
    ]
    for x in spec.external:
        key = f"--override=listener.name.{x.broker_listener.lower()}"
        if x.tls:
            args += [
                f"{key}.ssl.keystore.location={certs}/$(POD_NAME).pem",
                f"{key}.ssl.truststore.location={certs}/ca.crt",
            ]
        if x.mtls:
            args.append(f"{key}.ssl.client.auth=required")
        if x.sasl:
            args.append(f"{key}.sasl.enabled.mechanisms={x.sasl}")
    return args


def dns_names(spec: ClusterSpec, b: int, addresses: Addresses | None) -> list[str]:
    """The external names and addresses broker `b`'s certificate must carry: its own on
    each TLS listener and the listener's bootstrap address (clients check either)."""
    out: list[str] = []
    for x in spec.external:
        if not x.tls:
            continue
        found = [(addresses.brokers.get(x.name) or {}).get(b) if addresses else None]
        found.append(addresses.bootstrap.get(x.name) if addresses else None)
        o = x.override(b)
        hosts = [a[0] for a in found if a] + [h for h in (x.bootstrap_host, o and o.host) if h]
        for h in hosts:
            if h not in out:
                out.append(h)
    return out


def status(spec: ClusterSpec, brokers: int, addresses: Addresses) -> list[dict[str, Any]]:
    """status.listeners: per external listener its bootstrap address and the brokers'."""
    out = []
    for x in spec.external:
        boot = addresses.bootstrap.get(x.name)
        per = addresses.brokers.get(x.name, {})
        out.append(
            {
                "name": x.name,
                "type": x.type,
                "bootstrapServers": f"{boot[0]}:{boot[1]}" if boot else None,
                "addresses": [
                    f"{a[0]}:{a[1]}" for b in range(brokers) if (a := per.get(b)) is not None
                ],
            }
        )
    return out
