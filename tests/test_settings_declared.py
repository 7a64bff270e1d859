"""Every process's settings are declared once (straitmq.settings): the command line, the
defaults of the classes that use them and describe() all come from those declarations."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

import pytest
from straitmq.broker.__main__ import LISTENER_FIELDS, parse_args
from straitmq.broker.config import BrokerConfig
from straitmq.controller.active import ControllerSettings
from straitmq.controller.config import DEFAULTS, ControllerConfig
from straitmq.raft.core import RaftConfig

from straitmq.security.settings import ACL_KEYS, CONTROLLER_KEYS, HTTP_KEYS, KEYS, check_keys
from straitmq.settings import add_flags, default_of, flag_values, setting


def _parser(cls: type) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_flags(p, cls)
    return p


def test_controller_flags_parse_to_the_declared_defaults() -> None:
    a = _parser(ControllerConfig).parse_args([])
    assert ControllerConfig(**flag_values(a, ControllerConfig)) == ControllerConfig()
    a = _parser(ControllerConfig).parse_args(
        ["--election-timeout-ms", "50", "--no-auto-leader-rebalance", "--default-partitions=3"]
    )
    cfg = ControllerConfig(**flag_values(a, ControllerConfig))
    assert (cfg.election_timeout_ms, cfg.auto_leader_rebalance, cfg.default_partitions) == (
        50,
        False,
        3,
    )
    assert cfg.describe()["controller.quorum.election.timeout.ms"] == "50"
    assert cfg.describe()["auto.leader.rebalance.enable"] == "false"


def test_the_users_of_controller_settings_take_the_declared_defaults() -> None:
    raft = RaftConfig()
    assert (raft.election_timeout_ms, raft.fetch_timeout_ms) == (
        DEFAULTS.election_timeout_ms,
        DEFAULTS.fetch_timeout_ms,
    )
    s = ControllerSettings(cluster_id="c")
    assert s.session_timeout_ms == DEFAULTS.broker_session_timeout_ms
    assert s.leader_rebalance_interval_ms == DEFAULTS.leader_rebalance_interval_ms
    assert s.auto_leader_rebalance is DEFAULTS.auto_leader_rebalance
    assert (s.default_partitions, s.default_replication_factor) == (
        DEFAULTS.default_partitions,
        DEFAULTS.default_replication_factor,
    )
    b = BrokerConfig()  # a combined node runs its own controller with the same defaults
    assert (b.election_timeout_ms, b.fetch_timeout_ms) == (1000, 2000)
    assert b.session_timeout_ms == default_of(ControllerConfig, "broker_session_timeout_ms")
    assert b.leader_rebalance_interval_ms == DEFAULTS.leader_rebalance_interval_ms


def test_a_bool_setting_whose_default_is_false_gets_a_flag_that_turns_it_on() -> None:
    @dataclasses.dataclass
    class Toy:
        verbose: bool = setting(False, "toy.verbose", "--verbose", "say more")
        count: int | None = setting(None, None, "--count")
        quiet: int = 7  # not declared: no flag

    assert flag_values(_parser(Toy).parse_args([]), Toy) == {"verbose": False, "count": None}
    assert flag_values(_parser(Toy).parse_args(["--verbose", "--count", "2"]), Toy) == {
        "verbose": True,
        "count": 2,
    }
    with pytest.raises(KeyError):
        default_of(Toy, "nothing")


def test_broker_listener_settings_come_from_a_properties_file_too(tmp_path: Path) -> None:
    assert LISTENER_FIELDS == {
        "listeners": "listeners",
        "advertised.listeners": "advertised_listeners",
        "listener.security.protocol.map": "listener_security_protocol_map",
        "inter.broker.listener.name": "inter_broker_listener_name",
        "connections.max.reauth.ms": "connections_max_reauth_ms",
        "max.connections": "max_connections",
        "max.connections.per.ip": "max_connections_per_ip",
    }
    props = tmp_path / "broker.properties"
    props.write_text(
        "connections.max.reauth.ms=60000\nmax.connections.per.ip=7\nssl.client.auth=required\n"
    )
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:  # parse_args sets up the process's logging: give this process's back
        cfg = parse_args(["--properties", str(props), "--data-dir", str(tmp_path)])
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert cfg.connections_max_reauth_ms == 60000
    assert (cfg.max_connections_per_ip, cfg.max_connections) == (7, 2**31 - 1)
    assert cfg.describe()["max.connections.per.ip"] == "7"
    assert cfg.security == {"ssl.client.auth": "required"}
    with pytest.raises(ValueError, match=r"unknown setting 'ssl\.clientauth'"):
        check_keys({"ssl.clientauth": "required"}, LISTENER_FIELDS)


def test_security_keys_are_declared_once_with_their_defaults() -> None:
    assert ACL_KEYS == {"authorizer.class.name", "super.users", "allow.everyone.if.no.acl.found"}
    assert {k for k in HTTP_KEYS if not k.startswith("http.")} == set()
    # A controller: its HTTP port, its ACLs, and how it checks who calls it.
    assert CONTROLLER_KEYS == HTTP_KEYS | ACL_KEYS | {
        "ssl.truststore.location",
        "ssl.endpoint.identification.algorithm",
    }
    assert KEYS["http.authentication"].default == "none"
    assert KEYS["ssl.endpoint.identification.algorithm"].default == "https"
