"""The one exception type the `straitmq` Spark data source raises."""

from __future__ import annotations


class StraitMQSparkError(Exception):
    """A problem the Spark user can fix: the message names it and says what to do.

    Raised on the driver (bad options, missing topic, offsets out of range, unreachable
    cluster) and on executors (data deleted by retention while a query reads it). Spark
    reports it inside its own exception type; set
    ``spark.sql.execution.pyspark.udf.hideTraceback.enabled=true`` (the jobs here do) so that
    the message is all Spark shows, and see :func:`straitmq.spark.user_message` to pull the
    line out of whatever Spark raised.
    """

    PREFIX = "StraitMQSparkError: "
