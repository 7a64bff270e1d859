"""`strait-controller`: run one voter of the metadata quorum in the foreground."""

from __future__ import annotations

import argparse
import logging
import os
import sys

import uvloop
from straitmq.raft.core import RaftConfig

from straitmq import gc_tuning, logs
from straitmq.formats import EXIT_FORMAT, FormatError
from straitmq.node_identity import voter_for_hostname
from straitmq.properties import load_settings
from straitmq.security.settings import CONTROLLER_KEYS
from straitmq.settings import add_flags, flag_values
from straitmq.signals import wait_for_stop_signal
from straitmq.version import VERSION, commit, describe

from .active import ControllerSettings
from .bootstrap import parse_add_scram
from .config import ControllerConfig
from .node import ControllerNode
from .quorum import parse_voters

log = logging.getLogger("straitmq.controller")


def build(argv: list[str] | None = None) -> ControllerNode:
    p = argparse.ArgumentParser(
        prog="strait-controller", description="Run one voter of the StraitMQ controller quorum."
    )
    p.add_argument(
        "--node-id",
        required=True,
        help="a number, or 'auto': the voter whose DNS name starts with this host's name "
        "(a StatefulSet pod beyond the voters: the voters' numbering of its ordinal)",
    )
    p.add_argument(
        "--voters", required=True, help="all voters: 1@127.0.0.1:9093,2@127.0.0.1:9094,..."
    )
    p.add_argument("--cluster-id", required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--listen", default=None, help="host:port (default: this node's voter address)")
    # The settings with a flag, as config.py declares them.
    add_flags(p, ControllerConfig)
    p.add_argument(
        "--add-scram",
        action="append",
        default=[],
        metavar="'SCRAM-SHA-512=[name=U,password=P]'",
        help="a SCRAM user written when the cluster is created, as kafka-storage format "
        "--add-scram (e.g. the brokers' own user for a SASL inter-broker listener); "
        "repeatable; give every controller the same",
    )
    p.add_argument(
        "--properties",
        default=None,
        help="a Kafka-style key=value file of HTTP security settings: "
        + ", ".join(sorted(CONTROLLER_KEYS)),
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one such setting; repeatable, wins over --properties",
    )
    p.add_argument("--log-level", default=os.environ.get("STRAIT_LOG_LEVEL", "warning"))
    a = p.parse_args(argv)
    logs.setup(a.log_level)
    try:
        props = load_settings(a.properties, a.override)
    except OSError as e:
        p.error(f"--properties: {e}")
    except ValueError as e:
        p.error(str(e))
    for key in props:  # a typo must not leave the port open
        if key not in CONTROLLER_KEYS:
            known = ", ".join(sorted(CONTROLLER_KEYS))
            p.error(f"unknown setting {key!r}: a controller takes {known}")
    try:
        bootstrap = tuple(parse_add_scram(v) for v in a.add_scram)
    except ValueError as e:
        p.error(str(e))
    try:
        voters = parse_voters(a.voters)
    except ValueError as e:
        p.error(str(e))
    try:
        node_id = voter_for_hostname(voters) if a.node_id == "auto" else int(a.node_id)
    except ValueError as e:
        p.error(f"--node-id: {e}")
    if node_id not in voters and a.listen is None:
        p.error(
            f"--node-id {node_id} is not one of the --voters {sorted(voters)}: a controller "
            "that joins the quorum (as an observer, until `strait quorum add` makes it a "
            "voter) needs --listen host:port"
        )
    listen = a.listen or voters[node_id].removeprefix("http://")
    try:
        return _node(a, node_id, voters, listen, bootstrap, props)
    except ValueError as e:  # unusable TLS or authentication settings
        p.error(str(e))


def _node(
    a: argparse.Namespace,
    node_id: int,
    voters: dict[int, str],
    listen: str,
    bootstrap: tuple,
    props: dict[str, str],
) -> ControllerNode:
    host, _, port = listen.rpartition(":")
    cfg = ControllerConfig(**flag_values(a, ControllerConfig))
    return ControllerNode(
        node_id,
        voters,
        a.data_dir,
        ControllerSettings(
            cluster_id=a.cluster_id,
            session_timeout_ms=cfg.broker_session_timeout_ms,
            leader_rebalance_interval_ms=cfg.leader_rebalance_interval_ms,
            auto_leader_rebalance=cfg.auto_leader_rebalance,
            default_partitions=cfg.default_partitions,
            default_replication_factor=cfg.default_replication_factor,
            bootstrap_records=bootstrap,
            bootstrap_metadata_level=cfg.bootstrap_metadata_level,
            quota_window_num=cfg.quota_window_num,
            quota_window_size_seconds=cfg.quota_window_size_seconds,
        ),
        RaftConfig(
            election_timeout_ms=cfg.election_timeout_ms, fetch_timeout_ms=cfg.fetch_timeout_ms
        ),
        host or "127.0.0.1",
        int(port),
        otlp_endpoint=cfg.otlp_endpoint,
        security=props,
    )


async def run(node: ControllerNode) -> None:
    log.info(
        "controller starting",
        extra={
            "node": node.quorum.node_id,
            "port": node.port,
            "version": VERSION,
            "commit": commit(),
        },
    )
    await node.start()
    print(
        f"StraitMQ {describe()} controller {node.quorum.node_id} ready on {node.host}:{node.port}",
        file=sys.stderr,
        flush=True,
    )
    await wait_for_stop_signal()
    await node.stop()


def main(argv: list[str] | None = None) -> None:
    try:
        node = build(argv)
    except FormatError as e:  # data of another release: expected, no traceback
        print(f"strait-controller: cannot start: {e}", file=sys.stderr)
        sys.exit(EXIT_FORMAT)
    try:
        gc_tuning.install()  # full collections stalled the loop for up to 1.3 s
        uvloop.run(run(node))
    except OSError as e:
        print(f"strait-controller: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
