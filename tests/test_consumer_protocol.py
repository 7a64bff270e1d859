"""KIP-848 consumer groups (group.protocol=consumer) with real clients.

The Java client 4.4 (tools/java/kafka-4.4/ConsumerProtocolClient.java, run from source
with the 4.4 jars) and confluent-kafka (librdkafka 2.x, tests/consumer_protocol_client.py)
each run as processes printing their rebalance callbacks with wall-clock times, the
records they process and the offsets they commit. A group of 3 grows to 5 and shrinks to
2 while a producer writes, one member is killed with SIGKILL while it holds partitions,
and the broker (the coordinator) restarts: it rebuilds the group from
`__consumer_offsets` and the members keep their epochs and partitions. Then: every
acknowledged record was
processed, the committed offsets (polled from outside all along) never went backwards
and end at the log end, and no partition was owned by two members at the same time.
Bad input gets Kafka's error codes; `kafka-consumer-groups.sh --describe` (4.4) shows
the group.
"""

from __future__ import annotations

import datetime
import itertools
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from client_process import ClientProcess
from cluster_support import BROKER_ARGS as CLUSTER_BROKER_ARGS
from cluster_support import cluster_factory
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kio.schema.consumer_group_describe.v1 import request as cgd
from kio.schema.consumer_group_heartbeat.v1 import request as cgh
from kio.schema.describe_groups.v5 import request as dg
from kio.schema.errors import ErrorCode as E
from kio.schema.list_groups.v5 import request as lg
from kio.schema.offset_commit.v9 import request as oc
from kio.schema.offset_fetch.v9 import request as of
from straitmq.broker.groups.offsets import OffsetStore
from test_errors import Raw
from waiting import wait_for

from bench.javatools import KAFKA44_TOOLS, REPO_ROOT, ensure_jars, java_cmd

pytestmark = pytest.mark.timeout(600)

JAVA_CLIENT = REPO_ROOT / "tools" / "java" / "kafka-4.4" / "ConsumerProtocolClient.java"
PY_CLIENT = Path(__file__).with_name("consumer_protocol_client.py")
PARTITIONS = 12
# Short sessions and heartbeats so that a killed member is fenced, and a restart
# noticed, within seconds (Kafka's defaults are 45 s and 5 s).
BROKER_ARGS = (
    "--group-consumer-session-timeout-ms",
    "6000",
    "--group-consumer-heartbeat-interval-ms",
    "500",
)


@pytest.fixture(scope="module", autouse=True)
def _jars() -> None:
    ensure_jars()


def now_ms() -> int:
    return int(time.time() * 1000)


class Member(ClientProcess):
    """One consumer process and what it printed."""

    def __init__(
        self,
        kind: str,
        name: str,
        bootstrap: str,
        group: str,
        topic: str,
        logs: Path,
        extra: tuple[str, ...] = (),
    ):
        args = [bootstrap, group, topic, name, *extra]
        if kind == "java":
            cmd = java_cmd(str(JAVA_CLIENT), args, include_classes=False, jars="4.4")
        else:
            cmd = [sys.executable, str(PY_CLIENT), *args]
        super().__init__(name, cmd, logs)
        self.ended_at: int | None = None  # stopped or SIGKILLed: ownership ends here

    def owned(self) -> set[int]:
        held: set[int] = set()
        for e in list(self.events):
            if e["ev"] == "assigned":
                held |= set(e["parts"])
            elif e["ev"] in ("revoked", "lost"):
                held -= set(e["parts"])
        return held

    def processed(self) -> int:
        return sum(len(e["recs"]) for e in list(self.events) if e["ev"] == "records")

    def last_failed_commit(self) -> str | None:
        failed = [e["error"] for e in list(self.events) if e["ev"] == "commit_failed"]
        return failed[-1] if failed else None

    def check_alive(self) -> None:
        if self.ended_at is None and (why := self.exited()):
            raise AssertionError(why)

    def stop(self) -> None:
        super().stop()
        self.ended_at = now_ms()
        assert any(e["ev"] == "closed" for e in self.events), f"{self.name} did not close"

    def kill(self) -> None:
        super().kill()
        self.ended_at = now_ms()


def ownership_intervals(members: list[Member]) -> dict[int, list[tuple[int, int, str]]]:
    """partition -> (from, to, member) from each member's own callbacks; a member killed
    or still running holds what it had until it ended (or now)."""
    out: dict[int, list[tuple[int, int, str]]] = defaultdict(list)
    for m in members:
        since: dict[int, int] = {}
        for e in m.events:
            if e["ev"] == "assigned":
                for p in e["parts"]:
                    since.setdefault(p, e["ts"])
            elif e["ev"] in ("revoked", "lost"):
                for p in e["parts"]:
                    if p in since:
                        out[p].append((since.pop(p), e["ts"], m.name))
        end = m.ended_at or now_ms()
        for p, t in since.items():
            out[p].append((t, end, m.name))
    return out


def assert_single_owner(members: list[Member]) -> None:
    for p, spans in ownership_intervals(members).items():
        spans.sort()
        for (a0, a1, am), (b0, b1, bm) in itertools.pairwise(spans):
            # The next owner's callback may run in the same millisecond the previous
            # owner's revocation returned, never before it.
            assert b0 >= a1, f"partition {p} owned by {am} [{a0}, {a1}] and {bm} [{b0}, {b1}]"


class CommitWatcher:
    """Polls the group's committed offsets (OffsetFetch v9 as an admin: no member) the
    whole time. Raw requests, not confluent-kafka's AdminClient: librdkafka 2.16 crashes
    (rd_kafka_cgrp_op on an admin handle) when a coordinator error answers its
    ListConsumerGroupOffsets, as it does while the broker restarts."""

    def __init__(self, port_of: Callable[[], int], group: str, topic: str) -> None:
        self.port_of, self.group, self.topic = port_of, group, topic
        self.seen: dict[int, list[int]] = defaultdict(list)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        wanted = (
            of.OffsetFetchRequestTopics(
                name=self.topic, partition_indexes=tuple(range(PARTITIONS))
            ),
        )
        grp = of.OffsetFetchRequestGroup(
            group_id=self.group, member_id=None, member_epoch=-1, topics=wanted
        )
        raw: Raw | None = None
        while not self._stop.wait(0.3):
            try:
                raw = raw or Raw(SimpleNamespace(port=self.port_of()))
                (g,) = raw.call(of.OffsetFetchRequest(groups=(grp,), require_stable=True)).groups
                if g.error_code != E.none:
                    continue
                for t in g.topics:
                    for part in t.partitions:
                        if part.error_code == E.none and part.committed_offset >= 0:
                            self.seen[part.partition_index].append(part.committed_offset)
            except Exception:  # the coordinator restarts or moves meanwhile
                if raw is not None:
                    raw.close()
                raw = None
        if raw is not None:
            raw.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


class Writer:
    """Produces numbered records until stopped; remembers the acknowledged ones."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
        )
        self.topic = topic
        self.acked: set[str] = set()
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _done(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked.add(msg.value().decode())
        else:
            self.errors.append(str(err))

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            for _ in range(20):
                self.producer.produce(self.topic, value=f"r{i}".encode(), on_delivery=self._done)
                i += 1
            self.producer.poll(0.02)
        self.producer.flush(60)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(90)


def group_members(port: int, group: str) -> list[Any]:
    r = Raw(SimpleNamespace(port=port))
    try:
        resp = r.call(
            cgd.ConsumerGroupDescribeRequest(
                group_ids=(group,), include_authorized_operations=False
            )
        )
    finally:
        r.close()
    (g,) = resp.groups
    return list(g.members) if g.error_code == E.none and g.group_state == "Stable" else []


@pytest.mark.parametrize("kind", ["java", "confluent"])
def test_group_grows_shrinks_loses_a_member_and_its_coordinator(broker_factory, tmp_path, kind):
    broker = broker_factory(*BROKER_ARGS)
    topic, group = f"cp-{kind}", f"cp-group-{kind}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    writer = Writer(broker.bootstrap, topic)
    watcher = CommitWatcher(lambda: broker.port, group, topic)
    members: list[Member] = []

    def start(n: int) -> None:
        for _ in range(n):
            members.append(
                Member(kind, f"{kind}-{len(members)}", broker.bootstrap, group, topic, tmp_path)
            )

    def live() -> list[Member]:
        return [m for m in members if m.ended_at is None]

    def check() -> None:
        for m in members:
            m.check_alive()

    def settled(count: int) -> bool:
        """`count` members, each owning a share, every partition owned, all consuming."""
        ms = live()
        owned = [m.owned() for m in ms]
        return (
            len(ms) == count
            and len(group_members(broker.port, group)) == count
            and all(owned)
            and set().union(*owned) == set(range(PARTITIONS))
        )

    def status() -> str:
        return str([(m.name, sorted(m.owned()), m.processed()) for m in live()])

    def progress() -> int:
        return sum(m.processed() for m in members)

    try:
        start(3)
        wait_for(
            lambda: settled(3),
            120,
            "3 members own every partition",
            0.3,
            check=check,
            detail=status,
        )
        mark = progress()
        wait_for(
            lambda: progress() > mark + 200,
            60,
            "3 members consume",
            0.2,
            check=check,
            detail=status,
        )
        start(2)
        wait_for(
            lambda: settled(5),
            120,
            "5 members own every partition",
            0.3,
            check=check,
            detail=status,
        )
        mark = progress()
        wait_for(
            lambda: progress() > mark + 200,
            60,
            "5 members consume",
            0.2,
            check=check,
            detail=status,
        )
        # Shrink to 2: two leave cleanly, one is killed while it holds partitions.
        victim = live()[1]
        assert victim.owned()
        victim.kill()
        for m in live()[:2]:
            m.stop()
        wait_for(
            lambda: settled(2),
            120,
            "2 members own every partition",
            0.3,
            check=check,
            detail=status,
        )
        mark = progress()
        wait_for(
            lambda: progress() > mark + 200,
            60,
            "2 members consume",
            0.2,
            check=check,
            detail=status,
        )
        # The coordinator restarts and rebuilds the group from `__consumer_offsets`: the
        # members go on with their epochs and partitions.
        before = described(broker.port, group)
        restarted_at = now_ms()
        broker.restart()
        mark = progress()
        wait_for(
            lambda: described(broker.port, group) == before,
            60,
            "the same group after the restart",
            0.3,
            check=check,
            ignore=(Exception,),
            detail=lambda: f"{before} -> {described(broker.port, group)}",
        )
        wait_for(
            lambda: progress() > mark + 200,
            60,
            "consuming after the restart",
            0.2,
            check=check,
            detail=status,
        )
        writer.close()
        assert not writer.errors, writer.errors[:5]
        acked = set(writer.acked)
        assert len(acked) > 1000

        assert_drained(acked, members, watcher, broker.bootstrap, topic, check)
        stopped_at = now_ms()
        for m in live():
            m.stop()
    finally:
        finish(writer, watcher, members)
    assert_monotonic_commits_and_single_owner(watcher, members)
    # The members kept their partitions through the coordinator's restart.
    moved = [
        (m.name, e)
        for m in members[-2:]
        for e in m.events
        if e["ev"] in ("assigned", "revoked", "lost") and restarted_at <= e["ts"] < stopped_at
    ]
    assert not moved, moved
    # Commits refused on the way (stale epochs, unknown members) are the client's to
    # retry; every member committed something.
    assert_every_member_committed(members)


# Classic members of each client: the Java client's default assignors pick eager
# "range"; librdkafka is set to the cooperative protocol.
CLASSIC = {
    "java": ("group.protocol=classic",),
    "confluent": ("group.protocol=classic", "partition.assignment.strategy=cooperative-sticky"),
}


@pytest.mark.parametrize("kind", ["java", "confluent"])
def test_rolling_upgrade_from_the_classic_protocol(broker_factory, tmp_path, kind):
    """Three classic consumers are replaced one by one by consumer-protocol ones, as in
    a rolling upgrade: the first new member turns the group into a KIP-848 group in which
    the classic members go on until they are replaced. Every record is processed, the
    commits never go backwards, no partition has two owners at once."""
    broker = broker_factory(*BROKER_ARGS)
    topic, group = f"up-{kind}", f"up-group-{kind}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    writer = Writer(broker.bootstrap, topic)
    watcher = CommitWatcher(lambda: broker.port, group, topic)
    members: list[Member] = []

    def start(protocol: str) -> Member:
        extra = CLASSIC[kind] if protocol == "classic" else ()
        m = Member(
            kind,
            f"{kind}-{protocol}-{len(members)}",
            broker.bootstrap,
            group,
            topic,
            tmp_path,
            extra,
        )
        members.append(m)
        return m

    def live() -> list[Member]:
        return [m for m in members if m.ended_at is None]

    def check() -> None:
        for m in members:
            m.check_alive()

    def owned_by_all(count: int) -> bool:
        owned = [m.owned() for m in live()]
        return len(owned) == count and all(owned) and set().union(*owned) == set(range(PARTITIONS))

    def status() -> str:
        return str([(m.name, sorted(m.owned()), m.processed()) for m in live()]) + str(
            described(broker.port, group)
        )

    def consuming() -> None:
        mark = sum(m.processed() for m in members)
        wait_for(
            lambda: sum(m.processed() for m in members) > mark + 200,
            60,
            "consuming",
            0.2,
            check=check,
            detail=status,
        )

    try:
        classic = [start("classic") for _ in range(3)]
        wait_for(
            lambda: owned_by_all(3),
            120,
            "3 classic members own every partition",
            0.3,
            check=check,
            detail=status,
        )
        consuming()
        for i, old in enumerate(classic):
            old.stop()
            start("consumer")
            wait_for(
                lambda: owned_by_all(3),
                120,
                "3 members own every partition",
                0.3,
                check=check,
                detail=status,
            )
            consuming()
            if i == 0:
                # One group, upgraded in place: two classic members and a new one.
                wait_for(
                    lambda: (
                        sorted(m.member_type for m in group_members(broker.port, group))
                        == [0, 0, 1]
                    ),
                    60,
                    "a mixed group",
                    0.3,
                    check=check,
                    detail=status,
                )
        # All three speak the consumer protocol now, in one KIP-848 group.
        wait_for(
            lambda: len(group_members(broker.port, group)) == 3,
            60,
            "a stable consumer group of 3",
            0.3,
            check=check,
            detail=status,
        )
        assert {m.member_type for m in group_members(broker.port, group)} == {1}
        writer.close()
        assert not writer.errors, writer.errors[:5]
        acked = set(writer.acked)

        assert_drained(acked, members, watcher, broker.bootstrap, topic, check)
        for m in live():
            m.stop()
    finally:
        finish(writer, watcher, members)
    assert_monotonic_commits_and_single_owner(watcher, members)
    assert_every_member_committed(members)


def assert_every_member_committed(members: list[Member]) -> None:
    """Every member that processed records committed. One that got none has nothing to
    commit: on a loaded machine a member can hold its partitions for a second or two,
    before the next rebalance, without its first fetch coming back (seen in CI: the
    first classic member, alone in the group for 1.4 s, processed none)."""
    silent = [
        (m.name, m.processed(), m.events[-5:])
        for m in members
        if m.processed() and not any(e["ev"] == "committed" for e in m.events)
    ]
    assert not silent, f"members that never committed (name, processed, last events): {silent}"


def finish(writer: Writer, watcher: CommitWatcher, members: list[Member]) -> None:
    """Stop producing and watching; kill what still runs (a test that failed midway)."""
    writer.close()
    watcher.close()
    for m in members:
        if m.proc.poll() is None:
            m.kill()


def assert_monotonic_commits_and_single_owner(
    watcher: CommitWatcher, members: list[Member]
) -> None:
    for p, offsets in watcher.seen.items():
        assert offsets == sorted(offsets), f"partition {p}: commits went backwards: {offsets}"
    assert_single_owner(members)


def assert_drained(
    acked: set[str],
    members: list[Member],
    watcher: CommitWatcher,
    bootstrap: str,
    topic: str,
    check: Callable[[], None],
) -> None:
    """Every acknowledged record was processed by some member, and the committed
    offsets (as the watcher polls them) reach the log end of every partition."""

    def processed() -> set[str]:
        return {
            r[2] for m in members for e in list(m.events) if e["ev"] == "records" for r in e["recs"]
        }

    wait_for(
        lambda: acked <= processed(),
        120,
        "every record processed",
        0.3,
        check=check,
        detail=lambda: f"{len(acked - processed())} missing",
    )
    ends = _end_offsets(bootstrap, topic)
    wait_for(
        lambda: all(watcher.seen[p] and watcher.seen[p][-1] == ends[p] for p in ends),
        60,
        "committed offsets reach the log end",
        0.3,
        check=check,
        detail=lambda: (
            str({p: (watcher.seen[p][-1:], ends[p]) for p in ends})
            + str([(m.name, sorted(m.owned()), m.last_failed_commit()) for m in members])
        ),
    )


def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-end-offsets"})
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
    finally:
        c.close()


# -- bad input, straight to the broker: Kafka 4.4's codes --------------------------------


def _heartbeat(group: str, member: str, epoch: int, **kw: Any) -> Any:
    fields: dict[str, Any] = {
        "group_id": group,
        "member_id": member,
        "member_epoch": epoch,
        "instance_id": None,
        "rack_id": None,
        "rebalance_timeout": datetime.timedelta(milliseconds=-1),
        "subscribed_topic_names": None,
        "subscribed_topic_regex": None,
        "server_assignor": None,
        "topic_partitions": None,
    }
    return cgh.ConsumerGroupHeartbeatRequest(**{**fields, **kw})


def _join(group: str, member: str, **kw: Any) -> Any:
    return _heartbeat(
        group,
        member,
        0,
        rebalance_timeout=datetime.timedelta(seconds=30),
        topic_partitions=(),
        **kw,
    )


def _commit(group: str, member: str, epoch: int, topic: str) -> Any:
    part = oc.OffsetCommitRequestPartition(
        partition_index=0, committed_offset=1, committed_metadata=None
    )
    return oc.OffsetCommitRequest(
        group_id=group,
        generation_id_or_member_epoch=epoch,
        member_id=member,
        topics=(oc.OffsetCommitRequestTopic(name=topic, partitions=(part,)),),
    )


def test_bad_input_gets_kafkas_codes(broker_factory):
    broker = broker_factory(*BROKER_ARGS)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("bad-t", 2, 1)])["bad-t"].result(30)
    r = Raw(broker)
    g, m = "bad-group", str(uuid.uuid4())
    try:
        joined = r.call(_join(g, m, subscribed_topic_names=("bad-t",)))
        assert joined.error_code == E.none and joined.member_epoch >= 1
        epoch = joined.member_epoch
        # An unknown server assignor.
        resp = r.call(
            _join(
                g,
                str(uuid.uuid4()),
                subscribed_topic_names=("bad-t",),
                server_assignor="sticky-nope",
            )
        )
        assert resp.error_code == E.unsupported_assignor
        # An invalid regular expression: refused, and the member and the group unharmed.
        resp = r.call(_heartbeat(g, m, epoch, subscribed_topic_regex="bad-(t"))
        assert resp.error_code == E.invalid_regular_expression
        assert "bad-(t" in resp.error_message and "missing )" in resp.error_message
        # RE2 has no lookaround (Java's java.util.regex has): refused the same way.
        resp = r.call(_heartbeat(g, m, epoch, subscribed_topic_regex="(?!x)bad-t"))
        assert resp.error_code == E.invalid_regular_expression
        resp = r.call(_heartbeat(g, m, epoch, topic_partitions=joined.assignment.topic_partitions))
        assert resp.error_code == E.none and resp.member_epoch == epoch
        # Wrong member epochs and unknown members.
        assert r.call(_heartbeat(g, m, epoch + 5)).error_code == E.fenced_member_epoch
        assert r.call(_heartbeat(g, "ghost", 1)).error_code == E.unknown_member_id
        assert r.call(_heartbeat(g, "", 1)).error_code == E.invalid_request  # no member id
        resp = r.call(_heartbeat(g, str(uuid.uuid4()), 0))  # a join without its fields
        assert resp.error_code == E.invalid_request
        # OffsetCommit v9 with member epochs.
        commit = r.call(_commit(g, m, epoch, "bad-t"))
        assert commit.topics[0].partitions[0].error_code == E.none
        stale = r.call(_commit(g, m, epoch - 1, "bad-t"))
        assert stale.topics[0].partitions[0].error_code == E.stale_member_epoch
        ghost = r.call(_commit(g, "ghost", epoch, "bad-t"))
        assert ghost.topics[0].partitions[0].error_code == E.unknown_member_id
        nowhere = r.call(_commit("no-such-group", "x", 3, "bad-t"))
        assert nowhere.topics[0].partitions[0].error_code == E.group_id_not_found

        # OffsetFetch v9: the member's epoch is checked too; an admin (no member) reads.
        def fetch(member: str | None, ep: int) -> Any:
            grp = of.OffsetFetchRequestGroup(
                group_id=g, member_id=member, member_epoch=ep, topics=None
            )
            return r.call(of.OffsetFetchRequest(groups=(grp,), require_stable=True)).groups[0]

        assert fetch(m, epoch).error_code == E.none
        assert fetch(m, epoch + 1).error_code == E.stale_member_epoch
        assert fetch("ghost", epoch).error_code == E.unknown_member_id
        admin_view = fetch(None, -1)
        assert admin_view.error_code == E.none
        assert admin_view.topics[0].partitions[0].committed_offset == 1
        # ListGroups v5 with group types; DescribeGroups answers a consumer group as Dead;
        # ConsumerGroupDescribe refuses an unknown group.
        listed = r.call(lg.ListGroupsRequest(states_filter=(), types_filter=("Consumer",)))
        assert [(x.group_id, x.group_type, x.group_state) for x in listed.groups] == [
            (g, "consumer", "Stable")
        ]
        classic_only = r.call(lg.ListGroupsRequest(states_filter=(), types_filter=("classic",)))
        assert g not in [x.group_id for x in classic_only.groups]
        (described,) = r.call(
            dg.DescribeGroupsRequest(groups=(g,), include_authorized_operations=False)
        ).groups
        assert (described.error_code, described.group_state, described.members) == (
            E.none,
            "Dead",
            (),
        )
        resp = r.call(
            cgd.ConsumerGroupDescribeRequest(
                group_ids=(g, "nope"), include_authorized_operations=False
            )
        )
        mine, nope = resp.groups
        assert mine.error_code == E.none and mine.group_state == "Stable"
        (member,) = mine.members
        assert member.member_id == m and member.member_epoch == epoch and member.member_type == 1
        assert {tp.topic_name for tp in member.assignment.topic_partitions} == {"bad-t"}
        assert (nope.error_code, nope.error_message) == (
            E.group_id_not_found,
            "Group nope not found.",
        )
        # Its members are counted in the group metrics, as the classic ones are.
        metrics = urllib.request.urlopen(f"{broker.http}/metrics", timeout=10).read().decode()
        assert any(
            line.startswith("straitmq_consumer_group_members{")
            and f'_name="{g}"' in line
            and line.rstrip().endswith(" 1.0")
            for line in metrics.splitlines()
        ), [ln for ln in metrics.splitlines() if "consumer_group_members" in ln]
    finally:
        r.close()


def test_regex_subscription_picks_up_new_topics(broker_factory):
    """A member subscribed by RE2 expression gets the matching topics, and a topic created
    later that matches joins its assignment (the metadata changed)."""
    broker = broker_factory(*BROKER_ARGS)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for t in ("rx-a", "rx-b", "other"):
        admin.create_topics([NewTopic(t, 2, 1)])[t].result(30)
    r = Raw(broker)
    g, m = "rx-group", str(uuid.uuid4())
    ids: dict[Any, str] = {}
    try:
        resp = r.call(_join(g, m, subscribed_topic_names=(), subscribed_topic_regex="rx-.*"))
        assert resp.error_code == E.none
        epoch, owned = resp.member_epoch, resp.assignment.topic_partitions

        def names() -> set[str]:
            described = r.call(
                cgd.ConsumerGroupDescribeRequest(
                    group_ids=(g,), include_authorized_operations=False
                )
            ).groups[0]
            (mem,) = described.members
            assert mem.subscribed_topic_regex == "rx-.*"
            for tp in mem.assignment.topic_partitions:
                ids[tp.topic_id] = tp.topic_name
            return {tp.topic_name for tp in mem.assignment.topic_partitions}

        assert names() == {"rx-a", "rx-b"}
        admin.create_topics([NewTopic("rx-c", 3, 1)])["rx-c"].result(30)
        admin.create_topics([NewTopic("xrx-d", 1, 1)])["xrx-d"].result(30)  # not in full

        def beat() -> set[str]:
            nonlocal epoch, owned
            resp = r.call(_heartbeat(g, m, epoch, topic_partitions=owned))
            assert resp.error_code == E.none
            epoch = resp.member_epoch
            if resp.assignment is not None:
                owned = resp.assignment.topic_partitions
            return names()

        wait_for(lambda: beat() == {"rx-a", "rx-b", "rx-c"}, 30, "rx-c joins", 0.5)
        assert sum(len(tp.partitions) for tp in owned) == 7
    finally:
        r.close()


def test_kafka_consumer_groups_describe_shows_a_consumer_protocol_group(broker_factory, tmp_path):
    broker = broker_factory(*BROKER_ARGS)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("cli-t", 4, 1)])["cli-t"].result(30)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(40):
        p.produce("cli-t", value=f"v{i}".encode(), partition=i % 4)
    p.flush(30)
    members = [
        Member("java", f"cli-{i}", broker.bootstrap, "cli-group", "cli-t", tmp_path)
        for i in range(2)
    ]
    try:
        wait_for(
            lambda: (
                len(group_members(broker.port, "cli-group")) == 2
                and sum(m.processed() for m in members) >= 40
            ),
            120,
            "2 members consume",
            0.3,
            check=lambda: [m.check_alive() for m in members],
            detail=lambda: str([(m.name, m.owned(), m.processed()) for m in members]),
        )

        def tool(*args: str) -> str:
            res = subprocess.run(
                java_cmd(
                    KAFKA44_TOOLS["kafka-consumer-groups"],
                    ["--bootstrap-server", broker.bootstrap, *args],
                    jars="4.4",
                ),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert res.returncode == 0, res.stderr[-3000:]
            return res.stdout

        def rows(out: str) -> list[list[str]]:
            lines = [ln.split() for ln in out.splitlines() if ln.strip()]
            header = next(i for i, ln in enumerate(lines) if ln and ln[0] == "GROUP")
            return [lines[header], *lines[header + 1 :]]

        def described() -> list[list[str]]:
            return rows(tool("--describe", "--group", "cli-group"))

        # Committed offsets, lag and owners: every partition at its end (10 each), lag 0,
        # owned by one of the two members.
        def caught_up() -> bool:
            header, *body = described()
            cols = {name: i for i, name in enumerate(header)}
            return len(body) == 4 and all(
                r[cols["CURRENT-OFFSET"]] == "10"
                and r[cols["LAG"]] == "0"
                and r[cols["CONSUMER-ID"]] != "-"
                for r in body
            )

        wait_for(caught_up, 60, "describe shows the group caught up", 1)
        header, *body = rows(tool("--describe", "--group", "cli-group", "--members"))
        assert "#PARTITIONS" in header and len(body) == 2
        assert sorted(int(r[header.index("#PARTITIONS")]) for r in body) == [2, 2]
        header, *body = rows(tool("--describe", "--group", "cli-group", "--state"))
        assert body[0][header.index("STATE")] == "Stable"
        assert "uniform" in body[0]  # ASSIGNMENT-STRATEGY: the server's assignor
        listed = tool("--list", "--type", "consumer")
        assert "cli-group" in listed.split()
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.stop()


@pytest.fixture
def cluster(tmp_path):
    yield from cluster_factory(tmp_path)


def described(port: int, group: str) -> dict[str, tuple[int, list[int]]]:
    """ConsumerGroupDescribe of a Stable group: member id -> (member epoch, partitions)."""
    return {
        m.member_id: (
            m.member_epoch,
            sorted(p for tp in m.assignment.topic_partitions for p in tp.partitions),
        )
        for m in group_members(port, group)
    }


def test_coordinator_broker_killed_in_a_cluster(cluster, tmp_path):
    """3 controllers + 3 brokers: the broker coordinating a group of 3 (librdkafka)
    members is killed with SIGKILL while they consume; the offsets partition gets a new
    leader, which rebuilds the group from its records in `__consumer_offsets`: the
    members go on with the same member ids, epochs and assignments (ConsumerGroupDescribe
    before and after), no partition lost or revoked; the killed broker comes back.
    Every acknowledged record processed, commits monotonic, one owner per partition."""
    c = cluster(broker_args=[*CLUSTER_BROKER_ARGS, *BROKER_ARGS])
    topic, group = "cp-cluster", "cp-cluster-group"
    c.create_topic(topic, partitions=PARTITIONS, rf=3, min_isr=2)
    offsets_partition = OffsetStore(16).partition_for(group)

    def coordinator() -> int:
        return c.leader_of("__consumer_offsets", offsets_partition, exclude=tuple(dead))

    def coordinator_port() -> int:
        return c.brokers[coordinator()].kafka_port

    dead: list[int] = []
    writer = Writer(c.bootstrap, topic)
    members = [
        Member("confluent", f"cl-{i}", c.bootstrap, group, topic, tmp_path) for i in range(3)
    ]
    watcher = CommitWatcher(coordinator_port, group, topic)

    def check() -> None:
        for m in members:
            m.check_alive()

    def status() -> str:
        return str([(m.name, sorted(m.owned()), m.processed()) for m in members])

    def settled() -> bool:
        owned = [m.owned() for m in members]
        try:
            described = group_members(coordinator_port(), group)
        except Exception:
            return False
        return len(described) == 3 and all(owned) and set().union(*owned) == set(range(PARTITIONS))

    def progress() -> int:
        return sum(m.processed() for m in members)

    try:
        wait_for(settled, 120, "3 members own every partition", 0.3, check=check, detail=status)
        mark = progress()
        wait_for(lambda: progress() > mark + 200, 60, "consuming", 0.2, check=check, detail=status)
        victim = coordinator()
        before = described(coordinator_port(), group)
        assert len(before) == 3, before
        c.brokers[victim].kill9()
        killed_at = now_ms()
        dead.append(victim)
        wait_for(lambda: coordinator() != victim, 60, "a new coordinator", 0.3, ignore=(Exception,))
        # The new coordinator rebuilt the group: the same members, epochs, assignments.
        after: dict = {}

        def same_group() -> bool:
            nonlocal after
            after = described(coordinator_port(), group)
            return after == before

        wait_for(
            same_group,
            60,
            "the new coordinator describes the same group",
            0.3,
            check=check,
            ignore=(Exception,),
            detail=lambda: f"{before} -> {after}",
        )
        mark = progress()
        wait_for(
            lambda: progress() > mark + 200, 60, "consuming on", 0.2, check=check, detail=status
        )
        # The members heard of no change: nothing lost, revoked or assigned since.
        moved = [
            (m.name, e)
            for m in members
            for e in list(m.events)
            if e["ev"] in ("assigned", "revoked", "lost") and e["ts"] >= killed_at
        ]
        assert not moved, moved
        assert described(coordinator_port(), group) == before
        c.brokers[victim].start()
        dead.clear()
        c.wait_isr(topic, 3)
        writer.close()
        assert not writer.errors, writer.errors[:5]
        acked = set(writer.acked)
        assert len(acked) > 1000

        assert_drained(acked, members, watcher, c.bootstrap, topic, check)
        # Through the killed broker's return too (whichever broker coordinates now).
        assert described(coordinator_port(), group) == before
        stopped_at = now_ms()
        for m in members:
            m.stop()
    finally:
        finish(writer, watcher, members)
    assert_monotonic_commits_and_single_owner(watcher, members)
    moved = [
        (m.name, e)
        for m in members
        for e in m.events
        if e["ev"] in ("assigned", "revoked", "lost") and killed_at <= e["ts"] < stopped_at
    ]
    assert not moved, moved


def test_librdkafka_regex_subscription_follows_new_topics(broker_factory):
    """librdkafka sends a `^`-subscription as SubscribedTopicRegex: the broker matches it
    (RE2) and a matching topic created while the consumer runs is assigned to it."""
    from confluent_kafka import Consumer

    broker = broker_factory(*BROKER_ARGS)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for t in ("cpx-a", "cpx-b", "not-cpx"):
        admin.create_topics([NewTopic(t, 2, 1)])[t].result(30)
    assigned: set[tuple[str, int]] = set()
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "cpx-group",
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe(
            ["^cpx-.*"],
            on_assign=lambda c, ps: assigned.update((p.topic, p.partition) for p in ps),
            on_revoke=lambda c, ps: assigned.difference_update((p.topic, p.partition) for p in ps),
        )

        def poll_until(want: set[tuple[str, int]]) -> bool:
            consumer.poll(0.2)
            return assigned == want

        first = {(t, p) for t in ("cpx-a", "cpx-b") for p in range(2)}
        wait_for(
            lambda: poll_until(first),
            60,
            "cpx-a and cpx-b assigned",
            0,
            detail=lambda: str(assigned),
        )
        # The broker matched it: the member's subscription is the expression itself.
        (member,) = group_members(broker.port, "cpx-group")
        assert member.subscribed_topic_regex is not None
        assert "cpx-" in member.subscribed_topic_regex
        admin.create_topics([NewTopic("cpx-c", 3, 1)])["cpx-c"].result(30)
        more = first | {("cpx-c", p) for p in range(3)}
        wait_for(
            lambda: poll_until(more), 60, "cpx-c assigned too", 0, detail=lambda: str(assigned)
        )
    finally:
        consumer.close()


def test_empty_group_removed_once_its_offsets_expire(broker_factory):
    """offsets.retention.minutes (here 0.02 = 1.2 s, checked every 300 ms): a KIP-848
    group whose member left loses its offsets a retention after they were committed (as
    Kafka 4 counts for these groups) and is removed (ListGroups no longer shows it,
    OffsetFetch finds nothing); a group with a member heartbeating all along keeps its
    offsets."""
    broker = broker_factory(
        *BROKER_ARGS,
        "--offsets-retention-minutes",
        "0.02",
        "--offsets-retention-check-interval-ms",
        "300",
    )
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("exp-t", 1, 1)])["exp-t"].result(30)
    r = Raw(broker)

    def listed() -> set[str]:
        resp = r.call(lg.ListGroupsRequest(states_filter=(), types_filter=()))
        return {g.group_id for g in resp.groups}

    def committed(group: str) -> int:
        topics = (of.OffsetFetchRequestTopics(name="exp-t", partition_indexes=(0,)),)
        grp = of.OffsetFetchRequestGroup(
            group_id=group, member_id=None, member_epoch=-1, topics=topics
        )
        (g,) = r.call(of.OffsetFetchRequest(groups=(grp,), require_stable=False)).groups
        return g.topics[0].partitions[0].committed_offset

    try:
        members = {}
        for g in ("exp-gone", "exp-live"):
            m = str(uuid.uuid4())
            joined = r.call(_join(g, m, subscribed_topic_names=("exp-t",)))
            assert joined.error_code == E.none
            commit = r.call(_commit(g, m, joined.member_epoch, "exp-t"))
            assert commit.topics[0].partitions[0].error_code == E.none
            members[g] = (m, joined.member_epoch, joined.assignment.topic_partitions)
        m = members["exp-gone"][0]
        assert r.call(_heartbeat("exp-gone", m, -1)).error_code == E.none  # leaves
        assert {"exp-gone", "exp-live"} <= listed() and committed("exp-gone") == 1
        left_at = time.monotonic()

        def live_beat() -> bool:
            m, epoch, owned = members["exp-live"]
            resp = r.call(_heartbeat("exp-live", m, epoch, topic_partitions=owned))
            assert resp.error_code == E.none
            return "exp-gone" not in listed()

        wait_for(live_beat, 30, "the empty group is removed", 0.3)
        assert time.monotonic() - left_at >= 1.0  # not before its retention
        assert committed("exp-gone") == -1
        for _ in range(10):  # a group with a member keeps its offsets however old
            live_beat()
            time.sleep(0.3)
        assert "exp-live" in listed() and committed("exp-live") == 1
    finally:
        r.close()
