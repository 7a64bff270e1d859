"""The cluster CA and the brokers' certificates, kept in Secrets (spec.listeners.kafka.tls).

- `<cluster>-cluster-ca`: the CA's key and certificate (`ca.key`, `ca.crt`), made once
  and replaced a year before it expires (the old certificate kept as `old-ca.crt`, with
  `renewed-at`, until it expires).
- `<cluster>-cluster-ca-cert`: `ca.crt`, what clients trust: the CA's certificate, and
  the old CA's during a rollover.
- `<cluster>-broker-certs`: `ca.crt` and one PEM keystore per broker pod, `<pod>.pem`
  (key, certificate, CA), with the pod's DNS names (its name under the brokers' headless
  Service) and the bootstrap Service's. A keystore is issued again when it is missing,
  from another CA, names other hosts, or has less than 30 days left; the brokers reload
  the mounted file, so no restart. After a CA renewal the old CA's certificates stay a
  day (pki.ROLLOVER_GRACE), so everyone has the two-CA bundle before the new ones show.
- `<cluster>-controller-certs` (when spec.http_secured): the same for the three
  controller pods (their names under the controllers' headless Service): the quorum's
  port speaks https, voters and brokers call it with their certificates.
- `<cluster>-operator-certs` (when spec.http_secured): the operator's own client
  certificate (`tls.key`, `tls.crt`, `ca.crt`), CN=straitmq-operator, a super user of the
  cluster, for its calls on the brokers' https admin API; renewed as a broker's is.

Every Secret has the MQCluster as its owner: deleting the cluster deletes its CA.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from straitmq.admin_client import AdminAuth

from . import listeners, pki
from . import names as n
from .kube import Kube
from .listeners import Addresses
from .render import owner_reference
from .spec import ClusterSpec

OLD_CA = "old-ca.crt"  # in <cluster>-cluster-ca during a rollover: the previous CA
RENEWED_AT = "renewed-at"  # ... and when the new one was made (ISO 8601)


def broker_dns_names(
    spec: ClusterSpec, ordinal: int, addresses: Addresses | None = None
) -> list[str]:
    """The pod's names, its own Service's (what it advertises to clients), the bootstrap
    Service's, and the names and IP addresses clients of its TLS external listeners
    reach it by (its own, the listener's bootstrap)."""
    pod = n.pod_dns(spec.name, n.BROKER, ordinal, spec.namespace)
    own = n.broker_address(spec.name, ordinal, spec.namespace)
    boot = f"{n.bootstrap_service(spec.name)}.{spec.namespace}.svc"
    names = [pod, f"{pod}.cluster.local", own, f"{own}.cluster.local"]
    names += [boot, f"{boot}.cluster.local"]
    return names + [h for h in listeners.dns_names(spec, ordinal, addresses) if h not in names]


def controller_dns_names(spec: ClusterSpec, ordinal: int) -> list[str]:
    pod = n.pod_dns(spec.name, n.CONTROLLER, ordinal, spec.namespace)
    return [pod, f"{pod}.cluster.local"]


def _values(secret: dict[str, Any] | None) -> dict[str, str]:
    data = (secret or {}).get("data") or {}
    return {k: base64.b64decode(v).decode() for k, v in data.items() if v is not None}


def _secret(spec: ClusterSpec, name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": spec.namespace,
            "labels": n.labels(spec.name, "certificates"),
            "ownerReferences": [owner_reference(spec)],
        },
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in sorted(data.items())},
    }


async def ensure(
    kube: Kube,
    spec: ClusterSpec,
    brokers: int,
    emit: Any,
    now: datetime | None = None,
    addresses: Addresses | None = None,
    controllers: int | None = None,
) -> list[str]:
    """Make the CA if there is none and issue what brokers 0..brokers-1 (and, on a
    secured cluster, controllers 0..controllers-1: spec.controllers.replicas when not
    given) lack; returns the keystores issued this pass (pod names with why), for the
    caller's Event. `addresses`: the external listeners' (their names go into the
    brokers' SANs)."""
    ns = spec.namespace
    at = now or datetime.now(UTC)
    ca_name = n.cluster_ca_secret(spec.name)
    ca = _values(await kube.get("v1", "Secret", ns, ca_name))
    if not ca.get("ca.key") or not ca.get("ca.crt"):
        key, crt = pki.new_ca(spec.name, ns, at)
        ca = {"ca.key": key, "ca.crt": crt}
        await kube.apply(_secret(spec, ca_name, ca))
        emit("Normal", "ClusterCaCreated", f"cluster CA created in Secret '{ca_name}'")
    elif pki.due(pki.certificate(ca["ca.crt"]), at, pki.CA_RENEW_BEFORE):
        key, crt = pki.new_ca(spec.name, ns, at)
        ca = {"ca.key": key, "ca.crt": crt, OLD_CA: ca["ca.crt"], RENEWED_AT: at.isoformat()}
        await kube.apply(_secret(spec, ca_name, ca))
        emit(
            "Normal",
            "ClusterCaRenewed",
            f"new cluster CA in Secret '{ca_name}'; the old one stays trusted until it "
            f"expires, broker certificates move to the new one after "
            f"{pki.ROLLOVER_GRACE}",
        )
    old = ca.get(OLD_CA)
    if old and pki.certificate(old).not_valid_after_utc <= at:  # expired: trusted no more
        ca = {k: v for k, v in ca.items() if k not in (OLD_CA, RENEWED_AT)}
        await kube.apply(_secret(spec, ca_name, ca))
        old = None
    # Trusted: the CA, and the one before it until it expires (the rollover).
    bundle = ca["ca.crt"] + (old or "")
    renewed = datetime.fromisoformat(ca[RENEWED_AT]) if RENEWED_AT in ca else at
    still_serving = [old] if old and at - renewed < pki.ROLLOVER_GRACE else []
    public_name = n.cluster_ca_cert_secret(spec.name)
    public = _values(await kube.get("v1", "Secret", ns, public_name))
    if public.get("ca.crt") != bundle:
        await kube.apply(_secret(spec, public_name, {"ca.crt": bundle}))

    issued = await _keystores(
        kube,
        spec,
        n.BROKER,
        range(brokers),
        lambda s, i: broker_dns_names(s, i, addresses),
        ca,
        bundle,
        at,
        still_serving,
    )
    if spec.http_secured:
        issued += await _keystores(
            kube,
            spec,
            n.CONTROLLER,
            range(spec.controllers if controllers is None else controllers),
            controller_dns_names,
            ca,
            bundle,
            at,
            still_serving,
        )
        why = await _operator_certificate(kube, spec, ca, bundle, at, still_serving)
        if why is not None:
            issued.append(f"operator ({why})")
    if issued:
        emit("Normal", "CertificatesIssued", f"certificates issued: {', '.join(issued)}")
    return issued


async def _keystores(
    kube: Kube,
    spec: ClusterSpec,
    component: str,
    ordinals: range,
    dns_names: Callable[[ClusterSpec, int], list[str]],
    ca: dict[str, str],
    bundle: str,
    at: datetime,
    still_serving: list[str],
) -> list[str]:
    """The PEM keystores of a component's pods (`<pod>.pem`, CN=<cluster>-<component>)
    in its Secret, issued where missing or due; the pods issued, with why."""
    name = (
        n.broker_certs_secret(spec.name)
        if component == n.BROKER
        else (n.controller_certs_secret(spec.name))
    )
    stored = await kube.get("v1", "Secret", spec.namespace, name)
    data = _values(stored)
    issued: list[str] = []
    for ordinal in ordinals:
        pod = f"{n.statefulset(spec.name, component)}-{ordinal}"
        names = dns_names(spec, ordinal)
        why = pki.needs_new(data.get(f"{pod}.pem"), ca["ca.crt"], names, at, still_serving)
        if why is None:
            continue
        key, crt = pki.issue(ca["ca.key"], ca["ca.crt"], f"{spec.name}-{component}", names, at)
        data[f"{pod}.pem"] = pki.keystore(key, crt, ca["ca.crt"])
        issued.append(f"{pod} ({why})")
    if stored is None or issued or data.get("ca.crt") != bundle:
        data["ca.crt"] = bundle
        await kube.apply(_secret(spec, name, data))
    return issued


async def _operator_certificate(
    kube: Kube,
    spec: ClusterSpec,
    ca: dict[str, str],
    bundle: str,
    at: datetime,
    still_serving: list[str],
) -> str | None:
    """The operator's client certificate (CN=straitmq-operator, a super user of the
    cluster: render.OPERATOR_PRINCIPAL) in `<cluster>-operator-certs`; why it was issued,
    or None if the stored one is good."""
    name = n.operator_certs_secret(spec.name)
    data = _values(await kube.get("v1", "Secret", spec.namespace, name))
    why = pki.needs_new(data.get("tls.crt"), ca["ca.crt"], [n.OPERATOR_CN], at, still_serving)
    if why is None and data.get("ca.crt") == bundle:
        return None
    if why is not None:
        key, crt = pki.issue(ca["ca.key"], ca["ca.crt"], n.OPERATOR_CN, [n.OPERATOR_CN], at)
        data = {"tls.key": key, "tls.crt": crt}
    data["ca.crt"] = bundle
    await kube.apply(_secret(spec, name, data))
    return why


async def admin_auth(
    kube: Kube, spec: ClusterSpec, secured: bool | None = None
) -> AdminAuth | None:
    """How the operator calls this cluster's admin API: None when its HTTP API is not
    secured (`secured`, default spec.http_secured; then AdminClient falls back to
    $STRAIT_* settings), else https trusting the
    cluster CA, with the operator's client certificate (none yet: the call is refused,
    and the next pass, after certificates.ensure, has it). The server's certificate is
    checked against the cluster's own CA, not its host name: only the cluster's brokers
    and this operator hold certificates from it, and the admin URL may be an override
    (`straitmq.io/admin-url`) that no certificate names."""
    if not (spec.http_secured if secured is None else secured):
        return None
    data = _values(
        await kube.get("v1", "Secret", spec.namespace, n.operator_certs_secret(spec.name))
    )
    if not data.get("ca.crt"):
        return AdminAuth(ssl_context=_context(None, None, None))
    return AdminAuth(ssl_context=_context(data["ca.crt"], data.get("tls.crt"), data.get("tls.key")))


def _context(ca: str | None, crt: str | None, key: str | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    if ca:
        ctx.load_verify_locations(cadata=ca)
    if crt and key:
        # load_cert_chain reads files only: a private temporary one, gone once loaded.
        with tempfile.TemporaryDirectory(prefix="straitmq-operator-") as tmp:
            path = os.path.join(tmp, "client.pem")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(key + crt)
            ctx.load_cert_chain(path)
    return ctx
