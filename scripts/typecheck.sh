#!/usr/bin/env bash
# Type-checks the product packages (straitmq.*) with mypy, configured in pyproject.toml.
# The folders are mapped to import names by setuptools' package-dir (services/broker ->
# straitmq.broker, ...), which mypy cannot follow, so a tree of links under
# .cache/typecheck/straitmq gives it the import layout; the paths in its output are
# rewritten back to the real files. The mapping is read from pyproject so it cannot drift.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
TREE="$ROOT/.cache/typecheck"
mkdir -p .cache
[[ -f .cache/.gitignore ]] || printf '*\n' > .cache/.gitignore

# One "package<TAB>folder" line per mapped subpackage, longest (deepest) name last.
MAP="$("$PY" - <<'EOF'
import tomllib

with open("pyproject.toml", "rb") as f:
    dirs = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
for name, folder in sorted(dirs.items(), key=lambda kv: kv[0].count(".")):
    print(f"{name}\t{folder}")
EOF
)"

# Rebuilt each run (links only, cheap): a folder added or removed in the checkout shows up.
rm -rf "$TREE/straitmq"
mkdir -p "$TREE"
while IFS=$'\t' read -r name folder; do
  rel="${name//.//}"
  if [[ "$name" == "straitmq" ]]; then
    mkdir -p "$TREE/straitmq"
    for entry in "$ROOT/$folder"/*; do
      base="$(basename "$entry")"
      [[ "$base" == "__pycache__" ]] && continue
      ln -s "$entry" "$TREE/straitmq/$base"
    done
  else
    # A subpackage mapped inside a linked folder (straitmq.broker.x): the parent becomes a
    # real folder of links first, so nothing is ever written into the checkout.
    parent="$(dirname "$TREE/$rel")"
    if [[ -L "$parent" ]]; then
      target="$(readlink "$parent")"
      rm "$parent"
      mkdir "$parent"
      for entry in "$target"/*; do
        [[ "$(basename "$entry")" == "__pycache__" ]] || ln -s "$entry" "$parent/"
      done
    fi
    # A mapped folder that also exists inside straitmq/ would be shadowed: the mapping wins,
    # as it does for setuptools.
    rm -rf "${TREE:?}/$rel"
    ln -s "$ROOT/$folder" "$TREE/$rel"
  fi
done <<< "$MAP"

# The sed program that turns a path in the link tree back into the real file's path
# (deepest mapping first, then the ground package).
SED=()
while IFS=$'\t' read -r name folder; do
  [[ "$name" == "straitmq" ]] && continue
  rel="${name//.//}"
  SED+=(-e "s#^${rel}/#${folder}/#")
done <<< "$(printf '%s\n' "$MAP" | tac)"

cd "$TREE"
status=0
out="$("$PY" -m mypy --config-file "$ROOT/pyproject.toml" --cache-dir "$TREE/.mypy_cache" \
  -p straitmq "$@" 2>&1)" || status=$?
printf '%s\n' "$out" | sed "${SED[@]}"
exit "$status"
