"""Every on-disk format is versioned (issue 37): a data directory carries a manifest
(`straitmq-format.json`) of the version of each file kind in it, and a process refuses,
changing nothing, a directory it cannot read.

Unit level: `check_data_root` on new, 0.1.0-style and refused directories; the Raft
readers refuse files with structure they do not know. Process level: a real combined
node and a real controller on a directory of a newer release (or with a damaged
manifest) exit at once with status 2 and one line saying why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

import orjson
import pytest
from conftest import ROOT, BrokerProcess
from straitmq.cli.local_cluster import free_port
from straitmq.raft.messages import Entry
from straitmq.raft.storage import FileStorage, Snapshot

from straitmq import formats
from straitmq.formats import FORMAT_FILE, KINDS, ROLE_KINDS, FormatError, check_data_root

EXIT_S = 60.0  # the bound for a refusing process to exit (its imports take a second or two)


def _tree(root: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every file and folder under root: (bytes or None for a folder, mtime in ns)."""
    out: dict[str, tuple[bytes | None, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = (
                None if p.is_dir() else p.read_bytes(),
                p.stat().st_mtime_ns,
            )
    return out


def _manifest(root: Path) -> dict:
    return orjson.loads((root / FORMAT_FILE).read_bytes())


def _v010_broker_dir(root: Path) -> None:
    """A broker data directory as 0.1.0 left it: identity, a partition, a metadata log."""
    part = root / "logs" / "t-0"
    part.mkdir(parents=True)
    (root / "meta.json").write_bytes(b'{"node_id":1,"cluster_id":"c"}')
    (part / ".topic-id").write_text("AAAAAAAAAAAAAAAAAAAAAA")
    (part / "00000000000000000000.log").write_bytes(b"")
    (part / "leader-epoch-checkpoint").write_bytes(b"0\n0\n")
    s = FileStorage(root / "metadata-raft")
    s.load()
    s.save_state(3, 1)
    s.append([Entry(3, {"type": "noop"})])
    s.close()


# -- check_data_root -----------------------------------------------------------------------


@pytest.mark.parametrize("role", ["broker", "controller"])
@pytest.mark.parametrize("exists", [False, True])
def test_a_new_directory_gets_the_versions_this_code_writes(
    tmp_path: Path, role: str, exists: bool
) -> None:
    root = tmp_path / "data"
    if exists:
        root.mkdir()
        (root / "lost+found").mkdir()  # a fresh volume's root is still empty
    got = check_data_root(root, role)
    body = _manifest(root)
    assert body == {
        "manifest": 1,
        "role": role,
        "kinds": {k: KINDS[k].writes for k in ROLE_KINDS[role]},
        "written_by": formats.this_release()[1],
    }
    assert got.kinds == body["kinds"] and got.role == role
    assert not (root / (FORMAT_FILE + ".tmp")).exists()
    before = _tree(root)
    assert check_data_root(root, role) == got  # the same release again: nothing rewritten
    assert _tree(root) == before


def test_every_kind_has_a_role_and_is_at_version_1() -> None:
    """Version 1 of every kind is what 0.1.0 wrote: these bytes must not change until a
    cluster finalizes a level that allows a newer version."""
    assert {k for kinds in ROLE_KINDS.values() for k in kinds} == set(KINDS)
    assert all((k.oldest, k.writes) == (1, 1) and k.description for k in KINDS.values())


def test_data_of_0_1_0_without_a_manifest_is_stamped_at_version_1(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _v010_broker_dir(root)
    data = _tree(root)
    got = check_data_root(root, "broker")
    assert got.kinds == dict.fromkeys(ROLE_KINDS["broker"], 1)
    assert _manifest(root)["kinds"] == got.kinds
    after = _tree(root)
    del after[FORMAT_FILE]
    assert after == data  # the data itself is untouched


def test_a_controllers_0_1_0_directory_is_stamped_too(tmp_path: Path) -> None:
    from straitmq.controller.quorum import load_directory_id

    load_directory_id(str(tmp_path), 1001, "cid")  # meta.properties + metadata-raft/
    assert check_data_root(tmp_path, "controller").kinds == {
        "meta_properties": 1,
        "raft_log": 1,
        "raft_snapshot": 1,
        "quorum_state": 1,
    }


def _newer(body: dict) -> bytes:
    body["kinds"]["txn_index"] = 3
    body["written_by"] = "0.4.0 (commit 0123456789ab)"
    return orjson.dumps(body)


def _unknown_kind(body: dict) -> bytes:
    body["kinds"]["tiered_manifest"] = 1
    return orjson.dumps(body)


def _older(body: dict) -> bytes:
    body["kinds"]["offset_index"] = 0
    return orjson.dumps(body)


def _not_a_number(body: dict) -> bytes:
    body["kinds"]["time_index"] = "1"
    return orjson.dumps(body)


def _wrong_role(body: dict) -> bytes:
    body["role"] = "controller"
    return orjson.dumps(body)


def _missing_key(body: dict) -> bytes:
    del body["written_by"]
    return orjson.dumps(body)


def _newer_manifest(body: dict) -> bytes:
    body["manifest"] = 2
    return orjson.dumps(body)


def _corrupt(body: dict) -> bytes:
    return orjson.dumps(body)[:25]  # a torn manifest


# (how the manifest is spoiled, what the message must name besides the path)
REFUSED = [
    (_newer, ["txn_index format version 3 is newer", "(1..1)", "0.4.0 (commit 0123456789ab)"]),
    (_unknown_kind, ["unknown file kind 'tiered_manifest'", "format version 1", "txn_index 1..1"]),
    (_older, ["offset_index format version 0 is older", "(1..1)"]),
    (_not_a_number, ["time_index format version '1' is not a number", "1..1"]),
    (_wrong_role, ["a 'controller' data directory", "not a broker's"]),
    (_missing_key, ["format manifest version 1 is malformed", "no written_by"]),
    (_newer_manifest, ["manifest format version 2 is newer"]),
    (_corrupt, ["unreadable format manifest", "manifest version 1"]),
]


@pytest.mark.parametrize(("spoil", "names"), REFUSED, ids=[f.__name__[1:] for f, _ in REFUSED])
def test_a_manifest_this_code_cannot_read_is_refused_and_nothing_changes(
    tmp_path: Path, spoil, names: list[str]
) -> None:
    root = tmp_path / "data"
    _v010_broker_dir(root)
    check_data_root(root, "broker")
    (root / FORMAT_FILE).write_bytes(spoil(_manifest(root)))
    before = _tree(root)
    with pytest.raises(FormatError) as refused:
        check_data_root(root, "broker")
    message = str(refused.value)
    assert message.startswith(f"{root / FORMAT_FILE}: ")
    for name in names:
        assert name in message
    assert "\n" not in message  # one line on a process's stderr
    assert refused.value.path == str(root / FORMAT_FILE)
    assert _tree(root) == before  # bytes and mtimes of every file, the manifest included


def test_a_manifest_from_another_build_is_rewritten_with_the_same_versions(
    tmp_path: Path,
) -> None:
    root = tmp_path / "data"
    check_data_root(root, "controller")
    body = _manifest(root)
    body["written_by"] = "0.2.0.dev0 (commit 000000000000)"
    del body["kinds"]["quorum_state"]  # a kind that writer did not know: no files of it
    (root / FORMAT_FILE).write_bytes(orjson.dumps(body))
    got = check_data_root(root, "controller")
    assert got.written_by == formats.this_release()[1]
    assert _manifest(root)["kinds"] == formats.current("controller").kinds


# -- the Raft readers refuse what they do not know ------------------------------------------


def _raft_dir(tmp_path: Path) -> Path:
    s = FileStorage(tmp_path)
    s.load()
    s.save_state(2, 1)
    s.append([Entry(1, {"n": i}) for i in range(3)])
    s.save_snapshot(Snapshot(3, 1, {"image": True}))
    s.append([Entry(2, {"n": 3})])
    s.close()
    return tmp_path


def _refused_unchanged(tmp_path: Path, kind: str, needle: str) -> None:
    before = _tree(tmp_path)
    with pytest.raises(FormatError) as refused:
        FileStorage(tmp_path).load()
    assert refused.value.kind == kind and needle in str(refused.value)
    assert f"{kind} format version 1..1" in str(refused.value)
    assert _tree(tmp_path) == before


def test_a_quorum_state_with_fields_it_does_not_know_is_refused(tmp_path: Path) -> None:
    _raft_dir(tmp_path)
    state = tmp_path / "quorum-state"
    state.write_bytes(b'{"epoch":2,"voted_for":1,"voted_directory_id":"x"}')
    _refused_unchanged(tmp_path, "quorum_state", "quorum-state: ['epoch', 'voted_directory_id'")


def test_a_damaged_quorum_state_is_refused_not_a_traceback(tmp_path: Path) -> None:
    _raft_dir(tmp_path)
    (tmp_path / "quorum-state").write_bytes(b'{"epoch": 2, "vo')
    _refused_unchanged(tmp_path, "quorum_state", "not JSON")


def test_a_snapshot_with_fields_it_does_not_know_is_refused_not_replaced(
    tmp_path: Path,
) -> None:
    _raft_dir(tmp_path)
    (snap,) = tmp_path.glob("snapshot-*.json")
    body = orjson.loads(snap.read_bytes())
    snap.write_bytes(orjson.dumps({**body, "checksum": 7}))
    (tmp_path / "quorum-state.tmp").write_bytes(b"{")  # not even the tmp files go
    _refused_unchanged(tmp_path, "raft_snapshot", "'checksum'")


def test_a_whole_log_line_it_does_not_know_is_refused_not_cut_as_torn(tmp_path: Path) -> None:
    _raft_dir(tmp_path)
    (log,) = tmp_path.glob("log-*.jsonl")
    payload = orjson.dumps([2, {"n": 4}, {"new": "field"}])
    with open(log, "ab") as f:
        f.write(b"%08x " % zlib.crc32(payload) + payload + b"\n")
    _refused_unchanged(tmp_path, "raft_log", "is not [epoch, data]")


def test_the_raft_files_written_are_those_0_1_0_wrote(tmp_path: Path) -> None:
    """The readers got stricter; what they read back, and the bytes written, did not change."""
    _raft_dir(tmp_path)
    assert (tmp_path / "quorum-state").read_bytes() == b'{"epoch":2,"voted_for":1}'
    (snap,) = tmp_path.glob("snapshot-*.json")
    assert snap.read_bytes() == b'{"end_offset":3,"epoch":1,"data":{"image":true},"voters":null}'
    (log,) = tmp_path.glob("log-*.jsonl")
    payload = b'[2,{"n":3}]'
    assert log.read_bytes() == b"%08x " % zlib.crc32(payload) + payload + b"\n"
    assert FileStorage(tmp_path).load() == (
        2,
        1,
        Snapshot(3, 1, {"image": True}),
        3,
        [Entry(2, {"n": 3})],
    )


# -- real processes --------------------------------------------------------------------------


def _refusing_process(args: list[str], root: Path, needles: list[str]) -> None:
    """Run a process on `root` and expect it to refuse: exit status 2 within EXIT_S, one
    line on stderr naming the manifest and `needles`, no traceback, nothing changed."""
    before = _tree(root)
    proc = subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=EXIT_S,
    )
    lines = [ln for ln in proc.stderr.splitlines() if "cannot start" in ln]
    assert proc.returncode == formats.EXIT_FORMAT, proc.stderr[-3000:]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert str(root / FORMAT_FILE) in lines[0]
    for needle in needles:
        assert needle in lines[0]
    assert "Traceback" not in proc.stderr
    assert _tree(root) == before


def _broker_args(root: Path) -> list[str]:
    return [
        "straitmq.broker",
        "--data-dir",
        str(root),
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--http",
        f"127.0.0.1:{free_port()}",
    ]


def test_a_combined_node_stamps_a_new_directory_and_refuses_a_newer_release(
    tmp_path: Path,
) -> None:
    root = tmp_path / "data"
    node = BrokerProcess(root).start()  # combined: no --controllers
    try:
        node.create_topic("t")
    finally:
        node.stop()
    assert _manifest(root)["role"] == "broker"
    assert (root / "metadata-raft").is_dir() and (root / "logs" / "t-0").is_dir()
    (root / FORMAT_FILE).write_bytes(_newer(_manifest(root)))
    _refusing_process(
        _broker_args(root),
        root,
        ["strait-broker: cannot start:", "txn_index format version 3 is newer", "(1..1)"],
    )


def test_a_broker_process_refuses_a_damaged_manifest(tmp_path: Path) -> None:
    root = tmp_path / "data"
    _v010_broker_dir(root)
    (root / FORMAT_FILE).write_bytes(b'{"manifest": 1, "role": "bro')
    _refusing_process(_broker_args(root), root, ["unreadable format manifest"])


def test_a_controller_process_refuses_a_newer_release(tmp_path: Path) -> None:
    root = tmp_path / "c1"
    check_data_root(root, "controller")
    body = _manifest(root)
    body["kinds"]["raft_log"] = 2
    (root / FORMAT_FILE).write_bytes(orjson.dumps(body))
    port = free_port()
    _refusing_process(
        [
            "straitmq.controller",
            "--node-id",
            "1001",
            "--voters",
            f"1001@127.0.0.1:{port}",
            "--cluster-id",
            "c",
            "--data-dir",
            str(root),
        ],
        root,
        ["strait-controller: cannot start:", "raft_log format version 2 is newer"],
    )


def test_a_controller_refuses_a_brokers_directory(tmp_path: Path) -> None:
    root = tmp_path / "b1"
    _v010_broker_dir(root)
    check_data_root(root, "broker")
    port = free_port()
    _refusing_process(
        [
            "straitmq.controller",
            "--node-id",
            "1001",
            "--voters",
            f"1001@127.0.0.1:{port}",
            "--cluster-id",
            "c",
            "--data-dir",
            str(root),
        ],
        root,
        ["a 'broker' data directory", "not a controller's"],
    )
