"""Errors the broker's subsystems raise to the process that runs them."""

from __future__ import annotations


class BrokerStartupError(Exception):
    """The broker cannot join: wrong cluster id, duplicate node id, bad data dir."""
