"""Committed offsets, stored durably in the internal `__consumer_offsets` topic.

Each commit is one record batch appended to the group's partition of that topic (key:
group/topic/partition, value: offset, leader epoch, metadata; a null value deletes). The
store replays the topic at startup, so offsets survive restarts. Between restarts the
latest value per key is kept in memory.

The same partition holds the records of KIP-848 group state (`records.py`: a JSON object
key where a commit has an array). The store keeps the newest of those per key too, so
that a new coordinator rebuilds its groups from them; the log cleaner compacts the topic
by key, keeping the latest record of each.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import orjson

from ..record_codec import build_batch, decode_batch
from ..records import (
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    BatchInfo,
    parse_header,
    parse_marker,
    replicated_batches,
)
from .records import Record, RecordKey, decode_key, encode_key

OFFSETS_TOPIC = "__consumer_offsets"

# Appends to the group's partition (as its leader); returns the log end offset after it.
AppendFn = Callable[[int, memoryview, list[BatchInfo]], int]


@dataclass(slots=True)
class Committed:
    offset: int
    leader_epoch: int
    metadata: str
    timestamp: int


class OffsetStore:
    def __init__(self, partitions_count: int) -> None:
        self.partitions_count = partitions_count
        self.offsets: dict[str, dict[tuple[str, int], Committed]] = {}
        # Group state records (records.py), newest per key: group -> key -> value.
        self.group_records: dict[str, dict[RecordKey, dict]] = {}
        self._append: AppendFn | None = None
        self.owned: set[int] = set()  # partitions this broker leads, so coordinates
        # TxnOffsetCommit's offsets, visible once their transaction commits (its marker
        # reaches the group's partition): producer id -> group -> (topic, partition) ->.
        self.pending: dict[int, dict[str, dict[tuple[str, int], Committed]]] = {}

    def partition_for(self, group_id: str) -> int:
        return zlib.crc32(group_id.encode()) % self.partitions_count

    def bind(self, append: AppendFn) -> None:
        self._append = append

    def load_partition(self, partition: int, batches: Iterable[bytes]) -> None:
        """We lead this offsets partition now: replay it (the newest value per key wins)."""
        self.unload_partition(partition)
        self.load(batches)
        self.owned.add(partition)

    def unload_partition(self, partition: int) -> None:
        self.owned.discard(partition)
        for pid, groups in list(self.pending.items()):
            for group in [g for g in groups if self.partition_for(g) == partition]:
                del groups[group]
            if not groups:
                del self.pending[pid]
        for group in [g for g in self.offsets if self.partition_for(g) == partition]:
            del self.offsets[group]
        for group in [g for g in self.group_records if self.partition_for(g) == partition]:
            del self.group_records[group]

    def owns(self, group_id: str) -> bool:
        return self.partition_for(group_id) in self.owned

    def load(self, batches: Iterable[bytes]) -> None:
        for raw in batches:
            attrs = raw[22]
            if attrs & ATTR_CONTROL:  # a transaction's marker: its offsets count or go
                marker = parse_marker(raw)
                if marker is not None:
                    self._complete(parse_header(raw, 0, len(raw)).producer_id, marker[0], None)
                continue
            if attrs & ATTR_TRANSACTIONAL:
                pid = parse_header(raw, 0, len(raw)).producer_id
                for rec in decode_batch(raw):
                    if rec.key is not None and rec.value is not None:
                        group, topic, part = orjson.loads(rec.key)
                        v = orjson.loads(rec.value)
                        self.pending.setdefault(pid, {}).setdefault(group, {})[(topic, part)] = (
                            Committed(v["o"], v["e"], v["m"], v["t"])
                        )
                continue
            for rec in decode_batch(raw):
                if rec.key is None:
                    continue
                key = orjson.loads(rec.key)
                if isinstance(key, dict):
                    if "t" in key and "g" in key:  # else a kind this broker does not know
                        value = None if rec.value is None else orjson.loads(rec.value)
                        self._apply_group_record(decode_key(key), value)
                    continue
                group, topic, part = key
                self._apply(group, topic, part, rec.value)

    def _apply_group_record(self, key: RecordKey, value: dict | None) -> None:
        group = key[1]
        if value is None:
            g = self.group_records.get(group)
            if g is not None:
                g.pop(key, None)
                if not g:
                    del self.group_records[group]
            return
        self.group_records.setdefault(group, {})[key] = value

    def _apply(self, group: str, topic: str, part: int, value: bytes | None) -> None:
        if value is None:
            g = self.offsets.get(group)
            if g is not None:
                g.pop((topic, part), None)
                if not g:
                    del self.offsets[group]
            return
        v = orjson.loads(value)
        self.offsets.setdefault(group, {})[(topic, part)] = Committed(
            v["o"], v["e"], v["m"], v["t"]
        )

    @staticmethod
    def _record(group: str, topic: str, part: int, c: Committed | None) -> tuple:
        """The (key, value, headers) stored for one commit; a None commit deletes."""
        value = None
        if c is not None:
            value = orjson.dumps(
                {"o": c.offset, "e": c.leader_epoch, "m": c.metadata, "t": c.timestamp}
            )
        return orjson.dumps([group, topic, part]), value, []

    def commit(self, group: str, entries: list[tuple[str, int, int, int, str | None]]) -> int:
        """Record (topic, partition, offset, leader_epoch, metadata) entries; returns the
        offsets partition's log end, which the caller waits to see replicated."""
        now = int(time.time() * 1000)
        commits = {(t, p): Committed(o, e, m or "", now) for t, p, o, e, m in entries}
        end = self._write(
            group, [self._record(group, t, p, c) for (t, p), c in commits.items()], now
        )
        self.offsets.setdefault(group, {}).update(commits)
        return end

    def commit_transactional(
        self,
        group: str,
        producer: tuple[int, int],
        entries: list[tuple[str, int, int, int, str | None]],
    ) -> int:
        """TxnOffsetCommit: the offsets go into the group's partition in a transactional
        batch of the producer (id, epoch) and count once its transaction commits."""
        now = int(time.time() * 1000)
        commits = {(t, p): Committed(o, e, m or "", now) for t, p, o, e, m in entries}
        records = [self._record(group, t, p, c) for (t, p), c in commits.items()]
        end = self._write(group, records, now, producer)
        self.pending.setdefault(producer[0], {}).setdefault(group, {}).update(commits)
        return end

    def complete_transaction(self, partition: int, producer_id: int, commit: bool) -> None:
        """A transaction's marker is in offsets partition `partition`: the producer's
        pending offsets of the groups there count (commit) or go (abort)."""
        self._complete(producer_id, commit, partition)

    def _complete(self, producer_id: int, commit: bool, partition: int | None) -> None:
        groups = self.pending.get(producer_id)
        if not groups:
            return
        for group in list(groups):
            if partition is not None and self.partition_for(group) != partition:
                continue
            offsets = groups.pop(group)
            if commit:
                self.offsets.setdefault(group, {}).update(offsets)
        if not groups:
            del self.pending[producer_id]

    def has_pending(self, group: str, topic: str, partition: int) -> bool:
        """An open transaction holds an offset of it (OffsetFetch's require_stable)."""
        return any((topic, partition) in g.get(group, {}) for g in self.pending.values())

    def write_group_records(self, group: str, records: list[Record]) -> int:
        """Append group state records (None values are tombstones) in one batch; returns
        the offsets partition's log end, which the caller waits to see replicated."""
        now = int(time.time() * 1000)
        end = self._write(group, [self._group_record(k, v) for k, v in records], now)
        for k, v in records:
            self._apply_group_record(k, v)
        return end

    @staticmethod
    def _group_record(key: RecordKey, value: dict | None) -> tuple:
        return (
            orjson.dumps(encode_key(key)),
            None if value is None else orjson.dumps(value),
            [],
        )

    def expire(self, group: str, older_than: int, keep_topics: frozenset[str] = frozenset()) -> int:
        """Tombstone the group's commits made before `older_than` (ms since the epoch),
        but those of `keep_topics`; how many."""
        g = self.offsets.get(group, {})
        keys = [k for k, c in g.items() if c.timestamp < older_than and k[0] not in keep_topics]
        if keys:
            self._tombstones(group, keys)
            for k in keys:
                del g[k]
            if not g:
                del self.offsets[group]
        return len(keys)

    def delete_group(self, group: str) -> None:
        keys = list(self.offsets.get(group, {}))
        if keys:
            self._tombstones(group, keys)
        self.offsets.pop(group, None)

    def delete_topic(self, topic: str) -> None:
        for group, g in list(self.offsets.items()):
            keys = [k for k in g if k[0] == topic]
            if keys:
                self._tombstones(group, keys)
                for k in keys:
                    del g[k]
                if not g:
                    del self.offsets[group]

    def _tombstones(self, group: str, keys: list[tuple[str, int]]) -> None:
        now = int(time.time() * 1000)
        self._write(group, [self._record(group, t, p, None) for t, p in keys], now)

    def _write(
        self, group: str, records: list, now: int, producer: tuple[int, int] | None = None
    ) -> int:
        assert self._append is not None, "offset store is not bound to its topic"
        batch = build_batch(records, now, producer=producer)
        view = memoryview(batch)
        # The coordinator's own batches: framed and checked as a follower checks them
        # (a produce-path check would refuse the transactional ones).
        return self._append(self.partition_for(group), view, replicated_batches(view))

    def fetch(self, group: str) -> dict[tuple[str, int], Committed]:
        return self.offsets.get(group, {})

    def has_group(self, group: str) -> bool:
        return group in self.offsets

    def group_ids(self) -> list[str]:
        return list(self.offsets)

    def records_of(self, group: str) -> dict[RecordKey, dict]:
        return self.group_records.get(group, {})
