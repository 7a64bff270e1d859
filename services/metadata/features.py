"""Feature levels (KIP-584, KIP-778): what every node supports and what the cluster runs.

A node *supports* a range of levels per feature (the table below, advertised in
ApiVersions and sent with every broker registration); the cluster's *finalized* level
lives in the metadata log as `feature_level` records and only moves when an operator asks
(UpdateFeatures: `kafka-features upgrade`, `strait features upgrade`). Until it moves,
every node writes only what the oldest supported release reads, which is what keeps a
rolling upgrade reversible.

`straitmq.metadata.version` is StraitMQ's own level: the metadata records and on-disk
formats the cluster may write. Level 1 is release 0.1.0's. Level 2 (0.2.0) adds the
`feature_level` records themselves: writing the first one is the point after which
0.1.0 can no longer read the log, so every other feature change waits for it (see
`plan_update`). Level 3 (0.3.0) adds ip entities to client quotas (KIP-612's
connection_creation_rate): 0.2.0 would store them and enforce nothing. A log with no
feature records (made by 0.1.0, or upgraded from it and
never finalized) runs at BASELINE, the levels 0.1.0 ran at, reported truthfully.

Kafka's own features are reported at the levels StraitMQ really implements: tools and
clients read them (Java producers use transactions v2 only when `transaction.version`
is finalized at 2).

This module is sans-IO: the controller gives it the image and what each node supports,
and gets records back or a refusal that says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode

from straitmq.errors import KafkaError

STRAITMQ = "straitmq.metadata.version"
METADATA_VERSION = "metadata.version"

# Kafka's metadata.version numbers: 3.3-IV3 (7) is the oldest Kafka 4 knows; 4.1-IV1 (27)
# the level whose APIs and versions StraitMQ serves.
METADATA_VERSION_MIN = 7
METADATA_VERSION_LATEST = 27


@dataclass(frozen=True, slots=True)
class Feature:
    min_level: int  # the lowest level this code supports
    max_level: int  # the highest
    baseline: int  # the level of a log without feature records (release 0.1.0's)
    # A downgrade may go below the current level without losing data (Kafka's "safe"
    # downgrade). False where a lower level could not read what the higher one wrote.
    downgradable: bool


# What this code supports. A change here is a release note: raising `max_level` is what
# lets a later `upgrade` finalize the new level.
SUPPORTED: dict[str, Feature] = {
    STRAITMQ: Feature(1, 3, 1, downgradable=False),
    METADATA_VERSION: Feature(
        METADATA_VERSION_MIN, METADATA_VERSION_LATEST, METADATA_VERSION_LATEST, False
    ),
    # Voters change at runtime (KIP-853), so the voter set is in the log: level 1.
    "kraft.version": Feature(0, 1, 1, downgradable=False),
    # KIP-848's ConsumerGroupHeartbeat is served: level 1.
    "group.version": Feature(0, 1, 1, downgradable=True),
    # KIP-890 transactions v2 beside v1.
    "transaction.version": Feature(0, 2, 2, downgradable=True),
    "eligible.leader.replicas.version": Feature(0, 0, 0, downgradable=True),
    # KIP-932 share groups at Kafka 4.1's level.
    "share.version": Feature(0, 1, 1, downgradable=True),
    "streams.version": Feature(0, 0, 0, downgradable=True),
}

# Release 0.1.0 sends no supported ranges with its registration: these are what it ran.
# (Literals, not this code's constants: a release's ranges never change.)
RELEASE_0_1_0: dict[str, tuple[int, int]] = {
    STRAITMQ: (1, 1),
    METADATA_VERSION: (7, 27),
    "kraft.version": (0, 1),
    "group.version": (0, 1),
    "transaction.version": (0, 2),
    "eligible.leader.replicas.version": (0, 0),
    "share.version": (0, 1),
    "streams.version": (0, 0),
}

# What each release of releases.toml supports (a release adds its own when it is cut:
# tests/test_releases.py checks each is here), for `strait upgrade plan --to-release`.
RELEASES: dict[str, dict[str, tuple[int, int]]] = {
    "0.1.0": RELEASE_0_1_0,
    "0.2.0": {**RELEASE_0_1_0, STRAITMQ: (1, 2)},  # 0.1.0's Kafka levels
}

BASELINE: dict[str, int] = {name: f.baseline for name, f in SUPPORTED.items()}
# A new cluster starts at the newest level of every feature, as Kafka's does.
LATEST: dict[str, int] = {name: f.max_level for name, f in SUPPORTED.items()}


def levels_at(level: int) -> dict[str, int]:
    """Every feature's level for a new cluster at straitmq.metadata.version `level` (2
    and up: the newest levels of the newest release at that level; one it can join)."""
    if level == LATEST[STRAITMQ]:
        return dict(LATEST)
    for ranges in reversed(RELEASES.values()):
        if ranges[STRAITMQ][1] == level:
            return {name: hi for name, (_, hi) in ranges.items()}
    known = sorted({r[STRAITMQ][1] for r in RELEASES.values()} | {LATEST[STRAITMQ]})
    raise ValueError(f"no release runs at {STRAITMQ}={level} (known: {known})")


UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE = 1, 2, 3


def supported_ranges() -> dict[str, list[int]]:
    """This node's ranges, as a broker registration carries them."""
    return {name: [f.min_level, f.max_level] for name, f in SUPPORTED.items()}


def finalized(explicit: Mapping[str, int]) -> dict[str, int]:
    """The cluster's levels: the baseline with the levels the log finalized on top."""
    return {**BASELINE, **explicit}


def unsupported(
    levels: Mapping[str, int], ranges: Mapping[str, tuple[int, int] | list[int]]
) -> str:
    """Why a node with these supported `ranges` cannot run at `levels` ("" if it can). A
    feature the node does not know is fine at level 0 only."""
    problems = []
    for name, level in sorted(levels.items()):
        lo, hi = ranges.get(name, (0, 0))
        if not lo <= level <= hi:
            known = f"{lo}..{hi}" if name in ranges else "unknown to it"
            problems.append(f"{name}={level} (supported: {known})")
    return ", ".join(problems)


class FeatureRefused(KafkaError):
    """One update cannot be made; `code` is Kafka's error code for it."""

    def __init__(self, feature: str, code: int, message: str) -> None:
        super().__init__(code, message)
        self.feature = feature


INVALID_UPDATE_VERSION = ErrorCode.invalid_update_version


def plan_update(
    explicit: Mapping[str, int],
    updates: Mapping[str, tuple[int, int]],
    nodes: Mapping[str, Mapping[str, tuple[int, int] | list[int]]],
) -> tuple[list[dict], dict[str, FeatureRefused]]:
    """The `feature_level` records for `updates` ({feature: (level, upgrade type)}) on a
    cluster whose log finalized `explicit`, with every node's supported ranges in
    `nodes` ({"broker 3": ranges, "controller 1001": ranges}). All or nothing: any
    refusal means no records. Returns (records, refusals by feature)."""
    current = finalized(explicit)
    refusals: dict[str, FeatureRefused] = {}
    target = dict(current)
    for name, (level, kind) in updates.items():
        try:
            _check_one(name, level, kind, current)
        except FeatureRefused as e:
            refusals[name] = e
            continue
        target[name] = level
    if refusals:
        return [], refusals
    changed = {n: target[n] for n in updates if target[n] != current[n]}
    # The first feature record is what 0.1.0 cannot read: nothing else moves before the
    # cluster has said, on purpose, that it is done with 0.1.0.
    if changed and target[STRAITMQ] < 2:
        return [], {
            n: FeatureRefused(
                n,
                INVALID_UPDATE_VERSION,
                f"cannot finalize {n}={changed[n]} while {STRAITMQ} is 1 (release 0.1.0's "
                f"level, which cannot read feature records): finalize {STRAITMQ}=2 first, "
                "once every node runs 0.2.0 or newer (this ends rollback to 0.1.0)",
            )
            for n in changed
        }
    for node, ranges in sorted(nodes.items()):
        why = unsupported({n: target[n] for n in changed}, ranges)
        if why:
            return [], {
                n: FeatureRefused(
                    n,
                    INVALID_UPDATE_VERSION,
                    f"{node} does not support {why}: upgrade it first "
                    "(a finalized level every node must serve)",
                )
                for n in changed
            }
    return [{"type": "feature_level", "name": n, "level": lvl} for n, lvl in changed.items()], {}


def _check_one(name: str, level: int, kind: int, current: Mapping[str, int]) -> None:
    feature = SUPPORTED.get(name)
    if feature is None:
        raise FeatureRefused(
            name,
            INVALID_UPDATE_VERSION,
            f"unknown feature {name!r}; known: {', '.join(sorted(SUPPORTED))}",
        )
    if kind not in (UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE):
        raise FeatureRefused(name, INVALID_UPDATE_VERSION, f"unknown upgrade type {kind}")
    if level < 0:
        raise FeatureRefused(name, INVALID_UPDATE_VERSION, f"{name}: level {level} is below 0")
    now = current[name]
    if level < now:
        if kind == UPGRADE:
            raise FeatureRefused(
                name,
                INVALID_UPDATE_VERSION,
                f"{name} is finalized at {now}; {level} is a downgrade (use downgrade)",
            )
        if not feature.downgradable:
            raise FeatureRefused(
                name,
                INVALID_UPDATE_VERSION,
                f"{name} cannot be downgraded from {now} to {level}: what was written at "
                f"{now} cannot be read at a lower level (roll back only before finalizing)",
            )
    elif level > now and kind != UPGRADE:
        raise FeatureRefused(
            name, INVALID_UPDATE_VERSION, f"{name}: {level} is above {now}; that is an upgrade"
        )
    if not feature.min_level <= level <= feature.max_level:
        raise FeatureRefused(
            name,
            INVALID_UPDATE_VERSION,
            f"{name}={level} is outside this controller's supported range "
            f"{feature.min_level}..{feature.max_level}",
        )
