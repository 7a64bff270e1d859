"""HTTP admin/REST API and the `strait` CLI against a real broker process."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import orjson
import pytest
from waiting import wait_for


def call(broker, method: str, path: str, body: bytes | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(
        broker.http + path, data=body, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, orjson.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, orjson.loads(e.read())


def strait(broker, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "straitmq.cli", "--http", broker.http, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_health_and_readiness(broker):
    assert call(broker, "GET", "/healthz") == (200, {"status": "ok"})
    assert call(broker, "GET", "/readyz") == (200, {"status": "ready"})


def test_a_stopping_broker_exits_only_after_its_readiness_probe_saw_it_leave(broker_factory):
    """On Kubernetes (issue 27): a Service keeps routing to a terminating pod until the
    kubelet's readiness probe has failed; a connection sent there after the pod's address
    is gone hangs for the client's 30 s connect timeout. So a stopping broker answers
    /readyz 503 from the start, closes its Kafka listener (connections are refused, the
    client tries again at once) and exits only after --shutdown-readiness-probes such
    answers."""
    b = broker_factory("--shutdown-readiness-probes=3", "--shutdown-readiness-timeout-ms=120000")
    assert call(b, "GET", "/readyz")[0] == 200
    b.proc.send_signal(signal.SIGTERM)
    _, body = wait_for(
        lambda: (r := call(b, "GET", "/readyz"))[0] == 503 and r, 30, "/readyz 503 once stopping"
    )
    assert body["reason"] == "this broker is shutting down"

    def refused() -> bool:
        try:
            socket.create_connection(("127.0.0.1", b.port), timeout=2).close()
        except ConnectionRefusedError:
            return True
        return False

    wait_for(refused, 30, "the Kafka listener closed")
    assert call(b, "GET", "/readyz")[0] == 503  # the second unready answer
    assert b.proc.poll() is None, "exited before the third unready answer"
    assert call(b, "GET", "/readyz")[0] == 503  # the third: now it may go
    assert b.proc.wait(30) == 0


def test_rest_produce_consume_roundtrip(broker):
    status, t = call(
        broker, "POST", "/api/v1/topics", orjson.dumps({"name": "rest", "partitions": 2})
    )
    assert status == 201 and len(t["partitions"]) == 2
    records = [
        {"key": f"k{i}", "value": f"v{i}", "headers": {"n": str(i)}, "partition": i % 2}
        for i in range(50)
    ]
    status, res = call(
        broker, "POST", "/api/v1/topics/rest/records", orjson.dumps({"records": records})
    )
    assert status == 200
    assert sorted(o["count"] for o in res["offsets"]) == [25, 25]
    got = []
    for p in (0, 1):
        status, page = call(broker, "GET", f"/api/v1/topics/rest/partitions/{p}/records?limit=100")
        assert status == 200
        got += [
            (p, r["key"]["text"], r["value"]["text"], r["headers"]["n"]["text"])
            for r in page["records"]
        ]
        assert [r["offset"] for r in page["records"]] == list(range(25))
    assert sorted(got) == sorted((i % 2, f"k{i}", f"v{i}", str(i)) for i in range(50))


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "fragment"),
    [
        ("POST", "/api/v1/topics", b"{not json", 400, "not valid JSON"),
        ("POST", "/api/v1/topics", b"[1]", 400, "JSON object"),
        ("POST", "/api/v1/topics", b'{"name": "bad name"}', 400, "characters"),
        ("POST", "/api/v1/topics", b'{"name": "x", "partitions": 0}', 400, "partitions"),
        (
            "POST",
            "/api/v1/topics",
            b'{"name": "x", "replication_factor": 3}',
            400,
            "replication factor",
        ),
        ("POST", "/api/v1/topics", b'{"name": "x", "configs": {"nope": "1"}}', 400, "nope"),
        ("GET", "/api/v1/topics/missing", None, 404, "does not exist"),
        (
            "POST",
            "/api/v1/topics/missing/records",
            b'{"records": [{"value": "v"}]}',
            404,
            "does not exist",
        ),
        ("DELETE", "/api/v1/topics/missing", None, 404, "does not exist"),
        ("GET", "/api/v1/groups/none", None, 404, "does not exist"),
    ],
)
def test_bad_requests_get_clear_4xx(broker, method, path, body, status, fragment):
    # A broker that just became ready may still be loading its group coordinator's
    # partition: 503 ("retry") is the right answer until it has, so ask again while it lasts.
    def answer() -> tuple[int, dict] | None:
        got, payload = call(broker, method, path, body)
        return None if got == 503 and "retry" in payload.get("error", "") else (got, payload)

    got, payload = wait_for(answer, 30, f"{method} {path} answered without a 503")
    assert got == status
    assert fragment in payload["error"]


def test_rest_errors_on_existing_topic(broker):
    call(broker, "POST", "/api/v1/topics", orjson.dumps({"name": "e", "partitions": 1}))
    assert call(broker, "POST", "/api/v1/topics/e/records", b'{"records": []}')[0] == 400
    assert (
        call(
            broker,
            "POST",
            "/api/v1/topics/e/records",
            b'{"records": [{"value": "v", "partition": 5}]}',
        )[0]
        == 400
    )
    assert call(broker, "GET", "/api/v1/topics/e/partitions/0/records?offset=99")[0] == 416
    assert call(broker, "GET", "/api/v1/topics/e/partitions/9/records")[0] == 404
    assert call(broker, "PATCH", "/api/v1/topics/e", b'{"partitions": 0}')[0] == 400
    assert call(broker, "POST", "/api/v1/topics", orjson.dumps({"name": "e"}))[0] == 409


def test_rest_and_kafka_produce_refuse_alike_below_min_insync(broker):
    """One write path: a topic whose ISR (1) is below min.insync.replicas (2) refuses a
    Kafka acks=all produce and a REST produce with the same error, and stores nothing;
    acks=1 is still accepted, as in Kafka."""
    from confluent_kafka import KafkaError, Producer

    body = {"name": "strict", "partitions": 1, "configs": {"min.insync.replicas": "2"}}
    assert call(broker, "POST", "/api/v1/topics", orjson.dumps(body))[0] == 201
    status, res = call(
        broker, "POST", "/api/v1/topics/strict/records", b'{"records": [{"value": "v"}]}'
    )
    assert status == 503, res
    assert res["error_name"] == "NOT_ENOUGH_REPLICAS" and "min.insync.replicas=2" in res["error"]
    errors = []
    p = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "acks": "all",
            "retries": 0,
            "message.timeout.ms": 5000,
        }
    )
    p.produce("strict", b"v", on_delivery=lambda err, m: errors.append(err))
    p.flush(10)
    assert [e.code() for e in errors] == [KafkaError.NOT_ENOUGH_REPLICAS]
    status, page = call(broker, "GET", "/api/v1/topics/strict/partitions/0/records")
    assert status == 200 and page["records"] == []
    p1 = Producer({"bootstrap.servers": broker.bootstrap, "acks": 1})
    p1.produce("strict", b"v1")
    assert p1.flush(10) == 0


def test_cli_end_to_end(broker):
    r = strait(broker, "topic", "create", "cli", "-p", "2", "-c", "retention.ms=3600000")
    assert r.returncode == 0, r.stderr
    r = strait(broker, "topic", "create", "cli")
    assert r.returncode == 1 and r.stderr.strip() == "strait: topic 'cli' already exists"
    lines = "".join(f"k{i}\tv{i}\n" for i in range(20))
    r = strait(broker, "produce", "cli", "--key-separator", "\t", stdin=lines)
    assert r.returncode == 0, r.stderr
    r = strait(broker, "consume", "cli", "--from-beginning", "--print-key")
    assert sorted(r.stdout.split("\n")[:-1]) == sorted(f"k{i}\tv{i}" for i in range(20))
    r = strait(broker, "consume", "cli", "--group", "g", "-n", "7")
    assert len(r.stdout.splitlines()) == 7
    r = strait(broker, "consume", "cli", "--group", "g")
    assert len(r.stdout.splitlines()) == 13, "the group resumes after its commits"
    r = strait(broker, "group", "describe", "g")
    assert "cli" in r.stdout and r.returncode == 0
    described = strait(broker, "topic", "describe", "cli").stdout
    assert "retention.ms=3600000" in described
    assert "cleanup delete  retention.ms 3600000" in described, described
    r = strait(broker, "topic", "create", "cli-table", "-c", "cleanup.policy=compact,delete")
    assert r.returncode == 0, r.stderr
    described = strait(broker, "topic", "describe", "cli-table").stdout
    assert "cleanup compact,delete  retention.ms 604800000  min.cleanable.dirty.ratio 0.5" in (
        described
    ), described
    r = strait(broker, "topic", "alter", "cli-table", "-c", "cleanup.policy=shred")
    assert r.returncode == 1 and "'shred' is not a cleanup policy" in r.stderr, r.stderr
    r = strait(broker, "topic", "alter", "cli", "-p", "1")
    assert r.returncode == 1 and "never shrink" in r.stderr
    assert strait(broker, "topic", "alter", "cli", "-p", "4").returncode == 0
    assert "cli" in strait(broker, "topic", "list").stdout
    assert strait(broker, "topic", "delete", "cli").returncode == 0
    r = strait(broker, "topic", "describe", "cli")
    assert r.returncode == 1 and "does not exist" in r.stderr


def test_cli_unreachable_broker_is_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "straitmq.cli", "--http", "http://127.0.0.1:9", "topic", "list"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "cannot reach StraitMQ" in r.stderr
