"""The operator's cluster CA and broker certificates (straitmq.operator.pki and
.certificates): what is issued, when it is issued again, how a TLS MQCluster's brokers are
rendered, and that a broker serves the operator's keystore to a client that trusts only
the cluster CA (and picks up a renewed one without a restart)."""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import BrokerProcess
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from straitmq.cli.local_cluster import free_port
from straitmq.operator import certificates, pki, render
from straitmq.operator import names as n
from straitmq.operator.spec import SpecError, parse

UID = "6f1c2d4e-0000-4000-8000-00000000abcd"
NOW = datetime(2026, 11, 25, tzinfo=UTC)


def body(**spec: Any) -> dict:
    return {
        "apiVersion": "straitmq.io/v1alpha1",
        "kind": "MQCluster",
        "metadata": {"name": "demo", "namespace": "prod", "uid": UID},
        "spec": {"image": "straitmq:1", **spec},
    }


TLS = {"kafka": {"tls": True}}


class FakeKube:
    """Secrets by (namespace, name), as get/apply see them."""

    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], dict] = {}
        self.applies = 0

    async def get(self, api_version: str, kind: str, ns: str, name: str) -> dict | None:
        assert (api_version, kind) == ("v1", "Secret")
        return self.secrets.get((ns, name))

    async def apply(self, obj: dict) -> dict:
        self.applies += 1
        self.secrets[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        return obj

    def value(self, name: str, key: str) -> str:
        return base64.b64decode(self.secrets[("prod", name)]["data"][key]).decode()


def ensure(kube: FakeKube, brokers: int, now: datetime = NOW) -> tuple[list[str], list]:
    events: list = []
    spec = parse(body(listeners=TLS))
    issued = asyncio.run(
        certificates.ensure(
            kube,
            spec,
            brokers,
            lambda *e: events.append(e),
            now,
        )
    )
    return issued, events


def test_ca_and_broker_certificates() -> None:
    ca_key, ca_crt = pki.new_ca("demo", "prod", NOW)
    ca = x509.load_pem_x509_certificate(ca_crt.encode())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.not_valid_after_utc - NOW > timedelta(days=4 * 365)
    names = certificates.broker_dns_names(parse(body()), 1)
    assert names == [
        "demo-broker-1.demo-broker.prod.svc",
        "demo-broker-1.demo-broker.prod.svc.cluster.local",
        "demo-broker-1.prod.svc",  # its own Service, what it advertises to clients
        "demo-broker-1.prod.svc.cluster.local",
        "demo-bootstrap.prod.svc",
        "demo-bootstrap.prod.svc.cluster.local",
    ]
    key, crt = pki.issue(ca_key, ca_crt, "demo-broker", names, NOW)
    cert = pki.certificate(crt)
    assert pki.signed_by(cert, ca_crt) and pki.dns_names(cert) == names
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usage)
    store = pki.keystore(key, crt, ca_crt)
    assert store.startswith("-----BEGIN PRIVATE KEY-----") and store.count("CERTIFICATE-----") == 4
    assert pki.needs_new(store, ca_crt, names, NOW) is None
    # Why one is issued again.
    _, other_ca = pki.new_ca("demo", "prod", NOW)
    assert pki.needs_new(None, ca_crt, names, NOW) == "no certificate yet"
    assert pki.needs_new(store, other_ca, names, NOW) == "signed by another CA"
    assert pki.needs_new(store, ca_crt, names[:2], NOW) == "its DNS names changed"
    assert pki.needs_new(store, ca_crt, names, NOW + timedelta(days=330)) is None
    late = pki.needs_new(store, ca_crt, names, NOW + timedelta(days=340))
    assert late is not None and late.startswith("it expires")
    assert pki.needs_new("garbage", ca_crt, names, NOW) == "the certificate cannot be read"


def test_ensure_makes_the_ca_once_and_issues_only_what_is_missing_or_due() -> None:
    kube = FakeKube()
    issued, events = ensure(kube, 3)
    assert [i.split()[0] for i in issued] == ["demo-broker-0", "demo-broker-1", "demo-broker-2"]
    assert [e[1] for e in events] == ["ClusterCaCreated", "CertificatesIssued"]
    ca_crt = kube.value("demo-cluster-ca", "ca.crt")
    assert kube.value("demo-cluster-ca-cert", "ca.crt") == ca_crt
    assert "ca.key" not in kube.secrets[("prod", "demo-cluster-ca-cert")]["data"]
    certs = kube.secrets[("prod", "demo-broker-certs")]
    assert sorted(certs["data"]) == ["ca.crt", *(f"demo-broker-{i}.pem" for i in range(3))]
    assert certs["metadata"]["ownerReferences"][0]["kind"] == "MQCluster"
    first = kube.value("demo-broker-certs", "demo-broker-1.pem")

    applies = kube.applies
    assert ensure(kube, 3) == ([], [])  # nothing to do: nothing written
    assert kube.applies == applies
    issued, _ = ensure(kube, 4)  # scale up: the new pod's only
    assert issued == ["demo-broker-3 (no certificate yet)"]
    assert kube.value("demo-broker-certs", "demo-broker-1.pem") == first
    # Renewal: 30 days before expiry, every broker's, same CA.
    issued, events = ensure(kube, 4, NOW + timedelta(days=340))
    assert len(issued) == 4 and all("it expires" in i for i in issued)
    assert kube.value("demo-cluster-ca", "ca.crt") == ca_crt
    assert kube.value("demo-broker-certs", "demo-broker-1.pem") != first


def test_tls_spec_renders_listeners_and_the_certificates_volume() -> None:
    plain = parse(body())
    tls = parse(body(listeners=TLS))
    assert not plain.kafka_tls and tls.kafka_tls and tls.replication_port == 9091
    sts = render.broker_statefulset(tls, 3)
    pod = sts["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert render.tls_args(tls) == [a for a in c["args"] if a.startswith("--override=")]
    args = " ".join(c["args"])
    assert "listener.security.protocol.map=REPLICATION:SSL,CLIENT:SSL" in args
    assert (
        "advertised.listeners=REPLICATION://$(POD_NAME).demo-broker.$(POD_NAMESPACE).svc:9091,"
        "CLIENT://$(POD_NAME).$(POD_NAMESPACE).svc:9092"
    ) in args
    assert f"ssl.keystore.location={n.CERTS_DIR}/$(POD_NAME).pem" in args
    assert {"name": "certs", "secret": {"secretName": "demo-broker-certs"}} in pod["volumes"]
    assert {"name": "certs", "mountPath": n.CERTS_DIR, "readOnly": True} in c["volumeMounts"]
    assert {"name": "replication", "containerPort": 9091} in c["ports"]
    # Turning TLS on rolls the brokers; a cluster without it renders as before.
    assert render.config_hash(tls) != render.config_hash(plain)
    plain_pod = render.broker_statefulset(plain, 3)["spec"]["template"]["spec"]
    assert "volumes" not in plain_pod
    plain_args = plain_pod["containers"][0]["args"]
    assert [a for a in plain_args if "listener" in a] == render.plain_args(plain)
    assert "REPLICATION:PLAINTEXT,PLAINTEXT:PLAINTEXT" in " ".join(plain_args)
    with pytest.raises(SpecError, match=r"replication\.port 9092 is taken"):
        parse(body(listeners={"kafka": {"tls": True}, "replication": {"port": 9092}}))


def _served_certificate(port: int, ca_file: str, hostname: str) -> x509.Certificate:
    """The certificate the broker shows a client that trusts only `ca_file` and checks
    `hostname` against it (as a client reaching the pod by its DNS name would)."""
    ctx = ssl.create_default_context(cafile=ca_file)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname=hostname) as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def test_a_broker_serves_the_operators_keystore_and_follows_a_renewal(tmp_path: Path) -> None:
    from confluent_kafka import Consumer, Producer

    kube = FakeKube()
    ensure(kube, 1, datetime.now(UTC) - timedelta(days=340))  # 25 days left
    (tmp_path / "ca.crt").write_text(kube.value("demo-cluster-ca-cert", "ca.crt"))
    store = tmp_path / "demo-broker-0.pem"
    store.write_text(kube.value("demo-broker-certs", "demo-broker-0.pem"))
    repl, client = free_port(), free_port()
    props = [  # the CLIENT listener as tls_args sets it, on local ports, with a fast reload
        f"listeners=REPLICATION://127.0.0.1:{repl},CLIENT://127.0.0.1:{client}",
        "listener.security.protocol.map=REPLICATION:PLAINTEXT,CLIENT:SSL",
        "inter.broker.listener.name=REPLICATION",
        f"listener.name.client.ssl.keystore.location={store}",
        "listener.name.client.ssl.reload.interval.ms=100",
    ]
    (tmp_path / "server.properties").write_text("\n".join(props) + "\n")
    b = BrokerProcess(
        tmp_path / "data",
        port=repl,
        extra_args=["--properties", str(tmp_path / "server.properties")],
    )
    b.start()
    try:
        pod_name = "demo-broker-0.demo-broker.prod.svc"
        first = _served_certificate(client, str(tmp_path / "ca.crt"), pod_name)
        assert pod_name in pki.dns_names(first)
        with pytest.raises(ssl.SSLCertVerificationError):  # a name it was not issued for
            _served_certificate(client, str(tmp_path / "ca.crt"), "elsewhere.prod.svc")
        conf = {
            "bootstrap.servers": f"127.0.0.1:{client}",
            "security.protocol": "SSL",
            "ssl.ca.location": str(tmp_path / "ca.crt"),
            # The broker advertises 127.0.0.1 here, a name the certificate does not hold
            # (the hostname is checked above with the pod's name).
            "ssl.endpoint.identification.algorithm": "none",
        }
        p = Producer(conf)
        p.produce("tls-topic", value=b"over TLS")
        assert p.flush(30) == 0
        c = Consumer({**conf, "group.id": "g", "auto.offset.reset": "earliest"})
        c.subscribe(["tls-topic"])
        deadline = time.monotonic() + 30
        got = None
        while got is None and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                got = m.value()
        c.close()
        assert got == b"over TLS"

        # Renewal (30 days before expiry): the operator rewrites the Secret, the kubelet
        # the mounted file; the broker serves the new certificate without a restart.
        issued, _ = ensure(kube, 1, datetime.now(UTC))
        assert len(issued) == 1 and "it expires" in issued[0]
        store.write_text(kube.value("demo-broker-certs", "demo-broker-0.pem"))
        deadline = time.monotonic() + 10
        while True:
            now_served = _served_certificate(client, str(tmp_path / "ca.crt"), pod_name)
            if now_served.serial_number != first.serial_number:
                break
            assert time.monotonic() < deadline, "the renewed certificate is not served"
            time.sleep(0.2)
        assert b.proc is not None and b.proc.poll() is None
    finally:
        b.stop()


def _local_properties(spec: Any, certs: Path, repl: int, client: int) -> list[str]:
    """render.tls_args for pod 0, on local ports: every setting as the pod gets it, with
    the pod's paths, ports and advertised names mapped to this machine."""
    pod, ns = "demo-broker-0", "prod"
    out = []
    for arg in render.tls_args(spec):
        prop = arg.removeprefix("--override=")
        prop = prop.replace("$(POD_NAME).demo-broker.$(POD_NAMESPACE).svc", "127.0.0.1")
        prop = prop.replace("$(POD_NAME).$(POD_NAMESPACE).svc", "127.0.0.1")  # its Service
        prop = prop.replace("$(POD_NAME)", pod).replace("$(POD_NAMESPACE)", ns)
        prop = prop.replace(n.CERTS_DIR, str(certs))
        prop = prop.replace(f"0.0.0.0:{spec.replication_port}", f"127.0.0.1:{repl}")
        prop = prop.replace(f"0.0.0.0:{spec.kafka_port}", f"127.0.0.1:{client}")
        prop = prop.replace(f"127.0.0.1:{spec.replication_port}", f"127.0.0.1:{repl}")
        prop = prop.replace(f"127.0.0.1:{spec.kafka_port}", f"127.0.0.1:{client}")
        out.append(prop)
    return out


def test_secured_spec_scram_clients_acls_and_brokers_by_certificate(tmp_path: Path) -> None:
    """listeners.kafka {tls, authentication scram-sha-512} + authorization simple, as
    rendered: clients need a SCRAM login and ACLs on CLIENT; REPLICATION takes only a
    certificate from the cluster CA, whose principal (the brokers') is a super user."""
    from confluent_kafka import KafkaError, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from straitmq.admin_client import AdminAuth, exchange_sync, request_sync

    spec = parse(
        body(
            listeners={"kafka": {"tls": True, "authentication": {"type": "scram-sha-512"}}},
            authorization={"type": "simple", "superUsers": ["User:ops"]},
        )
    )
    assert spec.kafka_sasl == "SCRAM-SHA-512" and spec.authorization and spec.http_secured
    kube = FakeKube()
    asyncio.run(certificates.ensure(kube, spec, 1, lambda *e: None, NOW))  # type: ignore[arg-type]
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "ca.crt").write_text(kube.value("demo-broker-certs", "ca.crt"))
    store = kube.value("demo-broker-certs", "demo-broker-0.pem")
    (certs / "demo-broker-0.pem").write_text(store)
    key_end = store.index("-----END PRIVATE KEY-----") + len("-----END PRIVATE KEY-----\n")
    (certs / "client.key").write_text(store[:key_end])
    (certs / "client.crt").write_text(store[key_end:])
    repl, client = free_port(), free_port()
    props = _local_properties(spec, certs, repl, client)
    supers = "User:CN=demo-broker,O=straitmq;User:CN=straitmq-operator,O=straitmq;User:ops"
    assert f"super.users={supers}" in props
    (tmp_path / "server.properties").write_text("\n".join(props) + "\n")
    b = BrokerProcess(
        tmp_path / "data",
        port=repl,
        extra_args=["--properties", str(tmp_path / "server.properties")],
    )
    https = f"https://127.0.0.1:{b.http_port}"
    # The operator's identity, as it calls the cluster (its certificate, the cluster CA).
    op_auth = asyncio.run(certificates.admin_auth(kube, spec))  # type: ignore[arg-type]
    assert op_auth is not None and op_auth.ssl_context is not None
    b.launch()
    try:
        _wait_ready_as_the_kubelet(b, https)
        _http_api_needs_a_certificate_or_a_password(https, certs, op_auth)
        tls = {
            "ssl.ca.location": str(certs / "ca.crt"),
            "ssl.endpoint.identification.algorithm": "none",
        }
        # A broker's certificate on REPLICATION: the brokers' principal, a super user.
        as_broker = AdminClient(
            {
                "bootstrap.servers": f"127.0.0.1:{repl}",
                "security.protocol": "SSL",
                **tls,
                "ssl.certificate.location": str(certs / "client.crt"),
                "ssl.key.location": str(certs / "client.key"),
            }
        )
        as_broker.create_topics([NewTopic("ledger", 1, 1)])["ledger"].result(timeout=30)
        # No certificate: REPLICATION refuses the connection.
        anonymous = AdminClient(
            {"bootstrap.servers": f"127.0.0.1:{repl}", "security.protocol": "SSL", **tls}
        )
        with pytest.raises(KafkaException):
            anonymous.list_topics(timeout=4)

        # A User's credential (as the operator sets it) on CLIENT, SASL_SSL: ACLs decide.
        request_sync(
            https,
            "PUT",
            "/api/v1/users/app",
            {"mechanism": "SCRAM-SHA-512", "password": "app-pw"},
            auth=op_auth,
        )
        conf = {
            "bootstrap.servers": f"127.0.0.1:{client}",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "app",
            "sasl.password": "app-pw",
            "message.timeout.ms": 10000,
            **tls,
        }

        def produce() -> Any:
            outcome: list[Any] = []
            p = Producer(conf)
            p.produce("ledger", value=b"v", on_delivery=lambda err, msg: outcome.append(err))
            p.flush(20)
            return outcome[0].code() if outcome and outcome[0] is not None else None

        assert produce() == KafkaError.TOPIC_AUTHORIZATION_FAILED  # no ACL: no access
        acl = {
            "resource_type": "TOPIC",
            "resource_name": "ledger",
            "pattern_type": "LITERAL",
            "principal": "User:app",
            "host": "*",
            "operation": "WRITE",
            "permission": "ALLOW",
        }
        request_sync(https, "POST", "/api/v1/acls", {"create": [acl]}, auth=op_auth)
        assert produce() is None
        # The User's password as HTTP Basic: ACLs decide there too (WRITE on the topic
        # implies DESCRIBE, as in Kafka; the ACLs are the cluster's: DESCRIBE on it).
        app = AdminAuth(
            ca_file=str(certs / "ca.crt"), check_hostname=False, username="app", password="app-pw"
        )
        assert exchange_sync(https, "GET", "/api/v1/topics/ledger", auth=app)[0] == 200
        assert exchange_sync(https, "GET", "/api/v1/acls", auth=app)[0] == 403
        wrong = AdminAuth(
            ca_file=str(certs / "ca.crt"), check_hostname=False, username="app", password="nope"
        )
        assert exchange_sync(https, "GET", "/api/v1/topics/ledger", auth=wrong)[0] == 401
        # SSL without SASL on CLIENT is refused.
        plain_ssl = AdminClient(
            {"bootstrap.servers": f"127.0.0.1:{client}", "security.protocol": "SSL", **tls}
        )
        with pytest.raises(KafkaException):
            plain_ssl.list_topics(timeout=4)
    finally:
        b.stop()


def _kubelet_context() -> ssl.SSLContext:
    """As the kubelet's httpGet with scheme HTTPS: no client certificate, no verification."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _wait_ready_as_the_kubelet(b: Any, https: str, timeout: float = 30.0) -> None:
    from straitmq.admin_client import AdminAuth, AdminError, exchange_sync

    kubelet = AdminAuth(ssl_context=_kubelet_context())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert b.proc.poll() is None, b.log_path.read_text()[-3000:]
        try:
            if exchange_sync(https, "GET", "/readyz", timeout_s=1, auth=kubelet)[0] == 200:
                break
        except AdminError:
            pass
        time.sleep(0.1)
    else:
        raise AssertionError("the broker's /readyz did not answer the kubelet over https")
    assert exchange_sync(https, "GET", "/healthz", timeout_s=3, auth=kubelet)[0] == 200
    assert exchange_sync(https, "GET", "/metrics", timeout_s=3, auth=kubelet)[0] == 200


def _http_api_needs_a_certificate_or_a_password(https: str, certs: Path, op_auth: Any) -> None:
    """Anonymous (the CA trusted, no certificate, no password): 401 on the admin API;
    plain http on the port: no answer; the operator's certificate: a super user."""
    from straitmq.admin_client import AdminAuth, AdminError, exchange_sync, request_sync

    anonymous = AdminAuth(ca_file=str(certs / "ca.crt"), check_hostname=False)
    for method, path in (
        ("GET", "/api/v1/topics"),
        ("GET", "/api/v1/users/app"),
        ("GET", "/api/v1/acls"),
        ("POST", "/api/v1/topics"),
    ):
        status, answer = exchange_sync(
            https,
            method,
            path,
            {"name": "x"} if method == "POST" else None,
            timeout_s=5,
            auth=anonymous,
        )
        assert status == 401, (path, status, answer)
    with pytest.raises(AdminError):
        request_sync(https.replace("https://", "http://"), "GET", "/api/v1/topics", timeout_s=3)
    assert "topics" in request_sync(https, "GET", "/api/v1/topics", timeout_s=5, auth=op_auth)
    assert request_sync(https, "GET", "/api/v1/cluster", timeout_s=5, auth=op_auth)["brokers"]


def test_authentication_and_authorization_need_tls() -> None:
    with pytest.raises(SpecError, match=r"need spec\.listeners\.kafka\.tls"):
        parse(body(authorization={"type": "simple"}))
    with pytest.raises(SpecError, match=r"need spec\.listeners\.kafka\.tls"):
        parse(body(listeners={"kafka": {"authentication": {"type": "scram-sha-512"}}}))
    args = render.tls_args(parse(body(listeners=TLS)))
    assert not [a for a in args if "authorizer" in a or "sasl" in a]
    assert "--override=listener.security.protocol.map=REPLICATION:SSL,CLIENT:SSL" in args


def test_a_users_secret_names_the_protocol_and_the_ca_of_a_tls_cluster() -> None:
    from straitmq.operator.user import UserReconciler

    kube = FakeKube()
    ensure(kube, 1)
    r = UserReconciler(kube, lambda *e: None)  # type: ignore[arg-type]
    kafka = {"tls": True, "authentication": {"type": "scram-sha-512"}}
    got = asyncio.run(r._client_settings(parse(body(listeners={"kafka": kafka}))))
    ca = kube.value("demo-cluster-ca-cert", "ca.crt")
    assert got == {"security.protocol": "SASL_SSL", "ca.crt": ca}
    got = asyncio.run(r._client_settings(parse(body(listeners=TLS))))
    assert got == {"security.protocol": "SSL", "ca.crt": ca}
    assert asyncio.run(r._client_settings(parse(body()))) == {}


def test_ca_renewal_rolls_over_through_a_two_ca_bundle() -> None:
    """A year before the CA expires a new one signs; both are trusted until the old one
    expires, and brokers keep the old CA's certificates for a day (ROLLOVER_GRACE) so
    every client has the bundle before a new-CA certificate is shown to it."""
    kube = FakeKube()
    day = timedelta(days=1)
    ensure(kube, 2, NOW)
    old_ca = kube.value("demo-cluster-ca", "ca.crt")
    # Just before the CA's renewal: broker certificates renewed as usual, by the old CA.
    before = NOW + pki.CA_VALIDITY - pki.CA_RENEW_BEFORE - 30 * day
    issued, events = ensure(kube, 2, before)
    assert len(issued) == 2 and [e[1] for e in events] == ["CertificatesIssued"]
    leaf = kube.value("demo-broker-certs", "demo-broker-0.pem")
    assert pki.signed_by(pki.certificate(leaf), old_ca)

    at = before + 31 * day  # the CA has less than a year left
    issued, events = ensure(kube, 2, at)
    assert issued == [] and [e[1] for e in events] == ["ClusterCaRenewed"]
    new_ca = kube.value("demo-cluster-ca", "ca.crt")
    assert new_ca != old_ca and kube.value("demo-cluster-ca", "old-ca.crt") == old_ca
    bundle = new_ca + old_ca
    assert kube.value("demo-cluster-ca-cert", "ca.crt") == bundle
    assert kube.value("demo-broker-certs", "ca.crt") == bundle
    assert kube.value("demo-broker-certs", "demo-broker-0.pem") == leaf  # the grace
    assert ensure(kube, 2, at + day / 2) == ([], [])

    issued, _ = ensure(kube, 2, at + 2 * day)  # grace over: the new CA's certificates
    assert len(issued) == 2 and all("signed by another CA" in i for i in issued)
    renewed = pki.certificate(kube.value("demo-broker-certs", "demo-broker-0.pem"))
    assert pki.signed_by(renewed, new_ca) and not pki.signed_by(renewed, old_ca)
    assert kube.value("demo-cluster-ca-cert", "ca.crt") == bundle  # old still trusted

    gone = NOW + pki.CA_VALIDITY + day  # the old CA expired: trusted no more
    ensure(kube, 2, gone)
    assert kube.value("demo-cluster-ca-cert", "ca.crt") == new_ca
    assert kube.value("demo-broker-certs", "ca.crt") == new_ca
    assert "old-ca.crt" not in kube.secrets[("prod", "demo-cluster-ca")]["data"]


def test_a_pass_reaches_brokers_still_on_the_other_scheme_while_they_roll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Turning authorization on (or off) rolls the brokers to https with client
    certificates (or back to http); until each restarts it answers the old scheme, and
    the pass must still see the cluster to restart the next one."""
    from contextlib import AsyncExitStack

    from straitmq.operator.cluster import ClusterReconciler, Observed

    secured_body = body(listeners=TLS, authorization={"type": "simple"})
    tls_only_body = body(listeners=TLS)
    kube = FakeKube()
    asyncio.run(certificates.ensure(kube, parse(secured_body), 1, lambda *e: None, NOW))  # type: ignore[arg-type]
    answering: set[str] = set()
    calls: list[tuple[str, bool]] = []

    async def observe(self: Any, admin: Any) -> Observed:
        scheme = admin.base_url.partition(":")[0]
        ctx = admin.auth.ssl_context if admin.auth is not None else None
        calls.append((scheme, ctx is not None and bool(ctx.get_ca_certs())))
        if scheme in answering:
            return Observed(cluster={"brokers": []}, topics=[])
        return Observed(error="unreachable")

    monkeypatch.setattr(ClusterReconciler, "_observe", observe)
    reconciler = ClusterReconciler(kube, lambda *e: None)  # type: ignore[arg-type]

    def connect(doc: dict) -> str:
        async def go() -> str:
            async with AsyncExitStack() as stack:
                admin, seen = await reconciler._connect(doc, parse(doc), stack)
                return admin.base_url.partition(":")[0] if seen.reachable else "none"

        calls.clear()
        return asyncio.run(go())

    answering = {"http"}  # authorization just turned on: no broker restarted yet
    assert connect(secured_body) == "http"
    assert calls == [("https", True), ("http", False)]  # the cluster CA and the cert first
    answering = {"https"}  # all rolled
    assert connect(secured_body) == "https" and calls == [("https", True)]
    # Turned off again (the operator's certificate is still there): https until rolled.
    assert connect(tls_only_body) == "https"
    assert calls == [("http", False), ("https", True)]
    answering = set()
    assert connect(tls_only_body) == "none"
    # A cluster never secured (no operator certificate): nothing else to try.
    fresh = body(listeners=TLS)
    fresh["metadata"]["name"] = "other"
    assert connect(fresh) == "none" and calls == [("http", False)]
