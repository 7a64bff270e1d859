#!/usr/bin/env bash
# Creates .venv and installs StraitMQ with its test tools, the runtime dependencies pinned
# by requirements.lock (the versions the image ships); cached by a stamp of both files.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV="$ROOT/.venv"
STAMP="$VENV/.stamp"

# What is built the same for every checkout (the Kubernetes binaries, the images, the
# node's containerd store, Prometheus) lives in the user's cache and .cache/<name> links
# to it, so a fresh clone (CI's) starts warm. Each build keeps its own version stamps there, and its
# script takes a lock while it builds. The jars stay in the clone: Maven's own cache makes
# them quick, and an image build cannot COPY through a link out of its context.
SHARED="${STRAITMQ_CACHE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/straitmq}"
mkdir -p .cache
[[ -f .cache/.gitignore ]] || printf '*\n' > .cache/.gitignore
for name in k8s images node prometheus; do
  if [[ ! -e ".cache/$name" && ! -L ".cache/$name" ]]; then
    mkdir -p "$SHARED/$name"
    ln -s "$SHARED/$name" ".cache/$name"
  fi
done

WANT="$(cat pyproject.toml requirements.lock | sha256sum | cut -c1-16)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  exit 0
fi
echo "bootstrap: creating $VENV and installing packages (first run only)" >&2
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >&2
"$VENV/bin/python" -m pip install -q -e ".[test]" -c requirements.lock >&2
echo "$WANT" > "$STAMP"
