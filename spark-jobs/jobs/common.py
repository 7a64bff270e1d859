"""What every job here shares: building the SparkSession, the Kafka-source jars, and turning
a failure into one line for the user.

Jobs run the same on a laptop (`python spark-jobs/jobs/<job>.py ...`, Spark in local mode)
and on a cluster (`spark-submit ... <job>.py ...`, where the master comes from spark-submit).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from straitmq.properties import read_properties

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_JARS_DIR = REPO_ROOT / ".cache" / "jars" / "spark-kafka"
FETCH_SCRIPT = REPO_ROOT / "spark-jobs" / "jars" / "fetch.sh"
LOG4J2 = Path(__file__).resolve().parent / "log4j2.properties"

# Settings for small local runs; spark-submit / the SparkApplication override them.
LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.session.timeZone": "UTC",
    "spark.driver.memory": "1g",
    # One line per data-source error instead of a Python traceback (see straitmq.spark).
    "spark.sql.execution.pyspark.udf.hideTraceback.enabled": "true",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J2}",
}


def kafka_jars(fetch: bool = True) -> list[str]:
    """The jars of Spark's Kafka source (spark-sql-kafka-0-10 + kafka-clients + ...), fetched
    from Maven Central by spark-jobs/jars/fetch.sh into .cache/jars/spark-kafka/."""
    if fetch:
        env = dict(os.environ, PYTHON=os.environ.get("PYTHON", sys.executable))
        proc = subprocess.run(
            ["bash", str(FETCH_SCRIPT)], capture_output=True, text=True, env=env, timeout=1200
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{FETCH_SCRIPT} failed:\n{proc.stderr[-3000:]}")
    jars = sorted(glob.glob(str(KAFKA_JARS_DIR / "*.jar")))
    if not jars:
        raise RuntimeError(f"no jars in {KAFKA_JARS_DIR}: run {FETCH_SCRIPT}")
    return jars


def spark_session(
    app: str, *, with_kafka_jars: bool = False, master: str | None = None, **conf: str
) -> Any:
    """A SparkSession with the `straitmq` format registered (and Spark's `kafka` format when
    with_kafka_jars). Local mode (`local[2]`) unless spark-submit already chose a master."""
    # Python workers must run this interpreter (the one with pyspark, pyarrow and
    # confluent-kafka), not whatever `python3` is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from straitmq.spark import register

    builder = SparkSession.builder.appName(app)
    # Under spark-submit the JVM (and its gateway) exists before Python starts.
    submitted = bool(os.environ.get("PYSPARK_GATEWAY_PORT"))
    if master or not submitted:
        builder = builder.master(master or "local[2]")
        for k, v in LOCAL_CONF.items():
            builder = builder.config(k, v)
    if with_kafka_jars and not submitted:
        # Under spark-submit the jars come from the image (/opt/spark/jars) or --packages.
        builder = builder.config("spark.jars", ",".join(kafka_jars()))
    for k, v in conf.items():
        builder = builder.config(k.replace("__", "."), v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "ERROR"))
    register(spark)
    return spark


def run_main(main: Callable[[list[str]], int]) -> None:
    """Run a job's main(); a StraitMQ problem ends it with one line on stderr and exit code 2."""
    from straitmq.spark import user_message

    try:
        code = main(sys.argv[1:])
    except Exception as e:
        msg = user_message(e)
        if msg is None:
            raise
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code)


def client_options(path: str | None) -> dict[str, str]:
    """A Kafka client properties file (what Kafka's tools take as --command-config:
    security.protocol, sasl.mechanism, sasl.jaas.config, ssl.truststore.location, ...)
    as `kafka.<name>` options, which both Spark sources accept."""
    if not path:
        return {}
    return {f"kafka.{k}": v for k, v in read_properties(path).items()}
