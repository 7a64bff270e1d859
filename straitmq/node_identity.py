"""Node ids for processes run as StatefulSet pods, where every pod gets the same args.

A broker pod named `<cluster>-broker-3` is broker 3: its ordinal. A controller pod finds
itself among the voters by its host name, the first label of its voter's DNS name
(`1001@demo-controller-1.demo-controller.ns.svc:9093` is pod `demo-controller-1`). A pod
of the same StatefulSet beyond the --voters (the quorum grown after the cluster was made)
takes the id the voters' numbering gives its ordinal: with voters 1000..1002 on pods 0..2,
pod `demo-controller-4` is 1004, and joins as an observer until it is added as a voter.
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
    hosts = {node: (urlsplit(url).hostname or "").split(".")[0] for node, url in voters.items()}
    found = [node for node, host in hosts.items() if host == name]
    if not found:
        beyond = _beyond_voters(hosts, name)
        if beyond is not None:
            return beyond
    if len(found) != 1:
        raise ValueError(
            f"host name '{name}' matches {len(found)} of the voters "
            f"{sorted(voters)}; --node-id auto needs exactly one"
        )
    return found[0]


def _beyond_voters(hosts: dict[int, str], name: str) -> int | None:
    """The id of pod `name` when the voters are pods of its StatefulSet numbered
    id = base + ordinal (one base for all); None when they are not."""
    m = _ORDINAL.search(name)
    if m is None:
        return None
    prefix = name[: m.start()]
    bases = set()
    for node, host in hosts.items():
        hm = _ORDINAL.search(host)
        if hm is None or host[: hm.start()] != prefix:
            return None
        bases.add(node - int(hm.group(1)))
    if len(bases) != 1:
        return None
    return bases.pop() + int(m.group(1))
