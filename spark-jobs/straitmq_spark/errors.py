"""The one exception type the `straitmq` Spark data source raises."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


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


def one_line_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """For the driver-side entry points Spark calls in a short-lived Python worker (creating
    readers and writers, planning streaming offsets): if a StraitMQSparkError escapes, ask
    Spark to report it as its one line, without the Python traceback. Spark's planner for
    streaming sources ignores spark.sql.execution.pyspark.udf.hideTraceback.enabled, and the
    worker exits right after reporting, so this changes nothing else. Other exceptions (bugs)
    keep their full traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except StraitMQSparkError:
            os.environ["SPARK_HIDE_TRACEBACK"] = "1"
            raise

    return wrapper
