"""Node ids for processes run as StatefulSet pods, where every pod gets the same args.

A broker pod named `<cluster>-broker-3` is broker 3: its ordinal. A controller pod finds
itself among the voters by its host name, the first label of its voter's DNS name
(`1001@demo-controller-1.demo-controller.ns.svc:9093` is pod `demo-controller-1`).
"""

from __future__ import annotations

import re
import socket
from urllib.parse import urlsplit

_ORDINAL = re.compile(r"-(\d+)$")


def ordinal_from_hostname(hostname: str | None = None) -> int:
    name = hostname if hostname is not None else socket.gethostname()
    m = _ORDINAL.search(name.split(".", 1)[0])
    if m is None:
        raise ValueError(
            f"host name '{name}' does not end in -<ordinal>; --node-id auto needs a "
            "StatefulSet pod name (or give the id as a number)"
        )
    return int(m.group(1))


def voter_for_hostname(voters: dict[int, str], hostname: str | None = None) -> int:
    """The id of the voter whose address starts with this host's name."""
    name = (hostname if hostname is not None else socket.gethostname()).split(".", 1)[0]
    found = [
        node for node, url in voters.items() if (urlsplit(url).hostname or "").split(".")[0] == name
    ]
    if len(found) != 1:
        raise ValueError(
            f"host name '{name}' matches {len(found)} of the voters "
            f"{sorted(voters)}; --node-id auto needs exactly one"
        )
    return found[0]
