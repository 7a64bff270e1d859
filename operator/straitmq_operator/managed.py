"""The topics and users the operator made for Topic and User resources, and their removal.

Why Topics and Users carry no finalizer: a finalizer only comes off when the operator
runs. With the operator scaled to zero (or its namespace deleted first), or the
MQCluster deleted first, a namespace holding Topics or Users would stay Terminating for
ever, and Strimzi's topic operator has this very problem (its docs tell users to strip
the finalizers by hand). Kubernetes' own garbage collection cannot do the cleanup either:
deleting a topic or a SCRAM credential happens in the cluster, not in the API server.

So the cleanup does not hang on the resource's deletion. Before it makes a topic or a
user, the operator records it in a ConfigMap `<cluster>-managed` that the MQCluster owns
(`topic.<name>` / `user.<name>`). Each MQCluster pass (woken at once by a Topic's or a
User's deletion) removes from the cluster whatever the record holds and no Topic or
User claims any more, then drops the entry. A deletion the operator did not see (it was
not running) is done at its first pass after it starts; a deleted MQCluster takes the
record, its topics and its users with it; a deleted namespace takes everything, and no
step of that waits on the operator.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from . import names as n
from .admin import AdminClient
from .kube import Kube

log = logging.getLogger("straitmq.operator.managed")

TOPIC = "topic"
USER = "user"
TLS = "tls"
SCRAM = "scram"


def key(kind: str, name: str) -> str:
    """A ConfigMap key: topic and user names fit its alphabet ([-._a-zA-Z0-9])."""
    return f"{kind}.{name}"


def topic_name(body: dict[str, Any]) -> str:
    return (body.get("spec") or {}).get("topicName") or body["metadata"]["name"]


def claimed(cluster: str, topics: Iterable[dict], users: Iterable[dict]) -> set[str]:
    """The record keys that live Topic and User resources of `cluster` claim."""
    out: set[str] = set()
    for kind, bodies in ((TOPIC, topics), (USER, users)):
        for b in bodies:
            if b["metadata"].get("deletionTimestamp"):
                continue
            if (b.get("spec") or {}).get("cluster") != cluster:
                continue
            out.add(key(kind, topic_name(b) if kind == TOPIC else b["metadata"]["name"]))
    return out


def stale(record: dict[str, str], cluster: str, topics: list[dict], users: list[dict]) -> list[str]:
    """Keys of the record no resource claims: what to remove from the cluster.

    The record must have been read before the resources were listed: an entry is only
    written by a pass over a resource that existed, so it is then in the listing too."""
    live = claimed(cluster, topics, users)
    return sorted(k for k in record if k not in live and k.partition(".")[0] in (TOPIC, USER))


def config_map(cluster_body: dict[str, Any], data: dict[str, str]) -> dict[str, Any]:
    meta = cluster_body["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": n.managed_config_map(meta["name"]),
            "namespace": meta.get("namespace") or "default",
            "labels": n.labels(meta["name"]),
            # Garbage-collected with the MQCluster (whose topics and users go with it).
            "ownerReferences": [
                {
                    "apiVersion": n.API_VERSION,
                    "kind": "MQCluster",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "data": data,
    }


async def record(
    kube: Kube, cluster_body: dict[str, Any], kind: str, name: str, value: str
) -> None:
    """Note `name` in the cluster's record (before it is made there)."""
    meta = cluster_body["metadata"]
    ns = meta.get("namespace") or "default"
    cm_name = n.managed_config_map(meta["name"])
    entry = {key(kind, name): value}
    cm = await kube.get("v1", "ConfigMap", ns, cm_name)
    if cm is not None and (cm.get("data") or {}).get(key(kind, name)) == value:
        return
    if cm is not None and await kube.patch_config_map_data(ns, cm_name, dict(entry)):
        return
    if not await kube.create_config_map(config_map(cluster_body, entry)):
        await kube.patch_config_map_data(ns, cm_name, dict(entry))  # made meanwhile


async def remove_topic(admin: AdminClient, name: str) -> bool:
    """False if it was already gone."""
    return await admin.delete_topic(name)


async def remove_user(admin: AdminClient, name: str, tls: bool) -> tuple[bool, int]:
    """The user's credentials, every ACL binding of its principal and its own client
    quotas; returns whether it had a credential and how many bindings went."""
    principal = f"User:CN={name}" if tls else f"User:{name}"
    had = await admin.delete_user(name)
    doomed = await admin.acls(principal)
    if doomed:
        await admin.alter_acls([], doomed)
    user = principal.removeprefix("User:")
    quotas = await admin.user_quotas(user)
    if quotas:
        await admin.alter_user_quotas(user, dict.fromkeys(quotas))
    return had, len(doomed)


async def sweep(
    kube: Kube,
    admin: AdminClient,
    cluster_body: dict[str, Any],
    emit: Callable[[str, str, str], None],
) -> list[str]:
    """Remove from the cluster what the record holds and no resource claims; returns the
    keys removed. Admin errors propagate: the entry stays for the next pass."""
    meta = cluster_body["metadata"]
    ns = meta.get("namespace") or "default"
    cm_name = n.managed_config_map(meta["name"])
    cm = await kube.get("v1", "ConfigMap", ns, cm_name)
    data: dict[str, str] = (cm or {}).get("data") or {}
    if not data:
        return []
    topics = await kube.list_custom(n.TOPICS, ns)
    users = await kube.list_custom(n.USERS, ns)
    done = []
    for k in stale(data, meta["name"], topics, users):
        kind, _, name = k.partition(".")
        if kind == TOPIC:
            gone = await remove_topic(admin, name)
            what = f"deleted topic '{name}'" if gone else f"topic '{name}' already gone"
        else:
            had, acls = await remove_user(admin, name, data[k] == TLS)
            what = (
                f"user '{name}': credential {'deleted' if had else 'already gone'}, "
                f"{acls} ACL bindings removed"
            )
        await kube.patch_config_map_data(ns, cm_name, {k: None})
        emit("Normal", "Deleted", f"{what} (its {kind.capitalize()} resource is gone)")
        log.info("removed", extra={"key": k, "cluster": meta["name"], "namespace": ns})
        done.append(k)
    return done
