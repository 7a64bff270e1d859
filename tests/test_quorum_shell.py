"""The asyncio shell around the Raft core: a broken invariant stops the process on every
path into the node (a tick, a peer's request, a proposal), and metadata waits resolve
when entries are applied or fail with a clear error when they are not."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiohttp import web
from kio.schema.errors import ErrorCode
from straitmq.cli.local_cluster import free_port
from straitmq.controller.errors import ControllerError
from straitmq.controller.http_api import add_routes
from straitmq.controller.quorum import Quorum
from straitmq.raft.core import RaftConfig
from straitmq.raft.messages import VoteRequest, to_dict

from straitmq import invariants
from straitmq.invariants import InvariantBroken

CFG = RaftConfig(election_timeout_ms=50, fetch_timeout_ms=100)


@pytest.fixture
def broken() -> Iterator[list[InvariantBroken]]:
    """What the shared check saw: here it raises, in a product process it stops the
    process (tests/test_invariants.py runs that in real processes)."""
    with invariants.raising() as seen:
        yield seen


async def _leader(tmp_path: Path) -> Quorum:
    q = Quorum(1, {1: "http://127.0.0.1:9"}, str(tmp_path), CFG)
    await q.start()
    while not q.is_leader:
        await q.changed()
    return q


async def _close(q: Quorum) -> None:
    """What the process exit would have released."""
    assert q._session is not None
    await q._session.close()


def _broken(*_: object) -> None:
    raise AssertionError("made up by the test")  # a plain assert of the core that failed


def _stopped(seen: list[InvariantBroken]) -> None:
    (e,) = seen
    assert e.invariant == "the raft core's assertions hold"
    assert e.facts == {"node": 1, "error": "made up by the test"}


def test_invariant_broken_in_a_peer_request_stops_the_process(tmp_path, broken) -> None:
    async def go() -> None:
        q = await _leader(tmp_path)
        q._ticker.cancel()  # only the request path may reach the broken node
        q.node.step = _broken  # type: ignore[method-assign]
        vote = VoteRequest(src=2, dst=1, epoch=9, candidate_id=2, last_epoch=0, last_offset=0)
        with pytest.raises(InvariantBroken):
            await q.handle_request(to_dict(vote))
        await _close(q)

    asyncio.run(go())
    _stopped(broken)


def test_invariant_broken_in_a_proposal_stops_the_process(tmp_path, broken) -> None:
    async def go() -> None:
        q = await _leader(tmp_path)
        q._ticker.cancel()
        q.node.propose = _broken  # type: ignore[method-assign]
        with pytest.raises(InvariantBroken):
            await q.propose([{"type": "cluster", "cluster_id": "x"}])
        await _close(q)

    asyncio.run(go())
    _stopped(broken)


def test_invariant_broken_in_a_tick_stops_the_process(tmp_path, broken) -> None:
    async def go() -> None:
        q = await _leader(tmp_path)
        q.node.tick = _broken  # type: ignore[method-assign]
        with pytest.raises(InvariantBroken):
            await q._ticker
        await _close(q)

    asyncio.run(go())
    _stopped(broken)


def test_an_invariant_of_the_core_reaches_the_shared_check(tmp_path, broken) -> None:
    """The core's own checks are not re-wrapped by the shell: the invariant that broke is
    the one named."""

    async def go() -> None:
        q = await _leader(tmp_path)
        q._ticker.cancel()
        with pytest.raises(InvariantBroken):
            q._advance(lambda: q.node._set_hw(q.node.high_watermark - 1))
        await _close(q)

    asyncio.run(go())
    (e,) = broken
    assert e.invariant == "the high watermark never decreases"


def test_a_leader_that_stops_has_handed_over_when_stop_returns(tmp_path) -> None:
    """Stopping a leader sends EndQuorumEpoch to the other voters and returns once they
    have answered it (bounded by the request timeout), not after a guessed pause: the
    follower already knows the leader is gone, and campaigns at once."""

    async def go() -> None:
        ports = {1: free_port(), 2: free_port()}
        voters = {i: f"http://127.0.0.1:{port}" for i, port in ports.items()}
        quorums: dict[int, Quorum] = {}
        runners: list[web.AppRunner] = []
        for i, port in ports.items():
            q = quorums[i] = Quorum(i, voters, str(tmp_path / str(i)), CFG)
            app = web.Application()
            add_routes(app, SimpleNamespace(quorum=q, active=None))
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
        try:
            for q in quorums.values():
                await q.start()
            while not any(q.is_leader for q in quorums.values()):
                await quorums[1].changed()
            leader = next(q for q in quorums.values() if q.is_leader)
            follower = next(q for q in quorums.values() if q is not leader)
            while follower.leader_id != leader.node_id:
                await follower.changed()
            await leader.stop()
            assert follower.leader_id is None, follower.status()
        finally:
            for runner in runners:  # first: nothing reaches a stopped quorum
                await runner.cleanup()
            for q in quorums.values():
                if not q.closed:
                    await q.stop(resign=False)

    asyncio.run(go())


def test_wait_applied_resolves_on_apply_and_times_out_with_a_reason(tmp_path) -> None:
    async def go() -> None:
        q = await _leader(tmp_path)
        try:
            target = q.node.log_end_offset  # the next entry
            waiter = asyncio.ensure_future(q.wait_applied(target, 5.0))
            await asyncio.sleep(0)
            assert not waiter.done()
            offset = await q.propose([{"type": "cluster", "cluster_id": "abc"}])
            assert offset == target
            await asyncio.wait_for(waiter, 5.0)
            with pytest.raises(ControllerError) as e:
                await q.wait_applied(q.image.offset + 100, 0.05)
            assert e.value.code == ErrorCode.request_timed_out
            assert "not" in e.value.message and "quorum" in e.value.message
        finally:
            await q.stop()

    asyncio.run(go())


def test_a_large_commit_is_applied_in_slices_that_let_the_loop_serve(tmp_path) -> None:
    """Entries committed together (a broker catching up on thousands of topic records)
    are applied in order, each whole, but in slices of the event loop: other work runs
    between them, so a broker's Kafka listener is not stalled for the whole catch-up."""

    async def go() -> None:
        q = await _leader(tmp_path)
        events: list[tuple[str, int]] = []

        def slow_listener(offset: int, records: list, reset: bool) -> None:
            # The image a listener sees always ends at the entry it is told about.
            assert q.image.offset == offset
            events.append(("apply", offset))
            time.sleep(0.01)  # 30 entries: far more than one slice of the loop

        async def probe() -> None:
            while True:
                events.append(("loop", 0))
                await asyncio.sleep(0)

        try:
            q.listeners.append(slow_listener)
            prober = asyncio.ensure_future(probe())
            # Appended without a yield in between: the first entry goes to disk alone,
            # the other 29 in one write, so they commit in one go.
            dones = [q.append([{"type": "cluster", "cluster_id": f"c{i}"}])[1] for i in range(30)]
            await asyncio.wait_for(asyncio.gather(*dones), 10.0)
            prober.cancel()
            applied = [o for kind, o in events if kind == "apply"]
            assert applied == sorted(applied) and len(applied) == 30
            first, last = (
                i
                for i, e in enumerate(events)
                if e[0] == "apply" and e[1] in (applied[1], applied[-1])
            )
            between = [e for e in events[first:last] if e[0] == "loop"]
            assert between, "the loop never ran while 29 committed entries were applied"
        finally:
            await q.stop()

    asyncio.run(go())
