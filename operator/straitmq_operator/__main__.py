"""strait-operator: run the StraitMQ operator (kopf) with its metrics and health ports."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import kopf
from aiohttp import web

from straitmq.version import VERSION, commit

from . import handlers, log_format

log = logging.getLogger("straitmq.operator")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="strait-operator",
        description="Reconcile MQCluster and Topic resources (straitmq.io/v1alpha1).",
    )
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    p.add_argument("--metrics-port", type=int, default=8090, help="Prometheus /metrics; 0: off")
    p.add_argument("--health-port", type=int, default=8091, help="liveness /healthz; 0: off")
    p.add_argument("--log-format", choices=["json", "plain"], default="json")
    p.add_argument("--log-level", default=os.environ.get("STRAIT_LOG_LEVEL", "info"))
    a = p.parse_args(argv)
    if not a.namespace and not a.all_namespaces:
        env = os.environ.get("WATCH_NAMESPACE", "")
        a.namespace = [x for x in env.split(",") if x]
        a.all_namespaces = not a.namespace
    return a


async def serve_metrics(port: int) -> web.AppRunner:
    app = web.Application()
    handlers.metrics().telemetry.add_routes(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port, reuse_address=True).start()
    return runner


async def run(a: argparse.Namespace) -> None:
    log.info(
        "operator starting",
        extra={
            "namespaces": "*" if a.all_namespaces else ",".join(a.namespace),
            "version": VERSION,
            "commit": commit(),
        },
    )
    runner = await serve_metrics(a.metrics_port) if a.metrics_port else None
    liveness = f"http://0.0.0.0:{a.health_port}/healthz" if a.health_port else None
    try:
        await kopf.operator(
            standalone=True,  # one replica; no kopf peering CRDs needed
            clusterwide=a.all_namespaces,
            namespaces=a.namespace,
            liveness_endpoint=liveness,
        )
    finally:
        if runner is not None:
            await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    log_format.setup(a.log_format, a.log_level)
    try:
        asyncio.run(run(a))
    except KeyboardInterrupt:
        pass
    except OSError as e:
        print(f"strait-operator: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
