#!/usr/bin/env bash
# Fetch Apache Kafka 3.9.x (broker + tools + clients + all transitive deps) from
# Maven Central into .cache/jars/kafka-3.9/, and compile tools/java/StraitClient.java
# into .cache/jars/classes/.
#
# Idempotent: a stamp file records the sha256 of tools/java/pom.xml (jars) and of
# the Java sources (classes); when both match, the script exits at once.
# Needs only `mvn` (local repository: the default ~/.m2) and a JDK 17 (`javac`).
# Progress goes to stderr; stdout is left empty (callers may parse it).
#
# Usage: scripts/fetch-jars.sh [--force]
#   --force   re-download and recompile even if the stamps match
# Env:    MVN (default: mvn), JAVAC (default: javac), MVN_ARGS (extra mvn args)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
POM="$ROOT/tools/java/pom.xml"
SRC_DIR="$ROOT/tools/java"
CACHE="$ROOT/.cache"
JARS_PARENT="$CACHE/jars"
JAR_DIR="$JARS_PARENT/kafka-3.9"
CLASSES="$JARS_PARENT/classes"
JAR_STAMP="$JARS_PARENT/.kafka-3.9.stamp"
CLS_STAMP="$JARS_PARENT/.classes.stamp"
MVN="${MVN:-mvn}"
JAVAC="${JAVAC:-javac}"

log() { echo "fetch-jars: $*" >&2; }

force=0
[[ "${1:-}" == "--force" ]] && force=1

mkdir -p "$JARS_PARENT"
# .cache/ must never be committed; make it ignore itself (no edit of the root .gitignore needed).
[[ -f "$CACHE/.gitignore" ]] || printf '*\n' > "$CACHE/.gitignore"

# Serialize concurrent runs (e.g. parallel test workers): one downloads, the others wait.
if command -v flock >/dev/null; then
    exec 9>"$JARS_PARENT/.lock"
    flock -w 1200 9 || { log "error: timed out waiting for another fetch-jars run"; exit 1; }
fi

hash_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

# ---- 1. jars -------------------------------------------------------------
jar_hash="$(hash_of "$POM")"
if [[ $force -eq 0 && -f "$JAR_STAMP" && "$(cat "$JAR_STAMP")" == "$jar_hash" && -d "$JAR_DIR" ]]; then
    :
else
    command -v "$MVN" >/dev/null || { log "error: '$MVN' not found (Maven is required)"; exit 1; }
    log "downloading Kafka jars from Maven Central (first run takes a minute or two) ..."
    start=$(date +%s)
    tmp="$JARS_PARENT/.kafka-3.9.tmp.$$"
    rm -rf "$tmp"
    trap 'rm -rf "$tmp"' EXIT
    # Maven's own log goes to a file (shown on stderr only if it fails): stdout stays clean.
    mvn_log="$JARS_PARENT/mvn.log"
    # shellcheck disable=SC2086
    if ! "$MVN" -B -Dstyle.color=never -f "$POM" ${MVN_ARGS:-} \
            dependency:copy-dependencies \
            -DincludeScope=runtime \
            -DoutputDirectory="$tmp" > "$mvn_log" 2>&1; then
        tail -n 40 "$mvn_log" >&2
        log "error: mvn dependency:copy-dependencies failed (full log: $mvn_log)"
        exit 1
    fi
    n=$(ls "$tmp"/*.jar 2>/dev/null | wc -l)
    if [[ "$n" -lt 20 ]]; then
        log "error: only $n jars were copied; something is wrong"
        exit 1
    fi
    rm -rf "$JAR_DIR"
    mv "$tmp" "$JAR_DIR"
    trap - EXIT
    echo "$jar_hash" > "$JAR_STAMP"
    rm -f "$CLS_STAMP"   # recompile against the new jars
    log "$n jars in ${JAR_DIR#"$ROOT"/} ($(( $(date +%s) - start )) s)"
fi

# ---- 2. classes ----------------------------------------------------------
shopt -s nullglob
sources=("$SRC_DIR"/*.java)
resources=("$SRC_DIR"/*.properties)
shopt -u nullglob
if [[ ${#sources[@]} -gt 0 ]]; then
    cls_hash="$(hash_of "${sources[@]}" "${resources[@]}" "$JAR_STAMP")"
    if [[ $force -eq 0 && -f "$CLS_STAMP" && "$(cat "$CLS_STAMP")" == "$cls_hash" && -d "$CLASSES" ]]; then
        :
    else
        command -v "$JAVAC" >/dev/null || { log "error: '$JAVAC' not found (a JDK 17 is required)"; exit 1; }
        log "compiling ${#sources[@]} Java source(s) into ${CLASSES#"$ROOT"/} ..."
        rm -rf "$CLASSES"
        mkdir -p "$CLASSES"
        "$JAVAC" --release 17 -nowarn -encoding UTF-8 -cp "$JAR_DIR/*" -d "$CLASSES" "${sources[@]}" 1>&2
        # resources (log4j config for the client harness)
        for f in "${resources[@]}"; do cp "$f" "$CLASSES/"; done
        echo "$cls_hash" > "$CLS_STAMP"
    fi
fi

# ---- 3. Spark's Kafka source (only where pyspark is installed) -----------
if "${PYTHON:-$ROOT/.venv/bin/python}" -c \
        'import importlib.util, sys; sys.exit(importlib.util.find_spec("pyspark") is None)' 2>/dev/null; then
    args=(); [[ $force -eq 1 ]] && args=(--force)
    bash "$ROOT/spark-jobs/jars/fetch.sh" "${args[@]}"
fi
