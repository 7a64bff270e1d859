"""Kafka's transaction APIs (KIP-98, KIP-447, KIP-890): InitProducerId with a
transactional id, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit,
DescribeTransactions, ListTransactions. The coordinator decides (transactions/state.py);
these handlers check authorization, find the coordinator's answer and shape it for the
request's version.

Both transaction versions are served at once, per request: the `transaction.version`
feature is finalized at 2, so Kafka 4 clients use v2 (EndTxn v5 bumps the epoch and
answers the next one; partition leaders add partitions for Produce v12 and the group
coordinator for TxnOffsetCommit v5), while librdkafka and older Java clients keep v1
(explicit AddPartitionsToTxn and AddOffsetsToTxn), verified by the partition leaders.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from kio.schema.errors import ErrorCode

from straitmq.errors import KafkaError
from straitmq.security.acls import (
    CLUSTER_ACTION,
    DESCRIBE,
    GROUP,
    READ,
    TOPIC,
    TRANSACTIONAL_ID,
    WRITE,
)

from ..groups.offsets import OFFSETS_TOPIC
from ..transactions.state import MAX_EPOCH, STATES, TV1, TV2, Answer, TxnMetadata
from .context import RequestContext
from .deps import TxnDeps

Handler = Callable[[RequestContext, Any], Awaitable[Any]]


def _ms(value: Any) -> int:
    """kio gives durations as timedeltas, some versions as ints."""
    return int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value)


def _fenced(code: int, old: bool) -> int:
    """PRODUCER_FENCED (KIP-588) is INVALID_PRODUCER_EPOCH for older request versions."""
    if old and code == ErrorCode.producer_fenced:
        return ErrorCode.invalid_producer_epoch
    return code


async def _coordinator_error(deps: TxnDeps, tid: str) -> int:
    """NOT_COORDINATOR unless this broker coordinates `tid` (the topic made if need be);
    COORDINATOR_LOAD_IN_PROGRESS while it is becoming its coordinator."""
    try:
        await deps.coordinator.ensure_topic()
    except KafkaError:
        return ErrorCode.coordinator_not_available
    c = deps.coordinator
    if c.owns(tid):
        return 0
    if c.coordinator_of(tid) == c.node_id:  # leader by the metadata, not loaded yet
        return ErrorCode.coordinator_load_in_progress
    return ErrorCode.not_coordinator


async def handle_init_producer_id(
    deps: TxnDeps, idempotent: Handler, ctx: RequestContext, req: Any
) -> dict:
    """InitProducerId: with a transactional id here, without it `idempotent` (admin)."""
    if req.transactional_id is None:
        return dict(await idempotent(ctx, req))
    return await _init_transactional(deps, ctx, req)


async def _init_transactional(deps: TxnDeps, ctx: RequestContext, req: Any) -> dict:
    tid = req.transactional_id
    old = ctx.version < 4

    def answer(a: Answer) -> dict:
        return {
            "throttle_time": 0,
            "error_code": _fenced(a.error, old),
            "producer_id": a.producer_id,
            "producer_epoch": a.producer_epoch,
        }

    if not ctx.allowed(WRITE, TRANSACTIONAL_ID, tid):
        return answer(Answer(ErrorCode.transactional_id_authorization_failed))
    expected = (int(getattr(req, "producer_id", -1)), int(getattr(req, "producer_epoch", -1)))
    if (expected[0] == -1) != (expected[1] == -1):
        # KafkaApis.handleInitProducerIdRequest: a producer id without an epoch, or an
        # epoch without an id, is INVALID_REQUEST.
        return answer(Answer(ErrorCode.invalid_request))
    if code := await _coordinator_error(deps, tid):
        return answer(Answer(code))
    core = deps.coordinator.core
    m = core.txns.get(tid)
    new_pid = -1
    if m is None or m.producer_epoch >= MAX_EPOCH:
        try:
            new_pid = await deps.next_producer_id()
        except KafkaError as e:
            return answer(Answer(e.code))
    decision = core.init_producer_id(tid, _ms(req.transaction_timeout), _now(), new_pid, expected)
    return answer(await deps.coordinator.run(decision))


async def handle_add_partitions_to_txn(deps: TxnDeps, ctx: RequestContext, req: Any) -> dict:
    if ctx.version <= 3:
        results = await _add_partitions(
            deps,
            ctx,
            req.v3_and_below_transactional_id,
            req.v3_and_below_producer_id,
            req.v3_and_below_producer_epoch,
            False,
            req.v3_and_below_topics,
        )
        return {"throttle_time": 0, "results_by_topic_v3_and_below": results}
    # v4+: several transactions, from brokers verifying a produce (KIP-890 part 1).
    if not ctx.cluster_allowed(CLUSTER_ACTION):
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed}
    out = []
    for t in req.transactions:
        results = await _add_partitions(
            deps,
            ctx,
            t.transactional_id,
            t.producer_id,
            t.producer_epoch,
            t.verify_only,
            t.topics,
        )
        out.append({"transactional_id": t.transactional_id, "topic_results": results})
    return {"throttle_time": 0, "error_code": 0, "results_by_transaction": out}


async def _add_partitions(
    deps: TxnDeps,
    ctx: RequestContext,
    tid: str,
    producer_id: int,
    epoch: int,
    verify_only: bool,
    topics: Any,
) -> list[dict]:
    wanted = {(t.name, int(p)) for t in topics for p in t.partitions}

    def each(codes: dict[tuple[str, int], int]) -> list[dict]:
        by_topic: dict[str, list[dict]] = {}
        for (name, p), code in sorted(codes.items()):
            by_topic.setdefault(name, []).append(
                {"partition_index": p, "partition_error_code": code}
            )
        return [{"name": n, "results_by_partition": ps} for n, ps in by_topic.items()]

    def all_of(code: int) -> list[dict]:
        return each(dict.fromkeys(wanted, code))

    if not ctx.allowed(WRITE, TRANSACTIONAL_ID, tid):
        return all_of(ErrorCode.transactional_id_authorization_failed)
    # Kafka: partitions one may not write, or that do not exist, fail; the rest are
    # OPERATION_NOT_ATTEMPTED, and nothing is added.
    image = deps.metadata.image
    bad: dict[tuple[str, int], int] = {}
    for name, p in wanted:
        if not ctx.allowed(WRITE, TOPIC, name):
            bad[(name, p)] = ErrorCode.topic_authorization_failed
        elif image.partition(name, p) is None:
            bad[(name, p)] = ErrorCode.unknown_topic_or_partition
    if bad:
        return each({tp: bad.get(tp, ErrorCode.operation_not_attempted) for tp in wanted})
    if code := await _coordinator_error(deps, tid):
        return all_of(code)
    # v5 from a broker adds for a transactions v2 producer (Produce v12); below, v1.
    tv = TV2 if ctx.version >= 5 and not verify_only else TV1
    codes = await deps.coordinator.add_or_verify(tid, producer_id, epoch, wanted, verify_only, tv)
    old = ctx.version < 2
    return each({tp: _fenced(code, old) for tp, code in codes.items()})


async def handle_add_offsets_to_txn(deps: TxnDeps, ctx: RequestContext, req: Any) -> dict:
    tid, group = req.transactional_id, req.group_id
    if not ctx.allowed(WRITE, TRANSACTIONAL_ID, tid):
        return {"throttle_time": 0, "error_code": ErrorCode.transactional_id_authorization_failed}
    if not ctx.allowed(READ, GROUP, group):
        return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed}
    if code := await _coordinator_error(deps, tid):
        return {"throttle_time": 0, "error_code": code}
    if not await deps.ensure_offsets_topic():
        return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available}
    tp = (OFFSETS_TOPIC, deps.offsets.partition_for(group))
    decision = deps.coordinator.core.add_partitions(
        tid, req.producer_id, req.producer_epoch, {tp}, _now()
    )
    a = await deps.coordinator.run(decision)
    return {"throttle_time": 0, "error_code": _fenced(a.error, ctx.version < 2)}


async def handle_end_txn(deps: TxnDeps, ctx: RequestContext, req: Any) -> dict:
    tid = req.transactional_id

    def answer(a: Answer) -> dict:
        return {
            "throttle_time": 0,
            "error_code": _fenced(a.error, ctx.version < 2),
            # v5+: the identity of the producer's next transaction (KIP-890)
            "producer_id": a.producer_id,
            "producer_epoch": a.producer_epoch,
        }

    if not ctx.allowed(WRITE, TRANSACTIONAL_ID, tid):
        return answer(Answer(ErrorCode.transactional_id_authorization_failed))
    if code := await _coordinator_error(deps, tid):
        return answer(Answer(code))
    tv = TV2 if ctx.version >= 5 else TV1
    core = deps.coordinator.core
    m = core.txns.get(tid)
    new_pid = -1
    if tv >= TV2 and m is not None and m.producer_epoch >= MAX_EPOCH:
        try:  # the epochs of this producer id are spent: the id moves to a new one
            new_pid = await deps.next_producer_id()
        except KafkaError as e:
            return answer(Answer(e.code))
    decision = core.end_txn(
        tid, req.producer_id, req.producer_epoch, bool(req.committed), _now(), tv, new_pid
    )
    return answer(await deps.coordinator.run(decision))


async def handle_txn_offset_commit(deps: TxnDeps, ctx: RequestContext, req: Any) -> dict:
    """The group coordinator's side of sendOffsetsToTransaction: the offsets are written
    in the producer's transaction and count once it commits (KIP-98, KIP-447)."""
    group = req.group_id
    wanted = [(t.name, p) for t in req.topics for p in t.partitions]

    def answer(codes: dict[tuple[str, int], int]) -> dict:
        by_topic: dict[str, list[dict]] = {}
        for (name, p), code in codes.items():
            by_topic.setdefault(name, []).append({"partition_index": p, "error_code": code})
        return {
            "throttle_time": 0,
            "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()],
        }

    def all_of(code: int) -> dict:
        return answer({(n, int(p.partition_index)): code for n, p in wanted})

    if not ctx.allowed(WRITE, TRANSACTIONAL_ID, req.transactional_id):
        return all_of(ErrorCode.transactional_id_authorization_failed)
    if not ctx.allowed(READ, GROUP, group):
        return all_of(ErrorCode.group_authorization_failed)
    if not deps.offsets.owns(group):
        return all_of(ErrorCode.not_coordinator)
    # KIP-447 (v3+): a member of an older generation is a zombie, fenced as an
    # OffsetCommit of it would be.
    generation = int(getattr(req, "generation_id", -1))
    member = getattr(req, "member_id", "")
    if member and generation >= 0:
        instance = getattr(req, "group_instance_id", None)
        if code := deps.groups.commit_check(group, member, instance, generation):
            return all_of(code)
    codes: dict[tuple[str, int], int] = {}
    entries = []
    for name, p in wanted:
        tp = (name, int(p.partition_index))
        if not ctx.allowed(READ, TOPIC, name):
            codes[tp] = ErrorCode.topic_authorization_failed
        elif deps.metadata.image.partition(name, tp[1]) is None:
            codes[tp] = ErrorCode.unknown_topic_or_partition
        else:
            codes[tp] = 0
            entries.append(
                (
                    name,
                    tp[1],
                    int(p.committed_offset),
                    int(getattr(p, "committed_leader_epoch", -1)),
                    p.committed_metadata,
                )
            )
    if entries:
        # The offsets partition must be in the transaction: added for a v2 producer
        # (v5, which sends no AddOffsetsToTxn), verified for a v1 one (KIP-890).
        tp_offsets = (OFFSETS_TOPIC, deps.offsets.partition_for(group))
        verified = await deps.verifier.verify(
            req.transactional_id,
            int(req.producer_id),
            int(req.producer_epoch),
            [tp_offsets],
            add=ctx.version >= 5,
        )
        if code := verified[tp_offsets]:
            return all_of(ErrorCode.coordinator_load_in_progress if code in _RETRY else code)
        try:
            end = deps.offsets.commit_transactional(
                group, (int(req.producer_id), int(req.producer_epoch)), entries
            )
        except KafkaError as e:
            return all_of(e.code)
        if not await deps.offsets_durable(group, end):
            return all_of(ErrorCode.request_timed_out)
    return answer(codes)


# A verification's passing troubles, answered to TxnOffsetCommit as
# COORDINATOR_LOAD_IN_PROGRESS: every client retries that against the same group
# coordinator (NOT_COORDINATOR would send it looking for another one).
_RETRY = frozenset(
    {
        ErrorCode.concurrent_transactions,
        ErrorCode.network_exception,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.coordinator_not_available,
        ErrorCode.not_coordinator,
    }
)


async def handle_describe_transactions(deps: TxnDeps, ctx: RequestContext, req: Any) -> dict:
    out = []
    for tid in req.transactional_ids:
        # Every field of the entry, errors included (Kafka answers an error with an empty
        # state and a zero start time, the defaults of its schema); a missing one fails the
        # whole answer (an internal error: the connection is closed).
        base = {
            "transactional_id": tid,
            "transaction_state": "",
            "transaction_timeout": 0,
            "transaction_start_time": 0,
            "producer_id": -1,
            "producer_epoch": -1,
            "topics": [],
        }
        if not ctx.allowed(DESCRIBE, TRANSACTIONAL_ID, tid):
            out.append({**base, "error_code": ErrorCode.transactional_id_authorization_failed})
            continue
        if code := await _coordinator_error(deps, tid):
            out.append({**base, "error_code": code})
            continue
        m = deps.coordinator.core.txns.get(tid)
        if m is None:
            out.append({**base, "error_code": ErrorCode.transactional_id_not_found})
            continue
        out.append({**_described(m), "error_code": 0})
    return {"throttle_time": 0, "transaction_states": out}


def _described(m: TxnMetadata) -> dict:
    topics: dict[str, list[int]] = {}
    for t, p in sorted(m.partitions):
        topics.setdefault(t, []).append(p)
    return {
        "transactional_id": m.transactional_id,
        "transaction_state": m.state,
        "transaction_timeout": m.timeout_ms,
        "transaction_start_time": m.start_ms,
        "producer_id": m.producer_id,
        "producer_epoch": m.producer_epoch,
        "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
    }


async def handle_list_transactions(deps: TxnDeps, ctx: RequestContext, req: Any) -> dict:
    states = set(req.state_filters or ())
    unknown = sorted(states - set(STATES))
    pids = {int(p) for p in req.producer_id_filters or ()}
    min_duration = int(getattr(req, "duration_filter", -1))
    now = _now()
    out = []
    for m in deps.coordinator.transactions():
        if states and m.state not in states:
            continue
        if pids and m.producer_id not in pids:
            continue
        if min_duration >= 0 and not (m.start_ms >= 0 and now - m.start_ms >= min_duration):
            continue
        if not ctx.allowed(DESCRIBE, TRANSACTIONAL_ID, m.transactional_id):
            continue
        out.append(
            {
                "transactional_id": m.transactional_id,
                "producer_id": m.producer_id,
                "transaction_state": m.state,
            }
        )
    return {
        "throttle_time": 0,
        "error_code": 0,
        "unknown_state_filters": unknown,
        "transaction_states": out,
    }


def _now() -> int:
    return int(time.time() * 1000)
