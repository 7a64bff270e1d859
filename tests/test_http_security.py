"""The HTTP API secured (issue 15 point 4): https from PEM files, HTTP Basic against the
SCRAM users of the metadata log and the PLAIN users of the JAAS config, client
certificates, and the ACLs of the Kafka listener deciding per route.

One broker: a PLAINTEXT listener for replication, a SASL_PLAINTEXT one the tests write
users and ACLs through (confluent-kafka, as `admin`), and an HTTP port with
http.ssl.* (client certificates requested) and http.authentication=basic,mtls, the
authorizer on with `admin` the super user. The negative handshakes use raw sockets and
are each followed by a good request: the broker keeps serving.
"""

from __future__ import annotations

import base64
import os
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from conftest import ROOT, BrokerProcess
from straitmq.cli.local_cluster import free_port
from tls_support import Certs, make_certs
from waiting import wait_for

from straitmq.admin_client import AdminAuth, AdminError, exchange_sync, request_sync

pytestmark = pytest.mark.timeout(300)

JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'user_admin="admin-secret" user_bob="bob-pw";'
)
ALICE_DN = "User:CN=alice,O=Acme,C=US"


class Secured:
    def __init__(self, broker: BrokerProcess, sasl_port: int, certs: Certs) -> None:
        self.broker, self.sasl_port, self.certs = broker, sasl_port, certs
        self.url = f"https://127.0.0.1:{broker.http_port}"

    def auth(self, user: str | None = None, password: str | None = None, **kw: Any) -> AdminAuth:
        return AdminAuth(ca_file=self.certs.path("ca.pem"), username=user, password=password, **kw)

    def call(self, method: str, path: str, body: Any = None, **auth: Any) -> tuple[int, Any]:
        return exchange_sync(self.url, method, path, body, timeout_s=15, auth=self.auth(**auth))

    def as_admin(self, method: str, path: str, body: Any = None) -> Any:
        return request_sync(self.url, method, path, body, auth=self.auth("admin", "admin-secret"))

    def kafka_admin(self) -> AdminClient:
        if getattr(self, "_kafka_admin", None) is None:  # kept: its futures need the handle
            self._kafka_admin = self._new_kafka_admin()
        return self._kafka_admin

    def _new_kafka_admin(self) -> AdminClient:
        return AdminClient(
            {
                "bootstrap.servers": f"127.0.0.1:{self.sasl_port}",
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": "admin",
                "sasl.password": "admin-secret",
            }
        )

    def allow(self, principal: str, op: AclOperation, rtype: ResourceType, name: str) -> None:
        binding = AclBinding(
            rtype, name, ResourcePatternType.LITERAL, principal, "*", op, AclPermissionType.ALLOW
        )
        for f in self.kafka_admin().create_acls([binding]).values():
            f.result(timeout=30)

    def scram_user(self, name: str, password: bytes, iterations: int = 4096) -> None:
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, iterations)
        fs = self.kafka_admin().alter_user_scram_credentials(
            [UserScramCredentialUpsertion(name, info, password)]
        )
        for f in fs.values():
            f.result(timeout=30)

    def serving(self) -> None:
        """The broker still answers a good client."""
        assert self.call("GET", "/readyz")[0] == 200
        assert self.call("GET", "/api/v1/cluster", user="admin", password="admin-secret")[0] == 200


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("http-security")
    certs = make_certs(d / "certs")
    repl, sasl = free_port(), free_port()
    (d / "certs" / "http.pem").write_text((d / "certs" / "server.pem").read_text())
    props = [
        f"listeners=REPL://127.0.0.1:{repl},SASL://127.0.0.1:{sasl}",
        "listener.security.protocol.map=REPL:PLAINTEXT,SASL:SASL_PLAINTEXT",
        "inter.broker.listener.name=REPL",
        "listener.name.sasl.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512",
        f"listener.name.sasl.plain.sasl.jaas.config={JAAS}",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users=User:admin;User:ANONYMOUS",
        f"http.ssl.keystore.location={certs.path('http.pem')}",
        f"http.ssl.truststore.location={certs.path('ca.pem')}",
        "http.ssl.client.auth=requested",
        "http.ssl.reload.interval.ms=100",
        "http.authentication=basic,mtls",
    ]
    (d / "server.properties").write_text("\n".join(props) + "\n")
    b = BrokerProcess(
        d / "data", port=repl, extra_args=["--properties", str(d / "server.properties")]
    )
    b.launch()
    s = Secured(b, sasl, certs)
    deadline = time.monotonic() + 30
    while True:
        assert b.proc is not None and b.proc.poll() is None, b.log_path.read_text()[-3000:]
        try:
            if s.call("GET", "/readyz")[0] == 200:
                break
        except AdminError:
            pass
        assert time.monotonic() < deadline, "broker did not become ready"
        time.sleep(0.2)
    s.scram_user("alice", b"alice-pw")
    for name in ("secret", "orders"):
        s.as_admin("POST", "/api/v1/topics", {"name": name, "partitions": 1})
    yield s
    b.stop()


# -- TLS ----------------------------------------------------------------------------------


def test_https_with_a_trusted_ca_and_open_probes(secured: Secured) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):  # no credentials: the kubelet, Prometheus
        status, _ = secured.call("GET", path)
        assert status == 200, path
    assert secured.as_admin("GET", "/api/v1/cluster")["node_id"] == 1


def test_plaintext_http_to_the_tls_port_fails_cleanly(secured: Secured) -> None:
    plain = f"http://127.0.0.1:{secured.broker.http_port}"
    with pytest.raises(AdminError) as e:
        request_sync(plain, "GET", "/healthz", timeout_s=5)
    assert e.value.unreachable or e.value.status == 400
    with socket.create_connection(("127.0.0.1", secured.broker.http_port), timeout=5) as s:
        s.sendall(b"GET /api/v1/topics HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(5)
        try:
            data = s.recv(4096)
        except (ConnectionResetError, TimeoutError):
            data = b""
        assert b"topics" not in data  # nothing is served in plaintext
    secured.serving()


def test_an_untrusted_server_or_client_certificate_is_refused(secured: Secured) -> None:
    # The client trusts another CA: the server's certificate does not verify.
    wrong_ca = AdminAuth(ca_file=secured.certs.path("evil.pem"))
    with pytest.raises(AdminError) as e:
        request_sync(secured.url, "GET", "/healthz", timeout_s=5, auth=wrong_ca)
    assert e.value.unreachable and "certificate" in e.value.message.lower()
    # A client certificate from a CA the broker does not trust: the handshake fails.
    mallory = secured.auth(cert_file=secured.certs.path("mallory.pem"))
    with pytest.raises(AdminError) as e:
        request_sync(secured.url, "GET", "/api/v1/topics", timeout_s=5, auth=mallory)
    assert e.value.unreachable
    # Garbage instead of a ClientHello, and a handshake cut in the middle.
    for junk in (b"\x16\x03\x01\x00\x05hello", b"\x00" * 64, b"\x16\x03\x01\xff\xff" + b"a" * 50):
        with socket.create_connection(("127.0.0.1", secured.broker.http_port), timeout=5) as s:
            s.sendall(junk)
            s.settimeout(2)
            try:
                s.recv(100)
            except (ConnectionResetError, TimeoutError):
                pass
    secured.serving()


# -- authentication -----------------------------------------------------------------------


def test_missing_or_wrong_credentials_get_401(secured: Secured) -> None:
    status, body = secured.call("GET", "/api/v1/topics")
    assert status == 401 and "authentication required" in body["error"]
    for user, password in (("alice", "nope"), ("nobody", "x"), ("bob", "alice-pw")):
        status, body = secured.call("GET", "/api/v1/topics", user=user, password=password)
        assert status == 401, (user, body)
        assert "wrong user or password" in body["error"]
    # The challenge header, and a malformed Authorization header.
    import asyncio

    import aiohttp

    async def raw(headers: dict) -> tuple[int, str | None, dict]:
        ctx = ssl.create_default_context(cafile=secured.certs.path("ca.pem"))
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{secured.url}/api/v1/topics", headers=headers, ssl=ctx) as resp,
        ):
            return resp.status, resp.headers.get("WWW-Authenticate"), await resp.json()

    status, challenge, body = asyncio.run(raw({}))
    assert status == 401 and challenge is not None and challenge.startswith("Basic realm=")
    assert "error" in body
    status, _, body = asyncio.run(raw({"Authorization": "Basic !!notbase64"}))
    assert status == 401 and "malformed" in body["error"]
    status, _, body = asyncio.run(raw({"Authorization": "Bearer abc"}))
    assert status == 401 and "Basic" in body["error"]


def test_scram_and_plain_users_authenticate(secured: Secured) -> None:
    # alice: SCRAM-SHA-512 in the metadata log; bob: PLAIN in the JAAS config.
    for user, password in (("alice", "alice-pw"), ("bob", "bob-pw")):
        status, body = secured.call("GET", "/api/v1/topics", user=user, password=password)
        assert status == 200, body


def test_a_changed_password_is_not_served_from_the_cache(secured: Secured) -> None:
    secured.scram_user("erin", b"first", 4096)
    assert secured.call("GET", "/api/v1/topics", user="erin", password="first")[0] == 200
    secured.scram_user("erin", b"second", 4096)
    deadline = time.monotonic() + 10
    while secured.call("GET", "/api/v1/topics", user="erin", password="first")[0] != 401:
        assert time.monotonic() < deadline, "the old password still works"
        time.sleep(0.2)
    assert secured.call("GET", "/api/v1/topics", user="erin", password="second")[0] == 200


# -- authorization ------------------------------------------------------------------------


def test_no_acl_means_403_and_hidden_topics_then_acls_open_each_route(secured: Secured) -> None:
    who = {"user": "alice", "password": "alice-pw"}
    status, body = secured.call("GET", "/api/v1/topics", **who)
    assert status == 200 and body["topics"] == [], "unauthorized topics are not listed"
    status, body = secured.call("GET", "/api/v1/topics/orders", **who)
    assert (
        status == 403
        and "User:alice" in body["error"]
        and "DESCRIBE on TOPIC 'orders'" in (body["error"])
    )
    status, body = secured.call("POST", "/api/v1/topics", {"name": "mine"}, **who)
    assert (
        status == 403
        and "CREATE on CLUSTER 'kafka-cluster' or CREATE on TOPIC 'mine'" in (body["error"])
    )
    records = {"records": [{"value": "v1"}, {"value": "v2"}]}
    status, body = secured.call("POST", "/api/v1/topics/orders/records", records, **who)
    assert status == 403 and "WRITE on TOPIC 'orders'" in body["error"]
    status, body = secured.call("DELETE", "/api/v1/topics/orders", **who)
    assert status == 403 and "DELETE on TOPIC 'orders'" in body["error"]
    status, body = secured.call("PATCH", "/api/v1/topics/orders", {"configs": {"a": "1"}}, **who)
    assert status == 403 and "ALTER_CONFIGS on TOPIC 'orders'" in body["error"]
    status, body = secured.call("POST", "/api/v1/reassignments", {"partitions": []}, **who)
    assert status == 403 and "ALTER on CLUSTER" in body["error"]
    status, body = secured.call("PUT", "/api/v1/cluster/configs", {"configs": {}}, **who)
    assert status == 403 and "ALTER_CONFIGS on CLUSTER" in body["error"]
    assert secured.call("GET", "/api/v1/cluster", **who)[0] == 403

    secured.allow("User:alice", AclOperation.WRITE, ResourceType.TOPIC, "orders")
    secured.allow("User:alice", AclOperation.READ, ResourceType.TOPIC, "orders")
    secured.allow("User:alice", AclOperation.CREATE, ResourceType.TOPIC, "mine")
    status, body = secured.call("GET", "/api/v1/topics", **who)
    assert status == 200 and [t["name"] for t in body["topics"]] == ["orders"]
    status, body = secured.call("POST", "/api/v1/topics/orders/records", records, **who)
    assert status == 200, body
    path = "/api/v1/topics/orders/partitions/0/records?offset=0"
    status, body = secured.call("GET", path, **who)
    assert status == 200 and [r["value"]["text"] for r in body["records"]] == ["v1", "v2"]
    # A group: READ on it too, as OffsetCommit.
    status, body = secured.call("GET", path + "&group=billing", **who)
    assert status == 403 and "READ on GROUP 'billing'" in body["error"]
    secured.allow("User:alice", AclOperation.READ, ResourceType.GROUP, "billing")
    status, body = secured.call("GET", path + "&group=billing", **who)
    assert status == 200, body
    status, body = secured.call("GET", "/api/v1/groups", **who)
    assert status == 200 and [g["group_id"] for g in body["groups"]] == ["billing"]
    assert secured.call("GET", "/api/v1/groups/billing", **who)[0] == 200
    status, body = secured.call("DELETE", "/api/v1/groups/billing", **who)
    assert status == 403 and "DELETE on GROUP 'billing'" in body["error"]
    status, body = secured.call("POST", "/api/v1/topics", {"name": "mine"}, **who)
    assert status == 201, body
    # Still nothing on `secret`.
    assert secured.call("GET", "/api/v1/topics/secret", **who)[0] == 403


def test_a_super_user_may_do_everything(secured: Secured) -> None:
    names = [t["name"] for t in secured.as_admin("GET", "/api/v1/topics")["topics"]]
    assert {"secret", "orders"} <= set(names)
    secured.as_admin("POST", "/api/v1/topics", {"name": "admin-made", "partitions": 1})
    secured.as_admin("PATCH", "/api/v1/topics/admin-made", {"configs": {"retention.ms": "1000"}})
    assert secured.as_admin("GET", "/api/v1/cluster/configs")["configs"]
    secured.as_admin("DELETE", "/api/v1/topics/admin-made")


def test_scram_users_and_acls_over_http_need_alter_on_the_cluster(secured: Secured) -> None:
    """PUT/DELETE /api/v1/users/{name} and POST /api/v1/acls (what the operator's User
    resources use) do what AlterUserScramCredentials and Create/DeleteAcls do."""
    bob = {"user": "bob", "password": "bob-pw"}  # authenticated, no ACL
    status, body = secured.call(
        "PUT", "/api/v1/users/hank", {"mechanism": "SCRAM-SHA-512", "password": "x"}, **bob
    )
    assert status == 403 and "ALTER on CLUSTER" in body["error"]
    assert secured.call("GET", "/api/v1/acls", **bob)[0] == 403

    view = secured.as_admin(
        "PUT", "/api/v1/users/hank", {"mechanism": "SCRAM-SHA-512", "password": "hank-pw"}
    )
    assert view == {
        "name": "hank",
        "mechanisms": [{"mechanism": "SCRAM-SHA-512", "iterations": 4096}],
    }
    hank = {"user": "hank", "password": "hank-pw"}
    assert secured.call("GET", "/api/v1/topics", **hank)[0] == 200  # logs in with it
    write = {
        "resource_type": "TOPIC",
        "resource_name": "orders",
        "pattern_type": "LITERAL",
        "principal": "User:hank",
        "host": "*",
        "operation": "WRITE",
        "permission": "ALLOW",
    }
    assert secured.as_admin("POST", "/api/v1/acls", {"create": [write]}) == {
        "created": 1,
        "deleted": 0,
    }
    assert secured.as_admin("GET", "/api/v1/acls?principal=User:hank")["acls"] == [write]
    status, body = secured.call("GET", "/api/v1/topics", **hank)
    assert [t["name"] for t in body["topics"]] == ["orders"]  # WRITE implies DESCRIBE
    # One bad binding refuses the whole change, naming it.
    bad = {
        **write,
        "resource_type": "CLUSTER",
        "resource_name": "kafka-cluster",
        "operation": "READ",
    }
    status, body = secured.call(
        "POST",
        "/api/v1/acls",
        {"create": [bad], "delete": [write]},
        user="admin",
        password="admin-secret",
    )
    assert status == 400 and "operation READ does not apply to a CLUSTER" in body["error"], body
    assert body["error_name"] == "INVALID_REQUEST"
    assert secured.as_admin("GET", "/api/v1/acls?principal=User:hank")["acls"] == [write]
    assert secured.as_admin("POST", "/api/v1/acls", {"delete": [write]})["deleted"] == 1
    assert secured.as_admin("GET", "/api/v1/acls?principal=User:hank")["acls"] == []

    assert secured.as_admin("DELETE", "/api/v1/users/hank")["mechanisms"] == ["SCRAM-SHA-512"]
    assert (
        secured.call("GET", "/api/v1/users/hank", user="admin", password="admin-secret")[0] == 404
    )
    deadline = time.monotonic() + 10
    while secured.call("GET", "/api/v1/topics", **hank)[0] != 401:
        assert time.monotonic() < deadline, "a deleted user still logs in"
        time.sleep(0.2)


def test_client_certificate_principal(secured: Secured) -> None:
    cert = {"cert_file": secured.certs.path("alice.pem")}
    status, body = secured.call("GET", "/api/v1/topics", **cert)
    assert status == 200 and body["topics"] == []
    status, body = secured.call("GET", "/api/v1/topics/secret", **cert)
    assert status == 403 and ALICE_DN in body["error"]
    secured.allow(ALICE_DN, AclOperation.DESCRIBE, ResourceType.TOPIC, "secret")
    status, body = secured.call("GET", "/api/v1/topics", **cert)
    assert status == 200 and [t["name"] for t in body["topics"]] == ["secret"]


def test_a_rotated_certificate_is_served_without_a_restart(secured: Secured) -> None:
    def served_subject() -> str:
        ctx = ssl.create_default_context(cafile=secured.certs.path("ca.pem"))
        with socket.create_connection(("127.0.0.1", secured.broker.http_port), timeout=5) as raw:
            with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                cert = tls.getpeercert()
        return dict(x[0] for x in cert["subject"])["commonName"]

    assert served_subject() == "localhost"
    secured.certs.leaf("rotated", "ca", "/CN=rotated", "IP:127.0.0.1,DNS:localhost")
    target = Path(secured.certs.path("http.pem"))
    tmp = target.with_suffix(".tmp")
    tmp.write_text(Path(secured.certs.path("rotated.pem")).read_text())
    tmp.replace(target)  # atomically, as a Secret update does
    deadline = time.monotonic() + 10
    while served_subject() != "rotated":
        assert time.monotonic() < deadline, "the rotated certificate is not served"
        time.sleep(0.1)
    secured.serving()


# -- the strait CLI -----------------------------------------------------------------------


def _strait(secured: Secured, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "straitmq.cli", "--http", secured.url, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_strait_cli_with_credentials(secured: Secured) -> None:
    ca = secured.certs.path("ca.pem")
    r = _strait(
        secured,
        "--ca-file",
        ca,
        "--user",
        "admin",
        "topic",
        "list",
        env={"STRAIT_PASSWORD": "admin-secret"},
    )
    assert r.returncode == 0, r.stderr
    assert "secret" in r.stdout and "orders" in r.stdout
    r = _strait(secured, "topic", "list", env={"STRAIT_CA_FILE": ca})
    assert r.returncode == 1 and "authentication required" in r.stderr and "--user" in r.stderr
    r = _strait(
        secured,
        "topic",
        "list",
        env={"STRAIT_CA_FILE": ca, "STRAIT_USER": "alice", "STRAIT_PASSWORD": "alice-pw"},
    )
    assert r.returncode == 0 and "secret" not in r.stdout, r.stderr
    r = _strait(
        secured,
        "--cert",
        secured.certs.path("alice.pem"),
        "topic",
        "list",
        env={"STRAIT_CA_FILE": ca},
    )
    assert r.returncode == 0 and "secret" in r.stdout, r.stderr


def test_strait_cli_with_a_kafka_command_config(secured: Secured, tmp_path: Path) -> None:
    """`strait --command-config` takes the file a Kafka tool takes, in Java's names or
    librdkafka's, and uses its credentials for the HTTP API; a setting it cannot honour
    is refused saying what to use, not ignored."""
    ca = secured.certs.path("ca.pem")
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule"

    def config(name: str, *lines: str) -> str:
        path = tmp_path / f"{name}.properties"
        path.write_text("\n".join(lines) + "\n")
        return str(path)

    java = config(
        "java",
        "security.protocol=SASL_SSL",
        "sasl.mechanism=SCRAM-SHA-512",
        f"sasl.jaas.config={scram} required \\",
        '    username="alice" password="alice-pw";',
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={ca}",
    )
    r = _strait(secured, "--command-config", java, "topic", "list")
    assert r.returncode == 0 and "orders" in r.stdout and "secret" not in r.stdout, r.stderr
    mtls = config(
        "mtls",
        "security.protocol=SSL",
        f"ssl.ca.location={ca}",
        f"ssl.certificate.location={secured.certs.path('alice.pem')}",
        f"ssl.key.location={secured.certs.path('alice.pem')}",
    )
    r = _strait(secured, "--command-config", mtls, "topic", "list")
    assert r.returncode == 0 and "secret" in r.stdout, r.stderr
    plain = config(
        "plain",
        "security.protocol=SASL_SSL",
        "sasl.mechanism=PLAIN",
        "sasl.username=admin",
        "sasl.password=admin-secret",
        f"ssl.ca.location={ca}",
    )
    r = _strait(secured, "--command-config", plain, "topic", "list")
    assert r.returncode == 0 and "secret" in r.stdout, r.stderr
    # The flags (and environment) win over the file.
    r = _strait(
        secured,
        "--command-config",
        java,
        "--user",
        "admin",
        "topic",
        "list",
        env={"STRAIT_PASSWORD": "admin-secret"},
    )
    assert r.returncode == 0 and "secret" in r.stdout, r.stderr
    for lines, says in (
        (("ssl.truststore.location=/x.jks",), "JKS truststore"),
        ((f'sasl.jaas.config={scram} required username="alice";',), 'password="..."'),
        (("security.protocol=SASL_SSL", f"ssl.ca.location={ca}"), "needs sasl.jaas.config"),
        (("ssl.keystore.type=PKCS12", "ssl.keystore.location=/x.p12"), "PKCS12"),
    ):
        r = _strait(secured, "--command-config", config("bad", *lines), "topic", "list")
        assert r.returncode == 1 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = _strait(secured, "--command-config", str(tmp_path / "missing"), "topic", "list")
    assert r.returncode == 1 and "missing" in r.stderr and "Traceback" not in r.stderr


# -- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, says",
    [
        ("http.authentication=mtls", "http.authentication=mtls needs TLS"),
        ("http.authentication=token", "http.authentication 'token'"),
        ("http.ssl.client.auth=required", "without http.ssl.keystore.location"),
        ("http.metrics.require.authentication=maybe", "true or false"),
    ],
)
def test_unusable_http_settings_stop_the_broker_saying_why(
    tmp_path: Path, override: str, says: str
) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "straitmq.broker",
            "--data-dir",
            str(tmp_path / "d"),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--http",
            f"127.0.0.1:{free_port()}",
            "--override",
            override,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 78 and says in r.stderr, r.stderr


def test_basic_credentials_header() -> None:
    assert (
        AdminAuth(username="a", password="b:c").header()
        == "Basic " + base64.b64encode(b"a:b:c").decode()
    )
    assert (
        AdminAuth(username="a", password="b", basic_over_http=False).header_for("http://h:1/x")
        is None
    ), "a password meant for https never goes over http"


def test_operator_and_tools_read_credentials_from_the_environment(
    secured: Secured, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from straitmq.operator.admin import AdminClient as OperatorAdmin

    assert AdminAuth.from_env({}) is None
    monkeypatch.setenv("STRAIT_CA_FILE", secured.certs.path("ca.pem"))
    monkeypatch.setenv("STRAIT_USER", "admin")
    monkeypatch.setenv("STRAIT_PASSWORD", "admin-secret")

    async def topics() -> list[str]:
        async with OperatorAdmin(secured.url, 10) as admin:
            return [t.name for t in await admin.topics()]

    assert {"secret", "orders"} <= set(asyncio.run(topics()))


# -- a 3+3 cluster: brokers calling each other, redirects ---------------------------------


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    import straitmq.cli.local_cluster as local_cluster
    from cluster_support import cluster_factory

    certs = make_certs(tmp_path / "certs")
    # The harness polls /readyz over http; the brokers' port speaks https.
    plain = local_cluster.request_sync

    def either(
        base: str,
        method: str,
        path: str,
        body: Any = None,
        timeout_s: float = 30.0,
        auth: Any = None,
    ) -> Any:
        try:
            return plain(base, method, path, body, timeout_s, auth)
        except AdminError as e:
            if not e.unreachable or not base.startswith("http://"):
                raise
            tls = AdminAuth(ca_file=certs.path("ca.pem"), cert_file=certs.path("server.pem"))
            return plain("https://" + base[7:], method, path, body, timeout_s, tls)

    monkeypatch.setattr(local_cluster, "request_sync", either)
    for make in cluster_factory(tmp_path):
        yield make, certs


def test_brokers_forward_and_redirect_over_https_as_themselves(cluster: Any) -> None:
    from cluster_support import BROKER_ARGS

    make, certs = cluster
    c = make(
        broker_args=[
            *BROKER_ARGS,
            "--override",
            "authorizer.class.name=StandardAuthorizer",
            # ANONYMOUS: replication over the PLAINTEXT listener; CN=localhost: the brokers'
            # HTTP certificate, shown when they call each other.
            "--override",
            "super.users=User:ANONYMOUS;User:CN=localhost",
            "--override",
            f"http.ssl.keystore.location={certs.path('server.pem')}",
            "--override",
            f"http.ssl.truststore.location={certs.path('ca.pem')}",
            "--override",
            "http.ssl.client.auth=requested",
            "--override",
            "http.authentication=basic,mtls",
        ]
    )
    first = c.brokers[1]
    url = f"https://127.0.0.1:{first.http_port}"
    admin = AdminAuth(ca_file=certs.path("ca.pem"), cert_file=certs.path("server.pem"))
    spread = {"name": "spread", "partitions": 6, "replication_factor": 3}
    request_sync(url, "POST", "/api/v1/topics", spread, auth=admin)

    def everyone_knows_it() -> bool:
        # A broker forwards records to leaders that must know the topic already.
        for n in c.brokers.values():
            try:
                at = f"https://127.0.0.1:{n.http_port}"
                request_sync(at, "GET", "/api/v1/topics/spread", auth=admin)
            except AdminError:
                return False
        return True

    wait_for(everyone_knows_it, 30, "every broker to know the topic")
    kafka = AdminClient({"bootstrap.servers": c.bootstrap})
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    fs = kafka.alter_user_scram_credentials([UserScramCredentialUpsertion("alice", info, b"pw")])
    for f in fs.values():
        f.result(timeout=30)
    binding = AclBinding(
        ResourceType.TOPIC,
        "spread",
        ResourcePatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.ALL,
        AclPermissionType.ALLOW,
    )
    for f in kafka.create_acls([binding]).values():
        f.result(timeout=30)
    alice = AdminAuth(ca_file=certs.path("ca.pem"), username="alice", password="pw")
    topic = request_sync(url, "GET", "/api/v1/topics/spread", auth=alice)
    leaders = {p["partition"]: p["leader"] for p in topic["partitions"]}
    assert set(leaders.values()) - {1}, f"every partition is led by broker 1: {leaders}"
    # One produce through broker 1 for every partition: broker 1 writes its own and
    # forwards the rest to their leaders over https, as CN=localhost.
    records = [{"value": f"v{p}", "partition": p} for p in range(6)]
    answer = request_sync(
        url, "POST", "/api/v1/topics/spread/records", {"records": records}, auth=alice
    )
    assert sorted(o["partition"] for o in answer["offsets"]) == list(range(6))
    # A read of a partition led elsewhere: a 307 to https on its leader, followed with
    # alice's credentials (aiohttp would drop them across origins).
    elsewhere = next(p for p, leader in leaders.items() if leader != 1)
    got = request_sync(
        url, "GET", f"/api/v1/topics/spread/partitions/{elsewhere}/records", auth=alice
    )
    assert [r["value"]["text"] for r in got["records"]] == [f"v{elsewhere}"]
    # Without the brokers' identity among the super users, the forwarded share is refused.
    status, body = exchange_sync(
        f"https://127.0.0.1:{c.brokers[leaders[elsewhere]].http_port}",
        "POST",
        "/api/v1/topics/spread/records",
        {"records": [{"value": "x", "partition": elsewhere}]},
        auth=AdminAuth(ca_file=certs.path("ca.pem"), cert_file=certs.path("alice.pem")),
    )
    assert status == 403 and "WRITE on TOPIC 'spread' or CLUSTER_ACTION" in body["error"]


def test_controllers_over_https_with_client_certificates(cluster: Any) -> None:
    from cluster_support import BROKER_ARGS, CONTROLLER_ARGS

    make, certs = cluster
    http_tls = [
        "--override",
        f"http.ssl.keystore.location={certs.path('server.pem')}",
        "--override",
        f"http.ssl.truststore.location={certs.path('ca.pem')}",
        "--override",
        "http.ssl.client.auth=requested",
        "--override",
        "http.authentication=mtls",
        "--override",
        "authorizer.class.name=StandardAuthorizer",
    ]
    c = make(
        controller_args=[
            *CONTROLLER_ARGS,
            *http_tls,
            "--override",
            "super.users=User:CN=localhost",
        ],
        broker_args=[
            *BROKER_ARGS,
            *http_tls,
            "--override",
            "super.users=User:ANONYMOUS;User:CN=localhost",
            "--override",
            "controller.http.ssl.enabled=true",
        ],
    )
    # The brokers registered, caught up and were unfenced through the controllers' https
    # port, and the controllers elected a leader over it: the cluster is ready.
    ca = certs.path("ca.pem")
    admin = AdminAuth(ca_file=ca, cert_file=certs.path("server.pem"))
    url = f"https://127.0.0.1:{c.brokers[1].http_port}"
    request_sync(
        url,
        "POST",
        "/api/v1/topics",
        {"name": "t", "partitions": 3, "replication_factor": 3},
        auth=admin,
    )
    quorum = request_sync(url, "GET", "/api/v1/quorum", auth=admin)
    assert quorum["leader_id"] in c.controllers and all(v["reachable"] for v in quorum["voters"])
    # The active controller probes the brokers' https ports: their deaths are seen at once.
    active = next(v for v in quorum["voters"] if v["node_id"] == quorum["leader_id"])
    status = request_sync(active["url"], "GET", "/api/v1/quorum", auth=admin)
    assert status["fast_fencing_armed"] == sorted(c.brokers), status
    controller = active["url"]
    assert controller.startswith("https://")
    # The controller's port: probes open, the rest for the cluster's own principals only.
    assert exchange_sync(controller, "GET", "/healthz", auth=AdminAuth(ca_file=ca))[0] == 200
    status_, body = exchange_sync(
        controller, "POST", "/controller/describe", {}, auth=AdminAuth(ca_file=ca)
    )
    assert status_ == 401 and "client certificate" in body["error"]
    alice = AdminAuth(ca_file=ca, cert_file=certs.path("alice.pem"))
    status_, body = exchange_sync(controller, "POST", "/controller/describe", {}, auth=alice)
    assert status_ == 403 and "CLUSTER_ACTION on CLUSTER 'kafka-cluster'" in body["error"]
    status_, body = exchange_sync(controller, "POST", "/raft", {}, auth=alice)
    assert status_ == 403
    with pytest.raises(AdminError) as e:
        request_sync("http://" + controller.partition("://")[2], "GET", "/healthz", timeout_s=5)
    assert e.value.unreachable or e.value.status == 400

    # A killed broker is fenced at once (its stream closed, its https port refuses), not
    # after its session timeout: the controller's counter says which way.
    def gone() -> int:
        import aiohttp

        async def metrics() -> str:
            ctx = ssl.create_default_context(cafile=ca)
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"{controller}/metrics", ssl=ctx) as resp,
            ):
                return await resp.text()

        import asyncio

        return sum(
            int(float(line.rsplit(" ", 1)[1]))
            for line in asyncio.run(metrics()).splitlines()
            if line.startswith("straitmq_controller_broker_fencings_total{")
            and 'straitmq_fence_reason="process_gone"' in line
        )

    before = gone()
    c.brokers[3].kill9()
    deadline = time.monotonic() + 30
    while gone() != before + 1:
        assert time.monotonic() < deadline, "the killed broker was not fenced as gone"
        time.sleep(0.2)
    # A controller started with a setting it does not know refuses to start.
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "straitmq.controller",
            "--node-id",
            "1",
            "--voters",
            f"1@127.0.0.1:{free_port()}",
            "--cluster-id",
            "x",
            "--data-dir",
            str(certs.dir / "x"),
            "--override",
            "http.authentication=mtls",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert r.returncode == 2 and "http.authentication=mtls needs TLS" in r.stderr, r.stderr


def test_basic_over_plain_http_and_metrics_behind_authentication(tmp_path: Path) -> None:
    """No TLS, no authorizer: Basic alone (any authenticated user may do everything), and
    /metrics closed by http.metrics.require.authentication; the probes stay open."""
    sasl = free_port()
    b = BrokerProcess(
        tmp_path / "data",
        extra_args=[
            "--listeners",
            f"PLAINTEXT://127.0.0.1:0,SASL://127.0.0.1:{sasl}",
            "--listener-security-protocol-map",
            "PLAINTEXT:PLAINTEXT,SASL:SASL_PLAINTEXT",
            "--inter-broker-listener-name",
            "PLAINTEXT",
            "--override",
            "listener.name.sasl.sasl.enabled.mechanisms=PLAIN",
            "--override",
            f"listener.name.sasl.plain.sasl.jaas.config={JAAS}",
            "--override",
            "http.authentication=basic",
            "--override",
            "http.metrics.require.authentication=true",
        ],
    )
    b.start()
    try:
        bob = AdminAuth(username="bob", password="bob-pw")
        assert exchange_sync(b.http, "GET", "/readyz")[0] == 200
        assert exchange_sync(b.http, "GET", "/healthz")[0] == 200
        assert exchange_sync(b.http, "GET", "/metrics")[0] == 401
        assert exchange_sync(b.http, "GET", "/metrics", auth=bob)[0] == 200
        assert exchange_sync(b.http, "GET", "/api/v1/topics")[0] == 401
        request_sync(b.http, "POST", "/api/v1/topics", {"name": "t"}, auth=bob)
        topics = request_sync(b.http, "GET", "/api/v1/topics", auth=bob)["topics"]
        assert [t["name"] for t in topics] == ["t"]
    finally:
        b.stop()


def test_the_client_certificate_shown_to_peers_follows_a_rotation(tmp_path: Path) -> None:
    """The certificate a broker shows its peers and the controllers is reloaded with the
    served one (in-process: an HttpSecurity and a TLS server that requires certificates)."""
    import threading

    from straitmq.metadata.image import MetadataImage

    from straitmq.security.acls import Authorizer, AuthorizerSettings
    from straitmq.security.http_security import HttpSecurity

    certs = make_certs(tmp_path / "certs")
    certs.leaf("rotated", "ca", "/CN=rotated", "IP:127.0.0.1,DNS:localhost")
    keystore = tmp_path / "certs" / "http.pem"
    keystore.write_text(Path(certs.path("server.pem")).read_text())
    props = {
        "http.ssl.keystore.location": str(keystore),
        "http.ssl.truststore.location": certs.path("ca.pem"),
    }
    security = HttpSecurity(
        props, Authorizer(AuthorizerSettings(), MetadataImage), lambda user: None, []
    )
    assert security.client is not None and security.client.ssl_context is not None
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(certs.path("server.pem"))
    server_ctx.load_verify_locations(certs.path("ca.pem"))
    server_ctx.verify_mode = ssl.CERT_REQUIRED

    def shown() -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        seen: list[str] = []

        def serve() -> None:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                seen.append(dict(x[0] for x in tls.getpeercert()["subject"])["commonName"])
                tls.recv(1)

        t = threading.Thread(target=serve)
        t.start()
        ctx = security.client.ssl_context
        with socket.create_connection(listener.getsockname()) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(b"x")
        t.join(10)
        listener.close()
        return seen[0]

    assert shown() == "localhost"
    tmp = keystore.with_suffix(".tmp")
    tmp.write_text(Path(certs.path("rotated.pem")).read_text())
    tmp.replace(keystore)
    assert security.tls is not None and security.tls.check()
    security.reload_client()
    assert shown() == "rotated"
