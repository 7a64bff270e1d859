"""The group coordinator's asyncio shell around `GroupStateMachine`.

The state machine decides; this shell only gives it the loop's time, turns parked
requests into futures (one per handle), its timers into `loop.call_at`, and writes what
it asks to persist (offset deletions, KIP-848 group records) to `__consumer_offsets`. A
ConsumerGroupHeartbeat whose answer changed the group's records is answered once they
are replicated (as Kafka answers once its write is committed). The API the Kafka
handlers call (`join`, `sync`, `heartbeat`, `leave`, `commit_check`, `describe`,
`list_groups`, `delete`, `unload`) is that of the coordinator before the split, so the
protocol on the wire is unchanged.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from kio.schema.errors import ErrorCode

from straitmq.errors import KafkaError
from straitmq.invariants import broken
from straitmq.tasks import cancel_and_wait

from .classic_group import ClassicGroup
from .messages import (
    ConsumerHeartbeatRequest,
    ConsumerHeartbeatResponse,
    GroupRecords,
    JoinRequest,
    JoinResponse,
    Output,
    SyncRequest,
    SyncResponse,
    TimerCancel,
    TimerKey,
)
from .offsets import OffsetStore
from .records import RecordKey, classic_key
from .state_machine import GroupSettings, GroupStateMachine, TopicsView

__all__ = ["GroupCoordinator", "GroupSettings", "JoinError"]

log = logging.getLogger("straitmq.groups")

# (group id, log end offset after the write): True once the offsets partition's ISR has it.
# Called right after the write (the wait belongs to that leadership), awaited later.
DurableFn = Callable[[str, int], Awaitable[bool]]


# The wall-clock time (ms) a classic group became Empty, stamped by the shell on its record
# (Kafka's currentStateTimestamp): its offsets' retention counts from then after a move.
EMPTY_SINCE = "empty_since_ms"


# Internal groups whose commits are state, not consumer positions (share-partition start
# offsets, services/broker/share/checkpoints.py): never expired.
UNEXPIRED_PREFIXES = ("__share_group_state.",)


def _stamped(key: RecordKey, value: dict | None) -> tuple[RecordKey, dict | None]:
    if value is not None and key[0] == classic_key("")[0] and not value["members"]:
        return key, {**value, EMPTY_SINCE: int(time.time() * 1000)}
    return key, value


class JoinError(Exception):
    """A JoinGroup/SyncGroup answered with an error (the handlers build the response)."""

    def __init__(self, code: int, member_id: str = "") -> None:
        super().__init__(code)
        self.code = code
        self.member_id = member_id


# JoinGroup and SyncGroup requests of one group waiting for their answers, at most this
# many times group.max.size: a member has one of each parked (a retry replaces the
# earlier one, answered), and an answer may still wait for the group's records to be
# replicated when its member asks again. Past it, a client is sending requests without
# waiting for their answers: a JoinGroup gets GROUP_MAX_SIZE_REACHED and a SyncGroup
# REBALANCE_IN_PROGRESS (the member joins again) at once, before the state machine.
PARKED_PER_MEMBER = 3


class GroupCoordinator:
    def __init__(self, offsets: OffsetStore, settings: GroupSettings) -> None:
        self.offsets = offsets
        self.settings = settings
        self.machine = GroupStateMachine(settings, offsets)
        self._handles = itertools.count(1)
        # Every parked handle of every group; at most max_parked_per_group of a group.
        self._parked: dict[int, asyncio.Future[JoinResponse | SyncResponse]] = {}
        self.max_parked_per_group = PARKED_PER_MEMBER * settings.max_size
        self._parked_in: dict[str, int] = {}  # group -> its requests in _park now
        # Requests refused at a bound: the bound's name -> how many (metrics).
        self.refusals: Counter[str] = Counter()
        self._timers: dict[TimerKey, asyncio.TimerHandle] = {}
        self._durable: DurableFn | None = None
        # Per group, the offsets log end after its last records written.
        self._written_to: dict[str, int] = {}
        self._handle_groups: dict[int, str] = {}  # parked request -> its group
        self._answering: set[asyncio.Task] = set()  # answers waiting for durability
        self._stopped = False  # stop() ran: no timer is set again

    def bind(self, durable: DurableFn) -> None:
        """How to wait for group records to be replicated (unbound: not waited for)."""
        self._durable = durable

    async def stop(self) -> None:
        """The broker is stopping: no timer fires after this (a session expiry would
        write group records to logs being closed), no answer waits for durability, and
        the requests still parked are cancelled (their connections are closed by now)."""
        self._stopped = True
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        await cancel_and_wait(list(self._answering))
        for fut in list(self._parked.values()):
            fut.cancel()
        # Each parked request's own `finally` (in _park) drops its entries.

    @property
    def groups(self) -> dict[str, ClassicGroup]:
        return self.machine.groups

    # -- the shell ------------------------------------------------------------------------

    @staticmethod
    def _now() -> int:
        return int(asyncio.get_running_loop().time() * 1000)

    def _apply(self) -> dict[str, int | None]:
        """Carry out the machine's output; returns, per group whose records were
        written, the offsets log end after them (None: the write failed)."""
        out: Output = self.machine.take_output()
        written = self._persist(out)
        for reply in out.replies:
            fut = self._parked.pop(reply.handle, None)
            gid = self._handle_groups.pop(reply.handle, None)
            # A client that went away left a cancelled future (or none): drop the answer.
            if fut is None or fut.done():
                continue
            if gid is not None and gid in written and written[gid] is None:
                # Its records were not written (a full disk, or this broker no longer
                # leads the offsets partition): an answer must not tell of them.
                fut.set_result(_unstored(reply.response))
                continue
            end = self._written_to.get(gid) if gid is not None else None
            if end is None or self._durable is None:
                fut.set_result(reply.response)
            else:
                # The answer may tell what the group's records say (a SyncGroup that made
                # the generation Stable): sent once they are replicated, as Kafka does.
                # The wait is made now, bound to the leadership that wrote the records.
                durable = self._durable(gid or "", end)
                task = asyncio.get_running_loop().create_task(
                    self._answer_when_durable(fut, reply.response, durable)
                )
                self._answering.add(task)
                task.add_done_callback(self._answering.discard)
        for t in out.timers:
            old = self._timers.pop(t.key, None)
            if old is not None:
                old.cancel()
            if not isinstance(t, TimerCancel) and not self._stopped:
                self._timers[t.key] = asyncio.get_running_loop().call_at(
                    t.deadline_ms / 1000, self._fire, t.key
                )
        for e in out.events:
            log.info(e.what, extra={"group": e.group_id, "member": e.member_id})
        return written

    async def _answer_when_durable(
        self,
        fut: asyncio.Future,
        response: JoinResponse | SyncResponse,
        durable: Awaitable[bool],
    ) -> None:
        ok = await durable
        if not ok and isinstance(response, SyncResponse) and response.error == ErrorCode.none:
            # Not replicated (this broker lost the group, or the ISR lags): the members
            # rejoin, at the new coordinator if it moved.
            response = SyncResponse(ErrorCode.coordinator_not_available)
        if not fut.done():
            fut.set_result(response)

    def _persist(self, out: Output) -> dict[str, int | None]:
        written: dict[str, int | None] = {}
        for rec in out.persist:
            try:
                if isinstance(rec, GroupRecords):
                    records = [_stamped(k, v) for k, v in rec.records]
                    end = self.offsets.write_group_records(rec.group_id, records)
                    written[rec.group_id] = self._written_to[rec.group_id] = end
                else:
                    self.offsets.delete_group(rec.group_id)
            except (KafkaError, OSError) as e:  # not the offsets partition's leader now,
                # or its disk refused the append
                written[rec.group_id] = None
                log.warning(
                    "group records not written", extra={"group": rec.group_id, "reason": str(e)}
                )
            except Exception as e:  # a bug: the records are built and applied in memory
                broken(
                    "group records are written or refused by their partition",
                    group=rec.group_id,
                    error=f"{type(e).__name__}: {e}",
                )
        return written

    def _fire(self, key: TimerKey) -> None:
        self._timers.pop(key, None)
        self.machine.expire(key, self._now())
        self._apply()

    async def _park(
        self,
        group_id: str,
        start: Callable[[int], None],
        refusal: JoinResponse | SyncResponse,
    ) -> JoinResponse | SyncResponse:
        """Hand the request to the machine and wait for its answer; `refusal` at once
        when the group has max_parked_per_group requests waiting already."""
        waiting = self._parked_in.get(group_id, 0)
        if waiting >= self.max_parked_per_group:
            self.refusals["group.parked"] += 1
            return refusal
        self._parked_in[group_id] = waiting + 1
        handle = next(self._handles)
        fut: asyncio.Future[JoinResponse | SyncResponse] = (
            asyncio.get_running_loop().create_future()
        )
        self._parked[handle] = fut
        self._handle_groups[handle] = group_id
        try:
            start(handle)
            self._apply()
            return await fut
        finally:
            self._parked.pop(handle, None)
            self._handle_groups.pop(handle, None)
            left = self._parked_in[group_id] - 1
            if left:
                self._parked_in[group_id] = left
            else:
                del self._parked_in[group_id]

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
        topics: TopicsView | None = None,
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
        resp = await self._park(
            group_id,
            lambda h: self.machine.join(h, req, self._now(), topics),
            JoinResponse(ErrorCode.group_max_size_reached, ""),
        )
        if not isinstance(resp, JoinResponse):
            broken("a JoinGroup gets a JoinGroup answer", group=group_id, got=type(resp).__name__)
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
        resp = await self._park(
            group_id,
            lambda h: self.machine.sync(h, req, self._now()),
            SyncResponse(ErrorCode.rebalance_in_progress),
        )
        if not isinstance(resp, SyncResponse):
            broken("a SyncGroup gets a SyncGroup answer", group=group_id, got=type(resp).__name__)
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

    async def consumer_heartbeat(
        self, req: ConsumerHeartbeatRequest, topics: TopicsView
    ) -> ConsumerHeartbeatResponse:
        """ConsumerGroupHeartbeat (KIP-848): decided at once, nothing is parked; answered
        once the records it wrote are replicated. If they are not (this broker lost the
        leadership, or the ISR did not catch up in time), the member hears
        NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE, as from Kafka, and retries (at the
        new coordinator, which has the group as of its last replicated records)."""
        resp = self.machine.consumer_heartbeat(req, topics, self._now())
        written = self._apply()
        if resp.error:
            return resp
        # An answer that wrote nothing may still tell what an earlier heartbeat wrote
        # and is not replicated yet: it waits for that too (Kafka's coordinator answers
        # once its last written offset is committed).
        end = written.get(req.group_id, self._written_to.get(req.group_id, -1))
        if end == -1:
            return resp
        code = ErrorCode.not_coordinator
        if end is not None:
            if self._durable is None or await self._durable(req.group_id, end):
                return resp
            code = ErrorCode.coordinator_not_available
        # Its next successful answer carries the whole assignment again.
        self.machine.assignment_unsent(req.group_id, resp.member_id or "")
        return ConsumerHeartbeatResponse(code, "the group's state could not be written")

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
        offsets partition, just replayed into `offsets`): rebuild the KIP-848 groups
        from their records; hold assignments of groups without records for a session
        timeout."""
        now = self._now()
        wall = int(time.time() * 1000)
        records = {g: r for g, r in self.offsets.group_records.items() if belongs(g)}
        self.machine.load_consumer_groups(records, now)
        for gid, recs in records.items():
            since = (recs.get(classic_key(gid)) or {}).get(EMPTY_SINCE)
            if since is not None:  # an Empty classic group: since then, in the loop's time
                self.machine.empty_since(gid, now - max(wall - since, 0))
        self.machine.hold_assignments(belongs, now + self.settings.consumer_session_timeout_ms)
        self._apply()

    def expire_groups(self, retention_ms: int) -> list[str]:
        """Kafka's offsets.retention.minutes: a group without members loses each commit
        once `retention_ms` passed since the commit (a KIP-848 or simple group) or since
        the later of the commit and the moment it became empty (a classic group, as
        Kafka counts from its state timestamp); a group left with no member and no
        offset is removed (its records deleted, ListGroups no longer shows it). A
        KIP-848 group with members loses, by commit time, the offsets of topics none of
        them subscribes to. Returns the groups removed."""
        now = self._now()
        wall = int(time.time() * 1000)
        removed = []
        for gid, topics in sorted(self.machine.subscribed_topics().items()):
            if self.offsets.owns(gid):
                self.offsets.expire(gid, wall - retention_ms, keep_topics=topics)
        for gid, since in sorted(self.machine.empty_groups().items()):
            if not self.offsets.owns(gid) or gid.startswith(UNEXPIRED_PREFIXES):
                continue
            if since is None or now - since >= retention_ms:
                self.offsets.expire(gid, wall - retention_ms)
            if not self.offsets.has_group(gid):
                self.machine.remove_expired(gid, now)
                removed.append(gid)
        self._apply()
        return removed

    def unload(self, belongs: Callable[[str], bool]) -> None:
        self.machine.unload(belongs)
        for g in [g for g in self._written_to if belongs(g)]:
            del self._written_to[g]
        self._apply()


def _unstored(response: JoinResponse | SyncResponse) -> JoinResponse | SyncResponse:
    """The answer to a request whose group records could not be written: a SyncGroup
    that would tell the assignment gets NOT_COORDINATOR (Kafka's answer when storing the
    group fails with KAFKA_STORAGE_ERROR), and the members rejoin."""
    if isinstance(response, SyncResponse) and response.error == ErrorCode.none:
        return SyncResponse(ErrorCode.not_coordinator)
    return response
