"""StraitMQ."""
