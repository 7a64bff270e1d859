#!/usr/bin/env bash
# Fetch Spark's Kafka source (spark-sql-kafka-0-10_2.13, the version of the installed pyspark)
# plus kafka-clients and commons-pool2 from Maven Central into .cache/jars/spark-kafka/, and
# compile TokenProviderStandIn.scala (with the Scala compiler pyspark ships) into a jar beside
# them. Use them with `spark.jars` = every *.jar in that folder (straitmq.spark.kafka_jars()).
#
# Idempotent: a stamp records the sha256 of pom.xml, the .scala file and the pyspark version;
# when it matches, the script exits at once. Called by scripts/fetch-jars.sh; runnable alone.
# Usage: spark-jobs/jars/fetch.sh [--force]     Env: PYTHON (default .venv/bin/python), MVN
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
JARS_PARENT="$ROOT/.cache/jars"
OUT="$JARS_PARENT/spark-kafka"
STAMP="$JARS_PARENT/.spark-kafka.stamp"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
MVN="${MVN:-mvn}"
log() { echo "fetch-jars (spark-kafka): $*" >&2; }

mkdir -p "$JARS_PARENT"
[[ -f "$ROOT/.cache/.gitignore" ]] || printf '*\n' > "$ROOT/.cache/.gitignore"
if command -v flock >/dev/null; then
    exec 8>"$JARS_PARENT/.spark-kafka.lock"
    flock -w 1200 8 || { log "error: timed out waiting for another run"; exit 1; }
fi

pyspark_home="$("$PYTHON" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" || {
    log "error: pyspark is not installed for $PYTHON (pip install -e '.[test]')"; exit 1; }
spark_version="$("$PYTHON" -c 'import pyspark; print(pyspark.__version__)')"
pom_version="$(sed -n 's:.*<spark.version>\(.*\)</spark.version>.*:\1:p' "$HERE/pom.xml")"
if [[ "$spark_version" != "$pom_version" ]]; then
    log "error: pyspark is $spark_version but spark-jobs/jars/pom.xml asks for $pom_version;"
    log "       Spark's Kafka source must match Spark exactly: align the two"
    exit 1
fi

hash="$(cat "$HERE/pom.xml" "$HERE/TokenProviderStandIn.scala" | sha256sum | cut -d' ' -f1)-$spark_version"
if [[ "${1:-}" != "--force" && -f "$STAMP" && "$(cat "$STAMP")" == "$hash" && -d "$OUT" ]]; then
    exit 0
fi

command -v "$MVN" >/dev/null || { log "error: '$MVN' not found (Maven is required)"; exit 1; }
log "downloading spark-sql-kafka-0-10_2.13:$spark_version from Maven Central ..."
tmp="$JARS_PARENT/.spark-kafka.tmp.$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT
mvn_log="$JARS_PARENT/mvn-spark-kafka.log"
# Only the jars pyspark does not already ship (scala-library, lz4, snappy, slf4j... it does).
# shellcheck disable=SC2086
if ! "$MVN" -B -Dstyle.color=never -f "$HERE/pom.xml" ${MVN_ARGS:-} \
        dependency:copy-dependencies -DincludeScope=runtime \
        -DincludeArtifactIds=spark-sql-kafka-0-10_2.13,kafka-clients,commons-pool2 \
        -DoutputDirectory="$tmp" > "$mvn_log" 2>&1; then
    tail -n 30 "$mvn_log" >&2
    log "error: mvn dependency:copy-dependencies failed (full log: $mvn_log)"
    exit 1
fi
n=$(ls "$tmp"/*.jar 2>/dev/null | wc -l)
[[ "$n" -eq 3 ]] || { log "error: expected 3 jars, got $n (see $mvn_log)"; exit 1; }

log "compiling TokenProviderStandIn.scala with pyspark's scalac ..."
mkdir -p "$tmp/classes"
java -cp "$pyspark_home/jars/*" scala.tools.nsc.Main -usejavacp -nowarn -release 17 \
    -d "$tmp/classes" "$HERE/TokenProviderStandIn.scala" 1>&2
(cd "$tmp/classes" && jar cf "$tmp/straitmq-token-provider-standin.jar" .)
rm -rf "$tmp/classes"

rm -rf "$OUT"
mv "$tmp" "$OUT"
trap - EXIT
echo "$hash" > "$STAMP"
log "$(ls "$OUT" | wc -l) jars in ${OUT#"$ROOT"/}"
