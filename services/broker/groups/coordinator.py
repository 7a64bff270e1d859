"""Classic consumer-group coordinator (JoinGroup/SyncGroup/Heartbeat/LeaveGroup).

Assignment is client-side: the leader's assignor (range, roundrobin, sticky,
cooperative-sticky) computes it and the coordinator relays it, so every assignor works.
State per group follows Kafka's: Empty -> PreparingRebalance -> CompletingRebalance ->
Stable, with generation fencing, MEMBER_ID_REQUIRED on first join (v4+), static
membership by group.instance.id, and session timeouts.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from .offsets import OffsetStore

log = logging.getLogger("straitmq.groups")


EMPTY = "Empty"
PREPARING = "PreparingRebalance"
COMPLETING = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"


@dataclass
class GroupSettings:
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3000
    max_size: int = 1000


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_future: asyncio.Future | None = None
    sync_future: asyncio.Future | None = None
    expiry: asyncio.TimerHandle | None = None

    def metadata_for(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""


@dataclass
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending: set[str] = field(default_factory=set)  # ids handed out with MEMBER_ID_REQUIRED
    rebalance_timer: asyncio.TimerHandle | None = None
    initial_delay_until: float = 0.0


class JoinError(Exception):
    def __init__(self, code: int, member_id: str = "") -> None:
        super().__init__(code)
        self.code = code
        self.member_id = member_id


class GroupCoordinator:
    def __init__(self, offsets: OffsetStore, settings: GroupSettings) -> None:
        self.offsets = offsets
        self.settings = settings
        self.groups: dict[str, Group] = {}

    # -- helpers ----------------------------------------------------------------------

    def _loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def _touch(self, group: Group, member: Member) -> None:
        """(Re)start the member's session timer."""
        if member.expiry:
            member.expiry.cancel()
        member.expiry = self._loop().call_later(
            member.session_timeout_ms / 1000, self._expire, group.group_id, member.member_id
        )

    def _expire(self, group_id: str, member_id: str) -> None:
        group = self.groups.get(group_id)
        if not group or member_id not in group.members:
            return
        member = group.members[member_id]
        if member.join_future and not member.join_future.done():
            return  # waiting in a rebalance; the rebalance timeout governs it
        log.info("member session expired", extra={"group": group_id, "member": member_id})
        self._remove_member(group, member)
        self._after_membership_change(group)

    def _remove_member(self, group: Group, member: Member) -> None:
        if member.expiry:
            member.expiry.cancel()
        for fut in (member.join_future, member.sync_future):
            if fut and not fut.done():
                fut.set_exception(JoinError(ErrorCode.unknown_member_id))
        group.members.pop(member.member_id, None)
        if member.instance_id and group.static.get(member.instance_id) == member.member_id:
            del group.static[member.instance_id]
        if group.leader_id == member.member_id:
            group.leader_id = next(iter(group.members), None)

    def _after_membership_change(self, group: Group) -> None:
        if not group.members:
            self._cancel_rebalance_timer(group)
            group.state = EMPTY
            group.protocol_name = None
            group.leader_id = None
            group.generation += 1
            return
        if group.state in (STABLE, COMPLETING, EMPTY):
            self._prepare_rebalance(group)
        elif group.state == PREPARING:
            self._maybe_complete_join(group)

    def _cancel_rebalance_timer(self, group: Group) -> None:
        if group.rebalance_timer:
            group.rebalance_timer.cancel()
            group.rebalance_timer = None

    def _prepare_rebalance(self, group: Group) -> None:
        was_empty = group.state == EMPTY
        # Members parked in SyncGroup learn that the generation moved on.
        for m in group.members.values():
            if m.sync_future and not m.sync_future.done():
                m.sync_future.set_exception(JoinError(ErrorCode.rebalance_in_progress))
        group.state = PREPARING
        self._cancel_rebalance_timer(group)
        timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
        loop = self._loop()
        if was_empty and self.settings.initial_rebalance_delay_ms > 0:
            group.initial_delay_until = (
                loop.time() + self.settings.initial_rebalance_delay_ms / 1000
            )
        group.rebalance_timer = loop.call_later(
            timeout / 1000, self._rebalance_deadline, group.group_id
        )
        self._maybe_complete_join(group)

    def _rebalance_deadline(self, group_id: str) -> None:
        group = self.groups.get(group_id)
        if not group or group.state != PREPARING:
            return
        group.rebalance_timer = None
        for m in list(group.members.values()):
            if not (m.join_future and not m.join_future.done()):
                self._remove_member(group, m)
        if group.members:
            self._complete_join(group)
        else:
            self._after_membership_change(group)

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state != PREPARING:
            return
        waiting = all(m.join_future and not m.join_future.done() for m in group.members.values())
        if not waiting or not group.members:
            return
        delay = group.initial_delay_until - self._loop().time()
        if delay > 0:
            # Let more members of a starting group join before the first generation.
            self._cancel_rebalance_timer(group)
            group.rebalance_timer = self._loop().call_later(
                delay, self._delayed_complete, group.group_id
            )
            return
        self._complete_join(group)

    def _delayed_complete(self, group_id: str) -> None:
        group = self.groups.get(group_id)
        if group and group.state == PREPARING:
            group.initial_delay_until = 0.0
            group.rebalance_timer = None
            timeout = max((m.rebalance_timeout_ms for m in group.members.values()), default=0)
            group.rebalance_timer = self._loop().call_later(
                timeout / 1000, self._rebalance_deadline, group.group_id
            )
            self._maybe_complete_join(group)

    def _choose_protocol(self, group: Group) -> str:
        candidates = None
        for m in group.members.values():
            names = {n for n, _ in m.protocols}
            candidates = names if candidates is None else candidates & names
        assert candidates, "members share no protocol; JoinGroup should have refused"
        votes: dict[str, int] = {}
        for m in group.members.values():
            for name, _ in m.protocols:
                if name in candidates:
                    votes[name] = votes.get(name, 0) + 1
                    break
        return max(votes.items(), key=lambda kv: kv[1])[0]

    def _complete_join(self, group: Group) -> None:
        self._cancel_rebalance_timer(group)
        group.generation += 1
        group.protocol_name = self._choose_protocol(group)
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members))
        group.state = COMPLETING
        members = [
            {
                "member_id": m.member_id,
                "group_instance_id": m.instance_id,
                "metadata": m.metadata_for(group.protocol_name),
            }
            for m in group.members.values()
        ]
        for m in group.members.values():
            result = {
                "error_code": ErrorCode.none,
                "generation_id": group.generation,
                "protocol_type": group.protocol_type,
                "protocol_name": group.protocol_name,
                "leader": group.leader_id,
                "member_id": m.member_id,
                "members": members if m.member_id == group.leader_id else [],
            }
            if m.join_future and not m.join_future.done():
                m.join_future.set_result(result)
            m.join_future = None
            self._touch(group, m)

    # -- API ------------------------------------------------------------------------

    async def join(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        client_id: str,
        client_host: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        require_known_member_id: bool,
    ) -> dict:
        if not group_id:
            raise JoinError(ErrorCode.invalid_group_id)
        s = self.settings
        if not s.min_session_timeout_ms <= session_timeout_ms <= s.max_session_timeout_ms:
            raise JoinError(ErrorCode.invalid_session_timeout)
        if rebalance_timeout_ms <= 0:
            rebalance_timeout_ms = session_timeout_ms
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = Group(group_id)
        if not protocols or (
            group.members
            and (
                protocol_type != group.protocol_type
                or not self._protocols_fit(group, {n for n, _ in protocols}, member_id)
            )
        ):
            raise JoinError(ErrorCode.inconsistent_group_protocol, member_id)

        if instance_id:
            old_id = group.static.get(instance_id)
            if member_id and old_id and member_id != old_id and member_id in group.members:
                raise JoinError(ErrorCode.fenced_instance_id, member_id)
            if old_id and old_id in group.members and member_id != old_id:
                # A static member came back with a new id: take over its place.
                old = group.members.pop(old_id)
                if old.expiry:
                    old.expiry.cancel()
                for fut in (old.join_future, old.sync_future):
                    if fut and not fut.done():
                        fut.set_exception(JoinError(ErrorCode.fenced_instance_id))
                new_id = member_id or f"{instance_id}-{uuid.uuid4()}"
                old.member_id = new_id
                old.join_future = old.sync_future = old.expiry = None
                old.session_timeout_ms = session_timeout_ms
                old.rebalance_timeout_ms = rebalance_timeout_ms
                group.members[new_id] = old
                group.static[instance_id] = new_id
                if group.leader_id == old_id:
                    group.leader_id = new_id
                if group.state == STABLE and old.protocols == protocols:
                    self._touch(group, old)
                    return {
                        "error_code": ErrorCode.none,
                        "generation_id": group.generation,
                        "protocol_type": group.protocol_type,
                        "protocol_name": group.protocol_name,
                        "leader": group.leader_id,
                        "member_id": new_id,
                        "members": [],
                    }
                member_id = new_id
                old.protocols = protocols
            elif not member_id:
                member_id = f"{instance_id}-{uuid.uuid4()}"
            if member_id not in group.members:
                group.static[instance_id] = member_id
        elif not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if require_known_member_id:
                group.pending.add(member_id)
                raise JoinError(ErrorCode.member_id_required, member_id)
        elif member_id not in group.members and member_id not in group.pending:
            raise JoinError(ErrorCode.unknown_member_id, member_id)

        group.pending.discard(member_id)
        member = group.members.get(member_id)
        if member is None:
            if len(group.members) >= s.max_size:
                raise JoinError(ErrorCode.group_max_size_reached, member_id)
            member = Member(
                member_id,
                instance_id,
                client_id,
                client_host,
                session_timeout_ms,
                rebalance_timeout_ms,
                protocol_type,
                protocols,
            )
            group.members[member_id] = member
            changed = True
        else:
            changed = member.protocols != protocols
            member.protocols = protocols
            member.session_timeout_ms = session_timeout_ms
            member.rebalance_timeout_ms = rebalance_timeout_ms
        group.protocol_type = protocol_type
        if member.expiry:
            member.expiry.cancel()
            member.expiry = None
        if member.join_future and not member.join_future.done():
            member.join_future.set_exception(JoinError(ErrorCode.unknown_member_id))
        member.join_future = self._loop().create_future()
        fut = member.join_future
        del changed  # any join outside a rebalance starts one, as the leader's does in Kafka
        if group.state in (EMPTY, STABLE, COMPLETING):
            self._prepare_rebalance(group)
        else:
            self._maybe_complete_join(group)
        return await fut

    def _protocols_fit(self, group: Group, names: set[str], member_id: str) -> bool:
        for m in group.members.values():
            if m.member_id == member_id:
                continue
            if not names & {n for n, _ in m.protocols}:
                return False
        return True

    def _member(
        self, group_id: str, member_id: str, instance_id: str | None
    ) -> tuple[Group, Member]:
        group = self.groups.get(group_id)
        if group is None or member_id not in group.members:
            if instance_id and group and instance_id in group.static:
                raise JoinError(ErrorCode.fenced_instance_id)
            raise JoinError(ErrorCode.unknown_member_id)
        member = group.members[member_id]
        if instance_id and member.instance_id and member.instance_id != instance_id:
            raise JoinError(ErrorCode.fenced_instance_id)
        return group, member

    async def sync(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        generation: int,
        assignments: dict[str, bytes],
    ) -> dict:
        group, member = self._member(group_id, member_id, instance_id)
        if generation != group.generation:
            raise JoinError(ErrorCode.illegal_generation)
        if group.state == PREPARING:
            raise JoinError(ErrorCode.rebalance_in_progress)
        result = {
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol_name,
        }
        self._touch(group, member)
        if group.state == STABLE:
            return {**result, "assignment": member.assignment}
        # CompletingRebalance
        if member_id == group.leader_id:
            for m in group.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            group.state = STABLE
            for m in group.members.values():
                if m.sync_future and not m.sync_future.done():
                    m.sync_future.set_result(m.assignment)
                m.sync_future = None
            return {**result, "assignment": member.assignment}
        if member.sync_future and not member.sync_future.done():
            member.sync_future.set_exception(JoinError(ErrorCode.rebalance_in_progress))
        member.sync_future = self._loop().create_future()
        assignment = await member.sync_future
        return {**result, "assignment": assignment}

    def heartbeat(
        self, group_id: str, member_id: str, instance_id: str | None, generation: int
    ) -> int:
        try:
            group, member = self._member(group_id, member_id, instance_id)
        except JoinError as e:
            return e.code
        if generation != group.generation:
            return ErrorCode.illegal_generation
        self._touch(group, member)
        if group.state == PREPARING:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> tuple[int, list]:
        group = self.groups.get(group_id)
        results = []
        changed = False
        for member_id, instance_id in members:
            code = ErrorCode.none
            target = None
            if group is not None:
                if instance_id:
                    mid = group.static.get(instance_id)
                    if mid is None:
                        code = ErrorCode.unknown_member_id
                    elif member_id and member_id != mid:
                        code = ErrorCode.fenced_instance_id
                    else:
                        target = group.members.get(mid)
                else:
                    target = group.members.get(member_id)
                    if target is None:
                        code = ErrorCode.unknown_member_id
            else:
                code = ErrorCode.unknown_member_id
            if target is not None:
                self._remove_member(group, target)  # type: ignore[arg-type]
                changed = True
            results.append((member_id, instance_id, code))
        if changed and group is not None:
            self._after_membership_change(group)
        top = results[0][2] if len(results) == 1 else ErrorCode.none
        return top, results

    def commit_check(
        self, group_id: str, member_id: str, instance_id: str | None, generation: int
    ) -> int:
        group = self.groups.get(group_id)
        if generation < 0 and not member_id:
            if group is not None and group.members:
                return (
                    ErrorCode.unknown_member_id
                )  # as Kafka: an anonymous commit to an active group
            return ErrorCode.none
        try:
            group, member = self._member(group_id, member_id, instance_id)
        except JoinError as e:
            return e.code
        if generation != group.generation:
            return ErrorCode.illegal_generation
        if group.state == COMPLETING:
            return ErrorCode.rebalance_in_progress
        self._touch(group, member)
        return ErrorCode.none

    def describe(self, group_id: str) -> dict:
        group = self.groups.get(group_id)
        if group is None:
            state = EMPTY if self.offsets.has_group(group_id) else DEAD
            return {
                "group_id": group_id,
                "group_state": state,
                "protocol_type": "",
                "protocol_data": "",
                "members": [],
            }
        return {
            "group_id": group_id,
            "group_state": group.state,
            "protocol_type": group.protocol_type or "",
            "protocol_data": group.protocol_name or "",
            "members": [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "member_metadata": m.metadata_for(group.protocol_name or ""),
                    "member_assignment": m.assignment,
                }
                for m in group.members.values()
            ],
        }

    def list_groups(self) -> list[tuple[str, str, str]]:
        out = {}
        for gid in self.offsets.group_ids():
            out[gid] = ("consumer", EMPTY)
        for gid, g in self.groups.items():
            if g.state == EMPTY and not self.offsets.has_group(gid) and not g.protocol_type:
                continue
            out[gid] = (g.protocol_type or "consumer", g.state)
        return [(gid, pt, st) for gid, (pt, st) in sorted(out.items())]

    def unload(self, belongs: Callable[[str], bool]) -> None:
        """This broker stopped coordinating some groups (it no longer leads their offsets
        partition): drop them; waiting members get NOT_COORDINATOR and find the new one."""
        for gid in [g for g in self.groups if belongs(g)]:
            group = self.groups.pop(gid)
            self._cancel_rebalance_timer(group)
            for member in list(group.members.values()):
                if member.expiry:
                    member.expiry.cancel()
                for fut in (member.join_future, member.sync_future):
                    if fut and not fut.done():
                        fut.set_exception(JoinError(ErrorCode.not_coordinator))

    def delete(self, group_id: str) -> int:
        group = self.groups.get(group_id)
        if group is not None and group.members:
            return ErrorCode.non_empty_group
        if group is None and not self.offsets.has_group(group_id):
            return ErrorCode.group_id_not_found
        self.groups.pop(group_id, None)
        self.offsets.delete_group(group_id)
        return ErrorCode.none
