"""Share groups (KIP-932): the share-partition state and the share-group membership as
sans-IO units (milliseconds), the four APIs on the wire against a real broker, and the
Java KafkaShareConsumer (kafka-clients 4.4, tools/java/kafka-4.4/ShareConsumerClient.java).
"""

from __future__ import annotations

import itertools
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from client_process import ClientProcess
from kio.schema.errors import ErrorCode as E
from kio.schema.share_acknowledge.v1 import request as sa
from kio.schema.share_fetch.v1 import request as sf
from kio.schema.share_group_describe.v1 import request as sgd
from kio.schema.share_group_heartbeat.v1 import request as sgh
from straitmq.broker.groups.share_group import ShareGroupStateMachine, ShareSettings, assign
from straitmq.broker.share.partition import (
    ACCEPT,
    ACKNOWLEDGED,
    ACQUIRED,
    ARCHIVED,
    AVAILABLE,
    REJECT,
    RELEASE,
    InvalidRecordState,
    SharePartition,
)
from straitmq.broker.share.sessions import ShareState
from test_errors import Raw
from waiting import wait_for

from bench.javatools import REPO_ROOT, ensure_jars, java_cmd
from straitmq.admin_client import request_sync

pytestmark = pytest.mark.timeout(600)

JAVA_CLIENT = REPO_ROOT / "tools" / "java" / "kafka-4.4" / "ShareConsumerClient.java"


# -- the share-partition state, sans-IO ------------------------------------------------------


def batches(*spans: tuple[int, int]) -> list[tuple[int, int]]:
    return list(spans)


def test_acquire_whole_batches_up_to_max_records_then_accept_moves_the_spso():
    sp = SharePartition(10, lock_duration_ms=1000)
    got = sp.acquire("m1", 0, 15, batches((10, 19), (20, 29), (30, 39)))
    # A soft limit: the second batch is taken whole, the third is left.
    assert [(a.first, a.last, a.delivery_count) for a in got] == [(10, 19, 1), (20, 29, 1)]
    assert sp.next_offset == 30 and sp.spso == 10
    assert sp.state_of(25) == (ACQUIRED, 1, "m1")
    sp.acknowledge("m1", 20, 29, [ACCEPT])
    assert sp.spso == 10, "the SPSO waits for the first batch"
    sp.acknowledge("m1", 10, 19, [ACCEPT])
    assert sp.spso == 30 and sp.ranges == [] and sp.state_of(12)[0] == ACKNOWLEDGED
    sp.check()


def test_lock_timeout_makes_records_available_to_another_member():
    sp = SharePartition(0, lock_duration_ms=1000)
    sp.acquire("m1", 0, 100, batches((0, 4)))
    assert sp.acquire("m2", 500, 100, []) == [], "still locked by m1"
    assert sp.next_deadline() == 1000
    got = sp.acquire("m2", 1000, 100, [])
    assert [(a.first, a.last, a.delivery_count) for a in got] == [(0, 4, 2)]
    with pytest.raises(InvalidRecordState):
        sp.acknowledge("m1", 0, 4, [ACCEPT])  # m1's lock is gone
    sp.acknowledge("m2", 0, 4, [ACCEPT])
    assert sp.spso == 5
    sp.check()


def test_release_redelivers_reject_archives_and_per_record_types_split_ranges():
    sp = SharePartition(0)
    sp.acquire("m1", 0, 100, batches((0, 9)))
    # One type per record: 0-2 accepted, 3 rejected, 4-9 released.
    sp.acknowledge("m1", 0, 9, [ACCEPT] * 3 + [REJECT] + [RELEASE] * 6)
    assert sp.spso == 4, "accepted and rejected records at the start are done"
    assert sp.state_of(3)[0] == ACKNOWLEDGED  # before the SPSO: done
    assert sp.state_of(4) == (AVAILABLE, 1, None)
    got = sp.acquire("m2", 1, 100, [])
    assert [(a.first, a.last, a.delivery_count) for a in got] == [(4, 9, 2)]
    sp.acknowledge("m2", 6, 6, [REJECT])  # part of an acquired range
    assert sp.state_of(6)[0] == ARCHIVED and sp.state_of(5) == (ACQUIRED, 2, "m2")
    sp.acknowledge("m2", 4, 5, [ACCEPT])
    sp.acknowledge("m2", 7, 9, [ACCEPT])
    assert sp.spso == 10 and not sp.ranges
    sp.check()


def test_delivery_limit_archives_records_released_or_timed_out_too_often():
    sp = SharePartition(0, lock_duration_ms=100, delivery_limit=3)
    sp.acquire("m", 0, 10, batches((0, 1)))
    sp.acknowledge("m", 0, 1, [RELEASE])  # delivery 1
    sp.acquire("m", 1, 10, [])
    assert sp.acquire("m", 200, 10, [])[0].delivery_count == 3  # 2 timed out, 3rd delivery
    sp.expire(300)  # the third lock times out: at the limit, archived
    assert sp.spso == 2 and not sp.ranges
    assert sp.acquire("m", 400, 10, []) == []
    sp.check()


def test_acknowledging_records_not_held_is_refused_and_changes_nothing():
    sp = SharePartition(0)
    sp.acquire("m1", 0, 10, batches((0, 4)))
    sp.acquire("m2", 0, 10, batches((5, 9)))
    for member, first, last in (("m2", 0, 4), ("m1", 3, 6), ("m1", 10, 12)):
        with pytest.raises(InvalidRecordState):
            sp.acknowledge(member, first, last, [ACCEPT])
    with pytest.raises(ValueError):
        sp.acknowledge("m1", 0, 4, [ACCEPT, ACCEPT])  # neither one type nor one per record
    assert sp.state_of(3) == (ACQUIRED, 1, "m1") and sp.state_of(6) == (ACQUIRED, 1, "m2")
    sp.check()


def test_release_of_a_member_and_the_in_flight_cap_and_log_start():
    sp = SharePartition(0, max_in_flight=20)
    got = sp.acquire("m1", 0, 1000, batches((0, 9), (10, 19), (20, 29)))
    assert got[-1].last == 19, "no more than 20 records in flight"
    assert sp.release_member("m1") and sp.state_of(0) == (AVAILABLE, 1, None)
    sp.skip_to(15)  # retention removed 0-14
    assert sp.spso == 15 and sp.state_of(15) == (AVAILABLE, 1, None)
    sp.check()
    sp.skip_to(40)
    assert sp.spso == sp.next_offset == 40 and not sp.ranges


def test_a_batch_of_a_million_records_is_one_range():
    sp = SharePartition(0)
    start = time.perf_counter()
    sp.acquire("m", 0, 10, batches((0, 999_999)))
    sp.acknowledge("m", 0, 999_999, [ACCEPT])
    assert sp.spso == 1_000_000 and time.perf_counter() - start < 0.01


def test_snapshot_and_restore_keep_acknowledged_state_past_the_spso():
    sp = SharePartition(100, delivery_limit=2)
    sp.acquire("m", 0, 100, batches((100, 109), (110, 119)))
    sp.acknowledge("m", 100, 104, [ACCEPT])
    sp.acknowledge("m", 106, 107, [REJECT, ACCEPT])
    sp.acknowledge("m", 110, 119, [RELEASE])
    sp.acquire("m", 1, 100, [])  # 105, 108-109 stay acquired (count 1); 110-119 count 2
    snap = sp.snapshot()
    new = SharePartition(sp.spso, delivery_limit=2)
    new.restore(snap, 0, 120)
    new.check()
    assert new.spso == 105 and new.next_offset == 120
    assert new.state_of(105) == (AVAILABLE, 1, None)
    assert new.state_of(106)[0] == ARCHIVED and new.state_of(107)[0] == ACKNOWLEDGED
    assert new.state_of(110) == (ARCHIVED, 2, None), "acquired at the limit: archived"
    # A log shorter than the snapshot (the new leader's log end): cut there.
    short = SharePartition(105)
    short.restore(snap, 0, 109)
    short.check()
    assert short.next_offset == 109
    # Too long a snapshot is cut on a range boundary: the rest is fetched as new.
    assert len(sp.snapshot(max_chars=10).split(";")) == 1


def test_share_sessions_epochs():
    st = ShareState()
    s, code, _ = st.session_for("g", "m", 0, False)
    assert code == 0 and s is not None
    assert st.session_for("g", "m", 0, True)[1] == E.invalid_request  # acks on a new session
    assert st.session_for("g", "other", 1, False)[1] == E.share_session_not_found
    assert st.session_for("g", "m", 2, False)[1] == E.invalid_share_session_epoch
    assert st.session_for("g", "m", 1, False)[1] == 0
    assert st.session_for("g", "m", 2, False)[1] == 0
    sp = st.partition("g", "t", 0, 0, 10)
    assert sp.spso == 10, "share.auto.offset.reset=latest by default"
    s2, code, _ = st.session_for("g", "m", -1, False)
    assert code == 0 and s2 is s
    st.close(s2)
    assert st.session_for("g", "m", 3, False)[1] == E.share_session_not_found
    assert ShareState(auto_offset_reset="earliest").partition("g", "t", 0, 3, 10).spso == 3


def test_sessions_of_members_gone_are_closed_and_their_records_released():
    st = ShareState(session_idle_ms=1000, max_sessions=2)
    st.session_for("g", "m1", 0, False, now=0)
    sp = st.partition("g", "t", 0, 0, 0)
    sp.acquire("m1", 0, 10, batches((0, 4)))
    assert st.drop_member("g", "m1") and sp.state_of(0) == (AVAILABLE, 1, None)
    assert ("g", "m1") not in st.sessions
    st.session_for("g", "m2", 0, False, now=0)
    sp.acquire("m2", 0, 10, [])
    # A client that opens a new session (after an error or a timed-out request) keeps
    # its records and acknowledges them in the new session, as with Kafka.
    _, code, _ = st.session_for("g", "m2", 0, False, now=100)
    assert code == 0 and sp.state_of(0) == (ACQUIRED, 2, "m2")
    sp.acknowledge("m2", 0, 4, [ACCEPT])
    st.session_for("g", "m4", 0, False, now=200)
    # At the session limit, a session idle for longer than 1 s makes room; what its
    # member holds waits for the member (or its lock) instead of being handed out.
    sp.acquire("m2", 200, 10, batches((5, 6)))
    assert st.session_for("g", "m3", 0, False, now=500)[1] == E.share_session_limit_reached
    st.session_for("g", "m3", 0, False, now=1500)
    assert ("g", "m2") not in st.sessions and sp.state_of(5) == (ACQUIRED, 1, "m2")
    assert ("g", "m4") not in st.sessions  # idle too


# -- membership, sans-IO --------------------------------------------------------------------

T1, T2 = uuid.uuid4(), uuid.uuid4()


class Topics:
    def __init__(self, **counts: int) -> None:
        self.counts = counts

    def topic(self, name: str) -> tuple[uuid.UUID, int] | None:
        n = self.counts.get(name)
        return ({"a": T1, "b": T2}[name], n) if n is not None else None


def test_assign_shares_partitions_when_members_outnumber_them():
    parts = [(T1, 0), (T1, 1)]
    six = assign([f"m{i}" for i in range(6)], parts)
    assert all(a for a in six.values()), "every member gets a partition"
    assert Counter(p for a in six.values() for p in a[T1]) == {0: 3, 1: 3}
    one = assign(["m0"], parts)
    assert one == {"m0": {T1: (0, 1)}}


def test_share_group_heartbeats_epochs_and_errors():
    sm = ShareGroupStateMachine(ShareSettings(session_timeout_ms=1000, heartbeat_interval_ms=100))
    topics = Topics(a=2)

    def hb(member: str, epoch: int, subs: tuple[str, ...] | None = None, now: int = 0) -> Any:
        return sm.heartbeat("g", member, epoch, None, subs, "c", "/h", topics, now)

    r1 = hb("m1", 0, ("a",))
    assert r1.error == 0 and r1.member_epoch == 1 and r1.assignment == {T1: (0, 1)}
    assert r1.heartbeat_interval_ms == 100
    r2 = hb("m2", 0, ("a",))
    assert r2.member_epoch == 2 and r2.assignment == {T1: (1,)}
    # m1 learns of the new epoch and its new assignment at its next heartbeat.
    r1b = hb("m1", 1)
    assert r1b.member_epoch == 2 and r1b.assignment == {T1: (0,)}
    assert hb("m1", 2).assignment is None, "unchanged: no assignment sent"
    assert hb("m1", 1).error == E.fenced_member_epoch
    assert hb("m1", 7).error == E.fenced_member_epoch
    assert hb("ghost", 3).error == E.unknown_member_id
    assert hb("", 0, ("a",)).error == E.invalid_request
    assert hb("m3", 0).error == E.invalid_request  # a join without topics
    assert hb("ghost", -1).error == E.unknown_member_id
    # More partitions: a new epoch for everyone.
    topics.counts["a"] = 4
    assert hb("m2", 2).assignment == {T1: (1, 3)}
    # m2 stops heartbeating: removed after the session timeout, m1 gets everything.
    r = hb("m1", 2, now=900)
    r = hb("m1", r.member_epoch, now=1500)
    assert r.assignment == {T1: (0, 1, 2, 3)} and list(sm.groups["g"].members) == ["m1"]
    assert hb("m1", -1, now=1600).member_epoch == -1
    assert sm.groups["g"].state == "Empty"
    assert sm.take_removed() == [("g", "m2"), ("g", "m1")] and sm.take_removed() == []


# -- on the wire ------------------------------------------------------------------------------


def _create_topic(broker: Any, name: str, partitions: int) -> uuid.UUID:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)
    md = None

    def have_id() -> bool:
        nonlocal md
        from kio.schema.metadata.v12 import request as mr

        r = Raw(broker)
        try:
            md = r.call(
                mr.MetadataRequest(
                    topics=(mr.MetadataRequestTopic(topic_id=None, name=name),),
                    allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False,
                )
            )
        finally:
            r.close()
        return md.topics[0].error_code == 0 and len(md.topics[0].partitions) == partitions

    wait_for(have_id, 30, "topic metadata")
    assert md is not None
    return md.topics[0].topic_id


def _produce(broker: Any, topic: str, values: list[str], partition: int | None = None) -> None:
    from confluent_kafka import Producer

    # One batch per call, also on a loaded machine: the records wait for flush(), which
    # sends at once whatever linger.ms says (a 5 ms linger split them under load).
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 10_000})
    for v in values:
        if partition is None:
            p.produce(topic, v.encode())
        else:
            p.produce(topic, v.encode(), partition=partition)
    assert p.flush(30) == 0


def _hb(group: str, member: str, epoch: int, topics: tuple[str, ...] | None = None) -> Any:
    return sgh.ShareGroupHeartbeatRequest(
        group_id=group,
        member_id=member,
        member_epoch=epoch,
        rack_id=None,
        subscribed_topic_names=topics,
    )


def _fetch(group: str, member: str, epoch: int, tid: uuid.UUID, parts: dict, wait_ms: int = 500):
    """parts: partition -> [(first, last, [types])] acknowledgements."""
    import datetime

    return sf.ShareFetchRequest(
        group_id=group,
        member_id=member,
        share_session_epoch=epoch,
        max_wait=datetime.timedelta(milliseconds=wait_ms),
        min_bytes=1,
        max_bytes=1 << 20,
        max_records=500,
        batch_size=500,
        topics=(
            sf.FetchTopic(
                topic_id=tid,
                partitions=tuple(
                    sf.FetchPartition(
                        partition_index=p,
                        acknowledgement_batches=tuple(
                            sf.AcknowledgementBatch(
                                first_offset=f, last_offset=last, acknowledge_types=tuple(ts)
                            )
                            for f, last, ts in acks
                        ),
                    )
                    for p, acks in parts.items()
                ),
            ),
        ),
        forgotten_topics_data=(),
    )


def _ack(group: str, member: str, epoch: int, tid: uuid.UUID, parts: dict) -> Any:
    return sa.ShareAcknowledgeRequest(
        group_id=group,
        member_id=member,
        share_session_epoch=epoch,
        topics=(
            sa.AcknowledgeTopic(
                topic_id=tid,
                partitions=tuple(
                    sa.AcknowledgePartition(
                        partition_index=p,
                        acknowledgement_batches=tuple(
                            sa.AcknowledgementBatch(
                                first_offset=f, last_offset=last, acknowledge_types=tuple(ts)
                            )
                            for f, last, ts in acks
                        ),
                    )
                    for p, acks in parts.items()
                ),
            ),
        ),
    )


def _acquired(resp: Any) -> dict[int, list[tuple[int, int, int]]]:
    out: dict[int, list[tuple[int, int, int]]] = {}
    for t in resp.responses:
        for p in t.partitions:
            assert p.error_code == 0, p
            if p.acquired_records:
                out[p.partition_index] = [
                    (a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records
                ]
    return out


def test_wire_share_group_fetch_acknowledge_and_errors(broker_factory):
    broker = broker_factory(
        "--group-share-record-lock-duration-ms", "1500", "--group-share-delivery-count-limit", "2"
    )
    tid = _create_topic(broker, "sq", 2)
    r = Raw(broker)
    g, m1, m2 = "wire-share", str(uuid.uuid4()), str(uuid.uuid4())
    try:
        versions = {
            k.api_key: (k.min_version, k.max_version)
            for k in r.call(
                __import__("kio.schema.api_versions.v3.request", fromlist=["x"]).ApiVersionsRequest(
                    client_software_name="t", client_software_version="1"
                )
            ).api_keys
        }
        assert [versions[k] for k in (76, 77, 78, 79)] == [(1, 1)] * 4
        j1 = r.call(_hb(g, m1, 0, ("sq",)))
        assert j1.error_code == 0 and j1.member_epoch >= 1 and j1.heartbeat_interval.total_seconds()
        assert sorted(j1.assignment.topic_partitions[0].partitions) == [0, 1]
        j2 = r.call(_hb(g, m2, 0, ("sq",)))
        assert j2.error_code == 0
        # Bad input: Kafka's codes, the group unharmed.
        assert r.call(_hb(g, m1, j1.member_epoch + 9)).error_code == E.fenced_member_epoch
        assert r.call(_hb(g, "ghost", 3)).error_code == E.unknown_member_id
        assert r.call(_hb(g, "", 0, ("sq",))).error_code == E.invalid_request
        assert r.call(_hb(g, str(uuid.uuid4()), 0)).error_code == E.invalid_request
        d = r.call(
            sgd.ShareGroupDescribeRequest(
                group_ids=(g, "nope"), include_authorized_operations=False
            )
        )
        assert d.groups[0].error_code == 0 and {m.member_id for m in d.groups[0].members} == {
            m1,
            m2,
        }
        assert d.groups[0].group_state == "Stable"
        assert d.groups[1].error_code == E.group_id_not_found

        # A share session: epoch 0 opens it (latest: the share-partitions start at the end).
        f0 = r.call(_fetch(g, m1, 0, tid, {0: [], 1: []}, wait_ms=100))
        assert f0.error_code == 0 and _acquired(f0) == {}
        assert f0.acquisition_lock_timeout.total_seconds() == 1.5
        _produce(broker, "sq", [f"v{i}" for i in range(10)], partition=0)
        f1 = r.call(_fetch(g, m1, 1, tid, {}, wait_ms=3000))
        assert _acquired(f1) == {0: [(0, 9, 1)]}
        records = next(p for t in f1.responses for p in t.partitions if p.partition_index == 0)
        assert records.records, "the batches come with the acquired ranges"
        # m2 sees nothing while m1 holds them.
        g2 = r.call(_fetch(g, m2, 0, tid, {0: []}, wait_ms=100))
        assert _acquired(g2) == {}
        # m1 accepts 0-4 (piggybacked on a fetch) and releases 5-9 (ShareAcknowledge); m2
        # gets 5-9 on its next fetch.
        f2 = r.call(_fetch(g, m1, 2, tid, {0: [(0, 4, [1])]}, wait_ms=100))
        acked = [p for t in f2.responses for p in t.partitions if p.partition_index == 0]
        assert acked and acked[0].acknowledge_error_code == 0 and not acked[0].acquired_records
        released = r.call(_ack(g, m1, 3, tid, {0: [(5, 9, [2])]}))
        assert released.responses[0].partitions[0].error_code == 0
        g3 = r.call(_fetch(g, m2, 1, tid, {}, wait_ms=2000))
        assert _acquired(g3) == {0: [(5, 9, 2)]}
        # Acknowledging records someone else holds: INVALID_RECORD_STATE.
        bad = r.call(_ack(g, m1, 4, tid, {0: [(5, 9, [1])]}))
        assert bad.responses[0].partitions[0].error_code == E.invalid_record_state
        # m2 rejects 5 and lets 6-9 time out: at the delivery limit (2) they are archived.
        ok = r.call(_ack(g, m2, 2, tid, {0: [(5, 5, [3])]}))
        assert ok.error_code == 0 and ok.responses[0].partitions[0].error_code == 0
        time.sleep(1.7)
        assert _acquired(r.call(_fetch(g, m1, 5, tid, {}, wait_ms=300))) == {}
        # Session errors.
        assert r.call(_fetch(g, m1, 9, tid, {})).error_code == E.invalid_share_session_epoch
        assert r.call(_fetch(g, "nobody", 1, tid, {})).error_code == E.share_session_not_found
        assert r.call(_fetch(g, m1, 0, tid, {0: [(0, 0, [1])]})).error_code == E.invalid_request
        assert r.call(_ack(g, m1, 0, tid, {})).error_code == E.invalid_share_session_epoch
        # A member that closes its session (epoch -1) gives its records back at once.
        _produce(broker, "sq", ["w0", "w1"], partition=1)
        h = r.call(_fetch(g, m2, 3, tid, {1: []}, wait_ms=3000))
        assert _acquired(h) == {1: [(0, 1, 1)]}
        assert r.call(_ack(g, m2, -1, tid, {})).error_code == 0
        again = r.call(_fetch(g, m1, 0, tid, {1: []}, wait_ms=2000))
        assert _acquired(again) == {1: [(0, 1, 2)]}
        # Leaving the group.
        left = r.call(_hb(g, m2, -1))
        assert left.error_code == 0 and left.member_epoch == -1
        # The id belongs to a share group: the other protocols are refused; DeleteGroups
        # waits until it is empty.
        import datetime

        from kio.schema.consumer_group_heartbeat.v1 import request as cgh
        from kio.schema.delete_groups.v2 import request as dg
        from kio.schema.join_group.v9 import request as jg

        join = r.call(
            jg.JoinGroupRequest(
                group_id=g,
                session_timeout=datetime.timedelta(seconds=10),
                rebalance_timeout=datetime.timedelta(seconds=10),
                member_id="",
                group_instance_id=None,
                protocol_type="consumer",
                protocols=(jg.JoinGroupRequestProtocol(name="range", metadata=b""),),
            )
        )
        assert join.error_code == E.inconsistent_group_protocol
        cg = r.call(
            cgh.ConsumerGroupHeartbeatRequest(
                group_id=g,
                member_id=str(uuid.uuid4()),
                member_epoch=0,
                instance_id=None,
                rack_id=None,
                rebalance_timeout=datetime.timedelta(seconds=30),
                subscribed_topic_names=("sq",),
                subscribed_topic_regex=None,
                server_assignor=None,
                topic_partitions=(),
            )
        )
        assert cg.error_code == E.group_id_not_found
        deleted = r.call(dg.DeleteGroupsRequest(groups_names=(g,)))
        assert deleted.results[0].error_code == E.non_empty_group
        assert r.call(_hb(g, m1, -1)).error_code == 0
        deleted = r.call(dg.DeleteGroupsRequest(groups_names=(g,)))
        assert deleted.results[0].error_code == 0
        d = r.call(
            sgd.ShareGroupDescribeRequest(group_ids=(g,), include_authorized_operations=False)
        )
        assert d.groups[0].error_code == E.group_id_not_found
    finally:
        r.close()


# -- the Java KafkaShareConsumer --------------------------------------------------------------


@pytest.fixture(scope="module")
def _jars() -> None:
    ensure_jars()


class ShareMember(ClientProcess):
    def __init__(self, bootstrap: str, group: str, topic: str, name: str, mode: str, logs: Path):
        cmd = java_cmd(
            str(JAVA_CLIENT),
            [bootstrap, group, topic, name, mode],
            include_classes=False,
            jars="4.4",
        )
        super().__init__(name, cmd, logs)

    def records(self) -> list[tuple[int, int, int, str]]:
        return [tuple(r) for e in list(self.events) if e["ev"] == "records" for r in e["recs"]]

    def alive(self) -> None:
        if why := self.exited():
            raise AssertionError(why)


def _assert_at_least_once_without_redelivery_of_accepted(
    members: list[ShareMember], logs: Path
) -> None:
    """Kafka's share groups deliver at least once: a record comes back only when its
    earlier delivery's lock was lost (the lock timed out, the member was expired), and
    then with a higher delivery count. A record whose acceptance the broker confirmed
    (commitSync with no error for its partition) is never delivered again."""
    deliveries: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    accepted: dict[tuple[int, int], int] = {}
    for m in members:
        polled: list[tuple[int, int]] = []
        for e in list(m.events):
            if e["ev"] == "records":
                polled = [(p, o) for p, o, _, _ in e["recs"]]
                for p, o, d, _ in e["recs"]:
                    deliveries.setdefault((p, o), []).append((e["ts"], d, m.name))
            elif e["ev"] == "committed":
                failed = {int(x.split(":")[0]) for x in e["errors"]}
                for p, o in polled:
                    if p not in failed:
                        accepted.setdefault((p, o), e["ts"])
                polled = []
    bad = {}
    for key, ds in deliveries.items():
        ds.sort()
        counts = [d for _, d, _ in ds]
        after_accept = [x for x in ds if key in accepted and x[0] > accepted[key]]
        if any(b <= a for a, b in itertools.pairwise(counts)) or after_accept:
            bad[key] = (ds, accepted.get(key))
    assert not bad, f"redelivered wrongly ({len(bad)}): {dict(list(bad.items())[:5])}; " + (
        _share_logs(members, logs)
    )


def _share_logs(members: list[ShareMember], logs: Path) -> str:
    """The members' events other than records, and their stderr tails (a failure's story)."""
    out = []
    for m in members:
        events = [e for e in m.events if e["ev"] != "records"]
        err = (logs / f"{m.name}.err").read_text()[-1500:]
        out.append(f"{m.name}: {events[:20]} stderr: {err}")
    return "\n".join(out)


def _members_assigned(broker: Any, group: str, count: int) -> bool:
    r = Raw(broker)
    try:
        d = r.call(
            sgd.ShareGroupDescribeRequest(group_ids=(group,), include_authorized_operations=False)
        )
    finally:
        r.close()
    g = d.groups[0]
    return (
        g.error_code == 0
        and len(g.members) == count
        and all(m.assignment.topic_partitions for m in g.members)
    )


def _share_done(broker: Any, group: str, partitions: int) -> bool:
    """Every record of the group's partitions is acknowledged or archived, as saved: the
    share-partition start offsets have reached the log ends, so nothing can be delivered
    (again) any more."""
    rows = request_sync(broker.http, "GET", f"/api/v1/groups/{group}")["offsets"]
    return len(rows) == partitions and all(r["lag"] == 0 for r in rows)


def _finds_nothing_left(
    broker: Any, group: str, topic: str, partitions: int, tmp_path: Path
) -> list[str]:
    """A member that joins now, then one new record on each partition: it gets those and
    nothing else (a share fetch hands out older available records first), which proves
    it has fetched and that nothing earlier was left. Its values."""
    late = ShareMember(broker.bootstrap, group, topic, "late", "accept", tmp_path)
    try:
        wait_for(lambda: _members_assigned(broker, group, 1), 60, "the late member joins")
        for p in range(partitions):
            _produce(broker, topic, [f"late-{p}"], partition=p)

        def got_them() -> bool:
            late.alive()
            return len(late.records()) >= partitions

        wait_for(got_them, 60, "the late member's own records")
    finally:
        late.stop()
    return sorted(v for *_, v in late.records())


def test_java_share_consumers_share_two_partitions_and_redeliver_a_dead_members_records(
    broker_factory, tmp_path, _jars
):
    broker = broker_factory(
        "--group-share-record-lock-duration-ms",
        "8000",
        # Longer than the lock: six JVMs starting at once on two busy cores can stall a
        # member for seconds, and an expired member's records rightly go to others.
        "--group-share-session-timeout-ms",
        "12000",
        "--group-share-heartbeat-interval-ms",
        "500",
        "--share-auto-offset-reset",
        "earliest",
    )
    topic, group = "jshare", "jshare-group"
    _create_topic(broker, topic, 2)
    # One consumer that takes records and dies holding them (SIGKILL, no acknowledgement).
    holder = ShareMember(broker.bootstrap, group, topic, "holder", "hold", tmp_path)
    try:
        wait_for(lambda: _members_assigned(broker, group, 1), 60, "the holder joins")
        _produce(broker, topic, [f"h{i}" for i in range(20)])
        wait_for(lambda: holder.alive() or holder.records(), 60, "the holder gets records")
        held = {(p, o) for p, o, _, _ in holder.records()}
        assert held
        holder.kill()
    finally:
        if holder.proc.poll() is None:
            holder.kill()
    # Six consumers on the two partitions: all of them get records.
    members = [
        ShareMember(broker.bootstrap, group, topic, f"c{i}", "accept", tmp_path) for i in range(6)
    ]
    try:

        def assigned() -> bool:
            for m in members:
                m.alive()
            return _members_assigned(broker, group, 6)

        wait_for(assigned, 90, "six members assigned")
        total = 600
        sent = 0
        # Produce in rounds until every consumer has had records.
        deadline = time.time() + 120
        while time.time() < deadline:
            _produce(broker, topic, [f"v{sent + i}" for i in range(50)])
            sent += 50
            time.sleep(0.5)
            for m in members:
                m.alive()
            if sent >= total and all(m.records() for m in members):
                break
        expected = {f"h{i}" for i in range(20)} | {f"v{i}" for i in range(sent)}

        def everything() -> bool:
            for m in members:
                m.alive()
            return {v for m in members for *_, v in m.records()} >= expected

        wait_for(everything, 90, "every record consumed")
        got = [rec for m in members for rec in m.records()]
        assert all(m.records() for m in members), [len(m.records()) for m in members]
        # The records the holder died with came back after its lock timed out.
        redelivered = {(p, o): d for p, o, d, _ in got if (p, o) in held}
        assert set(redelivered) == held and all(d >= 2 for d in redelivered.values())
        _assert_at_least_once_without_redelivery_of_accepted(members, tmp_path)
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.stop()
    for m in members:
        assert any(e["ev"] == "closed" for e in m.events), m.name
        errors = [e for e in m.events if e["ev"] == "committed" and e["errors"]]
        assert not errors, errors[:3]


def test_java_share_consumer_released_past_the_delivery_limit_or_rejected_is_archived(
    broker_factory, tmp_path, _jars
):
    broker = broker_factory(
        "--group-share-delivery-count-limit",
        "3",
        "--group-share-heartbeat-interval-ms",
        "500",
        "--share-auto-offset-reset",
        "earliest",
    )
    topic, group = "jlimit", "jlimit-group"
    _create_topic(broker, topic, 1)
    values = [f"ok{i}" for i in range(10)] + ["release-0", "release-1", "reject-0"]
    values += [f"ok{i}" for i in range(10, 20)]
    _produce(broker, topic, values, partition=0)
    m = ShareMember(broker.bootstrap, group, topic, "limit", "accept", tmp_path)
    try:

        def settled() -> bool:
            m.alive()
            got = Counter(v for *_, v in m.records())
            return got["release-0"] >= 3 and got["release-1"] >= 3 and got["ok19"] >= 1

        wait_for(settled, 90, "released records delivered up to the limit")
        # Past the limit the released records are archived: nothing is left to deliver.
        wait_for(lambda: _share_done(broker, group, 1), 60, "every record done")
    finally:
        m.stop()
    got = m.records()  # after stop: every line it printed has been read
    deliveries: dict[str, list[int]] = {}
    for _, _, count, v in got:
        deliveries.setdefault(v, []).append(count)
    # Released: delivered exactly delivery.count.limit times, with counts 1, 2, 3; then
    # archived. Rejected: delivered once. Accepted: once each.
    assert deliveries["release-0"] == [1, 2, 3] and deliveries["release-1"] == [1, 2, 3]
    assert deliveries["reject-0"] == [1]
    assert all(deliveries[f"ok{i}"] == [1] for i in range(20)), deliveries
    # A new member finds nothing left: everything is acknowledged or archived.
    assert _finds_nothing_left(broker, group, topic, 1, tmp_path) == ["late-0"]


def test_wire_the_saved_spso_survives_a_broker_restart(broker_factory):
    """The share-partition's state is saved (as a commit of the internal group
    __share_group_state.<group>: the SPSO and the in-flight ranges) before an
    acknowledgement is answered, and read back by the partition's next leader: after a
    restart the group goes on from the first unacknowledged record, not from
    share.auto.offset.reset (latest), and records acknowledged past the SPSO stay done."""
    broker = broker_factory()
    tid = _create_topic(broker, "sr", 1)
    g, m = "restart-share", str(uuid.uuid4())
    r = Raw(broker)
    try:
        assert r.call(_hb(g, m, 0, ("sr",))).error_code == 0
        assert _acquired(r.call(_fetch(g, m, 0, tid, {0: []}, wait_ms=100))) == {}
        _produce(broker, "sr", [f"v{i}" for i in range(10)], partition=0)
        assert _acquired(r.call(_fetch(g, m, 1, tid, {}, wait_ms=3000))) == {0: [(0, 9, 1)]}
        # Accept 0-4 (SPSO 5), 7; reject 6; 5, 8 and 9 stay acquired.
        ok = r.call(_ack(g, m, 2, tid, {0: [(0, 4, [1]), (6, 7, [3, 1])]}))
        assert ok.responses[0].partitions[0].error_code == 0
        # No wait: the answer came once the state was saved.
    finally:
        r.close()
    broker.restart()
    r = Raw(broker)
    try:

        def rejoined() -> bool:
            return r.call(_hb(g, m, 0, ("sr",))).error_code == 0

        wait_for(rejoined, 30, "the member joins again")
        got: dict = {}

        def fetched() -> bool:
            nonlocal got
            resp = r.call(_fetch(g, m, 0, tid, {0: []}, wait_ms=1000))
            got = _acquired(resp) if resp.error_code == 0 else {}
            return bool(got)

        wait_for(fetched, 30, "records 5, 8 and 9 again")
        assert got == {0: [(5, 5, 2), (8, 9, 2)]}, "acquired ones again, with their count"
    finally:
        r.close()


@pytest.fixture
def cluster(tmp_path):
    from cluster_support import cluster_factory

    yield from cluster_factory(tmp_path)


def test_wire_a_killed_partition_leaders_share_state_resumes_at_the_new_leader(cluster):
    """3 controllers + 3 brokers, a topic with 3 replicas: the partition's leader (and
    share-partition) is killed with SIGKILL after a member accepted 0-4 and 7, rejected 6
    and holds 5, 8, 9; the new leader reads the saved state from the group's coordinator
    and delivers 5, 8 and 9 again (delivery count 2): no acknowledged state lost, not
    started over from share.auto.offset.reset (latest: nothing)."""
    from types import SimpleNamespace

    from confluent_kafka import Producer
    from kio.schema.find_coordinator.v4 import request as fc

    c = cluster()
    c.create_topic("sf", partitions=1, rf=3, min_isr=2)
    g, m = "failover-share", str(uuid.uuid4())

    def raw(node_id: int) -> Raw:
        return Raw(SimpleNamespace(port=c.brokers[node_id].kafka_port))

    def coordinator_ready() -> bool:
        r = raw(c.leader_of("sf", 0))
        try:
            resp = r.call(fc.FindCoordinatorRequest(key_type=0, coordinator_keys=(g,)))
        finally:
            r.close()
        return resp.coordinators[0].error_code == 0

    wait_for(coordinator_ready, 60, "__consumer_offsets")
    leader = c.leader_of("sf", 0)
    r = raw(leader)
    md = r.call(
        __import__("kio.schema.metadata.v12.request", fromlist=["x"]).MetadataRequest(
            topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
        )
    )
    tid = next(t.topic_id for t in md.topics if t.name == "sf")
    try:
        assert _acquired(r.call(_fetch(g, m, 0, tid, {0: []}, wait_ms=100))) == {}
        p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all"})
        for i in range(10):
            p.produce("sf", f"v{i}".encode(), partition=0)
        assert p.flush(30) == 0
        assert _acquired(r.call(_fetch(g, m, 1, tid, {}, wait_ms=5000))) == {0: [(0, 9, 1)]}
        ok = r.call(_ack(g, m, 2, tid, {0: [(0, 4, [1]), (6, 7, [3, 1])]}))
        assert ok.responses[0].partitions[0].error_code == 0  # answered once saved
    finally:
        r.close()
    c.brokers[leader].kill9()
    new_leader, _ = c.wait_new_leader("sf", 0, leader)
    assert new_leader != leader
    got: dict = {}

    def fetched() -> bool:
        nonlocal got
        r2 = raw(new_leader)
        try:
            resp = r2.call(_fetch(g, m, 0, tid, {0: []}, wait_ms=1000))
        finally:
            r2.close()
        got = _acquired(resp) if resp.error_code == 0 else {}
        return bool(got)

    wait_for(fetched, 60, "5, 8, 9 from the new leader")
    assert got == {0: [(5, 5, 2), (8, 9, 2)]}, "no acknowledged state lost"


def test_wire_describe_share_group_offsets_of_named_topics(broker_factory):
    """DescribeShareGroupOffsets naming its topics and partitions (Kafka's admin does when
    asked for some): the saved start offset of each, UNKNOWN_TOPIC_OR_PARTITION for one
    that does not exist. Release 0.1.0 failed such a request (a NameError closed the
    connection)."""
    from kio.schema.describe_share_group_offsets.v0 import request as dsgo
    from kio.static.primitive import i32

    broker = broker_factory()
    tid = _create_topic(broker, "named-share", 1)
    g, m = "named-share-group", str(uuid.uuid4())
    r = Raw(broker)
    try:
        assert r.call(_hb(g, m, 0, ("named-share",))).error_code == 0
        assert _acquired(r.call(_fetch(g, m, 0, tid, {0: []}, wait_ms=100))) == {}
        _produce(broker, "named-share", ["a", "b"], partition=0)
        assert _acquired(r.call(_fetch(g, m, 1, tid, {}, wait_ms=3000))) == {0: [(0, 1, 1)]}
        assert r.call(_ack(g, m, 2, tid, {0: [(0, 1, [1])]})).error_code == 0
        ask = dsgo.DescribeShareGroupOffsetsRequest(
            groups=(
                dsgo.DescribeShareGroupOffsetsRequestGroup(
                    group_id=g,
                    topics=(
                        dsgo.DescribeShareGroupOffsetsRequestTopic(
                            topic_name="named-share", partitions=(i32(0), i32(7))
                        ),
                        dsgo.DescribeShareGroupOffsetsRequestTopic(
                            topic_name="no-such-topic", partitions=(i32(0),)
                        ),
                    ),
                ),
            )
        )
        (group,) = r.call(ask).groups
        assert group.error_code == 0
        got = {
            (t.topic_name, p.partition_index): (p.start_offset, p.error_code)
            for t in group.topics
            for p in t.partitions
        }
        assert got == {
            ("named-share", 0): (2, 0),
            ("named-share", 7): (-1, E.unknown_topic_or_partition),
            ("no-such-topic", 0): (-1, E.unknown_topic_or_partition),
        }
    finally:
        r.close()


def test_kafka_share_groups_tool_lists_and_describes(broker_factory, _jars):
    """`kafka-share-groups.sh` (4.4): --list (ListGroups, type share), --describe
    --members (ShareGroupDescribe) and --describe (DescribeShareGroupOffsets: the saved
    start offset)."""
    from bench.javatools import KAFKA44_TOOLS

    broker = broker_factory()
    tid = _create_topic(broker, "cli-share", 2)
    g, m = "cli-share-group", str(uuid.uuid4())
    r = Raw(broker)
    try:
        assert r.call(_hb(g, m, 0, ("cli-share",))).error_code == 0
        assert _acquired(r.call(_fetch(g, m, 0, tid, {0: [], 1: []}, wait_ms=100))) == {}
        _produce(broker, "cli-share", [f"v{i}" for i in range(5)], partition=0)
        assert _acquired(r.call(_fetch(g, m, 1, tid, {}, wait_ms=3000))) == {0: [(0, 4, 1)]}
        assert r.call(_ack(g, m, 2, tid, {0: [(0, 2, [1])]})).error_code == 0

        def saved() -> bool:
            rows = request_sync(broker.http, "GET", f"/api/v1/groups/{g}")["offsets"]
            return any(row["partition"] == 0 and row["start_offset"] == 3 for row in rows)

        wait_for(saved, 30, "the start offset 3 saved")

        def tool(*args: str) -> str:
            res = subprocess.run(
                java_cmd(
                    KAFKA44_TOOLS["kafka-share-groups"],
                    ["--bootstrap-server", broker.bootstrap, *args],
                    jars="4.4",
                ),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
            return res.stdout

        listed = tool("--list").split()
        assert g in listed and not any(x.startswith("__share_group_state") for x in listed)
        members = tool("--describe", "--group", g, "--members")
        assert m in members and "cli-share:0,1" in members.replace(" ", ""), members
        offsets = tool("--describe", "--group", g)
        rows = [line.split() for line in offsets.splitlines() if line.startswith(g)]
        assert [g, "cli-share", "0", "3"] in [row[:4] for row in rows], offsets
    finally:
        r.close()


def test_java_share_consumer_with_implicit_acknowledgement(broker_factory, tmp_path, _jars):
    """share.acknowledgement.mode=implicit (the client's default): each poll accepts what
    the previous one returned; every record is delivered once and a member that comes
    later finds nothing left."""
    broker = broker_factory(
        "--group-share-heartbeat-interval-ms", "500", "--share-auto-offset-reset", "earliest"
    )
    topic, group = "jimplicit", "jimplicit-group"
    _create_topic(broker, topic, 2)
    _produce(broker, topic, [f"v{i}" for i in range(300)])
    m = ShareMember(broker.bootstrap, group, topic, "implicit", "implicit", tmp_path)
    try:

        def all_read() -> bool:
            m.alive()
            return len({v for *_, v in m.records()}) == 300

        wait_for(all_read, 90, "300 records")
        # The next polls accept the last records (implicitly): wait until they are done.
        wait_for(lambda: _share_done(broker, group, 2), 60, "every record accepted")
    finally:
        m.stop()
    got = m.records()
    assert sorted(v for *_, v in got) == sorted(f"v{i}" for i in range(300))
    assert {d for _, _, d, _ in got} == {1}
    late = _finds_nothing_left(broker, group, topic, 2, tmp_path)
    assert late == ["late-0", "late-1"], "the implicit acknowledgements were applied"


def test_share_auto_offset_reset_as_a_group_config(broker_factory, _jars):
    """`kafka-configs.sh --entity-type groups` sets share.auto.offset.reset (kept in the
    metadata log): with earliest the group reads records written before it existed."""
    from bench.javatools import KAFKA44_TOOLS

    broker = broker_factory()
    tid = _create_topic(broker, "cfg-share", 1)
    _produce(broker, "cfg-share", [f"v{i}" for i in range(5)], partition=0)
    g, m = "cfg-share-group", str(uuid.uuid4())

    def configs(*args: str) -> str:
        res = subprocess.run(
            java_cmd(
                KAFKA44_TOOLS["kafka-configs"],
                [
                    "--bootstrap-server",
                    broker.bootstrap,
                    "--entity-type",
                    "groups",
                    "--entity-name",
                    g,
                    *args,
                ],
                jars="4.4",
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
        return res.stdout

    configs("--alter", "--add-config", "share.auto.offset.reset=earliest")
    assert "share.auto.offset.reset=earliest" in configs("--describe"), configs("--describe")
    r = Raw(broker)
    try:
        assert r.call(_hb(g, m, 0, ("cfg-share",))).error_code == 0
        got: dict = {}

        def fetched() -> bool:
            nonlocal got
            got = _acquired(r.call(_fetch(g, m, 0, tid, {0: []}, wait_ms=1000)))
            return bool(got)

        wait_for(fetched, 30, "the records written before the group")
        assert got == {0: [(0, 4, 1)]}
        # A value Kafka does not know is refused.
        from kio.schema.incremental_alter_configs.v1 import request as iac

        bad = r.call(
            iac.IncrementalAlterConfigsRequest(
                resources=(
                    iac.AlterConfigsResource(
                        resource_type=32,
                        resource_name=g,
                        configs=(
                            iac.AlterableConfig(
                                name="share.auto.offset.reset",
                                config_operation=0,
                                value="sometimes",
                            ),
                        ),
                    ),
                ),
                validate_only=False,
            )
        )
        assert bad.responses[0].error_code == E.invalid_config
    finally:
        r.close()


def _assigned_at(c: Any, group: str, count: int) -> bool:
    """ShareGroupDescribe at the group's coordinator: `count` members, each assigned."""
    from types import SimpleNamespace

    from straitmq.broker.groups.offsets import OffsetStore

    node = c.leader_of("__consumer_offsets", OffsetStore(16).partition_for(group))
    return _members_assigned(SimpleNamespace(port=c.brokers[node].kafka_port), group, count)


@pytest.mark.parametrize("victim", ["partition leader", "share-state coordinator"])
def test_java_share_consumers_through_a_broker_kill(cluster, tmp_path, _jars, victim):
    """3 controllers + 3 brokers, a 2-partition topic with 3 replicas, 3 Java
    KafkaShareConsumers accepting what they get while a producer writes; killed with
    SIGKILL: the leader of partition 0, or the broker that coordinates the group's saved
    share state (the leader of the `__consumer_offsets` partition of
    `__share_group_state.<group>`, Kafka's share coordinator; the share-partition leaders
    must save through its successor). Every acknowledged record is consumed, and
    records whose acknowledgement succeeded (commitSync without error for their
    partition) are not delivered again: no acknowledged state is lost with the leader.
    A handful are tolerated: commitSync's result does not cover the acknowledgements the
    client piggybacked on a ShareFetch in flight (to the killed leader, say), which are
    reported to its commit callback instead; tests/test_share_groups'
    test_wire_a_killed_partition_leaders_share_state_resumes_at_the_new_leader checks the
    exact state across the kill."""
    from cluster_support import BROKER_ARGS as CLUSTER_BROKER_ARGS
    from cluster_support import Workload
    from straitmq.broker.groups.offsets import OffsetStore
    from straitmq.broker.share.checkpoints import state_group

    c = cluster(
        broker_args=[
            *CLUSTER_BROKER_ARGS,
            "--group-share-heartbeat-interval-ms",
            "500",
            "--group-share-session-timeout-ms",
            "6000",
            "--group-share-record-lock-duration-ms",
            "5000",
            "--share-auto-offset-reset",
            "earliest",
        ]
    )
    topic, group = "jfail", "jfail-group"
    c.create_topic(topic, partitions=2, rf=3, min_isr=2)
    members = [
        ShareMember(c.bootstrap, group, topic, f"f{i}", "accept", tmp_path) for i in range(3)
    ]
    w = Workload(c.bootstrap, topic, partitions=2, prefix="f", rate=100, limit=6000)
    try:
        # Produce once all three are in (the first to start would take everything).
        def assigned() -> bool:
            for m in members:
                m.alive()
            return _assigned_at(c, group, 3)

        wait_for(assigned, 120, "three members assigned")
        w.start()

        def all_consuming() -> bool:
            for m in members:
                m.alive()
            return all(m.records() for m in members)

        wait_for(
            all_consuming,
            120,
            "three members consuming",
            detail=lambda: str([(m.name, len(m.records())) for m in members]),
        )
        if victim == "partition leader":
            moved = (topic, 0)
        else:
            moved = ("__consumer_offsets", OffsetStore(16).partition_for(state_group(group)))
        killed = c.leader_of(*moved)
        c.brokers[killed].kill9()
        c.wait_new_leader(*moved, killed, timeout=30)
        w.wait_acked_growth(300, 90)
        w.stop()
        acked = {v.decode() for v in w.acked}

        def everything() -> bool:
            for m in members:
                m.alive()
            return {v for m in members for *_, v in m.records()} >= acked

        wait_for(everything, 180, "every acknowledged record consumed")
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.stop()
    # (partition, offset) -> when its acknowledgement succeeded; every delivery, with time.
    acked_at: dict[tuple[int, int], int] = {}
    deliveries: list[tuple[int, tuple[int, int], str]] = []
    for m in members:
        last: list = []
        for e in m.events:
            if e["ev"] == "records":
                last = e["recs"]
                deliveries += [(e["ts"], (p, o), f"{m.name}#{d}") for p, o, d, _ in last]
            elif e["ev"] == "committed":
                failed = {int(x.split(":")[0]) for x in e["errors"]}
                for p, o, _, _ in last:
                    if p not in failed:
                        acked_at.setdefault((p, o), e["ts"])
    late = [(ts, key, who) for ts, key, who in deliveries if key in acked_at and ts > acked_at[key]]
    assert len(late) <= max(3, len(acked) // 200), (
        f"delivered again after a successful acknowledgement: {late[:5]}, acked at "
        f"{[acked_at[k] for _, k, _ in late[:5]]}, all deliveries of the first: "
        f"{[d for d in deliveries if d[1] == late[0][1]]}, {victim} killed: {killed}, "
        f"p1 leader now {c.leader_of(topic, 1, exclude=(killed,))}"
    )
    assert len(acked_at) >= len(acked) * 0.9, (len(acked_at), len(acked))
