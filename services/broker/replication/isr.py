"""ISR upkeep on the leader: shrink followers that lag longer than
`replica.lag.time.max.ms`, add back those that caught up, through the controller
(AlterPartition). One change in flight per partition; it counts once committed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from straitmq.controller.errors import ControllerError

from ..partitions import LEADER, Partition

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("straitmq.replication")
SCAN_CHUNK = 2000  # replicas checked between yields to the event loop


class IsrManager:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.shrinks = 0
        self.expands = 0
        # Only leaders change an ISR: the scan visits them, not every replica.
        self.led: dict[tuple[str, int], Partition] = {}

    def on_role(self, part: Partition, role: str) -> None:
        if role == LEADER:
            self.led[(part.topic, part.index)] = part
        else:
            self.led.pop((part.topic, part.index), None)

    def _alive(self, broker_id: int) -> bool:
        return self.broker.image.broker_alive(broker_id)

    async def run(self) -> None:
        lag_s = self.broker.config.replica_lag_time_max_ms / 1000
        period = min(1.0, lag_s / 4)
        while True:
            await asyncio.sleep(period)
            if not self.broker.ready:
                continue
            parts = list(self.led.values())
            for n, part in enumerate(parts, 1):
                try:
                    new = part.isr_change(lag_s, self._alive)
                    if new is not None:
                        self.propose(part, new)
                except Exception:  # one partition's bug must not end ISR upkeep for all
                    log.exception(
                        "ISR check failed", extra={"partition": f"{part.topic}-{part.index}"}
                    )
                if n % SCAN_CHUNK == 0:
                    await asyncio.sleep(0)  # 100,000 replicas: let the listener answer

    def propose(self, part: Partition, new_isr: list[int]) -> None:
        part.pending_isr = new_isr
        asyncio.get_running_loop().create_task(self._send(part, new_isr))

    async def _send(self, part: Partition, new_isr: list[int]) -> None:
        grew = len(new_isr) > len(part.isr)
        try:
            await self.broker.controller.call(
                "alter_partition",
                {
                    "broker": self.broker.node_id,
                    "topic": part.topic,
                    "index": part.index,
                    "leader_epoch": part.leader_epoch,
                    "partition_epoch": part.partition_epoch,
                    "isr": new_isr,
                },
                within_s=5.0,
            )
            if grew:
                self.expands += 1
            else:
                self.shrinks += 1
            log.info(
                "ISR changed",
                extra={"partition": f"{part.topic}-{part.index}", "isr": new_isr},
            )
        except ControllerError as e:
            log.info(
                "ISR change refused",
                extra={"partition": f"{part.topic}-{part.index}", "reason": e.message},
            )
            if part.pending_isr == new_isr:
                part.pending_isr = None
        except Exception:
            # Whatever failed, the change is not in flight any more: left pending, the
            # partition's ISR could never change again (and a reassignment never end).
            log.exception("ISR change failed", extra={"partition": f"{part.topic}-{part.index}"})
            if part.pending_isr == new_isr:
                part.pending_isr = None
