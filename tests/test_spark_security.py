"""Spark jobs on a SASL_SSL listener (SCRAM-SHA-512, a private CA), configured the way a
user of Spark's Kafka source already does: `kafka.security.protocol`,
`kafka.sasl.mechanism`, `kafka.sasl.jaas.config`, `kafka.ssl.truststore.*`.

The same options (or the same client properties file, as the jobs' --command-config)
work on the `straitmq` source and on Spark's own Kafka source, and give the same rows; a
wrong password is one clear error at once, not a metadata timeout."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark  # noqa: F401  (pinned in pyproject.toml: missing, the tests fail, not skip)
import pytest
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from conftest import ROOT, BrokerProcess, free_port
from tls_support import make_certs

sys.path.insert(0, str(ROOT / "spark-jobs" / "jobs"))

import topic_to_parquet
from common import client_options, spark_session
from straitmq.spark import StraitMQSparkError
from straitmq.spark.options import SinkOptions, SourceOptions

pytestmark = pytest.mark.timeout(300)

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
RECORDS = 500


# ---- the option mapping, no Spark --------------------------------------------------------


def test_java_security_options_become_librdkafka_settings() -> None:
    o = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": "h:1",
            "subscribe": "t",
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": f'{SCRAM} required username="app" password="p=w \\"x\\"";',
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.location": "/ca.pem",
            "kafka.ssl.keystore.type": "PKCS12",
            "kafka.ssl.keystore.location": "/me.p12",
            "kafka.ssl.keystore.password": "ks",
            "kafka.ssl.endpoint.identification.algorithm": "",
        },
        streaming=False,
    )
    assert o.client_config == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "app",
        "sasl.password": 'p=w "x"',
        "ssl.ca.location": "/ca.pem",
        "ssl.keystore.location": "/me.p12",
        "ssl.keystore.password": "ks",
        "ssl.endpoint.identification.algorithm": "none",
    }
    # librdkafka's own names pass through; the sink maps the same way.
    sink = SinkOptions.parse(
        {
            "kafka.bootstrap.servers": "h:1",
            "kafka.sasl.username": "u",
            "kafka.ssl.ca.location": "/ca.pem",
            "kafka.ssl.keystore.type": "PEM",
            "kafka.ssl.keystore.location": "/me.pem",
        }
    )
    assert sink.client_config == {
        "sasl.username": "u",
        "ssl.ca.location": "/ca.pem",
        "ssl.certificate.location": "/me.pem",
        "ssl.key.location": "/me.pem",
    }


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("kafka.ssl.truststore.location", "/ts.jks", "JKS truststore"),
        ("kafka.sasl.jaas.config", "username=a password=b", "not a JAAS entry"),
        (
            "kafka.sasl.jaas.config",
            'com.example.Kerberos required principal="x";',
            "PLAIN or SCRAM",
        ),
        ("kafka.sasl.jaas.config", f'{SCRAM} required username="a";', 'password="..."'),
    ],
)
def test_java_options_librdkafka_cannot_honour_are_refused(
    option: str, value: str, message: str
) -> None:
    with pytest.raises(StraitMQSparkError, match=message):
        SourceOptions.parse(
            {"kafka.bootstrap.servers": "h:1", "subscribe": "t", option: value}, streaming=False
        )


# ---- a broker with a SASL_SSL listener ------------------------------------------------------


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, int, Any]]:
    d = tmp_path_factory.mktemp("spark-secure")
    certs = make_certs(d / "certs")
    port, sasl_port = free_port(), free_port()
    (d / "server.properties").write_text(
        f"listeners=PLAINTEXT://127.0.0.1:{port},SASL_SSL://127.0.0.1:{sasl_port}\n"
        f"ssl.keystore.location={certs.path('server.pem')}\n"
        "sasl.enabled.mechanisms=SCRAM-SHA-512\n"
    )
    b = BrokerProcess(
        d / "data", port=port, extra_args=["--properties", str(d / "server.properties")]
    )
    b.start()
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    upsert = UserScramCredentialUpsertion(
        "spark", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"spark-pw"
    )
    admin.alter_user_scram_credentials([upsert])["spark"].result(timeout=30)
    b.create_topic("secured", 2)
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all"})
    for i in range(RECORDS):
        p.produce("secured", key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2)
    assert p.flush(30) == 0
    yield b, sasl_port, certs
    b.stop()


def client_properties(path: Path, certs: Any, password: str) -> Path:
    """What a Kafka user writes for --command-config, JAAS entry on continued lines."""
    path.write_text(
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n"
        f"sasl.jaas.config={SCRAM} required \\\n"
        f'    username="spark" password="{password}";\n'
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={certs.path('ca.pem')}\n"
    )
    return path


@pytest.fixture(scope="module")
def spark() -> Any:
    return spark_session(
        "straitmq-tests", with_kafka_jars=True, spark__sql__shuffle__partitions="2"
    )


def test_both_spark_sources_read_a_sasl_ssl_listener_with_the_same_options(
    spark: Any, secure: tuple[BrokerProcess, int, Any], tmp_path: Path
) -> None:
    _, sasl_port, certs = secure
    client = client_options(
        str(client_properties(tmp_path / "client.properties", certs, "spark-pw"))
    )
    assert client["kafka.sasl.jaas.config"].endswith('password="spark-pw";')
    outs = {}
    for source in ("straitmq", "kafka"):
        out = str(tmp_path / source)
        topic_to_parquet.run(
            spark,
            source=source,
            bootstrap=f"127.0.0.1:{sasl_port}",
            topic="secured",
            out=out,
            client=client,
        )
        outs[source] = sorted(tuple(r) for r in spark.read.parquet(out).collect())
    assert len(outs["straitmq"]) == RECORDS
    assert {(r[0], r[1]) for r in outs["straitmq"]} == {(f"k{i}", f"v{i}") for i in range(RECORDS)}
    assert outs["straitmq"] == outs["kafka"]


def test_a_wrong_password_is_one_clear_error_at_once(
    spark: Any, secure: tuple[BrokerProcess, int, Any], tmp_path: Path
) -> None:
    _, sasl_port, certs = secure
    client = client_options(str(client_properties(tmp_path / "bad.properties", certs, "nope")))
    reader = (
        spark.read.format("straitmq")
        .option("kafka.bootstrap.servers", f"127.0.0.1:{sasl_port}")
        .option("subscribe", "secured")
        .option("metadataTimeoutMs", "60000")
        .options(**client)
    )
    with pytest.raises(Exception) as info:
        reader.load().collect()
    text = str(info.value)
    # The refused login ends it (not the 60 s metadata timeout, whose error says the
    # cluster "did not answer").
    assert "refused the connection" in text and "Authentication failed" in text, text
