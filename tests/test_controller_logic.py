"""The controller's decisions as pure functions: placement, election, reassignment,
ISR changes. Each test builds a MetadataImage by hand (or through the operations
themselves), feeds one request and checks the records, then applies them the way every
node does and checks the resulting image."""

from __future__ import annotations

from collections import Counter

import orjson
import pytest
from kio.schema.errors import ErrorCode
from straitmq.controller import operations as ops
from straitmq.controller.election import (
    on_broker_leaving,
    on_broker_returning,
    on_replicas_offline,
    preferred_leader_changes,
)
from straitmq.controller.errors import ControllerError
from straitmq.controller.placement import place, rack_alternated
from straitmq.metadata.image import NO_LEADER, MetadataImage, Record
from straitmq.metadata.topic_config import TOPIC_CONFIGS, effective

# -- building images -----------------------------------------------------------------------


def cluster(brokers: int | dict[int, str | None], fenced: tuple[int, ...] = ()) -> MetadataImage:
    """Brokers 1..n (or {id: rack}), registered and unfenced except `fenced`."""
    racks = brokers if isinstance(brokers, dict) else {b: None for b in range(1, brokers + 1)}
    img = MetadataImage(cluster_id="test-cluster")
    for bid, rack in racks.items():
        img.apply(
            {
                "type": "register_broker",
                "id": bid,
                "incarnation": f"inc-{bid}",
                "host": "127.0.0.1",
                "port": 9000 + bid,
                "http_port": 8000 + bid,
                "rack": rack,
            }
        )
        if bid not in fenced:
            img.apply({"type": "unfence_broker", "id": bid})
    return img


def apply(img: MetadataImage, records: list[Record]) -> MetadataImage:
    for r in records:
        img.apply(r)
    return img


def topic(
    img: MetadataImage,
    name: str,
    assignments: list[list[int]],
    configs: dict[str, str | None] | None = None,
) -> MetadataImage:
    return apply(img, ops.create_topic(img, name, -1, -1, configs or {}, assignments=assignments))


def fence(img: MetadataImage, bid: int) -> MetadataImage:
    """What the active controller commits when a broker's session expires."""
    return apply(img, [{"type": "fence_broker", "id": bid}, *on_broker_leaving(img, bid)])


def unfence(img: MetadataImage, bid: int) -> MetadataImage:
    return apply(img, [{"type": "unfence_broker", "id": bid}, *on_broker_returning(img, bid)])


def set_isr(img: MetadataImage, name: str, index: int, isr: list[int]) -> list[Record]:
    """The partition's leader proposes `isr` (AlterPartition) at the current epochs."""
    p = img.topics[name].partitions[index]
    return ops.alter_partition(img, p.leader, name, index, p.leader_epoch, p.partition_epoch, isr)


def code_of(call) -> tuple[int, str]:
    with pytest.raises(ControllerError) as info:
        call()
    return info.value.code, info.value.message


# -- placement -----------------------------------------------------------------------------


@pytest.mark.parametrize(("brokers", "partitions", "rf"), [(3, 30, 3), (5, 100, 3), (6, 60, 2)])
def test_placement_spreads_leaders_and_replicas_evenly(
    brokers: int, partitions: int, rf: int
) -> None:
    img = cluster(brokers)
    lists = place(img.live_brokers(), partitions, rf, 0, 0)
    assert all(len(r) == rf and len(set(r)) == rf for r in lists)
    leaders = Counter(r[0] for r in lists)
    replicas = Counter(b for r in lists for b in r)
    assert set(leaders) == set(replicas) == set(range(1, brokers + 1))
    assert max(leaders.values()) - min(leaders.values()) <= 1, leaders
    assert max(replicas.values()) - min(replicas.values()) <= 1, replicas


def test_successive_topics_start_their_leaders_on_different_brokers() -> None:
    img = cluster(3)
    for name in ("a", "b", "c"):
        apply(img, ops.create_topic(img, name, 1, 3, {}))
    leaders = [img.topics[n].partitions[0].leader for n in ("a", "b", "c")]
    assert sorted(leaders) == [1, 2, 3]
    # Many single-partition topics: leadership stays balanced across brokers.
    for i in range(30):
        apply(img, ops.create_topic(img, f"t{i}", 1, 2, {}))
    counts = Counter(t.partitions[0].leader for t in img.topics.values())
    assert max(counts.values()) - min(counts.values()) <= 1, counts


def test_rack_aware_placement_puts_one_replica_in_each_rack() -> None:
    racks = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
    img = cluster(racks)
    assert rack_alternated(img.live_brokers()) == [1, 3, 5, 2, 4, 6]
    lists = place(img.live_brokers(), 60, 3, 0, 7)
    for replicas in lists:
        assert sorted(racks[b] for b in replicas) == ["a", "b", "c"], replicas
    leaders = Counter(r[0] for r in lists)
    assert max(leaders.values()) - min(leaders.values()) <= 1


def test_rack_aware_placement_through_create_topic() -> None:
    racks = {1: "r1", 2: "r2", 3: "r3"}
    img = cluster(racks)
    apply(img, ops.create_topic(img, "t", 12, 3, {}))
    for p in img.topics["t"].partitions:
        assert {racks[b] for b in p.replicas} == {"r1", "r2", "r3"}
        assert p.isr == p.replicas and p.leader == p.replicas[0]


def test_replication_factor_larger_than_live_brokers_is_refused() -> None:
    img = cluster(4, fenced=(4,))  # 4 registered, 3 alive
    code, message = code_of(lambda: ops.create_topic(img, "t", 1, 4, {}))
    assert code == ErrorCode.invalid_replication_factor == 38
    assert "replication factor 4" in message and "3 available" in message
    apply(img, ops.create_topic(img, "t", 1, 3, {}))
    assert 4 not in img.topics["t"].partitions[0].replicas
    assert code_of(lambda: ops.create_topic(img, "u", 1, 0, {}))[0] == 38
    assert code_of(lambda: ops.create_partitions(img, "t", 2, [[1, 9]]))[0] == 39


# -- election ------------------------------------------------------------------------------


def test_election_prefers_the_preferred_replica_in_the_isr() -> None:
    img = topic(cluster(4), "t", [[2, 3, 4]])
    assert img.topics["t"].partitions[0].leader == 2
    fence(img, 2)
    p = img.topics["t"].partitions[0]
    assert (p.leader, p.isr, p.leader_epoch) == (3, [3, 4], 1)
    # 3 leads; when it goes too, 4 (the next replica in the ISR) takes over.
    fence(img, 3)
    assert (p.leader, p.isr) == (4, [4])
    # A returning broker that is not in the ISR does not take over...
    unfence(img, 2)
    assert (p.leader, p.isr) == (4, [4])
    # ...and preferred-leader rebalancing waits until it is back in sync.
    assert preferred_leader_changes(img) == []
    apply(img, set_isr(img, "t", 0, [4, 2]))
    apply(img, preferred_leader_changes(img))
    assert (p.leader, p.isr) == (2, [4, 2])


def test_election_skips_a_preferred_replica_that_is_not_in_sync() -> None:
    img = topic(cluster(3), "t", [[1, 2, 3]])
    apply(img, set_isr(img, "t", 0, [1, 3]))  # 2 fell behind
    fence(img, 1)
    p = img.topics["t"].partitions[0]
    assert (p.leader, p.isr) == (3, [3])


def test_no_leader_when_the_isr_is_dead_unless_unclean_election_is_enabled() -> None:
    for unclean in (False, True):
        configs = {"unclean.leader.election.enable": "true"} if unclean else {}
        img = topic(cluster(3), "t", [[1, 2, 3]], configs)
        apply(img, set_isr(img, "t", 0, [1]))  # followers fell behind
        fence(img, 1)
        p = img.topics["t"].partitions[0]
        if unclean:
            assert (p.leader, p.isr) == (2, [2])  # data loss accepted by the topic
        else:
            assert (p.leader, p.isr) == (NO_LEADER, [1])  # offline, waiting for 1
            unfence(img, 1)
            assert (p.leader, p.isr) == (1, [1])  # back with all its data


def test_broker_leaving_keeps_the_last_isr_member() -> None:
    img = topic(cluster(3), "t", [[1, 2, 3]])
    fence(img, 3)
    fence(img, 2)
    p = img.topics["t"].partitions[0]
    assert (p.leader, p.isr) == (1, [1])
    fence(img, 1)
    assert (p.leader, p.isr) == (NO_LEADER, [1])
    # A replica that was not in the ISR coming back does not lead (clean election only).
    unfence(img, 2)
    assert (p.leader, p.isr) == (NO_LEADER, [1])
    unfence(img, 1)
    assert (p.leader, p.isr) == (1, [1])


def test_controlled_shutdown_moves_leadership_and_drops_the_broker_from_isrs() -> None:
    img = topic(cluster(3), "t", [[1, 2, 3], [2, 3, 1]])
    apply(img, [{"type": "broker_shutdown", "id": 1}, *on_broker_leaving(img, 1)])
    p0, p1 = img.topics["t"].partitions
    assert (p0.leader, p0.isr) == (2, [2, 3])
    assert (p1.leader, p1.isr) == (2, [2, 3])


def test_replicas_a_broker_cannot_open_are_led_elsewhere_and_leave_the_isr() -> None:
    img = topic(cluster(3), "t", [[1, 2, 3], [2, 1, 3]])
    fence(img, 3)
    topic(img, "s", [[1]])
    topic(img, "u", [[1, 2]])
    apply(img, set_isr(img, "u", 0, [1]))
    offline = [("t", 0), ("t", 1), ("s", 0), ("u", 0), ("gone", 0), ("t", 9)]
    apply(img, on_replicas_offline(img, 1, offline))
    t0, t1 = img.topics["t"].partitions
    assert (t0.leader, t0.isr) == (2, [2])  # led elsewhere, 1 out of the ISR
    assert (t1.leader, t1.isr) == (2, [2])  # 1 only leaves the ISR
    s0 = img.topics["s"].partitions[0]
    assert (s0.leader, s0.isr) == (1, [1])  # the only replica: stays, leads once it opens
    u0 = img.topics["u"].partitions[0]
    assert (u0.leader, u0.isr) == (1, [1])  # the last in-sync copy stays
    # Nothing left to change: a steady report writes nothing.
    assert on_replicas_offline(img, 1, offline) == []


def test_preferred_leader_rebalancing() -> None:
    img = topic(cluster(3), "t", [[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    fence(img, 1)
    unfence(img, 1)
    parts = img.topics["t"].partitions
    assert [p.leader for p in parts] == [2, 2, 3]
    assert preferred_leader_changes(img) == []  # 1 is alive but not back in the ISRs
    apply(img, set_isr(img, "t", 0, [2, 3, 1]))
    changes = preferred_leader_changes(img)
    assert changes == [{"type": "partition_change", "topic": "t", "index": 0, "leader": 1}]
    apply(img, changes)
    assert [p.leader for p in parts] == [1, 2, 3]
    assert parts[0].leader_epoch == 2  # 1 -> 2 (epoch 1) -> 1 (epoch 2)
    assert preferred_leader_changes(img) == []
    # A fenced preferred replica is never chosen, even if the ISR still lists it.
    img2 = topic(cluster(3), "u", [[1, 2, 3]])
    apply(img2, [{"type": "partition_change", "topic": "u", "index": 0, "leader": 2}])
    apply(img2, [{"type": "fence_broker", "id": 1}])
    assert preferred_leader_changes(img2) == []


# -- reassignment --------------------------------------------------------------------------


def test_reassignment_adds_then_removes_replicas_once_the_new_ones_are_in_sync() -> None:
    img = topic(cluster(4), "t", [[1, 2, 3]])
    p = img.topics["t"].partitions[0]
    apply(img, ops.reassign(img, "t", 0, [2, 3, 4]))
    assert (p.replicas, p.adding, p.removing, p.isr) == ([2, 3, 4, 1], [4], [1], [1, 2, 3])
    assert img.topics["t"].replication_factor == 3
    assert p.leader == 1  # leadership stays until the move completes
    # The leader reports 4 in sync: the move completes in the same change.
    apply(img, set_isr(img, "t", 0, [1, 2, 3, 4]))
    assert (p.replicas, p.adding, p.removing) == ([2, 3, 4], [], [])
    assert p.isr == [2, 3, 4]
    assert p.leader == 2  # 1 left, the new preferred replica leads
    # An ISR change that leaves a target replica out does not complete it.
    img = topic(cluster(4), "t", [[1, 2, 3]])
    p = img.topics["t"].partitions[0]
    apply(img, ops.reassign(img, "t", 0, [2, 3, 4]))
    apply(img, set_isr(img, "t", 0, [1, 2, 4]))
    assert (p.adding, p.removing, p.replicas) == ([4], [1], [2, 3, 4, 1])


def test_reassignment_that_only_removes_replicas_completes_at_once() -> None:
    img = topic(cluster(3), "t", [[1, 2, 3]])
    p = img.topics["t"].partitions[0]
    apply(img, ops.reassign(img, "t", 0, [2, 3]))
    assert (p.replicas, p.isr, p.adding, p.removing, p.leader) == ([2, 3], [2, 3], [], [], 2)
    assert ops.reassign(img, "t", 0, [2, 3]) == []  # already there: nothing to do


def test_cancelling_a_reassignment_restores_the_original_replicas() -> None:
    img = topic(cluster(5), "t", [[1, 2, 3]])
    p = img.topics["t"].partitions[0]
    apply(img, ops.reassign(img, "t", 0, [3, 4, 5]))
    assert (p.replicas, p.adding, p.removing) == ([3, 4, 5, 1, 2], [4, 5], [1, 2])
    apply(img, set_isr(img, "t", 0, [1, 2, 3, 4]))  # 4 caught up, 5 not yet
    apply(img, ops.reassign(img, "t", 0, None))
    # Kafka's revert too keeps the merged order (target + removing, minus adding).
    assert (p.replicas, p.isr, p.adding, p.removing) == ([3, 1, 2], [1, 2, 3], [], [])
    assert p.leader == 1
    code, message = code_of(lambda: ops.reassign(img, "t", 0, None))
    assert code == ErrorCode.no_reassignment_in_progress == 85
    assert "t-0" in message


def test_reassignment_is_refused_for_unknown_brokers_topics_and_partitions() -> None:
    img = topic(cluster(3), "t", [[1, 2, 3]])
    code, message = code_of(lambda: ops.reassign(img, "t", 0, [1, 2, 99]))
    assert code == ErrorCode.invalid_replica_assignment == 39 and "broker 99" in message
    assert code_of(lambda: ops.reassign(img, "t", 0, [1, 1, 2]))[0] == 39
    assert code_of(lambda: ops.reassign(img, "t", 0, []))[0] == 39
    assert code_of(lambda: ops.reassign(img, "nope", 0, [1]))[0] == 3  # UNKNOWN_TOPIC_OR_PARTITION
    assert code_of(lambda: ops.reassign(img, "t", 5, [1]))[0] == 3  # UNKNOWN_TOPIC_OR_PARTITION


def test_changing_the_target_of_a_reassignment_in_flight() -> None:
    img = topic(cluster(5), "t", [[1, 2, 3]])
    p = img.topics["t"].partitions[0]
    apply(img, ops.reassign(img, "t", 0, [1, 2, 4]))
    assert (p.replicas, p.adding, p.removing) == ([1, 2, 4, 3], [4], [3])
    # 4 is dropped before it caught up; 5 is the new destination.
    apply(img, ops.reassign(img, "t", 0, [1, 2, 5]))
    assert (p.replicas, p.adding, p.removing) == ([1, 2, 5, 3], [5], [3])
    assert all(r in p.replicas for r in p.isr)
    apply(img, set_isr(img, "t", 0, [1, 2, 3, 5]))
    assert (p.replicas, p.isr, p.adding, p.removing) == ([1, 2, 5], [1, 2, 5], [], [])


def test_a_replica_dropped_from_the_target_in_flight_also_leaves_the_isr() -> None:
    img = topic(cluster(6), "t", [[1, 2, 3]])
    p = img.topics["t"].partitions[0]
    apply(img, ops.reassign(img, "t", 0, [1, 4, 5]))
    apply(img, set_isr(img, "t", 0, [1, 2, 3, 4]))  # 4 in sync, 5 not yet
    assert (p.adding, p.removing) == ([4, 5], [2, 3])
    apply(img, ops.reassign(img, "t", 0, [1, 5, 6]))  # 4 is not wanted after all
    assert 4 not in p.replicas
    assert 4 not in p.isr, f"ISR {p.isr} holds a broker that is no longer a replica"


def test_alter_partition_fences_stale_leaders_and_stale_partition_epochs() -> None:
    img = topic(cluster(3), "t", [[1, 2, 3]])
    p = img.topics["t"].partitions[0]
    le, pe = p.leader_epoch, p.partition_epoch
    # Not the leader.
    code, _ = code_of(lambda: ops.alter_partition(img, 2, "t", 0, le, pe, [2, 3]))
    assert code == ErrorCode.fenced_leader_epoch == 74
    # The leader, but from an older leader epoch (it was replaced and came back).
    fence(img, 1)
    unfence(img, 1)
    apply(img, set_isr(img, "t", 0, [2, 3, 1]))
    apply(img, preferred_leader_changes(img))
    assert p.leader == 1 and p.leader_epoch == le + 2
    code, message = code_of(lambda: ops.alter_partition(img, 1, "t", 0, le, p.partition_epoch, [1]))
    assert code == 74 and f"epoch {p.leader_epoch}" in message
    # The right leader epoch but an older partition epoch: someone changed it meanwhile.
    stale = p.partition_epoch
    apply(img, ops.alter_partition(img, 1, "t", 0, p.leader_epoch, stale, [1, 2]))
    code, _ = code_of(lambda: ops.alter_partition(img, 1, "t", 0, p.leader_epoch, stale, [1]))
    assert code == ErrorCode.invalid_update_version == 95
    # The ISR must hold the leader and only replicas; fenced brokers cannot join.
    cur = (p.leader_epoch, p.partition_epoch)
    assert code_of(lambda: ops.alter_partition(img, 1, "t", 0, *cur, [2, 3]))[0] == 42
    assert code_of(lambda: ops.alter_partition(img, 1, "t", 0, *cur, [1, 7]))[0] == 42
    apply(img, [{"type": "fence_broker", "id": 3}])
    code, message = code_of(lambda: ops.alter_partition(img, 1, "t", 0, *cur, [1, 2, 3]))
    assert code == 42 and "broker 3" in message
    # Each accepted change moves the partition epoch on.
    before = p.partition_epoch
    apply(img, ops.alter_partition(img, 1, "t", 0, *cur, [1]))
    assert (p.isr, p.partition_epoch) == ([1], before + 1)


def test_a_replica_cannot_join_the_isr_on_a_previous_processs_fetches() -> None:
    """KIP-903: the leader names the broker registration each joining member's caught-up
    fetches came from; one that registered again since (a restart: its unflushed tail
    may be gone) is refused with INELIGIBLE_REPLICA, retriable once it caught up anew.
    A leader that names none (a broker from before) is not checked."""
    img = topic(cluster(3), "t", [[1, 2, 3]])
    p = img.topics["t"].partitions[0]
    apply(img, set_isr(img, "t", 0, [1, 2]))
    cur = (p.leader_epoch, p.partition_epoch)
    img.apply(
        {"type": "register_broker", "id": 3, "incarnation": "inc-3b", "host": "127.0.0.1"}
        | {"port": 9003, "http_port": 8003}
    )
    unfence(img, 3)
    code, message = code_of(
        lambda: ops.alter_partition(img, 1, "t", 0, *cur, [1, 2, 3], {3: "inc-3"})
    )
    assert code == ErrorCode.ineligible_replica == 107 and "broker 3" in message
    code, _ = code_of(lambda: ops.alter_partition(img, 1, "t", 0, *cur, [1, 2, 3], {}))
    assert code == 107  # a joining member must be named
    records, refused = ops.alter_partitions(
        img,
        1,
        [
            {"topic": "t", "index": 0, "leader_epoch": cur[0], "partition_epoch": cur[1]}
            | {"isr": [1, 2, 3], "incarnations": {"3": "inc-3"}}
        ],
    )
    assert not records and refused[0].code == 107
    apply(img, ops.alter_partition(img, 1, "t", 0, *cur, [1, 2, 3], {3: "inc-3b"}))
    assert p.isr == [1, 2, 3]
    apply(img, ops.alter_partition(img, 1, "t", 0, p.leader_epoch, p.partition_epoch, [1, 2]))
    apply(img, ops.alter_partition(img, 1, "t", 0, p.leader_epoch, p.partition_epoch, [1, 2, 3]))
    assert p.isr == [1, 2, 3]  # no incarnations: not checked


def test_cluster_configs_validate_the_throttle() -> None:
    rec = ops.alter_cluster_configs({"replication.throttled.rate": "1048576"})
    img = apply(cluster(1), rec)
    assert img.cluster_configs == {"replication.throttled.rate": "1048576"}
    apply(img, ops.alter_cluster_configs({"replication.throttled.rate": None}))
    assert img.cluster_configs == {}
    for bad in ("0", "-5", "fast"):
        code, _ = code_of(
            lambda bad=bad: ops.alter_cluster_configs({"replication.throttled.rate": bad})
        )
        assert code == ErrorCode.invalid_config
    code, message = code_of(lambda: ops.alter_cluster_configs({"no.such": "1"}))
    assert code == ErrorCode.invalid_config and "replication.throttled.rate" in message


@pytest.mark.parametrize(
    "policy", ["delete", "compact", "compact,delete", "delete, compact", "compact,compact", ""]
)
def test_every_cleanup_policy_kafka_allows_is_accepted(policy: str) -> None:
    img = topic(cluster(1), "t", [[1]], {"cleanup.policy": policy})
    assert img.topics["t"].configs == {"cleanup.policy": policy}
    apply(img, ops.alter_configs(img, "t", {"cleanup.policy": "compact"}))
    assert img.topics["t"].configs["cleanup.policy"] == "compact"


@pytest.mark.parametrize(
    ("configs", "fragment"),
    [
        ({"cleanup.policy": "compact,bogus"}, "'bogus' is not a cleanup policy"),
        ({"cleanup.policy": "Compact"}, "'Compact' is not a cleanup policy"),
        ({"cleanup.policy": "compact,"}, "'' is not a cleanup policy"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "min.cleanable.dirty.ratio: 1.5 is outside"),
        ({"min.cleanable.dirty.ratio": "half"}, "'half' is not a number"),
        ({"max.compaction.lag.ms": "0"}, "max.compaction.lag.ms: 0 is outside"),
        ({"delete.retention.ms": "-1"}, "delete.retention.ms: -1 is outside"),
        ({"preallocate": "yes"}, "'yes' is not true or false"),
        ({"remote.storage.enable": "true"}, "tiered storage is not supported"),
        ({"message.timestamp.difference.max.ms": "1"}, "unknown topic config"),  # gone in 4.0
        (
            {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"},
            "min.compaction.lag.ms (10) > max.compaction.lag.ms (5)",
        ),
    ],
)
def test_bad_topic_configs_are_refused_saying_why(configs: dict, fragment: str) -> None:
    img = cluster(1)
    code, message = code_of(lambda: ops.create_topic(img, "t", 1, 1, configs))
    assert code == ErrorCode.invalid_config and fragment in message, message
    assert "t" not in img.topics


def test_the_compaction_lag_rule_holds_across_alterations() -> None:
    """Kafka checks min.compaction.lag.ms <= max.compaction.lag.ms on the topic's configs
    after the change, not only on the change."""
    img = topic(cluster(1), "t", [[1]], {"min.compaction.lag.ms": "1000"})
    code, message = code_of(lambda: ops.alter_configs(img, "t", {"max.compaction.lag.ms": "10"}))
    assert code == ErrorCode.invalid_config and "(1000) > max.compaction.lag.ms (10)" in message
    # Lowering the minimum in the same change makes it valid; so does deleting it.
    apply(
        img,
        ops.alter_configs(img, "t", {"max.compaction.lag.ms": "10", "min.compaction.lag.ms": "5"}),
    )
    apply(img, ops.alter_configs(img, "t", {"min.compaction.lag.ms": None}))
    assert img.topics["t"].configs == {"max.compaction.lag.ms": "10"}


def test_every_kafka_44_topic_config_is_known() -> None:
    """The names Kafka 4.4's LogConfig defines (MirrorMaker 2 copies or deletes all of
    them; kafka-reassign-partitions --verify deletes the throttled-replica lists)."""
    kafka_44 = set(
        """
        cleanup.policy compression.gzip.level compression.lz4.level compression.type
        compression.zstd.level delete.retention.ms errors.deadletterqueue.group.enable
        file.delete.delay.ms flush.messages
        flush.ms follower.replication.throttled.replicas index.interval.bytes
        leader.replication.throttled.replicas local.retention.bytes local.retention.ms
        max.compaction.lag.ms max.decompressed.message.bytes max.message.bytes
        message.timestamp.after.max.ms
        message.timestamp.before.max.ms message.timestamp.type min.cleanable.dirty.ratio
        min.compaction.lag.ms min.insync.replicas preallocate remote.copy.lag.bytes
        remote.copy.lag.ms remote.log.copy.disable
        remote.log.delete.on.disable remote.storage.enable retention.bytes retention.ms
        segment.bytes segment.index.bytes segment.jitter.ms segment.ms
        unclean.leader.election.enable
        """.split()
    )
    assert set(TOPIC_CONFIGS) == kafka_44
    img = cluster(1)
    deletes = {name: None for name in kafka_44}  # what MM2 sends for source defaults
    topic(img, "t", [[1]])
    apply(img, ops.alter_configs(img, "t", deletes))
    values = effective({"cleanup.policy": "delete , compact", "min.cleanable.dirty.ratio": "0.50"})
    assert values["cleanup.policy"] == "delete,compact"  # as Kafka describes a LIST
    assert values["min.cleanable.dirty.ratio"] == "0.5"
    assert (values["delete.retention.ms"], values["max.compaction.lag.ms"]) == (
        "86400000",
        str(2**63 - 1),
    )


def test_cluster_configs_take_the_runtime_broker_configs() -> None:
    img = apply(cluster(1), ops.alter_cluster_configs({"log.cleaner.threads": "2"}))
    apply(img, ops.alter_cluster_configs({"log.cleanup.policy": "compact,delete"}))
    apply(img, ops.alter_cluster_configs({"replica.alter.log.dirs.io.max.bytes.per.second": "0"}))
    assert img.cluster_configs == {
        "log.cleaner.threads": "2",
        "log.cleanup.policy": "compact,delete",
        "replica.alter.log.dirs.io.max.bytes.per.second": "0",
    }
    apply(img, ops.alter_cluster_configs({"log.cleaner.threads": None}))
    assert "log.cleaner.threads" not in img.cluster_configs
    for key, bad in [
        ("log.cleaner.threads", "many"),
        ("log.cleaner.min.cleanable.ratio", "2"),
        ("log.cleanup.policy", "shred"),
        ("log.cleaner.io.max.bytes.per.second", "-1"),
    ]:
        code, message = code_of(lambda k=key, v=bad: ops.alter_cluster_configs({k: v}))
        assert code == ErrorCode.invalid_config and key in message, message


def test_image_snapshots_keep_reassignments() -> None:
    img = topic(cluster(4), "t", [[1, 2, 3]])
    apply(img, ops.reassign(img, "t", 0, [2, 3, 4]))
    again = MetadataImage.from_dict(img.to_dict())
    p = again.topics["t"].partitions[0]
    assert (p.replicas, p.adding, p.removing) == ([2, 3, 4, 1], [4], [1])
    assert again.to_dict() == img.to_dict()


def test_snapshot_encoding_is_incremental_and_exact() -> None:
    """`encoded()` reuses unchanged topics' bytes; after any mix of changes it still
    decodes to exactly `to_dict()`, and both load back to the same image. Snapshots
    written before the positional partition form (a dict per partition) still load."""
    img = topic(topic(cluster(4), "a", [[1, 2, 3]] * 3), "b", [[2, 3, 4]] * 2)
    first = img.encoded()
    assert orjson.loads(first) == img.to_dict()
    cached_b = img._encoded["b"]
    apply(img, ops.reassign(img, "a", 1, [2, 3, 4]))  # changes a, not b
    apply(img, ops.alter_configs(img, "a", {"retention.ms": "1000"}))
    apply(img, ops.alter_cluster_configs({"replication.throttled.rate": "1048576"}))
    fence(img, 2)  # leaders and ISRs of both topics move
    apply(img, ops.delete_topic(img, "b"))
    img = topic(img, "b", [[1, 3, 4]])  # a new topic of the same name
    again = img.encoded()
    assert img._encoded.get("b") is not cached_b
    assert orjson.loads(again) == img.to_dict()
    assert MetadataImage.from_dict(orjson.loads(again)).to_dict() == img.to_dict()
    old_form = img.to_dict()
    fields = ("replicas", "isr", "leader", "leader_epoch", "partition_epoch", "adding", "removing")
    for t in old_form["topics"]:
        t["partitions"] = [dict(zip(fields, p, strict=True)) for p in t["partitions"]]
    assert MetadataImage.from_dict(old_form).to_dict() == img.to_dict()
    # copy() is independent of the original.
    dup = img.copy()
    fence(dup, 3)
    assert dup.to_dict() != img.to_dict() and orjson.loads(img.encoded()) == img.to_dict()


def test_a_new_target_that_drops_the_leader_elects_another() -> None:
    img = topic(cluster(5), "t", [[1, 2, 3]])
    p = img.topics["t"].partitions[0]
    apply(img, ops.reassign(img, "t", 0, [4, 5, 3]))
    apply(img, set_isr(img, "t", 0, [1, 2, 3, 4]))  # 4 in sync, 5 not yet
    fence(img, 1)
    assert p.leader == 4  # the first target replica in sync leads
    apply(img, ops.reassign(img, "t", 0, [1, 2, 3]))  # back to where it came from
    assert (p.replicas, p.adding, p.removing) == ([1, 2, 3], [], [])
    assert (p.leader, p.isr) == (2, [2, 3])


def test_a_new_target_that_would_leave_no_in_sync_replica_is_refused() -> None:
    img = topic(cluster(6), "t", [[1, 2, 3]])
    p = img.topics["t"].partitions[0]
    apply(img, ops.reassign(img, "t", 0, [4, 5, 6]))
    apply(img, set_isr(img, "t", 0, [1, 2, 3, 4]))
    for b in (1, 2, 3):
        fence(img, b)
    assert (p.leader, p.isr) == (4, [4])
    code, message = code_of(lambda: ops.reassign(img, "t", 0, [1, 5, 6]))
    assert code == ErrorCode.invalid_replica_assignment and "keep one of [4]" in message


def test_alter_partitions_judges_each_item_alone() -> None:
    """A leader's batch of ISR changes (one AlterPartition call for many partitions):
    the good ones become records, the stale or repeated ones are refused by position
    with alter_partition's own errors, and a refusal holds back none of the others."""
    img = topic(cluster(3), "t", [[1, 2, 3], [1, 2, 3], [2, 1, 3]])
    p0, p1, p2 = img.topics["t"].partitions
    items = [
        {
            "topic": "t",
            "index": 0,
            "leader_epoch": p0.leader_epoch,
            "partition_epoch": p0.partition_epoch,
            "isr": [1, 2],
        },
        {
            "topic": "t",
            "index": 1,
            "leader_epoch": p1.leader_epoch,
            "partition_epoch": p1.partition_epoch - 1,
            "isr": [1],
        },  # stale partition epoch
        {
            "topic": "t",
            "index": 2,
            "leader_epoch": p2.leader_epoch,
            "partition_epoch": p2.partition_epoch,
            "isr": [1, 3],
        },  # broker 1 does not lead it
        {
            "topic": "t",
            "index": 0,
            "leader_epoch": p0.leader_epoch,
            "partition_epoch": p0.partition_epoch,
            "isr": [1],
        },  # named twice
        {"topic": "gone", "index": 0, "leader_epoch": 0, "partition_epoch": 0, "isr": [1]},
    ]
    records, refused = ops.alter_partitions(img, 1, items)
    assert [(r["topic"], r["index"], r["isr"]) for r in records] == [("t", 0, [1, 2])]
    assert {i: e.code for i, e in refused.items()} == {
        1: ErrorCode.invalid_update_version,
        2: ErrorCode.fenced_leader_epoch,
        3: ErrorCode.invalid_request,
        4: ErrorCode.unknown_topic_or_partition,
    }
    apply(img, records)
    assert p0.isr == [1, 2] and p1.isr == [1, 2, 3]
