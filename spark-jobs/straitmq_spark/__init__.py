"""StraitMQ for Spark: a pure-Python data source registered as `straitmq`.

    from straitmq.spark import register
    register(spark)                      # spark.dataSource.register(StraitMQDataSource)
    df = spark.read.format("straitmq").option("kafka.bootstrap.servers", "host:9092") \\
        .option("subscribe", "orders").load()

Needs pyspark >= 4.2 (streaming reads with admission control), pyarrow and confluent-kafka
on the driver and the executors.
"""

from __future__ import annotations

from typing import Any

from .errors import StraitMQSparkError

__all__ = ["StraitMQDataSource", "StraitMQSparkError", "register", "user_message"]

# Spark settings that make a data source error read as one line, not a Python traceback.
QUIET_ERRORS_CONF = {
    "spark.sql.execution.pyspark.udf.hideTraceback.enabled": "true",
}


def __getattr__(name: str) -> Any:
    if name == "StraitMQDataSource":  # imports pyspark: only when asked for
        from .source import StraitMQDataSource

        return StraitMQDataSource
    raise AttributeError(name)


def register(spark: Any) -> None:
    """Register the `straitmq` format with a SparkSession (once per session is enough)."""
    from .source import StraitMQDataSource

    spark.dataSource.register(StraitMQDataSource)


def user_message(exc: BaseException) -> str | None:
    """The StraitMQSparkError line inside whatever Spark raised (AnalysisException,
    PythonException, StreamingQueryException, Py4JJavaError ...), or None if there is none."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, StraitMQSparkError):
            return str(e)
        for line in str(e).splitlines():
            at = line.find(StraitMQSparkError.PREFIX)
            if at >= 0:
                return line[at + len(StraitMQSparkError.PREFIX) :].strip()
        e = e.__cause__ or e.__context__
    return None
