#!/usr/bin/env bash
# Start a local StraitMQ in the foreground: Kafka at 127.0.0.1:9092, HTTP at 127.0.0.1:8080.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/bootstrap.sh"
exec "$ROOT/.venv/bin/strait" up "$@"
