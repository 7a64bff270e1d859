"""Real-pod figures (issue 11) for bench/RESULTS.md, on the single-node Kubernetes of
scripts/node-up.sh (tests/real_node_support.py): the chart and examples/ as a user
applies them, the image built from our Dockerfile.

    sudo .venv/bin/python bench/real_node.py --installs 3 --deletions 5

Per install round: node-up, `helm install` -> MQCluster Ready (examples/open/mqcluster.yaml,
3 controllers + 3 brokers), then in the first round `--deletions` times each: a broker
pod deleted (graceful) -> its replacement Ready and back in every ISR of
examples/open/topic.yaml, and the active controller's pod deleted (--grace-period=0 --force)
-> another controller active (/api/v1/quorum), and the active controller's process
SIGKILLed from the host -> another controller active. node-down after each round. Prints the
runs and their medians as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from real_node_support import RUN_DIR, NodeHandle  # noqa: E402
from test_real_node import (  # noqa: E402
    BROKERS,
    NS,
    RETRY,
    install_demo,
    isr_full,
    pod_ready,
)
from waiting import wait_for  # noqa: E402


def node_up() -> NodeHandle:
    subprocess.run([str(ROOT / "scripts" / "node-up.sh")], check=True, stdout=subprocess.DEVNULL)
    return NodeHandle(json.loads((RUN_DIR / "ready.json").read_text()))


def node_down() -> None:
    subprocess.run([str(ROOT / "scripts" / "node-down.sh")], check=True)


def broker_deletion(node: NodeHandle, pod: str) -> float:
    uid = node.get("pod", pod, "-n", NS)["metadata"]["uid"]
    t0 = time.monotonic()
    node.kubectl("delete", "pod", pod, "-n", NS, "--wait=false")
    wait_for(lambda: pod_ready(node, pod, not_uid=uid), 240, f"{pod} back", 0.2, ignore=RETRY)
    wait_for(lambda: isr_full(node), 240, f"{pod} in every ISR", 0.2, ignore=RETRY)
    return time.monotonic() - t0


def controller_deletion(node: NodeHandle, kill: bool = False) -> float:
    """The active controller's pod force-deleted (the kubelet still sends SIGTERM first),
    or with `kill` its process SIGKILLed from the host (no chance to hand over)."""
    old = node.admin(NS, "/api/v1/quorum", BROKERS)["leader_id"]
    pod = f"demo-controller-{old - 1000}"
    restarts = sum(
        c.get("restartCount", 0)
        for c in node.get("pod", pod, "-n", NS)["status"]["containerStatuses"]
    )
    t0 = time.monotonic()
    if kill:
        os.kill(node.container_pid(NS, pod, "controller"), signal.SIGKILL)
    else:
        node.kubectl("delete", "pod", pod, "-n", NS, "--grace-period=0", "--force", "--wait=false")

    def new_active() -> bool:
        q = node.admin(NS, "/api/v1/quorum", BROKERS)
        return q.get("leader_id") not in (None, old) and bool(q.get("active_controller"))

    wait_for(new_active, 120, "a new active controller", 0.1, ignore=RETRY)
    took = time.monotonic() - t0
    back = (lambda: pod_ready(node, pod, min_restarts=restarts + 1)) if kill else None
    wait_for(back or (lambda: pod_ready(node, pod)), 240, f"{pod} back", 0.5, ignore=RETRY)
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--installs", type=int, default=3)
    ap.add_argument("--deletions", type=int, default=5)
    args = ap.parse_args()
    runs: dict[str, list[float]] = {
        "helm_install_to_mqcluster_ready_s": [],
        "broker_pod_deleted_to_isr_s": [],
        "active_controller_pod_deleted_to_new_active_s": [],
        "active_controller_sigkilled_to_new_active_s": [],
    }
    for i in range(args.installs):
        node = node_up()
        try:
            t = install_demo(node)
            runs["helm_install_to_mqcluster_ready_s"].append(t["helm_install_to_mqcluster_ready"])
            if i == 0:
                for k in range(args.deletions):
                    runs["broker_pod_deleted_to_isr_s"].append(
                        broker_deletion(node, f"demo-broker-{k % 3}")
                    )
                    runs["active_controller_pod_deleted_to_new_active_s"].append(
                        controller_deletion(node)
                    )
                    runs["active_controller_sigkilled_to_new_active_s"].append(
                        controller_deletion(node, kill=True)
                    )
        finally:
            node_down()
        print(json.dumps({k: [round(x, 1) for x in v] for k, v in runs.items()}), flush=True)
    image = ROOT / ".cache" / "images" / "straitmq-dev.tar"
    out = {
        "runs": {k: [round(x, 1) for x in v] for k, v in runs.items()},
        "median": {k: round(statistics.median(v), 1) for k, v in runs.items() if v},
        "image_archive_bytes": image.stat().st_size if image.exists() else None,
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
