"""A seeded simulation of the transaction coordinator's state machine.

Producers (several incarnations per transactional id, old ones left running as zombies,
each speaking transactions v1 or v2) send InitProducerId, AddPartitionsToTxn (or, for
v2, the partition leader's add), verifications, EndTxn and retried EndTxns at random;
the clock jumps (timeouts);
writes to `__transaction_state` fail at random (the shell abandons them); markers finish
after a random delay; the coordinator crashes and a new one replays the log. After every
step the invariants are checked: epochs never go back, a prepared outcome is the one that
completes, a zombie is never answered success, a replay gives the live state, and every
answer is one Kafka gives for that request.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import pytest
from kio.schema.errors import ErrorCode as E
from straitmq.broker.transactions.state import (
    COMPLETE,
    EMPTY,
    MAX_EPOCH,
    ONGOING,
    PREPARE_ABORT,
    PREPARE_COMMIT,
    PREPARING,
    TV1,
    TV2,
    Answer,
    TransactionStateMachine,
    Transition,
    TxnMetadata,
)

from straitmq.invariants import raising

TIDS = ("a", "b", "c")
PARTS = [("t", i) for i in range(4)]
ANSWERS = {
    "init": {E.none, E.concurrent_transactions, E.producer_fenced, E.invalid_transaction_timeout},
    "add": {
        E.none,
        E.concurrent_transactions,
        E.producer_fenced,
        E.invalid_producer_id_mapping,
        E.invalid_txn_state,
    },
    "end": {
        E.none,
        E.concurrent_transactions,
        E.producer_fenced,
        E.invalid_producer_id_mapping,
        E.invalid_txn_state,
    },
}


@dataclass
class Client:
    tid: str
    tv: int = TV1
    pid: int = -1
    epoch: int = -1
    sent_end: tuple[int, int, bool] | None = None  # the last EndTxn, for a retry


class Sim:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.now = 1_000_000
        self.core = TransactionStateMachine(max_timeout_ms=60_000)
        self.log: list[TxnMetadata] = []  # what reached __transaction_state
        self.writing: list[Transition] = []  # begun, not yet durable
        self.next_pid = 100
        self.clients: list[Client] = []
        self.best: dict[str, tuple[int, int]] = {}  # newest (pid, epoch) handed out per id

    # -- the shell ----------------------------------------------------------------------

    def run(self, kind: str, decision: Answer | Transition) -> Answer:
        if isinstance(decision, Answer):
            assert decision.error in ANSWERS[kind], (kind, decision)
            return decision
        self.core.begin(decision)
        if self.rng.random() < 0.15:  # the write did not make it (leader moved, timeout)
            self.core.abandon(decision)
            return Answer(E.not_coordinator)
        self.log.append(decision.after)
        self.core.apply(decision)
        assert decision.answer.error in ANSWERS[kind], (kind, decision)
        return decision.answer

    def crash(self) -> None:
        """A new coordinator: the durable log replayed, nothing else."""
        core = TransactionStateMachine(max_timeout_ms=60_000)
        for m in self.log:
            core.replay(m.transactional_id, m.to_json())
        self.core = core

    def finish_markers(self) -> None:
        for m in list(self.core.txns.values()):
            if m.state in PREPARING and self.rng.random() < 0.5:
                t = self.core.complete(m.transactional_id, self.now)
                if t is not None:
                    self.run("end", t)

    # -- producers -------------------------------------------------------------------------

    def step(self) -> None:
        r = self.rng.random()
        self.now += self.rng.choice((1, 10, 100, 70_000 if r < 0.03 else 5))
        if r < 0.02:
            self.crash()
            return
        if r < 0.1:
            for t in self.core.timed_out(self.now):
                self.run("end", t)
            return
        if r < 0.3 or not self.clients:
            c = Client(self.rng.choice(TIDS), self.rng.choice((TV1, TV2)))
            self.clients.append(c)  # older incarnations of the id stay: zombies
            self.init(c)
            return
        c = self.rng.choice(self.clients)
        if c.pid < 0 or r < 0.4:
            self.init(c)
        elif r < 0.65:
            parts = set(self.rng.sample(PARTS, self.rng.randint(1, 3)))
            decision = self.core.add_partitions(c.tid, c.pid, c.epoch, parts, self.now, c.tv)
            a = self.run("add", decision)
            self.check_not_zombie(c, a)
        elif r < 0.72:
            self.verify(c)
        elif r < 0.8 and c.sent_end is not None:
            self.end(c, *c.sent_end)  # the answer was lost: the client sends it again
        else:
            self.end(c, c.pid, c.epoch, self.rng.random() < 0.6)
        self.finish_markers()

    def end(self, c: Client, pid: int, epoch: int, commit: bool) -> None:
        before = self.core.txns.get(c.tid)
        new_pid = self.next_pid
        self.next_pid += 1
        decision = self.core.end_txn(c.tid, pid, epoch, commit, self.now, c.tv, new_pid)
        a = self.run("end", decision)
        if c.tv < TV2:
            self.check_not_zombie(c, a)
            return
        c.sent_end = (pid, epoch, commit)
        if a.error != E.none:
            return
        assert before is not None
        current = (before.producer_id, before.producer_epoch) == (pid, epoch)
        retry = (before.producer_id == pid and before.producer_epoch == epoch + 1) or (
            before.previous_pid == pid and epoch == MAX_EPOCH and before.producer_epoch == 0
        )
        assert current or retry, "v2: only the current producer or its retry succeeds"
        m = self.core.txns[c.tid]
        if isinstance(decision, Transition):
            assert m.producer_epoch == before.producer_epoch + 1, "every v2 end bumps"
            assert m.state in PREPARING
        assert (a.producer_id, a.producer_epoch) in (
            (m.producer_id, m.producer_epoch),
            (m.next_pid, 0),
        ), "the answer is the producer's next identity"
        c.pid, c.epoch = a.producer_id, a.producer_epoch
        best = self.best.get(c.tid)
        if best is None or best < (c.pid, c.epoch) or best[0] != c.pid:
            self.best[c.tid] = (c.pid, c.epoch)

    def verify(self, c: Client) -> None:
        parts = set(self.rng.sample(PARTS, 2))
        codes = self.core.verify(c.tid, c.pid, c.epoch, parts)
        m = self.core.txns.get(c.tid)
        for tp, code in codes.items():
            assert code in ANSWERS["add"], code
            if code == E.none:
                assert m is not None and m.state == ONGOING and tp in m.partitions
                assert (m.producer_id, m.producer_epoch) == (c.pid, c.epoch)

    def init(self, c: Client) -> None:
        pid = self.next_pid
        self.next_pid += 1
        timeout = self.rng.choice((30_000, 60_000, 0, 90_000))
        a = self.run("init", self.core.init_producer_id(c.tid, timeout, self.now, pid))
        if a.error == E.none:
            best = self.best.get(c.tid)
            assert best is None or (a.producer_id, a.producer_epoch) != best, "a new epoch"
            c.pid, c.epoch = a.producer_id, a.producer_epoch
            self.best[c.tid] = (c.pid, c.epoch)

    def check_not_zombie(self, c: Client, a: Answer) -> None:
        m = self.core.txns.get(c.tid)
        if a.error == E.none:
            assert m is not None and (m.producer_id, m.producer_epoch) == (c.pid, c.epoch), (
                "only the current producer of an id is answered success"
            )

    # -- invariants ---------------------------------------------------------------------------

    def check(self) -> None:
        last: dict[str, TxnMetadata] = {}
        for m in self.log:
            before = last.get(m.transactional_id)
            if before is not None:
                if m.producer_id == before.producer_id:
                    assert m.producer_epoch >= before.producer_epoch, "epochs never go back"
                if before.state == PREPARE_COMMIT:
                    assert m.state == "CompleteCommit", "a prepared commit completes as one"
                if before.state == PREPARE_ABORT:
                    assert m.state == "CompleteAbort", "a prepared abort completes as one"
                if m.state in PREPARING and m.partitions:
                    assert before.state == ONGOING, "only an ongoing transaction is prepared"
                    assert m.partitions == before.partitions, "the markers go where it wrote"
                elif m.state in PREPARING:  # v2: an abort with no partition added
                    assert m.state == PREPARE_ABORT and m.tv == TV2
                    assert before.state in (EMPTY, ONGOING, *COMPLETE)
                if m.state in COMPLETE:
                    assert m.partitions == frozenset()
            last[m.transactional_id] = m
        if not self.core.pending:
            replayed = TransactionStateMachine(max_timeout_ms=60_000)
            for m in self.log:
                replayed.replay(m.transactional_id, m.to_json())
            assert replayed.txns == self.core.txns, "a replay gives the live state"


SEEDS = range(30)
SEEN: set[str] = set()


@pytest.mark.parametrize("seed", SEEDS)
def test_seeded_schedules_keep_the_invariants(seed: int) -> None:
    sim = Sim(seed)
    with raising():
        for _ in range(600):
            sim.step()
            sim.check()
    states = {m.state for m in sim.log}
    assert states & set(COMPLETE), f"seed {seed}: no transaction finished"
    SEEN.update(states)


def test_the_schedules_reached_every_state() -> None:
    """The seeds above together drove transactions through every state (a schedule
    that never commits would check little)."""
    if len(SEEN) < 3:  # run alone: drive the seeds here
        for seed in SEEDS:
            test_seeded_schedules_keep_the_invariants(seed)
    assert {"Empty", ONGOING, PREPARE_COMMIT, PREPARE_ABORT, *COMPLETE} <= SEEN, SEEN


def _written(core: TransactionStateMachine, d: Answer | Transition) -> Answer:
    """A shell whose writes always succeed: the answer, a transition applied first."""
    if isinstance(d, Answer):
        return d
    core.begin(d)
    core.apply(d)
    return d.answer


def test_a_zombie_is_fenced_and_its_transaction_aborted() -> None:
    core = TransactionStateMachine(max_timeout_ms=60_000)

    def run(d: Answer | Transition) -> Answer:
        return _written(core, d)

    first = run(core.init_producer_id("x", 10_000, 0, 7))
    assert (first.producer_id, first.producer_epoch) == (7, 0)
    assert run(core.add_partitions("x", 7, 0, {("t", 0)}, 1)).error == E.none
    # A second incarnation: the open transaction is aborted with the epoch bumped, and
    # the new producer is told to retry until that is done.
    d = core.init_producer_id("x", 10_000, 2, 8)
    assert isinstance(d, Transition) and d.markers and d.after.state == PREPARE_ABORT
    assert run(d).error == E.concurrent_transactions
    assert run(core.end_txn("x", 7, 0, True, 3)).error == E.producer_fenced
    done = core.complete("x", 4)
    assert done is not None
    run(done)
    second = run(core.init_producer_id("x", 10_000, 5, 9))
    assert (second.producer_id, second.producer_epoch) == (7, 2)
    # The zombie's commit and add are refused; so is an EndTxn with nothing open.
    assert run(core.add_partitions("x", 7, 0, {("t", 1)}, 6)).error == E.producer_fenced
    assert run(core.end_txn("x", 7, 2, True, 7)).error == E.invalid_txn_state
    assert run(core.end_txn("y", 7, 2, True, 7)).error == E.invalid_producer_id_mapping
    # A transaction past its timeout is aborted, fencing its producer.
    assert run(core.add_partitions("x", 7, 2, {("t", 1)}, 10)).error == E.none
    [t] = core.timed_out(10 + 10_001)
    # Fenced (+1) and bumped again as a v2 completion (+1): Kafka 4 aborts timed-out
    # transactions with the server's transaction.version, 2.
    assert t.after.state == PREPARE_ABORT and t.after.producer_epoch == 4


def test_init_producer_id_retried_after_a_lost_answer_gets_the_same_epoch() -> None:
    """KIP-360: an InitProducerId carrying the (producer id, epoch) the client held is
    answered the epoch + 1; the same request again (its answer lost) is answered that
    epoch again, also by a coordinator that replayed the log; other epochs are fenced
    (Kafka's TransactionMetadata.prepareIncrementProducerEpoch)."""
    core = TransactionStateMachine(max_timeout_ms=60_000)
    first = _written(core, core.init_producer_id("x", 10_000, 0, 7))
    assert (first.producer_id, first.producer_epoch) == (7, 0)
    bumped = _written(core, core.init_producer_id("x", 10_000, 1, -1, (7, 0)))
    assert (bumped.error, bumped.producer_id, bumped.producer_epoch) == (E.none, 7, 1)
    # The retry, on this coordinator and on one that replayed the records.
    replayed = TransactionStateMachine(max_timeout_ms=60_000)
    replayed.replay("x", core.txns["x"].to_json())
    for c in (core, replayed):
        again = _written(c, c.init_producer_id("x", 10_000, 2, -1, (7, 0)))
        assert (again.error, again.producer_id, again.producer_epoch) == (E.none, 7, 1)
    assert _written(core, core.init_producer_id("x", 10_000, 3, -1, (7, 1))).producer_epoch == 2
    assert _written(core, core.init_producer_id("x", 10_000, 4, -1, (7, 0))).error == (
        E.producer_fenced
    )
    # A new incarnation (no epoch given) forgets the last epoch: the old one's retry is
    # fenced; so is another producer id.
    assert _written(core, core.init_producer_id("x", 10_000, 5, -1)).producer_epoch == 3
    assert _written(core, core.init_producer_id("x", 10_000, 6, -1, (7, 2))).error == (
        E.producer_fenced
    )
    assert _written(core, core.init_producer_id("x", 10_000, 6, -1, (8, 3))).error == (
        E.producer_fenced
    )
    # The epochs run out: a new producer id, and its retry is answered it again.
    core.txns["x"] = replace(core.txns["x"], producer_epoch=MAX_EPOCH)
    moved = _written(core, core.init_producer_id("x", 10_000, 7, 9, (7, MAX_EPOCH)))
    assert (moved.error, moved.producer_id, moved.producer_epoch) == (E.none, 9, 0)
    again = _written(core, core.init_producer_id("x", 10_000, 8, -1, (7, MAX_EPOCH)))
    assert (again.error, again.producer_id, again.producer_epoch) == (E.none, 9, 0)


def test_v2_bumps_every_end_answers_retries_and_moves_to_a_new_id_when_spent() -> None:
    core = TransactionStateMachine(max_timeout_ms=60_000)

    def run(d: Answer | Transition) -> Answer:
        answer = _written(core, d)
        if isinstance(d, Transition) and d.markers:  # the markers are written at once here
            done = core.complete(d.after.transactional_id, 0)
            assert done is not None
            _written(core, done)
        return answer

    run(core.init_producer_id("x", 10_000, 0, 7))
    assert run(core.add_partitions("x", 7, 0, {("t", 0)}, 1, TV2)).error == E.none
    a = run(core.end_txn("x", 7, 0, True, 2, TV2))
    assert (a.error, a.producer_id, a.producer_epoch) == (E.none, 7, 1)
    # The same EndTxn again (its answer was lost): success, the same identity, no write.
    again = core.end_txn("x", 7, 0, True, 3, TV2)
    assert isinstance(again, Answer) and (again.producer_id, again.producer_epoch) == (7, 1)
    # An abort with no partition added (the client cannot know whether its first
    # produce reached the coordinator) bumps the epoch too.
    a = run(core.end_txn("x", 7, 1, False, 4, TV2))
    assert (a.error, a.producer_epoch) == (E.none, 2)
    # A commit with nothing open is refused, as is the old epoch's commit now.
    assert run(core.end_txn("x", 7, 2, True, 5, TV2)).error == E.invalid_txn_state
    assert run(core.end_txn("x", 7, 0, True, 5, TV2)).error == E.producer_fenced
    # The epochs of producer id 7 run out: the answer is a fresh id at epoch 0, the
    # markers still carry 7 at the last epoch, and a retry is answered the new id.
    core.txns["x"] = replace(core.txns["x"], producer_epoch=MAX_EPOCH)
    assert run(core.add_partitions("x", 7, MAX_EPOCH, {("t", 0)}, 6, TV2)).error == E.none
    d = core.end_txn("x", 7, MAX_EPOCH, True, 7, TV2, new_producer_id=42)
    assert isinstance(d, Transition) and d.after.producer_id == 7
    assert d.after.producer_epoch == MAX_EPOCH + 1 and d.after.next_pid == 42
    assert (run(d).producer_id, d.answer.producer_epoch) == (42, 0)
    m = core.txns["x"]
    assert (m.producer_id, m.producer_epoch, m.previous_pid) == (42, 0, 7)
    retry = core.end_txn("x", 7, MAX_EPOCH, True, 8, TV2)
    assert isinstance(retry, Answer) and (retry.error, retry.producer_id) == (E.none, 42)
    # A v1 record of the state still reads (records written before v2 existed).
    v1 = TxnMetadata("y", 3, 1, 1000, EMPTY)
    assert "tv" not in v1.to_json() and TxnMetadata.from_json("y", v1.to_json()) == v1


def test_verify_only_confirms_the_partitions_of_the_current_transaction() -> None:
    core = TransactionStateMachine(max_timeout_ms=60_000)
    assert _written(core, core.init_producer_id("x", 10_000, 0, 7)).error == E.none
    assert _written(core, core.add_partitions("x", 7, 0, {("t", 0)}, 1)).error == E.none
    assert core.verify("x", 7, 0, {("t", 0), ("t", 1)}) == {
        ("t", 0): E.none,
        ("t", 1): E.invalid_txn_state,
    }
    assert core.verify("x", 7, 1, {("t", 0)}) == {("t", 0): E.producer_fenced}
    assert core.verify("x", 8, 0, {("t", 0)}) == {("t", 0): E.invalid_producer_id_mapping}
