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
# Prometheus and promtool for the alert rules' tests (built once, cached).
scripts/fetch-prometheus.sh
# The previous releases (releases.toml), built from git with their own virtualenvs, for the
# upgrade and format-compatibility tests (tests/test_upgrades.py; cached by commit id).
scripts/build-releases.sh
# The real-node tier's packages, binaries and images (tests/test_real_node.py), built here
# rather than inside the tests. As non-root the tier fails loudly in pytest instead.
if [[ "$(id -u)" == 0 ]]; then
  scripts/node-up.sh --build-only
fi
echo "== ruff" >&2
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== mypy" >&2
scripts/typecheck.sh
echo "== import contracts" >&2
.venv/bin/python scripts/lint_imports.py --no-logo
echo "== pytest" >&2
# Most tests wait on processes, sockets and timeouts rather than the CPU: four workers on
# two cores. Modules stay whole on one worker, the Kubernetes tiers together on one, the
# longest first (tests/conftest.py). STRAITMQ_TEST_WORKERS=0 runs everything in this one process.
exec .venv/bin/python -m pytest -n "${STRAITMQ_TEST_WORKERS:-4}" --dist loadscope \
  --no-loadscope-reorder "$@"
