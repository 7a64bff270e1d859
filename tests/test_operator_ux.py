"""What the operator shows a person: its log lines, its conditions, its first scrape.

In-process, with a stand-in for the Kubernetes API: no cluster, no broker.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
from typing import Any

import kopf
import pytest
from kubernetes.client.rest import ApiException
from kubernetes.dynamic.exceptions import api_exception
from prometheus_client.parser import text_string_to_metric_families
from straitmq.operator import handlers, log_format, render
from straitmq.operator import names as n
from straitmq.operator.cluster import ClusterReconciler
from straitmq.operator.conditions import get_condition
from straitmq.operator.kube import explain
from straitmq.operator.spec import parse
from test_metrics import check_served, dashboards

from straitmq import logs
from straitmq.telemetry import Telemetry
from straitmq.telemetry.operator_metrics import ERROR_TYPES, KINDS, OperatorMetrics

UID = "6f1c2d4e-0000-4000-8000-00000000abcd"
HEADERS = {
    "Audit-Id": "0f6c4a51-8c39-4c1e-9d7e-3f1b8f0f3b11",
    "Cache-Control": "no-cache, private",
    "Content-Type": "application/json",
    "X-Kubernetes-Pf-Flowschema-Uid": "a5c1d2e3-1111-2222-3333-444455556666",
    "X-Kubernetes-Pf-Prioritylevel-Uid": "b6d2e3f4-7777-8888-9999-000011112222",
    "Date": "Mon, 24 Nov 2025 11:00:00 GMT",
}
FORBIDDEN = (
    'StatefulSet.apps "demo-broker" is invalid: spec: Forbidden: updates to statefulset '
    "spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', "
    "'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"
)


def mqcluster(size: str = "1Gi") -> dict[str, Any]:
    return {
        "apiVersion": n.API_VERSION,
        "kind": "MQCluster",
        "metadata": {
            "name": "demo",
            "namespace": "prod",
            "uid": UID,
            "generation": 2,
            # Nothing listens there: the admin API is unreachable at once.
            "annotations": {n.ADMIN_URL_ANNOTATION: "http://127.0.0.1:1"},
        },
        "spec": {"image": "straitmq:1", "brokers": {"replicas": 3, "storage": {"size": size}}},
        "status": {"phase": "Ready"},
    }


class Response:
    """What the Kubernetes client's REST layer hands an ApiException."""

    def __init__(self, status: int, reason: str, body: dict[str, Any]) -> None:
        self.status, self.reason = status, reason
        self.data = json.dumps(body).encode()
        self.headers = HEADERS


def refusal(message: str = FORBIDDEN, status: int = 422) -> ApiException:
    """The 422 the dynamic client raises (with headers) when a StatefulSet apply is refused."""
    reason = {422: "Unprocessable Entity", 403: "Forbidden"}[status]
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Invalid",
        "code": status,
        "details": {
            "name": "demo-broker",
            "group": "apps",
            "kind": "StatefulSet",
            "causes": [
                {
                    "reason": "FieldValueForbidden",
                    "field": "spec",
                    "message": "Forbidden: updates to statefulset spec for fields other than ...",
                },
            ],
        },
    }
    try:
        raise ApiException(http_resp=Response(status, reason, body))
    except ApiException as e:
        return api_exception(e)


class FakeKube:
    """The StatefulSets as they were created with 1Gi volumes; applies of anything else pass,
    a StatefulSet whose claim templates differ is refused as the API server refuses it."""

    def __init__(self, stored_size: str = "1Gi") -> None:
        spec = parse(mqcluster(stored_size))
        self.stored = {
            o["metadata"]["name"]: o for o in render.objects(spec, 3) if o["kind"] == "StatefulSet"
        }
        self.patched: list[dict[str, Any]] = []

    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> Any:
        return self.stored.get(name) if kind == "StatefulSet" else None

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj["kind"] == "StatefulSet":
            have = self.stored[obj["metadata"]["name"]]["spec"]["volumeClaimTemplates"]
            if have != obj["spec"]["volumeClaimTemplates"]:
                raise refusal()
        return obj

    async def list_objects(
        self, api_version: str, kind: str, namespace: str, selector: str
    ) -> list[dict[str, Any]]:
        return []  # no external listeners: none of their Services or Ingresses

    async def get_custom(self, plural: str, namespace: str, name: str) -> Any:
        return mqcluster("2Gi")

    async def patch_status(self, plural: str, ns: str, name: str, status: Any) -> None:
        self.patched.append(status)


def one_line(formatter: logging.Formatter, record: logging.LogRecord) -> dict[str, Any]:
    line = formatter.format(record)
    assert "\n" not in line
    return json.loads(line)


# --- log lines ------------------------------------------------------------------------


def kopf_record(msg: str, level: int = logging.INFO) -> logging.LogRecord:
    """A record as kopf's per-object logger makes it: its settings and the object ref."""
    record = logging.makeLogRecord(
        {
            "name": "kopf.objects",
            "levelno": level,
            "levelname": logging.getLevelName(level),
            "msg": msg,
        }
    )
    ref = {
        "apiVersion": n.API_VERSION,
        "kind": "MQCluster",
        "name": "demo",
        "uid": UID,
        "namespace": "prod",
    }
    record.__dict__.update(settings=kopf.OperatorSettings(), k8s_skip=True, k8s_ref=ref)
    return record


def test_kopf_settings_never_reach_a_log_line() -> None:
    record = kopf_record("Handler 'wake' succeeded.")
    assert len(str(record.__dict__["settings"])) > 1000  # what every line used to carry
    # StraitMQ's formatter (brokers, controllers) writes only its type...
    assert json.loads(logs.JsonFormatter().format(record))["settings"] == "<OperatorSettings>"
    # ...and the operator's drops kopf's extras altogether.
    line = log_format.JsonFormatter().format(record)
    assert len(line) < 250, line
    rec = json.loads(line)
    assert rec.keys() == {"ts", "level", "logger", "msg", "object"}
    assert rec["object"] == "MQCluster/prod/demo" and rec["msg"] == "Handler 'wake' succeeded."


class _Big:
    def __str__(self) -> str:
        return "x" * 5000


def test_plain_extras_stay_and_big_objects_shrink_to_their_type() -> None:
    record = logging.makeLogRecord(
        {
            "name": "straitmq.operator",
            "levelno": logging.INFO,
            "levelname": "INFO",
            "msg": "event",
            "object": "Topic/prod/orders",
            "reason": "Created",
            "n": 3,
            "nested": {"a": [1, 2]},
            "big": _Big(),
        }
    )
    rec = one_line(log_format.JsonFormatter(), record)
    assert rec["object"] == "Topic/prod/orders" and rec["reason"] == "Created" and rec["n"] == 3
    assert rec["nested"] == {"a": [1, 2]} and rec["big"] == "<_Big>"
    assert isinstance(record.__dict__["big"], _Big)  # the record itself is left as it was


def test_exceptions_keep_their_traceback() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    rec = one_line(log_format.JsonFormatter(), record)
    assert "RuntimeError: boom" in rec["exc"]


def test_watch_handler_success_is_debug_and_other_lines_stay() -> None:
    """Through kopf's own per-object logger, as its watch-event handlers log."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(log_format.JsonFormatter())
    target = logging.getLogger("kopf.objects")
    quiet = log_format.QuietWatchSuccess()
    level, propagate = target.level, target.propagate
    target.addHandler(handler)
    target.addFilter(quiet)
    target.propagate = False
    body = kopf.Body(mqcluster())
    try:
        local = kopf.LocalObjectLogger(body=body, settings=kopf.OperatorSettings())
        for lvl in (logging.INFO, logging.DEBUG):
            target.setLevel(lvl)
            local.info("Handler 'wake' succeeded.")
            local.warning("Handler 'wake' failed temporarily: nope")
    finally:
        target.removeHandler(handler)
        target.removeFilter(quiet)
        target.setLevel(level)
        target.propagate = propagate
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [(x["level"], x["msg"]) for x in lines] == [
        ("warning", "Handler 'wake' failed temporarily: nope"),
        ("debug", "Handler 'wake' succeeded."),
        ("warning", "Handler 'wake' failed temporarily: nope"),
    ]
    assert all("settings" not in x and x["object"] == "MQCluster/prod/demo" for x in lines)


# --- conditions -----------------------------------------------------------------------


def test_api_errors_are_one_line_without_headers() -> None:
    e = refusal("topics.straitmq.io is forbidden: User cannot patch resource", status=403)
    assert "Audit-Id" in str(e)  # the client's own text
    text = explain(e)
    assert text == (
        "the Kubernetes API refused a request (HTTP 403 Forbidden): topics.straitmq.io is "
        "forbidden: User cannot patch resource; grant the operator's service account that "
        "permission (the Helm chart's RBAC)"
    )
    plain = ApiException(status=503, reason="Service Unavailable")
    assert explain(plain) == (
        "the Kubernetes API refused a request (HTTP 503 Service Unavailable); "
        "the API server is unavailable; the operator retries"
    )
    assert explain(TimeoutError()) == "TimeoutError"
    assert explain(ValueError("bad\nvalue")) == "ValueError: bad value"


def test_refused_storage_change_is_a_sentence_saying_what_to_do() -> None:
    events: list[tuple[str, str, str]] = []
    kube = FakeKube("1Gi")
    reconciler = ClusterReconciler(kube, lambda *e: events.append(e), admin_timeout_s=2)  # type: ignore[arg-type]
    status = asyncio.run(reconciler.reconcile(mqcluster("2Gi")))
    c = get_condition(status["conditions"], "Degraded")
    assert c is not None and c["status"] == "True" and c["reason"] == "StorageImmutable"
    assert c["message"] == (
        "the storage of an existing MQCluster cannot be changed in place (Kubernetes does "
        "not allow StatefulSet demo-broker's volume claims to change from 1Gi to 2Gi): "
        "revert spec.brokers.storage.size to 1Gi; to grow the volumes, resize each "
        "PersistentVolumeClaim data-demo-broker-N instead if its StorageClass allows volume "
        "expansion"
    )
    assert "HTTP response" not in json.dumps(status)
    assert status["phase"] == "Degraded"
    assert events == [("Warning", "StorageImmutable", c["message"])]
    # The next pass (the status written back) repeats no Event.
    again = asyncio.run(reconciler.reconcile({**mqcluster("2Gi"), "status": status}))
    assert get_condition(again["conditions"], "Degraded") == c and len(events) == 1


def test_a_refused_storage_change_still_removes_deleted_topics_and_users(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One refused field stops what depends on the spec, not unrelated work: with the
    storage change refused, what deleted Topic and User resources left in the cluster is
    still removed in the same pass (a `kubectl delete topic` used to wait for the revert)."""
    from straitmq.operator import cluster as cluster_module

    swept: list[str] = []

    async def reachable(self: Any, admin: Any) -> Any:
        return cluster_module.Observed(cluster={"brokers": []}, topics=[])

    async def sweep(kube: Any, admin: Any, body: dict[str, Any], emit: Any) -> None:
        swept.append(body["metadata"]["name"])

    monkeypatch.setattr(ClusterReconciler, "_observe", reachable)
    monkeypatch.setattr(cluster_module.managed, "sweep", sweep)
    reconciler = ClusterReconciler(FakeKube("1Gi"), lambda *e: None, admin_timeout_s=2)  # type: ignore[arg-type]
    status = asyncio.run(reconciler.reconcile(mqcluster("2Gi")))
    c = get_condition(status["conditions"], "Degraded")
    assert c is not None and c["reason"] == "StorageImmutable"
    assert swept == ["demo"]


def test_a_failed_pass_becomes_a_condition_without_headers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The daemon loop: any exception is a condition (and an Event, and a count)."""
    kube = FakeKube()
    telemetry = Telemetry("straitmq-operator", "test")
    posted: list[dict[str, Any]] = []
    monkeypatch.setitem(handlers._state, "kube", kube)
    monkeypatch.setitem(handlers._state, "metrics", OperatorMetrics(telemetry))
    monkeypatch.setattr(handlers, "BUSY_INTERVAL_S", 0.01)
    monkeypatch.setattr(handlers.kopf, "exception", lambda body, **kw: posted.append(kw))

    async def reconcile(body: dict[str, Any]) -> dict[str, Any]:
        raise refusal("the object has been modified", status=422)

    class Stopped:
        def __bool__(self) -> bool:
            return bool(kube.patched)

    try:
        body = kopf.Body(mqcluster())
        asyncio.run(handlers._loop("MQCluster", n.CLUSTERS, body, UID, Stopped(), reconcile))
        text = telemetry.render().decode()
    finally:
        telemetry.shutdown()
    want = (
        "the Kubernetes API refused a request (HTTP 422 Unprocessable Entity): the object has "
        "been modified; correct the field the message names"
    )
    (status,) = kube.patched
    for type_ in ("Ready", "Degraded"):
        c = get_condition(status["conditions"], type_)
        assert c is not None and c["reason"] == "ReconcileError" and c["message"] == want
    assert posted == [{"reason": "ReconcileError", "message": want}]
    assert (
        served(text)["straitmq_operator_reconcile_errors_total"][
            (("error_type", "ApiException"), ("straitmq_resource_kind", "MQCluster"))
        ]
        == 1
    )


# --- metrics --------------------------------------------------------------------------


def served(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(
                sorted(
                    (k, v)
                    for k, v in s.labels.items()
                    if k in ("error_type", "straitmq_resource_kind", "straitmq_reconcile_outcome")
                )
            )
            out.setdefault(s.name, {})[labels] = s.value
    return out


def test_error_counters_start_at_zero_for_every_known_label_set() -> None:
    telemetry = Telemetry("straitmq-operator", "test")
    try:
        OperatorMetrics(telemetry)
        text = telemetry.render().decode()
    finally:
        telemetry.shutdown()
    errors = served(text)["straitmq_operator_reconcile_errors_total"]
    want = {(("error_type", e), ("straitmq_resource_kind", k)) for k in KINDS for e in ERROR_TYPES}
    assert set(errors) == want and not any(errors.values()), errors
    # Every counter panel of the operator dashboard, the error panels included, has its
    # series (the duration histogram has none until a first pass: it has no zero).
    scrape: dict = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            scrape.setdefault(s.name, []).append((s.labels, s.value))
    board = dashboards()["operator"]
    counters = [p for p in board["panels"] if "_total" in json.dumps(p.get("targets"))]
    assert any("reconcile_errors_total" in json.dumps(p["targets"]) for p in counters)
    check_served({**board, "panels": counters}, scrape, "a fresh operator")


@pytest.mark.parametrize(
    ("exc", "name"),
    [
        (refusal(), "ApiException"),  # UnprocessibleEntityError, from the dynamic client
        (ApiException(status=409), "ApiException"),
        (TimeoutError(), "TimeoutError"),
        (ConnectionRefusedError(), "OSError"),
        (KeyError("x"), "KeyError"),  # unforeseen: its own name
    ],
)
def test_errors_count_under_a_known_type(exc: Exception, name: str) -> None:
    telemetry = Telemetry("straitmq-operator", "test")
    try:
        metrics = OperatorMetrics(telemetry)
        with pytest.raises(type(exc)), metrics.reconcile("Topic"):
            raise exc
        errors = served(telemetry.render().decode())["straitmq_operator_reconcile_errors_total"]
    finally:
        telemetry.shutdown()
    assert errors[(("error_type", name), ("straitmq_resource_kind", "Topic"))] == 1
    assert sum(errors.values()) == 1
