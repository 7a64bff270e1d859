"""Rack awareness on Kubernetes, piece by piece against the real API server: the broker
pods' init step (`strait rack-from-node`) reads the Node's label with whatever account it
runs as, and the broker takes its rack from the file that step leaves (`--rack-file`).
The whole path, operator included, runs in test_operator_k8s (the `demo` cluster)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from cluster_support import PYTHON

ZONE = "topology.kubernetes.io/zone"


def rack_from_node(env: dict, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "straitmq.cli.main", "rack-from-node", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_writes_the_nodes_label_and_says_why_when_it_cannot(kube: Any, tmp_path: Path) -> None:
    node = kube.node_names[1]
    labels = json.loads(kube.kubectl("get", "node", node, "-o", "json").stdout)["metadata"]
    assert labels["labels"][ZONE] == "zone-b"
    out = tmp_path / "rack" / "rack"
    env = {**kube.env, "NODE_NAME": node}  # as the pod gets it, from spec.nodeName
    done = rack_from_node(env, f"--label={ZONE}", f"--out={out}")
    assert done.returncode == 0, done.stderr
    assert out.read_text() == "zone-b\n"

    missing = rack_from_node(env, "--label=example.com/rack", f"--out={out}")
    assert missing.returncode == 1
    assert f"node {node} has no label 'example.com/rack'" in missing.stderr, missing.stderr
    nowhere = rack_from_node(env, "--node=no-such-node", f"--label={ZONE}", f"--out={out}")
    assert nowhere.returncode == 1 and "node no-such-node does not exist" in nowhere.stderr
    assert out.read_text() == "zone-b\n"  # a failed run leaves no half-written file

    # An account without the node reader is refused, and told what it lacks.
    ns = kube.create_namespace("rack-check")
    kube.kubectl("create", "serviceaccount", "brokers", "-n", ns)
    cfg = kube.service_account_kubeconfig(ns, "brokers", tmp_path / "sa.kubeconfig")
    denied = rack_from_node({**env, "KUBECONFIG": str(cfg)}, f"--label={ZONE}", f"--out={out}")
    assert denied.returncode == 1
    assert f"not allowed to get node {node}" in denied.stderr, denied.stderr
    assert "node-reader" in denied.stderr

    no_node = {k: v for k, v in env.items() if k != "NODE_NAME"}
    unnamed = rack_from_node(no_node, f"--label={ZONE}", f"--out={out}")
    assert unnamed.returncode == 1 and "--node or NODE_NAME is required" in unnamed.stderr


def test_broker_refuses_a_rack_file_it_cannot_use(tmp_path: Path) -> None:
    def broker(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PYTHON, "-m", "straitmq.broker", f"--data-dir={tmp_path / 'data'}", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    empty = tmp_path / "empty"
    empty.write_text("\n")
    out = broker(f"--rack-file={empty}")
    assert out.returncode == 2 and f"--rack-file: {empty} is empty" in out.stderr, out.stderr
    out = broker(f"--rack-file={tmp_path / 'absent'}")
    assert out.returncode == 2 and "--rack-file" in out.stderr and "No such file" in out.stderr
    out = broker("--rack=a", f"--rack-file={empty}")
    assert out.returncode == 2 and "not allowed with argument" in out.stderr, out.stderr
