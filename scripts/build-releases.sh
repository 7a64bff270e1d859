#!/usr/bin/env bash
# Builds every release named in releases.toml from git, for the format-compatibility and
# rolling-upgrade tests (tests/test_upgrades.py): the release's source at its commit
# (`git archive`, no work tree bookkeeping) and a virtualenv of its own with its runtime
# dependencies as its requirements.lock pinned them. Cached by commit id in the user's
# cache (STRAITMQ_CACHE_HOME, as the other builds), so every clone on the machine shares
# them; a build takes a lock and writes its stamp last.
#
#   scripts/build-releases.sh            build what is missing, print nothing else
#   scripts/build-releases.sh --python V print the python of release V (building it first)
#
# A checkout without the release's commit (a shallow clone, a source tarball) fails here,
# saying so: the tests cannot check compatibility without the old code.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SHARED="${STRAITMQ_CACHE_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/straitmq}"
CACHE="$SHARED/releases"
mkdir -p "$CACHE"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

releases() {  # "version commit" per line
  "$PY" - <<'EOF'
import tomllib
with open("releases.toml", "rb") as f:
    for v, r in tomllib.load(f)["releases"].items():
        print(v, r["commit"])
EOF
}

build() {
  local version="$1" commit="$2" dir="$CACHE/$2"
  [[ -f "$dir/.stamp" ]] && return 0
  if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "build-releases: release $version's commit $commit is not in this checkout's git" \
      "history (a shallow clone?); fetch it (git fetch --unshallow) to test upgrades" >&2
    exit 1
  fi
  exec 9>"$CACHE/.lock-$commit"
  flock 9
  [[ -f "$dir/.stamp" ]] && return 0
  echo "build-releases: building release $version ($commit)" >&2
  rm -rf "$dir"
  mkdir -p "$dir/src"
  git archive "$commit" | tar -x -C "$dir/src"
  "$PY" -m venv "$dir/venv"
  "$dir/venv/bin/python" -m pip install -q --upgrade pip >&2
  # Runtime dependencies only, at the versions the release pinned.
  "$dir/venv/bin/python" -m pip install -q "$dir/src" -c "$dir/src/requirements.lock" >&2
  echo "$version $commit" > "$dir/.stamp"
  exec 9>&-
}

want="${2:-}"
while read -r version commit; do
  build "$version" "$commit"
  if [[ "${1:-}" == "--python" && "$version" == "$want" ]]; then
    echo "$CACHE/$commit/venv/bin/python"
    exit 0
  fi
done < <(releases)
if [[ "${1:-}" == "--python" ]]; then
  echo "build-releases: no release $want in releases.toml" >&2
  exit 1
fi
