#!/usr/bin/env bash
# Run every test: installs what it needs first (venv, Python packages, Kafka jars,
# Kubernetes binaries).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/bootstrap.sh
if [[ -x scripts/fetch-jars.sh ]]; then
  scripts/fetch-jars.sh
fi
# The Kubernetes control plane and helm for the operator tests (built once, cached).
scripts/fetch-k8s.sh
echo "== ruff" >&2
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== pytest" >&2
exec .venv/bin/python -m pytest "$@"
