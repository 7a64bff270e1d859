"""`strait group list/describe` and GET /api/v1/groups[/{group}] for the three kinds of
group (issue 14): a classic group (librdkafka, the default protocol), a KIP-848 one
(librdkafka, group.protocol=consumer) and a KIP-932 share group (ShareGroupHeartbeat on
the wire), all on one topic of a real broker."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest
from test_errors import Raw
from test_http_cli import call, strait
from test_metrics import scrape, total
from test_share_groups import _create_topic, _fetch, _hb, _produce
from waiting import wait_for

pytestmark = pytest.mark.timeout(180)


def _line(out: str, start: str) -> str:
    return next(ln for ln in out.splitlines() if ln.startswith(start))


def test_cli_and_http_describe_classic_consumer_and_share_groups(broker):
    from confluent_kafka import Consumer

    tid = _create_topic(broker, "gd", 3)
    # Ten records in each partition: librdkafka's sticky partitioner can leave a partition
    # of a 30-record burst empty, and a consumer commits no offset for a partition it read
    # nothing from (the lag series below are one per committed partition).
    for part in range(3):
        _produce(broker, "gd", [f"v{part * 10 + i}" for i in range(10)], partition=part)
    common = {
        "bootstrap.servers": broker.bootstrap,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    classic = Consumer({**common, "group.id": "gd-classic", "client.id": "cli-classic"})
    kip848 = Consumer(
        {**common, "group.id": "gd-848", "client.id": "cli-848", "group.protocol": "consumer"}
    )
    raw = Raw(broker)
    try:
        classic.subscribe(["gd"])
        kip848.subscribe(["gd"])
        got = {"classic": 0, "848": 0}

        def both_consumed() -> bool:
            for name, c in (("classic", classic), ("848", kip848)):
                m = c.poll(0.2)
                if m is not None and m.error() is None:
                    got[name] += 1
            return got["classic"] >= 30 and got["848"] >= 30

        wait_for(both_consumed, 60, "both groups consume the topic")
        classic.commit(asynchronous=False)
        kip848.commit(asynchronous=False)

        member = str(uuid.uuid4())
        share = wait_for(
            lambda: (r := raw.call(_hb("gd-share", member, 0, ("gd",)))).error_code == 0 and r,
            30,
            "a share group member",
        )

        # The list: every kind, with its type.
        r = strait(broker, "group", "list")
        assert r.returncode == 0, r.stderr
        assert _line(r.stdout, "GROUP").split() == ["GROUP", "TYPE", "STATE", "PROTOCOL"]
        assert _line(r.stdout, "gd-classic ").split()[1:3] == ["classic", "Stable"]
        assert _line(r.stdout, "gd-848 ").split()[1:3] == ["consumer", "Stable"]
        assert _line(r.stdout, "gd-share ").split()[1:3] == ["share", "Stable"]
        status, body = call(broker, "GET", "/api/v1/groups")
        assert status == 200
        kinds = {g["group_id"]: g["type"] for g in body["groups"]}
        assert kinds == {"gd-classic": "classic", "gd-848": "consumer", "gd-share": "share"}

        # A classic group: its generation, the member's assignment decoded, offsets and lag.
        status, d = call(broker, "GET", "/api/v1/groups/gd-classic")
        assert status == 200 and d["type"] == "classic" and d["state"] == "Stable"
        assert d["assignor"] == "range" and d["group_epoch"] >= 1
        (m,) = d["members"]
        assert m["client_id"] == "cli-classic" and m["member_epoch"] == d["group_epoch"]
        assert m["assignment"] == {"gd": [0, 1, 2]} and m["subscribed_topics"] == ["gd"]
        assert sum(o["committed"] for o in d["offsets"]) == 30
        assert all(o["lag"] == 0 for o in d["offsets"])
        r = strait(broker, "group", "describe", "gd-classic")
        assert r.returncode == 0, r.stderr
        head = r.stdout.splitlines()[0]
        assert head.startswith("group gd-classic  type classic  state Stable  generation ")
        assert "assignor range  members 1" in head
        row = _line(r.stdout, m["member_id"]).split()
        assert row[1] == str(d["group_epoch"]) and row[3] == "cli-classic"
        assert row[-1] == "gd:0,1,2"
        assert _line(r.stdout, "TOPIC").split() == ["TOPIC", "PARTITION", "COMMITTED", "END", "LAG"]

        # A KIP-848 group: group and assignment epochs, member epochs, the server assignor.
        status, d = call(broker, "GET", "/api/v1/groups/gd-848")
        assert status == 200 and d["type"] == "consumer" and d["state"] == "Stable"
        assert d["assignor"] in ("uniform", "range") and d["group_epoch"] >= 1
        assert d["assignment_epoch"] == d["group_epoch"]
        (m,) = d["members"]
        assert m["client_id"] == "cli-848" and m["member_epoch"] == d["group_epoch"]
        assert m["assignment"] == m["target_assignment"] == {"gd": [0, 1, 2]}
        assert m["pending"] == {} and m["subscribed_topics"] == ["gd"]
        assert sum(o["committed"] for o in d["offsets"]) == 30
        r = strait(broker, "group", "describe", "gd-848")
        assert r.returncode == 0, r.stderr
        head = r.stdout.splitlines()[0]
        assert head.startswith(
            f"group gd-848  type consumer  state Stable  group epoch {d['group_epoch']}  "
            f"assignment epoch {d['assignment_epoch']}  assignor {d['assignor']}"
        )
        assert _line(r.stdout, "MEMBER").split()[-2:] == ["ASSIGNED", "PENDING"]
        row = _line(r.stdout, m["member_id"]).split()
        assert row[1] == str(m["member_epoch"]) and row[-2:] == ["gd:0,1,2", "-"]

        # A share group: its epochs and the member's, the simple assignor, no commits.
        status, d = call(broker, "GET", "/api/v1/groups/gd-share")
        assert status == 200 and d["type"] == "share" and d["state"] == "Stable"
        assert d["assignor"] == "simple" and d["group_epoch"] >= 1
        (m,) = d["members"]
        assert m["member_id"] == member and m["member_epoch"] == share.member_epoch
        assert m["assignment"] == {"gd": [0, 1, 2]}
        assert all("start_offset" in o for o in d["offsets"])
        assert d["offsets"] == [] and "offsets_note" not in d, "nothing fetched, none saved"
        r = strait(broker, "group", "describe", "gd-share")
        assert r.returncode == 0 and r.stdout.endswith("start offsets: none saved yet\n")
        # A share session starts the share-partitions (at the end: latest), and saves that.
        f = raw.call(_fetch("gd-share", member, 0, tid, {0: [], 1: [], 2: []}, wait_ms=100))
        assert f.error_code == 0

        def saved() -> dict:
            d = call(broker, "GET", "/api/v1/groups/gd-share")[1]
            return len(d["offsets"]) == 3 and d

        d = wait_for(saved, 30, "the share-partition start offsets saved")
        rows = [(o["partition"], o["start_offset"] == o["end"], o["lag"]) for o in d["offsets"]]
        assert rows == [(0, True, 0), (1, True, 0), (2, True, 0)]
        r = strait(broker, "group", "describe", "gd-share")
        assert r.returncode == 0, r.stderr
        assert _line(r.stdout, "TOPIC").split() == [
            "TOPIC",
            "PARTITION",
            "START-OFFSET",
            "END",
            "LAG",
        ]
        assert r.stdout.startswith(
            f"group gd-share  type share  state Stable  group epoch {d['group_epoch']}  "
            f"assignment epoch {d['assignment_epoch']}  assignor simple  members 1"
        )
        row = _line(r.stdout, member).split()
        assert row[1] == str(share.member_epoch) and row[-1] == "gd:0,1,2"

        # The group metrics carry each group's kind; a share group's lag is past its SPSO.
        m = scrape(broker.http)
        kinds = {
            ls["messaging_consumer_group_name"]: ls["straitmq_consumer_group_type"]
            for ls, _ in m["straitmq_consumer_group_state"]
        }
        assert kinds == {"gd-classic": "classic", "gd-848": "consumer", "gd-share": "share"}
        for g, kind in kinds.items():
            labels = {"messaging_consumer_group_name": g, "straitmq_consumer_group_type": kind}
            assert total(m, "straitmq_consumer_group_members", **labels) == 1
            assert (
                len(
                    [
                        1
                        for ls, _ in m["straitmq_consumer_group_lag"]
                        if ls.items() >= labels.items()
                    ]
                )
                == 3
            ), g
            assert total(m, "straitmq_consumer_group_lag", **labels) == 0

        # A group that does not exist: one line, exit code 1.
        r = strait(broker, "group", "describe", "gd-none")
        assert r.returncode == 1 and r.stdout == ""
        assert r.stderr == "strait: group 'gd-none' does not exist\n"
    finally:
        raw.close()
        classic.close()
        kip848.close()


def test_classic_consumer_protocol_decoding_and_pending_partitions() -> None:
    import struct

    from straitmq.broker.http_api.groups import (
        _decode_consumer_assignment,
        _decode_consumer_subscription,
        _pending,
    )
    from straitmq.cli.main import _partitions

    def s(x: str) -> bytes:
        return struct.pack(">h", len(x)) + x.encode()

    # ConsumerProtocolAssignment v1: [topic [partition]], then user data (null).
    assignment = (
        struct.pack(">hi", 1, 2)
        + s("b")
        + struct.pack(">ii", 1, 4)
        + s("a")
        + struct.pack(">iii", 2, 2, 0)
        + struct.pack(">i", -1)
    )
    assert _decode_consumer_assignment(assignment) == {"b": [4], "a": [0, 2]}
    assert _decode_consumer_assignment(assignment[:9]) is None
    assert _decode_consumer_assignment(b"") is None
    # ConsumerProtocolSubscription v0: [topic], user data.
    subscription = struct.pack(">hi", 0, 2) + s("t2") + s("t1") + struct.pack(">i", -1)
    assert _decode_consumer_subscription(subscription) == ["t1", "t2"]
    assert _decode_consumer_subscription(b"\x00") is None
    # What a KIP-848 member's target gives it that it does not own yet.
    assert _pending({"a": [0]}, {"a": [0, 1], "b": [2]}) == {"a": [1], "b": [2]}
    assert _pending({"a": [0, 1]}, {"a": [0]}) == {}
    assert _partitions({"b": [4], "a": [0, 1, 2], "c": []}) == "a:0,1,2 b:4"
    assert _partitions({}) == "-"


def test_kip848_regex_member_and_pending_partitions_on_the_wire(broker):
    """Two KIP-848 members by ConsumerGroupHeartbeat: one subscribed by regular expression
    holds all 4 partitions; the second one's target takes 2 of them, which stay pending
    until the first revokes them."""
    from test_consumer_protocol import _join

    _create_topic(broker, "px", 4)
    r = Raw(broker)
    g, m1, m2 = "gd-pending", str(uuid.uuid4()), str(uuid.uuid4())
    try:
        j1 = wait_for(
            lambda: (
                (
                    x := r.call(
                        _join(g, m1, subscribed_topic_names=(), subscribed_topic_regex="p.*")
                    )
                ).error_code
                == 0
                and x
            ),
            30,
            "the first member",
        )
        assert sorted(j1.assignment.topic_partitions[0].partitions) == [0, 1, 2, 3]
        j2 = r.call(_join(g, m2, subscribed_topic_names=("px",)))
        assert j2.error_code == 0

        status, d = call(broker, "GET", f"/api/v1/groups/{g}")
        assert status == 200 and d["type"] == "consumer"
        assert d["state"] == "Reconciling" and d["group_epoch"] == d["assignment_epoch"]
        members = {m["member_id"]: m for m in d["members"]}
        first, second = members[m1], members[m2]
        assert first["subscribed_topic_regex"] == "p.*" and first["subscribed_topics"] == []
        assert first["assignment"] == {"px": [0, 1, 2, 3]} and first["pending"] == {}
        assert second["subscribed_topics"] == ["px"] and second["assignment"] == {}
        pending = second["pending"]["px"]
        assert len(pending) == 2 and set(pending) | set(first["target_assignment"]["px"]) == {
            0,
            1,
            2,
            3,
        }
        out = strait(broker, "group", "describe", g)
        assert out.returncode == 0, out.stderr
        assert "state Reconciling" in out.stdout.splitlines()[0]
        row = _line(out.stdout, m1).split()
        assert row[-3:] == ["p.*", "px:0,1,2,3", "-"]
        row = _line(out.stdout, m2).split()
        assert row[-3:] == ["px", "-", "px:" + ",".join(map(str, pending))]
    finally:
        r.close()


@pytest.fixture
def cluster(tmp_path):
    from cluster_support import cluster_factory

    yield from cluster_factory(tmp_path)


def test_group_list_covers_every_coordinator_of_a_cluster(cluster) -> None:
    """`strait group list` asks one broker, which asks the others for the groups they
    coordinate (as `kafka-consumer-groups --list` asks each broker)."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    c = cluster(brokers=3)
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic("gl", 1, 1)])["gl"].result(30)
    names = [f"gl-{i}" for i in range(8)]
    for g in names:  # committed offsets make an (empty) group at its coordinator
        consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": g})
        consumer.commit(offsets=[TopicPartition("gl", 0, 1)], asynchronous=False)
        consumer.close()
    first = SimpleNamespace(http=f"http://127.0.0.1:{c.brokers[1].http_port}")

    def listed(path: str) -> set[str]:
        status, body = call(first, "GET", path)
        assert status == 200, body
        return {g["group_id"] for g in body["groups"]} & set(names)

    local = listed("/api/v1/groups?scope=local")
    assert local < set(names), "one broker coordinates all: the test proves nothing"
    assert listed("/api/v1/groups") == set(names)
    out = strait(first, "group", "list")
    assert out.returncode == 0 and all(g in out.stdout for g in names), out
