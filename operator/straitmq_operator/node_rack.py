"""A broker pod's init step: read the pod's Node and write its rack label to a file.

Kafka's `broker.rack` is where the broker runs, which on Kubernetes is a label of the
Node the pod landed on (e.g. `topology.kubernetes.io/zone`). The downward API cannot
expose Node labels, so, as Strimzi does, an init container asks the API server with the
pod's service account (bound to a ClusterRole that may only `get nodes`) and leaves the
value in an emptyDir that the broker reads with `--rack-file`.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


class RackError(Exception):
    """The rack cannot be found; the message says why and what to fix."""


def node_label(node: str, label: str, api: Any = None) -> str:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    from .kube import api_client

    try:
        core = client.CoreV1Api(api or api_client())
    except config.ConfigException as e:
        raise RackError(f"no Kubernetes API credentials (not in a pod, no kubeconfig): {e}") from e
    try:
        obj = core.read_node(node)
    except ApiException as e:
        if e.status == 403:
            raise RackError(
                f"not allowed to get node {node}: the pod's service account needs the "
                "operator's node-reader ClusterRole (the operator binds it when "
                "brokers.rack.topologyKey is set)"
            ) from None
        if e.status == 404:
            raise RackError(f"node {node} does not exist") from None
        if e.status in (429,) or (e.status or 0) >= 500:
            raise  # the API server is busy or restarting: worth another try
        raise RackError(f"reading node {node}: HTTP {e.status} {e.reason}") from None
    value = ((obj.metadata.labels if obj.metadata else None) or {}).get(label)
    if not value:
        raise RackError(
            f"node {node} has no label {label!r}: label the node, or change "
            "brokers.rack.topologyKey"
        )
    return value


def write_rack(node: str, label: str, out: Path, attempts: int = 30, delay_s: float = 2.0) -> str:
    """Write the rack to `out` (atomically); retry while the API server is unreachable."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    for attempt in range(1, attempts + 1):
        try:
            rack = node_label(node, label)
            break
        except (ApiException, HTTPError, OSError) as e:  # unreachable or busy: wait, bounded
            if attempt == attempts:
                raise RackError(f"could not read node {node}: {type(e).__name__}: {e}") from e
            time.sleep(delay_s)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(rack + "\n")
    os.replace(tmp, out)
    return rack
