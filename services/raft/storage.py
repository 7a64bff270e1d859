"""Durable state of one quorum member: (epoch, voted-for), the log, the latest snapshot.

Every call returns only once what it wrote is durable: the core relies on that to
grant a vote only after the vote is on disk, and to count its own log end offset
toward the high watermark.

`MemoryStorage` is the "disk" of the deterministic simulation (it survives a
simulated crash because the simulation keeps it). `FileStorage` lays a directory out
as:

    quorum-state                          {"epoch": E, "voted_for": N|null}
    snapshot-<end_offset>-<epoch>.json    {"end_offset", "epoch", "data"}
    log-<base_offset>.jsonl               one entry a line: b"<crc32 hex> [epoch,data]\\n"

Exactly one log file is live: the one whose base is the newest snapshot's end offset
(0 without a snapshot). Replacing the log (a snapshot taken or installed) writes the
new log file first, then the snapshot (the commit point), then deletes what is
older, each step atomic (write a tmp file, fsync, rename, fsync the directory), so a
crash anywhere loads either the old state or the new one. A torn or corrupt line at
the log's tail (a crash during an append) is cut at load. A file of a structure this
code does not know (a whole line that is not `[epoch, data]`, fields it does not know in
`quorum-state` or a snapshot: a newer release's) is refused with `FormatError`, never
misread or cut as a torn tail.
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from straitmq.formats import unreadable

from .messages import Entry


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The state after applying offsets [0, end_offset); epoch is that of entry
    end_offset - 1."""

    end_offset: int
    epoch: int
    data: Any
    voters: Any = None  # the voter set at end_offset (VoterSet.to_list); None: static


LoadedState = tuple[int, int | None, Snapshot | None, int, list[Entry]]
# What the core hands the shell to persist, in order (see RaftNode.take_storage):
# ("state", epoch, voted_for) | ("append", [entries]) | ("truncate", end_offset)
# | ("snapshot", Snapshot) | ("install", Snapshot)
StorageOp = tuple[Any, ...]


class RaftStorage(Protocol):
    """What the core needs from a disk; `MemoryStorage` and `FileStorage` implement it.
    Every call returns only once what it wrote is durable."""

    def load(self) -> LoadedState:
        """(epoch, voted_for, latest snapshot or None, log start offset, entries)."""

    def save_state(self, epoch: int, voted_for: int | None) -> None:
        """Persist the quorum state (before a vote is granted)."""

    def append(self, entries: list[Entry]) -> None:
        """Append entries at the log end."""

    def truncate(self, end_offset: int) -> None:
        """Drop the entries at offsets >= end_offset."""

    def save_snapshot(self, snapshot: Snapshot) -> None:
        """Keep `snapshot` and drop the log entries below its end offset."""

    def install_snapshot(self, snapshot: Snapshot) -> None:
        """Replace the whole log by `snapshot` (a follower catching up)."""


def apply(storage: RaftStorage, ops: list[StorageOp]) -> None:
    """Persist `ops` in order. Consecutive appends become one write and one fsync: the
    batching a shell gets by persisting whatever piled up while the last batch ran."""
    pending: list[Entry] = []
    for op in ops:
        if op[0] == "append":
            pending.extend(op[1])
            continue
        if pending:
            storage.append(pending)
            pending = []
        kind = op[0]
        if kind == "state":
            storage.save_state(op[1], op[2])
        elif kind == "truncate":
            storage.truncate(op[1])
        elif kind == "snapshot":
            storage.save_snapshot(op[1])
        elif kind == "install":
            storage.install_snapshot(op[1])
        else:
            raise ValueError(f"unknown storage op {kind!r}")
    if pending:
        storage.append(pending)


class MemoryStorage:
    """Storage held in memory; what the simulation treats as the disk."""

    def __init__(self) -> None:
        self.epoch = 0
        self.voted_for: int | None = None
        self.snapshot: Snapshot | None = None
        self.log_start = 0
        self.entries: list[Entry] = []

    def load(self) -> LoadedState:
        return self.epoch, self.voted_for, self.snapshot, self.log_start, list(self.entries)

    def save_state(self, epoch: int, voted_for: int | None) -> None:
        self.epoch, self.voted_for = epoch, voted_for

    def append(self, entries: list[Entry]) -> None:
        self.entries.extend(entries)

    def truncate(self, end_offset: int) -> None:
        if end_offset < self.log_start:
            raise ValueError(f"truncate to {end_offset} below the log start {self.log_start}")
        del self.entries[end_offset - self.log_start :]

    def save_snapshot(self, snapshot: Snapshot) -> None:
        _check_prefix_snapshot(snapshot, self.log_start, self.log_start + len(self.entries))
        del self.entries[: snapshot.end_offset - self.log_start]
        self.snapshot, self.log_start = snapshot, snapshot.end_offset

    def install_snapshot(self, snapshot: Snapshot) -> None:
        self.snapshot, self.log_start, self.entries = snapshot, snapshot.end_offset, []


def _check_prefix_snapshot(snapshot: Snapshot, log_start: int, log_end: int) -> None:
    if not log_start < snapshot.end_offset <= log_end:
        raise ValueError(
            f"snapshot end offset {snapshot.end_offset} must lie in ({log_start}, {log_end}]; "
            "use install_snapshot to replace the log"
        )


_SNAPSHOT_NAME = re.compile(r"snapshot-(\d+)-(\d+)\.json")
_LOG_NAME = re.compile(r"log-(\d+)\.jsonl")
_STATE = "quorum-state"


def _encode_line(entry: Entry) -> bytes:
    payload = orjson.dumps([entry.epoch, entry.data])
    return b"%08x " % zlib.crc32(payload) + payload + b"\n"


class _UnknownEntry(ValueError):
    """A whole line (its checksum matches) that is not `[epoch, data]`."""


def _decode_line(line: bytes) -> Entry | None:
    """The entry of a complete line (newline stripped), or None when it is corrupt (a
    torn or damaged tail). A line whose checksum matches but which is not `[epoch, data]`
    was written so (a newer format): _UnknownEntry, never cut as a torn tail."""
    if len(line) < 10 or line[8:9] != b" ":
        return None
    payload = line[9:]
    try:
        if int(line[:8], 16) != zlib.crc32(payload):
            return None
    except ValueError:
        return None
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError as e:
        raise _UnknownEntry(f"not JSON ({e})") from None
    if not (isinstance(value, list) and len(value) == 2 and _is_int(value[0])):
        raise _UnknownEntry(f"{payload[:60]!r} is not [epoch, data]")
    return Entry(value[0], value[1])


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_STATE_KEYS = frozenset({"epoch", "voted_for"})
_SNAPSHOT_KEYS = frozenset({"end_offset", "epoch", "data"})
_SNAPSHOT_ALL = _SNAPSHOT_KEYS | {"voters"}  # voters absent or None: the static set


def _read_state(path: Path) -> tuple[int, int | None]:
    """(epoch, voted_for) of a quorum-state file; FormatError for anything else (a newer
    release's fields would be dropped: a vote half read)."""
    try:
        state = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as e:
        raise unreadable(path, "quorum_state", f"not JSON ({e})") from None
    if not isinstance(state, dict) or state.keys() != _STATE_KEYS:
        keys = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise unreadable(path, "quorum_state", f"{keys} instead of epoch and voted_for")
    epoch, voted_for = state["epoch"], state["voted_for"]
    if not (_is_int(epoch) and epoch >= 0 and (voted_for is None or _is_int(voted_for))):
        raise unreadable(path, "quorum_state", f"epoch {epoch!r}, voted_for {voted_for!r}")
    return epoch, voted_for


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class FileStorage:
    """Storage in one directory (see the module docstring for the layout)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self._dir = Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._log_start = 0
        self._positions: list[int] = []  # byte position where each entry's line starts
        self._size = 0  # byte size of the live log file
        self._file: Any = None  # the live log file, opened r+b

    def _log_path(self, base: int) -> Path:
        return self._dir / f"log-{base:020d}.jsonl"

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    # -- load ---------------------------------------------------------------------------

    def load(self) -> LoadedState:
        self.close()
        # Read (or refused: FormatError) before anything in the directory changes.
        epoch, voted_for = 0, None
        state_path = self._dir / _STATE
        if state_path.exists():
            epoch, voted_for = _read_state(state_path)
        snapshot = self._load_newest_snapshot()
        for tmp in self._dir.glob("*.tmp"):  # an atomic write a crash interrupted
            tmp.unlink()
        base = snapshot.end_offset if snapshot is not None else 0
        log_path = self._log_path(base)
        if not log_path.exists():
            if base != 0:
                raise RuntimeError(
                    f"{log_path} is missing although {self._dir} holds a snapshot ending at "
                    f"{base}: the log directory was altered by hand; restore it or clear it "
                    "to resync from the leader"
                )
            _write_atomic(log_path, b"")
        # Files a crash left behind between the steps of a snapshot: older snapshots
        # and logs, or a new log whose snapshot never got written.
        for path in self._dir.iterdir():
            keep_snapshot = snapshot is not None and path.name == self._snapshot_name(snapshot)
            stale = (_SNAPSHOT_NAME.fullmatch(path.name) and not keep_snapshot) or (
                _LOG_NAME.fullmatch(path.name) and path != log_path
            )
            if stale:
                path.unlink()
        _fsync_dir(self._dir)

        entries = self._read_log(log_path)
        self._log_start = base
        return epoch, voted_for, snapshot, base, entries

    @staticmethod
    def _snapshot_name(snapshot: Snapshot) -> str:
        return f"snapshot-{snapshot.end_offset:020d}-{snapshot.epoch:010d}.json"

    def _load_newest_snapshot(self) -> Snapshot | None:
        found = []
        for path in self._dir.iterdir():
            m = _SNAPSHOT_NAME.fullmatch(path.name)
            if m:
                found.append((int(m.group(1)), int(m.group(2)), path))
        for end_offset, epoch, path in sorted(found, reverse=True):
            try:
                d = orjson.loads(path.read_bytes())
            except orjson.JSONDecodeError:
                continue  # cannot happen with atomic writes; fall back to an older one
            # Fields this code does not know (a newer release's) would be dropped, and
            # the older snapshot fallen back to would delete this one: refused instead.
            if not isinstance(d, dict) or not _SNAPSHOT_KEYS <= d.keys() <= _SNAPSHOT_ALL:
                keys = sorted(d) if isinstance(d, dict) else type(d).__name__
                raise unreadable(
                    path, "raft_snapshot", f"{keys} instead of end_offset, epoch, data, voters"
                )
            if (d["end_offset"], d["epoch"]) == (end_offset, epoch):
                return Snapshot(end_offset, epoch, d["data"], d.get("voters"))
        return None

    def _read_log(self, path: Path) -> list[Entry]:
        raw = path.read_bytes()
        entries: list[Entry] = []
        self._positions = []
        pos = 0
        while pos < len(raw):
            nl = raw.find(b"\n", pos)
            try:
                entry = _decode_line(raw[pos:nl]) if nl >= 0 else None
            except _UnknownEntry as e:  # before anything is cut or opened for writing
                raise unreadable(path, "raft_log", f"the line at byte {pos}: {e}") from None
            if entry is None:
                break  # torn or corrupt: cut here, with everything after it
            self._positions.append(pos)
            entries.append(entry)
            pos = nl + 1
        self._file = open(path, "r+b")
        if pos < len(raw):
            self._file.truncate(pos)
            os.fsync(self._file.fileno())
        self._size = pos
        return entries

    # -- writes -------------------------------------------------------------------------

    def save_state(self, epoch: int, voted_for: int | None) -> None:
        _write_atomic(self._dir / _STATE, orjson.dumps({"epoch": epoch, "voted_for": voted_for}))

    def _require_loaded(self) -> Any:
        if self._file is None:
            raise RuntimeError("FileStorage.load() must be called before writing")
        return self._file

    def append(self, entries: list[Entry]) -> None:
        f = self._require_loaded()
        lines = [_encode_line(e) for e in entries]
        f.seek(self._size)
        for line in lines:
            self._positions.append(self._size)
            self._size += len(line)
        f.write(b"".join(lines))
        f.flush()
        os.fsync(f.fileno())

    def truncate(self, end_offset: int) -> None:
        f = self._require_loaded()
        index = end_offset - self._log_start
        if index < 0:
            raise ValueError(f"truncate to {end_offset} below the log start {self._log_start}")
        if index >= len(self._positions):
            return
        self._size = self._positions[index]
        del self._positions[index:]
        f.truncate(self._size)
        os.fsync(f.fileno())

    def save_snapshot(self, snapshot: Snapshot) -> None:
        f = self._require_loaded()
        _check_prefix_snapshot(snapshot, self._log_start, self._log_start + len(self._positions))
        index = snapshot.end_offset - self._log_start
        cut = self._positions[index] if index < len(self._positions) else self._size
        f.seek(cut)
        tail = f.read(self._size - cut)
        self._replace_log(snapshot, tail, [p - cut for p in self._positions[index:]])

    def install_snapshot(self, snapshot: Snapshot) -> None:
        self._require_loaded()
        if snapshot.end_offset == self._log_start:
            raise ValueError("install_snapshot of a snapshot ending at the log start")
        self._replace_log(snapshot, b"", [])

    def _replace_log(self, snapshot: Snapshot, tail: bytes, positions: list[int]) -> None:
        old_log = self._log_path(self._log_start)
        new_log = self._log_path(snapshot.end_offset)
        _write_atomic(new_log, tail)  # 1. the new log (ignored at load until step 2)
        body = {
            "end_offset": snapshot.end_offset,
            "epoch": snapshot.epoch,
            "data": snapshot.data,
            "voters": snapshot.voters,
        }
        _write_atomic(self._dir / self._snapshot_name(snapshot), orjson.dumps(body))  # 2. commit
        self.close()
        for path in self._dir.iterdir():  # 3. clean up what the snapshot replaced
            m = _SNAPSHOT_NAME.fullmatch(path.name)
            if (m and int(m.group(1)) < snapshot.end_offset) or path == old_log:
                path.unlink()
        _fsync_dir(self._dir)
        self._file = open(new_log, "r+b")
        self._log_start = snapshot.end_offset
        self._positions = positions
        self._size = len(tail)
