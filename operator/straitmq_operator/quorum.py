"""The controller quorum's next change (pure: what is seen in, one step out).

spec.controllers.replicas says how many voters the quorum should have; the voter set in
force is log data (KIP-853) that only AddRaftVoter/RemoveRaftVoter change, one at a time.
Each reconcile pass asks `plan` for the one next step:

- a change pending (appended, not committed): wait;
- a voter whose storage is new (its pod, or the leader's observers, show its id with
  another directory id: the PVC was lost): remove the old (id, directory); the pod is
  then an ordinary missing voter, added back once it has caught up;
- a voter missing below spec.controllers.replicas (scale up, or a replaced one): the
  StatefulSet runs its pod first; add the lowest such ordinal once its pod is Ready and
  has caught up as an observer;
- a voter at or above spec.controllers.replicas (scale down): remove the highest
  non-leader first, the leader (the active controller) last (it hands over), never
  leaving the live voters short of a majority;
- the StatefulSet shrinks only below voters already removed.

Controller pod `<cluster>-controller-<i>` is voter `CONTROLLER_ID_BASE + i`. A voter set
the operator could not have made (an id that is no pod of the StatefulSet, e.g. added
by hand) is left alone: the operator never removes what it does not own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import names as n

# How far behind the leader's log end a controller may be to count as caught up (the
# same bound the restarts use, Observed.lagging_voters).
MAX_LAG = 100

WAIT = "wait"  # nothing to do this pass; `reason` says what for
ADD = "add"
REMOVE = "remove"
IDLE = "idle"  # the voter set is what the spec asks for
UNMANAGED = "unmanaged"  # a voter set the operator did not make: left alone


@dataclass(frozen=True)
class ControllerPod:
    """One controller pod: Ready or not, and its own /api/v1/quorum (None: not asked, or
    it did not answer)."""

    ordinal: int
    ready: bool
    status: dict[str, Any] | None = None

    @property
    def node_id(self) -> int | None:
        return None if self.status is None else self.status.get("node_id")

    @property
    def directory_id(self) -> str | None:
        return None if self.status is None else self.status.get("directory_id")


@dataclass(frozen=True)
class Step:
    """The next step: `action` on voter (`node_id`, `directory_id`) (the pod's ordinal
    for an add), with the StatefulSet's replicas to run now."""

    action: str
    replicas: int
    reason: str
    node_id: int | None = None
    directory_id: str | None = None
    ordinal: int | None = None
    voters: list[dict[str, Any]] = field(default_factory=list)
    # A wait that is part of a change (pending, or due once a pod has caught up).
    waiting_change: bool = False

    @property
    def changing(self) -> bool:
        """The quorum is not yet what the spec asks for (a change made, due or waited
        for): restarts wait, and the status says what is in progress."""
        return self.action in (ADD, REMOVE) or self.waiting_change


def voter_set(quorum: dict[str, Any]) -> list[dict[str, Any]]:
    """[{"id", "directory_id"}] from the admin API's /api/v1/quorum view."""
    return [
        {"id": v["node_id"], "directory_id": v.get("directory_id")}
        for v in quorum.get("voters", [])
    ]


def live_voters(quorum: dict[str, Any], max_lag: int = MAX_LAG) -> set[int]:
    """Voters the leader hears from and that keep up with it."""
    live = set()
    for v in quorum.get("voters", []):
        lag = v.get("lag")
        if v["node_id"] == quorum.get("leader_id") or (
            v.get("reachable") and lag is not None and lag <= max_lag
        ):
            live.add(v["node_id"])
    return live


def _keeps_majority(quorum: dict[str, Any], ids: set[int], removing: int) -> bool:
    new = ids - {removing}
    return len(new & live_voters(quorum)) > len(new) // 2


def _caught_up(quorum: dict[str, Any], pod: ControllerPod, max_lag: int) -> str | None:
    """Why the pod's controller cannot be added yet; None when it can."""
    node = n.CONTROLLER_ID_BASE + pod.ordinal
    if not pod.ready:
        return f"controller pod {pod.ordinal} is not Ready"
    if pod.status is None:
        return f"controller pod {pod.ordinal} does not answer /api/v1/quorum"
    if pod.node_id != node:
        return f"controller pod {pod.ordinal} is node {pod.node_id}, not {node}"
    seen = next((o for o in quorum.get("observers", []) if o.get("node_id") == node), None)
    if seen is None:
        return f"controller {node} is not fetching from the quorum leader yet"
    if pod.directory_id is not None and seen.get("directory_id") not in (None, pod.directory_id):
        return f"controller {node} fetches with another directory id than its pod reports"
    lag = seen.get("lag")
    if lag is None or lag > max_lag:
        return f"controller {node} is catching up ({lag} entries behind the leader)"
    return None


def _new_storage(
    quorum: dict[str, Any], voter: dict[str, Any], pods: dict[int, ControllerPod]
) -> str | None:
    """The directory id the voter's node now has when it is not the voter's (its
    storage was lost and it came back empty); None otherwise."""
    old = voter.get("directory_id")
    if old is None:  # a static voter never pinned: any storage of that id counts
        return None
    pod = pods.get(voter["id"] - n.CONTROLLER_ID_BASE)
    if pod is not None and pod.node_id == voter["id"] and pod.directory_id not in (None, old):
        return pod.directory_id
    for o in quorum.get("observers", []):
        if o.get("node_id") == voter["id"] and o.get("directory_id") not in (None, old):
            return o["directory_id"]
    return None


def wants_pod_status(quorum: dict[str, Any] | None, desired: int) -> bool:
    """Whether the plan needs the controller pods' own quorum status: only while the
    voter set is not the one asked for, or a controller node is seen beside the voters
    (a lost PVC's new storage). Otherwise no pod is asked, pass after pass."""
    if quorum is None:
        return False
    ids = {v["id"] for v in voter_set(quorum)}
    want = {n.CONTROLLER_ID_BASE + i for i in range(desired)}
    beside = any(o.get("node_id") in ids for o in quorum.get("observers", []))
    return ids != want or beside


def plan(
    desired: int,
    sts_replicas: int,
    quorum: dict[str, Any] | None,
    pods: dict[int, ControllerPod],
    max_lag: int = MAX_LAG,
) -> Step:
    """The next step towards `desired` voters on pods 0..desired-1.

    `sts_replicas`: the controller pods the StatefulSet runs now; `quorum`: the admin
    API's /api/v1/quorum (None: unknown); `pods`: the controller pods by ordinal."""
    grow = max(sts_replicas, desired)  # more pods never hurt: they start as observers
    if quorum is None:
        return Step(WAIT, grow, "waiting for the quorum status (admin API unreachable)")
    voters = voter_set(quorum)
    ids = {v["id"] for v in voters}
    ordinals = {v["id"] - n.CONTROLLER_ID_BASE for v in voters}
    foreign = sorted(v["id"] for v in voters if not 0 <= v["id"] - n.CONTROLLER_ID_BASE < grow)
    if foreign:
        return Step(
            UNMANAGED,
            grow,
            f"voters {foreign} are not controller pods of this MQCluster (added by hand?): "
            "the operator leaves the quorum alone",
            voters=voters,
        )
    # Pods that hold voters stay; those above every voter and the spec may go.
    keep = max(desired, max(ordinals, default=-1) + 1)
    if quorum.get("voter_change_pending"):
        return Step(
            WAIT,
            grow,
            "a voter change is pending (not committed yet)",
            voters=voters,
            waiting_change=True,
        )
    for v in sorted(voters, key=lambda v: v["id"]):
        new = _new_storage(quorum, v, pods)
        if new is None:
            continue
        if not _keeps_majority(quorum, ids, v["id"]):
            return Step(
                WAIT,
                grow,
                f"controller {v['id']} is on new storage ({new}), but removing its old "
                "voter would leave the live voters without a majority",
                node_id=v["id"],
                voters=voters,
                waiting_change=True,
            )
        return Step(
            REMOVE,
            grow,
            f"controller {v['id']} came back on new storage ({new}): replacing its voter "
            f"(directory {v['directory_id']})",
            node_id=v["id"],
            directory_id=v["directory_id"],
            voters=voters,
        )
    missing = [i for i in range(desired) if n.CONTROLLER_ID_BASE + i not in ids]
    if missing:
        pod = pods.get(missing[0], ControllerPod(missing[0], False))
        node = n.CONTROLLER_ID_BASE + missing[0]
        why = _caught_up(quorum, pod, max_lag)
        if why is not None:
            return Step(
                WAIT,
                grow,
                f"adding controller {node}: {why}",
                node_id=node,
                voters=voters,
                waiting_change=True,
            )
        return Step(
            ADD,
            grow,
            f"adding controller {node} (caught up as an observer)",
            node_id=node,
            directory_id=pod.directory_id,
            ordinal=missing[0],
            voters=voters,
        )
    extra = [v for v in voters if v["id"] - n.CONTROLLER_ID_BASE >= desired]
    if extra:
        leader = quorum.get("leader_id")
        v = sorted(extra, key=lambda v: (v["id"] == leader, -v["id"]))[0]
        if not _keeps_majority(quorum, ids, v["id"]):
            return Step(
                WAIT,
                keep,
                f"removing controller {v['id']} would leave the live voters "
                f"{sorted(live_voters(quorum) & (ids - {v['id']}))} without a majority of "
                f"{len(ids) - 1}",
                node_id=v["id"],
                voters=voters,
                waiting_change=True,
            )
        last = " (the active controller: it hands over)" if v["id"] == leader else ""
        return Step(
            REMOVE,
            keep,
            f"removing controller {v['id']}{last}",
            node_id=v["id"],
            directory_id=v.get("directory_id"),
            voters=voters,
        )
    return Step(IDLE, keep, f"{len(voters)} voters, as asked", voters=voters)
