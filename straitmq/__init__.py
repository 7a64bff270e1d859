"""StraitMQ: a Kafka-compatible message queue written in Python."""

__version__ = "0.3.0.dev0"
