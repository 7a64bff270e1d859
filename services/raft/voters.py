"""The voter set as log data (KIP-853's VotersRecord).

A voter is a node id plus the directory id of its metadata storage (a new, empty
storage gets a new one) plus its endpoints. The set lives in the Raft log as a control
entry, and in every snapshot: the latest set in the log, committed or not, is the one
in force (a truncation reverts it). A log and snapshot without any set use the static
set the node was started with (the old `--voters` flags); those voters carry no
directory id, which matches any directory of that node id, as a static KRaft quorum.

Identity is (node id, directory id): a node whose storage was lost comes back with the
same id and a new directory id, and does not count as the voter it replaced (it never
kept that voter's votes or log) until the set is changed to hold its new identity.

A static set names no directory ids, so the leader of a quorum that never changed
pins them (RaftNode._maybe_pin_static): once it knows each voter's id from its fetches
it appends the same set with the ids, as KIP-853's upgrade to kraft.version 1 does (by
hand there, automatic here). The residual window: a voter whose disk is lost before
that set is in every voter's log. Before the pinned set is appended, the leader learns
whatever storage fetches under the voter's id, so it may pin the new, empty one (as
if nothing had happened: a static quorum's old behaviour, for that voter). After it is
committed but while some voter V still lacks it, V's candidacy asks with no directory
id, and the empty storage of a voter whose id was pinned may grant it: V and that vote
make a majority of three without the committed entries V lacks. Once every voter's log
holds the pinned set, every candidacy names the directory ids and a new storage grants
nothing and counts for nothing. On a healthy quorum the window closes within a fetch
round trip or two of the first leader's first commit.

    >>> s = VoterSet.static([1, 2, 3])
    >>> s.majority, s.matches(2, "abc"), s.ids
    (2, True, frozenset({1, 2, 3}))
    >>> t = s.with_directory(2, "abc")
    >>> t.matches(2, "abc"), t.matches(2, "new")
    (True, False)
    >>> VoterSet.from_entry(t.to_entry()) == t
    True
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# The control entry's marker key: `{"kraft": "voters", "voters": [...]}`. Application
# entries are lists (the metadata log) or other dicts (the simulation's values).
VOTERS_KIND = "voters"


@dataclass(frozen=True, slots=True)
class Voter:
    node_id: int
    directory_id: str | None = None  # None: a static voter (any directory of that id)
    endpoints: tuple[tuple[str, str], ...] = ()  # (listener name, "host:port"), sorted

    def matches(self, node_id: int, directory_id: str | None) -> bool:
        return self.node_id == node_id and self.directory_id in (None, directory_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.node_id,
            "directory_id": self.directory_id,
            "endpoints": dict(self.endpoints),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Voter:
        endpoints = d.get("endpoints") or {}
        return cls(int(d["id"]), d.get("directory_id"), tuple(sorted(endpoints.items())))


@dataclass(frozen=True, slots=True)
class VoterSet:
    voters: tuple[Voter, ...]  # sorted by node id, ids unique, never empty

    def __post_init__(self) -> None:
        ids = [v.node_id for v in self.voters]
        if not ids:
            raise ValueError("a voter set is never empty")
        if len(set(ids)) != len(ids):
            raise ValueError(f"a voter set holds each node id once: {ids}")

    @classmethod
    def of(cls, voters: Iterable[Voter]) -> VoterSet:
        return cls(tuple(sorted(voters, key=lambda v: v.node_id)))

    @classmethod
    def static(cls, ids: Iterable[int]) -> VoterSet:
        return cls.of(Voter(i) for i in ids)

    @property
    def ids(self) -> frozenset[int]:
        return frozenset(v.node_id for v in self.voters)

    @property
    def majority(self) -> int:
        return len(self.voters) // 2 + 1

    def __len__(self) -> int:
        return len(self.voters)

    def get(self, node_id: int) -> Voter | None:
        for v in self.voters:
            if v.node_id == node_id:
                return v
        return None

    def matches(self, node_id: int, directory_id: str | None) -> bool:
        """Whether (node_id, directory_id) is one of the voters."""
        v = self.get(node_id)
        return v is not None and v.matches(node_id, directory_id)

    def added(self, voter: Voter) -> VoterSet:
        return VoterSet.of([*self.voters, voter])

    def removed(self, node_id: int) -> VoterSet:
        return VoterSet.of(v for v in self.voters if v.node_id != node_id)

    def replaced(self, voter: Voter) -> VoterSet:
        return VoterSet.of([*(v for v in self.voters if v.node_id != voter.node_id), voter])

    def with_directory(self, node_id: int, directory_id: str) -> VoterSet:
        """Pin a static voter's directory id (narrows who counts as it: always safe)."""
        v = self.get(node_id)
        if v is None or v.directory_id is not None:
            return self
        return self.replaced(Voter(node_id, directory_id, v.endpoints))

    def to_entry(self) -> dict[str, Any]:
        """The control entry's data."""
        return {"kraft": VOTERS_KIND, "voters": [v.to_dict() for v in self.voters]}

    def to_list(self) -> list[dict[str, Any]]:
        return [v.to_dict() for v in self.voters]

    @classmethod
    def from_list(cls, items: list[dict[str, Any]]) -> VoterSet:
        return cls.of(Voter.from_dict(d) for d in items)

    @classmethod
    def from_entry(cls, data: Any) -> VoterSet | None:
        """The set a log entry's data holds, or None when it is not a voters entry."""
        if isinstance(data, dict) and data.get("kraft") == VOTERS_KIND:
            return cls.from_list(data["voters"])
        return None


def is_control(data: Any) -> bool:
    """A Raft control entry (a leader's first entry, or a voter set), not application data."""
    return data is None or (isinstance(data, dict) and "kraft" in data)
