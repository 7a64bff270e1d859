"""ISR proposals go to the controller batched, one call in flight, and fall back to one
call per partition when the controller is older (a rolling upgrade). The controller
here is a stand-in object answering as the real HTTP client does; the batched op itself
is tested in test_controller_logic and by every cluster test that restarts a broker."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from kio.schema.errors import ErrorCode
from straitmq.broker.replication import isr as isr_module
from straitmq.broker.replication.core import ReplicaCore
from straitmq.controller.errors import ControllerError
from straitmq.metadata.image import MetadataImage


class Controller:
    def __init__(self, batched: bool) -> None:
        self.batched = batched
        self.calls: list[tuple[str, int]] = []

    async def call(self, op: str, body: dict, within_s: float = 15.0) -> dict:
        await asyncio.sleep(0.01)
        if op == "alter_partitions":
            if not self.batched:
                raise ControllerError(ErrorCode.invalid_request, "no such call alter_partitions")
            self.calls.append((op, len(body["partitions"])))
            return {
                "partitions": [
                    {"error_code": 0}
                    if it["index"] % 2 == 0
                    else {"error_code": ErrorCode.fenced_leader_epoch, "message": "stale"}
                    for it in body["partitions"]
                ]
            }
        self.calls.append((op, 1))
        if body["index"] % 2:
            raise ControllerError(ErrorCode.fenced_leader_epoch, "stale")
        return {}


def _no_image() -> MetadataImage:
    return MetadataImage()


def _run(batched: bool, n: int) -> tuple[Controller, list, isr_module.IsrManager]:
    controller = Controller(batched)
    manager = isr_module.IsrManager(1, 30_000, controller, _no_image, lambda: True)
    parts = [ReplicaCore("t", i, 1) for i in range(n)]
    for p in parts:
        p.leader_epoch, p.partition_epoch, p.isr = 0, 0, [1, 2, 3]

    async def go() -> None:
        for p in parts:
            manager.propose(p, [1, 2])  # type: ignore[arg-type]
        assert manager._sender is not None
        await manager._sender

    asyncio.run(go())
    return controller, parts, manager


def test_proposals_are_sent_in_batches_one_call_in_flight() -> None:
    controller, parts, manager = _run(batched=True, n=2500)
    assert controller.calls == [("alter_partitions", 1000)] * 2 + [("alter_partitions", 500)]
    # Accepted ones count; refused ones are no longer pending (the next scan retries).
    assert manager.shrinks == 1250
    assert all(p.pending_isr == [1, 2] for p in parts if p.index % 2 == 0)
    assert all(p.pending_isr is None for p in parts if p.index % 2)


def test_an_older_controller_gets_one_call_per_partition() -> None:
    controller, parts, manager = _run(batched=False, n=30)
    assert [op for op, _ in controller.calls] == ["alter_partition"] * 30
    assert manager.shrinks == 15 and manager._batched is False
    assert all(p.pending_isr is None for p in parts if p.index % 2)


def test_full_isrs_are_checked_for_shrinking_less_often_than_short_ones_for_growing(
    monkeypatch,
) -> None:
    """A follower that caught up rejoins within one expand period; an ISR that lacks no
    replica can only shrink after replica.lag.time.max.ms, so it is checked every lag / 4
    (at 100,000 partitions a check of every led partition each second kept a core busy)."""
    monkeypatch.setattr(isr_module, "EXPAND_CHECK_S", 0.001)
    clock = [1000.0]  # the scan's clock, moved by hand
    monkeypatch.setattr(isr_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    checked: list[int] = []
    seen = asyncio.Event()

    def part(index: int, isr: list[int]) -> SimpleNamespace:
        def isr_change(lag_s: float, alive, incarnation) -> None:
            checked.append(index)
            seen.set()

        return SimpleNamespace(
            topic="t", index=index, isr=isr, replicas=[1, 2, 3], isr_change=isr_change
        )

    image = SimpleNamespace(broker_alive=lambda b: True)
    manager = isr_module.IsrManager(
        1,
        40_000,  # full ISRs: every 10 s
        Controller(batched=True),
        lambda: image,  # type: ignore[arg-type,return-value]
        lambda: True,
    )
    manager.led = {("t", 0): part(0, [1, 2, 3]), ("t", 1): part(1, [1, 2])}  # type: ignore[dict-item]

    async def scans(n: int) -> None:
        for _ in range(n):
            seen.clear()
            await seen.wait()

    async def go() -> None:
        task = asyncio.get_running_loop().create_task(manager.run())
        await scans(10)
        assert checked.count(1) == 10 and checked.count(0) == 1  # only the first scan
        clock[0] += 9.9
        await scans(5)
        assert checked.count(0) == 1
        clock[0] += 0.1  # 10 s after the first scan
        await scans(5)
        assert checked.count(0) == 2 and checked.count(1) == 20
        task.cancel()

    asyncio.run(asyncio.wait_for(go(), 30))
