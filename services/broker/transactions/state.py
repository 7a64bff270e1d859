"""The transaction coordinator's decisions, without I/O (Kafka's TransactionCoordinator
and TransactionMetadata, KIP-98 with KIP-360's epoch bumps).

Per transactional id the coordinator keeps one `TxnMetadata`: the producer id and epoch
it handed out, the transaction timeout, the state, and the partitions of the ongoing
transaction. Every change is first written to `__transaction_state` (the shell appends
the new metadata as a record keyed by the transactional id and waits until the ISR has
it) and applied only then, so a new coordinator that replays the partition knows every
transaction's outcome.

A request is answered by a `Decision`: either an answer at once (an error, or nothing to
change), or a `Transition` the shell writes and then applies with `apply`, answering
after. A transition to PrepareCommit/PrepareAbort asks the shell to write the markers to
every partition of the transaction; once all are written, `complete` gives the
transition to CompleteCommit/CompleteAbort. One change per transactional id at a time:
while one is being written, others are answered CONCURRENT_TRANSACTIONS, as Kafka does.

    Empty ──AddPartitions──▶ Ongoing ──EndTxn──▶ PrepareCommit ─markers─▶ CompleteCommit
      ▲                        │  └──EndTxn(abort), timeout──▶ PrepareAbort ─markers─▶ CompleteAbort
      └────InitProducerId (epoch + 1) from Empty / Complete*; from Ongoing: abort first
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kio.schema.errors import ErrorCode

from straitmq.invariants import check

EMPTY = "Empty"
ONGOING = "Ongoing"
PREPARE_COMMIT = "PrepareCommit"
PREPARE_ABORT = "PrepareAbort"
COMPLETE_COMMIT = "CompleteCommit"
COMPLETE_ABORT = "CompleteAbort"
DEAD = "Dead"
STATES = (EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT, DEAD)
PREPARING = (PREPARE_COMMIT, PREPARE_ABORT)
COMPLETE = (COMPLETE_COMMIT, COMPLETE_ABORT)

# Kafka's Short.MaxValue - 1: the last epoch a producer id can be given; past it, a new id.
MAX_EPOCH = 32766
NO_PRODUCER_ID = -1

TopicPartition = tuple[str, int]

# Which transitions are allowed (Kafka's TransactionState.validPreviousStates, read the
# other way round).
_NEXT: dict[str, tuple[str, ...]] = {
    EMPTY: (EMPTY, ONGOING, PREPARE_ABORT, DEAD),
    ONGOING: (ONGOING, PREPARE_COMMIT, PREPARE_ABORT),
    PREPARE_COMMIT: (COMPLETE_COMMIT,),
    PREPARE_ABORT: (COMPLETE_ABORT,),
    COMPLETE_COMMIT: (EMPTY, ONGOING, PREPARE_ABORT, DEAD),
    COMPLETE_ABORT: (EMPTY, ONGOING, PREPARE_ABORT, DEAD),
    DEAD: (),
}


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str
    partitions: frozenset[TopicPartition] = frozenset()
    start_ms: int = -1  # when the ongoing transaction began (its first partition)
    update_ms: int = -1

    def to_json(self) -> dict:
        return {
            "pid": self.producer_id,
            "epoch": self.producer_epoch,
            "timeout": self.timeout_ms,
            "state": self.state,
            "partitions": sorted([t, p] for t, p in self.partitions),
            "start": self.start_ms,
            "update": self.update_ms,
        }

    @classmethod
    def from_json(cls, tid: str, v: dict) -> TxnMetadata:
        if v["state"] not in STATES:
            raise ValueError(f"unknown transaction state {v['state']!r}")
        return cls(
            tid,
            int(v["pid"]),
            int(v["epoch"]),
            int(v["timeout"]),
            v["state"],
            frozenset((str(t), int(p)) for t, p in v["partitions"]),
            int(v["start"]),
            int(v["update"]),
        )


@dataclass(frozen=True, slots=True)
class Answer:
    error: int = ErrorCode.none
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class Transition:
    """Write `after` to the log, then `apply` it and answer `answer`. `markers`: the
    markers of `after` must be written next (it is a Prepare state)."""

    after: TxnMetadata
    answer: Answer
    markers: bool = False


Decision = Answer | Transition


@dataclass(slots=True)
class TransactionStateMachine:
    """The state of every transactional id one coordinator owns (the ids of the
    `__transaction_state` partitions this broker leads)."""

    max_timeout_ms: int
    txns: dict[str, TxnMetadata] = field(default_factory=dict)
    pending: set[str] = field(default_factory=set)  # ids with a transition being written

    # -- the log --------------------------------------------------------------------------

    def replay(self, tid: str, value: dict | None) -> None:
        """A record of `__transaction_state`, in log order (a new coordinator's load)."""
        if value is None:
            self.txns.pop(tid, None)
            return
        self.txns[tid] = TxnMetadata.from_json(tid, value)

    def unload(self, owned: set[str]) -> None:
        for tid in owned:
            self.txns.pop(tid, None)
            self.pending.discard(tid)

    # -- requests -------------------------------------------------------------------------

    def init_producer_id(
        self,
        tid: str,
        timeout_ms: int,
        now: int,
        new_producer_id: int,
        expected: tuple[int, int] = (NO_PRODUCER_ID, -1),
    ) -> Decision:
        """InitProducerId with a transactional id. `new_producer_id`: a fresh id the
        shell allocated, used when the id is new or its epochs are exhausted.
        `expected`: KIP-360's (producer id, epoch) the client already holds, or none."""
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return Answer(ErrorCode.invalid_transaction_timeout)
        if tid in self.pending:
            return Answer(ErrorCode.concurrent_transactions)
        m = self.txns.get(tid)
        if m is None:
            after = TxnMetadata(tid, new_producer_id, 0, timeout_ms, EMPTY, update_ms=now)
            return Transition(after, Answer(ErrorCode.none, new_producer_id, 0))
        if m.state in PREPARING or m.state == DEAD:
            return Answer(ErrorCode.concurrent_transactions)
        if expected[0] != NO_PRODUCER_ID and expected != (m.producer_id, m.producer_epoch):
            return Answer(ErrorCode.producer_fenced)
        if m.state == ONGOING:
            # A new incarnation of the producer: fence the old one (epoch + 1) and abort
            # what it left open; the client retries until the abort is complete.
            return Transition(
                self._fenced_abort(m, now), Answer(ErrorCode.concurrent_transactions), True
            )
        pid, epoch = m.producer_id, m.producer_epoch + 1
        if epoch > MAX_EPOCH:
            pid, epoch = new_producer_id, 0
        after = replace(
            m,
            producer_id=pid,
            producer_epoch=epoch,
            timeout_ms=timeout_ms,
            state=EMPTY,
            partitions=frozenset(),
            start_ms=-1,
            update_ms=now,
        )
        return Transition(after, Answer(ErrorCode.none, pid, epoch))

    def add_partitions(
        self, tid: str, producer_id: int, epoch: int, partitions: set[TopicPartition], now: int
    ) -> Decision:
        """AddPartitionsToTxn, and AddOffsetsToTxn (its offsets partition)."""
        m, error = self._producer(tid, producer_id, epoch)
        if m is None:
            return Answer(error)
        if m.state in PREPARING:
            return Answer(ErrorCode.concurrent_transactions)
        if m.state == DEAD:
            return Answer(ErrorCode.invalid_txn_state)
        if m.state == ONGOING and partitions <= m.partitions:
            return Answer()  # nothing new: no write
        after = replace(
            m,
            state=ONGOING,
            partitions=(m.partitions if m.state == ONGOING else frozenset()) | partitions,
            start_ms=m.start_ms if m.state == ONGOING else now,
            update_ms=now,
        )
        return Transition(after, Answer())

    def end_txn(self, tid: str, producer_id: int, epoch: int, commit: bool, now: int) -> Decision:
        m, error = self._producer(tid, producer_id, epoch)
        if m is None:
            return Answer(error)
        if m.state == ONGOING:
            after = replace(m, state=PREPARE_COMMIT if commit else PREPARE_ABORT, update_ms=now)
            return Transition(after, Answer(), markers=True)
        # A retried EndTxn after its outcome: the same answer again.
        if (m.state == COMPLETE_COMMIT and commit) or (m.state == COMPLETE_ABORT and not commit):
            return Answer()
        if (m.state == PREPARE_COMMIT and commit) or (m.state == PREPARE_ABORT and not commit):
            return Answer(ErrorCode.concurrent_transactions)
        return Answer(ErrorCode.invalid_txn_state)

    def complete(self, tid: str, now: int) -> Transition | None:
        """The markers of a Prepare state are all written: the transition to its
        Complete state (None if the state moved on meanwhile, e.g. unloaded)."""
        m = self.txns.get(tid)
        if m is None or m.state not in PREPARING or tid in self.pending:
            return None
        state = COMPLETE_COMMIT if m.state == PREPARE_COMMIT else COMPLETE_ABORT
        after = replace(m, state=state, partitions=frozenset(), start_ms=-1, update_ms=now)
        return Transition(after, Answer())

    def timed_out(self, now: int) -> list[Transition]:
        """Ongoing transactions past their timeout: aborted, the producer fenced (epoch
        + 1), so a zombie cannot go on writing in them."""
        out = []
        for tid, m in self.txns.items():
            if tid in self.pending or m.state != ONGOING:
                continue
            if now - m.start_ms > m.timeout_ms:
                out.append(Transition(self._fenced_abort(m, now), Answer(), True))
        return out

    def expired(self, now: int, expiration_ms: int) -> list[str]:
        """Ids idle for transactional.id.expiration.ms with no transaction open: the
        shell writes their tombstones."""
        return [
            tid
            for tid, m in self.txns.items()
            if tid not in self.pending
            and m.state in (EMPTY, *COMPLETE)
            and now - m.update_ms > expiration_ms
        ]

    def in_flight(self) -> list[TxnMetadata]:
        """Prepare states whose markers must be (re)written: after a coordinator moves."""
        return [
            m for tid, m in self.txns.items() if m.state in PREPARING and tid not in self.pending
        ]

    # -- applying what was written -----------------------------------------------------------

    def begin(self, t: Transition) -> None:
        """The shell is writing `t`: no other change to the id until `apply`/`abandon`."""
        check(
            t.after.transactional_id not in self.pending,
            "one transition per transactional id at a time",
            transactional_id=t.after.transactional_id,
        )
        self.pending.add(t.after.transactional_id)

    def apply(self, t: Transition) -> None:
        tid = t.after.transactional_id
        before = self.txns.get(tid)
        if before is not None:
            check(
                t.after.state in _NEXT[before.state]
                or (before.state == ONGOING and t.after.state == PREPARE_ABORT),
                "a transaction moves only along Kafka's state graph",
                transactional_id=tid,
                before=before.state,
                after=t.after.state,
            )
            check(
                (t.after.producer_id, t.after.producer_epoch)
                >= (before.producer_id, before.producer_epoch)
                or t.after.producer_id != before.producer_id,
                "a producer's epoch never goes back",
                transactional_id=tid,
                before=before.producer_epoch,
                after=t.after.producer_epoch,
            )
        self.pending.discard(tid)
        self.txns[tid] = t.after

    def abandon(self, t: Transition) -> None:
        """The write failed (not leader any more, a timeout): nothing changed."""
        self.pending.discard(t.after.transactional_id)

    # -- helpers ------------------------------------------------------------------------------

    def _producer(self, tid: str, producer_id: int, epoch: int) -> tuple[TxnMetadata | None, int]:
        m = self.txns.get(tid)
        if m is None or m.producer_id != producer_id:
            return None, ErrorCode.invalid_producer_id_mapping
        if epoch != m.producer_epoch:
            return None, ErrorCode.producer_fenced
        if tid in self.pending:
            return None, ErrorCode.concurrent_transactions
        return m, ErrorCode.none

    @staticmethod
    def _fenced_abort(m: TxnMetadata, now: int) -> TxnMetadata:
        epoch = m.producer_epoch + 1 if m.producer_epoch < MAX_EPOCH else m.producer_epoch
        return replace(m, producer_epoch=epoch, state=PREPARE_ABORT, update_ms=now)
