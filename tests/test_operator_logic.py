"""The operator's pure parts: spec parsing, rendered manifests, partition-move plans."""

from __future__ import annotations

import argparse
import random
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Producer
from cryptography import x509
from straitmq.broker import __main__ as broker_main
from straitmq.broker.config import BrokerConfig
from straitmq.broker.security.listeners import resolve as resolve_listeners
from straitmq.operator import (
    certificates,
    cluster,
    conditions,
    listeners,
    managed,
    pki,
    planning,
    quorum,
    render,
    upgrade,
    user,
)
from straitmq.operator import names as n
from straitmq.operator.admin import Partition, Topic
from straitmq.operator.spec import SpecError, parse

from straitmq.node_identity import voter_for_hostname
from straitmq.settings import add_flags, flag_values

UID = "6f1c2d4e-0000-4000-8000-00000000abcd"


def body(**spec) -> dict:
    return {
        "apiVersion": "straitmq.io/v1alpha1",
        "kind": "MQCluster",
        "metadata": {"name": "demo", "namespace": "prod", "uid": UID},
        "spec": {"image": "straitmq:1", **spec},
    }


def test_spec_defaults_and_broker_configs() -> None:
    config = {"num.partitions": 6, "auto.create.topics.enable": False}
    s = parse(body(brokers={"replicas": 5, "config": config}))
    assert s.brokers == 5 and s.kafka_port == 9092 and s.http_port == 8080
    assert s.broker_args() == ["--no-auto-create", "--num-partitions=6"]
    assert s.controller_args() == ["--default-partitions=6"]
    assert len(s.cluster_id) == 22 and s.cluster_id == parse(body()).cluster_id


def test_the_log_cleaners_broker_configs_become_flags() -> None:
    config = {
        "log.cleaner.threads": 2,
        "log.cleaner.min.cleanable.ratio": 0.2,
        "log.cleanup.policy": "compact, delete",
        "log.cleaner.enable": False,
    }
    args = parse(body(brokers={"config": config})).broker_args()
    assert args == [
        "--no-log-cleaner",
        "--log-cleaner-min-cleanable-ratio=0.2",
        "--log-cleaner-threads=2",
        "--log-cleanup-policy=compact,delete",
    ]
    # Each is a flag the broker takes, to the setting of the same Kafka name.
    flags = argparse.ArgumentParser()
    add_flags(flags, BrokerConfig)
    cfg = BrokerConfig(**flag_values(flags.parse_args(args), BrokerConfig))
    assert (cfg.log_cleaner_enable, cfg.log_cleaner_threads) == (False, 2)
    assert cfg.describe()["log.cleanup.policy"] == "compact,delete"
    assert cfg.describe()["log.cleaner.min.cleanable.ratio"] == "0.2"


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"controllers": {"replicas": 2}}, "controllers.replicas must be 1, 3 or 5"),
        ({"controllers": {"replicas": 7}}, "controllers.replicas must be 1, 3 or 5"),
        ({"brokers": {"config": {"log.dirs": "/x"}}}, "log.dirs is not a broker config"),
        ({"brokers": {"config": {"num.partitions": "many"}}}, "must be an integer"),
        ({"brokers": {"config": {"auto.create.topics.enable": "maybe"}}}, "true or false"),
        ({"brokers": {"config": {"log.cleanup.policy": "shred"}}}, "compact and/or delete"),
        ({"brokers": {"config": {"log.cleaner.min.cleanable.ratio": "half"}}}, "a number"),
    ],
)
def test_spec_errors_say_which_field(spec: dict, error: str) -> None:
    with pytest.raises(SpecError, match=error):
        parse(body(**spec))


def test_rendered_objects() -> None:
    s = parse(body(brokers={"replicas": 4, "rack": {"topologyKey": "topology.kubernetes.io/zone"}}))
    objs = {(o["kind"], o["metadata"]["name"]): o for o in render.objects(s, 4)}
    assert set(objs) == {
        ("ConfigMap", "demo-config"),
        ("Service", "demo-controller"),
        ("Service", "demo-broker"),
        ("Service", "demo-bootstrap"),
        ("PodDisruptionBudget", "demo-controller"),
        ("PodDisruptionBudget", "demo-broker"),
        ("ServiceAccount", "demo-broker"),
        ("StatefulSet", "demo-controller"),
        ("StatefulSet", "demo-broker"),
    }
    for o in objs.values():
        (ref,) = o["metadata"]["ownerReferences"]
        assert ref["kind"] == "MQCluster" and ref["uid"] == s.uid and ref["controller"] is True
        assert o["metadata"]["namespace"] == "prod"
    assert objs[("ConfigMap", "demo-config")]["data"]["STRAIT_CONTROLLER_VOTERS"] == (
        "1000@demo-controller-0.demo-controller.prod.svc:9093,"
        "1001@demo-controller-1.demo-controller.prod.svc:9093,"
        "1002@demo-controller-2.demo-controller.prod.svc:9093"
    )
    for svc in ("demo-controller", "demo-broker"):
        spec = objs[("Service", svc)]["spec"]
        assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    assert "clusterIP" not in objs[("Service", "demo-bootstrap")]["spec"]
    ctl = objs[("StatefulSet", "demo-controller")]["spec"]
    brk = objs[("StatefulSet", "demo-broker")]["spec"]
    assert ctl["replicas"] == 3 and brk["replicas"] == 4
    for sts in (ctl, brk):
        assert sts["podManagementPolicy"] == "Parallel"
        assert sts["updateStrategy"] == {"type": "OnDelete"}
        (c,) = sts["template"]["spec"]["containers"]
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["securityContext"]["runAsNonRoot"] is True
        labels = sts["template"]["metadata"]["labels"]
        assert labels.items() >= sts["selector"]["matchLabels"].items()
    (c,) = brk["template"]["spec"]["containers"]
    # Clients get each broker at its own Service; the brokers each other at the pod's
    # DNS name, on a listener of their own (registered first: the inter-broker one).
    assert (
        "--override=advertised.listeners="
        "REPLICATION://$(POD_NAME).demo-broker.$(POD_NAMESPACE).svc:9091,"
        "PLAINTEXT://$(POD_NAME).$(POD_NAMESPACE).svc:9092"
    ) in c["args"]
    assert "--override=inter.broker.listener.name=REPLICATION" in c["args"]
    assert {"name": "replication", "containerPort": 9091} in c["ports"]
    assert "--node-id=auto" in c["args"]
    assert brk["template"]["spec"]["topologySpreadConstraints"][0]["topologyKey"] == (
        "topology.kubernetes.io/zone"
    )
    assert brk["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Delete"


def test_rack_aware_brokers_read_their_node_and_others_mount_no_token() -> None:
    key = "topology.kubernetes.io/zone"
    s = parse(body(brokers={"rack": {"topologyKey": key}}))
    pod = render.broker_statefulset(s, 3)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "demo-broker"
    assert pod["automountServiceAccountToken"] is True
    (init,) = pod["initContainers"]
    assert init["command"] == ["strait", "rack-from-node"]
    assert init["args"] == [f"--label={key}", f"--out={n.RACK_FILE}"]
    assert init["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    ]
    assert init["image"] == "straitmq:1" and init["securityContext"]["readOnlyRootFilesystem"]
    assert init["volumeMounts"] == [{"name": "rack", "mountPath": n.RACK_DIR}]
    (c,) = pod["containers"]
    assert f"--rack-file={n.RACK_FILE}" in c["args"]
    assert {"name": "rack", "mountPath": n.RACK_DIR, "readOnly": True} in c["volumeMounts"]
    assert {"name": "rack", "emptyDir": {"sizeLimit": "1Mi"}} in pod["volumes"]

    crb = render.rack_binding(s, "sm-straitmq-node-reader")
    assert crb["metadata"]["name"] == "straitmq-rack-prod-demo"
    assert "ownerReferences" not in crb["metadata"]  # cluster-scoped: the operator deletes it
    assert crb["metadata"]["labels"][n.CLUSTER_NAMESPACE_LABEL] == "prod"
    assert crb["roleRef"]["name"] == "sm-straitmq-node-reader"
    assert crb["subjects"] == [
        {"kind": "ServiceAccount", "name": "demo-broker", "namespace": "prod"}
    ]

    plain = parse(body())
    for sts in (render.broker_statefulset(plain, 3), render.controller_statefulset(s)):
        spec = sts["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert "initContainers" not in spec
        assert not [a for a in spec["containers"][0]["args"] if a.startswith("--rack")]
    # Turning rack awareness on changes the pods (a roll); clusters without it keep their
    # hash from before rack awareness existed.
    assert render.config_hash(s) != render.config_hash(plain)
    assert render.config_hash(plain) == "473757f81597ffc8"  # as before rack awareness


def test_config_change_changes_the_pod_template_hash() -> None:
    a = parse(body())
    b = parse(body(brokers={"config": {"message.max.bytes": 2000000}}))
    key = n.CONFIG_HASH_ANNOTATION
    ha = render.broker_statefulset(a, 3)["spec"]["template"]["metadata"]["annotations"][key]
    hb = render.broker_statefulset(b, 3)["spec"]["template"]["metadata"]["annotations"][key]
    assert ha != hb
    assert (
        ha
        == render.broker_statefulset(parse(body()), 5)["spec"]["template"]["metadata"][
            "annotations"
        ][key]
    ), "scaling alone must not restart pods"


SECURED = {"kafka": {"tls": True, "authentication": {"type": "scram-sha-512"}}}


def _broker(spec_body: dict) -> tuple[dict, dict, dict[str, str]]:
    """(container, pod annotations, the --override settings) of the rendered brokers."""
    sts = render.broker_statefulset(parse(spec_body), 3)["spec"]["template"]
    (c,) = sts["spec"]["containers"]
    props = dict(
        a.removeprefix("--override=").split("=", 1)
        for a in c["args"]
        if a.startswith("--override=")
    )
    return c, sts["metadata"]["annotations"], props


@pytest.mark.parametrize(
    "listeners, authorization, methods",
    [
        (SECURED, {"type": "simple", "superUsers": ["User:ops"]}, "mtls,basic"),
        (SECURED, None, "mtls,basic"),  # SCRAM alone: authenticated, no authorizer
        ({"kafka": {"tls": True}}, {"type": "simple"}, "mtls"),  # certificates only
    ],
)
def test_secured_cluster_serves_its_http_api_over_https_to_certificates_and_users(
    listeners: dict, authorization: dict | None, methods: str
) -> None:
    extra = {"authorization": authorization} if authorization else {}
    spec_body = body(listeners=listeners, **extra)
    spec = parse(spec_body)
    assert spec.http_secured
    c, annotations, props = _broker(spec_body)
    assert props["http.ssl.keystore.location"] == "/opt/straitmq/certs/$(POD_NAME).pem"
    assert props["http.ssl.truststore.location"] == "/opt/straitmq/certs/ca.crt"
    # `requested`: the kubelet's probes show no certificate; http.authentication makes
    # every path but /healthz, /readyz and /metrics need one (or a User's password).
    assert props["http.ssl.client.auth"] == "requested"
    assert props["http.authentication"] == methods
    assert props["http.metrics.require.authentication"] == "false"
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "http", "scheme": "HTTPS"}
    assert annotations["prometheus.io/scheme"] == "https"
    assert annotations["prometheus.io/path"] == "/metrics"
    # The operator calls the cluster at its https URL, with its certificate: a super user
    # beside the brokers' own (which they show each other on HTTP as on REPLICATION).
    assert cluster.admin_url(spec_body, spec) == "https://demo-bootstrap.prod.svc:8080"
    if authorization:
        supers = props["super.users"].split(";")
        assert supers[:2] == [
            "User:CN=demo-broker,O=straitmq",
            "User:CN=straitmq-operator,O=straitmq",
        ]
        assert supers[2:] == authorization.get("superUsers", [])
    else:
        assert "super.users" not in props and "authorizer.class.name" not in props
    # The controllers' port is https too, with their own certificates (a Secret no
    # broker mounts); the voters, the brokers and the operator are its only super users,
    # and every setting is one strait-controller takes.
    assert props["controller.http.ssl.enabled"] == "true"
    pod = render.controller_statefulset(spec)["spec"]["template"]["spec"]
    (ctl,) = pod["containers"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert ctl[probe]["httpGet"]["scheme"] == "HTTPS"
    assert pod["volumes"] == [{"name": "certs", "secret": {"secretName": "demo-controller-certs"}}]
    assert {"name": "certs", "mountPath": "/opt/straitmq/certs", "readOnly": True} in (
        ctl["volumeMounts"]
    )
    ctl_props = dict(
        a.removeprefix("--override=").split("=", 1)
        for a in ctl["args"]
        if a.startswith("--override=")
    )
    assert ctl_props["http.ssl.keystore.location"] == "/opt/straitmq/certs/$(POD_NAME).pem"
    assert ctl_props["http.authentication"] == "mtls"
    assert ctl_props["super.users"].split(";") == [
        "User:CN=demo-controller,O=straitmq",
        "User:CN=demo-broker,O=straitmq",
        "User:CN=straitmq-operator,O=straitmq",
    ]
    from straitmq.security.settings import CONTROLLER_KEYS

    assert set(ctl_props) <= CONTROLLER_KEYS


@pytest.mark.parametrize("listeners", [None, {"kafka": {"tls": True}}])
def test_open_or_tls_only_cluster_keeps_plain_http(listeners: dict | None) -> None:
    spec_body = body(listeners=listeners) if listeners else body()
    spec = parse(spec_body)
    assert not spec.http_secured
    c, annotations, props = _broker(spec_body)
    assert not [k for k in props if k.startswith("http.")]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert "prometheus.io/scheme" not in annotations
    assert cluster.admin_url(spec_body, spec) == "http://demo-bootstrap.prod.svc:8080"
    if listeners:  # TLS without authorization: no super users to add the operator to
        assert "super.users" not in props
    assert "controller.http.ssl.enabled" not in props
    ctl = render.controller_statefulset(spec)["spec"]["template"]["spec"]["containers"][0]
    assert "scheme" not in ctl["readinessProbe"]["httpGet"]
    assert not [a for a in ctl["args"] if a.startswith("--override=")]


def test_admin_url_annotation_wins_on_a_secured_cluster() -> None:
    spec_body = body(listeners=SECURED, authorization={"type": "simple"})
    spec_body["metadata"]["annotations"] = {n.ADMIN_URL_ANNOTATION: "https://127.0.0.1:1"}
    assert cluster.admin_url(spec_body, parse(spec_body)) == "https://127.0.0.1:1"


def layout(rng: random.Random, brokers: int, topics: int = 4, rf: int = 3) -> list[Topic]:
    out = []
    for t in range(topics):
        parts = []
        for i in range(rng.randint(1, 12)):
            reps = rng.sample(range(brokers), rf)
            parts.append(Partition(f"t{t}", i, reps, list(reps), reps[0], [], []))
        out.append(Topic(f"t{t}", "", False, rf, {}, 2, parts))
    return out


def apply(parts: list[Partition], moves: planning.Moves) -> list[Partition]:
    return [
        Partition(p.topic, p.index, moves.get((p.topic, p.index), p.replicas), [], -1, [], [])
        for p in parts
    ]


@pytest.mark.parametrize("seed", range(40))
def test_drain_moves_every_replica_off_and_keeps_replication(seed: int) -> None:
    rng = random.Random(seed)
    total = rng.randint(4, 7)
    keep = rng.randint(3, total - 1)
    parts = planning.all_partitions(layout(rng, total))
    moves = planning.drain(parts, set(range(keep, total)), list(range(keep)))
    after = apply(parts, moves)
    for before, p in zip(parts, after, strict=True):
        assert len(set(p.replicas)) == len(before.replicas) == 3
        assert all(b < keep for b in p.replicas)
        # replicas that stay keep their position (and so the preferred leader)
        for x, y in zip(before.replicas, p.replicas, strict=True):
            assert x == y or x >= keep
    counts = planning.replica_counts(after, range(keep))
    untouched = planning.replica_counts(
        [p for p in parts if (p.topic, p.index) not in moves], range(keep)
    )
    assert (
        max(counts.values()) - min(counts.values())
        <= max(untouched.values()) - min(untouched.values()) + 1
    )


@pytest.mark.parametrize("seed", range(40))
def test_spread_gives_new_brokers_their_share(seed: int) -> None:
    rng = random.Random(seed)
    old = rng.randint(3, 5)
    new = rng.randint(1, 3)
    parts = planning.all_partitions(layout(rng, old))
    brokers = list(range(old + new))
    moves = planning.spread_onto(parts, set(range(old, old + new)), brokers)
    after = apply(parts, moves)
    counts = planning.replica_counts(after, brokers)
    fair = sum(counts.values()) // len(brokers)
    for b in range(old, old + new):
        assert counts[b] >= min(fair, len(parts)), counts
    for p in after:
        assert len(set(p.replicas)) == 3
    assert planning.spread_onto(after, set(range(old, old + new)), brokers) == {}, "idempotent"
    leaders = Counter(p.replicas[0] for p in after)
    assert any(leaders[b] for b in range(old, old + new)), "leadership spreads too"


def test_refusals_and_min_isr_rules() -> None:
    reps = [0, 1, 2]
    t3 = Topic("orders", "", False, 3, {}, 2, [Partition("orders", 0, reps, [0, 1], 0, [], [])])
    t1 = Topic("scratch", "", False, 1, {}, 1, [Partition("scratch", 0, [2], [2], 2, [], [])])
    assert planning.blocking_topic([t3, t1], 2) is t3
    assert planning.blocking_topic([t3, t1], 3) is None
    # ISR {0,1} with min ISR 2: restarting 0 or 1 would go below; 2 is not in the ISR
    assert planning.restart_would_break_min_isr([t3, t1], 0) is t3
    assert planning.restart_would_break_min_isr([t3, t1], 2) is None, "RF1 topics do not block"
    assert planning.under_min_isr([t3, t1]) == 0


def test_operator_folder_never_shadows_the_stdlib_operator() -> None:
    """`operator/` must not be a package: from the repository root it would replace the
    standard library's `operator` (a fresh clone's `python -m venv` failed on it)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    assert not (root / "operator" / "__init__.py").exists()
    out = subprocess.run(
        [sys.executable, "-c", "import operator, collections; print(operator.eq(1, 1))"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


def test_replication_factor_growth_is_rack_aware_and_balanced() -> None:
    parts = [
        Partition("t", i, [i % 2, (i + 1) % 2], [i % 2, (i + 1) % 2], i % 2, [], [])
        for i in range(4)
    ]
    racks = {0: "a", 1: "a", 2: "b", 3: "c"}
    moves = planning.change_replication(parts, 3, racks, Counter({0: 4, 1: 4, 2: 0, 3: 0}))
    assert sorted(moves) == [("t", i) for i in range(4)]
    for p in parts:
        target = moves[(p.topic, p.index)]
        assert target[:2] == p.replicas  # the existing replicas keep their positions
        assert target[2] in (2, 3)  # a rack the partition lacks
    assert Counter(t[2] for t in moves.values()) == Counter({2: 2, 3: 2})  # spread evenly


def test_replication_factor_shrink_keeps_leaders_and_drops_lagging_replicas_first() -> None:
    p = Partition("t", 0, [0, 1, 2], [0, 2], 2, [], [])  # 1 is out of sync, 2 leads
    assert planning.change_replication([p], 2, {0: None, 1: None, 2: None}, Counter()) == {
        ("t", 0): [0, 2]
    }
    q = Partition("t", 1, [0, 1, 2], [0, 1, 2], 1, [], [])
    assert planning.change_replication([q], 2, {}, Counter()) == {("t", 1): [0, 1]}
    assert planning.change_replication([q], 1, {}, Counter()) == {("t", 1): [1]}  # the leader
    assert planning.change_replication([q], 3, {0: None, 1: None, 2: None}, Counter()) == {}


# -- User resources: the spec's ACL rules as bindings, and what to change -----------------


def user_body(name: str = "app", **spec) -> dict:
    return {
        "apiVersion": "straitmq.io/v1alpha1",
        "kind": "User",
        "metadata": {"name": name, "namespace": "prod", "uid": UID},
        "spec": {"cluster": "demo", "authentication": {"type": "scram-sha-512"}, **spec},
    }


def test_user_spec_turns_each_operation_into_a_binding() -> None:
    acls = [
        {"resource": {"type": "topic", "name": "orders"}, "operations": ["Write", "Describe"]},
        {
            "resource": {"type": "group", "name": "billing-", "patternType": "prefixed"},
            "operations": ["Read"],
            "host": "10.0.0.1",
            "type": "deny",
        },
        {"resource": {"type": "cluster"}, "operations": ["IdempotentWrite"]},
        {"resource": {"type": "transactionalId", "name": "tx"}, "operations": ["All"]},
    ]
    us = user.user_spec(user_body(authorization={"acls": acls}))
    assert us.mechanism == "SCRAM-SHA-512" and us.principal == "User:app"
    assert us.password_ref is None
    B = user.Binding
    assert us.acls == {
        B("TOPIC", "orders", "LITERAL", "User:app", "*", "WRITE", "ALLOW"),
        B("TOPIC", "orders", "LITERAL", "User:app", "*", "DESCRIBE", "ALLOW"),
        B("GROUP", "billing-", "PREFIXED", "User:app", "10.0.0.1", "READ", "DENY"),
        B("CLUSTER", "kafka-cluster", "LITERAL", "User:app", "*", "IDEMPOTENT_WRITE", "ALLOW"),
        B("TRANSACTIONAL_ID", "tx", "LITERAL", "User:app", "*", "ALL", "ALLOW"),
    }
    ref = {"password": {"valueFrom": {"secretKeyRef": {"name": "app-pw", "key": "pw"}}}}
    us = user.user_spec(user_body(authentication={"type": "scram-sha-256", **ref}))
    assert us.mechanism == "SCRAM-SHA-256" and us.password_ref == ("app-pw", "pw")
    assert us.acls == frozenset()


def test_tls_users_and_a_listener_that_takes_their_certificates() -> None:
    acls = [{"resource": {"type": "topic", "name": "orders"}, "operations": ["Read"]}]
    us = user.user_spec(user_body(authentication={"type": "tls"}, authorization={"acls": acls}))
    assert us.tls and us.principal == "User:CN=app"
    assert {b.principal for b in us.acls} == {"User:CN=app"}
    # The cluster's client listener: SSL, a certificate from the cluster CA required.
    spec_body = body(listeners={"kafka": {"tls": True, "authentication": {"type": "tls"}}})
    spec = parse(spec_body)
    assert spec.kafka_mtls and spec.kafka_sasl is None and spec.http_secured
    _, _, props = _broker(spec_body)
    assert props["listener.security.protocol.map"] == "REPLICATION:SSL,CLIENT:SSL"
    assert props["listener.name.client.ssl.client.auth"] == "required"
    assert props["http.authentication"] == "mtls"
    with pytest.raises(SpecError, match=r"need spec\.listeners\.kafka\.tls"):
        parse(body(listeners={"kafka": {"authentication": {"type": "tls"}}}))
    # A user's certificate has its CN alone; the cluster's own say O=straitmq.
    from straitmq.operator import pki

    ca_key, ca_crt = pki.new_ca("demo", "prod")
    _, crt = pki.issue(ca_key, ca_crt, "app", ["app"], organization=None)
    assert pki.certificate(crt).subject.rfc4514_string() == "CN=app"
    _, crt = pki.issue(ca_key, ca_crt, "demo-broker", ["x"])
    assert pki.certificate(crt).subject.rfc4514_string() == "CN=demo-broker,O=straitmq"


def test_user_spec_refusals() -> None:
    own = {
        "type": "scram-sha-512",
        "password": {"valueFrom": {"secretKeyRef": {"name": "app", "key": "pw"}}},
    }
    with pytest.raises(user.UserProblem) as e:
        user.user_spec(user_body(authentication=own))
    assert e.value.reason == "PasswordSecretConflict"
    with pytest.raises(user.UserProblem) as e:
        user.user_spec(user_body(authentication={"type": "plain"}))
    assert e.value.reason == "InvalidSpec"


def test_acl_changes_add_the_missing_and_remove_the_extra_bindings() -> None:
    B = user.Binding
    keep = B("TOPIC", "orders", "LITERAL", "User:app", "*", "WRITE", "ALLOW")
    new = B("TOPIC", "orders", "LITERAL", "User:app", "*", "READ", "ALLOW")
    # Same resource and operation, other host or permission: a different binding.
    stale = [
        B("TOPIC", "orders", "LITERAL", "User:app", "10.0.0.1", "WRITE", "ALLOW"),
        B("TOPIC", "orders", "LITERAL", "User:app", "*", "READ", "DENY"),
        B("TOPIC", "orders", "PREFIXED", "User:app", "*", "WRITE", "ALLOW"),
    ]
    create, delete = user.acl_changes(frozenset({keep, new}), [keep, *stale])
    assert create == [new] and delete == sorted(stale)
    assert user.acl_changes(frozenset({keep}), [keep]) == ([], [])
    assert user.acl_changes(frozenset(), [keep]) == ([], [keep])
    # What the broker answers parses back to the same binding.
    assert user.Binding.from_json(keep.as_json()) == keep


def test_user_secret_values() -> None:
    assert user.jaas_config("app", 'p"w\\') == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="app" password="p\\"w\\\\";'
    )
    d = user.credential_digest(UID, "SCRAM-SHA-512", "pw")
    assert d == user.credential_digest(UID, "SCRAM-SHA-512", "pw")
    assert d != user.credential_digest(UID, "SCRAM-SHA-512", "pw2")
    assert d != user.credential_digest(UID, "SCRAM-SHA-256", "pw")
    spec = parse(body())
    assert user.bootstrap_servers(body(), spec) == "demo-bootstrap.prod.svc:9092"
    annotated = body()
    annotated["metadata"]["annotations"] = {n.BOOTSTRAP_ANNOTATION: "127.0.0.1:1"}
    assert user.bootstrap_servers(annotated, spec) == "127.0.0.1:1"
    # The client settings every User Secret carries are properties librdkafka takes as
    # they are (a misspelt name or a bad value raises here); a connect that gets no
    # answer is given up well within the issue's 5 s (kube-proxy's race, user.py).
    Producer({"bootstrap.servers": "127.0.0.1:1", **user.CLIENT_SETTINGS}).flush(0)
    assert int(user.CLIENT_SETTINGS["socket.connection.setup.timeout.ms"]) < 5000


# ------------------------------------------------------------- external listeners (issue 27)


def external(*listeners_: dict, **spec: object) -> dict:
    return body(listeners={"external": list(listeners_)}, **spec)


INGRESS = {
    "name": "ing",
    "type": "ingress",
    "port": 9096,
    "tls": True,
    "configuration": {
        "class": "public",
        "bootstrap": {"host": "kafka.example.com"},
        "brokers": [{"broker": b, "host": f"kafka-{b}.example.com"} for b in range(3)],
    },
}


@pytest.mark.parametrize(
    ("listener", "error"),
    [
        ({"name": "Ext", "type": "nodeport", "port": 9094}, "1-11 lowercase"),
        ({"name": "client", "type": "nodeport", "port": 9094}, "'client' is taken"),
        ({"name": "ext", "type": "hostport", "port": 9094}, "is not one of internal"),
        ({"name": "ext", "type": "nodeport", "port": 8080}, "taken by the http listener"),
        (
            {"name": "ext", "type": "nodeport", "port": 9094, "authentication": {"type": "tls"}},
            "tls needs tls: true",
        ),
        ({"name": "ing", "type": "ingress", "port": 9096}, "needs tls: true"),
        (
            {**INGRESS, "configuration": {"bootstrap": {"host": "k.example.com"}}},
            "missing: broker 0, broker 1, broker 2",
        ),
    ],
)
def test_external_listener_spec_errors_say_which_field(listener: dict, error: str) -> None:
    with pytest.raises(SpecError, match=error):
        parse(external(listener))


def test_two_external_listeners_cannot_share_a_port_or_a_name() -> None:
    one = {"name": "one", "type": "nodeport", "port": 9094}
    with pytest.raises(SpecError, match="port 9094 is taken by the one listener"):
        parse(external(one, {**one, "name": "two"}))
    with pytest.raises(SpecError, match="'one' is taken"):
        parse(external(one, {**one, "port": 9095}))


def test_external_listeners_render_per_broker_services_ingresses_and_listener_args() -> None:
    nodeport = {
        "name": "ext",
        "type": "nodeport",
        "port": 9094,
        "tls": True,
        "authentication": {"type": "scram-sha-512"},
        "configuration": {
            "bootstrap": {"nodePort": 31900},
            "brokers": [{"broker": 1, "nodePort": 31901}],
        },
    }
    lb = {"name": "lb", "type": "loadbalancer", "port": 9095}
    inner = {"name": "in", "type": "internal", "port": 9097}
    s = parse(external(nodeport, lb, INGRESS, inner))
    assert s.needs_certificates and not s.kafka_tls and not s.http_secured
    svcs = {o["metadata"]["name"]: o for o in listeners.services(s, 3)}
    assert set(svcs) == {
        f"demo-{x}-{b}" for x in ("ext", "lb", "ing") for b in ("bootstrap", 0, 1, 2)
    }
    assert svcs["demo-ext-0"]["spec"]["type"] == "NodePort"
    assert svcs["demo-lb-2"]["spec"]["type"] == "LoadBalancer"
    assert svcs["demo-ing-1"]["spec"]["type"] == "ClusterIP"
    assert svcs["demo-ext-bootstrap"]["spec"]["ports"][0]["nodePort"] == 31900
    assert svcs["demo-ext-1"]["spec"]["ports"][0]["nodePort"] == 31901
    assert "nodePort" not in svcs["demo-ext-2"]["spec"]["ports"][0]
    # One broker each (the StatefulSet's pod-name label), the bootstrap all of them;
    # neither publishes not-ready (terminating) pods.
    assert svcs["demo-ext-2"]["spec"]["selector"] == {
        **n.selector("demo", n.BROKER),
        "statefulset.kubernetes.io/pod-name": "demo-broker-2",
    }
    assert svcs["demo-ext-bootstrap"]["spec"]["selector"] == n.selector("demo", n.BROKER)
    for svc in svcs.values():
        assert "publishNotReadyAddresses" not in svc["spec"]
        assert svc["metadata"]["labels"][n.LISTENER_LABEL] in ("ext", "lb", "ing")
        assert svc["spec"]["ports"][0]["targetPort"] == svc["spec"]["ports"][0]["name"]
    # Scaling: the per-broker Services follow the broker count.
    assert {o["metadata"]["name"] for o in listeners.services(s, 5)} >= {"demo-lb-4"}
    ings = {o["metadata"]["name"]: o for o in listeners.ingresses(s, 3)}
    assert set(ings) == {"demo-ing-bootstrap", "demo-ing-0", "demo-ing-1", "demo-ing-2"}
    ing = ings["demo-ing-2"]
    assert ing["apiVersion"] == "networking.k8s.io/v1"
    assert ing["metadata"]["annotations"]["nginx.ingress.kubernetes.io/ssl-passthrough"] == "true"
    assert ing["spec"]["ingressClassName"] == "public"
    (rule,) = ing["spec"]["rules"]
    assert rule["host"] == "kafka-2.example.com"
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "demo-ing-2", "port": {"number": 9096}}
    assert ings["demo-ing-bootstrap"]["spec"]["rules"][0]["host"] == "kafka.example.com"

    objs = {(o["kind"], o["metadata"]["name"]): o for o in render.objects(s, 3)}
    boot_ports = {p["name"] for p in objs[("Service", "demo-bootstrap")]["spec"]["ports"]}
    assert boot_ports == {"kafka", "http", "ext-in"}  # the internal one's port too
    sts = objs[("StatefulSet", "demo-broker")]["spec"]["template"]["spec"]
    (c,) = sts["containers"]
    args = c["args"]
    assert not any(a.startswith("--advertise=") for a in args)
    assert "--properties=/opt/straitmq/advertised/$(POD_NAME).properties" in args
    assert (
        "--override=listeners=REPLICATION://0.0.0.0:9091,PLAINTEXT://0.0.0.0:9092,"
        "EXT_EXT://0.0.0.0:9094,EXT_LB://0.0.0.0:9095,EXT_ING://0.0.0.0:9096,"
        "EXT_IN://0.0.0.0:9097"
    ) in args
    assert (
        "--override=listener.security.protocol.map=REPLICATION:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
        "EXT_EXT:SASL_SSL,EXT_LB:PLAINTEXT,EXT_ING:SSL,EXT_IN:PLAINTEXT"
    ) in args
    assert "--override=inter.broker.listener.name=REPLICATION" in args
    assert "--override=listener.name.ext_ext.sasl.enabled.mechanisms=SCRAM-SHA-512" in args
    assert (
        "--override=listener.name.ext_ing.ssl.keystore.location=/opt/straitmq/certs/$(POD_NAME).pem"
    ) in args
    assert {p["name"] for p in c["ports"]} >= {"ext-ext", "ext-lb", "ext-ing", "ext-in"}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts[n.ADVERTISED_VOLUME] == "/opt/straitmq/advertised"
    assert mounts[n.CERTS_VOLUME] == "/opt/straitmq/certs"  # a TLS listener: certificates
    assert ("ConfigMap", "demo-advertised") in objs

    flags = [a for a in args if a.startswith("--shutdown-readiness-probes=")]
    assert flags == [f"--shutdown-readiness-probes={render.BROKER_SHUTDOWN_PROBES}"]
    # The pod has been unready a while (endpoints and kube-proxy updated) when it exits.
    assert render.BROKER_SHUTDOWN_PROBES > render.BROKER_READINESS_FAILURES + 1
    assert c["readinessProbe"]["periodSeconds"] == render.BROKER_READINESS_PERIOD_S
    assert c["readinessProbe"]["failureThreshold"] == render.BROKER_READINESS_FAILURES
    assert BrokerConfig().shutdown_readiness_probes == 0  # off outside Kubernetes


def _pod_args(container: dict, files: dict[str, str], tmp_path: Path) -> list[str]:
    """Broker 0's command line as its pod runs it: the pod's properties files written
    where the args name them, `$(VAR)` from the pod's environment, and the node id the
    pod's host name (demo-broker-0) gives."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {"POD_NAME": "demo-broker-0", "POD_NAMESPACE": "prod", "STRAIT_CLUSTER_ID": "x"}
    env["STRAIT_CONTROLLER_VOTERS"] = "1000@c:9093"
    args = [
        re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], x).replace(
            n.ADVERTISED_DIR, str(tmp_path)
        )
        for x in container["args"]
    ]
    return [x if x != "--node-id=auto" else "--node-id=0" for x in args]


def test_the_broker_takes_the_rendered_listeners_and_its_pods_file(tmp_path: Path) -> None:
    lb = {
        "name": "lb",
        "type": "loadbalancer",
        "port": 9095,
        "authentication": {"type": "scram-sha-256"},
    }
    s = parse(external(lb))
    stored = _stored(s, 1)
    stored["demo-lb-0"]["status"] = {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}
    a = listeners.resolve(s, 1, stored, {})
    (c,) = render.broker_statefulset(s, 1)["spec"]["template"]["spec"]["containers"]
    cfg = broker_main.parse_args(_pod_args(c, listeners.advertised_properties(s, 1, a), tmp_path))
    specs = {x.name: x for x in resolve_listeners(cfg)}
    assert list(specs) == ["REPLICATION", "PLAINTEXT", "EXT_LB"]  # the inter-broker one first
    assert specs["EXT_LB"].protocol == "SASL_PLAINTEXT" and specs["EXT_LB"].port == 9095
    assert (specs["EXT_LB"].advertised_host, specs["EXT_LB"].advertised_port) == (
        "198.51.100.7",
        9095,
    )
    assert specs["REPLICATION"].advertised_host == "demo-broker-0.demo-broker.prod.svc"
    assert specs["PLAINTEXT"].advertised_host == "demo-broker-0.prod.svc"  # its own Service
    assert cfg.shutdown_readiness_probes == render.BROKER_SHUTDOWN_PROBES


def test_a_nodeport_broker_advertises_its_own_nodes_address_from_its_first_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No pod is scheduled yet when a cluster is created, so no node address is known;
    the node ports are (their Services come first). The broker reads its node's address
    from status.hostIP when it starts, so it advertises the right address at once and
    is not restarted once the operator learns it (Strimzi's init container's job)."""
    ext = {"name": "ext", "type": "nodeport", "port": 9094}
    s = parse(external(ext))
    stored = _stored(s, 1)
    stored["demo-ext-0"]["spec"]["ports"][0]["nodePort"] = 31001
    stored["demo-ext-bootstrap"]["spec"]["ports"][0]["nodePort"] = 31000
    a = listeners.resolve(s, 1, stored, {})  # not scheduled: the operator knows no node
    assert a.brokers["ext"] == {0: None}
    (c,) = render.broker_statefulset(s, 1)["spec"]["template"]["spec"]["containers"]
    assert {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}} in c[
        "env"
    ]
    args = _pod_args(c, listeners.advertised_properties(s, 1, a), tmp_path)
    monkeypatch.setenv("HOST_IP", "192.0.2.10")  # as the kubelet sets it
    specs = {x.name: x for x in resolve_listeners(broker_main.parse_args(args))}
    assert (specs["EXT_EXT"].advertised_host, specs["EXT_EXT"].advertised_port) == (
        "192.0.2.10",
        31001,
    )
    # Scheduled: the operator's view is the same address, so nothing is restarted.
    assert listeners.resolve(s, 1, stored, {0: "192.0.2.10"}).brokers["ext"][0] == (
        "192.0.2.10",
        31001,
    )
    # Without the variable the broker refuses to start rather than advertise "${env:...}".
    monkeypatch.delenv("HOST_IP")
    with pytest.raises(SystemExit):
        broker_main.parse_args(args)
    # Only a cluster with a node port listener gets the variable (another pod template
    # would restart every other cluster's brokers).
    (c,) = render.broker_statefulset(parse(body()), 1)["spec"]["template"]["spec"]["containers"]
    assert all(e["name"] != "HOST_IP" for e in c["env"])


def test_config_providers_resolve_the_environment_and_refuse_what_they_cannot() -> None:
    """Kafka's ${env:NAME} (KIP-887's EnvVarConfigProvider, declared as Kafka declares
    it); the declarations are used up, a reference to an undeclared provider is kept."""
    from straitmq.properties import ENV_PROVIDER, resolve_providers

    declared = {"config.providers": "env", "config.providers.env.class": ENV_PROVIDER}
    props = {**declared, "advertised.listeners": "EXT://${env:HOST_IP}:31001", "x": "${vault:k}"}
    assert resolve_providers(props, {"HOST_IP": "10.0.0.7"}) == {
        "advertised.listeners": "EXT://10.0.0.7:31001",
        "x": "${vault:k}",
    }
    assert resolve_providers({"x": "${env:HOST_IP}"}, {}) == {"x": "${env:HOST_IP}"}  # none
    with pytest.raises(ValueError, match="the environment has no HOST_IP"):
        resolve_providers(props, {})
    file_provider = "org.apache.kafka.common.config.provider.FileConfigProvider"
    with pytest.raises(ValueError, match="not supported"):
        resolve_providers({**declared, "config.providers.env.class": file_provider}, {})


def test_kafka_tls_cluster_keeps_its_listeners_and_adds_the_external_ones() -> None:
    ext = {"name": "ext", "type": "nodeport", "port": 9094, "tls": True}
    kafka = {"tls": True, "authentication": {"type": "scram-sha-512"}}
    s = parse(body(listeners={"kafka": kafka, "external": [ext]}))
    (c,) = render.broker_statefulset(s, 3)["spec"]["template"]["spec"]["containers"]
    args = c["args"]
    # advertised.listeners comes from the pod's file only (an --override would win).
    assert not any(a.startswith("--override=advertised.listeners=") for a in args)
    assert (
        "--override=listeners=REPLICATION://0.0.0.0:9091,CLIENT://0.0.0.0:9092,"
        "EXT_EXT://0.0.0.0:9094"
    ) in args
    assert (
        "--override=listener.security.protocol.map=REPLICATION:SSL,CLIENT:SASL_SSL,EXT_EXT:SSL"
    ) in args
    assert "--override=inter.broker.listener.name=REPLICATION" in args
    assert sum(a.startswith("--override=listeners=") for a in args) == 1
    props = listeners.advertised_properties(s, 1, listeners.Addresses())
    assert props == {
        "demo-broker-0.properties": "advertised.listeners="
        "REPLICATION://demo-broker-0.demo-broker.prod.svc:9091,"
        "CLIENT://demo-broker-0.prod.svc:9092,"
        "EXT_EXT://demo-broker-0.demo-broker.prod.svc:9094\n"
    }


def _stored(s: object, brokers: int) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in listeners.services(s, brokers)}  # type: ignore[arg-type]


def test_addresses_come_from_node_ports_load_balancer_status_hosts_and_overrides() -> None:
    nodeport = {
        "name": "ext",
        "type": "nodeport",
        "port": 9094,
        "tls": True,
        "configuration": {"brokers": [{"broker": 2, "advertisedHost": "edge.example.com"}]},
    }
    lb = {
        "name": "lb",
        "type": "loadbalancer",
        "port": 9095,
        "tls": True,
        "configuration": {"brokers": [{"broker": 0, "advertisedPort": 19095}]},
    }
    s = parse(external(nodeport, lb, INGRESS))
    stored = _stored(s, 3)
    for i, name in enumerate(["demo-ext-bootstrap", "demo-ext-0", "demo-ext-1", "demo-ext-2"]):
        stored[name]["spec"]["ports"][0]["nodePort"] = 31000 + i
    stored["demo-lb-1"]["status"] = {"loadBalancer": {"ingress": [{"hostname": "lb1.aws"}]}}
    # Broker 1 not scheduled yet: advertised at another broker's node (node ports
    # answer on every node).
    a = listeners.resolve(s, 3, stored, {0: "192.0.2.10", 2: "192.0.2.12"})
    assert a.brokers["ext"] == {
        0: ("192.0.2.10", 31001),
        1: ("192.0.2.10", 31002),
        2: ("edge.example.com", 31003),
    }
    assert a.bootstrap["ext"] == ("192.0.2.10", 31000)
    # No load balancer address yet for 0 and 2 (0's override has a port, not a host).
    assert a.brokers["lb"] == {0: None, 1: ("lb1.aws", 9095), 2: None}
    assert a.bootstrap["lb"] is None
    assert a.brokers["ing"][1] == ("kafka-1.example.com", 443)
    assert a.bootstrap["ing"] == ("kafka.example.com", 443)
    assert a.pending(3) == ["lb"]
    assert listeners.unknown(a, range(1, 2)) == []
    assert listeners.unknown(a, range(2, 3)) == ["lb"]
    # Until a load balancer has an address its broker advertises its pod DNS name. On
    # the node port, the address of whichever node it runs on, read where it runs.
    props = listeners.advertised_properties(s, 3, a)["demo-broker-0.properties"]
    assert props == (
        "config.providers=env\n"
        "config.providers.env.class=org.apache.kafka.common.config.provider.EnvVarConfigProvider\n"
        "advertised.listeners=REPLICATION://demo-broker-0.demo-broker.prod.svc:9091,"
        "PLAINTEXT://demo-broker-0.prod.svc:9092,EXT_EXT://${env:HOST_IP}:31001,EXT_LB://demo-broker-0.demo-broker.prod.svc:9095,"
        "EXT_ING://kafka-0.example.com:443\n"
    )
    # Broker 2's advertisedHost stands: no node address for it.
    props = listeners.advertised_properties(s, 3, a)["demo-broker-2.properties"]
    assert "EXT_EXT://edge.example.com:31003," in props
    stored["demo-lb-0"]["status"] = {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}
    stored["demo-lb-2"]["status"] = {"loadBalancer": {"ingress": [{"ip": "198.51.100.9"}]}}
    stored["demo-lb-bootstrap"]["status"] = {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}}
    a = listeners.resolve(s, 3, stored, {0: "192.0.2.10", 2: "192.0.2.12"})
    assert a.pending(3) == []
    assert a.brokers["lb"][0] == ("198.51.100.7", 19095)
    # The certificate: every TLS listener's address of this broker and its bootstraps.
    names = certificates.broker_dns_names(s, 0, a)
    assert names[:4] == [
        "demo-broker-0.demo-broker.prod.svc",
        "demo-broker-0.demo-broker.prod.svc.cluster.local",
        "demo-broker-0.prod.svc",  # its own Service: what it advertises to clients
        "demo-broker-0.prod.svc.cluster.local",
    ]
    assert set(names[6:]) == {
        "192.0.2.10",
        "198.51.100.7",
        "198.51.100.1",
        "kafka-0.example.com",
        "kafka.example.com",
    }
    assert listeners.status(s, 3, a) == [
        {
            "name": "ext",
            "type": "nodeport",
            "bootstrapServers": "192.0.2.10:31000",
            "addresses": ["192.0.2.10:31001", "192.0.2.10:31002", "edge.example.com:31003"],
        },
        {
            "name": "lb",
            "type": "loadbalancer",
            "bootstrapServers": "198.51.100.1:9095",
            "addresses": ["198.51.100.7:19095", "lb1.aws:9095", "198.51.100.9:9095"],
        },
        {
            "name": "ing",
            "type": "ingress",
            "bootstrapServers": "kafka.example.com:443",
            "addresses": [f"kafka-{b}.example.com:443" for b in range(3)],
        },
    ]


def test_certificates_carry_ip_addresses_as_ip_sans() -> None:
    key, crt = pki.new_ca("demo", "prod")
    names = ["demo-broker-0.demo-broker.prod.svc", "172.31.255.1", "kafka.example.com"]
    _, c = pki.issue(key, crt, "demo-broker", names)
    cert = pki.certificate(c)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["172.31.255.1"]
    assert "172.31.255.1" not in san.get_values_for_type(x509.DNSName)
    assert sorted(pki.dns_names(cert)) == sorted(names)
    assert pki.needs_new(c, crt, names) is None
    assert pki.needs_new(c, crt, [*names, "172.31.255.2"]) == "its DNS names changed"


def test_pod_template_hash_follows_the_listeners_not_their_addresses() -> None:
    one = {"name": "ext", "type": "nodeport", "port": 9094}
    plain = render.config_hash(parse(body()))
    with_one = render.config_hash(parse(external(one)))
    assert plain != with_one
    assert render.config_hash(parse(external({**one, "tls": True}))) != with_one
    # An override changes what a broker advertises (its own file), not the template.
    moved = {**one, "configuration": {"brokers": [{"broker": 0, "advertisedHost": "x.example"}]}}
    assert render.config_hash(parse(external(moved))) == with_one
    # The controllers do not restart for a listener.
    ctl = render.controller_statefulset(parse(external(one)))["spec"]["template"]
    plain_ctl = render.controller_statefulset(parse(body()))["spec"]["template"]
    assert ctl == plain_ctl


# --- pausing, manual rolls, status phases, the managed record ----------------------------


def test_pause_annotation_keeps_the_status_and_says_so() -> None:
    b = body(brokers={"replicas": 3})
    b["metadata"] |= {"generation": 5, "annotations": {n.PAUSE_ANNOTATION: "true"}}
    b["status"] = {
        "observedGeneration": 4,
        "phase": "Ready",
        "brokers": {"ready": 3},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": ""}],
    }
    assert conditions.paused(b)
    st = conditions.paused_status(b)
    # What the last pass saw stays; generation 5 is not applied.
    assert st["phase"] == "Paused" and st["observedGeneration"] == 4
    assert st["brokers"] == {"ready": 3}
    c = conditions.get_condition(st["conditions"], "ReconciliationPaused")
    assert c is not None and c["status"] == "True" and c["observedGeneration"] == 5
    assert "generation 5 not applied" in c["message"]
    progressing = conditions.get_condition(st["conditions"], "Progressing")
    assert progressing is not None and progressing["status"] == "False"
    assert conditions.get_condition(st["conditions"], "Ready")["status"] == "True"
    # Unpaused: the next pass's status drops the condition.
    back = conditions.unpaused(st)
    assert conditions.get_condition(back["conditions"], "ReconciliationPaused") is None
    for value in ("false", "", "yes"):
        b["metadata"]["annotations"][n.PAUSE_ANNOTATION] = value
        assert not conditions.paused(b)
    # A Topic has no phase.
    t = {"kind": "Topic", "metadata": {"generation": 1, "annotations": {}}, "status": {}}
    assert "phase" not in conditions.paused_status(t)


def pod(name: str, revision: str, annotations: dict | None = None, deleting: bool = False) -> dict:
    meta: dict = {
        "name": name,
        "labels": {"controller-revision-hash": revision},
        "annotations": annotations or {},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta}


def test_a_pod_is_due_for_restart_when_outdated_or_asked_for() -> None:
    assert not cluster.restart_due(pod("demo-broker-0", "r2"), "r2")
    assert cluster.restart_due(pod("demo-broker-0", "r1"), "r2")
    asked = pod("demo-broker-1", "r2", {n.ROLL_ANNOTATION: "true"})
    assert cluster.manual_roll(asked) and cluster.restart_due(asked, "r2")
    assert not cluster.restart_due(pod("demo-broker-1", "r2", {n.ROLL_ANNOTATION: "false"}), "r2")
    # On its way out already: nothing to restart, whatever it carries.
    assert not cluster.restart_due(
        pod("demo-broker-2", "r1", {n.ROLL_ANNOTATION: "true"}, deleting=True), "r2"
    )
    mq = body()
    mq["metadata"]["annotations"] = {n.ROLL_ANNOTATION: "True"}
    assert cluster.manual_roll(mq)


def sts(ready: int, replicas: int = 3) -> dict:
    return {"status": {"readyReplicas": ready, "replicas": replicas}}


def status_of(p: cluster.Pass, seen: cluster.Observed, ready: int, old_phase: str) -> dict:
    events: list = []
    r = cluster.ClusterReconciler(None, lambda *e: events.append(e))  # type: ignore[arg-type]
    spec = parse(body(brokers={"replicas": 3}))
    sets = {n.BROKER: sts(ready), n.CONTROLLER: sts(3)}
    return r._status(spec, {"phase": old_phase}, 2, seen, p, 3, sets)


def healthy() -> cluster.Observed:
    return cluster.Observed(
        cluster={
            "controller": 1000,
            "brokers": [{"id": i} for i in range(3)],
            "offline_partitions": 0,
            "under_replicated_partitions": 0,
        },
        topics=[],
    )


def test_status_phases_tell_the_truth() -> None:
    # A roll waiting for its last restarted broker: Rolling, not Degraded.
    st = status_of(
        cluster.Pass(phase="Rolling", progressing=("Rolling", "w")), healthy(), 2, "Rolling"
    )
    assert st["phase"] == "Rolling"
    assert conditions.get_condition(st["conditions"], "Degraded")["status"] == "False"
    # Every broker down, the admin API away: not Ready, whatever the last phase.
    down = cluster.Observed(error="connection refused")
    st = status_of(cluster.Pass(), down, 0, "Ready")
    assert st["phase"] == "Degraded"
    assert conditions.get_condition(st["conditions"], "Ready")["status"] == "False"
    # Every broker down during a roll: Degraded, not a roll's ordinary state.
    st = status_of(cluster.Pass(phase="Rolling"), down, 0, "Rolling")
    assert st["phase"] == "Degraded"
    assert conditions.get_condition(st["conditions"], "Degraded")["reason"] == "NoBrokersReady"
    # One broker not Ready outside a roll: Degraded, PodsNotReady.
    st = status_of(cluster.Pass(), healthy(), 2, "Ready")
    assert st["phase"] == "Degraded"
    assert conditions.get_condition(st["conditions"], "Degraded")["reason"] == "PodsNotReady"
    st = status_of(cluster.Pass(), healthy(), 3, "Degraded")
    assert st["phase"] == "Ready"
    assert conditions.get_condition(st["conditions"], "Ready")["status"] == "True"


def test_topic_isr_health() -> None:
    parts = [
        Partition("t", 0, [0, 1, 2], [0, 1, 2], 0, [], []),
        Partition("t", 1, [0, 1, 2], [1, 2], 1, [], []),
        Partition("t", 2, [0, 1, 2], [2], 2, [], []),
        Partition("t", 3, [0, 1, 2], [], -1, [], []),
    ]
    topic = Topic("t", "id", False, 3, {}, 2, parts)
    assert planning.isr_health(topic) == {
        "minInSyncReplicas": 2,
        "underReplicatedPartitions": 3,
        "underMinIsrPartitions": 2,
        "offlinePartitions": 1,
    }


def resource(kind: str, name: str, cluster_name: str = "demo", **extra: object) -> dict:
    meta: dict = {"name": name}
    if extra.pop("deleting", False):
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"kind": kind, "metadata": meta, "spec": {"cluster": cluster_name, **extra}}


def test_the_record_sweeps_what_no_resource_claims() -> None:
    record = {
        "topic.orders": "orders",
        "topic.audit-log": "audit",
        "topic.gone": "gone",
        "topic.other-cluster": "x",
        "topic.deleting": "deleting",
        "user.alice": managed.SCRAM,
        "user.bob": managed.TLS,
        "unknown.key": "left alone",
    }
    topics = [
        resource("Topic", "orders"),
        resource("Topic", "audit", topicName="audit-log"),  # claimed by its topicName
        resource("Topic", "other-cluster", cluster_name="other"),
        resource("Topic", "deleting", deleting=True),
    ]
    users = [resource("User", "alice")]
    assert managed.stale(record, "demo", topics, users) == [
        "topic.deleting",
        "topic.gone",
        "topic.other-cluster",
        "user.bob",
    ]
    assert managed.stale({}, "demo", topics, users) == []
    cm = managed.config_map(body(), {"topic.orders": "orders"})
    (owner,) = cm["metadata"]["ownerReferences"]
    assert owner["uid"] == UID and owner["kind"] == "MQCluster"
    assert cm["metadata"]["name"] == n.managed_config_map("demo") == "demo-managed"


# --- the controller quorum (spec.controllers.replicas: 1, 3 or 5) ----------------------


def test_static_voters_are_the_first_set_whatever_the_spec_says_now() -> None:
    five = parse(body(controllers={"replicas": 5}))
    assert (five.controllers, five.first_voters, five.initial_voters) == (5, None, 5)
    cm = render.config_map(five)["data"]["STRAIT_CONTROLLER_VOTERS"].split(",")
    assert [v.split("@")[0] for v in cm] == ["1000", "1001", "1002", "1003", "1004"]
    # Created with three, now asked for five: the pods still start with the three (the
    # voter set is log data), so the pod template, and its hash, do not change.
    three = parse(body())
    grown = body(controllers={"replicas": 5})
    grown["status"] = {"controllers": {"initialVoters": 3}}
    g = parse(grown)
    assert g.initial_voters == 3
    assert render.config_map(g)["data"] == render.config_map(three)["data"]
    assert render.config_hash(g) == render.config_hash(three)
    objs = {o["metadata"]["name"]: o for o in render.objects(g, 3, controller_replicas=4)}
    assert objs["demo-controller"]["spec"]["replicas"] == 4  # the reconciler's choice
    objs = {o["metadata"]["name"]: o for o in render.objects(g, 3)}
    assert objs["demo-controller"]["spec"]["replicas"] == 5
    # One controller: one static voter, one pod.
    one = parse(body(controllers={"replicas": 1}))
    assert render.voters(one) == "1000@demo-controller-0.demo-controller.prod.svc:9093"
    assert render.controller_statefulset(one)["spec"]["replicas"] == 1


def test_a_controller_pod_beyond_the_first_voters_gets_its_ordinals_id() -> None:
    voters = {1000 + i: f"http://demo-controller-{i}.demo-controller.ns.svc:9093" for i in range(3)}
    assert voter_for_hostname(voters, "demo-controller-1") == 1001
    assert voter_for_hostname(voters, "demo-controller-4") == 1004  # joins as an observer
    with pytest.raises(ValueError, match="matches 0 of the voters"):
        voter_for_hostname(voters, "other-controller-4")
    # Voters numbered without one base: no guess.
    odd = {7: "http://demo-controller-0.x:9093", 9: "http://demo-controller-1.x:9093"}
    with pytest.raises(ValueError):
        voter_for_hostname(odd, "demo-controller-3")


def qview(
    voters: dict[int, str | None],
    leader: int = 1000,
    observers: list[dict] | None = None,
    pending: bool = False,
    down: tuple[int, ...] = (),
) -> dict:
    """The admin API's /api/v1/quorum: voters {id: directory id}, all caught up unless
    `down`."""
    return {
        "leader_id": leader,
        "voters": [
            {
                "node_id": i,
                "directory_id": d,
                "reachable": i not in down,
                "lag": None if i in down else 0,
            }
            for i, d in voters.items()
        ],
        "observers": observers or [],
        "voter_change_pending": pending,
    }


def cpod(i: int, directory: str | None = None, ready: bool = True) -> quorum.ControllerPod:
    st = {"node_id": 1000 + i, "directory_id": directory or f"d{i}"}
    return quorum.ControllerPod(i, ready, st)


def obs(i: int, directory: str | None = None, lag: int = 0) -> dict:
    return {"node_id": 1000 + i, "directory_id": directory or f"d{i}", "lag": lag}


THREE = {1000: "d0", 1001: "d1", 1002: "d2"}
FIVE = {**THREE, 1003: "d3", 1004: "d4"}


def test_quorum_plan_idle_unknown_pending_and_foreign() -> None:
    idle = quorum.plan(3, 3, qview(THREE), {})
    assert (idle.action, idle.replicas, idle.changing) == (quorum.IDLE, 3, False)
    assert not quorum.wants_pod_status(qview(THREE), 3)
    # The quorum unknown: nothing changes, the StatefulSet may grow but never shrinks.
    blind = quorum.plan(3, 5, None, {})
    assert (blind.action, blind.replicas) == (quorum.WAIT, 5)
    assert quorum.plan(5, 3, None, {}).replicas == 5
    # A change not committed yet: wait, whatever else is due.
    pending = quorum.plan(5, 5, qview(THREE, pending=True), {i: cpod(i) for i in range(5)})
    assert (pending.action, pending.changing) == (quorum.WAIT, True)
    # Voters that are no pod of this cluster (added by hand): never touched.
    foreign = quorum.plan(3, 3, qview({1001: "a", 1002: "b", 1003: "c"}), {})
    assert foreign.action == quorum.UNMANAGED and "1003" in foreign.reason


def test_quorum_plan_scale_up_adds_the_lowest_caught_up_pod_one_at_a_time() -> None:
    view = qview(THREE)
    assert quorum.wants_pod_status(view, 5)
    # The StatefulSet grows first; the new pod must be Ready, answer, and follow.
    step = quorum.plan(5, 3, view, {i: cpod(i) for i in range(3)})
    assert (step.action, step.replicas, step.node_id) == (quorum.WAIT, 5, 1003)
    assert "not Ready" in step.reason and step.changing
    pods = {i: cpod(i) for i in range(5)}
    step = quorum.plan(5, 5, view, {**pods, 3: cpod(3, ready=False)})
    assert step.action == quorum.WAIT and "not Ready" in step.reason
    step = quorum.plan(5, 5, view, pods)
    assert step.action == quorum.WAIT and "not fetching" in step.reason
    step = quorum.plan(5, 5, qview(THREE, observers=[obs(3, lag=5000), obs(4)]), pods)
    assert step.action == quorum.WAIT and "catching up" in step.reason
    step = quorum.plan(5, 5, qview(THREE, observers=[obs(3), obs(4)]), pods)
    assert (step.action, step.node_id, step.ordinal) == (quorum.ADD, 1003, 3)
    step = quorum.plan(5, 5, qview({**THREE, 1003: "d3"}, observers=[obs(4)]), pods)
    assert (step.action, step.node_id) == (quorum.ADD, 1004)
    done = quorum.plan(5, 5, qview(FIVE), pods)
    assert done.action == quorum.IDLE and done.replicas == 5
    # One to three: the same, from a single voter.
    step = quorum.plan(3, 3, qview({1000: "d0"}, observers=[obs(1), obs(2)]), pods)
    assert (step.action, step.node_id) == (quorum.ADD, 1001)


def test_quorum_plan_scale_down_removes_the_leader_last_and_shrinks_after() -> None:
    pods = {i: cpod(i) for i in range(5)}
    # The leader is 1004: 1003 goes first, the StatefulSet keeps every voter's pod.
    step = quorum.plan(3, 5, qview(FIVE, leader=1004), pods)
    assert (step.action, step.node_id, step.directory_id) == (quorum.REMOVE, 1003, "d3")
    assert step.replicas == 5
    left = {k: v for k, v in FIVE.items() if k != 1003}
    step = quorum.plan(3, 5, qview(left, leader=1004), pods)
    assert (step.action, step.node_id) == (quorum.REMOVE, 1004)
    assert "hands over" in step.reason and step.replicas == 5
    # Removed: only now may the StatefulSet shrink below those pods.
    done = quorum.plan(3, 5, qview(THREE, leader=1001), pods)
    assert (done.action, done.replicas) == (quorum.IDLE, 3)
    # Never below a majority of live voters: one of five down, removing 1004 leaves
    # three live of four; two down, it would leave two of four.
    step = quorum.plan(3, 5, qview(FIVE, leader=1000, down=(1001,)), pods)
    assert (step.action, step.node_id) == (quorum.REMOVE, 1004)
    step = quorum.plan(3, 5, qview(FIVE, leader=1000, down=(1001, 1002)), pods)
    assert step.action == quorum.WAIT and "majority" in step.reason and step.replicas == 5
    # Down to one: three voters, then two, then the leader's own.
    step = quorum.plan(1, 3, qview(THREE, leader=1001), pods)
    assert (step.action, step.node_id) == (quorum.REMOVE, 1002)


def test_quorum_plan_replaces_a_voter_whose_storage_is_new() -> None:
    # Pod 1's PVC was lost: it is back with directory "new" (its own status says so).
    pods = {0: cpod(0), 1: cpod(1, "new"), 2: cpod(2)}
    view = qview(THREE, down=(1001,), observers=[obs(1, "new")])
    assert quorum.wants_pod_status(view, 3)
    step = quorum.plan(3, 3, view, pods)
    assert (step.action, step.node_id, step.directory_id) == (quorum.REMOVE, 1001, "d1")
    # The leader's observers alone tell it too (the pod not asked).
    assert quorum.plan(3, 3, view, {}).action == quorum.REMOVE
    # Removed: it is a missing voter, added back (with its new storage) once caught up.
    gone = {1000: "d0", 1002: "d2"}
    step = quorum.plan(3, 3, qview(gone, observers=[obs(1, "new", lag=900)]), pods)
    assert step.action == quorum.WAIT and "catching up" in step.reason
    step = quorum.plan(3, 3, qview(gone, observers=[obs(1, "new")]), pods)
    assert (step.action, step.node_id, step.directory_id) == (quorum.ADD, 1001, "new")
    # A static voter never pinned (no directory id in the set): any storage counts as it.
    static = {1000: None, 1001: None, 1002: None}
    assert quorum.plan(3, 3, qview(static), pods).action == quorum.IDLE
    # Not when the rest cannot keep a majority: one voter, its storage lost.
    step = quorum.plan(1, 1, qview({1000: "d0"}, down=(1000,), leader=-1), {0: cpod(0, "x")})
    assert step.action == quorum.WAIT and "majority" in step.reason


def test_status_counts_the_controllers_asked_for_and_shows_the_voters() -> None:
    events: list = []
    r = cluster.ClusterReconciler(None, lambda *e: events.append(e))  # type: ignore[arg-type]
    spec = parse(body(controllers={"replicas": 5}))
    ctl = {"spec": {"replicas": 5}, "status": {"readyReplicas": 5, "replicas": 5}}
    sets = {n.BROKER: sts(3), n.CONTROLLER: ctl}
    seen = healthy()
    seen.quorum = qview(FIVE)
    p = cluster.Pass(quorum_step=quorum.plan(5, 5, seen.quorum, {}))
    st = r._status(spec, {"phase": "Ready"}, 2, seen, p, 3, sets)
    assert st["phase"] == "Ready"
    c = st["controllers"]
    assert (c["replicas"], c["ready"], c["initialVoters"], c["leader"]) == (5, 5, 5, 1000)
    assert c["voters"][3] == {"id": 1003, "directoryId": "d3"} and c["change"] is None
    # Four of five Ready outside a change: Degraded, and the message counts five.
    ctl["status"]["readyReplicas"] = 4
    st = r._status(spec, {"phase": "Ready"}, 2, seen, cluster.Pass(), 3, sets)
    degraded = conditions.get_condition(st["conditions"], "Degraded")
    assert degraded["reason"] == "PodsNotReady" and "4/5 controllers" in degraded["message"]
    # Growing from three: the two new pods not Ready yet is the change, not a fault.
    seen.quorum = qview(THREE)
    step = quorum.plan(5, 5, seen.quorum, {i: cpod(i) for i in range(3)})
    ctl["status"]["readyReplicas"] = 3
    st = r._status(spec, {"phase": "Ready"}, 2, seen, cluster.Pass(quorum_step=step), 3, sets)
    assert st["phase"] == "Ready"
    change = st["controllers"]["change"]
    assert change == {"action": "wait", "nodeId": 1003, "directoryId": None, "refused": None}


def test_controller_urls_are_pod_dns_names_unless_the_annotation_says_otherwise() -> None:
    mq = body()
    spec = parse(mq)
    assert cluster.controller_url(mq, spec, 4) == (
        "http://demo-controller-4.demo-controller.prod.svc:9093"
    )
    mq["metadata"]["annotations"] = {
        n.CONTROLLER_URLS_ANNOTATION: '{"0": "http://127.0.0.1:7000", "4": "http://h:1"}'
    }
    assert cluster.controller_url(mq, spec, 4) == "http://h:1"
    assert cluster.controller_url(mq, spec, 1).startswith("http://demo-controller-1.")
    mq["metadata"]["annotations"] = {n.CONTROLLER_URLS_ANNOTATION: "not json"}
    assert cluster.controller_url(mq, spec, 0).startswith("http://demo-controller-0.")


def test_each_broker_has_a_service_of_its_own_with_its_ready_pod_only() -> None:
    """Issue 27: what a broker advertises to clients is its own ClusterIP Service, named
    as its pod, over its ready pod only (a stable address that refuses at once while no
    pod is ready, where a pod DNS name may still give a deleted pod's address)."""
    inner = {"name": "in", "type": "internal", "port": 9097}
    s = parse(external(inner))
    svcs = {o["metadata"]["name"]: o for o in render.broker_services(s, 3)}
    assert set(svcs) == {"demo-broker-0", "demo-broker-1", "demo-broker-2"}
    svc = svcs["demo-broker-1"]
    assert svc["spec"]["type"] == "ClusterIP" and "clusterIP" not in svc["spec"]
    assert "publishNotReadyAddresses" not in svc["spec"]
    assert svc["spec"]["selector"] == {
        **n.selector("demo", n.BROKER),
        "statefulset.kubernetes.io/pod-name": "demo-broker-1",
    }
    assert [(p["name"], p["port"]) for p in svc["spec"]["ports"]] == [
        ("kafka", 9092),
        ("ext-in", 9097),
    ]
    labels = svc["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == n.BROKER_SERVICE_COMPONENT
    assert n.LISTENER_LABEL not in labels  # not an external listener's Service
    assert svc["metadata"]["ownerReferences"][0]["uid"] == s.uid
    # Scaling: one per broker, whatever the count.
    assert len(render.broker_services(s, 5)) == 5
    # The internal listener is advertised there too; the brokers' own at the pod name.
    a = listeners.resolve(s, 2, {}, {})
    assert a.brokers["in"] == {
        0: ("demo-broker-0.prod.svc", 9097),
        1: ("demo-broker-1.prod.svc", 9097),
    }
    assert listeners.advertised_properties(s, 2, a)["demo-broker-1.properties"] == (
        "advertised.listeners=REPLICATION://demo-broker-1.demo-broker.prod.svc:9091,"
        "PLAINTEXT://demo-broker-1.prod.svc:9092,EXT_IN://demo-broker-1.prod.svc:9097\n"
    )
    # The replication port is the brokers' own, with or without TLS.
    with pytest.raises(SpecError, match="port 9092 is taken by the kafka"):
        parse(body(listeners={"replication": {"port": 9092}}))


# -- version rolls (upgrade.py) ------------------------------------------------------------

OLD_IMAGE, NEW_IMAGE = "straitmq:0.1.0", "straitmq:0.2.0"
SETTINGS = upgrade.Settings(step_timeout_s=60, min_ready_s=5)


class RollSim:
    """A 3+3 cluster as the planner sees it: each restart puts the pod on the new image,
    back in service at once with a new incarnation, unless the image is in `broken`."""

    def __init__(self, image: str = OLD_IMAGE, active: int = 1001) -> None:
        self.pods = {
            f"demo-{c}-{i}": upgrade.Pod(f"demo-{c}-{i}", c, i, image, True)
            for c in (n.CONTROLLER, n.BROKER)
            for i in range(3)
        }
        self.active = active
        self.broken: set[str] = set()
        self.incarnations = {b: f"inc-{b}-0" for b in range(3)}
        self.under_min_isr = 0
        self.under_replicated = 0
        self.unsafe: dict[int, str] = {}
        self.status: dict | None = None
        self.now = 1_000_000.0
        self.generation = 1
        self.restarts: list[str] = []

    def health(self) -> upgrade.Health:
        up = [p for p in self.pods.values() if p.image not in self.broken]
        return upgrade.Health(
            True,
            active_controller=self.active,
            voters=frozenset({1000, 1001, 1002}),
            caught_up=frozenset(p.node_id for p in up if p.component == n.CONTROLLER),
            live_brokers={
                p.ordinal: self.incarnations[p.ordinal] for p in up if p.component == n.BROKER
            },
            under_replicated=self.under_replicated,
            under_min_isr=self.under_min_isr,
            unsafe_brokers=self.unsafe,
        )

    def step(self, image: str, version: str) -> upgrade.Plan:
        plan = upgrade.plan(
            image,
            version,
            list(self.pods.values()),
            self.health(),
            self.status,
            self.generation,
            self.now,
            SETTINGS,
        )
        self.status = plan.status
        if plan.action == upgrade.RESTART:
            assert plan.pod is not None
            old = self.pods[plan.pod]
            self.pods[plan.pod] = replace(old, image=image)
            if old.component == n.BROKER:
                self.incarnations[old.ordinal] = f"inc-{old.ordinal}-{len(self.restarts) + 1}"
            self.restarts.append(plan.pod)
        self.now += 3
        return plan

    def run(self, image: str, version: str, passes: int = 60) -> upgrade.Plan:
        for _ in range(passes):
            plan = self.step(image, version)
            if plan.action in (upgrade.NONE, upgrade.PAUSE, upgrade.HOLD):
                return plan
        raise AssertionError(f"no end after {passes} passes: {self.status}")


def test_upgrade_rolls_controllers_followers_first_then_brokers_one_at_a_time() -> None:
    sim = RollSim()
    first = sim.step(NEW_IMAGE, "0.2.0")
    assert first.action == upgrade.RESTART and first.pod == "demo-controller-2"
    assert "demo-controller-2 (a follower of 1001)" in first.message, first.message
    assert first.status and first.status["phase"] == upgrade.ROLLING
    assert (first.status["from"], first.status["to"]) == ("0.1.0", "0.2.0")
    # The next pass: the restarted pod is back, but not for min_ready_s yet.
    settling = sim.step(NEW_IMAGE, "0.2.0")
    assert settling.action == upgrade.WAIT and settling.reason == "PodSettling"
    assert settling.rolling and settling.status["progress"] == "controllers 1/3, brokers 0/3"
    done = sim.run(NEW_IMAGE, "0.2.0")
    assert sim.restarts == [
        "demo-controller-2",
        "demo-controller-0",
        "demo-controller-1",  # the active controller (1001) last
        "demo-broker-2",
        "demo-broker-1",
        "demo-broker-0",
    ]
    assert done.action == upgrade.NONE and not done.rolling
    assert done.status and done.status["phase"] == upgrade.DONE
    assert done.status["progress"] == "controllers 3/3, brokers 3/3"
    assert (done.status["from"], done.status["to"]) == ("0.1.0", "0.2.0")
    # Done stays Done, since the first pass that saw it (finalizing counts from there).
    since = done.status["since"]
    sim.now += 100
    again = sim.step(NEW_IMAGE, "0.2.0")
    assert again.action == upgrade.NONE and again.status["since"] == since


def test_rollback_rolls_brokers_first_then_controllers() -> None:
    sim = RollSim(NEW_IMAGE, active=1000)
    sim.status = {"from": "0.1.0", "to": "0.2.0", "image": NEW_IMAGE, "phase": "Done"}
    sim.run(OLD_IMAGE, "0.1.0")
    assert sim.restarts == [
        "demo-broker-2",
        "demo-broker-1",
        "demo-broker-0",
        "demo-controller-2",
        "demo-controller-1",
        "demo-controller-0",  # the active controller last
    ]
    assert sim.status and (sim.status["from"], sim.status["to"]) == ("0.2.0", "0.1.0")
    assert upgrade.is_downgrade("0.2.0", "0.1.0") and not upgrade.is_downgrade("0.1.0", "0.2.0")
    assert upgrade.is_downgrade("0.2.0", "0.2.0.dev0")  # a pre-release is below its release
    assert not upgrade.is_downgrade("dev", "0.1.0")  # not versions: the upgrade order


def test_a_broker_is_back_only_with_a_new_registration() -> None:
    sim = RollSim()
    sim.pods = {k: replace(p, image=NEW_IMAGE) for k, p in sim.pods.items()}
    sim.pods["demo-broker-2"] = replace(sim.pods["demo-broker-2"], image=OLD_IMAGE)
    sim.status = {"image": NEW_IMAGE, "to": "0.2.0", "phase": "Rolling"}
    assert sim.step(NEW_IMAGE, "0.2.0").pod == "demo-broker-2"
    sim.incarnations[2] = "inc-2-0"  # the old process's registration, still live
    plan = sim.step(NEW_IMAGE, "0.2.0")
    assert plan.action == upgrade.WAIT and plan.reason == "PodNotInService"


def test_each_gate_holds_the_next_restart() -> None:
    sim = RollSim()
    sim.under_min_isr = 1
    plan = sim.step(NEW_IMAGE, "0.2.0")
    assert (plan.action, plan.reason) == (upgrade.WAIT, "UnderMinIsr")
    sim.under_min_isr, sim.under_replicated = 0, 2
    assert sim.step(NEW_IMAGE, "0.2.0").reason == "UnderReplicated"
    sim.under_replicated = 0
    blind = upgrade.plan(
        NEW_IMAGE, "0.2.0", list(sim.pods.values()), upgrade.Health(False, "refused"),
        None, 1, sim.now, SETTINGS,
    )  # fmt: skip
    assert (blind.action, blind.reason) == (upgrade.WAIT, "AdminUnreachable")
    # Brokers whose restart would take a partition below min ISR are passed over.
    sim.pods = {
        k: replace(p, image=NEW_IMAGE) if p.component == n.CONTROLLER else p
        for k, p in sim.pods.items()
    }
    sim.unsafe = {2: "orders"}
    assert sim.step(NEW_IMAGE, "0.2.0").pod == "demo-broker-1"
    sim.unsafe = {0: "orders", 1: "orders", 2: "orders"}
    while (plan := sim.step(NEW_IMAGE, "0.2.0")).reason == "PodSettling":
        pass
    assert (plan.action, plan.reason) == (upgrade.WAIT, "MinIsr") and "orders" in plan.message


def test_a_step_that_does_not_finish_pauses_until_the_spec_changes() -> None:
    sim = RollSim(OLD_IMAGE)
    sim.broken = {"straitmq:9.9.9"}  # cannot start (a tag that does not exist)
    assert sim.step("straitmq:9.9.9", "9.9.9").pod == "demo-controller-2"
    waits = 0
    while (plan := sim.step("straitmq:9.9.9", "9.9.9")).action == upgrade.WAIT:
        assert plan.reason == "PodNotInService"
        waits += 1
    assert plan.action == upgrade.PAUSE and waits >= SETTINGS.step_timeout_s // 3 - 1
    assert plan.reason == "PodNotInService" and "demo-controller-2" in plan.message
    assert plan.status and plan.status["phase"] == upgrade.PAUSED
    assert plan.status["pausedGeneration"] == 1
    # Paused: nothing moves while the generation stays, healthy or not, for good.
    for _ in range(50):
        held = sim.step("straitmq:9.9.9", "9.9.9")
        assert held.action == upgrade.HOLD and held.rolling
    assert sim.restarts == ["demo-controller-2"]
    # The spec changes: the old version back. The broken pod goes first (it is out of
    # service anyway), and the roll ends with every pod on the old image.
    sim.generation = 2
    back = sim.step(OLD_IMAGE, "0.1.0")
    assert back.action == upgrade.RESTART and back.pod == "demo-controller-2"
    assert back.status and back.status["from"] == "9.9.9"
    assert sim.run(OLD_IMAGE, "0.1.0").action == upgrade.NONE
    assert sim.restarts == ["demo-controller-2", "demo-controller-2"]


def test_the_cluster_health_gate_pauses_too_and_a_new_generation_resumes() -> None:
    sim = RollSim()
    sim.pods = {
        k: replace(p, image=NEW_IMAGE) if p.component == n.CONTROLLER else p
        for k, p in sim.pods.items()
    }
    sim.status = {"image": NEW_IMAGE, "to": "0.2.0", "from": "0.1.0", "phase": "Rolling"}
    sim.status["since"] = upgrade.iso(sim.now)
    sim.under_min_isr = 3
    plan = sim.run(NEW_IMAGE, "0.2.0")
    assert (plan.action, plan.reason) == (upgrade.PAUSE, "UnderMinIsr")
    sim.under_min_isr = 0
    assert sim.step(NEW_IMAGE, "0.2.0").action == upgrade.HOLD  # healthy again: still held
    sim.generation = 2  # any spec change resumes it, with a new clock
    assert sim.step(NEW_IMAGE, "0.2.0").action == upgrade.RESTART


def test_version_derives_the_image_and_finalizing_is_explicit() -> None:
    s = parse(
        {
            "metadata": {"name": "demo", "uid": UID},
            "spec": {"version": "0.2.0", "upgrade": {"finalizeFeatures": "auto"}},
        },
        image_repository="reg.example/straitmq",
    )
    assert s.image == "reg.example/straitmq:0.2.0" and s.reported_version == "0.2.0"
    assert s.finalize_features == "auto"
    assert parse(body()).finalize_features == "manual"  # by default nothing is finalized
    # An image wins; the version is then only reported.
    both = parse(body(version="0.2.0"))
    assert both.image == "straitmq:1" and both.reported_version == "0.2.0"
    assert parse(body()).reported_version == "1"
    assert upgrade.version_of("reg.example:5000/straitmq:0.1.0") == "0.1.0"
    assert upgrade.version_of("reg.example:5000/straitmq") == "reg.example:5000/straitmq"
    with pytest.raises(SpecError, match=r"spec\.version or spec\.image"):
        parse({"metadata": {"name": "x"}, "spec": {}})
    with pytest.raises(SpecError, match="finalizeFeatures"):
        parse(body(upgrade={"finalizeFeatures": "yes"}))
    done = {"phase": "Done", "since": upgrade.iso(1000.0)}
    assert not upgrade.finalize_due("manual", done, 10_000.0, 600)
    assert not upgrade.finalize_due("auto", done, 1500.0, 600)
    assert upgrade.finalize_due("auto", done, 1600.0, 600)
    assert not upgrade.finalize_due("auto", {**done, "phase": "Rolling"}, 10_000.0, 600)
    feats = {
        "features": [
            {"name": "straitmq.metadata.version", "supported_max": 2, "finalized": 1},
            {"name": "metadata.version", "supported_max": 27, "finalized": 27},
        ]
    }
    assert upgrade.levels_to_finalize(feats) == {"straitmq.metadata.version": 2}
    assert upgrade.finalized(feats) == {"straitmq.metadata.version": 1, "metadata.version": 27}
    feats["features"][0]["finalized"] = 2
    assert upgrade.levels_to_finalize(feats) == {} and upgrade.levels_to_finalize(None) == {}


def pod_templates(spec_body: dict) -> bytes:
    s = parse(spec_body)
    sets = [render.controller_statefulset(s), render.broker_statefulset(s, 3)]
    return orjson.dumps([x["spec"]["template"] for x in sets], option=orjson.OPT_SORT_KEYS)


TEMPLATE_SPECS = [
    body(),
    body(brokers={"replicas": 3, "rack": {"topologyKey": "zone"}, "config": {"num.partitions": 6}}),
    body(
        listeners={"kafka": {"tls": True, "authentication": {"type": "scram-sha-512"}}},
        authorization={"type": "simple"},
    ),
]


def test_a_new_operator_version_renders_the_same_pod_templates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An upgrade of the operator (helm upgrade) restarts no pod: the pod templates are a
    function of the MQCluster's spec alone, never of the operator's own version, so the
    StatefulSets' revisions do not move. Checked in process (another version string) and
    against the previous release's operator (releases.toml, built by
    scripts/build-releases.sh)."""
    import subprocess

    import straitmq
    import straitmq.version

    before = [pod_templates(b) for b in TEMPLATE_SPECS]
    monkeypatch.setattr(straitmq.version, "VERSION", "9.9.9")
    monkeypatch.setattr(straitmq, "__version__", "9.9.9")
    assert [pod_templates(b) for b in TEMPLATE_SPECS] == before
    # A spec.version naming the same image renders the same templates as spec.image.
    versioned = body(version="1")
    del versioned["spec"]["image"]
    s = parse(versioned, image_repository="straitmq")
    assert render.broker_statefulset(s, 3) == render.broker_statefulset(parse(body()), 3)

    from bench.releases import previous_release, release_python

    old_python = release_python(previous_release())
    code = (
        "import sys, orjson\n"
        "from straitmq.operator import render, spec\n"
        "out = []\n"
        "for b in orjson.loads(sys.stdin.buffer.read()):\n"
        "    s = spec.parse(b)\n"
        "    sets = [render.controller_statefulset(s), render.broker_statefulset(s, 3)]\n"
        "    out.append(orjson.dumps([x['spec']['template'] for x in sets],"
        " option=orjson.OPT_SORT_KEYS).decode())\n"
        "sys.stdout.write(orjson.dumps(out).decode())\n"
    )
    old = subprocess.run(
        [old_python, "-P", "-c", code],
        input=orjson.dumps(TEMPLATE_SPECS),
        capture_output=True,
        timeout=60,
        cwd="/",
    )
    assert old.returncode == 0, old.stderr.decode()[-2000:]
    assert [t.encode() for t in orjson.loads(old.stdout)] == before


def _features(finalized: int, top: int) -> dict:
    return {
        "features": [
            {"name": "straitmq.metadata.version", "finalized": finalized, "supported_max": top},
            {"name": "transaction.version", "finalized": 2, "supported_max": 2},
        ]
    }


def _client_seen(client_id: str, apis: dict[int, list[int]]) -> dict:
    return {
        "software_name": "librdkafka",
        "software_version": "2.0.2",
        "api_versions_version": 3,
        "software": "librdkafka 2.0.2",
        "client_id": client_id,
        "principal": "User:ANONYMOUS",
        "host": "10.0.0.9",
        "connections": 1,
        "apis": [{"api_key": k, "versions": v} for k, v in apis.items()],
        "transactional_produce": [],
    }


def test_the_finalize_condition_names_what_would_change_and_for_how_many_clients() -> None:
    producer = _client_seen("orders-producer", {0: [9], 3: [12]})
    fetcher = _client_seen("replica-fetcher-2", {1: [17]})
    views = {0: [producer], 1: [producer, fetcher]}
    status, reason, msg = upgrade.finalize_impact(_features(1, 2), views, [])
    assert (status, reason) == (False, "NoClientAffected"), msg
    assert msg.startswith("finalizing straitmq.metadata.version 1 -> 2: "), msg
    # One client seen by two brokers counts once; the brokers' own fetchers not at all.
    assert "no client is affected (1 client seen)" in msg, msg
    # A broker that could not be asked is said, not skipped in silence.
    _, _, msg = upgrade.finalize_impact(_features(1, 2), {0: [producer]}, ["broker 1 not asked"])
    assert msg.endswith("(not in this report: broker 1 not asked)"), msg
    # Nothing to finalize: said so.
    assert upgrade.finalize_impact(_features(2, 2), views, [])[:2] == (False, "NothingToFinalize")
