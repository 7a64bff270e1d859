"""StraitMQ: a Kafka-compatible message queue written in Python."""

__version__ = "0.2.0"
