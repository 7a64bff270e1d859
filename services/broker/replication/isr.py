"""ISR upkeep on the leader: shrink followers that lag longer than
`replica.lag.time.max.ms`, add back those that caught up, through the controller
(AlterPartition). One change in flight per partition; it counts once committed.
As Kafka's broker does, changes go to the controller batched, one call in flight: a
broker that comes back after a restart puts thousands of partitions back in their
ISRs with a few calls, not thousands.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable

from straitmq.metadata.image import MetadataImage

from straitmq.errors import KafkaError
from straitmq.invariants import broken

from ..loop_slice import LoopSlice
from ..metadata_view import ControllerCalls
from ..partitions import LEADER, Partition

log = logging.getLogger("straitmq.replication")
# The scan yields to the event loop after SCAN_SLICE_S of work (checked every
# SCAN_CHECK replicas): a count alone is 100+ ms on a busy 2-core machine.
SCAN_SLICE_S = 0.02
SCAN_CHECK = 100
EXPAND_CHECK_S = 1.0  # how soon a caught-up follower rejoins the ISR, at most
ALTER_BATCH = 1000  # ISR changes per call to the controller
Queued = tuple[Partition, list[int], dict]  # a proposal: partition, new ISR, request item


class IsrManager:
    def __init__(
        self,
        node_id: int,
        lag_time_max_ms: int,
        controller: ControllerCalls,
        image: Callable[[], MetadataImage],
        ready: Callable[[], bool],
    ) -> None:
        self.node_id = node_id
        self.lag_s = lag_time_max_ms / 1000
        self._controller = controller
        self._image = image
        self._ready = ready  # registered and unfenced: only then are ISR changes proposed
        self.shrinks = 0
        self.expands = 0
        # Only leaders change an ISR: the scan visits them, not every replica.
        self.led: dict[tuple[str, int], Partition] = {}
        # Proposed, not sent yet (a later proposal for a partition replaces its earlier).
        # Each with the request item built when proposed: the epochs and incarnations
        # it was decided on, not those of when it is sent.
        self._queued: dict[tuple[str, int], Queued] = {}
        self._sender: asyncio.Task | None = None
        self._batched = True  # False once a controller without alter_partitions answered

    def on_role(self, part: Partition, role: str) -> None:
        if role == LEADER:
            self.led[(part.topic, part.index)] = part
        else:
            self.led.pop((part.topic, part.index), None)

    def _alive(self, broker_id: int) -> bool:
        return self._image().broker_alive(broker_id)

    def _incarnation(self, broker_id: int) -> str | None:
        return self._image().broker_incarnation(broker_id)

    async def run(self) -> None:
        lag_s = self.lag_s
        period = min(EXPAND_CHECK_S, lag_s / 4)
        # A returning follower rejoins within `period`, so a partition whose ISR lacks a
        # replica is checked every period. A full ISR can only shrink, and a follower is
        # dropped only after lagging lag_s: those are checked every lag_s / 4, as Kafka
        # checks every lag / 2. (At 100,000 partitions a check of every led partition
        # each second kept a core busy.)
        shrink_every = lag_s / 4
        next_shrink_check = 0.0
        while True:
            await asyncio.sleep(period)
            if not self._ready():
                continue
            now = time.monotonic()
            if now >= next_shrink_check:
                next_shrink_check = now + shrink_every
                parts = list(self.led.values())
            else:
                parts = [p for p in self.led.values() if len(p.isr) < len(p.replicas)]
            pacer = LoopSlice(SCAN_SLICE_S, SCAN_CHECK)
            for part in parts:
                try:
                    new = part.isr_change(lag_s, self._alive, self._incarnation)
                    if new is not None:
                        self.propose(part, new)
                except Exception as e:  # pure decisions: only a bug raises here
                    broken(
                        "an ISR check decides without failing",
                        partition=f"{part.topic}-{part.index}",
                        error=f"{type(e).__name__}: {e}",
                    )
                if pacer.due():
                    await pacer.pause()  # 100,000 replicas: let the listener answer

    async def stop(self) -> None:
        """Stop sending: proposals not answered yet are dropped (the next leader, or
        this broker once back, proposes anew)."""
        self._queued.clear()
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
            self._sender = None

    def propose(self, part: Partition, new_isr: list[int]) -> None:
        part.propose_isr(new_isr)
        self._queued[(part.topic, part.index)] = (part, new_isr, _item(part, new_isr))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send_queued())

    async def _send_queued(self) -> None:
        while self._queued:
            keys = list(itertools.islice(self._queued, ALTER_BATCH))
            batch = [self._queued.pop(k) for k in keys]
            if self._batched and await self._send_batch(batch):
                continue
            self._batched = False  # an older controller (a rolling upgrade)
            await asyncio.gather(*(self._send(*q) for q in batch))

    async def _send_batch(self, batch: list[Queued]) -> bool:
        """One alter_partitions call for the batch; False, with nothing sent, when the
        controller does not know that call."""
        items = [item for _, _, item in batch]
        # Judged now: by the answer the broker may have applied the new ISR already.
        grew = [len(isr) > len(part.isr) for part, isr, _ in batch]
        answers: list[dict | None]
        try:
            reply = await self._controller.call(
                "alter_partitions",
                {"broker": self.node_id, "partitions": items},
                within_s=10.0,
            )
            got = reply.get("partitions") if isinstance(reply, dict) else None
            answers = got if isinstance(got, list) else []
            if len(answers) != len(batch):
                # The controller's answer does not have the batch's shape (a peer's
                # bad answer): each change counts as failed and is proposed anew.
                log.error(
                    "ISR changes: the controller's answer does not match the request",
                    extra={"partitions": len(batch), "answer": str(reply)[:200]},
                )
                answers = [None] * len(batch)
        except KafkaError as e:
            if "no such call" in e.message:
                return False
            answers = [{"error_code": e.code, "message": e.message}] * len(batch)
        except Exception as e:  # the call raises KafkaError (ControllerError) only
            broken(
                "a controller call fails with a Kafka error",
                call="alter_partitions",
                error=f"{type(e).__name__}: {e}",
            )
        for (part, isr, _), answer, more in zip(batch, answers, grew, strict=True):
            self._settle(part, isr, more, answer)
        return True

    async def _send(self, part: Partition, new_isr: list[int], item: dict) -> None:
        grew = len(new_isr) > len(part.isr)
        answer: dict | None
        try:
            await self._controller.call(
                "alter_partition", {"broker": self.node_id, **item}, within_s=5.0
            )
            answer = {"error_code": 0}
        except KafkaError as e:
            answer = {"error_code": e.code, "message": e.message}
        except Exception as e:  # the call raises KafkaError (ControllerError) only
            broken(
                "a controller call fails with a Kafka error",
                call="alter_partition",
                partition=f"{part.topic}-{part.index}",
                error=f"{type(e).__name__}: {e}",
            )
        self._settle(part, new_isr, grew, answer)

    def _settle(self, part: Partition, new_isr: list[int], grew: bool, answer: dict | None) -> None:
        """The controller's answer to one proposal (None: the call failed, logged): count
        it, or take the change out of flight. Whatever failed, left pending the ISR could
        never change again (and a reassignment never end); the next scan proposes anew."""
        if answer is not None and answer["error_code"] == 0:
            if grew:
                self.expands += 1
            else:
                self.shrinks += 1
            log.info(
                "ISR changed", extra={"partition": f"{part.topic}-{part.index}", "isr": new_isr}
            )
            return
        if answer is not None:
            log.info(
                "ISR change refused",
                extra={"partition": f"{part.topic}-{part.index}", "reason": answer.get("message")},
            )
        part.isr_refused(new_isr)


def _item(part: Partition, isr: list[int]) -> dict:
    """One ISR change as the controller reads it; `incarnations` names the broker
    registration each joining member's fetches came from (KIP-903)."""
    return {
        "topic": part.topic,
        "index": part.index,
        "leader_epoch": part.leader_epoch,
        "partition_epoch": part.partition_epoch,
        "isr": isr,
        "incarnations": {str(r): i for r, i in part.isr_incarnations(isr).items()},
    }
