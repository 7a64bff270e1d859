"""The Helm chart (charts/straitmq), checked with the real helm binary.

helm comes from scripts/fetch-k8s.sh (.cache/k8s/bin/helm); without it these tests fail
rather than skip, since a chart nobody rendered is a chart nobody tested.

What is checked: `helm lint --strict` in every mode; the rendered objects (RBAC exactly
as the operator's contract, no wildcards; a non-root, read-only, probed operator
Deployment; the metrics Service the ServiceMonitor selects); the CRDs in the chart equal
to the repository's, in `helm template --include-crds` and in `helm package`; the
MQCluster/Topics the chart renders and examples/*.yaml valid against the CRDs' schemas
and accepted by the operator's own spec parser; every value documented.

Then on the real control plane of tests/kube_support.py (the `kube` fixture): `helm
install` with the API server checking every object (CEL rules included) and `kubectl auth
can-i` checking the grants; and the real operator, authenticated as the chart's
ServiceAccount, reconciling an MQCluster without a single 403 (least privilege that is
still enough).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for

from straitmq import __version__

HELM = ROOT / ".cache" / "k8s" / "bin" / "helm"
CHART = ROOT / "charts" / "straitmq"
CRDS = ROOT / "crds"
EXAMPLES = ROOT / "examples"
RELEASE = "sm"
NAMESPACE = "strait"
OPERATOR = "sm-straitmq-operator"
# The default image: its tag is the chart's appVersion, the version of the code
# (tests/test_releases.py keeps them equal).
IMAGE = f"straitmq/straitmq:{__version__}"


# -- helm ------------------------------------------------------------------------------


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    if not HELM.exists():
        pytest.fail(
            f"{HELM.relative_to(ROOT)} is missing: run scripts/fetch-k8s.sh (it builds helm "
            "with `go install`) and run the tests again"
        )
    proc = subprocess.run([str(HELM), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    if check:
        assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stderr}"
        # Helm logs to stderr when it follows a symlink or sees anything odd; a clean
        # chart produces no such output.
        assert not proc.stderr.strip(), f"helm {' '.join(args)} wrote to stderr:\n{proc.stderr}"
    return proc


def render(
    tmp_path: Path, values: dict[str, Any] | None = None, *extra: str
) -> list[dict[str, Any]]:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, *extra]
    if values is not None:
        f = tmp_path / f"values-{len(list(tmp_path.glob('values-*')))}.yaml"
        f.write_text(yaml.safe_dump(values))
        args += ["--values", str(f)]
    out = helm(*args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def only(objs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def kinds(objs: list[dict]) -> list[tuple[str, str]]:
    return sorted((o["kind"], o["metadata"]["name"]) for o in objs)


NAMESPACED_MODE = {"operator": {"watchNamespaces": ["team-a", "team-b"]}}
CLUSTER_MODE = {
    "cluster": {"enabled": True, "name": "demo"},
    "topics": [
        {
            "name": "orders",
            "partitions": 3,
            "replicationFactor": 3,
            "config": {"retention.ms": "604800000"},
        },
        {"name": "audit", "partitions": 1, "cluster": "other"},
    ],
    "users": [
        {
            "name": "billing",
            "authorization": {
                "acls": [
                    {"resource": {"type": "topic", "name": "orders"}, "operations": ["Write"]},
                    {"resource": {"type": "cluster"}, "operations": ["IdempotentWrite"]},
                ]
            },
        },
    ],
}
EVERYTHING = {
    **CLUSTER_MODE,
    **NAMESPACED_MODE,
    "metrics": {
        "serviceMonitor": {"enabled": True},
        "otelCollector": {"enabled": True},
        "prometheusRule": {"enabled": True},
    },
}


# -- lint -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [None, CLUSTER_MODE, NAMESPACED_MODE, EVERYTHING, {"operator": {"enabled": False}}],
    ids=["defaults", "cluster", "namespaced", "everything", "no-operator"],
)
def test_lint_strict_is_clean(tmp_path: Path, values: dict | None) -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    if values is not None:
        f = tmp_path / "values.yaml"
        f.write_text(yaml.safe_dump(values))
        args += ["--values", str(f)]
    out = helm(*args).stdout
    assert "0 chart(s) failed" in out, out
    # Only the icon hint may remain: the project has no logo to point at.
    findings = [line for line in out.splitlines() if line.startswith("[")]
    assert findings == ["[INFO] Chart.yaml: icon is recommended"], out


# -- what gets installed ------------------------------------------------------------------


def test_defaults_install_the_operator_and_dashboards_only(tmp_path: Path) -> None:
    objs = render(tmp_path)
    assert kinds([o for o in objs if o["kind"] != "ConfigMap"]) == sorted(
        [
            ("ClusterRole", OPERATOR),
            ("ClusterRole", "sm-straitmq-edit"),
            ("ClusterRole", "sm-straitmq-view"),
            ("ClusterRoleBinding", OPERATOR),
            ("ClusterRole", NODE_READER),
            ("Deployment", OPERATOR),
            ("Service", f"{OPERATOR}-metrics"),
            ("ServiceAccount", OPERATOR),
        ]
    )
    dashboards = [o for o in objs if o["kind"] == "ConfigMap"]
    assert len(dashboards) == len(list((CHART / "dashboards").glob("*.json")))
    for o in objs:
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert o["metadata"]["namespace"] == NAMESPACE, o["metadata"]
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "straitmq"


def test_operator_disabled_renders_no_operator(tmp_path: Path) -> None:
    objs = render(tmp_path, {"operator": {"enabled": False}, **CLUSTER_MODE})
    assert not [
        o
        for o in objs
        if o["kind"] in ("Deployment", "ServiceAccount", "Role", "ClusterRole", "Service")
    ]
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "MQCluster"] == ["demo"]


# -- RBAC -------------------------------------------------------------------------------

# The operator's contract: what it calls, by API group and resource.
NAMESPACED_RULES = {
    ("straitmq.io", "mqclusters"): {"get", "list", "watch", "patch", "update"},
    ("straitmq.io", "topics"): {"get", "list", "watch", "patch", "update"},
    ("straitmq.io", "users"): {"get", "list", "watch", "patch", "update"},
    ("straitmq.io", "mqclusters/status"): {"get", "patch", "update"},
    ("straitmq.io", "topics/status"): {"get", "patch", "update"},
    ("straitmq.io", "users/status"): {"get", "patch", "update"},
    ("straitmq.io", "mqclusters/finalizers"): {"get", "patch", "update"},
    ("straitmq.io", "topics/finalizers"): {"get", "patch", "update"},
    ("straitmq.io", "users/finalizers"): {"get", "patch", "update"},
    ("", "secrets"): {"get", "create", "patch"},  # Users' Secrets, by name only
    ("apps", "statefulsets"): {"get", "list", "watch", "create", "patch", "update", "delete"},
    ("", "services"): {"get", "list", "watch", "create", "patch", "update", "delete"},
    ("", "configmaps"): {"get", "list", "watch", "create", "patch", "update", "delete"},
    ("policy", "poddisruptionbudgets"): {
        "get",
        "list",
        "watch",
        "create",
        "patch",
        "update",
        "delete",
    },
    ("", "pods"): {"get", "list", "watch", "patch", "delete"},
    # External listeners of type ingress: an Ingress per broker and a bootstrap one.
    ("networking.k8s.io", "ingresses"): {
        "get",
        "list",
        "watch",
        "create",
        "patch",
        "update",
        "delete",
    },
    ("", "events"): {"create"},
    ("", "serviceaccounts"): {"get", "create", "patch"},  # the brokers' (rack awareness)
}
CRD_READ = {("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"}}
NAMESPACES_READ = {("", "namespaces"): {"get", "list", "watch"}}
NODE_READER = "sm-straitmq-node-reader"
# Rack awareness: bind the node reader (and only it) to rack-aware clusters' brokers.
RACK_BINDING = {
    ("rbac.authorization.k8s.io", "clusterrolebindings"): {
        "get",
        "list",
        "create",
        "patch",
        "delete",
    },
    ("rbac.authorization.k8s.io", f"clusterroles/{NODE_READER}"): {"bind"},
}


def grants(role: dict) -> dict[tuple[str, str], set[str]]:
    """(group, resource) -> verbs; a rule limited to names gives (group, resource/name)."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for name in rule.get("resourceNames") or [None]:
                    key = (group, f"{resource}/{name}" if name else resource)
                    out.setdefault(key, set()).update(rule["verbs"])
    return out


def assert_no_wildcards(objs: list[dict]) -> None:
    roles = [o for o in objs if o["kind"] in ("Role", "ClusterRole")]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert all("*" not in v for v in rule[key]), (role["metadata"]["name"], rule)
            assert not {"escalate", "impersonate"} & set(rule["verbs"]), rule
            if "bind" in rule["verbs"]:  # the node reader only, by name
                assert rule["resources"] == ["clusterroles"], rule
                assert rule["resourceNames"] == [NODE_READER], rule
            if "secrets" in rule["resources"]:  # by name only: never list or watch them
                assert set(rule["verbs"]) <= {"get", "create", "patch"}, rule


def bound_to_operator(objs: list[dict], binding_kind: str, role: dict) -> None:
    """Some binding of `binding_kind` grants `role` to the operator's ServiceAccount."""
    sa = only(objs, "ServiceAccount")["metadata"]["name"]
    ns = role["metadata"].get("namespace")
    for b in objs:
        if (
            b["kind"] == binding_kind
            and b["metadata"].get("namespace") == ns
            and b["roleRef"]
            == {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": role["kind"],
                "name": role["metadata"]["name"],
            }
        ):
            assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
            return
    raise AssertionError(f"no {binding_kind} for {role['kind']} {role['metadata']['name']}")


def test_cluster_wide_rbac_is_exactly_the_contract(tmp_path: Path) -> None:
    objs = render(tmp_path)
    assert_no_wildcards(objs)
    cr = only(objs, "ClusterRole", OPERATOR)
    assert grants(cr) == {**NAMESPACED_RULES, **CRD_READ, **RACK_BINDING}
    bound_to_operator(objs, "ClusterRoleBinding", cr)
    assert grants(only(objs, "ClusterRole", NODE_READER)) == {("", "nodes"): {"get"}}
    # The operator binds it itself, per rack-aware MQCluster; the chart binds it to no one.
    assert not [b for b in objs if "roleRef" in b and b["roleRef"]["name"] == NODE_READER]
    env = only(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "STRAITMQ_RACK_CLUSTER_ROLE", "value": NODE_READER} in env
    args = only(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args
    assert not [a for a in args if a.startswith("--namespace")]


def test_namespaced_rbac_grants_cluster_wide_only_reads_and_the_rack_binding(
    tmp_path: Path,
) -> None:
    objs = render(tmp_path, NAMESPACED_MODE)
    assert_no_wildcards(objs)
    cr = only(objs, "ClusterRole", OPERATOR)
    assert grants(cr) == {**CRD_READ, **NAMESPACES_READ, **RACK_BINDING}
    bound_to_operator(objs, "ClusterRoleBinding", cr)
    roles = {
        o["metadata"]["namespace"]: o
        for o in objs
        if o["kind"] == "Role" and o["metadata"]["name"] == OPERATOR
    }
    assert sorted(roles) == ["team-a", "team-b"]
    for role in roles.values():
        assert grants(role) == NAMESPACED_RULES
        bound_to_operator(objs, "RoleBinding", role)
    args = only(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--all-namespaces" not in args


def test_watch_namespaces_must_be_a_list(tmp_path: Path) -> None:
    # `--set operator.watchNamespaces=team-a` is a string: it must not fall back to
    # watching (and being granted) every namespace.
    proc = helm(
        "template", RELEASE, str(CHART), "--set", "operator.watchNamespaces=team-a", check=False
    )
    assert proc.returncode != 0
    assert "operator.watchNamespaces must be a list" in proc.stderr


def test_user_roles_aggregate_into_the_builtin_roles(tmp_path: Path) -> None:
    objs = render(tmp_path)
    edit = only(objs, "ClusterRole", "sm-straitmq-edit")
    view = only(objs, "ClusterRole", "sm-straitmq-view")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "update" in grants(edit)[("straitmq.io", "mqclusters/scale")]  # kubectl scale
    assert all(v <= {"get", "list", "watch"} for v in grants(view).values())
    off = render(tmp_path, {"rbac": {"aggregateToDefaultRoles": False}})
    names = sorted(o["metadata"]["name"] for o in off if o["kind"] == "ClusterRole")
    assert names == sorted([OPERATOR, NODE_READER])


def test_rack_awareness_off_grants_nothing_cluster_scoped_to_bind(tmp_path: Path) -> None:
    for mode in ({}, NAMESPACED_MODE):
        objs = render(tmp_path, {**mode, "rbac": {"rackAwareness": False}})
        assert_no_wildcards(objs)
        assert not [o for o in objs if o["metadata"]["name"] == NODE_READER]
        everything = {
            k: v for o in objs if o["kind"] in ("Role", "ClusterRole") for k, v in grants(o).items()
        }
        assert not set(RACK_BINDING) & set(everything)
        assert ("", "serviceaccounts") not in everything
        env = only(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
        assert "STRAITMQ_RACK_CLUSTER_ROLE" not in {e["name"] for e in env}


# -- the operator Deployment ------------------------------------------------------------------


def test_operator_deployment_is_non_root_read_only_and_probed(tmp_path: Path) -> None:
    objs = render(tmp_path)
    dep = only(objs, "Deployment", OPERATOR)
    spec = dep["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}  # never two operators at once
    pod = spec["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == only(objs, "ServiceAccount")["metadata"]["name"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True
    assert isinstance(psc["runAsUser"], int) and psc["runAsUser"] > 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}

    [c] = pod["containers"]
    assert c["image"] == IMAGE  # tag defaults to appVersion
    assert c["command"] == ["strait-operator"]
    assert c["args"][:1] == ["--all-namespaces"]
    for arg in (
        "--metrics-port=8090",
        "--health-port=8091",
        "--log-format=json",
        "--log-level=info",
    ):
        assert arg in c["args"]
    csc = c["securityContext"]
    assert csc["runAsNonRoot"] is True
    assert csc["readOnlyRootFilesystem"] is True
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"] == {"drop": ["ALL"]}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": 8090, "health": 8091}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]
    # A writable /tmp, since the root filesystem is not.
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert {v["name"] for v in pod["volumes"]} == {"tmp"}
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_operator_entrypoint_is_a_console_script() -> None:
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "strait-operator" in scripts


def test_operator_deployment_follows_values(tmp_path: Path) -> None:
    objs = render(
        tmp_path,
        {
            "image": {"repository": "reg.example/straitmq", "digest": "sha256:" + "a" * 64},
            "operator": {
                "logFormat": "plain",
                "logLevel": "debug",
                "metricsPort": 9100,
                "healthPort": 9101,
                "extraArgs": ["--foo"],
                "runAsUser": None,
                "runAsGroup": None,
            },
            "serviceAccount": {"create": False, "name": "existing"},
            "imagePullSecrets": [{"name": "regcred"}],
        },
    )
    assert not [o for o in objs if o["kind"] == "ServiceAccount"]
    pod = only(objs, "Deployment")["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["image"] == "reg.example/straitmq@sha256:" + "a" * 64
    assert {
        "--log-format=plain",
        "--log-level=debug",
        "--metrics-port=9100",
        "--health-port=9101",
        "--foo",
    } <= set(c["args"])
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9100, "health": 9101}
    assert pod["serviceAccountName"] == "existing"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "runAsUser" not in pod["securityContext"]
    svc = only(objs, "Service", f"{OPERATOR}-metrics")
    assert svc["spec"]["ports"][0]["port"] == 9100
    crb = only(objs, "ClusterRoleBinding", OPERATOR)
    assert crb["subjects"][0]["name"] == "existing"

    proc = helm("template", RELEASE, str(CHART), "--set", "operator.logFormat=xml", check=False)
    assert proc.returncode != 0 and "operator.logFormat must be json or plain" in proc.stderr
    proc = helm(
        "template", RELEASE, str(CHART), "--set", "serviceAccount.create=false", check=False
    )
    assert proc.returncode != 0 and "serviceAccount.name is required" in proc.stderr


def test_metrics_service_is_what_the_service_monitor_scrapes(tmp_path: Path) -> None:
    objs = render(tmp_path, {"metrics": {"serviceMonitor": {"enabled": True}}})
    svc = only(objs, "Service", f"{OPERATOR}-metrics")
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 8090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert svc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "straitmq"
    pod_labels = only(objs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    sm = only(objs, "ServiceMonitor")
    sel = sm["spec"]["selector"]
    assert sel["matchLabels"].items() <= svc["metadata"]["labels"].items()
    for expr in sel.get("matchExpressions", []):
        assert expr["operator"] == "NotIn"
        assert svc["metadata"]["labels"].get(expr["key"]) not in expr["values"]
    assert "metrics" in [e["port"] for e in sm["spec"]["endpoints"]]


# -- CRDs --------------------------------------------------------------------------------


def test_chart_crds_are_byte_identical_copies_of_the_repository_crds() -> None:
    chart_crds = CHART / "crds"
    assert not chart_crds.is_symlink()
    repo = {p.name: p.read_bytes() for p in CRDS.glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in chart_crds.iterdir()}
    assert repo, "no CRDs in crds/"
    assert sorted(chart) == sorted(repo), "run: cp crds/*.yaml charts/straitmq/crds/"
    for name, data in repo.items():
        assert chart[name] == data, (
            f"charts/straitmq/crds/{name} differs from crds/{name}: "
            "run: cp crds/*.yaml charts/straitmq/crds/"
        )


def crd_docs() -> dict[str, dict]:
    return {
        d["metadata"]["name"]: d
        for p in sorted(CRDS.glob("*.yaml"))
        for d in yaml.safe_load_all(p.read_text())
    }


def test_template_include_crds_renders_the_crds(tmp_path: Path) -> None:
    objs = render(tmp_path, None, "--include-crds")
    rendered = {o["metadata"]["name"]: o for o in objs if o["kind"] == "CustomResourceDefinition"}
    assert rendered == crd_docs()
    without = render(tmp_path)
    assert not [o for o in without if o["kind"] == "CustomResourceDefinition"]


def test_packaged_chart_holds_the_crds_and_nothing_stray(tmp_path: Path) -> None:
    helm("package", str(CHART), "--destination", str(tmp_path))
    [tgz] = tmp_path.glob("straitmq-*.tgz")
    with tarfile.open(tgz) as tar:
        names = tar.getnames()
        for p in CRDS.glob("*.yaml"):
            member = tar.extractfile(f"straitmq/crds/{p.name}")
            assert member is not None and member.read() == p.read_bytes()
    assert {n.split("/")[1] for n in names} == {
        "Chart.yaml",
        "values.yaml",
        "README.md",
        ".helmignore",
        "crds",
        "templates",
        "dashboards",
        "alerts",  # the rule file the PrometheusRule includes (its unit tests stay out)
    }
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".orig", "~"))]


# -- custom resources against the CRD schemas -----------------------------------------------


class SchemaError(AssertionError):
    pass


def _check(schema: dict, value: Any, path: str) -> Any:
    """Validate `value` like the API server does for a structural schema, with defaults
    applied; unknown fields are errors here (the server would prune them silently, which
    for a user means settings that vanish). Returns the defaulted value. CEL rules
    (x-kubernetes-validations) are left to a real API server: tests/test_operator_k8s.py."""
    if value is None:
        raise SchemaError(f"{path}: null")
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise SchemaError(f"{path}: {value!r} is neither an integer nor a string")
        return value
    t = schema.get("type")
    if t == "object":
        if not isinstance(value, dict):
            raise SchemaError(f"{path}: expected an object, got {value!r}")
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return value
        props = schema.get("properties", {})
        out = {}
        for key, sub in props.items():
            if key in value:
                out[key] = _check(sub, value[key], f"{path}.{key}")
            elif "default" in sub:
                out[key] = _check(sub, sub["default"], f"{path}.{key}")
        for key in value.keys() - props.keys():
            if "additionalProperties" not in schema:
                raise SchemaError(f"{path}.{key}: unknown field")
            out[key] = _check(schema["additionalProperties"], value[key], f"{path}.{key}")
        for key in schema.get("required", []):
            if key not in out:
                raise SchemaError(f"{path}.{key}: required")
        # anyOf of `required` lists (MQCluster: spec.version or spec.image).
        alternatives = [alt.get("required", []) for alt in schema.get("anyOf", [])]
        if alternatives and not any(all(k in out for k in alt) for alt in alternatives):
            raise SchemaError(f"{path}: needs one of {alternatives}")
        return out
    if t == "array":
        if not isinstance(value, list):
            raise SchemaError(f"{path}: expected an array")
        return [_check(schema["items"], v, f"{path}[{i}]") for i, v in enumerate(value)]
    if t == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(f"{path}: expected an integer, got {value!r}")
        if "minimum" in schema and value < schema["minimum"]:
            raise SchemaError(f"{path}: {value} < {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise SchemaError(f"{path}: {value} > {schema['maximum']}")
    elif t == "string":
        if not isinstance(value, str):
            raise SchemaError(f"{path}: expected a string, got {value!r}")
        if len(value) < schema.get("minLength", 0):
            raise SchemaError(f"{path}: shorter than {schema['minLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            raise SchemaError(f"{path}: {value!r} does not match {schema['pattern']}")
    elif t == "boolean":
        if not isinstance(value, bool):
            raise SchemaError(f"{path}: expected a boolean")
    if "enum" in schema and value not in schema["enum"]:
        raise SchemaError(f"{path}: {value!r} not in {schema['enum']}")
    if t is None:
        raise SchemaError(f"{path}: schema without a type")
    return value


def validate(obj: dict) -> dict:
    """The object's spec, defaulted, if it is valid against its CRD."""
    crds = {(c["spec"]["group"], c["spec"]["names"]["kind"]): c for c in crd_docs().values()}
    group, version = obj["apiVersion"].split("/")
    crd = crds[(group, obj["kind"])]
    [ver] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert ver["served"], f"{obj['apiVersion']} is not served"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", obj["metadata"]["name"])
    schema = ver["schema"]["openAPIV3Schema"]
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    return _check(schema, body, obj["kind"])["spec"]


def test_validator_rejects_what_the_api_server_rejects() -> None:
    ok = {
        "apiVersion": "straitmq.io/v1alpha1",
        "kind": "MQCluster",
        "metadata": {"name": "x"},
        "spec": {"image": "i"},
    }
    spec = validate(ok)
    assert spec["brokers"]["replicas"] == 3 and spec["controllers"]["replicas"] == 3
    assert validate({**ok, "spec": {"version": "0.2.0"}})["version"] == "0.2.0"
    for voters in (1, 5):  # a quorum of one or five voters; even sizes are refused
        five = validate({**ok, "spec": {"image": "i", "controllers": {"replicas": voters}}})
        assert five["controllers"]["replicas"] == voters
    bad = [
        {"image": "i", "brokers": {"replicas": 0}},
        {"image": "i", "controllers": {"replicas": 2}},
        {"image": "i", "controllers": {"replicas": 7}},
        {"image": "i", "listeners": {"http": {"port": 0}}},
        {"image": "i", "brokers": {"config": {"auto.create.topics.enable": False}}},
        {"image": "i", "brokers": {"storage": {"size": "ten gigs"}}},
        {"image": "i", "typo": 1},
        {"brokers": {}},  # neither version nor image
        {"version": "0.2.0 beta"},
        {"version": "0.2.0", "upgrade": {"finalizeFeatures": "always"}},
    ]
    for spec in bad:
        with pytest.raises(SchemaError):
            validate({**ok, "spec": spec})


def load_example(name: str) -> dict:
    [doc] = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    return doc


def operator_accepts(obj: dict, spec: dict) -> None:
    """The operator's own parser takes the (defaulted) MQCluster spec."""
    from straitmq.operator import spec as operator_spec

    operator_spec.parse({"metadata": {**obj["metadata"], "namespace": NAMESPACE}, "spec": spec})


def test_examples_are_valid_custom_resources() -> None:
    cluster = load_example("open/mqcluster.yaml")
    topic = load_example("open/topic.yaml")
    cspec = validate(cluster)
    tspec = validate(topic)
    assert cluster["metadata"]["name"] == "demo"
    assert cspec["brokers"]["replicas"] == 3
    assert topic["metadata"]["name"] == "orders"
    assert tspec["cluster"] == "demo"
    assert tspec["partitions"] == 3 and tspec["replicationFactor"] == 3
    assert "retention.ms" in tspec["config"]
    assert tspec["replicationFactor"] <= cspec["brokers"]["replicas"]
    operator_accepts(cluster, cspec)


def test_secure_examples_are_valid_and_secure_the_http_api() -> None:
    from straitmq.operator import spec as operator_spec
    from straitmq.operator import user as operator_user

    cluster = load_example("mqcluster.yaml")
    cspec = validate(cluster)
    operator_accepts(cluster, cspec)
    parsed = operator_spec.parse(
        {"metadata": {**cluster["metadata"], "namespace": NAMESPACE}, "spec": cspec}
    )
    assert parsed.kafka_tls and parsed.kafka_sasl == "SCRAM-SHA-512" and parsed.authorization
    assert parsed.http_secured
    user = load_example("user.yaml")
    uspec = validate(user)
    assert uspec["cluster"] == cluster["metadata"]["name"]
    topic = load_example("topic.yaml")
    assert validate(topic)["cluster"] == cluster["metadata"]["name"]
    bindings = operator_user.user_spec(user).acls
    assert {b.operation for b in bindings} >= {"WRITE", "READ", "DESCRIBE"}


def test_chart_cluster_and_topics_are_valid_custom_resources(tmp_path: Path) -> None:
    objs = render(tmp_path, CLUSTER_MODE)
    cluster = only(objs, "MQCluster", "demo")
    assert cluster["metadata"]["namespace"] == NAMESPACE
    spec = validate(cluster)
    assert spec["image"] == IMAGE  # the operator's image
    assert spec["brokers"]["replicas"] == 3
    operator_accepts(cluster, spec)
    orders = only(objs, "Topic", "orders")
    assert validate(orders) == {
        "cluster": "demo",
        "partitions": 3,
        "replicationFactor": 3,
        "config": {"retention.ms": "604800000"},
    }
    assert validate(only(objs, "Topic", "audit"))["cluster"] == "other"
    billing = validate(only(objs, "User", "billing"))
    assert billing["cluster"] == "demo"
    assert billing["authentication"] == {"type": "scram-sha-512"}
    assert billing["authorization"]["acls"][0] == {
        "resource": {"type": "topic", "name": "orders", "patternType": "literal"},
        "operations": ["Write"],
        "host": "*",
        "type": "allow",
    }
    # spec is passed through: what a user sets wins, including the image.
    objs = render(
        tmp_path,
        {"cluster": {"enabled": True, "spec": {"image": "mine:1", "brokers": {"replicas": 5}}}},
    )
    spec = validate(only(objs, "MQCluster", RELEASE))
    assert spec["image"] == "mine:1" and spec["brokers"]["replicas"] == 5
    # spec.version: the operator derives the image from the chart's repository (the
    # Deployment names it), and the chart sets none, so an upgrade of the chart leaves
    # the cluster's version alone.
    objs = render(
        tmp_path,
        {
            "image": {"repository": "reg.example/straitmq"},
            "cluster": {"enabled": True, "spec": {"version": "0.1.0"}},
        },
    )
    spec = validate(only(objs, "MQCluster", RELEASE))
    assert spec["version"] == "0.1.0" and "image" not in spec
    env = only(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "STRAITMQ_IMAGE_REPOSITORY", "value": "reg.example/straitmq"} in env


# -- documentation --------------------------------------------------------------------------


def value_paths(node: Any, prefix: str = "") -> list[str]:
    # Maps the chart passes through (cluster.spec, selectors) are documented as one value.
    opaque = {"cluster.spec", "metrics.serviceMonitor.selector", "operator.resources"}
    if isinstance(node, dict) and node and prefix not in opaque:
        return [
            p for k, v in node.items() for p in value_paths(v, f"{prefix}.{k}" if prefix else k)
        ]
    return [prefix]


def test_every_value_is_documented_in_the_readme() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme, re.M))
    paths = set(value_paths(values))
    assert paths - documented == set(), "values missing from charts/straitmq/README.md"
    assert documented - paths == set(), "README.md documents values that do not exist"


# -- on a real API server ----------------------------------------------------------------------


def test_chart_installs_on_a_real_api_server(kube: Any, tmp_path: Path) -> None:
    """`helm install` against the real control plane (tests/kube_support.py), in the
    namespaced RBAC mode with an MQCluster and Topics: the API server accepts every object
    (the custom resources against the CRDs' schemas and CEL rules), the examples pass a
    server-side dry run, and the operator's account may do what the contract says, where
    it says, and nothing else that matters."""
    release, ns, watched = "chartcheck", "chart-check", "chart-check-team"
    kube.create_namespace(ns)
    kube.create_namespace(watched)
    values = {**CLUSTER_MODE, "operator": {"watchNamespaces": [watched]}}
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    kube.helm("install", release, str(CHART), "--namespace", ns, "--values", str(f))
    try:
        for crd in ("mqclusters.straitmq.io", "topics.straitmq.io"):
            kube.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=30s")
        spec = yaml.safe_load(
            kube.kubectl("get", "mqcluster", "demo", "-n", ns, "-o", "yaml").stdout
        )
        assert spec["spec"]["image"] == IMAGE
        assert spec["spec"]["controllers"]["replicas"] == 3  # the CRD's default, applied
        topics = kube.kubectl("get", "topics", "-n", ns, "-o", "name").stdout.split()
        assert sorted(topics) == ["topic.straitmq.io/audit", "topic.straitmq.io/orders"]

        dry = kube.kubectl(
            "apply",
            "--dry-run=server",
            "-n",
            watched,
            "-f",
            str(EXAMPLES / "open" / "mqcluster.yaml"),
            "-f",
            str(EXAMPLES / "open" / "topic.yaml"),
            "-f",
            str(EXAMPLES / "mqcluster.yaml"),
            "-f",
            str(EXAMPLES / "user.yaml"),
        )
        assert "mqcluster.straitmq.io/demo created (server dry run)" in dry.stdout
        assert "mqcluster.straitmq.io/secure created (server dry run)" in dry.stdout
        assert "user.straitmq.io/orders-app created (server dry run)" in dry.stdout
        assert "topic.straitmq.io/orders created (server dry run)" in dry.stdout

        who = f"--as=system:serviceaccount:{ns}:chartcheck-straitmq-operator"

        def can(*args: str) -> bool:
            out = kube.kubectl("auth", "can-i", *args, who, check=False)
            return out.stdout.strip() == "yes"

        assert can("patch", "statefulsets.apps", "-n", watched)
        assert can("delete", "pods", "-n", watched)
        assert can("update", "topics.straitmq.io/status", "-n", watched)
        assert can("create", "events", "-n", watched)
        assert can("watch", "customresourcedefinitions.apiextensions.k8s.io")
        assert can("list", "namespaces")
        assert can("create", "clusterrolebindings.rbac.authorization.k8s.io")
        assert can("bind", "clusterroles.rbac.authorization.k8s.io/chartcheck-straitmq-node-reader")
        assert can("create", "secrets", "-n", watched)  # Users' credentials
        # Only the watched namespace, secrets by name only, no cluster-wide writes.
        assert not can("patch", "statefulsets.apps", "-n", ns)
        assert not can("list", "pods", "-n", "default")
        assert not can("list", "secrets", "-n", watched)
        assert not can("get", "secrets", "-n", ns)
        assert not can("bind", "clusterroles.rbac.authorization.k8s.io/cluster-admin")
        assert not can("escalate", "clusterroles.rbac.authorization.k8s.io")
        assert not can("get", "nodes")
        assert not can("delete", "persistentvolumeclaims", "-n", watched)
    finally:
        kube.helm("uninstall", release, "--namespace", ns, check=False)


def test_operator_reconciles_with_nothing_but_the_charts_rbac(kube: Any, tmp_path: Path) -> None:
    """The real operator, run as the chart's ServiceAccount (namespaced mode), turns the
    chart's MQCluster into StatefulSets and writes its status without a single 403; and
    in cluster-wide mode it starts up without one."""
    from conftest import free_port

    release, ns = "rbaccheck", "rbac-check"
    kube.create_namespace(ns)
    values = {
        "operator": {"watchNamespaces": [ns]},
        "cluster": {
            "enabled": True,
            "name": "demo",
            # No brokers really run (kwok fakes the pods): point the admin API somewhere
            # that refuses at once instead of waiting on DNS.
            "annotations": {"straitmq.io/admin-url": "http://127.0.0.1:1"},
            # Rack-aware: the operator must also bind the node reader to the brokers.
            "spec": {"brokers": {"rack": {"topologyKey": "topology.kubernetes.io/zone"}}},
        },
        "topics": [{"name": "orders", "partitions": 3}],
    }
    f = tmp_path / "values.yaml"
    f.write_text(yaml.safe_dump(values))
    kube.helm("install", release, str(CHART), "--namespace", ns, "--values", str(f))
    sa = f"{release}-straitmq-operator"
    kubeconfig = kube.service_account_kubeconfig(ns, sa, tmp_path / "sa.kubeconfig")
    env = {
        **kube.env,
        "KUBECONFIG": str(kubeconfig),
        "STRAITMQ_OPERATOR_BUSY_INTERVAL_S": "1",
        "STRAITMQ_RACK_CLUSTER_ROLE": f"{release}-straitmq-node-reader",  # as the chart sets
    }
    binding = f"straitmq-rack-{ns}-demo"
    brokers = f"--as=system:serviceaccount:{ns}:demo-broker"

    metrics_ports: list[int] = []  # the last one is the running operator's

    def run_operator(scope: list[str], log: Path) -> subprocess.Popen[bytes]:
        metrics_ports.append(free_port())
        with open(log, "wb") as out:
            return subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "straitmq.operator",
                    *scope,
                    "--log-level=info",
                    f"--metrics-port={metrics_ports[-1]}",
                    f"--health-port={free_port()}",
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )

    def forbidden(log: Path) -> list[str]:
        return [
            line
            for line in log.read_text(errors="replace").splitlines()
            if re.search(r"\b403\b|[Ff]orbidden|Not enough permissions", line)
        ]

    def healthy(proc: subprocess.Popen[bytes], log: Path) -> None:
        """Fail at once, not at a timeout: the operator died or was refused something."""
        assert proc.poll() is None, log.read_text()[-3000:]
        assert not forbidden(log), "\n".join(forbidden(log))

    def passes(kind: str) -> int:
        """Reconcile passes of `kind` this operator process finished (any outcome)."""
        url = f"http://127.0.0.1:{metrics_ports[-1]}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return 0  # not serving yet
        return int(
            sum(
                sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "straitmq_operator_reconciles_total"
                and kind in sample.labels.values()
            )
        )

    log = tmp_path / "operator-namespaced.log"
    proc = run_operator([f"--namespace={ns}"], log)
    try:

        def reconciled() -> bool:
            sts = kube.kubectl("get", "statefulsets", "-n", ns, "-o", "name").stdout.split()
            out = kube.kubectl("get", "mqcluster", "demo", "-n", ns, "-o", "jsonpath={.status}")
            status = yaml.safe_load(out.stdout or "{}")
            return (
                sorted(sts) == ["statefulset.apps/demo-broker", "statefulset.apps/demo-controller"]
                and status.get("observedGeneration") == 1
                and bool(status.get("phase"))
            )

        # Not kube.wait_for (it retries on exceptions): a refusal or a dead operator must
        # fail at once, not time out.
        wait_for(
            reconciled,
            90,
            "the operator to reconcile MQCluster demo",
            0.5,
            check=lambda: healthy(proc, log),
        )
        pdbs = kube.kubectl("get", "pdb", "-n", ns, "-o", "name").stdout.split()
        assert len(pdbs) == 2
        # The brokers' account may read nodes (their rack label) and nothing more.
        got = kube.kubectl("get", "clusterrolebinding", binding, "-o", "yaml")
        crb = yaml.safe_load(got.stdout)
        assert crb["roleRef"]["name"] == f"{release}-straitmq-node-reader"
        assert crb["subjects"] == [
            {"kind": "ServiceAccount", "name": "demo-broker", "namespace": ns}
        ]
        for verb, what, yes in (
            ("get", "nodes", True),
            ("list", "nodes", False),
            ("get", "pods", False),
            ("get", "secrets", False),
        ):
            out = kube.kubectl("auth", "can-i", verb, what, "-n", ns, brokers, check=False)
            assert (out.stdout.strip() == "yes") == yes, (verb, what, out.stdout)
        assert not forbidden(log), "\n".join(forbidden(log))
    finally:
        proc.terminate()
        proc.wait(30)

    # Cluster-wide mode is the same rules in a ClusterRole: switch the release over and
    # check the operator starts, scans and watches without being refused.
    kube.helm(
        "upgrade",
        release,
        str(CHART),
        "--namespace",
        ns,
        "--values",
        str(f),
        "--set-json",
        "operator.watchNamespaces=[]",
    )
    log = tmp_path / "operator-clusterwide.log"
    proc = run_operator(["--all-namespaces"], log)
    try:
        # Started, scanned the CRDs and watching in every namespace: it has finished a
        # pass over the MQCluster and the Topic, which it can only know of from its watches.
        wait_for(
            lambda: passes("MQCluster") > 0 and passes("Topic") > 0,
            60,
            "the cluster-wide operator's first passes over MQCluster demo and Topic orders",
            0.5,
            check=lambda: healthy(proc, log),
        )
        # Deleting the MQCluster takes its rack binding (cluster-scoped: no owner reference);
        # the operator deletes it when it sees the MQCluster gone (there is no finalizer).
        kube.kubectl("delete", "mqcluster", "demo", "-n", ns, "--timeout=60s")

        def binding_gone() -> bool:
            out = kube.kubectl("get", "clusterrolebinding", binding, check=False)
            return out.returncode != 0 and "NotFound" in out.stderr

        wait_for(
            binding_gone, 30, "the rack binding deleted", 0.5, check=lambda: healthy(proc, log)
        )
        assert not forbidden(log), "\n".join(forbidden(log))
    finally:
        proc.terminate()
        proc.wait(30)
        kube.kubectl("delete", "topics,mqclusters", "--all", "-n", ns, "--wait=false", check=False)
        kube.helm("uninstall", release, "--namespace", ns, check=False)
