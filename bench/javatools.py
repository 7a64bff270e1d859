"""Run Java tools (the Apache Kafka jars and the StraitClient harness) from Python.

The jars are fetched from Maven Central by ``scripts/fetch-jars.sh`` into ``.cache/jars/``;
:func:`classpath` runs that script (a no-op taking milliseconds once the stamp files are there).
Two sets: ``kafka-3.9`` (the default here: StraitClient is compiled against it, the tests and
the perf tools run with it) and ``kafka-4.4`` (``jars="4.4"``: the reference broker of
bench/kafka_ref.py and the Kafka 4.4 CLI tools, see KAFKA44_TOOLS).

    from bench.javatools import classpath, run_java, straitclient
    r = straitclient(["admin", "--bootstrap", "127.0.0.1:9092", "list-topics"])
    r.returncode, r.json        # r.json: the last JSON line printed, r.lines: all of them

Standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = REPO_ROOT / ".cache"
JARS_DIR = CACHE_DIR / "jars" / "kafka-3.9"
KAFKA44_JARS_DIR = CACHE_DIR / "jars" / "kafka-4.4"
# jar set name -> folder (scripts/fetch-jars.sh fills both)
JAR_SETS = {"3.9": JARS_DIR, "4.4": KAFKA44_JARS_DIR}
# the Apache Kafka that bench/kafka_ref.py runs as the reference broker
REF_KAFKA = "4.4"
CLASSES_DIR = CACHE_DIR / "jars" / "classes"
# tools/java/kafka-4.4/apps/*.java compiled against the 4.4 set (the Streams word count)
CLASSES_44_DIR = CACHE_DIR / "jars" / "classes-4.4"
CLASS_DIRS = {"3.9": CLASSES_DIR, "4.4": CLASSES_44_DIR}
FETCH_SCRIPT = REPO_ROOT / "scripts" / "fetch-jars.sh"
LOG4J_CONFIG = REPO_ROOT / "tools" / "java" / "log4j.properties"  # log4j 1 (3.9 jars)
LOG4J2_CONFIG = REPO_ROOT / "tools" / "java" / "kafka-4.4" / "log4j2-tools.xml"  # 4.4 jars

# Main classes present in the Kafka 3.9 and 4.4 jars (see also bench/kafka_ref.py).
KAFKA_MAIN = "kafka.Kafka"  # the broker (kafka_2.13 jar)
STORAGE_TOOL = "kafka.tools.StorageTool"  # `kafka-storage.sh format` (kafka_2.13 jar)
PRODUCER_PERF = (
    "org.apache.kafka.tools.ProducerPerformance"  # kafka-producer-perf-test.sh (kafka-tools jar)
)
CONSUMER_PERF = (
    "org.apache.kafka.tools.ConsumerPerformance"  # kafka-consumer-perf-test.sh (kafka-tools jar)
)
END_TO_END_LATENCY = (
    "org.apache.kafka.tools.EndToEndLatency"  # kafka-e2e-latency.sh (kafka-tools jar)
)
STRAIT_CLIENT = "StraitClient"  # tools/java/StraitClient.java

# bin/kafka-*.sh -> main class, in the Kafka 4.4 jars (kafka-tools unless noted). Many tools
# moved from kafka.* (Scala, core) to org.apache.kafka.tools.* between 3.x and 4.0.
KAFKA44_TOOLS = {
    "kafka-server-start": KAFKA_MAIN,  # kafka_2.13
    "kafka-storage": STORAGE_TOOL,  # kafka_2.13
    "kafka-configs": "org.apache.kafka.tools.ConfigCommand",  # Scala kafka.admin.* up to 4.1
    "kafka-topics": "org.apache.kafka.tools.TopicCommand",
    "kafka-console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "kafka-console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "kafka-consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "kafka-share-groups": "org.apache.kafka.tools.consumer.group.ShareGroupCommand",
    "kafka-groups": "org.apache.kafka.tools.GroupsCommand",
    "kafka-broker-api-versions": "org.apache.kafka.tools.BrokerApiVersionsCommand",
    "kafka-metadata-quorum": "org.apache.kafka.tools.MetadataQuorumCommand",
    "kafka-log-dirs": "org.apache.kafka.tools.LogDirsCommand",
    "kafka-get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "kafka-delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "kafka-leader-election": "org.apache.kafka.tools.LeaderElectionCommand",
    "kafka-reassign-partitions": "org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
    "kafka-features": "org.apache.kafka.tools.FeatureCommand",
    "kafka-cluster": "org.apache.kafka.tools.ClusterTool",
    "kafka-acls": "org.apache.kafka.tools.AclCommand",
    "kafka-transactions": "org.apache.kafka.tools.TransactionsCommand",
    "kafka-delegation-tokens": "org.apache.kafka.tools.DelegationTokenCommand",
    "kafka-client-metrics": "org.apache.kafka.tools.ClientMetricsCommand",
    "kafka-streams-groups": "org.apache.kafka.tools.streams.StreamsGroupCommand",
    "kafka-producer-perf-test": PRODUCER_PERF,
    "kafka-consumer-perf-test": CONSUMER_PERF,
    "kafka-e2e-latency": END_TO_END_LATENCY,
}

# JVM flags for short-lived client tools (StraitClient): fast start-up matters more than speed.
CLIENT_JVM_ARGS = ["-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"]
# JVM flags for the perf tools, as bin/kafka-producer-perf-test.sh runs them
# (KAFKA_HEAP_OPTS=-Xmx512M + kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS).
KAFKA_JVM_PERFORMANCE_OPTS = [
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
]
PERF_JVM_ARGS = ["-Xmx512m", *KAFKA_JVM_PERFORMANCE_OPTS, "-Duser.language=en", "-Duser.country=US"]

_lock = threading.Lock()
_classpath: str | None = None


class JavaToolsError(RuntimeError):
    pass


def ensure_jars(force: bool = False) -> None:
    """Run scripts/fetch-jars.sh (downloads jars and compiles StraitClient when needed)."""
    if shutil.which("java") is None:
        raise JavaToolsError("java not found on PATH (a JDK 17 is required)")
    cmd = ["bash", str(FETCH_SCRIPT)] + (["--force"] if force else [])
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise JavaToolsError(
            f"{FETCH_SCRIPT} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}"
        )


def classpath(include_classes: bool = True, jars: str = "3.9") -> str:
    """Ensure fetch-jars ran; return the Java classpath (absolute paths, jar wildcard).

    include_classes=False leaves out the compiled classes dir of the set (used for the broker,
    and for the single-file clients run from source, which must not be on the classpath too).
    jars: which jar set, "3.9" (default: with StraitClient) or "4.4" (with the programs of
    tools/java/kafka-4.4/apps/, e.g. WordCountApp); each set gets only its own classes.
    """
    global _classpath
    if jars not in JAR_SETS:
        raise ValueError(f"unknown jar set {jars!r} (one of {sorted(JAR_SETS)})")
    with _lock:
        if _classpath is None:
            ensure_jars()
            _classpath = "ok"
    parts = [str(JAR_SETS[jars] / "*")]
    if include_classes:
        parts.insert(0, str(CLASS_DIRS[jars]))
    return os.pathsep.join(parts)


def java_cmd(
    main_class: str,
    args: Iterable[Any] = (),
    jvm_args: Sequence[str] | None = None,
    include_classes: bool = True,
    log_level: str | None = None,
    jars: str = "3.9",
) -> list[str]:
    """Build the java command line for ``main_class`` (does not run it).

    jars="4.4" runs it from the Kafka 4.4 jars, logging through Log4j 2 (WARN and up to stderr
    unless jvm_args bring their own -Dlog4j2.configurationFile)."""
    java = os.environ.get("JAVA", "java")
    if jvm_args is None:
        jvm_args = CLIENT_JVM_ARGS
    level = log_level or os.environ.get("STRAIT_JAVA_LOGLEVEL", "WARN")
    cfg_prefix = "-Dlog4j2.configurationFile=" if jars != "3.9" else "-Dlog4j.configuration="
    has_log_cfg = any(str(a).startswith(cfg_prefix) for a in jvm_args)
    cmd = [java, *jvm_args]
    if not has_log_cfg:
        if jars == "3.9":
            cmd += [f"-Dlog4j.configuration=file:{LOG4J_CONFIG}", f"-Dstrait.loglevel={level}"]
        else:
            cmd += [f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}", f"-Dstrait.loglevel={level}"]
    cmd += ["-cp", classpath(include_classes, jars), main_class, *[str(a) for a in args]]
    return cmd


def run_java(
    main_class: str,
    args: Iterable[Any] = (),
    *,
    jvm_args: Sequence[str] | None = None,
    include_classes: bool = True,
    log_level: str | None = None,
    jars: str = "3.9",
    **popen_kwargs: Any,
) -> subprocess.Popen:
    """Start ``java <jvm_args> -cp <classpath> main_class args...``; returns the Popen.

    popen_kwargs go to subprocess.Popen (stdout=..., stderr=..., cwd=..., text=True, ...).
    """
    cmd = java_cmd(
        main_class,
        args,
        jvm_args=jvm_args,
        include_classes=include_classes,
        log_level=log_level,
        jars=jars,
    )
    return subprocess.Popen(cmd, **popen_kwargs)


class ClientResult(subprocess.CompletedProcess):
    """CompletedProcess of a StraitClient run with its JSON output parsed.

    lines: every stdout line that parsed as JSON (records, then the summary);
    json:  the last of them (the summary for produce/consume, the answer for admin), or None.
    records: for consume, the per-record lines (everything but the summary).
    """

    lines: list[Any]

    @property
    def json(self) -> Any:
        return self.lines[-1] if self.lines else None

    @property
    def records(self) -> list[Any]:
        return [rec for rec in self.lines if isinstance(rec, dict) and "o" in rec and "p" in rec]


def straitclient(
    args: Sequence[Any],
    *,
    timeout: float = 120,
    check: bool = False,
    jvm_args: Sequence[str] | None = None,
    input: str | None = None,
    env: dict[str, str] | None = None,
) -> ClientResult:
    """Run the StraitClient harness (``produce`` / ``consume`` / ``admin`` ...) to completion.

    Example: straitclient(["produce", "--bootstrap", "127.0.0.1:9092", "--topic", "t",
                           "--count", 1000, "--compression", "zstd", "--acks", "all"])
    Raises subprocess.TimeoutExpired after ``timeout`` seconds (the JVM is killed),
    and JavaToolsError when check=True and the exit code is not 0.
    """
    cmd = java_cmd(STRAIT_CLIENT, args, jvm_args=jvm_args)
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        env=env,
    )
    res = ClientResult(proc.args, proc.returncode, proc.stdout, proc.stderr)
    res.lines = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            res.lines.append(json.loads(line))
        except ValueError:
            pass
    if check and proc.returncode != 0:
        raise JavaToolsError(
            f"StraitClient {' '.join(map(str, args))} exited {proc.returncode}\n"
            f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-4000:]}"
        )
    return res


if __name__ == "__main__":  # python -m bench.javatools [StraitClient args...]
    import sys

    if len(sys.argv) > 1:
        r = straitclient(sys.argv[1:], timeout=600)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        sys.exit(r.returncode)
    print(classpath())
