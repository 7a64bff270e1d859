"""Named listeners, TLS and SASL with real clients and real handshakes.

One broker serves six listeners (see LISTENERS): PLAINTEXT for replication, SSL, SSL with
required client certificates, SASL_SSL with SCRAM, SASL_SSL with PLAIN, SASL_PLAINTEXT
with a 2 s session lifetime (KIP-368), and an SSL listener whose certificate the tests
rotate. confluent-kafka (librdkafka), kafka-python, aiokafka and the Java client talk to
it; the negative cases use a raw socket, so what the broker answers (or that it closes
the connection) is checked byte for byte, and after each one a good client still works.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import secrets
import socket
import ssl
import struct
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from conftest import BrokerProcess
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest
from kio.schema.sasl_authenticate.v2.request import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v0.request import SaslHandshakeRequest as SaslHandshakeV0
from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
from straitmq.cli.local_cluster import free_port
from straitmq.metadata.image import MetadataImage
from test_fuzz_frames import decode_response, encode_request, recv_frame
from tls_support import Certs, make_certs
from waiting import wait_for

pytestmark = pytest.mark.timeout(300)

SASL_FAILED, ILLEGAL_SASL_STATE, UNSUPPORTED_MECHANISM = 58, 34, 33
LISTENERS = {
    "REPL": "PLAINTEXT",
    "TLS": "SSL",
    "MTLS": "SSL",
    "SCRAM": "SASL_SSL",
    "PLAIN": "SASL_SSL",
    "SASLPT": "SASL_PLAINTEXT",
    "ROT": "SSL",
}
REAUTH_MS = 3000
JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" user_admin="admin-secret" user_bob="bob-pw";'
)


class Secure:
    def __init__(self, broker: BrokerProcess, ports: dict[str, int], certs: Certs) -> None:
        self.broker, self.ports, self.certs = broker, ports, certs

    def conf(self, listener: str, **extra: Any) -> dict:
        c: dict[str, Any] = {"bootstrap.servers": f"127.0.0.1:{self.ports[listener]}"}
        protocol = LISTENERS[listener]
        c["security.protocol"] = protocol
        if "SSL" in protocol:
            c["ssl.ca.location"] = self.certs.path("ca.pem")
        c.update({k.replace("_", "."): v for k, v in extra.items()})
        return c

    def sasl(self, listener: str, mechanism: str, user: str, password: str, **extra: Any) -> dict:
        return self.conf(
            listener, sasl_mechanism=mechanism, sasl_username=user, sasl_password=password, **extra
        )

    def log(self) -> str:
        assert self.broker.log_path is not None
        return self.broker.log_path.read_text()


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("security")
    certs = make_certs(d / "certs")
    (d / "certs" / "rot.pem").write_text((d / "certs" / "server.pem").read_text())
    ports = {name: free_port() for name in LISTENERS}
    props = [
        "listeners=" + ",".join(f"{n}://127.0.0.1:{p}" for n, p in ports.items()),
        "listener.security.protocol.map=" + ",".join(f"{n}:{p}" for n, p in LISTENERS.items()),
        "inter.broker.listener.name=REPL",
        f"ssl.keystore.location={certs.path('server.pem')}",
        f"listener.name.mtls.ssl.truststore.location={certs.path('ca.pem')}",
        "listener.name.mtls.ssl.client.auth=required",
        f"listener.name.rot.ssl.keystore.location={certs.path('rot.pem')}",
        f"listener.name.rot.ssl.truststore.location={certs.path('ca.pem')}",
        "listener.name.rot.ssl.client.auth=required",
        "listener.name.rot.ssl.reload.interval.ms=100",
        "listener.name.scram.sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512",
        "listener.name.plain.sasl.enabled.mechanisms=PLAIN",
        f"listener.name.plain.plain.sasl.jaas.config={JAAS}",
        "listener.name.saslpt.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-512",
        f"listener.name.saslpt.plain.sasl.jaas.config={JAAS}",
        f"listener.name.saslpt.connections.max.reauth.ms={REAUTH_MS}",
    ]
    (d / "server.properties").write_text("\n".join(props) + "\n")
    b = BrokerProcess(
        d / "data", port=ports["REPL"], extra_args=["--properties", str(d / "server.properties")]
    )
    b.start()
    s = Secure(b, ports, certs)
    admin = AdminClient(s.sasl("PLAIN", "PLAIN", "admin", "admin-secret"))
    futures = admin.alter_user_scram_credentials(
        [
            UserScramCredentialUpsertion(
                "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"alice-pw"
            ),
            UserScramCredentialUpsertion(
                "carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"carol-pw"
            ),
        ]
    )
    for f in futures.values():
        f.result(timeout=30)
    yield s
    b.stop()


# -- helpers ------------------------------------------------------------------------------


def produce(conf: dict, topic: str, values: list[bytes]) -> None:
    errors: list[str] = []
    p = Producer({**conf, "error_cb": lambda e: errors.append(str(e))})
    for v in values:
        p.produce(topic, value=v)
    assert p.flush(60) == 0, f"undelivered; client errors: {errors[:3]}"


def consume(conf: dict, topic: str, n: int, group: str | None = None) -> list[bytes]:
    c = Consumer(
        {
            **conf,
            "group.id": group or f"g-{topic}-{secrets.token_hex(3)}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    got: list[bytes] = []
    try:
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append(m.value())
    finally:
        c.close()
    return got


def refused(conf: dict) -> str:
    """What a client is told when it cannot get in; fails if it gets in."""
    errors: list[str] = []
    p = Producer({**conf, "error_cb": lambda e: errors.append(str(e))})
    with pytest.raises(KafkaException):
        p.list_topics(timeout=6)
    wait_for(lambda: (p.poll(0.1), errors)[1], 10, "the client reports why")
    return " | ".join(errors)


def brokers_seen(conf: dict) -> dict[int, tuple[str, int]]:
    md = AdminClient(conf).list_topics(timeout=20)
    return {b.id: (b.host, b.port) for b in md.brokers.values()}


class Raw:
    """A raw Kafka connection (optionally TLS): requests in, frames or a close out."""

    def __init__(self, port: int, tls_ca: str | None = None) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if tls_ca is not None:
            ctx = ssl.create_default_context(cafile=tls_ca)
            sock = ctx.wrap_socket(sock, server_hostname="localhost")
        self.sock = sock
        self.cid = 0

    def send(self, req: Any) -> None:
        self.cid += 1
        self.sock.sendall(encode_request(req, self.cid))

    def call(self, req: Any) -> Any | None:
        """The answer, or None when the broker closed the connection instead."""
        try:
            self.send(req)
            frame = recv_frame(self.sock)
        except (ssl.SSLError, ConnectionError):  # a TLS alert, or a reset while sending
            return None
        if frame is None:
            return None
        cid, body = decode_response(req.__api_key__, req.__version__, frame)
        assert cid == self.cid
        return body

    def closed(self) -> bool:
        """True once the broker has closed (EOF), False if it sends anything."""
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True

    def handshake(self, mechanism: str) -> Any:
        return self.call(SaslHandshakeRequest(mechanism=mechanism))

    def authenticate(self, token: bytes) -> Any:
        return self.call(SaslAuthenticateRequest(auth_bytes=token))

    def metadata(self) -> Any:
        return self.call(
            MetadataRequest(
                topics=None,
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            )
        )

    def close(self) -> None:
        self.sock.close()


class ScramClient:
    """The client side of RFC 5802, written from the RFC (not from the broker's code)."""

    def __init__(self, user: str, password: str, hash_name: str = "sha512") -> None:
        self.user, self.password, self.h = user, password, hash_name
        self.nonce = base64.b64encode(secrets.token_bytes(18)).decode()
        self.first_bare = f"n={user},r={self.nonce}"

    def first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def final(self, server_first: bytes, proof_tamper: bool = False) -> bytes:
        attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
        salted = hashlib.pbkdf2_hmac(
            self.h, self.password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
        )
        without_proof = f"c={base64.b64encode(b'n,,').decode()},r={attrs['r']}"
        auth = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        client_key = hmac.digest(salted, b"Client Key", self.h)
        signature = hmac.digest(hashlib.new(self.h, client_key).digest(), auth, self.h)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        if proof_tamper:
            proof = bytes([proof[0] ^ 1]) + proof[1:]
        self.expected_server = hmac.digest(hmac.digest(salted, b"Server Key", self.h), auth, self.h)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def login(self, raw: Raw, mechanism: str = "SCRAM-SHA-512") -> Any:
        assert raw.handshake(mechanism).error_code == 0
        first = raw.authenticate(self.first())
        assert first.error_code == 0, first.error_message
        last = raw.authenticate(self.final(first.auth_bytes))
        assert last.error_code == 0, last.error_message
        assert last.auth_bytes == b"v=" + base64.b64encode(self.expected_server)
        return last


def rotate(certs: Certs, target: str, cn: str) -> None:
    """Issue a new server certificate and swap it in atomically (as cert-manager does)."""
    certs.leaf(cn, "ca", f"/CN={cn}", "IP:127.0.0.1,DNS:localhost")
    tmp = certs.dir / f"{target}.tmp"
    tmp.write_text((certs.dir / f"{cn}.pem").read_text())
    os.replace(tmp, certs.dir / target)


def served_cert_cn(port: int, certs: Certs) -> str:
    ctx = ssl.create_default_context(cafile=certs.path("ca.pem"))
    ctx.load_cert_chain(certs.path("alice.pem"))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        with ctx.wrap_socket(s, server_hostname="localhost") as t:
            return dict(x[0] for x in t.getpeercert()["subject"])["commonName"]


# -- listeners ----------------------------------------------------------------------------


def test_metadata_answers_with_the_endpoints_of_the_clients_listener(secure: Secure) -> None:
    p = secure.ports
    assert brokers_seen(secure.conf("REPL")) == {1: ("127.0.0.1", p["REPL"])}
    assert brokers_seen(secure.conf("TLS")) == {1: ("127.0.0.1", p["TLS"])}
    plain = secure.sasl("PLAIN", "PLAIN", "bob", "bob-pw")
    assert brokers_seen(plain) == {1: ("127.0.0.1", p["PLAIN"])}
    # FindCoordinator too: a group over TLS only works if it names the TLS port.
    produce(secure.conf("TLS"), "listener-group", [b"a", b"b"])
    assert consume(secure.conf("TLS"), "listener-group", 2, group="tls-group") == [b"a", b"b"]


# -- TLS ----------------------------------------------------------------------------------


def test_ssl_produce_and_fetch_large_batches_through_tls(secure: Secure) -> None:
    """Fetch answers are file ranges; over TLS they cannot go by sendfile and are read
    into memory in chunks: several MB of them must arrive intact and in order."""
    values = [(b"%06d" % i) * 3000 for i in range(400)]  # 18 kB each, ~7 MB
    produce(secure.conf("TLS", linger_ms=20), "tls-big", values)
    assert consume(secure.conf("TLS", fetch_max_bytes=4 << 20), "tls-big", 400) == values


def test_mtls_client_certificate_gets_in(secure: Secure) -> None:
    conf = secure.conf(
        "MTLS",
        ssl_certificate_location=secure.certs.path("alice.crt"),
        ssl_key_location=secure.certs.path("alice.key"),
    )
    produce(conf, "mtls", [b"x%d" % i for i in range(50)])
    assert consume(conf, "mtls", 50) == [b"x%d" % i for i in range(50)]


def test_principal_from_a_real_client_certificate(secure: Secure) -> None:
    """The subject of a certificate verified in a real handshake, as Kafka's default
    ssl.principal.mapping.rules names it (RFC 2253, most specific first)."""
    from straitmq.security.tls import principal_from_cert

    c = secure.certs
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(c.path("server.pem"))
    server_ctx.load_verify_locations(c.path("ca.pem"))
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=c.path("ca.pem"))
    client_ctx.load_cert_chain(c.path("alice.pem"))
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[dict] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as t:
            seen.append(t.getpeercert())
            t.recv(1)

    th = threading.Thread(target=serve)
    th.start()
    with socket.create_connection(listener.getsockname()) as s:
        with client_ctx.wrap_socket(s, server_hostname="localhost") as t:
            t.sendall(b"x")
    th.join(10)
    listener.close()
    assert principal_from_cert(seen[0]) == "User:CN=alice,O=Acme,C=US"
    tricky = {"subject": ((("organizationName", "A, B"),), (("commonName", "#x+y"),))}
    assert principal_from_cert(tricky) == "User:CN=\\#x\\+y,O=A\\, B"
    assert principal_from_cert(None) is None


def test_untrusted_expired_or_missing_client_certificate_is_refused(secure: Secure) -> None:
    c = secure.certs
    untrusted = secure.conf(
        "MTLS",
        ssl_certificate_location=c.path("mallory.crt"),
        ssl_key_location=c.path("mallory.key"),
    )
    assert refused(untrusted)
    expired = secure.conf(
        "MTLS", ssl_certificate_location=c.path("old.crt"), ssl_key_location=c.path("old.key")
    )
    assert refused(expired)
    assert refused(secure.conf("MTLS"))  # no certificate at all
    # Raw: the TLS 1.3 handshake completes on the client's side, then nothing is served.
    raw = Raw(secure.ports["MTLS"], tls_ca=c.path("ca.pem"))
    assert (
        raw.call(ApiVersionsRequest(client_software_name="t", client_software_version="1")) is None
    )
    raw.close()
    good = secure.conf(
        "MTLS", ssl_certificate_location=c.path("alice.crt"), ssl_key_location=c.path("alice.key")
    )
    assert brokers_seen(good) == {1: ("127.0.0.1", secure.ports["MTLS"])}


def test_plaintext_client_on_a_tls_port_is_closed_at_once(secure: Secure) -> None:
    raw = Raw(secure.ports["TLS"])
    started = time.monotonic()
    assert (
        raw.call(ApiVersionsRequest(client_software_name="t", client_software_version="1")) is None
    )
    assert time.monotonic() - started < 5, "closed promptly, not after a handshake timeout"
    raw.close()
    assert refused({"bootstrap.servers": f"127.0.0.1:{secure.ports['TLS']}"})
    assert brokers_seen(secure.conf("TLS")) == {1: ("127.0.0.1", secure.ports["TLS"])}


def test_rotated_certificate_reaches_new_connections_without_a_restart(secure: Secure) -> None:
    c = secure.certs
    conf = secure.conf(
        "ROT", ssl_certificate_location=c.path("alice.crt"), ssl_key_location=c.path("alice.key")
    )
    assert served_cert_cn(secure.ports["ROT"], c) == "localhost"
    p = Producer(conf)  # holds its connection across the rotation
    p.produce("rot", value=b"before")
    assert p.flush(30) == 0
    rotate(c, "rot.pem", "rotated")
    wait_for(
        lambda: served_cert_cn(secure.ports["ROT"], c) == "rotated",
        20,
        "new connections get the rotated certificate",
    )
    p.produce("rot", value=b"after")
    assert p.flush(30) == 0
    # The rotated context still checks client certificates against the CA.
    untrusted = secure.conf(
        "ROT",
        ssl_certificate_location=c.path("mallory.crt"),
        ssl_key_location=c.path("mallory.key"),
    )
    assert refused(untrusted)
    assert refused(secure.conf("ROT"))
    assert consume(conf, "rot", 2) == [b"before", b"after"]
    # A half-written file does not take the listener down: the last good one stays.
    (c.dir / "rot.pem").write_text("-----BEGIN PRIVATE KEY-----\ntruncated")
    assert "do not load" in wait_for(
        lambda: "do not load" in secure.log() and secure.log(), 20, "the bad file reported"
    )
    assert served_cert_cn(secure.ports["ROT"], c) == "rotated"


# -- SASL ---------------------------------------------------------------------------------


def test_scram_users_from_the_admin_api_log_in_with_three_clients(secure: Secure) -> None:
    admin = AdminClient(secure.sasl("PLAIN", "PLAIN", "admin", "admin-secret"))
    described = admin.describe_user_scram_credentials(["alice", "carol"])
    infos = {
        u: [(i.mechanism, i.iterations) for i in f.result(timeout=30).scram_credential_infos]
        for u, f in described.items()
    }
    assert infos == {
        "alice": [(ScramMechanism.SCRAM_SHA_512, 8192)],
        "carol": [(ScramMechanism.SCRAM_SHA_256, 4096)],
    }
    # librdkafka, SCRAM-SHA-512
    alice = secure.sasl("SCRAM", "SCRAM-SHA-512", "alice", "alice-pw")
    produce(alice, "scram", [b"r%d" % i for i in range(20)])
    assert consume(alice, "scram", 20) == [b"r%d" % i for i in range(20)]

    # aiokafka, SCRAM-SHA-256
    async def aio() -> list[bytes]:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
        from aiokafka.helpers import create_ssl_context

        tls = create_ssl_context(cafile=secure.certs.path("ca.pem"))
        common = dict(
            bootstrap_servers=f"127.0.0.1:{secure.ports['SCRAM']}",
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-256",
            sasl_plain_username="carol",
            sasl_plain_password="carol-pw",
            ssl_context=tls,
        )
        p = AIOKafkaProducer(**common)
        await p.start()
        try:
            for i in range(10):
                await p.send_and_wait("scram-aio", b"a%d" % i)
        finally:
            await p.stop()
        c = AIOKafkaConsumer("scram-aio", auto_offset_reset="earliest", **common)
        await c.start()
        got: list[bytes] = []
        try:
            async with asyncio.timeout(60):
                async for m in c:
                    got.append(m.value)
                    if len(got) == 10:
                        break
        finally:
            await c.stop()
        return got

    assert asyncio.run(aio()) == [b"a%d" % i for i in range(10)]

    # kafka-python, SCRAM-SHA-512
    from kafka import KafkaConsumer, KafkaProducer

    kp = dict(
        bootstrap_servers=f"127.0.0.1:{secure.ports['SCRAM']}",
        security_protocol="SASL_SSL",
        ssl_cafile=secure.certs.path("ca.pem"),
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="alice",
        sasl_plain_password="alice-pw",
    )
    producer = KafkaProducer(**kp)
    for i in range(10):
        producer.send("scram-kp", b"k%d" % i)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(
        "scram-kp", auto_offset_reset="earliest", consumer_timeout_ms=20000, **kp
    )
    got = []
    for m in consumer:
        got.append(m.value)
        if len(got) == 10:
            break
    consumer.close()
    assert got == [b"k%d" % i for i in range(10)]


def test_wrong_password_and_unknown_user_are_refused_while_others_go_on(secure: Secure) -> None:
    good = Producer(secure.sasl("SCRAM", "SCRAM-SHA-512", "alice", "alice-pw"))
    good.produce("busy", value=b"0")
    assert good.flush(30) == 0
    cases = [
        secure.sasl("SCRAM", "SCRAM-SHA-512", "alice", "wrong"),
        secure.sasl("SCRAM", "SCRAM-SHA-512", "nobody", "x"),
        secure.sasl("SCRAM", "SCRAM-SHA-256", "alice", "alice-pw"),  # no 256 credential
        secure.sasl("PLAIN", "PLAIN", "bob", "wrong"),
        secure.sasl("PLAIN", "PLAIN", "nobody", "x"),
    ]
    for conf in cases:
        told = refused(conf)
        assert "Authentication failed" in told and "invalid credentials" in told, told
        good.produce("busy", value=b"1")
        assert good.flush(30) == 0, "a good client keeps being served"
    told = refused(secure.sasl("PLAIN", "SCRAM-SHA-512", "alice", "alice-pw"))
    assert "SCRAM-SHA-512" in told and "PLAIN" in told, told  # what it asked, what there is


def test_plain_over_sasl_ssl_with_kafka_python(secure: Secure) -> None:
    from kafka import KafkaConsumer, KafkaProducer

    kp = dict(
        bootstrap_servers=f"127.0.0.1:{secure.ports['PLAIN']}",
        security_protocol="SASL_SSL",
        ssl_cafile=secure.certs.path("ca.pem"),
        sasl_mechanism="PLAIN",
        sasl_plain_username="bob",
        sasl_plain_password="bob-pw",
    )
    producer = KafkaProducer(**kp)
    producer.send("plain-kp", b"hello")
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(
        "plain-kp", auto_offset_reset="earliest", consumer_timeout_ms=20000, **kp
    )
    assert [m.value for m in consumer][:1] == [b"hello"]
    consumer.close()


def test_nothing_is_served_before_authentication(secure: Secure) -> None:
    port = secure.ports["SASLPT"]
    raw = Raw(port)
    versions = raw.call(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    assert versions is not None and versions.error_code == 0
    assert {17, 36} <= {k.api_key for k in versions.api_keys}
    assert raw.metadata() is None, "a request before SASL closes the connection"
    raw.close()
    raw = Raw(port)
    answer = raw.authenticate(b"\0bob\0bob-pw")
    assert answer.error_code == ILLEGAL_SASL_STATE and raw.closed()
    raw.close()
    raw = Raw(port)
    answer = raw.handshake("GSSAPI")
    assert answer.error_code == UNSUPPORTED_MECHANISM
    assert set(answer.mechanisms) == {"PLAIN", "SCRAM-SHA-512"} and raw.closed()
    raw.close()
    # A frame too big for a SASL token (Kafka's sasl.server.max.receive.size, 512 kB) is
    # not buffered: the connection closes once its size is read.
    raw = Raw(port)
    raw.sock.sendall(struct.pack(">i", 600_000) + b"\0" * 1000)
    assert raw.closed()
    raw.close()
    # The same on a TLS listener, after a good TLS handshake.
    raw = Raw(secure.ports["SCRAM"], tls_ca=secure.certs.path("ca.pem"))
    assert raw.metadata() is None
    raw.close()


def _first_then(final: bytes | None) -> Any:
    def run(raw: Raw) -> Any:
        assert raw.handshake("SCRAM-SHA-512").error_code == 0
        first = raw.authenticate(b"n,,n=alice,r=abc")
        assert first.error_code == 0
        return raw.authenticate(final if final is not None else first.auth_bytes)

    return run


def _one(token: bytes, mechanism: str = "SCRAM-SHA-512") -> Any:
    def run(raw: Raw) -> Any:
        assert raw.handshake(mechanism).error_code == 0
        return raw.authenticate(token)

    return run


def _bad_proof(raw: Raw) -> Any:
    client = ScramClient("alice", "alice-pw")
    assert raw.handshake("SCRAM-SHA-512").error_code == 0
    first = raw.authenticate(client.first())
    return raw.authenticate(client.final(first.auth_bytes, proof_tamper=True))


MALFORMED = {
    "empty": _one(b""),
    "garbage": _one(b"\xff\xfe\x00garbage"),
    "no nonce": _one(b"n,,n=alice"),
    "truncated first": _one(b"n,,n=al"),
    "channel binding asked": _one(b"p=tls-unique,,n=alice,r=abc"),
    "bad escape": _one(b"n,,n=al=ZZice,r=abc"),
    "other authzid": _one(b"n,a=bob,n=alice,r=abc"),
    "final echoes first": _first_then(None),
    "truncated final": _first_then(b"c=biws,r="),
    "wrong nonce": _first_then(b"c=biws,r=abcXYZ,p=AAAA"),
    "proof not base64": _first_then(b"c=biws,r=abc,p=@@@"),
    "tampered proof": _bad_proof,
    "plain two fields": _one(b"bob\0bob-pw", "PLAIN"),
    "plain not utf8": _one(b"\0bob\0\xff", "PLAIN"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_or_wrong_sasl_tokens_fail_cleanly(secure: Secure, case: str) -> None:
    raw = Raw(secure.ports["SASLPT"])
    answer = MALFORMED[case](raw)
    assert answer is not None and answer.error_code == SASL_FAILED, answer
    assert answer.error_message and "Authentication failed" in answer.error_message
    assert raw.closed(), "the connection ends after a failed authentication"
    raw.close()
    ok = Raw(secure.ports["SASLPT"])
    ScramClient("alice", "alice-pw").login(ok)
    assert ok.metadata() is not None
    ok.close()


def test_fuzzed_sasl_tokens_frames_and_tls_records(secure: Secure) -> None:
    """Seeded random tokens, truncations and bit flips of good ones, truncated
    SaslAuthenticate frames and garbage TLS records: every connection gets an answer or a
    close (never a hang: each socket read has a 10 s timeout), none is let in with a bad
    token, and a good client logs in afterwards."""
    import random

    rng = random.Random(15)
    port = secure.ports["SASLPT"]

    def mutate(good: bytes) -> bytes:
        kind = rng.randrange(3)
        if kind == 0:
            return rng.randbytes(rng.randrange(0, 400))
        if kind == 1:
            return good[: rng.randrange(len(good))]
        out = bytearray(good)
        for _ in range(rng.randrange(1, 4)):
            out[rng.randrange(len(out))] ^= rng.randrange(1, 256)
        return bytes(out)

    for _ in range(120):
        raw = Raw(port)
        mechanism = rng.choice(["PLAIN", "SCRAM-SHA-512"])
        assert raw.handshake(mechanism).error_code == 0
        good = b"\0bob\0bob-pw" if mechanism == "PLAIN" else ScramClient("alice", "x").first()
        answer = raw.authenticate(mutate(good))
        if answer is not None and answer.error_code == 0:  # a SCRAM first that still parses
            assert mechanism != "PLAIN"
            answer = raw.authenticate(mutate(b"c=biws,r=" + answer.auth_bytes[2:40] + b",p=AA=="))
        assert answer is not None and answer.error_code == SASL_FAILED, answer
        assert raw.closed()
        raw.close()
    frame = encode_request(SaslAuthenticateRequest(auth_bytes=b"n,,n=alice,r=abcdef"), 2)
    for cut in range(5, len(frame) - 1, 3):
        raw = Raw(port)
        assert raw.handshake("SCRAM-SHA-512").error_code == 0
        body = frame[4:cut]
        raw.sock.sendall(struct.pack(">i", len(body)) + body)
        assert raw.closed(), f"a frame cut at {cut} closes the connection"
        raw.close()
    for size in (0, 1, 5, 64, 3000):
        with socket.create_connection(("127.0.0.1", secure.ports["TLS"]), timeout=10) as s:
            s.sendall(b"\x16\x03\x01" + rng.randbytes(size))
            s.shutdown(socket.SHUT_WR)
            while s.recv(1 << 16):  # an alert, then EOF; a hang raises socket.timeout
                pass
    ok = Raw(port)
    ScramClient("alice", "alice-pw").login(ok)
    assert ok.metadata() is not None
    ok.close()


def test_handshake_v0_with_unframed_tokens(secure: Secure) -> None:
    raw = Raw(secure.ports["SASLPT"])
    assert raw.call(SaslHandshakeV0(mechanism="PLAIN")).error_code == 0
    token = b"\0bob\0bob-pw"
    raw.sock.sendall(struct.pack(">i", len(token)) + token)
    assert recv_frame(raw.sock) == b""  # PLAIN's empty server reply, size-prefixed
    assert raw.metadata() is not None
    raw.close()
    raw = Raw(secure.ports["SASLPT"])
    assert raw.call(SaslHandshakeV0(mechanism="PLAIN")).error_code == 0
    token = b"\0bob\0nope"
    raw.sock.sendall(struct.pack(">i", len(token)) + token)
    assert recv_frame(raw.sock) is None  # v0 has no error frame: the connection closes
    raw.close()


def _after(t: float) -> None:
    wait_for(lambda: time.monotonic() > t, 30, f"{t - time.monotonic():.1f} s to pass")


def test_session_lifetime_and_reauthentication(secure: Secure) -> None:
    lifetime = REAUTH_MS / 1000
    raw = Raw(secure.ports["SASLPT"])
    done = ScramClient("alice", "alice-pw").login(raw)
    first_ends_by = time.monotonic() + lifetime
    assert done.session_lifetime.total_seconds() * 1000 == REAUTH_MS
    assert raw.metadata() is not None
    # Re-authenticate on the same connection a second later (KIP-368) ...
    _after(first_ends_by - lifetime + 1.0)
    second_ends_after = time.monotonic() + lifetime
    again = ScramClient("alice", "alice-pw").login(raw)
    assert again.session_lifetime.total_seconds() * 1000 == REAUTH_MS
    # ... and the connection serves past the first session's end.
    _after(first_ends_by + 0.2)
    assert time.monotonic() < second_ends_after, "the test machine is too slow for this check"
    assert raw.metadata() is not None
    # Re-authenticating as someone else is refused and ends the connection.
    assert raw.handshake("PLAIN").error_code == 0
    other = raw.authenticate(b"\0bob\0bob-pw")
    assert other.error_code == SASL_FAILED and raw.closed()
    raw.close()
    # A session left to expire: the next request closes the connection.
    raw = Raw(secure.ports["SASLPT"])
    ScramClient("alice", "alice-pw").login(raw)
    _after(time.monotonic() + REAUTH_MS / 1000 + 0.1)
    assert raw.metadata() is None
    raw.close()


def test_librdkafka_reauthenticates_before_its_session_ends(secure: Secure) -> None:
    expired_before = secure.log().count("SASL session expired")
    conf = secure.sasl("SASLPT", "SCRAM-SHA-512", "alice", "alice-pw")
    errors: list[str] = []
    p = Producer({**conf, "error_cb": lambda e: errors.append(str(e))})
    end = time.monotonic() + 2.5 * REAUTH_MS / 1000
    sent = 0
    while time.monotonic() < end:
        p.produce("reauth", value=b"%d" % sent)
        sent += 1
        assert p.flush(10) == 0
    assert errors == []
    assert secure.log().count("SASL session expired") == expired_before, (
        "librdkafka re-authenticated in time, so no connection of its was cut"
    )
    assert len(consume(conf, "reauth", sent)) == sent


def test_scram_credential_deletion(secure: Secure) -> None:
    admin = AdminClient(secure.sasl("PLAIN", "PLAIN", "admin", "admin-secret"))
    upsert = UserScramCredentialUpsertion(
        "erin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"erin-pw"
    )
    admin.alter_user_scram_credentials([upsert])["erin"].result(timeout=30)
    erin = secure.sasl("SCRAM", "SCRAM-SHA-256", "erin", "erin-pw")
    assert brokers_seen(erin)
    gone = UserScramCredentialDeletion("erin", ScramMechanism.SCRAM_SHA_256)
    admin.alter_user_scram_credentials([gone])["erin"].result(timeout=30)
    assert "Authentication failed" in refused(erin)
    with pytest.raises(KafkaException, match=r"RESOURCE_NOT_FOUND|does not exist"):
        admin.describe_user_scram_credentials(["erin"])["erin"].result(timeout=30)
    with pytest.raises(KafkaException, match=r"RESOURCE_NOT_FOUND|does not exist"):
        admin.alter_user_scram_credentials([gone])["erin"].result(timeout=30)
    few = UserScramCredentialUpsertion(
        "erin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100), b"erin-pw"
    )
    with pytest.raises(KafkaException, match="iterations"):
        admin.alter_user_scram_credentials([few])["erin"].result(timeout=30)


# -- SCRAM credentials in the metadata log ------------------------------------------------


def test_scram_records_are_in_snapshots_and_hold_no_password() -> None:
    from straitmq.security.scram import credential_record, salted_password

    salt = b"0123456789abcdef"
    rec = credential_record(
        "alice",
        "SCRAM-SHA-512",
        salt,
        4096,
        salted_password("SCRAM-SHA-512", "alice-pw", salt, 4096),
    )
    image = MetadataImage(cluster_id="c")
    image.apply({"type": "user_scram_credential", **rec})
    image.apply({"type": "user_scram_credential", **{**rec, "name": "bob"}})
    image.apply(
        {"type": "remove_user_scram_credential", "name": "bob", "mechanism": "SCRAM-SHA-512"}
    )
    for restored in (
        MetadataImage.from_dict(orjson.loads(image.encoded())),
        MetadataImage.from_dict(image.to_dict()),
        image.copy(),
    ):
        assert restored.scram_credentials == {
            "alice": {
                "SCRAM-SHA-512": {
                    k: rec[k] for k in ("salt", "iterations", "stored_key", "server_key")
                }
            }
        }
    assert b"alice-pw" not in image.encoded()
    # Snapshots written before SCRAM existed still load.
    old = image.to_dict()
    del old["scram_credentials"]
    assert MetadataImage.from_dict(old).scram_credentials == {}


def test_scram_credentials_survive_a_restart(broker_factory: Any, tmp_path: Path) -> None:
    port, sasl_port = free_port(), free_port()
    props = tmp_path / "p.properties"
    props.write_text(
        f"listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}\n"
    )
    b = broker_factory("--properties", str(props))
    plain = {"bootstrap.servers": f"127.0.0.1:{port}"}
    upsert = UserScramCredentialUpsertion(
        "zoe", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"zoe-pw"
    )
    admin = AdminClient(plain)  # held: a collected client cancels its requests
    admin.alter_user_scram_credentials([upsert])["zoe"].result(timeout=30)
    b.restart()
    zoe = {
        "bootstrap.servers": f"127.0.0.1:{sasl_port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "zoe",
        "sasl.password": "zoe-pw",
    }
    assert brokers_seen(zoe) == {1: ("127.0.0.1", sasl_port)}
    assert brokers_seen(plain) == {1: ("127.0.0.1", port)}


def test_bad_security_settings_stop_the_broker_saying_why(tmp_path: Path) -> None:
    cases = {
        "listeners=CLIENT://127.0.0.1:0": "no security protocol",
        "listeners=A://127.0.0.1:0\nlistener.security.protocol.map=A:SSL": "no PLAINTEXT listener",
        "listeners=PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0": "ssl.keystore.location",
        (
            "listeners=PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0\n"
            "sasl.enabled.mechanisms=PLAIN"
        ): "PLAIN is enabled but has no users",
        "listeners=PLAINTEXT://127.0.0.1:0\nssl.keystore.lokation=x": "",  # a typo: refused
        (
            "listeners=PLAINTEXT://127.0.0.1:0\nlistener.name.clinet.ssl.client.auth=required"
        ): "there is no listener CLINET",
    }
    for i, (text, why) in enumerate(cases.items()):
        props = tmp_path / f"{i}.properties"
        props.write_text(text + "\n")
        b = BrokerProcess(tmp_path / f"d{i}", extra_args=["--properties", str(props)])
        b.launch()
        assert b.proc is not None and b.log_path is not None
        try:
            assert b.proc.wait(30) != 0
        finally:
            b.kill9()
        out = b.log_path.read_text()
        assert why in out, out
        if not why:
            assert "unknown setting 'ssl.keystore.lokation'" in out, out


# -- the Java client and the Kafka CLI tools ----------------------------------------------


@pytest.fixture(scope="module")
def jars() -> None:
    from bench.javatools import ensure_jars

    ensure_jars()


def java_props(secure: Secure, kind: str) -> tuple[int, list[str]]:
    """(port, StraitClient --prop values) for each way in."""
    c = secure.certs
    trust = ["ssl.truststore.type=PEM", f"ssl.truststore.location={c.path('ca.pem')}"]
    scram = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="alice-pw";'
    )
    plain = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="bob" password="bob-pw";'
    )
    ways = {
        "ssl": ("TLS", ["security.protocol=SSL", *trust]),
        "mtls": (
            "MTLS",
            [
                "security.protocol=SSL",
                *trust,
                "ssl.keystore.type=PEM",
                f"ssl.keystore.location={c.path('alice.pem')}",
            ],
        ),
        "scram-sha-512": (
            "SCRAM",
            [
                "security.protocol=SASL_SSL",
                *trust,
                "sasl.mechanism=SCRAM-SHA-512",
                f"sasl.jaas.config={scram}",
            ],
        ),
        "plain": (
            "PLAIN",
            [
                "security.protocol=SASL_SSL",
                *trust,
                "sasl.mechanism=PLAIN",
                f"sasl.jaas.config={plain}",
            ],
        ),
    }
    listener, props = ways[kind]
    return secure.ports[listener], props


@pytest.mark.parametrize("kind", ["ssl", "mtls", "scram-sha-512", "plain"])
def test_java_client(secure: Secure, jars: None, kind: str) -> None:
    from bench.javatools import straitclient

    port, props = java_props(secure, kind)
    extra = [a for p in props for a in ("--prop", p)]
    topic = f"java-{kind}"
    bootstrap = f"127.0.0.1:{port}"
    sent = straitclient(
        [
            "produce",
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--count",
            30,
            "--value-size",
            20000,
            *extra,
        ],
        timeout=180,
    )
    assert sent.returncode == 0, sent.stderr[-3000:]
    assert sent.json["acked"] == 30 and sent.json["errors"] == 0
    got = straitclient(
        [
            "consume",
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--group",
            f"jg-{kind}",
            "--count",
            30,
            "--timeout-ms",
            60000,
            "--offset-reset",
            "earliest",
            *extra,
        ],
        timeout=180,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    assert sorted(int(r["v"][1:].rstrip("x")) for r in got.records) == list(range(30))


def test_java_client_with_a_wrong_password_is_told_why(secure: Secure, jars: None) -> None:
    from bench.javatools import straitclient

    port, props = java_props(secure, "scram-sha-512")
    props = [p.replace("alice-pw", "wrong") for p in props]
    extra = [a for p in props for a in ("--prop", p)]
    res = straitclient(
        ["admin", "--bootstrap", f"127.0.0.1:{port}", "list-topics", "--timeout-ms", 20000, *extra],
        timeout=120,
    )
    assert res.returncode != 0
    assert "SaslAuthenticationException" in res.stdout + res.stderr, res.stderr[-3000:]
    assert "invalid credentials" in res.stdout + res.stderr


def test_kafka_configs_manages_scram_users(secure: Secure, jars: None, tmp_path: Path) -> None:
    """kafka-configs (Kafka 4.4) with --command-config, as a platform team runs it."""
    import subprocess

    from bench.javatools import KAFKA44_TOOLS, java_cmd

    port, props = java_props(secure, "plain")
    config = tmp_path / "admin.properties"
    config.write_text("\n".join(props) + "\n")

    def configs(*args: str) -> str:
        r = subprocess.run(
            java_cmd(
                KAFKA44_TOOLS["kafka-configs"],
                ["--bootstrap-server", f"127.0.0.1:{port}", "--command-config", str(config), *args],
                jars="4.4",
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, f"kafka-configs {args}: {r.stdout[-2000:]}{r.stderr[-3000:]}"
        return r.stdout

    configs(
        "--alter",
        "--add-config",
        "SCRAM-SHA-512=[iterations=8192,password=dave-pw]",
        "--entity-type",
        "users",
        "--entity-name",
        "dave",
    )
    described = configs("--describe", "--entity-type", "users", "--entity-name", "dave")
    assert "SCRAM-SHA-512=iterations=8192" in described, described
    everyone = configs("--describe", "--entity-type", "users")
    assert "'dave'" in everyone and "'alice'" in everyone, everyone
    dave = secure.sasl("SCRAM", "SCRAM-SHA-512", "dave", "dave-pw")
    produce(dave, "dave", [b"hi"])
    configs(
        "--alter",
        "--delete-config",
        "SCRAM-SHA-512",
        "--entity-type",
        "users",
        "--entity-name",
        "dave",
    )
    assert "SCRAM" not in configs("--describe", "--entity-type", "users", "--entity-name", "dave")
    assert "Authentication failed" in refused(dave)
