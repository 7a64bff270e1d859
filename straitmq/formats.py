"""Which version of each on-disk file format a data directory holds (issue 37).

Every kind of file a process writes is listed in `KINDS`: the version this code writes,
the oldest version it still reads, and what the file is. Every data directory carries a
small manifest beside its data, `straitmq-format.json`:

    {"manifest": 1, "role": "broker", "kinds": {"log_segment": 1, ...},
     "written_by": "0.2.0.dev0 (commit 1379679a4ec5)"}

The files themselves carry no version of StraitMQ's own (their bytes are those 0.1.0
wrote, which must keep reading them after a rollback; Kafka's own formats carry Kafka's
versions). `check_data_root` runs when a process starts, for each data directory it
owns, before anything else there is opened: it refuses (`FormatError`) a directory
holding a kind or a version this code cannot read, changing nothing on disk, and stamps
one that has no manifest yet: a new directory with the versions this code writes, one
written by 0.1.0 (data, no manifest) with version 1 of every kind.

A data directory is the `--data-dir` of a process, with one role:
- "broker": a broker's, a combined node's included (its partition logs, its identity and
  the metadata log it keeps in `metadata-raft/`, as an observer or as the voter of a
  combined node);
- "controller": a controller's (its identity and the metadata log in `metadata-raft/`).
Share-group state, committed offsets and transactions live in records of internal
topics (`__consumer_offsets`, `__transaction_state`), i.e. in log segments: Kafka's record
formats version those. The metadata records are versioned by the cluster's feature level.

A new version of a kind raises its `writes` only once the release that reads it is out
(rollback: the older release must read what this one writes until the cluster finalizes
a level that allows the new version); a new kind must be known to the releases a
cluster may roll back to before a manifest records it, since they refuse unknown kinds.

Standard library and orjson only: the ground floor.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeGuard

import orjson

FORMAT_FILE = "straitmq-format.json"
MANIFEST_VERSION = 1  # the manifest's own layout (its keys)
LEGACY_VERSION = 1  # what 0.1.0 wrote, for every kind, without a manifest
ROLES = ("broker", "controller")
# A process refusing a data directory (FormatError) exits with this status, saying why in
# one line on stderr: starting it again changes nothing, another release is needed.
EXIT_FORMAT = 2
# Not data: what a new file system puts in its root (a fresh volume of a pod).
_NOT_DATA = frozenset({FORMAT_FILE, FORMAT_FILE + ".tmp", "lost+found"})
_KEYS = ("manifest", "role", "kinds", "written_by")


class Kind(NamedTuple):
    writes: int  # the version this code writes
    oldest: int  # the oldest version it reads
    description: str


_RAFT = "metadata-raft/"
KINDS: dict[str, Kind] = {
    # A broker's data directory (log.dirs); partition directories are logs/<topic>-<p>/.
    "broker_meta": Kind(1, 1, "meta.json: the node id and cluster id of the directory"),
    "log_segment": Kind(
        1, 1, "logs/<topic>-<p>/<base offset:020d>.log: record batches (Kafka's magic 2)"
    ),
    "offset_index": Kind(1, 1, "<base>.index: Kafka's 8-byte (relative offset, position)"),
    "time_index": Kind(1, 1, "<base>.timeindex: Kafka's 12-byte (timestamp, relative offset)"),
    "txn_index": Kind(1, 1, "<base>.txnindex: Kafka's 34-byte aborted transactions"),
    "producer_snapshot": Kind(1, 1, "<offset:020d>.snapshot: the producer state table (JSON)"),
    "leader_epoch_checkpoint": Kind(
        1, 1, "leader-epoch-checkpoint: Kafka's text (0, count, 'epoch offset' lines)"
    ),
    "log_start_checkpoint": Kind(1, 1, "log-start-offset-checkpoint: the log start (text)"),
    "cleaner_checkpoint": Kind(
        1, 1, "cleaner-offset-checkpoint: 'first dirty offset, delete horizon or -' (text)"
    ),
    "topic_id_marker": Kind(1, 1, ".topic-id: the topic id a partition directory holds"),
    "cleaner_swap": Kind(
        1, 1, "<base>.<log|index|timeindex|txnindex>.cleaned|.swap: a cleaning's segments"
    ),
    # The metadata log (Raft): a controller's, and every broker's copy of it.
    "raft_log": Kind(1, 1, _RAFT + "log-<base:020d>.jsonl: '<crc32 hex> [epoch,data]' a line"),
    "raft_snapshot": Kind(
        1, 1, _RAFT + "snapshot-<end:020d>-<epoch:010d>.json: {end_offset, epoch, data, voters}"
    ),
    "quorum_state": Kind(1, 1, _RAFT + "quorum-state: {epoch, voted_for}"),
    # A controller's identity (KIP-853's directory id).
    "meta_properties": Kind(
        1, 1, "meta.properties: Kafka's v1 (version, cluster.id, node.id, directory.id)"
    ),
}
_RAFT_KINDS = ("raft_log", "raft_snapshot", "quorum_state")
ROLE_KINDS: dict[str, tuple[str, ...]] = {
    "broker": (
        "broker_meta",
        "log_segment",
        "offset_index",
        "time_index",
        "txn_index",
        "producer_snapshot",
        "leader_epoch_checkpoint",
        "log_start_checkpoint",
        "cleaner_checkpoint",
        "topic_id_marker",
        "cleaner_swap",
        *_RAFT_KINDS,
    ),
    "controller": ("meta_properties", *_RAFT_KINDS),
}


class FormatError(Exception):
    """A data directory (or a file in it) this code must not read: the message names the
    file, the kind and the version found, and what this code reads."""

    def __init__(
        self, message: str, path: str, kind: str | None = None, found: object = None
    ) -> None:
        super().__init__(message)
        self.path = path
        self.kind = kind
        self.found = found


@dataclass(frozen=True)
class Manifest:
    role: str
    kinds: Mapping[str, int]
    written_by: str

    def to_bytes(self) -> bytes:
        body = {
            "manifest": MANIFEST_VERSION,
            "role": self.role,
            "kinds": dict(sorted(self.kinds.items())),
            "written_by": self.written_by,
        }
        return orjson.dumps(body, option=orjson.OPT_INDENT_2) + b"\n"


def this_release() -> tuple[str, str]:
    """(version, "version (commit id)") of this code."""
    try:  # imported here: the ground floor must work without it (a source tree, tools)
        from straitmq import version
    except ImportError:
        from straitmq import __version__

        return __version__, __version__
    return version.VERSION, version.describe()


def current(role: str) -> Manifest:
    """The manifest of a new directory of `role`: the versions this code writes."""
    return Manifest(role, {k: KINDS[k].writes for k in ROLE_KINDS[role]}, this_release()[1])


def check_data_root(path: str | os.PathLike[str], role: str) -> Manifest:
    """Check (and stamp) the data directory `path` of a process of `role` before anything
    else in it is opened: the manifest it holds afterwards. Raises FormatError, changing
    nothing, when it holds what this code cannot read."""
    if role not in ROLES:
        raise ValueError(f"unknown data directory role {role!r}: one of {', '.join(ROLES)}")
    root = os.fspath(path)
    file = os.path.join(os.path.abspath(root), FORMAT_FILE)
    written_by = this_release()[1]
    try:
        raw = _read(file)
    except FileNotFoundError:
        raw = None
    if raw is None:
        if _holds_data(root):  # 0.1.0's data: every kind at its version 1
            found = Manifest(role, dict.fromkeys(ROLE_KINDS[role], LEGACY_VERSION), written_by)
        else:
            found = current(role)
        os.makedirs(root, exist_ok=True)
        _write(root, found)
        return found
    found = parse(raw, file, role)
    # A kind the writer did not know yet has no files: this code writes them.
    kinds = {k: found.kinds.get(k, KINDS[k].writes) for k in ROLE_KINDS[role]}
    keep = Manifest(role, kinds, written_by)
    if keep != found:
        _write(root, keep)
    return keep


def _read(file: str) -> bytes:
    with open(file, "rb") as f:
        return f.read()


def _holds_data(root: str) -> bool:
    try:
        with os.scandir(root) as entries:
            return any(e.name not in _NOT_DATA for e in entries)
    except FileNotFoundError:
        return False


def parse(raw: bytes, file: str, role: str) -> Manifest:
    """The manifest in `raw` (the bytes of `file`), checked against what this code reads
    for a directory of `role`; FormatError otherwise."""
    version = this_release()[0]
    reads = f"this StraitMQ {version} reads manifest version {MANIFEST_VERSION} of a {role}"

    def refuse(why: str, kind: str = "manifest", found: object = None) -> FormatError:
        return FormatError(f"{file}: {why}", file, kind, found)

    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise refuse(f"unreadable format manifest ({e}); {reads} data directory") from None
    if not isinstance(body, dict):
        raise refuse(f"the format manifest is not a JSON object; {reads} data directory")
    m = body.get("manifest")
    if _version_number(m) and m > MANIFEST_VERSION:
        raise refuse(
            f"manifest format version {m} is newer than {reads} data directory; it was "
            f"written by {body.get('written_by')}: start that release or a newer one",
            found=m,
        )
    missing = [k for k in _KEYS if k not in body]
    extra = sorted(k for k in body if k not in _KEYS)
    if missing or extra:
        what = "; ".join(
            s
            for s in (
                missing and f"no {', '.join(missing)}",
                extra and f"unknown key(s) {', '.join(map(repr, extra))}",
            )
            if s
        )
        raise refuse(f"format manifest version {m!r} is malformed ({what}); {reads} directory")
    kinds, written_by, found_role = body["kinds"], body["written_by"], body["role"]
    if m != MANIFEST_VERSION:
        raise refuse(f"format manifest version {m!r} is not one {reads} directory reads", found=m)
    if not isinstance(written_by, str) or not isinstance(kinds, dict):
        raise refuse(f"format manifest is malformed (kinds or written_by); {reads} directory")
    if found_role != role:
        raise refuse(
            f"this is a {found_role!r} data directory (written by {written_by}), not a "
            f"{role}'s: give each process its own --data-dir",
            kind="role",
            found=found_role,
        )
    known = ROLE_KINDS[role]
    for kind in sorted(kinds):
        v = kinds[kind]
        if not _version_number(v):
            k = KINDS.get(kind)
            reads_it = f" (this StraitMQ {version} reads {k.oldest}..{k.writes})" if k else ""
            raise refuse(f"{kind} format version {v!r} is not a number{reads_it}", kind, v)
        if kind not in known:
            raise refuse(
                f"unknown file kind {kind!r} (format version {v}): this StraitMQ {version} "
                f"reads {_listing(known)} in a {role} data directory; it was written by "
                f"{written_by}: start that release or a newer one",
                kind,
                v,
            )
        k = KINDS[kind]
        if v > k.writes:
            raise refuse(
                f"{kind} format version {v} is newer than this StraitMQ {version} reads "
                f"({k.oldest}..{k.writes}); it was written by {written_by}: start that "
                "release or a newer one",
                kind,
                v,
            )
        if v < k.oldest:
            raise refuse(
                f"{kind} format version {v} is older than this StraitMQ {version} reads "
                f"({k.oldest}..{k.writes}); it was written by {written_by}: upgrade it "
                "with an older release first",
                kind,
                v,
            )
    return Manifest(role, dict(kinds), written_by)


def _version_number(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _listing(kinds: tuple[str, ...]) -> str:
    return ", ".join(f"{k} {KINDS[k].oldest}..{KINDS[k].writes}" for k in kinds)


def _write(root: str, manifest: Manifest) -> None:
    """tmp + fsync + rename + fsync of the directory: the old manifest or the new one."""
    file = os.path.join(root, FORMAT_FILE)
    tmp = file + ".tmp"
    with open(tmp, "wb") as f:
        f.write(manifest.to_bytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, file)
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unreadable(path: str | os.PathLike[str], kind: str, why: str) -> FormatError:
    """A file of `kind` whose structure this code does not know (a newer release's, or
    damage): refused rather than misread. Its version is that of the directory's
    manifest; what this code reads is in the message."""
    k = KINDS[kind]
    version = this_release()[0]
    p = os.fspath(path)
    return FormatError(
        f"{p}: {why}: not the {kind} format version {k.oldest}..{k.writes} this StraitMQ "
        f"{version} reads (a newer release's file, or a damaged one)",
        p,
        kind,
    )


__all__ = [
    "EXIT_FORMAT",
    "FORMAT_FILE",
    "KINDS",
    "ROLE_KINDS",
    "FormatError",
    "Kind",
    "Manifest",
    "check_data_root",
    "current",
    "parse",
    "this_release",
    "unreadable",
]
