#!/usr/bin/env bash
# Starts the control plane the operator tests use (tests/kube_support.py: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler and kwok with three fake nodes
# in zone-a/b/c, 24 static 10Gi volumes) for poking at by hand. Prints the KUBECONFIG to
# export; Ctrl-C stops everything. Options: --work-dir DIR (kept afterwards, logs in
# DIR/logs), --nodes N, --volumes N.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch-k8s.sh  # builds the binaries once; a no-op when they are there
py=.venv/bin/python
[[ -x "$py" ]] || py=python3
exec "$py" tests/kube_support.py "$@"
