"""A broken invariant stops the process: in a real Python process (also under `python
-O`, which strips `assert`), the Raft core, the group state machine, a share-partition
and a partition log are built, corrupted and stepped; the process must end with
EXIT_INVARIANT at once, its log naming the invariant and its facts, and nothing after
the step may run (no except clause or finally swallows it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from straitmq import invariants
from straitmq.invariants import EXIT_INVARIANT, InvariantBroken

PRELUDE = """
import sys
from straitmq import logs
logs.setup("warning")
"""
# Each script ends in a step that must not return; the except and finally clauses around
# it stand for the handlers on the way in a broker (a connection's, a task's).
STEP = """
try:
    step()
except BaseException:
    print("swallowed", flush=True)
finally:
    print("finally ran", flush=True)
print("went on", flush=True)
"""

SCRIPTS = {
    "raft": (
        "a committed entry is never truncated",
        """
import random
from straitmq.raft.core import RaftConfig, RaftNode
from straitmq.raft.messages import BeginQuorumEpoch, Entry, FetchResponse
from straitmq.raft.storage import MemoryStorage

follower = RaftNode(1, frozenset({0, 1, 2}), MemoryStorage(), RaftConfig(), random.Random(1), 0)
follower.step(BeginQuorumEpoch(0, 1, 1, 0), 10)
follower.take_messages()
entries = (Entry(1, None), Entry(1, "a"))
follower.step(FetchResponse(0, 1, 1, 0, None, 0, entries, high_watermark=2), 20)
(fetch,) = follower.take_messages()
# A leader that says the follower diverges below what it already committed.
bogus = FetchResponse(
    0, 1, 1, 0, None, fetch.fetch_offset, diverging_epoch=0, diverging_end_offset=0,
    last_fetched_epoch=fetch.last_fetched_epoch,
)
def step():
    follower.step(bogus, 30)
""",
    ),
    "groups": (
        "every timer kind is handled",
        """
from straitmq.broker.groups.messages import JoinRequest, TimerKey
from straitmq.broker.groups.state_machine import GroupSettings, GroupStateMachine

class NoOffsets:
    def has_group(self, group_id):
        return False
    def group_ids(self):
        return []

machine = GroupStateMachine(GroupSettings(), NoOffsets())
join = JoinRequest("g", "", None, "c", "h", 10_000, 10_000, "consumer", (("range", b""),), False)
machine.join(1, join, 0)
assert "g" in machine.groups
machine._timers[TimerKey("bogus", "g")] = 100  # corrupt: a timer of no known kind
def step():
    machine.tick(200)
""",
    ),
    "share": (
        "new batches follow next_offset",
        """
from straitmq.broker.share.partition import SharePartition

sp = SharePartition(0)
sp.acquire("m1", 0, 100, [(0, 9)])
sp.next_offset = 5  # corrupt: the in-flight ranges already reach 10
def step():
    sp.acquire("m2", 1, 100, [(10, 19)])
""",
    ),
    "storage": (
        "a batch is appended at or after the log end and offsets only grow",
        """
import sys
from straitmq.broker.record_codec import build_batch
from straitmq.broker.records import validate_batches
from straitmq.broker.storage.log import LogConfig, PartitionLog

plog = PartitionLog(sys.argv[1], LogConfig())
data = memoryview(build_batch([(None, b"v", [])], 1_700_000_000_000))
plog.append(data, validate_batches(data, 1 << 20), leader_epoch=0)
batches = validate_batches(data, 1 << 20)
batches[0].last_offset_delta = -1  # corrupt: a validated batch that ends before it starts
def step():
    plog.append(data, batches, leader_epoch=0)
""",
    ),
}


def _run(tmp_path: Path, body: str, *flags: str) -> subprocess.CompletedProcess[str]:
    script = PRELUDE + textwrap.dedent(body) + STEP
    return subprocess.run(
        [sys.executable, *flags, "-c", script, str(tmp_path / "log")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def _broken_lines(stderr: str) -> list[dict]:
    out = []
    for line in stderr.splitlines():
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(entry, dict) and "invariant" in entry:
            out.append(entry)
    return out


@pytest.mark.parametrize("flags", [(), ("-O",)], ids=["plain", "optimized"])
@pytest.mark.parametrize("machine", sorted(SCRIPTS))
def test_a_broken_invariant_stops_the_process(
    tmp_path: Path, machine: str, flags: tuple[str, ...]
) -> None:
    invariant, body = SCRIPTS[machine]
    done = _run(tmp_path, body, *flags)
    assert done.returncode == EXIT_INVARIANT, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == "", "something ran after the invariant broke"
    (entry,) = _broken_lines(done.stderr)
    assert entry["invariant"] == invariant
    assert entry["level"] == "critical" and entry["exit_code"] == EXIT_INVARIANT
    assert entry["facts"], "the log says what was seen"
    assert f"invariant broken: {invariant}" in entry["msg"]
    assert ", in step" in entry["stack"], "the log says where it broke"


def test_the_scripts_run_clean_without_the_corruption(tmp_path: Path) -> None:
    """The scripts themselves are sound: what stops them is the corruption."""
    for machine, (_, body) in SCRIPTS.items():
        sound = "\n".join(line for line in body.splitlines() if "# corrupt" not in line)
        if machine == "raft":  # the bogus answer is the corruption there
            sound = sound.replace("follower.step(bogus, 30)", "follower.take_messages()")
        (tmp_path / machine).mkdir()
        done = _run(tmp_path / machine, sound)
        assert done.returncode == 0, (machine, done.stderr)
        assert done.stdout == "finally ran\nwent on\n", machine


def test_within_raising_a_broken_invariant_raises_and_is_recorded() -> None:
    """The simulations' and tests' mode: raised where it broke, and recorded even if an
    except clause swallows it; nested blocks record only their own."""
    with invariants.raising() as outer:
        with invariants.raising() as inner:
            try:
                invariants.check(1 > 2, "one is more than two", one=1, two=[2])
            except InvariantBroken as e:
                assert e.invariant == "one is more than two"
                assert e.facts == {"one": 1, "two": "[2]"}
        invariants.check(True, "never broken")
        with pytest.raises(InvariantBroken, match="invariant broken: outer"):
            invariants.broken("outer")
    assert [e.invariant for e in inner] == ["one is more than two"]
    assert [e.invariant for e in outer] == ["outer"]
