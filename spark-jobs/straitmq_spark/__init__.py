"""StraitMQ for Spark: a pure-Python data source registered as `straitmq`."""
