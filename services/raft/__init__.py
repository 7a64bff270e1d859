"""The metadata quorum's Raft (KRaft-style), sans-IO.

messages    the wire messages and their JSON form (to_dict / from_dict)
storage     RaftStorage: MemoryStorage (simulation), FileStorage (a directory)
epochs      the epoch cache behind fetch validation and truncation
voters      Voter, VoterSet: the voter set as log data (KIP-853)
core        RaftNode, RaftConfig, NotLeader, VoterChangeRefused: the state machine itself
simulation  the deterministic cluster simulation (tests, bench.raft_sim)
"""

from .core import NotLeader, RaftConfig, RaftNode, VoterChangeRefused
from .messages import Entry, Message, from_dict, to_dict
from .storage import FileStorage, MemoryStorage, RaftStorage, Snapshot
from .voters import Voter, VoterSet

__all__ = [
    "Entry",
    "FileStorage",
    "MemoryStorage",
    "Message",
    "NotLeader",
    "RaftConfig",
    "RaftNode",
    "RaftStorage",
    "Snapshot",
    "Voter",
    "VoterChangeRefused",
    "VoterSet",
    "from_dict",
    "to_dict",
]
