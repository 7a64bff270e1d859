"""User reconciliation: a credential and exactly the spec's ACLs in the cluster, and the
credentials in a Secret named after the User.

authentication.type tls (as Strimzi's KafkaUser): a client certificate from the cluster
CA with CN=<user> and no other subject field, so its principal is User:CN=<user> (the
cluster's own certificates say O=straitmq: no user name can pass for them); `user.crt`,
`user.key` and `ca.crt` in the Secret, issued again before it expires or when the CA is
renewed. A certificate cannot be taken back: deleting the User removes its ACLs, which
is what keeps it out (with authorization on).

SCRAM (scram-sha-512 / -256):

The password is the one the User names (`spec.authentication.password.valueFrom
.secretKeyRef`), else the one already in the User's Secret, else a new random one. The
broker salts it (PUT /api/v1/users/{name}); the Secret's `straitmq.io/credential`
annotation keeps a digest of what was last sent, so a changed password (a rotation) is
sent again and an unchanged one is not. The Secret holds the password anyway, so the
digest tells nobody anything they could not read beside it.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from straitmq.invariants import broken

from . import certificates, managed, pki
from . import names as n
from .admin import AdminClient, AdminError
from .cluster import Emit, admin_url
from .conditions import get_condition, set_condition
from .kube import Kube
from .spec import SpecError, parse

MECHANISMS = {"scram-sha-512": "SCRAM-SHA-512", "scram-sha-256": "SCRAM-SHA-256"}
RESOURCE_TYPES = {
    "topic": "TOPIC",
    "group": "GROUP",
    "cluster": "CLUSTER",
    "transactionalId": "TRANSACTIONAL_ID",
}
OPERATIONS = {
    "All": "ALL",
    "Read": "READ",
    "Write": "WRITE",
    "Create": "CREATE",
    "Delete": "DELETE",
    "Alter": "ALTER",
    "Describe": "DESCRIBE",
    "ClusterAction": "CLUSTER_ACTION",
    "DescribeConfigs": "DESCRIBE_CONFIGS",
    "AlterConfigs": "ALTER_CONFIGS",
    "IdempotentWrite": "IDEMPOTENT_WRITE",
}
# spec.quotas (Strimzi KafkaUser's names) -> Kafka's quota keys.
QUOTA_KEYS = {
    "producerByteRate": "producer_byte_rate",
    "consumerByteRate": "consumer_byte_rate",
    "requestPercentage": "request_percentage",
    "controllerMutationRate": "controller_mutation_rate",
}
CLUSTER_NAME = "kafka-cluster"  # the CLUSTER resource's one name, in Kafka
CREDENTIAL_ANNOTATION = "straitmq.io/credential"
SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
# Client settings every User Secret carries (Kafka's names: the Java client and librdkafka
# read both). A connection setup that gets no answer is given up after 3 s and tried
# anew: when a Service goes from no ready pod to one, kube-proxy (iptables mode) drops
# its REJECT rule (filter table) a moment before it adds the DNAT rules (nat table), and
# a SYN sent in between is conntracked un-NATed to the ClusterIP, where nothing answers;
# its retransmits follow that entry, so the connect hangs until the client's own timeout
# (librdkafka 30 s, Java 10 s; kubernetes/kubernetes#48719). The next connect is NATed.
# Seen on the real node: the bootstrap Service as the broker pods came back after all
# were deleted. reconnect.backoff.max.ms: the Java default, librdkafka's is 10 s (a
# broker it kept through an outage may otherwise wait that long once it is back).
CLIENT_SETTINGS = {"socket.connection.setup.timeout.ms": "3000", "reconnect.backoff.max.ms": "1000"}


class Binding(NamedTuple):
    """One ACL binding as the broker's /api/v1/acls names it."""

    resource_type: str
    resource_name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission: str

    def as_json(self) -> dict[str, str]:
        return self._asdict()

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Binding:
        return cls(*(str(raw[f]) for f in cls._fields))


@dataclass(frozen=True)
class UserSpec:
    cluster: str
    name: str  # the user name: metadata.name
    mechanism: str  # SCRAM-SHA-512 or SCRAM-SHA-256; TLS for a certificate
    password_ref: tuple[str, str] | None  # (Secret, key) or None: generated
    acls: frozenset[Binding]
    # spec.quotas in Kafka's keys (producer_byte_rate, ...): the user's own quotas.
    quotas: dict[str, float] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return self.mechanism == TLS

    @property
    def principal(self) -> str:
        return principal_of(self.name, self.tls)


TLS = "TLS"


def principal_of(name: str, tls: bool) -> str:
    return f"User:CN={name}" if tls else f"User:{name}"


class UserProblem(Exception):
    """The user cannot be made to match its spec; `reason` becomes the condition's."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def bindings(principal: str, acls: list[dict[str, Any]]) -> frozenset[Binding]:
    """The spec's ACL rules as bindings of `principal`: one per operation."""
    out: set[Binding] = set()
    for rule in acls:
        res = rule["resource"]
        rtype = RESOURCE_TYPES.get(res["type"])
        if rtype is None:
            raise UserProblem("InvalidAcl", f"unknown resource type {res['type']!r}")
        rname = CLUSTER_NAME if rtype == "CLUSTER" else res.get("name", "")
        pattern = str(res.get("patternType") or "literal").upper()
        permission = str(rule.get("type") or "allow").upper()
        for op in rule.get("operations") or []:
            operation = OPERATIONS.get(op)
            if operation is None:
                raise UserProblem("InvalidAcl", f"unknown operation {op!r}")
            out.add(
                Binding(
                    rtype, rname, pattern, principal, rule.get("host") or "*", operation, permission
                )
            )
    return frozenset(out)


def user_spec(body: dict[str, Any]) -> UserSpec:
    spec = body.get("spec") or {}
    name = body["metadata"]["name"]
    auth = spec.get("authentication") or {}
    mechanism = TLS if auth.get("type") == "tls" else MECHANISMS.get(auth.get("type", ""))
    if mechanism is None:
        raise UserProblem(
            "InvalidSpec",
            f"authentication.type {auth.get('type')!r} is not "
            f"one of {', '.join([*MECHANISMS, 'tls'])}",
        )
    ref = (((auth.get("password") or {}).get("valueFrom") or {}).get("secretKeyRef")) or None
    password_ref = (ref["name"], ref["key"]) if ref else None
    if password_ref and password_ref[0] == name:
        raise UserProblem(
            "PasswordSecretConflict",
            f"the password Secret may not be '{name}': the operator writes the User's "
            "credentials to the Secret of that name",
        )
    acls = ((spec.get("authorization") or {}).get("acls")) or []
    principal = principal_of(name, mechanism == TLS)
    return UserSpec(
        spec["cluster"],
        name,
        mechanism,
        password_ref,
        bindings(principal, acls),
        quota_values(spec.get("quotas") or {}),
    )


def quota_values(quotas: dict[str, Any]) -> dict[str, float]:
    """spec.quotas as Kafka's keys and values; UserProblem names what the broker would
    refuse (the CRD's schema refuses it first when it is installed)."""
    out: dict[str, float] = {}
    for key, value in quotas.items():
        kafka_key = QUOTA_KEYS.get(key)
        if kafka_key is None:
            raise UserProblem(
                "InvalidQuota", f"unknown quota {key!r} (one of {', '.join(QUOTA_KEYS)})"
            )
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise UserProblem("InvalidQuota", f"quotas.{key} must be a number >= 0, not {value!r}")
        out[kafka_key] = float(value)
    return out


def quota_changes(want: dict[str, float], have: dict[str, float]) -> dict[str, float | None]:
    """What to send so that the user's quotas are exactly `want` (None: remove the key)."""
    changes: dict[str, float | None] = {k: v for k, v in want.items() if have.get(k) != v}
    changes.update({k: None for k in have if k not in want})
    return changes


def acl_changes(
    want: frozenset[Binding], have: list[Binding]
) -> tuple[list[Binding], list[Binding]]:
    """(to create, to delete) so that the principal holds exactly `want`."""
    have_set = set(have)
    return sorted(want - have_set), sorted(have_set - want)


def jaas_config(user: str, password: str) -> str:
    def quoted(v: str) -> str:
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return f"{SCRAM_LOGIN} required username={quoted(user)} password={quoted(password)};"


def credential_digest(uid: str, mechanism: str, password: str) -> str:
    return hashlib.sha256(f"{uid}\0{mechanism}\0{password}".encode()).hexdigest()


def bootstrap_servers(cluster: dict[str, Any], cspec: Any) -> str:
    override = (cluster.get("metadata", {}).get("annotations") or {}).get(n.BOOTSTRAP_ANNOTATION)
    if override:
        return override
    return f"{n.bootstrap_service(cspec.name)}.{cspec.namespace}.svc:{cspec.kafka_port}"


def _b64(v: str) -> str:
    return base64.b64encode(v.encode()).decode()


def _secret_value(secret: dict[str, Any] | None, key: str) -> str | None:
    raw = ((secret or {}).get("data") or {}).get(key)
    if raw is None:
        return None
    return base64.b64decode(raw).decode()


def _reason(e: AdminError) -> str:
    if e.unreachable:
        return "ClusterUnreachable"
    if e.status in (401, 403):
        return "AdminAccessDenied"
    if e.error_name:
        return "".join(w.capitalize() for w in e.error_name.split("_"))
    return f"AdminError{e.status}"


class UserReconciler:
    def __init__(self, kube: Kube, emit: Emit, admin_timeout_s: float = 10.0) -> None:
        self.kube = kube
        self.emit = emit
        self.admin_timeout_s = admin_timeout_s

    async def _cluster(self, ns: str, us: UserSpec) -> tuple[dict[str, Any], Any]:
        cluster = await self.kube.get_custom(n.CLUSTERS, ns, us.cluster)
        if cluster is None:
            raise UserProblem(
                "ClusterNotFound", f"MQCluster '{us.cluster}' does not exist in namespace '{ns}'"
            )
        try:
            return cluster, parse(cluster)
        except SpecError as e:
            raise UserProblem("ClusterInvalid", f"MQCluster '{us.cluster}': {e}") from None

    async def _password(self, ns: str, us: UserSpec, own: dict[str, Any] | None) -> str:
        if us.password_ref is None:
            return _secret_value(own, "password") or secrets.token_urlsafe(24)
        name, key = us.password_ref
        secret = await self.kube.get("v1", "Secret", ns, name)
        if secret is None:
            raise UserProblem(
                "PasswordSecretNotFound", f"Secret '{name}' (the password) does not exist in '{ns}'"
            )
        value = _secret_value(secret, key)
        if not value:
            raise UserProblem(
                "PasswordKeyNotFound", f"Secret '{name}' has no key '{key}' (or it is empty)"
            )
        return value

    async def reconcile(self, body: dict[str, Any]) -> dict[str, Any]:
        """Credential, Secret and ACLs; returns the new status."""
        old = body.get("status") or {}
        meta = body["metadata"]
        generation = meta.get("generation")
        ns = meta.get("namespace") or "default"
        conds = list(old.get("conditions") or [])
        status: dict[str, Any] = {**old, "observedGeneration": generation}
        try:
            us = user_spec(body)
            cluster, cspec = await self._cluster(ns, us)
            # Recorded before it is made: deleting the User removes it (managed.py).
            kind = managed.TLS if us.tls else managed.SCRAM
            await managed.record(self.kube, cluster, managed.USER, us.name, kind)
            own = await self.kube.get("v1", "Secret", ns, us.name)
            password = None if us.tls else await self._password(ns, us, own)
            auth = await certificates.admin_auth(self.kube, cspec)
            async with AdminClient(admin_url(cluster, cspec), self.admin_timeout_s, auth) as admin:
                extra = await self._client_settings(cspec)
                bootstrap = bootstrap_servers(cluster, cspec)
                rotated: str | bool | None  # why a certificate was issued / a credential set
                if password is None:
                    rotated = await self._certificate(admin, body, us, cspec, own, bootstrap, extra)
                else:
                    digest = credential_digest(meta["uid"], us.mechanism, password)
                    rotated = await self._credential(admin, us, password, digest, own)
                    data = {
                        "username": us.name,
                        "password": password,
                        "sasl.mechanism": us.mechanism,
                        "sasl.jaas.config": jaas_config(us.name, password),
                        "bootstrap.servers": bootstrap,
                        **CLIENT_SETTINGS,
                        **extra,
                    }
                    await self._secret(body, us, data, digest)
                status |= {"username": us.principal.removeprefix("User:"), "secret": us.name}
                count = await self._acls(admin, us)
                await self._quotas(admin, us)
        except UserProblem as e:
            if not _same_problem(conds, e.reason, e.message):
                self.emit("Warning", e.reason, e.message)
            conds = set_condition(conds, "Ready", False, e.reason, e.message, generation)
            return {**status, "conditions": conds}
        if rotated:
            what = f"certificate ({rotated})" if us.tls else "credential"
            self.emit("Normal", "CredentialSet", f"{us.mechanism} {what} of '{us.name}' set")
        conds = set_condition(
            conds,
            "Ready",
            True,
            "Reconciled",
            f"user '{us.name}' has its credential and {count} ACL bindings",
            generation,
        )
        if old.get("conditions") and not _ready(old["conditions"]):
            self.emit("Normal", "Ready", f"user '{us.name}' matches its spec")
        return {**status, "acls": count, "conditions": conds}

    async def _credential(
        self,
        admin: AdminClient,
        us: UserSpec,
        password: str,
        digest: str,
        own: dict[str, Any] | None,
    ) -> bool:
        """Send the password when the cluster lacks the credential or it changed; drop the
        other mechanism's credential. True if the credential was (re)set."""
        try:
            have = await admin.user(us.name)
            mechanisms = {m["mechanism"] for m in (have or {}).get("mechanisms", [])}
            sent = ((own or {}).get("metadata", {}).get("annotations") or {}).get(
                CREDENTIAL_ANNOTATION
            )
            changed = us.mechanism not in mechanisms or sent != digest
            if changed:
                await admin.put_user(us.name, us.mechanism, password)
            for other in sorted(mechanisms - {us.mechanism}):
                await admin.delete_user(us.name, other)
        except AdminError as e:
            raise UserProblem(_reason(e), e.message) from None
        return changed

    async def _certificate(
        self,
        admin: AdminClient,
        body: dict[str, Any],
        us: UserSpec,
        cspec: Any,
        own: dict[str, Any] | None,
        bootstrap: str,
        extra: dict[str, str],
    ) -> str | None:
        """A tls User's certificate in its Secret, issued when missing or due; why it was
        issued (None: the stored one is good). A SCRAM credential it had is dropped."""
        if not cspec.kafka_tls:
            raise UserProblem(
                "ClusterNotTls",
                f"MQCluster '{cspec.name}' has no "
                "listeners.kafka.tls: a tls User needs its cluster CA",
            )
        ca = await self.kube.get("v1", "Secret", cspec.namespace, n.cluster_ca_secret(cspec.name))
        ca_key, ca_crt = _secret_value(ca, "ca.key"), _secret_value(ca, "ca.crt")
        if not ca_key or not ca_crt:
            raise UserProblem(
                "ClusterCaNotReady", f"the cluster CA of '{cspec.name}' is not made yet"
            )
        crt, key = _secret_value(own, "user.crt"), _secret_value(own, "user.key")
        why = pki.needs_new(crt, ca_crt, [us.name]) if key else "no certificate yet"
        if why is not None:
            key, crt = pki.issue(ca_key, ca_crt, us.name, [us.name], organization=None)
        if key is None or crt is None:
            broken("a tls user has a certificate and its key", user=us.name)
        try:
            have = await admin.user(us.name)
            for m in sorted({m["mechanism"] for m in (have or {}).get("mechanisms", [])}):
                await admin.delete_user(us.name, m)
        except AdminError as e:
            raise UserProblem(_reason(e), e.message) from None
        data = {
            "username": us.principal.removeprefix("User:"),
            "user.crt": crt,
            "user.key": key,
            "bootstrap.servers": bootstrap,
            **CLIENT_SETTINGS,
            **extra,
            "security.protocol": "SSL",
        }
        await self._secret(body, us, data, hashlib.sha256(crt.encode()).hexdigest())
        return why

    async def _client_settings(self, cspec: Any) -> dict[str, str]:
        """What a client needs besides the password when the MQCluster's spec says how its
        listener is secured: the cluster CA (`ca.crt`) and `security.protocol`."""
        if not cspec.kafka_tls:
            return {}
        ca = await self.kube.get(
            "v1", "Secret", cspec.namespace, n.cluster_ca_cert_secret(cspec.name)
        )
        out = {"security.protocol": "SASL_SSL" if cspec.kafka_sasl else "SSL"}
        if crt := _secret_value(ca, "ca.crt"):
            out["ca.crt"] = crt
        return out

    async def _secret(
        self, body: dict[str, Any], us: UserSpec, data: dict[str, str], digest: str
    ) -> None:
        meta = body["metadata"]
        await self.kube.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "Opaque",
                "metadata": {
                    "name": us.name,
                    "namespace": meta.get("namespace") or "default",
                    "labels": {
                        "app.kubernetes.io/part-of": "straitmq",
                        "app.kubernetes.io/managed-by": n.FIELD_MANAGER,
                        "straitmq.io/cluster": us.cluster,
                        "straitmq.io/user": us.name,
                    },
                    "annotations": {CREDENTIAL_ANNOTATION: digest},
                    "ownerReferences": [
                        {
                            "apiVersion": n.API_VERSION,
                            "kind": "User",
                            "name": meta["name"],
                            "uid": meta["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "data": {k: _b64(v) for k, v in data.items()},
            }
        )

    async def _acls(self, admin: AdminClient, us: UserSpec) -> int:
        """Make the principal's bindings exactly the spec's; returns how many it has."""
        try:
            have = [Binding.from_json(b) for b in await admin.acls(us.principal)]
            create, delete = acl_changes(us.acls, have)
            if create or delete:
                await admin.alter_acls([b.as_json() for b in create], [b.as_json() for b in delete])
                self.emit(
                    "Normal",
                    "AclsChanged",
                    f"{len(create)} ACL bindings added, {len(delete)} removed",
                )
        except AdminError as e:
            reason = "InvalidAcl" if e.error_name == "INVALID_REQUEST" else _reason(e)
            raise UserProblem(reason, e.message) from None
        return len(us.acls)

    async def _quotas(self, admin: AdminClient, us: UserSpec) -> None:
        """Make the user's own client quotas exactly spec.quotas (AlterClientQuotas)."""
        user = us.principal.removeprefix("User:")
        try:
            changes = quota_changes(us.quotas, await admin.user_quotas(user))
            if changes:
                await admin.alter_user_quotas(user, changes)
                self.emit(
                    "Normal",
                    "QuotasChanged",
                    ", ".join(f"{k}={'removed' if v is None else v}" for k, v in changes.items()),
                )
        except AdminError as e:
            reason = "InvalidQuota" if e.error_name == "INVALID_REQUEST" else _reason(e)
            raise UserProblem(reason, e.message) from None


def _ready(conditions: list[dict[str, Any]]) -> bool:
    return (get_condition(conditions, "Ready") or {}).get("status") == "True"


def _same_problem(conditions: list[dict[str, Any]], reason: str, message: str) -> bool:
    c = get_condition(conditions, "Ready") or {}
    return c.get("reason") == reason and c.get("message") == message
