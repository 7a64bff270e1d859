"""The DataFrame schema: the same columns, names and types as Spark's Kafka source."""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


def spark_schema(include_headers: bool) -> StructType:
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", HEADERS))
    return StructType(fields)


_ARROW: dict[bool, Any] = {}


def arrow_schema(include_headers: bool) -> Any:
    """The Arrow schema pyspark expects of batches returned by read() (checked by equality)."""
    if include_headers not in _ARROW:
        from pyspark.sql.pandas.types import to_arrow_schema

        _ARROW[include_headers] = to_arrow_schema(spark_schema(include_headers), timezone="UTC")
    return _ARROW[include_headers]
