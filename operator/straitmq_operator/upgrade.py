"""A version roll's next step (pure: the pods and the cluster's health in, one step out).

When an MQCluster's image changes (spec.version or spec.image: an upgrade or a rollback),
`plan` decides, each pass, the one next thing to do, as README "Upgrading" says to do it
by hand:

- an upgrade: the controllers one at a time, the followers first and the active
  controller last, each caught up with the quorum before the next; then the brokers one
  at a time, each registered again (a new incarnation) and the cluster without
  under-replicated or under-min-ISR partitions before the next, and only a broker whose
  restart cannot take a partition below min ISR;
- a rollback (a lower version than the pods run): the same, brokers first, then the
  controllers (the reverse order, as the hand procedure and tests/test_upgrades.py do);
- a pod still on the old image that is out of service anyway (not Ready, not caught
  up, not registered) goes first, whatever the order: restarting it costs nothing, and
  a rollback must be able to replace the pod that failed;
- a restarted pod counts as back once it has been in service for `min_ready_s`;
- a step that does not finish within `step_timeout_s` (the pod not back, or the cluster
  not healthy enough for the next restart) pauses the roll: nothing more is restarted
  until the spec changes (the generation moves: setting the old version back is a
  rollback, rolled the same way). Never a retry loop.

The state between passes is status.version (`from`, `to`, `image`, `phase`, `progress`,
`since`: when the current wait began, `step`: the pod restarted last, `pausedGeneration`),
so a restarted operator continues where the last one stopped.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from straitmq.metadata import client_impact

from . import names as n

ROLLING, PAUSED, DONE = "Rolling", "Paused", "Done"

# Plan actions
NONE = "none"  # no version roll: the pods run the spec's image
RESTART = "restart"  # delete `pod` (the StatefulSet brings it back on the new image)
WAIT = "wait"  # a step in progress, or the cluster not ready for the next one
PAUSE = "pause"  # a step failed this pass: say so (condition, Event) and stop
HOLD = "hold"  # paused earlier, same generation: nothing moves


@dataclass(frozen=True)
class Pod:
    """A broker or controller pod as the roll sees it."""

    name: str
    component: str  # names.CONTROLLER | names.BROKER
    ordinal: int
    image: str | None  # its main container's image
    ready: bool  # the pod's Ready condition
    deleting: bool = False

    @property
    def node_id(self) -> int:
        base = n.CONTROLLER_ID_BASE if self.component == n.CONTROLLER else 0
        return base + self.ordinal


@dataclass(frozen=True)
class Health:
    """What the cluster's admin API said this pass (reachable False: nothing else is known)."""

    reachable: bool
    error: str | None = None
    active_controller: int | None = None
    voters: frozenset[int] = frozenset()  # the voter set's node ids
    caught_up: frozenset[int] = frozenset()  # voters reachable and within the lag bound
    # Registered, unfenced, not shutting down: broker id -> its registration's incarnation.
    live_brokers: dict[int, str | None] = field(default_factory=dict)
    under_replicated: int = 0
    under_min_isr: int = 0
    # Brokers whose restart would take a partition below min ISR: id -> the topic.
    unsafe_brokers: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Settings:
    step_timeout_s: float = 300.0
    min_ready_s: float = 10.0


@dataclass
class Plan:
    action: str
    reason: str = ""  # CamelCase, for a condition or an Event
    message: str = ""
    pod: str | None = None
    status: dict[str, Any] | None = None  # the new status.version (None: leave it)

    @property
    def rolling(self) -> bool:
        """A version roll is under way or paused: the ordinary roll keeps out."""
        return self.action in (RESTART, WAIT, PAUSE, HOLD)


def version_of(image: str) -> str:
    """The version an image names: its tag (`repo:0.2.0` -> 0.2.0), else the image."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else image


def image_for(version: str, repository: str) -> str:
    return f"{repository}:{version}"


_NUMBERS = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(.*)$")


def _key(version: str | None) -> tuple[int, int, int, int, str] | None:
    """A sortable key for x.y.z[suffix]; a pre-release (0.2.0.dev0, 0.2.0rc1) sorts
    before its release. None: not a version (a tag like `dev`)."""
    m = _NUMBERS.match(version or "")
    if not m:
        return None
    rest = m.group(4).lstrip(".-+")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), 0 if rest else 1, rest)


def is_downgrade(old: str | None, new: str | None) -> bool:
    a, b = _key(old), _key(new)
    return a is not None and b is not None and b < a


def _ts(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def progress(pods: list[Pod], image: str) -> str:
    done = Counter(p.component for p in pods if p.image == image and not p.deleting)
    total = Counter(p.component for p in pods)
    return (
        f"controllers {done[n.CONTROLLER]}/{total[n.CONTROLLER]}, "
        f"brokers {done[n.BROKER]}/{total[n.BROKER]}"
    )


def in_service(pod: Pod, health: Health) -> bool:
    """Ready, and doing its job as the cluster sees it: a voter caught up with the
    quorum (a controller pod that is no voter only needs to be Ready), a broker
    registered and unfenced."""
    if not pod.ready or pod.deleting or not health.reachable:
        return False
    if pod.component == n.CONTROLLER:
        return pod.node_id not in health.voters or pod.node_id in health.caught_up
    return pod.node_id in health.live_brokers


def _order(todo: list[Pod], health: Health, downgrade: bool) -> list[Pod]:
    """Controllers (followers first, highest ordinal first, the active one last), then
    brokers (highest ordinal first); brokers first for a rollback."""
    rank = {n.CONTROLLER: 1 if downgrade else 0, n.BROKER: 0 if downgrade else 1}
    return sorted(
        todo,
        key=lambda p: (
            rank[p.component],
            p.component == n.CONTROLLER and p.node_id == health.active_controller,
            -p.ordinal,
        ),
    )


def plan(
    image: str,
    version: str,
    pods: list[Pod],
    health: Health,
    prev: dict[str, Any] | None,
    generation: int | None,
    now: float,
    settings: Settings,
    expected: int | None = None,
) -> Plan:
    """The next step of the roll onto `image` (reported as `version`). `prev`: the last
    status.version; `expected`: how many pods the StatefulSets run (fewer listed: some
    are being recreated)."""
    prev = prev or {}
    same_roll = prev.get("image") == image
    live = [p for p in pods if not p.deleting]
    todo = [p for p in live if p.image != image]
    base = {
        "from": prev.get("from") if same_roll else prev.get("to"),
        "to": version,
        "image": image,
        "progress": progress(pods, image),
        "step": prev.get("step") if same_roll else None,
        "pausedGeneration": None,
    }

    def done() -> Plan:
        # Every pod runs the image: Done (since when: for finalizing after a while).
        done_since = prev.get("since") if same_roll and prev.get("phase") == DONE else None
        status = {**base, "phase": DONE, "since": done_since or iso(now), "step": None}
        status["from"] = status["from"] or version
        return Plan(NONE, status=status)

    if not todo and not (same_roll and prev.get("phase") == ROLLING and prev.get("step")):
        return done()  # (a roll of another kind, if any, is the ordinary roll's)
    if same_roll and prev.get("phase") == PAUSED and prev.get("pausedGeneration") == generation:
        status = {**prev, "progress": base["progress"]}
        return Plan(HOLD, "UpgradePaused", prev.get("message") or "paused", status=status)
    if base["from"] is None:  # the first roll this operator sees: name what the pods run
        images = Counter(p.image for p in todo if p.image)
        base["from"] = version_of(images.most_common(1)[0][0]) if images else None
    if not same_roll or prev.get("phase") in (PAUSED, DONE, None):
        # A new roll, or one resumed by a new spec: the clock starts now.
        since = now
    else:
        since = _ts(prev.get("since")) or now
    status = {**base, "phase": ROLLING, "since": iso(since)}
    downgrade = is_downgrade(base["from"], version)

    def wait(reason: str, message: str) -> Plan:
        if now - since > settings.step_timeout_s:
            paused = {
                **status,
                "phase": PAUSED,
                "pausedGeneration": generation,
                "message": f"{message} for more than {settings.step_timeout_s:g}s",
            }
            return Plan(PAUSE, reason, paused["message"], status=paused)
        return Plan(WAIT, reason, message, status={**status, "message": message})

    if not health.reachable:
        return wait("AdminUnreachable", f"waiting for the admin API: {health.error}")
    by_name = {p.name: p for p in pods}
    step = status.get("step") or {}
    last = by_name.get(step.get("pod", ""))
    if step:
        # The pod restarted last: back (its new process in service) for min_ready_s?
        back = last is not None and last.image == image and in_service(last, health)
        if back and last is not None and last.component == n.BROKER and step.get("incarnation"):
            back = health.live_brokers.get(last.node_id) != step.get("incarnation")
        if not back:
            status["step"] = {**step, "backSince": None}
            return wait("PodNotInService", f"waiting for {step['pod']} to be back in service")
        back_since = _ts(step.get("backSince"))
        if back_since is None:
            status["step"] = {**step, "backSince": iso(now)}
            return wait("PodSettling", f"{step['pod']} is back; waiting {settings.min_ready_s:g}s")
        if now - back_since < settings.min_ready_s:
            return wait("PodSettling", f"{step['pod']} is back; waiting {settings.min_ready_s:g}s")
    if not todo:
        return done()
    # The next pod. One already out of service goes first: restarting it costs nothing.
    ordered = _order(todo, health, downgrade)
    victim = next((p for p in ordered if not in_service(p, health)), None)
    if victim is None:
        if len(live) < len(pods) or (expected is not None and len(pods) < expected):
            return wait("PodsMissing", "waiting for every pod to exist")
        out = [p.name for p in live if not in_service(p, health)]
        if out:
            return wait("PodNotInService", f"waiting for {out} to be in service")
        lagging = sorted(health.voters - health.caught_up)
        if lagging:
            return wait("VotersLagging", f"waiting: voters {lagging} behind the leader")
        if health.under_min_isr:
            return wait("UnderMinIsr", f"{health.under_min_isr} partitions under min ISR")
        if health.under_replicated:
            return wait("UnderReplicated", f"{health.under_replicated} partitions under-replicated")
        for p in ordered:
            if p.component == n.BROKER and p.node_id in health.unsafe_brokers:
                continue
            victim = p
            break
        if victim is None:
            first = ordered[0]
            return wait(
                "MinIsr",
                f"restarting broker {first.ordinal} would take topic "
                f"'{health.unsafe_brokers.get(first.node_id)}' below min.insync.replicas",
            )
    record: dict[str, Any] = {"pod": victim.name, "at": iso(now), "backSince": None}
    if victim.component == n.BROKER:
        record["incarnation"] = health.live_brokers.get(victim.node_id)
    status = {**status, "step": record, "since": iso(now)}
    todo_left = len(todo) - 1
    direction = "rolling back" if downgrade else "upgrading"
    role = ""
    if victim.component == n.CONTROLLER and health.active_controller is not None:
        # Said, so that the order can be checked against the leader the operator saw.
        leader = health.active_controller
        is_leader = victim.node_id == leader
        role = " (the active controller)" if is_leader else f" (a follower of {leader})"
    msg = f"{direction} {victim.name}{role} to {version}; {todo_left} to go"
    return Plan(RESTART, "VersionRoll", msg, victim.name, {**status, "message": msg})


# Every key of status.version and of its step, always written: the status is
# merge-patched, so a key left out would keep its last value (None deletes it).
STATUS_KEYS: tuple[str, ...] = ("from", "to", "image", "phase", "progress", "since")
STATUS_KEYS += ("message", "step", "pausedGeneration", "finalizeError")
STEP_KEYS = ("pod", "at", "backSince", "incarnation")


def complete(status: dict[str, Any]) -> dict[str, Any]:
    out = {k: status.get(k) for k in STATUS_KEYS}
    if isinstance(out["step"], dict):
        out["step"] = {k: out["step"].get(k) for k in STEP_KEYS}
    return out


def finalize_due(mode: str, status: dict[str, Any] | None, now: float, after_s: float) -> bool:
    """spec.upgrade.finalizeFeatures auto: every pod has run the new image for `after_s`."""
    if mode != "auto" or not status or status.get("phase") != DONE:
        return False
    since = _ts(status.get("since"))
    return since is not None and now - since >= after_s


def levels_to_finalize(features: dict[str, Any] | None) -> dict[str, int]:
    """GET /api/v1/features -> the straitmq.metadata.version update to ask for, if the
    answering node supports more than is finalized ({} otherwise)."""
    for f in (features or {}).get("features", []):
        if f.get("name") == "straitmq.metadata.version":
            top, now = f.get("supported_max"), f.get("finalized")
            if isinstance(top, int) and isinstance(now, int) and top > now:
                return {"straitmq.metadata.version": top}
    return {}


def finalized(features: dict[str, Any] | None) -> dict[str, int] | None:
    """status.features: each feature's finalized level."""
    if not features:
        return None
    return {
        f["name"]: f["finalized"]
        for f in features.get("features", [])
        if isinstance(f.get("finalized"), int)
    }


def finalize_impact(
    features: dict[str, Any] | None,
    views: dict[int, list[dict[str, Any]]],
    missing: list[str],
) -> tuple[bool, str, str]:
    """The FinalizeAffectsClients condition (status, reason, message): what finalizing
    the levels the cluster could finalize now would do to the clients the brokers have
    seen (`views`: each broker's GET /api/v1/clients; `missing`: brokers not asked)."""
    updates = levels_to_finalize(features)
    if not updates:
        return False, "NothingToFinalize", "every level is finalized as high as the nodes allow"
    clients = [c for c in client_impact.merge(views) if "broker" not in c["roles"]]
    result = client_impact.plan(clients, finalized(features) or {}, updates)
    change = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in result.changes.items())
    said = result.affected or result.findings
    msg = f"finalizing {change}: " + "; ".join(f.sentence for f in said)
    if missing:
        msg += f" (not in this report: {'; '.join(missing)})"
    if result.affected:
        return True, "ClientsAffected", msg
    return False, "NoClientAffected", msg
