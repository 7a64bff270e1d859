"""The data of one KIP-848 consumer group (ConsumerGroupHeartbeat protocol) and the
reconciliation of a member toward its target assignment, as Kafka's ConsumerGroup,
ConsumerGroupMember and CurrentAssignmentBuilder define them.

Epochs: the group epoch moves on every change of membership, subscriptions or the
subscribed topics' partitions; the assignment epoch is the group epoch the target
assignment was computed for; a member's epoch is the assignment epoch it has reached.
A member gives up partitions before anyone gets them: it stays in its epoch while it
revokes (UNREVOKED_PARTITIONS), and a partition another member still holds is not
handed out until released (UNRELEASED_PARTITIONS). Plain data and pure functions.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from .assignors import TopicPartition
from .classic_group import Protocols

STABLE_MEMBER = "stable"
UNREVOKED = "unrevoked_partitions"
UNRELEASED = "unreleased_partitions"

LEAVE_EPOCH = -1  # the member leaves
STATIC_LEAVE_EPOCH = -2  # a static member leaves for now and keeps its place


@dataclass(frozen=True, slots=True)
class ClassicInfo:
    """A member that speaks the classic protocol (JoinGroup/SyncGroup/Heartbeat) inside
    a KIP-848 group, as during an online upgrade: its session timeout and the protocols
    it joined with (their metadata is its ConsumerProtocolSubscription)."""

    session_timeout_ms: int
    protocols: Protocols

    @property
    def protocol_name(self) -> str:
        return self.protocols[0][0]


@dataclass(slots=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    subscribed: frozenset[str] = frozenset()
    assignor: str | None = None
    subscribed_regex: str | None = None  # ConsumerGroupHeartbeat v1 (RE2 syntax)
    epoch: int = 0
    previous_epoch: int = 0
    state: str = STABLE_MEMBER
    assigned: frozenset[TopicPartition] = frozenset()
    pending_revocation: frozenset[TopicPartition] = frozenset()
    last_sent: frozenset[TopicPartition] | None = None  # the assignment it was last told
    classic: ClassicInfo | None = None  # it joined with JoinGroup, not the heartbeat

    def held(self) -> frozenset[TopicPartition]:
        """What it may still consume: assigned, and what it has yet to give up."""
        return self.assigned | self.pending_revocation


@dataclass(slots=True)
class ConsumerGroup:
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    target: dict[str, frozenset[TopicPartition]] = field(default_factory=dict)
    # The subscribed topics as last seen: name -> (topic id, partition count).
    topics: dict[str, tuple[uuid.UUID, int]] = field(default_factory=dict)
    # The members' regular expressions and the topic names each matched at the last refresh.
    regex_matches: dict[str, frozenset[str]] = field(default_factory=dict)

    def subscribed_names(self, member: ConsumerMember) -> frozenset[str]:
        """Its topic names and what its regular expression matches."""
        if member.subscribed_regex is None:
            return member.subscribed
        return member.subscribed | self.regex_matches.get(member.subscribed_regex, frozenset())

    @property
    def state(self) -> str:
        if not self.members:
            return "Empty"
        if self.assignment_epoch < self.epoch:
            return "Assigning"
        if any(
            m.epoch != self.assignment_epoch or m.state != STABLE_MEMBER
            for m in self.members.values()
        ):
            return "Reconciling"
        return "Stable"

    def owner_of(self) -> dict[TopicPartition, str]:
        return {tp: m.member_id for m in self.members.values() for tp in m.held()}

    def remove(self, member_id: str) -> ConsumerMember | None:
        m = self.members.pop(member_id, None)
        if m is not None and m.instance_id is not None:
            if self.static.get(m.instance_id) == member_id:
                del self.static[m.instance_id]
        self.target.pop(member_id, None)
        return m


def reconcile(
    member: ConsumerMember,
    assignment_epoch: int,
    target: frozenset[TopicPartition],
    owners: dict[TopicPartition, str],
    owned: frozenset[TopicPartition] | None,
) -> None:
    """Move the member one step toward `target` (Kafka's CurrentAssignmentBuilder).

    `owned` is what the member reported owning in this heartbeat (None: unchanged)."""
    if member.state == UNREVOKED:
        if owned is None or owned & member.pending_revocation:
            return  # still revoking
        member.pending_revocation = frozenset()
    elif member.state == STABLE_MEMBER and member.epoch == assignment_epoch:
        return
    kept = member.assigned & target
    revoke = member.assigned - target
    if revoke and (owned is None or owned & revoke):
        # Give up first, in the current epoch; nothing new until it has. (A member that
        # says it no longer holds them, as a classic member rejoining, has given them up.)
        member.state = UNREVOKED
        member.assigned = kept
        member.pending_revocation = revoke
        return
    wanted = target - member.assigned
    free = frozenset(tp for tp in wanted if owners.get(tp, member.member_id) == member.member_id)
    if member.epoch != assignment_epoch:
        member.previous_epoch, member.epoch = member.epoch, assignment_epoch
    member.assigned = kept | free
    member.state = UNRELEASED if wanted - free else STABLE_MEMBER
