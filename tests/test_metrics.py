"""Metrics: every dashboard panel is backed by a metric StraitMQ really serves, and moves.

A combined node (broker + controller in one process) and a standalone controller
process are scraped on GET /metrics; the broker also pushes OTLP/HTTP to a receiver in
this test. The dashboards (charts/straitmq/dashboards/*.json) are checked for the
structure Grafana's dashboard schema requires (no machine-readable schema is published
on PyPI or npm: @grafana/schema ships TypeScript types, grafana-foundation-sdk builders).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import ROOT, BrokerProcess, free_port
from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families
from tls_support import make_certs
from waiting import wait_for

from straitmq.version import VERSION, commit

DASHBOARDS = ROOT / "charts" / "straitmq" / "dashboards"
EXPECTED_DASHBOARDS = {
    "cluster-overview",
    "topics",
    "consumer-lag",
    "controller-quorum",
    "operator",
    "quotas",
}
METRIC = re.compile(r"\b(straitmq_[a-z0-9_]+)")
SELECTOR = re.compile(r"\b(straitmq_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
LABEL_CONTEXT = re.compile(
    r"\{[^}]*\}|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
)
VARIABLE = re.compile(r"\$\{?([a-zA-Z_][a-zA-Z0-9_]*)")
SCRAPE_LABELS = {"le", "instance", "job"}  # added by the histogram type or by Prometheus
GRAFANA_BUILTINS = {"__rate_interval", "__range", "__interval", "__interval_ms", "__range_s"}
PANEL_TYPES = {"row", "timeseries", "stat", "table", "gauge", "bargauge", "text", "heatmap"}

Scrape = dict[str, list[tuple[dict[str, str], float]]]


# -- helpers ----------------------------------------------------------------------------


def scrape(base: str) -> Scrape:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    out: Scrape = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def total(s: Scrape, name: str, **labels: str) -> float:
    return sum(
        v for ls, v in s.get(name, []) if all(ls.get(k) == want for k, want in labels.items())
    )


def dashboards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def queries(board: dict) -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) of every query of every panel."""
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]


def metric_names(expr: str) -> list[str]:
    """Metric names in a PromQL expression (label names in {...} and by (...) aside)."""
    return METRIC.findall(LABEL_CONTEXT.sub(" ", expr))


def check_served(board: dict, served: Scrape, where: str) -> None:
    """Every metric a panel queries is in `served`, with the labels the query uses."""
    missing = []
    for title, expr in queries(board):
        names = metric_names(expr)
        assert names, f"panel {title!r} queries no StraitMQ metric: {expr}"
        known_labels = set(SCRAPE_LABELS)
        for name in names:
            if name not in served:
                missing.append(f"{title!r}: {name}")
                continue
            known_labels |= {k for labels, _ in served[name] for k in labels}
        for name, body in SELECTOR.findall(expr):
            for label in MATCHER.findall(body):
                have = {k for labels, _ in served.get(name, []) for k in labels}
                assert label in have, f"panel {title!r}: {name} has no label {label!r}"
        for group in GROUPING.findall(expr):
            for label in (x.strip() for x in group.split(",") if x.strip()):
                assert label in known_labels, f"panel {title!r}: no metric has label {label!r}"
    assert not missing, f"metrics not served by {where}:\n" + "\n".join(missing)


class OtlpReceiver:
    """A stand-in OpenTelemetry Collector: records the metric names POSTed to it."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
            ExportMetricsServiceRequest,
        )

        self.names: set[str] = set()
        self.services: set[str] = set()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                req = ExportMetricsServiceRequest.FromString(body)
                for rm in req.resource_metrics:
                    for a in rm.resource.attributes:
                        if a.key == "service.name":
                            receiver.services.add(a.value.string_value)
                    for sm in rm.scope_metrics:
                        receiver.names |= {m.name for m in sm.metrics}
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- dashboards ------------------------------------------------------------------------


def test_dashboards_are_valid_grafana_json() -> None:
    boards = dashboards()
    assert set(boards) == EXPECTED_DASHBOARDS
    uids = set()
    for file, d in boards.items():
        where = f"{file}.json"
        for key, kind in [
            ("title", str),
            ("uid", str),
            ("schemaVersion", int),
            ("panels", list),
            ("templating", dict),
            ("time", dict),
            ("tags", list),
            ("editable", bool),
            ("annotations", dict),
        ]:
            assert isinstance(d.get(key), kind), f"{where}: {key} must be a {kind.__name__}"
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", d["uid"]), where
        assert d["uid"] not in uids, f"{where}: uid {d['uid']} used twice"
        uids.add(d["uid"])
        assert d["schemaVersion"] >= 36, f"{where}: schemaVersion too old for Grafana 10+"
        assert {"from", "to"} <= set(d["time"])
        variables = d["templating"]["list"]
        names = [v["name"] for v in variables]
        assert len(names) == len(set(names)), f"{where}: variable names repeat"
        assert "datasource" in names, f"{where}: needs the ${{datasource}} variable"
        for v in variables:
            assert v["type"] in {"datasource", "query", "custom", "constant", "interval"}
            if v["type"] == "query":
                assert v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
                assert "label_values(" in v["query"]["query"]

        ids = [p["id"] for p in d["panels"]]
        assert all(isinstance(i, int) for i in ids) and len(ids) == len(set(ids)), where
        cells: set[tuple[int, int]] = set()
        for p in d["panels"]:
            title = f"{where} panel {p.get('title')!r}"
            assert p["type"] in PANEL_TYPES, title
            assert isinstance(p.get("title"), str) and p["title"], title
            g = p["gridPos"]
            assert all(isinstance(g[k], int) for k in "hwxy"), title
            assert g["w"] >= 1 and g["h"] >= 1 and g["x"] >= 0 and g["x"] + g["w"] <= 24, title
            mine = {
                (x, y)
                for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])
            }
            assert not mine & cells, f"{title} overlaps another panel"
            cells |= mine
            if p["type"] == "row":
                continue
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
            assert isinstance(p.get("fieldConfig", {}).get("defaults"), dict), title
            assert isinstance(p.get("options"), dict), title
            targets = p["targets"]
            assert targets, f"{title} has no query"
            refs = [t["refId"] for t in targets]
            assert len(refs) == len(set(refs)), f"{title}: refIds repeat"
            for t in targets:
                assert t["datasource"] == p["datasource"], title
                assert isinstance(t["expr"], str) and t["expr"].strip(), title
                assert t["expr"].count("(") == t["expr"].count(")"), f"{title}: {t['expr']}"
                assert t["expr"].count("{") == t["expr"].count("}"), f"{title}: {t['expr']}"
                for var in VARIABLE.findall(t["expr"]):
                    assert var in names or var in GRAFANA_BUILTINS, f"{title}: ${var} undefined"


def test_operator_dashboard_uses_the_declared_operator_instruments() -> None:
    """The dashboard against the instruments `straitmq.telemetry.operator_metrics`
    declares, exported in-process, including an error (the live operator in the
    Kubernetes tests seldom fails)."""
    from straitmq.telemetry import Telemetry
    from straitmq.telemetry.operator_metrics import OperatorMetrics

    telemetry = Telemetry("straitmq-operator", "test")
    try:
        metrics = OperatorMetrics(telemetry)
        with metrics.reconcile("Topic"):
            pass
        with pytest.raises(TimeoutError), metrics.reconcile("MQCluster"):
            raise TimeoutError("the controller did not answer")
        metrics.requeued("MQCluster")
        served: Scrape = {}
        for family in text_string_to_metric_families(telemetry.render().decode()):
            for s in family.samples:
                served.setdefault(s.name, []).append((s.labels, s.value))
        check_served(dashboards()["operator"], served, "the operator's instruments")
        assert total(served, "straitmq_operator_reconcile_errors_total", error_type="TimeoutError")
    finally:
        telemetry.shutdown()


# The running operator's /metrics against its dashboard: tests/test_operator_k8s.py
# (test_operator_logs_are_structured_and_metrics_count_reconciles).


# -- fast histogram --------------------------------------------------------------------


def test_fast_histogram_exports_like_an_sdk_histogram() -> None:
    from straitmq.telemetry import Telemetry
    from straitmq.telemetry import catalog as C

    telemetry = Telemetry("straitmq-broker", "test")
    try:
        family = telemetry.fast_histogram(C.BROKER_REQUEST_DURATION, (0.001, 0.01, 0.1))
        h = family.bind({C.API: "Produce"})
        assert family.bind({C.API: "Produce"}) is h
        for v in (0.0005, 0.001, 0.002, 0.05, 3.0):
            h.record(v)
        s: Scrape = {}
        for fam in text_string_to_metric_families(telemetry.render().decode()):
            for smp in fam.samples:
                s.setdefault(smp.name, []).append((smp.labels, smp.value))
        buckets = {ls["le"]: v for ls, v in s["straitmq_broker_request_duration_seconds_bucket"]}
        # Prometheus buckets are cumulative and `le` is inclusive: 0.001 falls in le=0.001.
        assert buckets == {"0.001": 2, "0.01": 3, "0.1": 4, "+Inf": 5}
        assert total(s, "straitmq_broker_request_duration_seconds_count") == 5
        assert total(s, "straitmq_broker_request_duration_seconds_sum") == pytest.approx(3.0535)
    finally:
        telemetry.shutdown()


def test_otlp_export_carries_sdk_and_fast_instruments() -> None:
    from straitmq.telemetry import Telemetry
    from straitmq.telemetry import catalog as C

    receiver = OtlpReceiver()
    telemetry = Telemetry("straitmq-broker", "test", receiver.url, export_interval_ms=200)
    try:
        assert telemetry.otlp
        telemetry.observe(C.BROKER_LEADERS, lambda: [(1, {})])  # same scope as the next
        telemetry.fast_histogram(C.BROKER_REQUEST_DURATION, (0.1,)).bind({}).record(0.01)
        wanted = {C.BROKER_LEADERS.name, C.BROKER_REQUEST_DURATION.name}
        wait_for(lambda: wanted <= receiver.names, 10, f"OTLP export of {wanted}")
    finally:
        telemetry.shutdown()
        receiver.close()


# -- a running broker and controller ---------------------------------------------------


@pytest.fixture
def controller_process(tmp_path: Path) -> Iterator[str]:
    """A standalone one-voter controller (it elects itself and becomes active)."""
    port = free_port()
    log = open(tmp_path / "controller.log", "ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "straitmq.controller",
            "--node-id",
            "1001",
            "--voters",
            f"1001@127.0.0.1:{port}",
            "--cluster-id",
            "metrics-test",
            "--data-dir",
            str(tmp_path / "controller"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def active() -> bool:
            try:
                return total(scrape(base), "straitmq_controller_active") == 1
            except OSError:
                return False

        wait_for(active, 20, "the controller to become active")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_controller_process_serves_the_quorum_dashboard(controller_process: str) -> None:
    served = scrape(controller_process)
    check_served(dashboards()["controller-quorum"], served, "a controller process")
    assert total(served, "straitmq_controller_quorum_epoch") >= 1
    assert total(served, "straitmq_controller_quorum_commit_duration_seconds_count") >= 1
    assert "target_info" in served
    service = {ls.get("service_name") for ls, _ in served["target_info"]}
    assert service == {"straitmq-controller"}
    # Which code it runs, as Prometheus' build_info (the controller runs this checkout).
    assert [ls for ls, _ in served["straitmq_build_info"]] == [
        {"version": VERSION, "commit": commit()}
    ]
    # What the QuorumVoterLost and EventLoopStalls alerts read (one voter: itself).
    voters = "straitmq_controller_quorum_voters"
    assert total(served, voters, straitmq_raft_voter_state="reachable") == 1
    assert total(served, voters, straitmq_raft_voter_state="unreachable") == 0
    assert "straitmq_process_event_loop_stalls_total" in served


def test_certificate_expiry_follows_a_rotation(tmp_path: Path) -> None:
    """A listener's straitmq.tls.certificate.expiry is the notAfter of the certificate
    new connections get: rotated files (here to one that expired in 2020) move it."""
    from datetime import UTC, datetime

    from straitmq.security.tls import TlsListener, TlsSettings

    certs = make_certs(tmp_path / "certs")
    keystore = tmp_path / "listener.pem"
    keystore.write_text(Path(certs.path("server.pem")).read_text())
    tls = TlsListener(TlsSettings("SSL", str(keystore), None, None, "none", 100))
    server = x509.load_pem_x509_certificate(Path(certs.path("server.crt")).read_bytes())
    assert tls.not_after == server.not_valid_after_utc.timestamp()
    old = Path(certs.path("old.key")).read_text() + Path(certs.path("old.crt")).read_text()
    keystore.write_text(old)
    assert tls.check()
    assert tls.not_after == datetime(2020, 1, 2, tzinfo=UTC).timestamp()


def test_alerting_metrics_are_served_and_measured(tmp_path: Path) -> None:
    """The broker metrics the alert rules need beyond the dashboards': the log
    directory's free space (statvfs), the expiry of the certificate a TLS listener
    serves, and event-loop stalls, one made here by stopping the process (SIGSTOP) until
    it does not answer, then letting it go on."""
    certs = make_certs(tmp_path / "certs")
    plain, tls = free_port(), free_port()
    props = tmp_path / "server.properties"
    props.write_text(
        f"listeners=PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}\n"
        "inter.broker.listener.name=PLAINTEXT\n"
        f"ssl.keystore.location={certs.path('server.pem')}\n"
    )
    b = BrokerProcess(tmp_path / "data", port=plain, extra_args=["--properties", str(props)])
    b.start()
    try:
        served = scrape(b.http)
        log_dir = str((tmp_path / "data" / "logs").resolve())
        st = os.statvfs(log_dir)
        capacity = "straitmq_broker_log_dir_capacity_bytes"
        usable = "straitmq_broker_log_dir_usable_bytes"
        assert [ls for ls, _ in served[capacity]] == [{"straitmq_log_dir": log_dir}]
        assert total(served, capacity) == st.f_blocks * st.f_frsize
        # Other processes write to the same file system meanwhile: close, not equal.
        assert abs(total(served, usable) - st.f_bavail * st.f_frsize) < 256 * 2**20
        assert 0 < total(served, usable) <= total(served, capacity)

        crt = x509.load_pem_x509_certificate(Path(certs.path("server.crt")).read_bytes())
        expiry = "straitmq_tls_certificate_expiry_seconds"
        assert total(served, expiry, straitmq_listener="SSL") == pytest.approx(
            crt.not_valid_after_utc.timestamp()
        )
        assert {ls["straitmq_listener"] for ls, _ in served[expiry]} == {"SSL"}

        stalls = "straitmq_process_event_loop_stalls_total"
        stalled = "straitmq_process_event_loop_stalled_seconds_total"
        before = scrape(b.http)
        assert b.proc is not None
        os.kill(b.proc.pid, signal.SIGSTOP)
        try:

            def unresponsive() -> bool:
                try:
                    urllib.request.urlopen(f"{b.http}/healthz", timeout=0.5).read()
                except OSError:  # timed out: the loop has been stopped for 0.5 s at least
                    return True
                return False

            wait_for(unresponsive, 10, "the stopped broker to stop answering")
        finally:
            os.kill(b.proc.pid, signal.SIGCONT)

        def counted() -> bool:
            now = scrape(b.http)
            return (
                total(now, stalls) >= total(before, stalls) + 1
                # Stopped for 0.5 s at least, of which the heartbeat (due up to 0.1 s
                # after the stop) is late by 0.4 s at least.
                and total(now, stalled) >= total(before, stalled) + 0.4
            )

        def counts() -> str:
            now = scrape(b.http)
            return f"stalls {total(now, stalls)}, {total(now, stalled)} s; before: " + (
                f"{total(before, stalls)}, {total(before, stalled)} s"
            )

        wait_for(counted, 10, "the stall to be counted", detail=counts)
    finally:
        b.stop()


def test_dashboards_are_backed_by_live_metrics_that_move(
    broker_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    receiver = OtlpReceiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "500")
    b = None
    try:
        b = broker_factory()
        b.create_topic("orders", partitions=2)
        before = scrape(b.http)
        in_before = total(
            before,
            "straitmq_broker_topic_io_bytes_total",
            messaging_destination_name="orders",
            network_io_direction="receive",
        )

        producer = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})

        def produce(n: int, start: int) -> None:
            for i in range(start, start + n):
                producer.produce("orders", key=str(i).encode(), value=b"v" * 100)
            assert producer.flush(15) == 0

        # A produce raises bytes in (and messages in, and the Produce request count).
        produce(200, 0)
        after = scrape(b.http)
        io = "straitmq_broker_topic_io_bytes_total"
        orders_in = {"messaging_destination_name": "orders", "network_io_direction": "receive"}
        assert total(after, io, **orders_in) >= in_before + 200 * 100
        assert total(after, "straitmq_broker_topic_messages_total", **orders_in) == 200
        assert total(
            after, "straitmq_broker_request_duration_seconds_count", kafka_api_name="Produce"
        ) > total(
            before, "straitmq_broker_request_duration_seconds_count", kafka_api_name="Produce"
        )

        # A consumer reads everything and commits: lag 0, bytes and messages out.
        consumer = Consumer(
            {
                "bootstrap.servers": b.bootstrap,
                "group.id": "billing",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe(["orders"])
        got = 0
        deadline = time.monotonic() + 30
        while got < 200 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                got += 1
        assert got == 200
        consumer.commit(asynchronous=False)
        consumed = scrape(b.http)
        lag = "straitmq_consumer_group_lag"
        billing = {"messaging_consumer_group_name": "billing"}
        assert len([1 for ls, _ in consumed[lag] if ls.items() >= billing.items()]) == 2
        assert total(consumed, lag, **billing) == 0
        assert (
            total(consumed, "straitmq_consumer_group_members", **billing) == 1
        )  # still in the group
        orders_out = {"messaging_destination_name": "orders", "network_io_direction": "transmit"}
        assert total(consumed, io, **orders_out) >= 200 * 100
        assert total(consumed, "straitmq_broker_topic_messages_total", **orders_out) >= 200
        consumer.close()

        # The consumer is gone; producing goes on: the lag rises by what was produced.
        produce(150, 200)
        stopped = scrape(b.http)
        assert total(stopped, lag, **billing) == 150
        state = "straitmq_consumer_group_state"
        assert {ls["straitmq_consumer_group_state"] for ls, _ in stopped[state]} == {"Empty"}

        # A fetch past the log end is an OFFSET_OUT_OF_RANGE error, counted by code.
        stray = Consumer(
            {
                "bootstrap.servers": b.bootstrap,
                "group.id": "stray",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        stray.assign([TopicPartition("orders", 0, 1_000_000)])
        errors = "straitmq_broker_request_errors_total"
        out_of_range = {"kafka_api_name": "Fetch", "error_type": "OFFSET_OUT_OF_RANGE"}

        def counted() -> bool:
            stray.poll(0.2)
            return total(scrape(b.http), errors, **out_of_range) >= 1

        wait_for(counted, 15, "the OFFSET_OUT_OF_RANGE error to be counted")
        stray.close()

        # A committed transaction moves the coordinator's metrics.
        txn = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "metrics"})
        txn.init_transactions(30)
        txn.begin_transaction()
        txn.produce("orders", value=b"in a transaction")
        txn.commit_transaction(30)
        completed = "straitmq_broker_transactions_completed_total"

        def committed() -> bool:
            return total(scrape(b.http), completed, straitmq_transaction_outcome="commit") == 1

        wait_for(committed, 15, "the committed transaction to be counted")

        # Every metric of every dashboard (the operator's aside) exists, with its labels.
        final = scrape(b.http)
        # (The quotas board's series exist once a client is throttled: test_quotas.py.)
        for name, board in dashboards().items():
            if name not in ("operator", "quotas"):
                check_served(board, final, "a combined broker node")
        assert {ls.get("service_name") for ls, _ in final["target_info"]} == {"straitmq-broker"}
        assert total(final, "straitmq_build_info", version=VERSION, commit=commit()) == 1

        # The same metrics went out over OTLP, the request-path histogram included.
        wanted = {
            "straitmq.broker.topic.io",
            "straitmq.broker.request.duration",
            "straitmq.consumer_group.lag",
            "straitmq.controller.quorum.commit.duration",
        }
        wait_for(lambda: wanted <= receiver.names, 15, f"OTLP export of {wanted}")
        assert receiver.services == {"straitmq-broker"}
    finally:
        if b is not None:
            b.stop()  # while the receiver still answers its last export
        receiver.close()


def test_cluster_metrics_come_from_the_right_processes(tmp_path: Path) -> None:
    """One controller process and two brokers (replication factor 2): replica fetches,
    observers' lag on the quorum leader, and consumer lag summed over brokers."""
    from confluent_kafka import Consumer, Producer
    from straitmq.cli.local_cluster import LocalCluster

    cluster = LocalCluster(
        str(tmp_path / "cluster"),
        controllers=1,
        brokers=2,
        kafka_base=None,
        http_base=None,
        controller_base=None,
        broker_args=[
            *("--heartbeat-interval-ms", "300"),
            *("--default-replication-factor", "2"),
            *("--offsets-topic-replication-factor", "2"),
            *("--group-initial-rebalance-delay-ms", "0"),
        ],
        python=sys.executable,
    )
    cluster.start()
    try:
        controller = f"http://127.0.0.1:{cluster.controllers[1001].http_port}"
        brokers = [f"http://127.0.0.1:{n.http_port}" for n in cluster.brokers.values()]
        req = urllib.request.Request(
            f"{brokers[0]}/api/v1/topics",
            data=json.dumps({"name": "events", "partitions": 4, "replication_factor": 2}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=10).read()
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})

        def produce(n: int) -> None:
            for i in range(n):  # every partition gets some, so the group commits all four
                producer.produce("events", value=b"e" * 50, partition=i % 4)
            assert producer.flush(20) == 0

        produce(300)
        consumer = Consumer(
            {
                "bootstrap.servers": cluster.bootstrap,
                "group.id": "audit",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe(["events"])
        got, deadline = 0, time.monotonic() + 30
        while got < 300 and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and not m.error():
                got += 1
        assert got == 300
        consumer.commit(asynchronous=False)
        consumer.close()
        produce(120)

        def lag() -> float:
            return sum(
                total(
                    scrape(b), "straitmq_consumer_group_lag", messaging_consumer_group_name="audit"
                )
                for b in brokers
            )

        # Followers learn the high watermark with their next fetch: wait for it.
        wait_for(lambda: lag() == 120, 10, "the group's lag to reach 120 on the brokers")

        on_brokers = [scrape(b) for b in brokers]
        quorum = scrape(controller)
        assert sum(total(s, "straitmq_broker_replication_io_bytes_total") for s in on_brokers)
        assert sum(
            total(
                s, "straitmq_broker_request_duration_seconds_count", kafka_api_name="FetchFollower"
            )
            for s in on_brokers
        )
        assert sum(total(s, "straitmq_broker_leaders") for s in on_brokers) == 4 + 16
        assert sum(total(s, "straitmq_broker_partitions_under_replicated") for s in on_brokers) == 0
        assert total(quorum, "straitmq_controller_partitions") == 4 + 16
        assert total(quorum, "straitmq_controller_brokers", straitmq_broker_state="active") == 2
        observers = {
            ls["straitmq_node_id"]
            for ls, _ in quorum["straitmq_controller_quorum_follower_lag"]
            if ls["straitmq_raft_replica_kind"] == "observer"
        }
        assert observers == {"1", "2"}
        for s in on_brokers:  # brokers of a cluster carry no controller metrics
            assert not any(name.startswith("straitmq_controller_") for name in s)
        check_served(dashboards()["controller-quorum"], quorum, "the controller process")
    finally:
        cluster.stop()


def test_a_scrape_runs_the_callbacks_off_the_event_loop() -> None:
    """GET /metrics renders in a worker thread: a broker's scrape walks every partition,
    and on the event loop every Kafka request waited for it."""
    import asyncio

    from aiohttp import web

    from straitmq.telemetry import Telemetry
    from straitmq.telemetry import catalog as C

    telemetry = Telemetry("straitmq-broker", "test")
    seen: list[str] = []

    def partitions() -> list[tuple[int, dict]]:
        seen.append(threading.current_thread().name)
        return [(3, {})]

    telemetry.observe(C.BROKER_PARTITIONS, partitions)

    async def serve_and_scrape() -> Scrape:
        app = web.Application()
        telemetry.add_routes(app)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:  # the client in a thread of its own: the loop must be free to answer
            return await asyncio.to_thread(scrape, f"http://127.0.0.1:{port}")
        finally:
            await runner.cleanup()

    try:
        served = asyncio.run(serve_and_scrape())
    finally:
        telemetry.shutdown()
    assert total(served, "straitmq_broker_partitions") == 3
    assert seen and threading.main_thread().name not in seen
