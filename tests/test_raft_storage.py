"""Quorum storage: round trips, torn tails, truncation, snapshots and crash points."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from straitmq.controller.quorum import load_directory_id, parse_kafka_uuid
from straitmq.raft.messages import Entry
from straitmq.raft.storage import FileStorage, MemoryStorage, Snapshot


def entries(epochs: list[int], start: int = 0) -> list[Entry]:
    return [Entry(e, {"n": start + i}) for i, e in enumerate(epochs)]


def reopen(path: Path) -> tuple:
    return FileStorage(path).load()


@pytest.fixture(params=["file", "memory"])
def storage(request, tmp_path):
    if request.param == "memory":
        s = MemoryStorage()
    else:
        s = FileStorage(tmp_path)
    s.load()
    return s


def test_both_storages_keep_the_same_history(storage) -> None:
    storage.save_state(3, 1)
    storage.append(entries([1, 1, 2]))
    storage.append([Entry(3, None)])
    storage.truncate(2)
    storage.append(entries([3], 2))
    assert storage.load() == (3, 1, None, 0, [*entries([1, 1]), Entry(3, {"n": 2})])
    storage.save_snapshot(Snapshot(2, 1, {"image": 1}))
    assert storage.load() == (3, 1, Snapshot(2, 1, {"image": 1}), 2, [Entry(3, {"n": 2})])
    storage.install_snapshot(Snapshot(9, 4, "later"))
    assert storage.load() == (3, 1, Snapshot(9, 4, "later"), 9, [])
    storage.append(entries([4], 9))
    assert storage.load()[4] == [Entry(4, {"n": 9})]


def test_file_storage_round_trip(tmp_path: Path) -> None:
    s = FileStorage(tmp_path)
    assert s.load() == (0, None, None, 0, [])
    s.save_state(2, None)
    s.save_state(2, 7)
    s.append(entries([1, 2]))
    s.append([Entry(2, None), Entry(2, ["a", {"b": 1.5}])])
    assert reopen(tmp_path) == (
        2,
        7,
        None,
        0,
        [*entries([1, 2]), Entry(2, None), Entry(2, ["a", {"b": 1.5}])],
    )
    assert orjson.loads((tmp_path / "quorum-state").read_bytes()) == {"epoch": 2, "voted_for": 7}


def _log_file(path: Path) -> Path:
    (log,) = path.glob("log-*.jsonl")
    return log


@pytest.mark.parametrize("tail", [b"0badc0de [1,", b"00000000 [1,{}]\n", b"\x00" * 40, b"zz\n"])
def test_torn_or_corrupt_tail_is_cut_at_load(tmp_path: Path, tail: bytes) -> None:
    s = FileStorage(tmp_path)
    s.load()
    s.append(entries([1, 1, 1]))
    log = _log_file(tmp_path)
    good = log.stat().st_size
    with open(log, "ab") as f:
        f.write(tail)
    s2 = FileStorage(tmp_path)
    assert s2.load()[4] == entries([1, 1, 1])
    assert log.stat().st_size == good  # cut on disk too
    s2.append(entries([2], 3))
    assert reopen(tmp_path)[4] == [*entries([1, 1, 1]), Entry(2, {"n": 3})]


def test_corrupt_line_in_the_middle_drops_everything_after_it(tmp_path: Path) -> None:
    s = FileStorage(tmp_path)
    s.load()
    s.append(entries([1, 1, 1, 1]))
    log = _log_file(tmp_path)
    raw = bytearray(log.read_bytes())
    second = raw.index(b"\n") + 1
    raw[second + 12] ^= 0x01  # flip a bit inside entry 1's JSON: its CRC no longer matches
    log.write_bytes(bytes(raw))
    assert reopen(tmp_path)[4] == entries([1])


def test_truncate_then_append(tmp_path: Path) -> None:
    s = FileStorage(tmp_path)
    s.load()
    s.append(entries([1, 1, 1, 1, 1]))
    s.truncate(3)
    s.truncate(3)  # idempotent
    s.truncate(10)  # beyond the end: nothing to do
    s.append(entries([2, 2], 3))
    assert reopen(tmp_path)[4] == [*entries([1, 1, 1]), *entries([2, 2], 3)]
    s.truncate(0)
    assert reopen(tmp_path)[4] == []


def test_save_snapshot_drops_the_prefix(tmp_path: Path) -> None:
    s = FileStorage(tmp_path)
    s.load()
    s.append(entries([1] * 10))
    s.save_snapshot(Snapshot(6, 1, {"image": "six"}))
    s.append(entries([2], 10))
    s.truncate(10)
    s.append(entries([3], 10))
    _, _, snap, start, log = reopen(tmp_path)
    assert (snap, start) == (Snapshot(6, 1, {"image": "six"}), 6)
    assert log == [*entries([1] * 4, 6), Entry(3, {"n": 10})]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "log-00000000000000000006.jsonl",
        "snapshot-00000000000000000006-0000000001.json",
    ]
    s.save_snapshot(Snapshot(11, 3, "eleven"))  # the older snapshot goes away
    assert reopen(tmp_path)[2:] == (Snapshot(11, 3, "eleven"), 11, [])
    assert len(list(tmp_path.glob("snapshot-*"))) == 1


def test_save_snapshot_must_lie_inside_the_log(tmp_path: Path) -> None:
    s = FileStorage(tmp_path)
    s.load()
    s.append(entries([1, 1]))
    with pytest.raises(ValueError, match="install_snapshot"):
        s.save_snapshot(Snapshot(3, 1, None))


def test_install_snapshot_replaces_the_log(tmp_path: Path) -> None:
    s = FileStorage(tmp_path)
    s.load()
    s.save_state(5, None)
    s.append(entries([1, 1, 4, 4]))  # a divergent tail the snapshot must not keep
    s.install_snapshot(Snapshot(3, 2, {"x": 1}))
    assert reopen(tmp_path) == (5, None, Snapshot(3, 2, {"x": 1}), 3, [])
    s.append(entries([5], 3))
    assert reopen(tmp_path)[4] == [Entry(5, {"n": 3})]


# -- crash points: what each step of a snapshot leaves behind must load consistently ----


def _snapshot_step_by_step(tmp_path: Path, stop_after: int) -> None:
    """Replay FileStorage._replace_log's steps by hand, stopping after step `stop_after`."""
    log = tmp_path / "log-00000000000000000004.jsonl"
    old = FileStorage(tmp_path)
    old.load()
    raw = _log_file(tmp_path).read_bytes()
    tail = b"".join(raw.splitlines(keepends=True)[4:])
    if stop_after >= 0:
        log.with_name(log.name + ".tmp").write_bytes(tail[:7])  # 0: a torn tmp file
    if stop_after >= 1:
        log.write_bytes(tail)  # 1: the new log, renamed into place
    if stop_after >= 2:
        body = orjson.dumps({"end_offset": 4, "epoch": 1, "data": "four"})
        (tmp_path / "snapshot-00000000000000000004-0000000001.json").write_bytes(body)
    old.close()


@pytest.mark.parametrize("stop_after", [0, 1, 2])
def test_crash_during_a_snapshot_loads_old_or_new_state(tmp_path: Path, stop_after: int) -> None:
    s = FileStorage(tmp_path)
    s.load()
    s.append(entries([1] * 6))
    s.close()
    _snapshot_step_by_step(tmp_path, stop_after)
    _, _, snap, start, log = reopen(tmp_path)
    if stop_after < 2:  # the snapshot (the commit point) was never written: old state
        assert (snap, start, log) == (None, 0, entries([1] * 6))
    else:
        assert (snap, start, log) == (Snapshot(4, 1, "four"), 4, entries([1, 1], 4))
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name != "quorum-state")
    assert len(leftovers) == (1 if stop_after < 2 else 2) and not any(
        n.endswith(".tmp") for n in leftovers
    )


def test_crash_during_install_keeps_the_old_log_until_the_snapshot_exists(tmp_path: Path) -> None:
    s = FileStorage(tmp_path)
    s.load()
    s.append(entries([1, 1, 4]))
    s.close()
    (tmp_path / "log-00000000000000000009.jsonl").write_bytes(b"")  # step 1 of install only
    assert reopen(tmp_path)[2:] == (None, 0, entries([1, 1, 4]))
    assert not (tmp_path / "log-00000000000000000009.jsonl").exists()


def test_torn_quorum_state_write_keeps_the_previous_state(tmp_path: Path) -> None:
    s = FileStorage(tmp_path)
    s.load()
    s.save_state(4, 2)
    (tmp_path / "quorum-state.tmp").write_bytes(b'{"epoch": 5, "vo')  # crash before rename
    assert reopen(tmp_path)[:2] == (4, 2)
    assert not (tmp_path / "quorum-state.tmp").exists()


def test_missing_live_log_is_reported_not_papered_over(tmp_path: Path) -> None:
    s = FileStorage(tmp_path)
    s.load()
    s.append(entries([1, 1, 1]))
    s.save_snapshot(Snapshot(2, 1, None))
    s.close()
    _log_file(tmp_path).unlink()
    with pytest.raises(RuntimeError, match="is missing"):
        reopen(tmp_path)


def test_writes_before_load_are_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="load"):
        FileStorage(tmp_path).append(entries([1]))


@pytest.mark.parametrize("seed", range(6))
def test_simulated_cluster_on_file_storage(tmp_path: Path, seed: int) -> None:
    """The deterministic simulation, with every node's disk a real FileStorage directory:
    crashes reload the directory, snapshots are taken and installed through the files."""
    from straitmq.raft.simulation import Simulation

    stats = Simulation(seed, storage_factory=lambda i: FileStorage(tmp_path / str(i))).run()
    assert stats["committed"] > 0


def test_a_controllers_directory_id_lives_and_dies_with_its_storage(tmp_path) -> None:
    """meta.properties (Kafka's v1 layout) keeps the directory id across restarts; new
    storage, or a metadata log that is gone, gets a new one (KIP-853: never the old
    voter's identity without its votes and log)."""
    first = load_directory_id(str(tmp_path), 1001, "cid")
    assert len(parse_kafka_uuid(first).bytes) == 16
    props = dict(
        line.split("=", 1) for line in (tmp_path / "meta.properties").read_text().splitlines()
    )
    assert props == {"version": "1", "cluster.id": "cid", "node.id": "1001", "directory.id": first}
    assert load_directory_id(str(tmp_path), 1001, "cid") == first
    shutil.rmtree(tmp_path / "metadata-raft")
    second = load_directory_id(str(tmp_path), 1001, "cid")
    assert second != first and load_directory_id(str(tmp_path), 1001, "cid") == second


def test_a_snapshot_keeps_its_voter_set(tmp_path) -> None:
    s = FileStorage(tmp_path)
    s.load()
    s.append([Entry(1, "a"), Entry(1, "b")])
    voters = [{"id": 1, "directory_id": "d1", "endpoints": {"CONTROLLER": "h:1"}}]
    s.save_snapshot(Snapshot(2, 1, ["a", "b"], voters))
    s.close()
    _, _, snapshot, _, _ = FileStorage(tmp_path).load()
    assert snapshot == Snapshot(2, 1, ["a", "b"], voters)
