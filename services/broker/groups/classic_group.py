"""The data of one classic consumer group (JoinGroup/SyncGroup protocol) and the queries
on it that Kafka's ClassicGroup answers: who is awaiting a join, which protocols every
member supports, who leads, which protocol the members vote for.

Plain data, no I/O and no decisions about time: `state_machine.py` drives it. A member's
parked JoinGroup or SyncGroup is represented by the shell's handle for that request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from straitmq.invariants import broken

EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"

Protocols = tuple[tuple[str, bytes], ...]  # (name, metadata) in the member's preference order


@dataclass(slots=True)
class ClassicMember:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    assignment: bytes = b""
    join_handle: int | None = None  # a JoinGroup parked until the join phase completes
    sync_handle: int | None = None  # a SyncGroup parked until the leader's assignment
    # Joined during the current rebalance and not yet given a generation: it cannot
    # heartbeat, so its join has its own (longer) timeout instead of the session (KIP-394).
    is_new: bool = False

    @property
    def awaiting_join(self) -> bool:
        return self.join_handle is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_handle is not None

    def has_satisfied_heartbeat(self) -> bool:
        """Whether its session timer may fire without removing it: a member parked in a
        rebalance cannot heartbeat, so the parked request stands in for heartbeats (a new
        member excepted, its join timeout governs it)."""
        if self.is_new:
            return False
        return self.awaiting_join or self.awaiting_sync

    def metadata_for(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def vote(self, candidates: set[str]) -> str:
        """Its most preferred protocol among those every member supports."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        broken(
            "a member votes for a protocol it supports",
            member=self.member_id,
            candidates=sorted(candidates),
        )


@dataclass(slots=True)
class ClassicGroup:
    group_id: str
    state: str = EMPTY
    previous_state: str = DEAD
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, ClassicMember] = field(default_factory=dict)  # in join order
    static: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    # Member ids handed out with MEMBER_ID_REQUIRED whose second JoinGroup is awaited.
    pending_join: set[str] = field(default_factory=set)
    # Members given this generation's JoinGroup answer that have not sent SyncGroup yet.
    pending_sync: set[str] = field(default_factory=set)
    # The first rebalance of an empty group waits for more members (initial rebalance
    # delay): (this delay, what is left of the rebalance timeout) while it does.
    initial_delay: tuple[int, int] | None = None
    new_member_added: bool = False

    def transition(self, state: str) -> None:
        self.previous_state, self.state = self.state, state

    # -- membership ---------------------------------------------------------------------

    def add(self, member: ClassicMember) -> None:
        if member.instance_id is not None:
            if member.instance_id in self.static:
                broken(
                    "one member per group.instance.id",
                    group=self.group_id,
                    instance=member.instance_id,
                    member=self.static[member.instance_id],
                    new=member.member_id,
                )
            self.static[member.instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.pending_join.discard(member.member_id)

    def remove(self, member_id: str) -> ClassicMember | None:
        member = self.members.pop(member_id, None)
        if member is not None and member.instance_id is not None:
            self.static.pop(member.instance_id, None)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_join.discard(member_id)
        self.pending_sync.discard(member_id)
        return member

    def replace_static(self, instance_id: str, old_id: str, new_id: str) -> ClassicMember:
        """The same instance came back with a new member id: it takes the old member's
        place (and assignment); the caller fences the old id's parked requests."""
        member = self.members.pop(old_id)
        member.member_id = new_id
        member.is_new = False  # Kafka builds a fresh member object here
        self.members[new_id] = member
        if self.leader_id == old_id:
            self.leader_id = new_id
        self.static[instance_id] = new_id
        self.pending_sync.discard(old_id)
        return member

    def validate_member(self, member_id: str, instance_id: str | None) -> int:
        """Kafka's validateMember: an instance id must map to this member id (else the
        caller is an older incarnation: FENCED_INSTANCE_ID), and the member must exist."""
        if instance_id is not None:
            current = self.static.get(instance_id)
            if current is None:
                return ErrorCode.unknown_member_id
            if current != member_id:
                return ErrorCode.fenced_instance_id
        if member_id not in self.members:
            return ErrorCode.unknown_member_id
        return ErrorCode.none

    # -- queries ----------------------------------------------------------------------

    def awaiting_join_count(self) -> int:
        return sum(m.awaiting_join for m in self.members.values())

    def has_all_members_joined(self) -> bool:
        return all(m.awaiting_join for m in self.members.values()) and not self.pending_join

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def supports_protocols(self, protocol_type: str, names: set[str]) -> bool:
        """Kafka's rule: an empty group takes any non-empty protocol list; otherwise the
        type must match and one of the protocols must be supported by every current
        member (a rejoining member counts with the protocols it had)."""
        if self.state == EMPTY:
            return bool(protocol_type) and bool(names)
        if protocol_type != self.protocol_type:
            return False
        return any(
            all(name in {n for n, _ in m.protocols} for m in self.members.values())
            for name in names
        )

    def select_protocol(self) -> str:
        candidates: set[str] | None = None
        for m in self.members.values():
            names = {n for n, _ in m.protocols}
            candidates = names if candidates is None else candidates & names
        if not candidates:
            broken("the members of a group share a protocol", group=self.group_id)
        votes: dict[str, int] = {}
        for m in self.members.values():
            name = m.vote(candidates)
            votes[name] = votes.get(name, 0) + 1
        # Ties go to the protocol first voted for (dicts keep insertion order).
        return max(votes.items(), key=lambda kv: kv[1])[0]

    def elect_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else pick a member that did. False when no
        member rejoined (or the group is empty)."""
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].awaiting_join:
            return True
        for m in self.members.values():
            if m.awaiting_join:
                self.leader_id = m.member_id
                return True
        return False

    def init_next_generation(self) -> None:
        self.generation += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition(COMPLETING)
        else:
            self.protocol_name = None
            self.transition(EMPTY)
        self.pending_sync.clear()

    def join_members(self) -> list[dict]:
        """The member list only the leader gets in its JoinGroup answer."""
        return [
            {
                "member_id": m.member_id,
                "group_instance_id": m.instance_id,
                "metadata": m.metadata_for(self.protocol_name),
            }
            for m in self.members.values()
        ]
