"""The transaction coordinator's decisions, without I/O (Kafka's TransactionCoordinator
and TransactionMetadata, KIP-98 with KIP-360's epoch bumps and KIP-890's transactions v2).

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

Transactions v2 (KIP-890 part 2, an EndTxn of v5+): every EndTxn bumps the epoch (the
markers carry the new one, so a late write of the old epoch is fenced at the partition),
and the answer hands the client its next (producer id, epoch); a retried EndTxn is known
by the epoch one below the stored one. When the epochs of a producer id run out the
coordinator moves the id on to a fresh producer id. With v2 an abort is allowed with no
partition added (the client cannot know whether its first produce added one). The
partitions themselves are added by the partition leaders (AddPartitionsToTxn v5 from a
broker), and verified for v1 producers (KIP-890 part 1): `verify`.
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
TV1 = 1  # a client with transactions v1 (explicit AddPartitionsToTxn, one epoch per session)
TV2 = 2  # KIP-890's transactions v2: the epoch bumps at every EndTxn

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
    # Transactions v2: the epoch before the last bump (a retried EndTxn carries it), the
    # producer id before a move to a new one and the new one chosen while the markers
    # of the old one are written, and the version the client used last.
    last_epoch: int = -1
    previous_pid: int = NO_PRODUCER_ID
    next_pid: int = NO_PRODUCER_ID
    tv: int = TV1

    def to_json(self) -> dict:
        v = {
            "pid": self.producer_id,
            "epoch": self.producer_epoch,
            "timeout": self.timeout_ms,
            "state": self.state,
            "partitions": sorted([t, p] for t, p in self.partitions),
            "start": self.start_ms,
            "update": self.update_ms,
        }
        if self.tv >= TV2:  # v1 records stay as they were
            v.update(tv=self.tv, last=self.last_epoch, prev=self.previous_pid, next=self.next_pid)
        else:
            # The last epoch of an InitProducerId (Kafka writes lastProducerEpoch since
            # 2.4), so a retry is still known after the coordinator moves.
            if self.last_epoch >= 0:
                v["last"] = self.last_epoch
            if self.previous_pid != NO_PRODUCER_ID:
                v["prev"] = self.previous_pid
        return v

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
            int(v.get("last", -1)),
            int(v.get("prev", NO_PRODUCER_ID)),
            int(v.get("next", NO_PRODUCER_ID)),
            int(v.get("tv", TV1)),
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
        `expected`: KIP-360's (producer id, epoch) the client already holds, or none.

        Kafka's TransactionCoordinator.prepareInitProducerIdTransit and
        TransactionMetadata.prepareIncrementProducerEpoch: a client that holds the
        current epoch gets it bumped, and the epoch it held is kept as the last epoch, so
        the same request retried after its answer was lost (the client still holds the
        old epoch) is answered the current epoch again, unbumped; any other epoch is
        PRODUCER_FENCED. An InitProducerId without an expected epoch (a new incarnation)
        clears the last epoch, so an old incarnation's retry is fenced."""
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return Answer(ErrorCode.invalid_transaction_timeout)
        if tid in self.pending:
            return Answer(ErrorCode.concurrent_transactions)
        m = self.txns.get(tid)
        if m is None:
            after = TxnMetadata(tid, new_producer_id, 0, timeout_ms, EMPTY, update_ms=now)
            return Transition(after, Answer(ErrorCode.none, new_producer_id, 0))
        given = expected[0] != NO_PRODUCER_ID
        # isValidProducerId: the current id, or the previous one with its epochs spent (a
        # retry of the InitProducerId that moved the id on).
        if given and not (
            expected[0] == m.producer_id
            or (expected[0] == m.previous_pid and expected[1] >= MAX_EPOCH)
        ):
            return Answer(ErrorCode.producer_fenced)
        if m.state in PREPARING or m.state == DEAD:
            return Answer(ErrorCode.concurrent_transactions)
        if m.state == ONGOING:
            # A new incarnation of the producer: fence the old one (epoch + 1) and abort
            # what it left open; the client retries until the abort is complete.
            return Transition(
                self._fenced_abort(m, now, m.tv), Answer(ErrorCode.concurrent_transactions), True
            )
        previous = NO_PRODUCER_ID
        if m.producer_epoch >= MAX_EPOCH and (not given or expected[1] == m.producer_epoch):
            # prepareProducerIdRotation: a new producer id at epoch 0; the last epoch is
            # the spent one when the client named it, so its retry is known.
            if new_producer_id == NO_PRODUCER_ID:
                return Answer(ErrorCode.concurrent_transactions)  # the shell had no id: retry
            pid, epoch, last = new_producer_id, 0, m.producer_epoch if given else -1
            previous = m.producer_id
        elif not given:
            pid, epoch, last = m.producer_id, m.producer_epoch + 1, -1
        elif expected[1] == m.producer_epoch and m.producer_epoch < MAX_EPOCH:
            pid, epoch, last = m.producer_id, m.producer_epoch + 1, m.producer_epoch
        elif expected[1] == m.last_epoch and m.last_epoch >= 0:
            # A retry of a successful call: the current epoch again, not bumped (Kafka
            # still writes the state, with the new timeout).
            pid, epoch, last = m.producer_id, m.producer_epoch, m.last_epoch
            previous = m.previous_pid
        else:
            return Answer(ErrorCode.producer_fenced)
        after = replace(
            m,
            producer_id=pid,
            producer_epoch=epoch,
            timeout_ms=timeout_ms,
            state=EMPTY,
            partitions=frozenset(),
            start_ms=-1,
            update_ms=now,
            last_epoch=last,
            previous_pid=previous,
            next_pid=NO_PRODUCER_ID,
        )
        return Transition(after, Answer(ErrorCode.none, pid, epoch))

    def add_partitions(
        self,
        tid: str,
        producer_id: int,
        epoch: int,
        partitions: set[TopicPartition],
        now: int,
        tv: int = TV1,
    ) -> Decision:
        """AddPartitionsToTxn, AddOffsetsToTxn (its offsets partition), and with
        transactions v2 a partition leader's first produce (or TxnOffsetCommit) of a
        transaction: with v2 the epoch was bumped by the last EndTxn, so a new
        transaction starts at the same epoch."""
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
            tv=tv,
        )
        return Transition(after, Answer())

    def verify(
        self, tid: str, producer_id: int, epoch: int, partitions: set[TopicPartition]
    ) -> dict[TopicPartition, int]:
        """AddPartitionsToTxn with verify_only (KIP-890 part 1): is each partition in the
        producer's ongoing transaction? A partition leader asks before a transactional
        producer's first write to it, so a late write after the transaction ended is
        refused instead of opening a transaction no marker will close."""
        m, error = self._producer(tid, producer_id, epoch)
        if m is None:
            return dict.fromkeys(partitions, error)
        if m.state in PREPARING:
            return dict.fromkeys(partitions, ErrorCode.concurrent_transactions)
        inside = m.partitions if m.state == ONGOING else frozenset()
        return {tp: 0 if tp in inside else ErrorCode.invalid_txn_state for tp in partitions}

    def end_txn(
        self,
        tid: str,
        producer_id: int,
        epoch: int,
        commit: bool,
        now: int,
        tv: int = TV1,
        new_producer_id: int = NO_PRODUCER_ID,
    ) -> Decision:
        """EndTxn. `tv`: TV2 for an EndTxn of v5+. `new_producer_id`: a fresh id the
        shell allocated in case the epochs run out (only used with v2)."""
        if tv >= TV2:
            return self._end_txn_v2(tid, producer_id, epoch, commit, now, new_producer_id)
        m, error = self._producer(tid, producer_id, epoch)
        if m is None:
            return Answer(error)
        if m.state == ONGOING:
            after = replace(
                m, state=PREPARE_COMMIT if commit else PREPARE_ABORT, update_ms=now, tv=tv
            )
            return Transition(after, Answer(), markers=True)
        # A retried EndTxn after its outcome: the same answer again.
        if (m.state == COMPLETE_COMMIT and commit) or (m.state == COMPLETE_ABORT and not commit):
            return Answer()
        if (m.state == PREPARE_COMMIT and commit) or (m.state == PREPARE_ABORT and not commit):
            return Answer(ErrorCode.concurrent_transactions)
        return Answer(ErrorCode.invalid_txn_state)

    def _end_txn_v2(
        self, tid: str, producer_id: int, epoch: int, commit: bool, now: int, new_pid: int
    ) -> Decision:
        """Kafka 4's endTransaction for transactions v2."""
        m = self.txns.get(tid)
        if m is None:
            return Answer(ErrorCode.invalid_producer_id_mapping)
        # A retry of an EndTxn that moved the id to a new producer id, or bumped the epoch.
        retry_overflow = (
            m.previous_pid == producer_id and epoch == MAX_EPOCH and m.producer_epoch == 0
        )
        retry_bump = m.producer_id == producer_id and m.producer_epoch == epoch + 1
        if m.state in PREPARING:
            valid = retry_bump
        elif m.state in COMPLETE:
            valid = retry_bump or retry_overflow or epoch == m.producer_epoch
        else:
            valid = epoch == m.producer_epoch
        if m.producer_id != producer_id and not retry_overflow:
            return Answer(ErrorCode.invalid_producer_id_mapping)
        if not valid:
            return Answer(ErrorCode.producer_fenced)
        if tid in self.pending:
            return Answer(ErrorCode.concurrent_transactions)
        retry = retry_bump or retry_overflow
        done = Answer(ErrorCode.none, m.producer_id, m.producer_epoch)
        if m.state == ONGOING:
            return self._prepare_v2(m, PREPARE_COMMIT if commit else PREPARE_ABORT, now, new_pid)
        if m.state == COMPLETE_COMMIT:
            if commit:
                return done if retry else Answer(ErrorCode.invalid_txn_state)
            if retry:
                return Answer(ErrorCode.invalid_txn_state)
            return self._prepare_v2(m, PREPARE_ABORT, now, new_pid, empty=True)
        if m.state == COMPLETE_ABORT:
            if commit:
                return Answer(ErrorCode.invalid_txn_state)
            return done if retry else self._prepare_v2(m, PREPARE_ABORT, now, new_pid, True)
        if m.state in PREPARING:
            same = (m.state == PREPARE_COMMIT) == commit
            code = ErrorCode.concurrent_transactions if same else ErrorCode.invalid_txn_state
            return Answer(code)
        if m.state == EMPTY and not commit:
            return self._prepare_v2(m, PREPARE_ABORT, now, new_pid, empty=True)
        return Answer(ErrorCode.invalid_txn_state)

    def _prepare_v2(
        self, m: TxnMetadata, state: str, now: int, new_pid: int, empty: bool = False
    ) -> Decision:
        """Prepare with the epoch bumped; the client is answered its next identity: the
        bumped epoch, or a fresh producer id at epoch 0 once the epochs are spent (the
        markers still carry the old id, at the last epoch)."""
        next_pid = NO_PRODUCER_ID
        if m.producer_epoch >= MAX_EPOCH:
            if new_pid == NO_PRODUCER_ID:
                return Answer(ErrorCode.producer_fenced)  # the shell had no id to give
            next_pid = new_pid
        after = replace(
            m,
            producer_epoch=m.producer_epoch + 1,
            last_epoch=m.producer_epoch,
            next_pid=next_pid,
            state=state,
            partitions=frozenset() if empty else m.partitions,
            start_ms=now if empty else m.start_ms,
            update_ms=now,
            tv=TV2,
        )
        if next_pid != NO_PRODUCER_ID:
            answer = Answer(ErrorCode.none, next_pid, 0)
        else:
            answer = Answer(ErrorCode.none, m.producer_id, after.producer_epoch)
        return Transition(after, answer, markers=True)

    def complete(self, tid: str, now: int) -> Transition | None:
        """The markers of a Prepare state are all written: the transition to its
        Complete state (None if the state moved on meanwhile, e.g. unloaded)."""
        m = self.txns.get(tid)
        if m is None or m.state not in PREPARING or tid in self.pending:
            return None
        state = COMPLETE_COMMIT if m.state == PREPARE_COMMIT else COMPLETE_ABORT
        after = replace(m, state=state, partitions=frozenset(), start_ms=-1, update_ms=now)
        if m.tv >= TV2 and m.next_pid != NO_PRODUCER_ID:
            # The old id's markers are written: the id moves on to its new producer id.
            after = replace(
                after,
                producer_id=m.next_pid,
                producer_epoch=0,
                last_epoch=-1,
                previous_pid=m.producer_id,
                next_pid=NO_PRODUCER_ID,
            )
        return Transition(after, Answer())

    def timed_out(self, now: int) -> list[Transition]:
        """Ongoing transactions past their timeout: aborted, the producer fenced (epoch
        + 1, and + 1 more for the v2 abort, as Kafka 4 with transaction.version 2), so a
        zombie cannot go on writing in them."""
        out = []
        for tid, m in self.txns.items():
            if tid in self.pending or m.state != ONGOING:
                continue
            if now - m.start_ms > m.timeout_ms:
                out.append(Transition(self._fenced_abort(m, now, TV2), Answer(), True))
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
    def _fenced_abort(m: TxnMetadata, now: int, tv: int) -> TxnMetadata:
        """The abort of a transaction its producer left: fenced (epoch + 1) and, with
        v2, bumped once more as every v2 completion is (never past the last epoch)."""
        fenced = min(m.producer_epoch + 1, MAX_EPOCH + 1)
        if tv < TV2:
            return replace(m, producer_epoch=fenced, state=PREPARE_ABORT, update_ms=now, tv=tv)
        return replace(
            m,
            producer_epoch=min(fenced + 1, MAX_EPOCH + 1),
            last_epoch=fenced,
            next_pid=NO_PRODUCER_ID,
            state=PREPARE_ABORT,
            update_ms=now,
            tv=tv,
        )
