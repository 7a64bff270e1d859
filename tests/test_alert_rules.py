"""The alert rules (charts/straitmq/alerts/straitmq-rules.yaml), checked with Prometheus's
own tools, built from the Go module proxy by scripts/fetch-prometheus.sh into
.cache/prometheus/bin (without them these tests fail rather than skip).

- `promtool check rules`, and `promtool test rules` with the unit tests checked in beside
  the rules (straitmq-rules.test.yaml): every alert fires when it should, with its labels
  and expanded annotations, and stays silent when it should not.
- Every metric a rule reads is one the catalog declares (the catalog's instruments are
  served: tests/test_metrics.py), every alert has its labels, annotations and a line in
  README.md's "Alert runbook".
- The chart's PrometheusRule (helm template only, no Kubernetes) is the plain file.
- A real Prometheus scraping a real 3-broker cluster with the rules loaded: a SIGKILLed
  broker holding replicas of an RF=3 topic makes the under-replicated (and fenced-broker)
  alert fire, and its restart resolves it; so does a killed controller voter the
  lost-voter alert.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_support import Cluster, cluster_factory, wait_for
from conftest import ROOT, free_port

from straitmq.telemetry import catalog as C

BIN = ROOT / ".cache" / "prometheus" / "bin"
ALERTS = ROOT / "charts" / "straitmq" / "alerts"
RULES = ALERTS / "straitmq-rules.yaml"
RULE_TESTS = ALERTS / "straitmq-rules.test.yaml"
HELM = ROOT / ".cache" / "k8s" / "bin" / "helm"
CHART = ROOT / "charts" / "straitmq"
METRIC = re.compile(r"\b(straitmq_[a-z0-9_]+)")
SELECTOR = re.compile(r"\b(straitmq_[a-z0-9_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)")
LABEL_CONTEXT = re.compile(r"\{[^}]*\}|" + GROUPING.pattern)
TARGET_LABELS = {"job", "instance", "namespace"}  # Prometheus's (and the ServiceMonitor's)
# The list of what must wake someone, each a rule of the file.
EXPECTED_ALERTS = {
    "StraitMQUnderReplicatedPartitions",
    "StraitMQOfflinePartitions",
    "StraitMQUnderMinIsrPartitions",
    "StraitMQNoActiveController",
    "StraitMQQuorumVoterLost",
    "StraitMQBrokerFenced",
    "StraitMQLogDirNearlyFull",
    "StraitMQLogDirFull",
    "StraitMQConsumerGroupLagGrowing",
    "StraitMQRequestErrorRate",
    "StraitMQClientThrottled",
    "StraitMQEventLoopStalls",
    "StraitMQCertificateExpiringSoon",
    "StraitMQCertificateExpiring",
    "StraitMQOperatorReconcileErrors",
}


def tool(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(
            f"{path.relative_to(ROOT)} is missing: run scripts/fetch-prometheus.sh (it builds "
            "prometheus and promtool with `go install`) and run the tests again"
        )
    return str(path)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=ALERTS
    )


def rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def prometheus_names(inst: C.Instrument) -> set[str]:
    """The names the OpenTelemetry Prometheus exporter gives an instrument's series."""
    base = inst.name.replace(".", "_")
    unit = {"By": "_bytes", "s": "_seconds"}.get(inst.unit, "")
    if unit and not base.endswith(unit):
        base += unit
    if inst.kind in (C.HISTOGRAM, C.FAST_HISTOGRAM):
        return {base + s for s in ("_bucket", "_count", "_sum")}
    if inst.kind in (C.COUNTER, C.OBSERVABLE_COUNTER):
        return {base + "_total"}
    return {base}


# -- promtool ---------------------------------------------------------------------------


def test_promtool_checks_the_rules() -> None:
    out = promtool("check", "rules", RULES.name)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules())} rules found" in out.stdout


def test_promtool_unit_tests_pass() -> None:
    out = promtool("test", "rules", RULE_TESTS.name)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else silent).add(check["alertname"])
    names = {r["alert"] for r in rules()}
    assert names == EXPECTED_ALERTS
    assert names - fires == set(), "alerts no unit test sees firing"
    assert names - silent == set(), "alerts no unit test expects to stay silent"


def test_a_broken_expectation_fails_the_unit_tests(tmp_path: Path) -> None:
    """promtool really compares: the same tests, one expected label changed, fail."""
    doc = yaml.safe_load(RULE_TESTS.read_text())
    firing = next(c for t in doc["tests"] for c in t["alert_rule_test"] if c["exp_alerts"])
    firing["exp_alerts"][0]["exp_labels"]["severity"] = "info"
    doc["rule_files"] = [str(RULES)]
    broken = tmp_path / "broken.test.yaml"
    broken.write_text(yaml.safe_dump(doc))
    out = promtool("test", "rules", str(broken))
    assert out.returncode != 0 and "FAILED" in out.stdout + out.stderr


# -- the rules against the product ---------------------------------------------------


def test_rules_read_only_metrics_and_labels_the_catalog_declares() -> None:
    labels = {
        n: {a.replace(".", "_") for a in inst.attributes} | TARGET_LABELS
        for inst in C.ALL
        for n in prometheus_names(inst)
    }
    for r in rules():
        expr, name = r["expr"], r["alert"]
        names = set(METRIC.findall(LABEL_CONTEXT.sub(" ", expr)))
        assert names, f"{name} reads no StraitMQ metric"
        assert names <= set(labels), f"{name}: not in the catalog: {names - set(labels)}"
        for metric, body in SELECTOR.findall(expr):
            assert set(MATCHER.findall(body)) <= labels[metric], f"{name}: {metric}{{{body}}}"
        known = set().union(*(labels[m] for m in names))
        for group in GROUPING.findall(expr):
            used = {x.strip() for x in group.split(",") if x.strip()}
            assert used <= known, f"{name}: no metric of it has labels {used - known}"


def test_every_alert_is_labelled_annotated_and_in_the_readme_runbook() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Alert runbook", 1)[1].split("\n#", 1)[0]
    for r in rules():
        name = r["alert"]
        assert r["labels"]["severity"] in {"warning", "critical"}, name
        assert set(r["annotations"]) == {"summary", "description", "runbook"}, name
        assert all(v.strip() for v in r["annotations"].values()), name
        assert "for" in r, f"{name}: no `for:` (one bad scrape would page)"
        lines = [ln for ln in section.splitlines() if ln.startswith(f"- `{name}` (")]
        assert len(lines) == 1, f"{name}: needs one line in README's Alert runbook"


# -- the chart ------------------------------------------------------------------------------


def helm_template(*args: str) -> list[dict[str, Any]]:
    if not HELM.exists():
        pytest.fail(f"{HELM.relative_to(ROOT)} is missing: run scripts/fetch-k8s.sh")
    out = subprocess.run(
        [str(HELM), "template", "sm", str(CHART), "--namespace", "strait", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def prometheus_rules(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == "PrometheusRule"]


def test_chart_prometheus_rule_is_the_plain_rule_file() -> None:
    crd = "monitoring.coreos.com/v1/PrometheusRule"
    # Auto: only where the Prometheus operator's CRD is served.
    assert prometheus_rules(helm_template()) == []
    [pr] = prometheus_rules(helm_template("--api-versions", crd))
    assert pr["apiVersion"] == "monitoring.coreos.com/v1"
    assert pr["metadata"]["namespace"] == "strait"
    assert pr["metadata"]["labels"]["app.kubernetes.io/part-of"] == "straitmq"
    assert pr["spec"] == yaml.safe_load(RULES.read_text())
    # Forced either way by the value; labels for the Prometheus's ruleSelector.
    assert (
        prometheus_rules(
            helm_template("--api-versions", crd, "--set", "metrics.prometheusRule.enabled=false")
        )
        == []
    )
    [forced] = prometheus_rules(
        helm_template(
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "metrics.prometheusRule.labels.release=kube-prometheus-stack",
            "--set",
            "metrics.prometheusRule.namespace=monitoring",
        )
    )
    assert forced["spec"] == pr["spec"]
    assert forced["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert forced["metadata"]["namespace"] == "monitoring"


def test_packaged_chart_holds_the_rules_but_not_their_unit_tests(tmp_path: Path) -> None:
    if not HELM.exists():
        pytest.fail(f"{HELM.relative_to(ROOT)} is missing: run scripts/fetch-k8s.sh")
    out = subprocess.run(
        [str(HELM), "package", str(CHART), "--destination", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    [tgz] = tmp_path.glob("straitmq-*.tgz")
    with tarfile.open(tgz) as tar:
        names = {n for n in tar.getnames() if n.startswith("straitmq/alerts/")}
        member = tar.extractfile("straitmq/alerts/straitmq-rules.yaml")
        assert member is not None and member.read() == RULES.read_bytes()
    assert names == {"straitmq/alerts/straitmq-rules.yaml"}


# -- a real Prometheus, a real cluster ---------------------------------------------------------

# The live copy of the rules holds alerts this long instead of the shipped 1-15 minutes: the
# expressions are the shipped ones, only `for:` is shorter, so that the test waits seconds
# (the shipped `for:` values are checked by the promtool unit tests above). Prometheus
# scrapes and evaluates every second for the same reason.
LIVE_FOR = "5s"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Any]:
    yield from cluster_factory(tmp_path)


def static_scrapes(cluster: Cluster) -> list[dict[str, Any]]:
    """Local processes: one job for the brokers, one for the controllers."""
    targets = {
        "straitmq-brokers": cluster.brokers.values(),
        "straitmq-controllers": cluster.controllers.values(),
    }
    return [
        {
            "job_name": job,
            "scrape_timeout": "1s",
            "static_configs": [{"targets": [f"{n.host}:{n.http_port}" for n in nodes]}],
        }
        for job, nodes in targets.items()
    ]


class Prometheus:
    """A real Prometheus with the shipped rules, their `for:` shortened to LIVE_FOR,
    scraping and evaluating every second."""

    def __init__(self, tmp_path: Path, scrape_configs: list[dict[str, Any]]) -> None:
        live = copy.deepcopy(yaml.safe_load(RULES.read_text()))
        for group in live["groups"]:
            for rule in group["rules"]:
                rule["for"] = LIVE_FOR
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump(live))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp_path / "rules.yaml")],
            "scrape_configs": scrape_configs,
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(tmp_path / "prometheus.log", "ab")
        self.proc = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=5) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def alerts(self, name: str) -> list[dict[str, Any]]:
        return [a for a in self.get("/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == name]

    def firing(self, name: str) -> bool:
        return any(a["state"] == "firing" for a in self.alerts(name))

    def alive(self) -> None:
        assert self.proc.poll() is None, f"prometheus exited with {self.proc.returncode}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def test_killed_broker_and_voter_fire_their_alerts_in_a_real_prometheus(
    tmp_path: Path, cluster: Any
) -> None:
    c: Cluster = cluster()
    c.create_topic("orders", partitions=3, rf=3, min_isr=2)
    prom = Prometheus(tmp_path, static_scrapes(c))
    try:
        urp = "StraitMQUnderReplicatedPartitions"

        def scraping() -> bool:
            targets = prom.get("/api/v1/targets")["activeTargets"]
            loaded = {r["name"] for g in prom.get("/api/v1/rules")["groups"] for r in g["rules"]}
            series = prom.get("/api/v1/query?query=straitmq_broker_partitions_under_replicated")
            return (
                len(targets) == 6
                and all(t["health"] == "up" for t in targets)
                and loaded == EXPECTED_ALERTS
                and len(series["result"]) == 3
            )

        wait_for(
            scraping,
            60,
            "Prometheus to scrape all six nodes with the rules loaded",
            check=prom.alive,
            ignore=(OSError,),
        )
        assert prom.alerts(urp) == []  # a healthy cluster

        victim = 2  # with RF=3 on three brokers, every broker holds a replica of each
        t_kill = time.monotonic()
        c.brokers[victim].kill9()
        # Pending: the expression holds (the detection time); firing: held for `for:`.
        wait_for(lambda: prom.alerts(urp), 60, f"{urp} pending", check=prom.alive, every=0.2)
        to_pending = time.monotonic() - t_kill
        wait_for(lambda: prom.firing(urp), 90, f"{urp} to fire", check=prom.alive, every=0.2)
        to_firing = time.monotonic() - t_kill
        firing = [a for a in prom.alerts(urp) if a["state"] == "firing"]
        assert {a["labels"]["job"] for a in firing} == {"straitmq-brokers"}
        assert all(a["labels"]["severity"] == "warning" for a in firing)
        victim_target = f"{c.brokers[victim].host}:{c.brokers[victim].http_port}"
        assert victim_target not in {a["labels"]["instance"] for a in firing}
        # The active controller fenced it: the BrokerFenced rule, on controller metrics.
        wait_for(lambda: prom.firing("StraitMQBrokerFenced"), 60, "StraitMQBrokerFenced")

        t_restart = time.monotonic()
        c.brokers[victim].start()
        c.wait_ready(brokers=[victim])
        wait_for(
            lambda: prom.alerts(urp) == [], 90, f"{urp} to resolve", check=prom.alive, every=0.2
        )
        to_resolved = time.monotonic() - t_restart
        print(
            f"\n[alert figures] {urp} (for: {LIVE_FOR} in this test, 2m shipped; scrape and "
            f"evaluation every 1s): SIGKILL -> pending {to_pending:.1f} s, -> firing "
            f"{to_firing:.1f} s (shipped rule: pending + 2m), restart -> resolved "
            f"{to_resolved:.1f} s, SIGKILL -> resolved {time.monotonic() - t_kill:.1f} s",
            flush=True,
        )

        # A controller voter that is not the leader: the leader's
        # straitmq_controller_quorum_voters{unreachable} fires StraitMQQuorumVoterLost.
        lost = "StraitMQQuorumVoterLost"
        leader = c.wait_active_controller()
        voter = next(n for cid, n in c.controllers.items() if cid != leader.node_id)
        voter.kill9()
        wait_for(lambda: prom.firing(lost), 60, f"{lost} to fire", check=prom.alive, every=0.2)
        assert [a["labels"]["job"] for a in prom.alerts(lost)] == ["straitmq-controllers"]
        voter.start()
        wait_for(lambda: prom.alerts(lost) == [], 60, f"{lost} to resolve", check=prom.alive)
    finally:
        prom.stop()
