"""An MQCluster's spec with the CRD's defaults filled in, and broker configs checked.

The API server applies the schema defaults, but the operator must not depend on them
(an object stored before a default existed has none), so they are repeated here.
"""

from __future__ import annotations

import base64
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from .upgrade import version_of

# Broker configs an MQCluster may set, and the broker (and controller) flag for each.
# Names are Kafka's, so a Kafka user's settings carry over.
BROKER_FLAGS = {
    "num.partitions": "--num-partitions",
    "default.replication.factor": "--default-replication-factor",
    "offsets.topic.replication.factor": "--offsets-topic-replication-factor",
    "message.max.bytes": "--message-max-bytes",
    "replica.lag.time.max.ms": "--replica-lag-time-max-ms",
    "log.retention.check.interval.ms": "--retention-check-interval-ms",
    "group.initial.rebalance.delay.ms": "--group-initial-rebalance-delay-ms",
    "controlled.shutdown.timeout.ms": "--controlled-shutdown-timeout-ms",
    # The log cleaner and the broker defaults of the compaction topic configs (they can
    # also be changed at runtime with kafka-configs; these are the values pods start with).
    "log.cleaner.threads": "--log-cleaner-threads",
    "log.cleaner.dedupe.buffer.size": "--log-cleaner-dedupe-buffer-size",
    "log.cleaner.io.buffer.size": "--log-cleaner-io-buffer-size",
    "log.cleaner.backoff.ms": "--log-cleaner-backoff-ms",
    "log.cleaner.min.compaction.lag.ms": "--log-cleaner-min-compaction-lag-ms",
    "log.cleaner.max.compaction.lag.ms": "--log-cleaner-max-compaction-lag-ms",
    "log.cleaner.delete.retention.ms": "--log-cleaner-delete-retention-ms",
}
# Settings whose value is a number with a fraction, not an integer.
NUMBER_FLAGS = {
    "log.cleaner.min.cleanable.ratio": "--log-cleaner-min-cleanable-ratio",
    "log.cleaner.io.max.bytes.per.second": "--log-cleaner-io-max-bytes-per-second",
    "log.cleaner.io.buffer.load.factor": "--log-cleaner-io-buffer-load-factor",
}
# The quorum sizes an MQCluster may ask for: odd, so that no even split stalls it.
CONTROLLER_COUNTS = (1, 3, 5)
# log.cleanup.policy: a list of these (the broker checks the rest when it starts).
CLEANUP_POLICIES = ("compact", "delete")
BOOLEAN_CONFIGS = {"auto.create.topics.enable", "log.cleaner.enable"}
CONTROLLER_FLAGS = {
    "num.partitions": "--default-partitions",
    "default.replication.factor": "--default-replication-factor",
}


# The repository spec.version's image comes from (<repository>:<version>): the chart's
# image.repository (the Deployment sets the variable), else the published one.
DEFAULT_IMAGE_REPOSITORY = "straitmq/straitmq"
IMAGE_REPOSITORY = os.environ.get("STRAITMQ_IMAGE_REPOSITORY") or DEFAULT_IMAGE_REPOSITORY
FINALIZE_MODES = ("manual", "auto")


class SpecError(ValueError):
    """The spec cannot be turned into a cluster; the message says which field and why."""


@dataclass(frozen=True)
class Storage:
    size: str = "1Gi"
    storage_class: str | None = None


LISTENER_TYPES = ("internal", "nodeport", "loadbalancer", "ingress")
SASL_TYPES = {"scram-sha-512": "SCRAM-SHA-512", "scram-sha-256": "SCRAM-SHA-256"}
# Listener names the brokers use themselves (or that Kafka maps to a protocol).
RESERVED_LISTENERS = (
    *("kafka", "http", "replication", "controller", "client", "plaintext", "ssl"),
    *("broker", "bootstrap", "config", "advertised"),
)
INGRESS_PORT = 443  # an ingress controller's TLS port: what clients of an ingress listener use


@dataclass(frozen=True)
class BrokerListenerOverride:
    """configuration.brokers[]: one broker's address on an external listener."""

    broker: int
    advertised_host: str | None = None
    advertised_port: int | None = None
    node_port: int | None = None
    host: str | None = None  # ingress: the broker's own host name (SNI)


@dataclass(frozen=True)
class ExternalListener:
    """spec.listeners.external[]: a listener for clients elsewhere, Strimzi-style.

    internal: another listener on the pods' DNS names; nodeport: one NodePort Service
    per broker (advertised as its node's address and node port) plus a bootstrap one;
    loadbalancer: one LoadBalancer Service per broker (its ingress IP or host name) plus
    a bootstrap one; ingress: TLS passthrough through an ingress controller, one host
    per broker (SNI) and a bootstrap host, on port 443."""

    name: str
    type: str
    port: int
    tls: bool = False
    sasl: str | None = None  # SCRAM-SHA-512 / -256
    mtls: bool = False
    bootstrap_host: str | None = None  # ingress host; an advertised name for the others
    bootstrap_node_port: int | None = None
    ingress_class: str = "nginx"
    brokers: tuple[BrokerListenerOverride, ...] = ()

    @property
    def broker_listener(self) -> str:
        """The listener's name in the brokers' config (listeners=EXT_<NAME>://...)."""
        return f"EXT_{self.name.upper()}"

    @property
    def port_name(self) -> str:
        return f"ext-{self.name}"

    @property
    def protocol(self) -> str:
        if self.sasl:
            return "SASL_SSL" if self.tls else "SASL_PLAINTEXT"
        return "SSL" if self.tls else "PLAINTEXT"

    def override(self, broker: int) -> BrokerListenerOverride | None:
        return next((o for o in self.brokers if o.broker == broker), None)


@dataclass(frozen=True)
class ClusterSpec:
    name: str
    namespace: str
    uid: str
    image: str
    image_pull_policy: str = "IfNotPresent"
    brokers: int = 3
    broker_storage: Storage = Storage()
    broker_resources: dict[str, Any] = field(default_factory=dict)
    broker_config: dict[str, str] = field(default_factory=dict)
    rack_topology_key: str | None = None
    throttle_bytes_per_sec: int = 10 * 1024 * 1024
    # spec.controllers.replicas: the voters the quorum should have (the operator adds
    # and removes them one at a time, KIP-853).
    controllers: int = 3
    # The controllers the cluster was created with: the static --voters every pod
    # starts with (its first voter set, never changed afterwards: a new pod beyond it
    # joins as an observer). From status.controllers.initialVoters; None when the status
    # does not say (the reconciler decides: 3 for a cluster made before it was kept).
    first_voters: int | None = None
    controller_storage: Storage = Storage()
    controller_resources: dict[str, Any] = field(default_factory=dict)
    kafka_port: int = 9092
    http_port: int = 8080
    controller_port: int = 9093
    # listeners.kafka.tls: clients get SSL with a certificate from the cluster CA. The
    # brokers replicate over their own listener on replication_port (SSL with kafka.tls).
    kafka_tls: bool = False
    replication_port: int = 9091
    # listeners.kafka.authentication.type: SASL on the client listener (SCRAM-SHA-512 or
    # -256); authorization.type simple: Kafka's StandardAuthorizer, with these super users
    # besides the brokers' own certificate principal.
    kafka_sasl: str | None = None
    # listeners.kafka.authentication.type tls: clients show a certificate from the cluster
    # CA (a tls User's), their principal User:CN=<name>.
    kafka_mtls: bool = False
    authorization: bool = False
    super_users: tuple[str, ...] = ()
    metrics_enabled: bool = True
    otlp_endpoint: str | None = None
    external: tuple[ExternalListener, ...] = ()
    # spec.version (None: spec.image alone), and what a version roll does (upgrade.py):
    # spec.upgrade.finalizeFeatures (manual: `strait features upgrade`; auto: the operator
    # finalizes straitmq.metadata.version once every pod has run the image for
    # finalizeAfterSeconds), stepTimeoutSeconds (a restart not done in time pauses the
    # roll), minReadySeconds (a restarted pod in service this long counts as back).
    version: str | None = None
    finalize_features: str = "manual"
    finalize_after_s: int = 600
    upgrade_step_timeout_s: int = 600
    upgrade_min_ready_s: int = 10

    @property
    def reported_version(self) -> str:
        """What status.version.to says: spec.version, else the image's tag."""
        return self.version or version_of(self.image)

    @property
    def needs_certificates(self) -> bool:
        """The cluster CA and the brokers' certificates: kafka.tls or a TLS listener."""
        return self.kafka_tls or any(x.tls for x in self.external)

    @property
    def initial_voters(self) -> int:
        """How many controllers the static --voters name (the first voter set)."""
        return self.first_voters if self.first_voters is not None else self.controllers

    @property
    def http_secured(self) -> bool:
        """The brokers' HTTP API (topics, users, ACLs) needs a credential: https with the
        brokers' certificates, a client certificate from the cluster CA (or, with SCRAM, a
        User's password as HTTP Basic). On whenever listeners.kafka.authentication or
        authorization is set (both need kafka.tls); /healthz, /readyz and /metrics stay
        open. A TLS-only cluster keeps plain HTTP, as open as its Kafka listener."""
        return self.kafka_tls and (
            self.authorization or self.kafka_sasl is not None or self.kafka_mtls
        )

    @property
    def cluster_id(self) -> str:
        """Kafka-style cluster id (22 chars of URL-safe base64), fixed by the object's uid."""
        key = uuid.UUID(self.uid) if self.uid else uuid.uuid5(uuid.NAMESPACE_DNS, self.name)
        raw = key.bytes
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    def broker_args(self) -> list[str]:
        args = []
        for key, value in sorted(self.broker_config.items()):
            if key in BOOLEAN_CONFIGS:
                if key == "auto.create.topics.enable" and value == "false":
                    args.append("--no-auto-create")
                if key == "log.cleaner.enable" and value == "false":
                    args.append("--no-log-cleaner")
            elif key == "log.cleanup.policy":
                args.append(f"--log-cleanup-policy={value}")
            else:
                args.append(f"{BROKER_FLAGS.get(key) or NUMBER_FLAGS[key]}={value}")
        return args

    def controller_args(self) -> list[str]:
        return [
            f"{CONTROLLER_FLAGS[k]}={v}"
            for k, v in sorted(self.broker_config.items())
            if k in CONTROLLER_FLAGS
        ]


def _storage(raw: Any) -> Storage:
    raw = raw or {}
    return Storage(size=str(raw.get("size") or "1Gi"), storage_class=raw.get("class") or None)


def _config(raw: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (raw or {}).items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if key in BOOLEAN_CONFIGS:
            if text not in ("true", "false"):
                raise SpecError(f"spec.brokers.config.{key} must be true or false, not {text!r}")
        elif key in BROKER_FLAGS:
            if not text.lstrip("-").isdigit():
                raise SpecError(f"spec.brokers.config.{key} must be an integer, not {text!r}")
        elif key in NUMBER_FLAGS:
            try:
                float(text)
            except ValueError:
                raise SpecError(
                    f"spec.brokers.config.{key} must be a number, not {text!r}"
                ) from None
        elif key == "log.cleanup.policy":
            policies = [p.strip() for p in text.split(",")] if text.strip() else []
            if any(p not in CLEANUP_POLICIES for p in policies):
                raise SpecError(
                    f"spec.brokers.config.{key} must list compact and/or delete, not {text!r}"
                )
            text = ",".join(policies)
        else:
            known = ", ".join(
                sorted([*BROKER_FLAGS, *NUMBER_FLAGS, *BOOLEAN_CONFIGS, "log.cleanup.policy"])
            )
            raise SpecError(f"spec.brokers.config.{key} is not a broker config (known: {known})")
        out[key] = text
    return out


def parse(body: dict[str, Any], image_repository: str | None = None) -> ClusterSpec:
    meta = body.get("metadata", {})
    spec = body.get("spec") or {}
    version = spec.get("version") or None
    if version is not None:
        version = str(version)
    image = spec.get("image") or (
        f"{image_repository or IMAGE_REPOSITORY}:{version}" if version else None
    )
    if not image:
        raise SpecError("spec.version or spec.image is required")
    upgrade = spec.get("upgrade") or {}
    finalize = str(upgrade.get("finalizeFeatures") or "manual")
    if finalize not in FINALIZE_MODES:
        raise SpecError(f"spec.upgrade.finalizeFeatures must be manual or auto, not {finalize!r}")
    controllers = spec.get("controllers") or {}
    ctl_replicas = controllers.get("replicas", 3)
    if ctl_replicas not in CONTROLLER_COUNTS or isinstance(ctl_replicas, bool):
        raise SpecError(
            f"spec.controllers.replicas must be 1, 3 or 5, not {ctl_replicas!r} (an odd "
            "quorum: an even one tolerates no more failures than the odd one below it)"
        )
    first = ((body.get("status") or {}).get("controllers") or {}).get("initialVoters")
    brokers = spec.get("brokers") or {}
    listeners = spec.get("listeners") or {}
    metrics = spec.get("metrics") or {}
    replicas = int(brokers.get("replicas", 3))
    if replicas < 1:
        raise SpecError("spec.brokers.replicas must be at least 1")
    kafka = listeners.get("kafka") or {}
    replication_port = int((listeners.get("replication") or {}).get("port", 9091))
    if replication_port in (
        int(kafka.get("port", 9092)),
        int((listeners.get("http") or {}).get("port", 8080)),
    ):
        raise SpecError(
            f"spec.listeners.replication.port {replication_port} is taken by the kafka or "
            "http listener; the brokers replicate on their own port"
        )
    sasl = {"scram-sha-512": "SCRAM-SHA-512", "scram-sha-256": "SCRAM-SHA-256"}
    auth_type = (kafka.get("authentication") or {}).get("type")
    if auth_type is not None and auth_type not in (*sasl, "tls"):
        raise SpecError(
            f"spec.listeners.kafka.authentication.type {auth_type!r} is not one "
            f"of {', '.join([*sasl, 'tls'])}"
        )
    authz = spec.get("authorization") or {}
    if (auth_type or authz) and not kafka.get("tls"):
        raise SpecError(
            "spec.listeners.kafka.authentication and spec.authorization need "
            "spec.listeners.kafka.tls: true (the brokers replicate with their certificates)"
        )
    external = _external(listeners.get("external"), replicas, kafka, listeners)
    return ClusterSpec(
        name=meta["name"],
        namespace=meta.get("namespace") or "default",
        uid=meta.get("uid") or "",
        image=image,
        image_pull_policy=spec.get("imagePullPolicy") or "IfNotPresent",
        brokers=replicas,
        broker_storage=_storage(brokers.get("storage")),
        broker_resources=dict(brokers.get("resources") or {}),
        broker_config=_config(brokers.get("config")),
        rack_topology_key=(brokers.get("rack") or {}).get("topologyKey") or None,
        throttle_bytes_per_sec=int(brokers.get("rebalanceThrottleBytesPerSecond") or 10485760),
        controllers=int(ctl_replicas),
        first_voters=int(first) if isinstance(first, int) and first > 0 else None,
        controller_storage=_storage(controllers.get("storage")),
        controller_resources=dict(controllers.get("resources") or {}),
        kafka_port=int((listeners.get("kafka") or {}).get("port", 9092)),
        http_port=int((listeners.get("http") or {}).get("port", 8080)),
        controller_port=int((listeners.get("controller") or {}).get("port", 9093)),
        kafka_tls=bool((listeners.get("kafka") or {}).get("tls", False)),
        replication_port=replication_port,
        kafka_sasl=sasl.get(auth_type or ""),
        kafka_mtls=auth_type == "tls",
        authorization=authz.get("type") == "simple",
        super_users=tuple(authz.get("superUsers") or ()),
        metrics_enabled=bool(metrics.get("enabled", True)),
        otlp_endpoint=metrics.get("otlpEndpoint") or None,
        external=external,
        version=version,
        finalize_features=finalize,
        finalize_after_s=int(upgrade.get("finalizeAfterSeconds", 600)),
        upgrade_step_timeout_s=int(upgrade.get("stepTimeoutSeconds", 600)),
        upgrade_min_ready_s=int(upgrade.get("minReadySeconds", 10)),
    )


def _external(
    raw: Any, replicas: int, kafka: dict[str, Any], listeners: dict[str, Any]
) -> tuple[ExternalListener, ...]:
    taken = {
        int(kafka.get("port", 9092)): "kafka",
        int((listeners.get("http") or {}).get("port", 8080)): "http",
        int((listeners.get("controller") or {}).get("port", 9093)): "controller",
    }
    taken[int((listeners.get("replication") or {}).get("port", 9091))] = "replication"
    out: list[ExternalListener] = []
    for i, item in enumerate(raw or []):
        where = f"spec.listeners.external[{i}]"
        name = str(item.get("name") or "")
        if not name.isascii() or not name.isalnum() or name != name.lower() or len(name) > 11:
            raise SpecError(f"{where}.name {name!r} must be 1-11 lowercase letters or digits")
        if name in RESERVED_LISTENERS or any(x.name == name for x in out):
            raise SpecError(f"{where}.name {name!r} is taken")
        where = f"spec.listeners.external[{name}]"
        kind = str(item.get("type") or "")
        if kind not in LISTENER_TYPES:
            raise SpecError(f"{where}.type {kind!r} is not one of {', '.join(LISTENER_TYPES)}")
        port = int(item.get("port") or 0)
        if not 1 <= port <= 65535:
            raise SpecError(f"{where}.port must be 1-65535")
        if port in taken:
            raise SpecError(f"{where}.port {port} is taken by the {taken[port]} listener")
        taken[port] = name
        tls = bool(item.get("tls", False))
        auth = (item.get("authentication") or {}).get("type")
        if auth is not None and auth not in (*SASL_TYPES, "tls"):
            raise SpecError(
                f"{where}.authentication.type {auth!r} is not one of "
                f"{', '.join([*SASL_TYPES, 'tls'])}"
            )
        if auth == "tls" and not tls:
            raise SpecError(f"{where}.authentication.type tls needs tls: true")
        if kind == "ingress" and not tls:
            raise SpecError(f"{where}: an ingress listener needs tls: true (TLS passthrough)")
        conf = item.get("configuration") or {}
        boot = conf.get("bootstrap") or {}
        overrides: list[BrokerListenerOverride] = []
        for o in conf.get("brokers") or []:
            b = int(o.get("broker", -1))
            if b < 0 or any(x.broker == b for x in overrides):
                raise SpecError(f"{where}.configuration.brokers: broker {b} is not a broker id")
            adv_port = o.get("advertisedPort")
            node_port = o.get("nodePort")
            overrides.append(
                BrokerListenerOverride(
                    broker=b,
                    advertised_host=o.get("advertisedHost") or None,
                    advertised_port=int(adv_port) if adv_port else None,
                    node_port=int(node_port) if node_port else None,
                    host=o.get("host") or None,
                )
            )
        listener = ExternalListener(
            name=name,
            type=kind,
            port=port,
            tls=tls,
            sasl=SASL_TYPES.get(auth or ""),
            mtls=auth == "tls",
            bootstrap_host=boot.get("host") or None,
            bootstrap_node_port=int(boot["nodePort"]) if boot.get("nodePort") else None,
            ingress_class=str(conf.get("class") or "nginx"),
            brokers=tuple(sorted(overrides, key=lambda o: o.broker)),
        )
        if kind == "ingress":
            missing = [b for b in range(replicas) if not (listener.override(b) or _NO_HOST).host]
            if not listener.bootstrap_host or missing:
                raise SpecError(
                    f"{where}: an ingress listener needs configuration.bootstrap.host and a "
                    f"configuration.brokers[].host for every broker (missing: "
                    f"{'bootstrap' if not listener.bootstrap_host else ''}"
                    f"{' ' if not listener.bootstrap_host and missing else ''}"
                    f"{', '.join(f'broker {b}' for b in missing)})"
                )
        out.append(listener)
    return tuple(out)


_NO_HOST = BrokerListenerOverride(broker=-1)
