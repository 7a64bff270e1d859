"""`strait-broker`: run one broker process in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from pathlib import Path

import uvloop
from straitmq.node import build_broker

from straitmq import gc_tuning, logs
from straitmq.formats import EXIT_FORMAT, FormatError
from straitmq.node_identity import ordinal_from_hostname
from straitmq.properties import load_settings
from straitmq.security.settings import check_keys
from straitmq.settings import add_flags, flag_values, properties_fields
from straitmq.signals import stop_signal
from straitmq.version import VERSION, commit, describe

from .config import BrokerConfig
from .errors import BrokerStartupError

log = logging.getLogger("straitmq.broker")

# The listener settings a --properties file may set too (declared in config.py).
LISTENER_FIELDS = properties_fields(BrokerConfig)


def parse_args(argv: list[str] | None = None) -> BrokerConfig:
    d = BrokerConfig()
    p = argparse.ArgumentParser(prog="strait-broker", description="Run a StraitMQ broker.")
    p.add_argument(
        "--node-id",
        default=str(d.node_id),
        help="a number, or 'auto': the ordinal at the end of the host name (StatefulSet pods)",
    )
    # The settings with a plain flag, as config.py declares them.
    add_flags(p, BrokerConfig)
    # Settings whose flag is shaped differently from the field(s) it sets.
    p.add_argument("--listen", default=f"{d.host}:{d.port}", help="Kafka listener host:port")
    p.add_argument("--advertise", default=None, help="host:port clients should use")
    p.add_argument("--http", default=f"{d.http_host}:{d.http_port}", help="HTTP host:port")
    rack = p.add_mutually_exclusive_group()
    rack.add_argument("--rack", default=None, help="broker.rack: where this broker runs")
    rack.add_argument(
        "--rack-file",
        default=None,
        help="read broker.rack from this file (on Kubernetes, written by an init container "
        "from the node's label)",
    )
    p.add_argument("--no-auto-create", action="store_true", help="auto.create.topics.enable=false")
    p.add_argument(
        "--properties",
        default=None,
        help="a Kafka-style key=value file of listener and security settings (listeners, "
        "listener.security.protocol.map, ssl.*, sasl.*, listener.name.<name>.*)",
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
    if a.controller_voters and not a.cluster_id:
        p.error("--cluster-id is required with --controllers")
    try:
        node_id = ordinal_from_hostname() if a.node_id == "auto" else int(a.node_id)
    except ValueError as e:
        p.error(f"--node-id: {e}")
    rack_name = a.rack
    if a.rack_file:
        try:
            rack_name = Path(a.rack_file).read_text().strip()
        except OSError as e:
            p.error(f"--rack-file: {e}")
        if not rack_name:
            p.error(f"--rack-file: {a.rack_file} is empty")
    host, _, port = a.listen.rpartition(":")
    adv_host, _, adv_port = (a.advertise or a.listen).rpartition(":")
    http_host, _, http_port = a.http.rpartition(":")
    try:
        props = load_settings(a.properties, a.override)
    except OSError as e:
        p.error(f"--properties: {e}")
    except ValueError as e:
        p.error(str(e))
    try:
        check_keys(props, LISTENER_FIELDS)
    except ValueError as e:
        p.error(str(e))
    for key, name in LISTENER_FIELDS.items():  # a flag given on the command line wins
        if key in props and getattr(a, name) == getattr(d, name):
            value = props.pop(key)
            setattr(a, name, int(value) if isinstance(getattr(d, name), int) else value)
    logs.setup(a.log_level)
    return BrokerConfig(
        security=props,
        node_id=node_id,
        host=host or "127.0.0.1",
        port=int(port),
        advertised_host=adv_host or host or "127.0.0.1",
        advertised_port=int(adv_port),
        http_host=http_host or "127.0.0.1",
        http_port=int(http_port),
        rack=rack_name,
        auto_create_topics=not a.no_auto_create,
        **flag_values(a, BrokerConfig),
    )


STARTUP_REPORT_S = 10.0  # how often a broker that is not serving yet says why


async def run(config: BrokerConfig, announce: bool = True) -> None:
    log.info(
        "broker starting",
        extra={
            "node": config.node_id,
            # A combined node (no --controllers) runs its controller in this process.
            "combined": not config.controller_voters,
            "version": VERSION,
            "commit": commit(),
        },
    )
    broker = build_broker(config)
    stop = stop_signal()
    starting = asyncio.ensure_future(broker.start())
    stopped = asyncio.ensure_future(stop.wait())
    while not starting.done():
        await asyncio.wait(
            {starting, stopped}, timeout=STARTUP_REPORT_S, return_when=asyncio.FIRST_COMPLETED
        )
        if stopped.done() and not starting.done():  # asked to stop before it served
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting
            await broker.stop(controlled=False)
            return
        if not starting.done():
            print(
                f"strait-broker {config.node_id}: not serving yet: {broker.phase}",
                file=sys.stderr,
                flush=True,
            )
    try:
        starting.result()
    except BrokerStartupError as e:
        print(f"strait-broker {config.node_id}: cannot join: {e}", file=sys.stderr, flush=True)
        await broker.stop(controlled=False)
        sys.exit(78)
    if announce:
        kafka = (
            ", ".join(
                f"{ln.name} ({ln.spec.protocol}) {ln.spec.advertised_host}:"
                f"{ln.spec.advertised_port}"
                for ln in broker.listeners
            )
            if config.listeners
            else f"{config.advertised_host}:{config.port}"
        )
        print(
            f"StraitMQ {describe()} broker {config.node_id} ready: kafka {kafka}, "
            f"http {config.http_host}:{config.http_port}, "
            f"data {os.path.abspath(config.data_dir)}",
            file=sys.stderr,
            flush=True,
        )
    await stop.wait()
    stopped.cancel()
    await broker.stop()


def main(argv: list[str] | None = None) -> None:
    try:
        config = parse_args(argv)
        gc_tuning.install()  # full collections stalled the loop for up to 1.3 s
        uvloop.run(run(config))
    except BrokerStartupError as e:
        print(f"strait-broker: cannot start: {e}", file=sys.stderr)
        sys.exit(78)
    except FormatError as e:  # data of another release: expected, no traceback
        print(f"strait-broker: cannot start: {e}", file=sys.stderr)
        sys.exit(EXIT_FORMAT)
    except OSError as e:
        print(f"strait-broker: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
