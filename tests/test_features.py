"""Feature levels as metadata (straitmq.metadata.features, the image's feature_level
records): finalized on purpose, all or nothing, never beyond what some node supports, and
never read by a node that cannot serve them. The sans-IO planner and the image, plus the
controller's refusal of a broker registration below the cluster's levels."""

from __future__ import annotations

import asyncio
import uuid
import zlib

import orjson
import pytest
from straitmq.controller.active import (
    ActiveController,
    ControllerSettings,
    bootstrap_feature_records,
)
from straitmq.controller.quorum import Quorum
from straitmq.metadata import features as F
from straitmq.metadata.image import RECORD_VERSIONS, MetadataImage, MetadataVersionError
from straitmq.raft.core import RaftConfig

CURRENT = F.supported_ranges()
CFG = RaftConfig(election_timeout_ms=50, fetch_timeout_ms=100)


def plan(explicit: dict, updates: dict, nodes: dict | None = None) -> tuple[list, dict]:
    return F.plan_update(explicit, updates, nodes if nodes is not None else {"me": CURRENT})


def test_a_log_without_feature_records_runs_at_0_1_0s_levels() -> None:
    image = MetadataImage()
    assert image.finalized_features() == F.BASELINE
    assert F.BASELINE[F.STRAITMQ] == 1
    # 0.1.0 reported these truthfully except kraft.version and group.version.
    assert F.BASELINE["transaction.version"] == 2
    assert F.BASELINE["group.version"] == 1


def test_the_first_finalization_is_straitmq_metadata_version_and_needs_every_node() -> None:
    # Nothing else moves while the cluster is still readable by 0.1.0.
    records, refused = plan({}, {"share.version": (0, F.SAFE_DOWNGRADE)})
    assert records == [] and "finalize straitmq.metadata.version=2 first" in (
        refused["share.version"].message
    )
    # A broker of 0.1.0 (it sent no ranges) blocks it, and is named.
    nodes = {"controller 1": CURRENT, "broker 2": F.RELEASE_0_1_0}
    records, refused = plan({}, {F.STRAITMQ: (2, F.UPGRADE)}, nodes)
    assert records == []
    assert "broker 2 does not support straitmq.metadata.version=2" in refused[F.STRAITMQ].message
    assert refused[F.STRAITMQ].code == F.INVALID_UPDATE_VERSION
    # Once every node runs this release it goes through, with others in the same request.
    records, refused = plan(
        {}, {F.STRAITMQ: (2, F.UPGRADE), "transaction.version": (1, F.SAFE_DOWNGRADE)}
    )
    assert refused == {}
    assert records == [
        {"type": "feature_level", "name": F.STRAITMQ, "level": 2},
        {"type": "feature_level", "name": "transaction.version", "level": 1},
    ]


def test_refusals_say_why_and_are_all_or_nothing() -> None:
    at2 = {F.STRAITMQ: 2}
    cases = {
        "no.such": ((1, F.UPGRADE), "unknown feature"),
        F.STRAITMQ: ((1, F.SAFE_DOWNGRADE), "cannot be downgraded from 2 to 1"),
        "metadata.version": ((20, F.UNSAFE_DOWNGRADE), "cannot be downgraded"),
        "transaction.version": ((1, F.UPGRADE), "is a downgrade"),
        "group.version": ((5, F.UPGRADE), "supported range 0..1"),
        "share.version": ((0, 9), "unknown upgrade type"),
    }
    for name, (update, why) in cases.items():
        records, refused = plan(at2, {name: update, "streams.version": (0, F.SAFE_DOWNGRADE)})
        assert records == [], name
        assert why in refused[name].message, (name, refused[name].message)
    # An upgrade type that says downgrade for a raise is refused too.
    _, refused = plan(at2, {"kraft.version": (1, F.SAFE_DOWNGRADE)})
    assert refused == {}  # already 1: nothing to do, nothing refused
    _, refused = plan({**at2, "group.version": 0}, {"group.version": (1, F.SAFE_DOWNGRADE)})
    assert "that is an upgrade" in refused["group.version"].message


def test_a_node_that_cannot_serve_the_new_level_blocks_it() -> None:
    old_controller = {**CURRENT, "transaction.version": [0, 1]}
    _, refused = plan(
        {F.STRAITMQ: 2, "transaction.version": 1},
        {"transaction.version": (2, F.UPGRADE)},
        {"controller 1001": CURRENT, "controller 1002": old_controller},
    )
    assert "controller 1002 does not support transaction.version=2" in (
        refused["transaction.version"].message
    )


def test_feature_records_apply_snapshot_and_stop_a_node_beyond_its_range() -> None:
    # A cluster that release 0.2.0 can join starts at 0.2.0's newest levels.
    at2 = MetadataImage()
    for r in bootstrap_feature_records(2):
        at2.apply(r)
    assert at2.finalized_features() == {n: hi for n, (_, hi) in F.RELEASES["0.2.0"].items()}
    with pytest.raises(ValueError, match=r"no release runs at straitmq\.metadata\.version=9"):
        bootstrap_feature_records(9)
    image = MetadataImage()
    for r in bootstrap_feature_records(F.LATEST[F.STRAITMQ]):
        image.apply(r)
    assert image.finalized_features() == F.LATEST
    again = MetadataImage.from_dict(orjson.loads(image.encoded()))
    assert again.features == image.features
    assert MetadataImage.from_dict(image.to_dict()).features == image.features
    with pytest.raises(MetadataVersionError, match=r"finalized straitmq.metadata.version=9"):
        image.apply({"type": "feature_level", "name": F.STRAITMQ, "level": 9})
    assert image.features[F.STRAITMQ] == F.LATEST[F.STRAITMQ], "a refused level is not taken"
    snap = orjson.loads(image.encoded())
    snap["features"]["group.version"] = 7
    with pytest.raises(MetadataVersionError, match=r"group\.version=7"):
        MetadataImage.from_dict(snap)
    # A feature this release does not know is fine at 0 only (Kafka's rule).
    image.apply({"type": "feature_level", "name": "future.version", "level": 0})
    with pytest.raises(MetadataVersionError, match=r"future\.version=1"):
        image.apply({"type": "feature_level", "name": "future.version", "level": 1})


def test_unknown_and_newer_records_are_refused_not_guessed() -> None:
    image = MetadataImage()
    with pytest.raises(MetadataVersionError, match="unknown metadata record type 'tiered'"):
        image.apply({"type": "tiered", "topic": "t"})
    assert RECORD_VERSIONS["topic"] == 1
    with pytest.raises(MetadataVersionError, match=r"'cluster' version 2 is newer .* \(1..1\)"):
        image.apply({"type": "cluster", "cluster_id": "x", "v": 2})
    assert image.cluster_id == ""
    image.apply({"type": "cluster", "cluster_id": "x", "v": 1})
    assert image.cluster_id == "x"


def test_an_unfinalized_image_snapshots_as_release_0_1_0_wrote_it() -> None:
    """Until something is finalized, a snapshot has no key 0.1.0 does not know, and a
    broker registration's ranges go in a key of their own (0.1.0 builds BrokerImage from
    every key of a broker's entry, so a new key there would break its reads)."""
    image = MetadataImage()
    image.apply({"type": "cluster", "cluster_id": "c"})
    snap = orjson.loads(image.encoded())
    assert set(snap) == {
        "topics",
        "cluster_id",
        "brokers",
        "cluster_configs",
        "next_producer_id",
        "offset",
        "scram_credentials",
        "acls",
        "client_quotas",
    }
    image.apply(
        {
            "type": "register_broker",
            "id": 1,
            "incarnation": uuid.uuid4().hex,
            "host": "h",
            "port": 1,
            "http_port": 2,
            "features": CURRENT,
        }
    )
    snap = orjson.loads(image.encoded())
    assert set(snap["brokers"][0]) == {
        "id",
        "incarnation",
        "host",
        "port",
        "http_port",
        "rack",
        "fenced",
        "shutting_down",
        "endpoints",
    }
    assert snap["broker_features"] == {"1": CURRENT}
    assert MetadataImage.from_dict(snap).broker_features == {1: CURRENT}
    # The same broker restarted on 0.1.0 sends no ranges: it is 0.1.0 again.
    image.apply(
        {
            "type": "register_broker",
            "id": 1,
            "incarnation": "x",
            "host": "h",
            "port": 1,
            "http_port": 2,
        }
    )
    assert image.broker_features == {}


def test_a_broker_below_the_finalized_levels_cannot_register(tmp_path) -> None:
    """The real ActiveController on a real one-voter Quorum: a new cluster finalizes every
    feature, and a broker that sends no ranges (release 0.1.0) is refused with the reason."""

    async def go() -> None:
        q = Quorum(1, {1: "http://127.0.0.1:9"}, str(tmp_path), CFG)
        c = ActiveController(q, ControllerSettings(cluster_id="f"))
        await q.start()
        await c.start()
        try:
            for _ in range(500):
                if c.active:
                    break
                await asyncio.sleep(0.01)
            assert c.active and c.image.finalized_features() == F.LATEST
            with pytest.raises(Exception, match=r"broker 7 cannot join.*straitmq.metadata"):
                await c.register_broker(
                    {
                        "id": 7,
                        "incarnation": "i",
                        "cluster_id": c.image.cluster_id,
                        "host": "h",
                        "port": 1,
                        "http_port": 2,
                    }
                )
            await c.register_broker(
                {
                    "id": 8,
                    "incarnation": "i",
                    "cluster_id": c.image.cluster_id,
                    "host": "h",
                    "port": 2,
                    "http_port": 3,
                    "features": CURRENT,
                }
            )
            assert c.image.broker_features[8] == CURRENT
        finally:
            await c.stop()
            await q.stop(resign=False)

    asyncio.run(go())


def test_a_node_refuses_to_run_on_a_level_it_does_not_support(broker_factory) -> None:
    """A combined node whose metadata log finalized a level beyond this release (as a
    newer release would write it) stops with exit 78 and says which level, instead of
    serving from a log it cannot read; the record stays where it is."""
    b = broker_factory()
    b.stop()
    logs = sorted(b.data_dir.rglob("log-*.jsonl"))
    assert logs, f"no metadata log under {b.data_dir}"
    path = logs[-1]
    lines = path.read_bytes().splitlines()
    epoch = orjson.loads(lines[-1][9:])[0]
    beyond = F.LATEST[F.STRAITMQ] + 1
    record = {"type": "feature_level", "name": F.STRAITMQ, "level": beyond}
    payload = orjson.dumps([epoch, [record]])
    with open(path, "ab") as f:
        f.write(b"%08x " % zlib.crc32(payload) + payload + b"\n")
    b.launch()
    assert b.proc is not None and b.log_path is not None
    code = b.proc.wait(60)
    text = b.log_path.read_text()
    assert code == 78, text[-3000:]
    assert (
        "cannot run on this cluster's metadata: the cluster has finalized "
        f"straitmq.metadata.version={beyond}, which this StraitMQ does not support "
        f"(supported: 1..{beyond - 1})"
    ) in text, text[-3000:]
    assert payload in path.read_bytes()
