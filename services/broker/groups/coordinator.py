"""The group coordinator's asyncio shell around `GroupStateMachine`.

The state machine decides; this shell only gives it the loop's time, turns parked
requests into futures (one per handle), its timers into `loop.call_at`, and writes the
offset deletions it asks for. The API the Kafka handlers call (`join`, `sync`,
`heartbeat`, `leave`, `commit_check`, `describe`, `list_groups`, `delete`, `unload`) is
that of the coordinator before the split, so the protocol on the wire is unchanged.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from kio.schema.errors import ErrorCode

from .classic_group import ClassicGroup
from .messages import (
    ConsumerHeartbeatRequest,
    ConsumerHeartbeatResponse,
    JoinRequest,
    JoinResponse,
    Output,
    SyncRequest,
    SyncResponse,
    TimerCancel,
    TimerKey,
)
from .offsets import OffsetStore
from .state_machine import GroupSettings, GroupStateMachine, TopicsView

__all__ = ["GroupCoordinator", "GroupSettings", "JoinError"]

log = logging.getLogger("straitmq.groups")


class JoinError(Exception):
    """A JoinGroup/SyncGroup answered with an error (the handlers build the response)."""

    def __init__(self, code: int, member_id: str = "") -> None:
        super().__init__(code)
        self.code = code
        self.member_id = member_id


class GroupCoordinator:
    def __init__(self, offsets: OffsetStore, settings: GroupSettings) -> None:
        self.offsets = offsets
        self.settings = settings
        self.machine = GroupStateMachine(settings, offsets)
        self._handles = itertools.count(1)
        self._parked: dict[int, asyncio.Future[JoinResponse | SyncResponse]] = {}
        self._timers: dict[TimerKey, asyncio.TimerHandle] = {}

    @property
    def groups(self) -> dict[str, ClassicGroup]:
        return self.machine.groups

    # -- the shell ------------------------------------------------------------------------

    @staticmethod
    def _now() -> int:
        return int(asyncio.get_running_loop().time() * 1000)

    def _apply(self) -> None:
        out: Output = self.machine.take_output()
        for reply in out.replies:
            fut = self._parked.pop(reply.handle, None)
            # A client that went away left a cancelled future (or none): drop the answer.
            if fut is not None and not fut.done():
                fut.set_result(reply.response)
        for t in out.timers:
            old = self._timers.pop(t.key, None)
            if old is not None:
                old.cancel()
            if not isinstance(t, TimerCancel):
                self._timers[t.key] = asyncio.get_running_loop().call_at(
                    t.deadline_ms / 1000, self._fire, t.key
                )
        for rec in out.persist:
            self.offsets.delete_group(rec.group_id)
        for e in out.events:
            log.info(e.what, extra={"group": e.group_id, "member": e.member_id})

    def _fire(self, key: TimerKey) -> None:
        self._timers.pop(key, None)
        self.machine.expire(key, self._now())
        self._apply()

    async def _park(self, start: Callable[[int], None]) -> JoinResponse | SyncResponse:
        handle = next(self._handles)
        fut: asyncio.Future[JoinResponse | SyncResponse] = (
            asyncio.get_running_loop().create_future()
        )
        self._parked[handle] = fut
        try:
            start(handle)
            self._apply()
            return await fut
        finally:
            self._parked.pop(handle, None)

    # -- API ------------------------------------------------------------------------------

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
        supports_skip_assignment: bool = False,
    ) -> dict:
        req = JoinRequest(
            group_id,
            member_id,
            instance_id,
            client_id,
            client_host,
            session_timeout_ms,
            rebalance_timeout_ms,
            protocol_type,
            tuple(protocols),
            require_known_member_id,
            supports_skip_assignment,
        )
        resp = await self._park(lambda h: self.machine.join(h, req, self._now()))
        assert isinstance(resp, JoinResponse), "invariant: a JoinGroup gets a JoinGroup answer"
        if resp.error:
            raise JoinError(resp.error, resp.member_id)
        return resp.as_dict()

    async def sync(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        generation: int,
        assignments: dict[str, bytes],
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> dict:
        req = SyncRequest(
            group_id, member_id, instance_id, generation, assignments, protocol_type, protocol_name
        )
        resp = await self._park(lambda h: self.machine.sync(h, req, self._now()))
        assert isinstance(resp, SyncResponse), "invariant: a SyncGroup gets a SyncGroup answer"
        if resp.error:
            raise JoinError(resp.error)
        return {
            "protocol_type": resp.protocol_type,
            "protocol_name": resp.protocol_name,
            "assignment": resp.assignment,
        }

    def heartbeat(
        self, group_id: str, member_id: str, instance_id: str | None, generation: int
    ) -> int:
        code = self.machine.heartbeat(group_id, member_id, instance_id, generation, self._now())
        self._apply()
        return code

    def leave(self, group_id: str, members: list[tuple[str, str | None]]) -> tuple[int, list]:
        results = self.machine.leave(group_id, members, self._now())
        self._apply()
        # LeaveGroup v0-2 carries one member and its error at the top level.
        top = results[0][2] if len(results) == 1 else ErrorCode.none
        return top, results

    def commit_check(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        generation: int,
        version: int | None = None,
    ) -> int:
        code = self.machine.commit_check(
            group_id, member_id, instance_id, generation, self._now(), version
        )
        self._apply()
        return code

    def consumer_heartbeat(
        self, req: ConsumerHeartbeatRequest, topics: TopicsView
    ) -> ConsumerHeartbeatResponse:
        """ConsumerGroupHeartbeat (KIP-848): answered at once, nothing is parked."""
        resp = self.machine.consumer_heartbeat(req, topics, self._now())
        self._apply()
        return resp

    def fetch_check(self, group_id: str, member_id: str | None, member_epoch: int) -> int:
        return self.machine.fetch_check(group_id, member_id, member_epoch)

    def group_type(self, group_id: str) -> str | None:
        return self.machine.group_type(group_id)

    def consumer_describe(self, group_id: str) -> tuple[int, str | None, dict | None]:
        return self.machine.consumer_describe(group_id)

    def describe(self, group_id: str) -> dict:
        return self.machine.describe(group_id)

    def list_groups(self) -> list[tuple[str, str, str]]:
        return self.machine.list_groups()

    def delete(self, group_id: str) -> int:
        code = self.machine.delete(group_id)
        self._apply()
        return code

    def loaded(self, belongs: Callable[[str], bool]) -> None:
        """This broker now coordinates the groups `belongs` selects (it leads their
        offsets partition): hold KIP-848 assignments for a session timeout."""
        now = self._now()
        self.machine.hold_assignments(belongs, now + self.settings.consumer_session_timeout_ms)

    def unload(self, belongs: Callable[[str], bool]) -> None:
        self.machine.unload(belongs)
        self._apply()
