"""The pieces of inter-broker security without a cluster: the SCRAM/PLAIN client against
the broker's own SASL server code, the inter-broker login and TLS settings, and the
controllers' `--add-scram` bootstrap records (tests/test_security_replication.py runs
them all on a real cluster)."""

from __future__ import annotations

import asyncio
import base64
import ssl
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from conftest import BrokerProcess
from straitmq.broker.config import BrokerConfig
from straitmq.broker.security.build import build_listeners
from straitmq.broker.security.listeners import ListenerConfigError
from straitmq.broker.security.sasl import PlainServer
from straitmq.cli.local_cluster import free_port
from straitmq.controller.bootstrap import parse_add_scram
from straitmq.metadata.image import MetadataImage
from test_fetch_sessions import _request as _fetch_request
from tls_support import make_certs

from straitmq.admin_client import request_sync
from straitmq.protocol.client import (
    AuthenticationFailed,
    ClientSecurity,
    KafkaConnection,
    SaslLogin,
)
from straitmq.protocol.sasl_client import PlainClient, SaslClientError, ScramClient
from straitmq.security.scram import ScramError, ScramServer

SCRAM_JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    'username="broker" password="broker-secret";'
)


def _lookup_for(*records: dict):
    creds: dict[tuple[str, str], dict] = {}
    for r in records:
        creds[(r["name"], r["mechanism"])] = {k: v for k, v in r.items() if k != "type"}
    return lambda user, mech: creds.get((user, mech))


def _exchange(client: ScramClient | PlainClient, server: ScramServer | PlainServer) -> None:
    token: bytes | None = client.first()
    while token is not None:
        reply = server.step(token)
        token = client.step(reply)
    assert server.done


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_client_logs_in_and_checks_the_server(mechanism: str) -> None:
    cred = parse_add_scram(f"{mechanism}=[name=broker,password=broker-secret]")
    lookup = _lookup_for(cred)
    client = ScramClient(mechanism, "broker", "broker-secret")
    server = ScramServer(mechanism, lookup)
    _exchange(client, server)
    assert client.done and server.user == "broker"

    # A wrong password: the server refuses the proof.
    with pytest.raises(ScramError, match="invalid credentials"):
        _exchange(ScramClient(mechanism, "broker", "wrong"), ScramServer(mechanism, lookup))

    # A server that does not hold the user's ServerKey cannot finish: the client refuses
    # its signature (someone in between, or the wrong cluster).
    forged = dict(cred, server_key=base64.b64encode(b"\0" * 64).decode())
    client = ScramClient(mechanism, "broker", "broker-secret")
    server = ScramServer(mechanism, _lookup_for(forged))
    final = server.step(client.step(server.step(client.first())))  # type: ignore[arg-type]
    with pytest.raises(SaslClientError, match="signature does not verify"):
        client.step(final)
    assert not client.done


def test_scram_client_refuses_a_weak_or_foreign_server_first() -> None:
    client = ScramClient("SCRAM-SHA-512", "broker", "pw")
    nonce = client.first().decode().split("r=")[1]
    with pytest.raises(SaslClientError, match="fewer than 4096"):
        client.step(f"r={nonce}xyz,s={base64.b64encode(b'salt').decode()},i=1000".encode())
    with pytest.raises(SaslClientError, match="nonce"):
        ScramClient("SCRAM-SHA-512", "broker", "pw").step(b"r=other,s=c2FsdA==,i=4096")


def test_plain_client_against_the_plain_server() -> None:
    _exchange(PlainClient("admin", "admin-secret"), PlainServer({"admin": "admin-secret"}))
    with pytest.raises(ScramError):
        _exchange(PlainClient("admin", "nope"), PlainServer({"admin": "admin-secret"}))


def test_add_scram_writes_a_salted_credential_the_image_applies() -> None:
    rec = parse_add_scram('SCRAM-SHA-512=[name=broker,password="a,b=c",iterations=8192]')
    assert rec["type"] == "user_scram_credential" and rec["iterations"] == 8192
    assert "a,b=c" not in str(rec)  # salted and hashed, never the password
    img = MetadataImage()
    img.apply(rec)
    lookup = lambda u, m: img.scram_credentials.get(u, {}).get(m)  # noqa: E731
    _exchange(ScramClient("SCRAM-SHA-512", "broker", "a,b=c"), ScramServer("SCRAM-SHA-512", lookup))
    for bad in (
        "SCRAM-SHA-1=[name=a,password=b]",
        "SCRAM-SHA-512=[name=a]",
        "SCRAM-SHA-512=[name=a,password=b,iterations=10]",
    ):
        with pytest.raises(ValueError, match="--add-scram"):
            parse_add_scram(bad)


def _config(protocol: str, **security: str) -> BrokerConfig:
    return BrokerConfig(
        node_id=1,
        listeners="REPLICATION://127.0.0.1:0,CLIENT://127.0.0.1:0",
        listener_security_protocol_map=f"REPLICATION:{protocol},CLIENT:PLAINTEXT",
        inter_broker_listener_name="REPLICATION",
        security=dict(security),
    )


def test_inter_broker_listener_settings(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    tls = {
        "ssl.keystore.location": certs.path("server.pem"),
        "listener.name.replication.ssl.truststore.location": certs.path("ca.pem"),
    }
    # PLAINTEXT replication: no client security at all.
    assert build_listeners(_config("PLAINTEXT"))[0].client is None

    sasl_ssl = build_listeners(
        _config(
            "SASL_SSL",
            **tls,
            **{
                "listener.name.replication.sasl.enabled.mechanisms": "SCRAM-SHA-512",
                "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
                "listener.name.replication.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
            },
        )
    )[0]
    client = sasl_ssl.client
    assert sasl_ssl.name == "REPLICATION" and client is not None
    assert client.protocol == "SASL_SSL"
    assert client.sasl is not None and client.sasl.username == "broker"
    assert "broker-secret" not in repr(client.sasl)
    assert client.tls is not None and client.tls.check_hostname  # Kafka's default: https
    assert client.tls.verify_mode == ssl.CERT_REQUIRED

    ssl_only = build_listeners(
        _config("SSL", **tls, **{"ssl.endpoint.identification.algorithm": ""})
    )[0].client
    assert ssl_only is not None and ssl_only.sasl is None
    assert ssl_only.tls is not None and not ssl_only.tls.check_hostname

    refusals = {
        "no login": (
            {"listener.name.replication.sasl.enabled.mechanisms": "SCRAM-SHA-512"},
            "has no login",
        ),
        "not enabled": (
            {
                "listener.name.replication.sasl.enabled.mechanisms": "SCRAM-SHA-512",
                "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256",
                "sasl.jaas.config": SCRAM_JAAS,
            },
            "not enabled",
        ),
        "bad CA": (
            {
                "listener.name.replication.sasl.enabled.mechanisms": "SCRAM-SHA-512",
                "sasl.jaas.config": SCRAM_JAAS,
                "listener.name.replication.ssl.truststore.location": str(tmp_path / "no"),
            },
            "cannot load TLS files",
        ),
        "bad algorithm": (
            {"ssl.endpoint.identification.algorithm": "ldap", "sasl.jaas.config": SCRAM_JAAS},
            "identification",
        ),
    }
    for case, (extra, message) in refusals.items():
        # ValueError: a listener's own TLS check (TlsConfigError) may see a file first
        with pytest.raises((ListenerConfigError, ValueError), match=message):
            build_listeners(_config("SASL_SSL", **{**tls, **extra}))
            pytest.fail(case)


def test_replication_tls_files_rotate_without_a_restart(tmp_path: Path) -> None:
    """The CA file the replica fetchers trust is replaced (a new cluster CA): the next
    connection uses it; a half-written file keeps the previous context."""
    certs = make_certs(tmp_path / "certs")
    trust = tmp_path / "trust.pem"
    trust.write_text(Path(certs.path("ca.pem")).read_text())
    client = build_listeners(
        _config(
            "SSL",
            **{
                "ssl.keystore.location": certs.path("server.pem"),
                "listener.name.replication.ssl.truststore.location": str(trust),
                "ssl.endpoint.identification.algorithm": "",
            },
        )
    )[0].client
    assert client is not None
    served = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    served.load_cert_chain(certs.path("mallory.pem"))  # signed by the `evil` CA

    async def run() -> None:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=served)
        port = server.sockets[0].getsockname()[1]

        async def handshake() -> None:
            conn = KafkaConnection("127.0.0.1", port, "rotation-test", client)
            await conn.connect(within_s=5)
            conn.close()

        try:
            with pytest.raises(AuthenticationFailed):
                await handshake()  # the old CA does not trust mallory
            trust.write_text(Path(certs.path("evil.pem")).read_text())
            await handshake()  # the rotated file does
            trust.write_text("-----BEGIN CERTIFICATE-----\ntrunc")  # mid-write
            await handshake()  # the previous context stays
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(run())


# -- KafkaConnection against a real broker ------------------------------------------------

LOGIN_REAUTH_MS = 1000


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One broker: REPL (PLAINTEXT, for setup), SECURE (SASL_SSL, SCRAM-SHA-512 and PLAIN,
    1 s sessions), MTLS (SSL, client certificates required), SASLPT (SASL_PLAINTEXT) and
    ALICE (SSL with a certificate for another host name)."""
    d = tmp_path_factory.mktemp("inter-broker")
    certs = make_certs(d / "certs")
    ports = {n: free_port() for n in ("REPL", "SECURE", "MTLS", "SASLPT", "ALICE")}
    props = [
        "listeners=" + ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
        "listener.security.protocol.map=REPL:PLAINTEXT,SECURE:SASL_SSL,MTLS:SSL,"
        "SASLPT:SASL_PLAINTEXT,ALICE:SSL",
        "inter.broker.listener.name=REPL",
        f"ssl.keystore.location={certs.path('server.pem')}",
        # a certificate naming another host (DNS:alice), for the host name check
        f"listener.name.alice.ssl.keystore.location={certs.path('alice.pem')}",
        "listener.name.saslpt.sasl.enabled.mechanisms=SCRAM-SHA-512",
        f"ssl.truststore.location={certs.path('ca.pem')}",
        "listener.name.mtls.ssl.client.auth=required",
        "listener.name.secure.sasl.enabled.mechanisms=SCRAM-SHA-512,PLAIN",
        "listener.name.secure.plain.sasl.jaas.config=org.apache.kafka.common.security.plain"
        '.PlainLoginModule required user_admin="admin-secret";',
        f"listener.name.secure.connections.max.reauth.ms={LOGIN_REAUTH_MS}",
    ]
    (d / "server.properties").write_text("\n".join(props) + "\n")
    b = BrokerProcess(
        d / "data", port=ports["REPL"], extra_args=["--properties", str(d / "server.properties")]
    )
    b.start()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    upsert = UserScramCredentialUpsertion(
        "broker", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"broker-secret"
    )
    admin.alter_user_scram_credentials([upsert])["broker"].result(timeout=30)
    b.create_topic("lp", partitions=1)
    yield b, ports, certs
    b.stop()


def _client_tls(certs: Any, ca: str = "ca.pem", cert: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=certs.path(ca))
    if cert is not None:
        ctx.load_cert_chain(certs.path(cert))
    return ctx


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def _metrics(b: Any) -> dict:
    return request_sync(b.http, "GET", "/api/v1/cluster")["metrics"]


SCRAM_LOGIN = SaslLogin("SCRAM-SHA-512", "broker", "broker-secret")


def test_logins_are_renewed_between_long_polls_on_one_connection(secured: Any) -> None:
    b, ports, certs = secured
    security = ClientSecurity(_client_tls(certs), SCRAM_LOGIN)
    before = _metrics(b)

    async def scenario() -> tuple[int, int, int]:
        conn = KafkaConnection("127.0.0.1", ports["SECURE"], "t", security)
        fetches = 0
        try:
            loop = asyncio.get_running_loop()
            # Until the session was renewed three times (a condition, bounded: a fixed
            # window of 4 lifetimes saw only two renewals once on a busy CI machine).
            end = loop.time() + 12 * LOGIN_REAUTH_MS / 1000
            while (conn.logins < 4 or fetches < 5) and loop.time() < end:
                # 600 ms long polls with nothing to read: some are in flight when the
                # session's renewal time passes, and must come back whole.
                req = _fetch_request("lp", 0, 0, {0: 0}, max_wait_ms=600)
                r = await conn.request(1, 12, req, 10.0)
                assert int(r.error_code) == 0
                assert [int(p.error_code) for t in r.responses for p in t.partitions] == [0]
                fetches += 1
            return conn.logins, fetches, conn.session_lifetime_ms
        finally:
            conn.close()

    logins, fetches, lifetime = _run(scenario())
    assert lifetime == LOGIN_REAUTH_MS
    assert fetches >= 5 and logins >= 4, (logins, fetches)
    after = _metrics(b)
    # One connection for all of it, logged in `logins` times, never closed for expiry.
    opened = after["listener_connections"]["SECURE"]
    assert opened - before["listener_connections"].get("SECURE", 0) == 1
    principal = "User:broker"
    seen = after["sasl_logins"]["SECURE"][principal]
    assert seen - before["sasl_logins"].get("SECURE", {}).get(principal, 0) == logins
    assert "SASL session expired" not in b.log_path.read_text()


def test_a_refused_login_is_a_clear_error_at_once(secured: Any) -> None:
    b, ports, certs = secured
    cases = {
        "wrong password": (
            ports["SECURE"],
            ClientSecurity(_client_tls(certs), SaslLogin("SCRAM-SHA-512", "broker", "wrong")),
            "login as 'broker' refused: .*invalid credentials",
        ),
        "unknown user": (
            ports["SECURE"],
            ClientSecurity(_client_tls(certs), SaslLogin("SCRAM-SHA-512", "nobody", "x")),
            "login as 'nobody' refused",
        ),
        "mechanism not enabled": (
            ports["SECURE"],
            ClientSecurity(
                _client_tls(certs), SaslLogin("SCRAM-SHA-256", "broker", "broker-secret")
            ),
            "SCRAM-SHA-256 refused .*offers SCRAM-SHA-512, PLAIN",
        ),
        "untrusted server certificate": (
            ports["SECURE"],
            ClientSecurity(_client_tls(certs, ca="evil.pem"), SCRAM_LOGIN),
            "TLS handshake failed",
        ),
        "certificate for another host": (
            ports["ALICE"],
            ClientSecurity(_client_tls(certs)),
            "TLS handshake failed: CERTIFICATE_VERIFY_FAILED",
        ),
        "wrong password, SASL_PLAINTEXT": (
            ports["SASLPT"],
            ClientSecurity(None, SaslLogin("SCRAM-SHA-512", "broker", "wrong")),
            "invalid credentials",
        ),
    }

    async def attempt(port: int, security: ClientSecurity) -> None:
        conn = KafkaConnection("127.0.0.1", port, "t", security)
        try:
            await conn.request(18, 3, _api_versions(), 5.0)
        finally:
            conn.close()

    for case, (port, security, message) in cases.items():
        with pytest.raises(AuthenticationFailed, match=message):
            _run(attempt(port, security))
            pytest.fail(case)
    # PLAIN works too, and so do the mTLS listener's client certificates and SASL
    # without TLS.
    _run(
        attempt(
            ports["SECURE"],
            ClientSecurity(_client_tls(certs), SaslLogin("PLAIN", "admin", "admin-secret")),
        )
    )
    _run(attempt(ports["MTLS"], ClientSecurity(_client_tls(certs, cert="alice.pem"))))
    _run(attempt(ports["SASLPT"], ClientSecurity(None, SCRAM_LOGIN)))
    # ssl.endpoint.identification.algorithm= (empty): the CA is checked, the name is not.
    unnamed = _client_tls(certs)
    unnamed.check_hostname = False
    _run(attempt(ports["ALICE"], ClientSecurity(unnamed)))
    fetched = _metrics(b)["listener_connections"]
    assert fetched["MTLS"] >= 1


def _api_versions() -> Any:
    from kio.index import load_request_schema

    return load_request_schema(18, 3)(client_software_name="t", client_software_version="1")
