#!/usr/bin/env bash
# Builds Prometheus's `prometheus` and `promtool` once, into .cache/prometheus/bin
# (git-ignored, shared by every clone through scripts/bootstrap.sh), from the Go module
# proxy: tests/test_alert_rules.py unit-tests the shipped alert rules with
# `promtool test rules` and loads them into a real Prometheus scraping real brokers.
#
# The module has no replace directives, so `go install module@version` builds it. Tags:
# - no `builtinassets`: the web UI's assets are not embedded (they are built by npm, not
#   in the module); the HTTP API the tests use needs none of them.
# - `remove_all_sd` + `enable_kubernetes_sd`: only file, HTTP, static and Kubernetes
#   discovery, which cuts the cloud SDKs out of a build that otherwise takes far longer.
set -euo pipefail
cd "$(dirname "$0")/.."

PROMETHEUS_MODULE_VERSION="${PROMETHEUS_MODULE_VERSION:-v0.316.0}" # Prometheus 3.16.0
ROOT="$PWD/.cache/prometheus"
BIN="$ROOT/bin"
STAMP="$BIN/.versions"
TAGS="remove_all_sd,enable_kubernetes_sd"
WANT="prometheus=$PROMETHEUS_MODULE_VERSION tags=$TAGS"
mkdir -p "$BIN"
exec 8>"$ROOT/.lock"
flock -w 3600 8 || { echo "fetch-prometheus: timed out waiting for another build" >&2; exit 1; }

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$BIN/prometheus" && -x "$BIN/promtool" ]]; then
  exit 0
fi
echo "fetch-prometheus: prometheus and promtool $PROMETHEUS_MODULE_VERSION (minutes on 2 cores)" >&2
rm -f "$STAMP"
# The version shown by `promtool --version`: 0.316.0 is Prometheus 3.16.0.
num="${PROMETHEUS_MODULE_VERSION#v0.}" # 316.0
minor="${num%%.*}"
v="${minor:0:1}.${minor:1}.${num#*.}"
ldflags="-s -w -X github.com/prometheus/common/version.Version=$v"
for cmd in prometheus promtool; do
  GOBIN="$BIN" CGO_ENABLED=0 go install -trimpath -tags "$TAGS" -ldflags "$ldflags" \
    "github.com/prometheus/prometheus/cmd/$cmd@$PROMETHEUS_MODULE_VERSION"
done
echo "$WANT" >"$STAMP"
