#!/usr/bin/env bash
# Fetch Apache Kafka jars (broker + tools + clients + all transitive deps) from Maven
# Central, and compile tools/java/StraitClient.java into .cache/jars/classes/:
#   .cache/jars/kafka-3.9/   Kafka 3.9.x (tools/java/pom.xml): the StraitClient harness and
#                            the tests are compiled against / run with these
#   .cache/jars/kafka-4.4/   Kafka 4.4.x (tools/java/kafka-4.4/pom.xml): the reference broker
#                            of the benchmarks (bench/kafka_ref.py) and the 4.4 CLI tools
#
# Idempotent: one stamp file per jar set records the sha256 of its POM, another the sha256
# of the Java sources (classes); when all match, the script exits at once.
# Needs only `mvn` (local repository: the default ~/.m2) and a JDK 17 (`javac`).
# Progress goes to stderr; stdout is left empty (callers may parse it).
#
# Usage: scripts/fetch-jars.sh [--force]
#   --force   re-download and recompile even if the stamps match
# Env:    MVN (default: mvn), JAVAC (default: javac), MVN_ARGS (extra mvn args)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
POM="$ROOT/tools/java/pom.xml"
POM_44="$ROOT/tools/java/kafka-4.4/pom.xml"
SRC_DIR="$ROOT/tools/java"
CACHE="$ROOT/.cache"
JARS_PARENT="$CACHE/jars"
JAR_DIR="$JARS_PARENT/kafka-3.9"
CLASSES="$JARS_PARENT/classes"
JAR_STAMP="$JARS_PARENT/.kafka-3.9.stamp"
JAR_DIR_44="$JARS_PARENT/kafka-4.4"
JAR_STAMP_44="$JARS_PARENT/.kafka-4.4.stamp"
CLS_STAMP="$JARS_PARENT/.classes.stamp"
SRC_DIR_44="$ROOT/tools/java/kafka-4.4/apps"
COMPAT_DIR_44="$ROOT/tools/java/kafka-4.4/compat"
CLASSES_44="$JARS_PARENT/classes-4.4"
CLS_STAMP_44="$JARS_PARENT/.classes-4.4.stamp"
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
# fetch_jars NAME POM DIR STAMP: copy POM's runtime dependencies into DIR unless STAMP holds
# the POM's hash already. Sets fetched=1 when it (re)fetched, 0 when there was nothing to do.
# (Called as a plain command, not in an `if`, so that `set -e` stays in force inside.)
fetched=0
fetch_jars() {
    local name="$1" pom="$2" dir="$3" stamp="$4"
    local hash
    fetched=0
    hash="$(hash_of "$pom")"
    if [[ $force -eq 0 && -f "$stamp" && "$(cat "$stamp")" == "$hash" && -d "$dir" ]]; then
        return 0
    fi
    command -v "$MVN" >/dev/null || { log "error: '$MVN' not found (Maven is required)"; exit 1; }
    log "downloading Kafka $name jars from Maven Central (first run takes a minute or two) ..."
    local start mvn_log n   # tmp stays global: the EXIT trap may need it
    start=$(date +%s)
    tmp="$JARS_PARENT/.kafka-$name.tmp.$$"
    rm -rf "$tmp"
    trap 'rm -rf "$tmp"' EXIT
    # Maven's own log goes to a file (shown on stderr only if it fails): stdout stays clean.
    if [[ "$name" == "3.9" ]]; then mvn_log="$JARS_PARENT/mvn.log"; else mvn_log="$JARS_PARENT/mvn-kafka-$name.log"; fi
    # shellcheck disable=SC2086
    if ! "$MVN" -B -Dstyle.color=never -f "$pom" ${MVN_ARGS:-} \
            dependency:copy-dependencies \
            -DincludeScope=runtime \
            -DoutputDirectory="$tmp" > "$mvn_log" 2>&1; then
        tail -n 40 "$mvn_log" >&2
        log "error: mvn dependency:copy-dependencies failed for Kafka $name (full log: $mvn_log)"
        exit 1
    fi
    n=$(ls "$tmp"/*.jar 2>/dev/null | wc -l)
    if [[ "$n" -lt 20 ]]; then
        log "error: only $n jars were copied for Kafka $name; something is wrong"
        exit 1
    fi
    rm -rf "$dir"
    mv "$tmp" "$dir"
    trap - EXIT
    echo "$hash" > "$stamp"
    log "$n jars in ${dir#"$ROOT"/} ($(( $(date +%s) - start )) s)"
    fetched=1
}

fetch_jars 3.9 "$POM" "$JAR_DIR" "$JAR_STAMP"
if [[ $fetched -eq 1 ]]; then rm -f "$CLS_STAMP"; fi   # recompile against the new jars
# Kafka 4.4: the benchmarks' reference broker, the CLI tools, Streams, Connect, MirrorMaker 2
fetch_jars 4.4 "$POM_44" "$JAR_DIR_44" "$JAR_STAMP_44"

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
# the same for the programs built on the 4.4 jars (the stamp hashes the 4.4 jar stamp too,
# so new jars mean a recompile)
shopt -s nullglob
# apps/*.java, and compat/: the bridge classes that let the 4.3.1 Connect plugins (connect-file,
# connect-mirror; 4.4.0 of those is not served here) run on the 4.4 runtime
mapfile -t compat_44 < <(find "$COMPAT_DIR_44" -name '*.java' 2>/dev/null | sort)
sources_44=("$SRC_DIR_44"/*.java "${compat_44[@]}")
shopt -u nullglob
if [[ ${#sources_44[@]} -gt 0 ]]; then
    cls_hash_44="$(hash_of "${sources_44[@]}" "$JAR_STAMP_44")"
    if [[ $force -eq 0 && -f "$CLS_STAMP_44" && "$(cat "$CLS_STAMP_44")" == "$cls_hash_44" && -d "$CLASSES_44" ]]; then
        :
    else
        command -v "$JAVAC" >/dev/null || { log "error: '$JAVAC' not found (a JDK 17 is required)"; exit 1; }
        log "compiling ${#sources_44[@]} Java source(s) into ${CLASSES_44#"$ROOT"/} ..."
        rm -rf "$CLASSES_44"
        mkdir -p "$CLASSES_44"
        "$JAVAC" --release 17 -nowarn -encoding UTF-8 -cp "$JAR_DIR_44/*" -d "$CLASSES_44" "${sources_44[@]}" 1>&2
        echo "$cls_hash_44" > "$CLS_STAMP_44"
    fi
fi

# ---- 3. Spark's Kafka source (only where pyspark is installed) -----------
if "${PYTHON:-$ROOT/.venv/bin/python}" -c \
        'import importlib.util, sys; sys.exit(importlib.util.find_spec("pyspark") is None)' 2>/dev/null; then
    args=(); [[ $force -eq 1 ]] && args=(--force)
    bash "$ROOT/spark-jobs/jars/fetch.sh" "${args[@]}"
fi
