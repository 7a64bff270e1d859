#!/usr/bin/env bash
# Tears down the node scripts/node-up.sh started: stops kubelet and kube-proxy, kills and
# deletes every pod container, stops containerd and the control plane, then removes the
# CNI bridge, the node's dummy interface, mounts under the run dir (kubelet volumes,
# container root filesystems, network namespaces), the KUBE-*/CNI-* iptables rules and
# the run dir itself. Exits non-zero, listing them, if anything is left behind.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR="${STRAITMQ_NODE_RUN:-/run/straitmq-node}"
py=.venv/bin/python
[[ -x "$py" ]] || py=python3
[[ "$(id -u)" == 0 ]] || { echo "node-down: needs root" >&2; exit 1; }
t0=$SECONDS
"$py" tests/real_node_support.py down --run-dir "$RUN_DIR"
rc=$?
rm -f "$RUN_DIR.log.old"; [[ -f "$RUN_DIR.log" ]] && mv "$RUN_DIR.log" "$RUN_DIR.log.old"
echo "node-down: $((SECONDS - t0))s" >&2
exit $rc
