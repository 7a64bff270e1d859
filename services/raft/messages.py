"""The messages the metadata quorum exchanges, and their JSON form.

Every message names its sender (`src`) and receiver (`dst`) and carries the sender's
epoch, so a transport only has to route by `dst`: there is no request/response
pairing at the transport level. Responses echo what identifies their request (a
FetchResponse echoes `fetch_offset` as `base_offset` and `last_fetched_epoch`) so a
duplicated or late response is recognised and dropped by the core.

    >>> m = FetchRequest(src=1, dst=0, epoch=3, fetch_offset=10, last_fetched_epoch=2)
    >>> from_dict(to_dict(m)) == m
    True

`to_dict` gives plain dicts and lists (orjson-ready); entries travel as `[epoch, data]`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

# Error codes carried by FetchResponse / FetchSnapshotResponse.
FENCED_LEADER_EPOCH = "FENCED_LEADER_EPOCH"  # the request's epoch is older than the receiver's
NOT_LEADER = "NOT_LEADER"  # the receiver is not the leader; leader_id/epoch are a hint
SNAPSHOT_NOT_FOUND = "SNAPSHOT_NOT_FOUND"  # the leader no longer has that snapshot: fetch again


@dataclass(frozen=True, slots=True)
class Entry:
    """One record of the replicated log. Its offset is its position in the log.
    `data` is any JSON-able value; None marks a control entry (a new leader's first)."""

    epoch: int
    data: Any


@dataclass(frozen=True, slots=True)
class FetchRequest:
    src: int
    dst: int
    epoch: int
    fetch_offset: int  # the fetcher's log end offset
    last_fetched_epoch: int  # epoch of the fetcher's last entry (or snapshot); 0 if empty
    observer: bool = False
    # The high watermark the fetcher knows (as KIP-1166): a leader whose own is newer
    # answers at once instead of parking the fetch. -1: unknown (an older sender).
    high_watermark: int = -1
    # The fetcher's storage identity (KIP-853): a voter counts only with its own.
    directory_id: str | None = None


@dataclass(frozen=True, slots=True)
class FetchResponse:
    src: int
    dst: int
    epoch: int
    leader_id: int | None
    error: str | None
    base_offset: int  # always the request's fetch_offset
    entries: tuple[Entry, ...] = ()
    high_watermark: int = 0
    log_start_offset: int = 0
    diverging_epoch: int | None = None
    diverging_end_offset: int | None = None
    snapshot_offset: int | None = None
    snapshot_epoch: int | None = None
    last_fetched_epoch: int = 0  # echo of the request's, to match the response to it


@dataclass(frozen=True, slots=True)
class FetchSnapshotRequest:
    src: int
    dst: int
    epoch: int
    snapshot_offset: int
    snapshot_epoch: int


@dataclass(frozen=True, slots=True)
class FetchSnapshotResponse:
    """The whole snapshot in one message: metadata images are small (kilobytes to a few
    megabytes), so the transport's body limit is the limit on a snapshot's size."""

    src: int
    dst: int
    epoch: int
    leader_id: int | None
    error: str | None
    snapshot_offset: int
    snapshot_epoch: int
    data: Any = None
    voters: Any = None  # the snapshot's voter set (VoterSet.to_list), None: static


@dataclass(frozen=True, slots=True)
class VoteRequest:
    src: int
    dst: int
    epoch: int  # for a pre-vote: the epoch the candidate would campaign in (its own + 1)
    candidate_id: int
    last_epoch: int
    last_offset: int  # the candidate's log end offset
    pre_vote: bool = False
    # The receiver's directory id as the candidate's voter set has it: a node whose
    # storage is new (another directory id) must not vote as the voter it replaced.
    voter_directory_id: str | None = None


@dataclass(frozen=True, slots=True)
class VoteResponse:
    src: int
    dst: int
    epoch: int
    granted: bool
    pre_vote: bool
    leader_id: int | None = None


@dataclass(frozen=True, slots=True)
class BeginQuorumEpoch:
    src: int
    dst: int
    epoch: int
    leader_id: int


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochResponse:
    src: int
    dst: int
    epoch: int


@dataclass(frozen=True, slots=True)
class EndQuorumEpoch:
    src: int
    dst: int
    epoch: int
    leader_id: int
    preferred_successors: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class EndQuorumEpochResponse:
    src: int
    dst: int
    epoch: int


Message = (
    FetchRequest
    | FetchResponse
    | FetchSnapshotRequest
    | FetchSnapshotResponse
    | VoteRequest
    | VoteResponse
    | BeginQuorumEpoch
    | BeginQuorumEpochResponse
    | EndQuorumEpoch
    | EndQuorumEpochResponse
)

KINDS: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        FetchRequest,
        FetchResponse,
        FetchSnapshotRequest,
        FetchSnapshotResponse,
        VoteRequest,
        VoteResponse,
        BeginQuorumEpoch,
        BeginQuorumEpochResponse,
        EndQuorumEpoch,
        EndQuorumEpochResponse,
    )
}
_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in KINDS.values()
}


def to_dict(msg: Message) -> dict[str, Any]:
    """A JSON-able dict of `msg`, with "kind" naming its class."""
    d: dict[str, Any] = {"kind": type(msg).__name__}
    for name in _FIELDS[type(msg)]:
        value = getattr(msg, name)
        if name == "entries":
            value = [[e.epoch, e.data] for e in value]
        elif name == "preferred_successors":
            value = list(value)
        d[name] = value
    return d


def from_dict(d: dict[str, Any]) -> Message:
    """The message `to_dict` produced. Unknown keys are ignored (a newer sender);
    an unknown kind or a missing field raises ValueError."""
    kind = d.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"unknown raft message kind {kind!r}; expected one of {sorted(KINDS)}")
    kwargs: dict[str, Any] = {}
    for name in _FIELDS[cls]:
        if name not in d:
            continue  # fields with defaults may be omitted
        value = d[name]
        if name == "entries":
            value = tuple(Entry(int(epoch), data) for epoch, data in value)
        elif name == "preferred_successors":
            value = tuple(value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"malformed {kind}: {exc}") from exc
