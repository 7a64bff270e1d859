"""A partition leader's side of KIP-890: before a transactional producer's first write
to a partition in a transaction, ask the transaction's coordinator.

- Transactions v1 producers (Produce up to v11) added the partition themselves with
  AddPartitionsToTxn; the leader only verifies it was added (`verify_only`), so a late or
  retried write after the transaction ended is refused instead of opening a transaction
  that no marker will ever close (a "hanging" transaction that stalls the LSO).
- Transactions v2 producers (Produce v12+) send no AddPartitionsToTxn: the leader adds
  the partition to the transaction for them. The group coordinator does the same for a
  TxnOffsetCommit v5 (the offsets partition).

Kafka's AddPartitionsToTxnManager does this over the inter-broker listener with
AddPartitionsToTxn v4+ (several transactions per request); here one request per
produce, and a direct call when this broker is the coordinator.
"""

from __future__ import annotations

from kio.schema.add_partitions_to_txn.v5 import request as aptx
from kio.schema.errors import ErrorCode
from kio.schema.types import ProducerId, TopicName, TransactionalId
from kio.static.primitive import i16, i32

from .channel import InterBrokerChannel
from .coordinator import TransactionCoordinator
from .state import TV1, TV2

TopicPartition = tuple[str, int]

# What a coordinator's answer means to the writer (Kafka's AddPartitionsToTxnManager).
_FOR_WRITER: dict[int, int] = {
    ErrorCode.producer_fenced: ErrorCode.invalid_producer_epoch,
    ErrorCode.transaction_abortable: ErrorCode.invalid_txn_state,
}


class TxnVerifier:
    def __init__(
        self, coordinator: TransactionCoordinator, channel: InterBrokerChannel, enabled: bool
    ) -> None:
        self.coordinator = coordinator
        self.channel = channel
        self._static = enabled  # the broker's own transaction.partition.verification.enable

    def verifying(self) -> bool:
        """transaction.partition.verification.enable now: the cluster's dynamic value
        over this broker's setting."""
        configs = self.coordinator.metadata.image.cluster_configs
        value = configs.get("transaction.partition.verification.enable")
        return self._static if value is None else value != "false"

    async def verify(
        self, tid: str, producer_id: int, epoch: int, partitions: list[TopicPartition], add: bool
    ) -> dict[TopicPartition, int]:
        """Per partition: 0 if it is (now) in the producer's ongoing transaction, else the
        error the writer answers. `add`: transactions v2, add it if it is not."""
        node = self.coordinator.coordinator_of(tid)
        if node is None:
            return dict.fromkeys(partitions, ErrorCode.coordinator_not_available)
        if node == self.channel.node_id:
            codes = await self.coordinator.add_or_verify(
                tid, producer_id, epoch, set(partitions), not add, TV2 if add else TV1
            )
        else:
            codes = await self._remote(node, tid, producer_id, epoch, partitions, add)
        return {tp: _FOR_WRITER.get(code, code) for tp, code in codes.items()}

    def close(self) -> None:
        self.channel.close()

    async def _remote(
        self,
        node: int,
        tid: str,
        producer_id: int,
        epoch: int,
        partitions: list[TopicPartition],
        add: bool,
    ) -> dict[TopicPartition, int]:
        by_topic: dict[str, list[int]] = {}
        for t, p in partitions:
            by_topic.setdefault(t, []).append(p)
        req = aptx.AddPartitionsToTxnRequest(
            transactions=(
                aptx.AddPartitionsToTxnTransaction(
                    transactional_id=TransactionalId(tid),
                    producer_id=ProducerId(producer_id),
                    producer_epoch=i16(epoch),
                    verify_only=not add,
                    topics=tuple(
                        aptx.AddPartitionsToTxnTopic(
                            name=TopicName(t), partitions=tuple(i32(p) for p in ps)
                        )
                        for t, ps in by_topic.items()
                    ),
                ),
            )
        )
        resp = await self.channel.call(node, 24, 5, req)
        if resp is None:
            return dict.fromkeys(partitions, ErrorCode.network_exception)
        if resp.error_code != ErrorCode.none:
            # The client must not see CLUSTER_AUTHORIZATION_FAILED (this broker's
            # principal lacks CLUSTER_ACTION): the partition is simply not verified.
            code = resp.error_code
            if code == ErrorCode.cluster_authorization_failed:
                code = ErrorCode.invalid_txn_state
            return dict.fromkeys(partitions, code)
        codes = dict.fromkeys(partitions, int(ErrorCode.network_exception))
        for txn in resp.results_by_transaction:
            for topic in txn.topic_results:
                for r in topic.results_by_partition:
                    tp = (str(topic.name), int(r.partition_index))
                    if tp in codes:
                        codes[tp] = int(r.partition_error_code)
        return codes
