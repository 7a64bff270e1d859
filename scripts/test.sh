#!/usr/bin/env bash
# Run every test: installs what it needs first (venv, Python packages, Kafka jars).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/bootstrap.sh
if [[ -x scripts/fetch-jars.sh ]]; then
  scripts/fetch-jars.sh
fi
echo "== ruff" >&2
.venv/bin/ruff check .
echo "== pytest" >&2
exec .venv/bin/python -m pytest "$@"
