"""Every waiter set and every listener has a bound that turns into a Kafka answer: fetches
parked on a partition, acks=all writes waiting for the high watermark, ShareFetches
parked on a broker, JoinGroup/SyncGroup requests waiting in a group and the ids a group
hands out; and a broker's listeners close a connection past max.connections or
max.connections.per.ip at once, while the connections within them stay usable."""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import time
import urllib.request
from collections import Counter
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import record_batch
from kio.schema.errors import ErrorCode as E
from straitmq.broker import partitions as partitions_module
from straitmq.broker.api import fetch as fetch_api
from straitmq.broker.api import share as share_api
from straitmq.broker.groups.coordinator import GroupCoordinator, JoinError
from straitmq.broker.groups.state_machine import GroupSettings
from straitmq.broker.metrics import BrokerMetrics
from straitmq.broker.partitions import Partition
from straitmq.broker.records import validate_batches
from straitmq.broker.server import ConnectionLimits
from straitmq.broker.share import coordinator as share_coordinator
from straitmq.broker.storage.log import LogConfig, PartitionLog
from straitmq.metadata.image import PartitionImage

from straitmq.admin_client import request_sync

# -- connection limits, sans-IO ---------------------------------------------------------


def test_connection_limits_count_per_address_and_over_the_listeners() -> None:
    limits = ConnectionLimits(max_connections=3, max_per_ip=2, protected_listener="REPL")
    assert limits.admit("CLIENT", "/10.0.0.1") is None
    assert limits.admit("CLIENT", "/10.0.0.1") is None
    assert limits.admit("CLIENT", "/10.0.0.1") == "max.connections.per.ip"
    assert limits.admit("CLIENT", "/10.0.0.2") is None
    assert limits.admit("CLIENT", "/10.0.0.3") == "max.connections"
    # The inter-broker listener beside client listeners is not held to max.connections,
    # but an address is held to its cap there too.
    assert limits.admit("REPL", "/10.0.0.9") is None
    assert limits.counted == 3
    limits.release("CLIENT", "/10.0.0.1")
    assert limits.admit("CLIENT", "/10.0.0.3") is None  # a slot freed
    limits.release("REPL", "/10.0.0.9")
    assert limits.counted == 3 and "/10.0.0.9" not in limits.per_ip


# -- what waits on a partition ------------------------------------------------------------


def _leader(tmp_path: Path) -> Partition:
    part = Partition("t", 0, PartitionLog(str(tmp_path / "t-0"), LogConfig()), node_id=1)
    image = PartitionImage(replicas=[1, 2], isr=[1, 2], leader=1, leader_epoch=3)
    assert part.update(image, min_isr=1) == "leader"
    return part


def test_a_fetch_past_the_parked_bound_answers_at_its_max_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full partition does not take another parked fetch: that one waits on its timer
    alone (an empty answer at once would have its consumer fetch again at once), is
    counted, and leaves the partition's waiters as they were."""
    monkeypatch.setattr(partitions_module, "MAX_PARKED_FETCHES", 2)
    part = _leader(tmp_path)
    metrics = BrokerMetrics()
    plan: Any = SimpleNamespace(partitions=lambda: [part], deps=SimpleNamespace(metrics=metrics))

    async def run() -> None:
        first = asyncio.ensure_future(fetch_api._wait_for_change(plan, None, 5.0))
        second = asyncio.ensure_future(fetch_api._wait_for_change(plan, None, 5.0))
        await asyncio.sleep(0)
        assert len(part.waiters) == 2
        started = time.monotonic()
        await fetch_api._wait_for_change(plan, None, 0.2)  # not parked: its timer ends it
        assert 0.15 <= time.monotonic() - started < 2.0
        assert metrics.limit_refusals == {"fetch.parked.per.partition": 1}
        assert len(part.waiters) == 2
        # The parked ones are woken by the next append, as before.
        view = memoryview(record_batch([b"x"]))
        part.append(view, validate_batches(view, 1 << 20))
        await asyncio.wait_for(asyncio.gather(first, second), 1.0)
        assert not part.waiters

    asyncio.run(run())


def test_acks_all_waits_past_the_bound_are_answered_not_confirmed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(partitions_module, "MAX_HW_WAITERS", 1)
    part = _leader(tmp_path)
    view = memoryview(record_batch([b"a"]))
    part.append(view, validate_batches(view, 1 << 20))
    end = part.log.log_end_offset

    async def run() -> None:
        parked = asyncio.ensure_future(part.wait_for_hw(end, 5.0, 3))
        await asyncio.sleep(0)
        assert len(part.hw_waiters) == 1
        # The writer answers False with REQUEST_TIMED_OUT (retriable).
        assert await asyncio.wait_for(part.wait_for_hw(end, 5.0, 3), 0.1) is False
        part.on_follower_fetch(2, end)  # the follower has it: the parked one is confirmed
        assert await asyncio.wait_for(parked, 1.0) is True

    asyncio.run(run())


def test_delete_records_waits_past_the_bound_time_out_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(partitions_module, "MAX_LOW_WATERMARK_WAITERS", 1)
    part = _leader(tmp_path)

    async def run() -> None:
        parked = asyncio.ensure_future(part.wait_low_watermark(5, 0.3, lambda _: True))
        await asyncio.sleep(0)
        assert await asyncio.wait_for(part.wait_low_watermark(5, 5.0, lambda _: True), 0.1) is False
        assert await parked is False  # its own timeout
        assert not part.low_watermark_waiters

    asyncio.run(run())


# -- ShareFetches parked on a broker ------------------------------------------------------


def test_a_share_fetch_past_the_parked_bound_is_not_parked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(share_api, "MAX_PARKED_SHARE_FETCHES", 2)
    assert share_coordinator.MAX_PARKED_SHARE_FETCHES >= 1000  # the product's bound
    collected: list[float] = []

    def collect(ctx: Any, share: Any, session: Any, req: Any) -> tuple[dict, bool, list]:
        collected.append(time.monotonic())
        return {}, False, []

    monkeypatch.setattr(share_api, "_collect", collect)
    share: Any = SimpleNamespace(
        parked={object(): 0, object(): 1},  # two fetches of other members wait
        park_order=itertools.count(2),
        refusals=Counter(),
        fetch_max_wait_s=5.0,
        stopping=lambda: False,
    )
    session: Any = SimpleNamespace(partitions={("topic id", 0)})
    req: Any = SimpleNamespace(max_wait=timedelta(milliseconds=200))

    async def run() -> dict:
        return await share_api._fetch(None, share, session, req)  # type: ignore[arg-type]

    started = time.monotonic()
    assert asyncio.run(run()) == {}  # answered with what there is, at its max wait
    assert 0.15 <= time.monotonic() - started < 2.0
    assert len(collected) == 2  # at once, and again once the wait was over
    assert share.refusals == {"share.fetch.parked": 1}
    assert len(share.parked) == 2


# -- groups -------------------------------------------------------------------------------


class _Offsets:
    def __init__(self) -> None:
        self.groups: set[str] = set()

    def has_group(self, group_id: str) -> bool:
        return group_id in self.groups

    def group_ids(self) -> list[str]:
        return sorted(self.groups)

    def write_group_records(self, group_id: str, records: list) -> int:
        self.groups.add(group_id)
        return 1

    def delete_group(self, group_id: str) -> None:
        self.groups.discard(group_id)


def _join(gc: GroupCoordinator, member_id: str, require_known: bool) -> Any:
    return gc.join(
        "g",
        member_id,
        None,
        "client",
        "/127.0.0.1",
        10_000,
        10_000,
        "consumer",
        [("range", b"")],
        require_known_member_id=require_known,
    )


def test_a_group_past_its_parked_bound_answers_join_and_sync_at_once() -> None:
    """Past max_parked_per_group requests waiting in one group, a JoinGroup gets
    GROUP_MAX_SIZE_REACHED and a SyncGroup REBALANCE_IN_PROGRESS at once; another
    group is not affected, and the bound frees as answers go out."""

    async def run() -> None:
        settings = GroupSettings(initial_rebalance_delay_ms=60_000, max_size=10)
        gc = GroupCoordinator(_Offsets(), settings)  # type: ignore[arg-type]
        assert gc.max_parked_per_group == 30
        gc.max_parked_per_group = 2
        # Two new members (JoinGroup v3: no id asked for first) wait for the delay.
        parked = [asyncio.ensure_future(_join(gc, "", False)) for _ in range(2)]
        await asyncio.sleep(0)
        assert len(gc._parked) == 2
        with pytest.raises(JoinError) as e:
            await asyncio.wait_for(_join(gc, "", False), 0.5)
        assert e.value.code == E.group_max_size_reached
        with pytest.raises(JoinError) as e:
            await asyncio.wait_for(gc.sync("g", "someone", None, 1, {}), 0.5)
        assert e.value.code == E.rebalance_in_progress
        assert gc.refusals == {"group.parked": 2}
        for task in parked:
            task.cancel()
        await asyncio.gather(*parked, return_exceptions=True)
        assert gc._parked == {} and gc._parked_in == {}
        gc.unload(lambda _: True)

    asyncio.run(run())


def test_a_stopped_group_coordinator_leaves_no_timer_and_no_waiter() -> None:
    """Broker.stop stops the group coordinator: its timers (the initial rebalance delay
    here) are cancelled and never set again, and the parked joins are cancelled, their
    bookkeeping gone (before, the timers outlived the broker)."""

    async def run() -> None:
        settings = GroupSettings(initial_rebalance_delay_ms=60_000, max_size=10)
        gc = GroupCoordinator(_Offsets(), settings)  # type: ignore[arg-type]
        parked = [asyncio.ensure_future(_join(gc, "", False)) for _ in range(2)]
        await asyncio.sleep(0)
        assert gc._timers and len(gc._parked) == 2
        await gc.stop()
        assert gc._timers == {}
        results = await asyncio.gather(*parked, return_exceptions=True)
        assert all(isinstance(r, asyncio.CancelledError) for r in results), results
        assert gc._parked == {} and gc._parked_in == {} and gc._handle_groups == {}
        # A request still arriving sets no timer again.
        late = asyncio.ensure_future(_join(gc, "", False))
        await asyncio.sleep(0)
        assert gc._timers == {}
        late.cancel()
        await asyncio.gather(late, return_exceptions=True)

    asyncio.run(run())


def test_member_ids_handed_out_and_not_joined_with_are_bounded() -> None:
    """JoinGroup v4+ without a member id gets an id to join with (MEMBER_ID_REQUIRED);
    a group holds at most group.max.size such ids at once."""

    async def run() -> None:
        settings = GroupSettings(initial_rebalance_delay_ms=0, max_size=2)
        gc = GroupCoordinator(_Offsets(), settings)  # type: ignore[arg-type]
        codes = []
        for _ in range(3):
            with pytest.raises(JoinError) as e:
                await _join(gc, "", True)
            codes.append(e.value.code)
        assert codes == [E.member_id_required, E.member_id_required, E.group_max_size_reached]
        gc.unload(lambda _: True)

    asyncio.run(run())


# -- connection caps on a real broker -----------------------------------------------------

_CORRELATION = itertools.count(1)


def _api_versions(sock: socket.socket) -> bool:
    """One ApiVersions v0 round trip; False if the broker closed the connection."""
    correlation = next(_CORRELATION)
    client = b"limits"
    body = struct.pack(">hhih", 18, 0, correlation, len(client)) + client
    try:
        sock.sendall(struct.pack(">i", len(body)) + body)
        head = _read(sock, 4)
        if head is None:
            return False
        (size,) = struct.unpack(">i", head)
        frame = _read(sock, size)
    except (ConnectionResetError, BrokenPipeError):
        return False
    if frame is None:
        return False
    assert struct.unpack_from(">ih", frame) == (correlation, 0)  # correlation, NONE
    return True


def _read(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        if not piece:
            return None
        data += piece
    return data


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def _refusals(broker: Any) -> dict:
    return request_sync(broker.http, "GET", "/api/v1/cluster")["metrics"]["limit_refusals"]


def _usable_soon(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A new connection that gets an answer, once the broker has seen a close."""
    deadline = time.monotonic() + 5
    while True:
        sock = _connect(port, source)
        if _api_versions(sock):
            return sock
        sock.close()
        assert time.monotonic() < deadline, "no connection admitted again"
        time.sleep(0.1)


def test_the_connection_past_max_connections_is_closed(broker_factory: Any) -> None:
    broker = broker_factory("--max-connections", "3")
    kept = [_connect(broker.port) for _ in range(3)]
    assert all(_api_versions(s) for s in kept)
    extra = _connect(broker.port)  # accepted by the kernel, closed by the broker
    assert not _api_versions(extra)
    extra.close()
    assert all(_api_versions(s) for s in kept)  # the three stay usable
    assert _refusals(broker) == {"max.connections": 1}
    kept.pop().close()
    kept.append(_usable_soon(broker.port))  # a closed one lets a new one in
    assert all(_api_versions(s) for s in kept)
    for s in kept:
        s.close()


def test_the_connection_past_max_connections_per_ip_is_closed(broker_factory: Any) -> None:
    broker = broker_factory("--override", "max.connections.per.ip=2")
    kept = [_connect(broker.port) for _ in range(2)]
    assert all(_api_versions(s) for s in kept)
    extra = _connect(broker.port)
    assert not _api_versions(extra)
    extra.close()
    other = _connect(broker.port, "127.0.0.2")  # another address has its own count
    assert _api_versions(other)
    assert all(_api_versions(s) for s in kept)
    assert _refusals(broker) == {"max.connections.per.ip": 1}
    kept.pop().close()
    kept.append(_usable_soon(broker.port))
    for s in [*kept, other]:
        assert _api_versions(s)
        s.close()
    with urllib.request.urlopen(f"{broker.http}/metrics", timeout=10) as r:
        scraped = r.read().decode()
    assert 'straitmq_broker_limit_refusals_total{straitmq_limit="max.connections.per.ip"}' in (
        scraped
    )
