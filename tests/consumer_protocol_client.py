"""A confluent-kafka (librdkafka 2.x) consumer with group.protocol=consumer (KIP-848), run as
a process by tests/test_consumer_protocol.py; the same JSON lines as
tools/java/kafka-4.4/ConsumerProtocolClient.java:

    python tests/consumer_protocol_client.py BOOTSTRAP GROUP TOPIC NAME [key=value ...]

"assigned"/"revoked"/"lost" from the rebalance callbacks (wall-clock ms), "records" per
batch before its offsets are committed synchronously, "committed" or "commit_failed". A
refused commit (STALE_MEMBER_EPOCH while the member's epoch moves on) is tried again on the
next poll for the partitions the member still owns, as an application would. A line "stop"
(or end of input) on stdin ends the loop at its next poll: what is still pending is
committed, then the consumer closes and leaves the group.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaException, TopicPartition


def emit(**event: object) -> None:
    print(json.dumps(event), flush=True)


def main() -> None:
    bootstrap, group, topic, name, *extra = sys.argv[1:]
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": "consumer",
        "client.id": name,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    conf.update(kv.split("=", 1) for kv in extra)
    consumer = Consumer(conf)
    stop = threading.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=read_stdin, daemon=True).start()

    def now() -> int:
        return int(time.time() * 1000)

    # Offsets whose commit was refused, dropped when the partition is revoked or lost (the
    # next owner reads from the last commit and commits on its own).
    pending: dict[int, int] = {}

    def gone(event: str, ps: list[TopicPartition]) -> None:
        for p in ps:
            pending.pop(p.partition, None)
        emit(ev=event, ts=now(), parts=[p.partition for p in ps])

    consumer.subscribe(
        [topic],
        on_assign=lambda c, ps: emit(ev="assigned", ts=now(), parts=[p.partition for p in ps]),
        on_revoke=lambda c, ps: gone("revoked", ps),
        on_lost=lambda c, ps: gone("lost", ps),
    )

    def commit(offsets: dict[int, int]) -> dict[int, int]:
        """Commit synchronously, saying "committed" (what took) and "commit_failed";
        returns what was refused."""
        try:
            res = consumer.commit(
                offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()],
                asynchronous=False,
            )
        except KafkaException as e:
            emit(ev="commit_failed", error=str(e))
            return offsets
        done = [(tp.partition, tp.offset) for tp in res or () if tp.error is None]
        emit(ev="committed", ts=now(), offsets=sorted(done))
        if len(done) < len(offsets):
            emit(ev="commit_failed", error=str([tp.error for tp in res if tp.error]))
        return {tp.partition: tp.offset for tp in res or () if tp.error is not None}

    emit(ev="started")
    while not stop.is_set():
        msgs = consumer.consume(num_messages=500, timeout=0.2)
        good = [m for m in msgs if m.error() is None]
        owned = {tp.partition for tp in consumer.assignment()}
        nxt = {p: o for p, o in pending.items() if p in owned}
        pending.clear()
        if not good and not nxt:
            continue
        if good:
            emit(
                ev="records",
                ts=now(),
                recs=[[m.partition(), m.offset(), m.value().decode()] for m in good],
            )
        for m in good:
            nxt[m.partition()] = max(nxt.get(m.partition(), 0), m.offset() + 1)
        # Refused during a rebalance or after fencing: tried again next poll while the
        # partition is ours, else the next owner processes the records again.
        pending.update(commit(nxt))
    # A graceful shutdown commits what is still pending for partitions it owns.
    owned = {tp.partition for tp in consumer.assignment()}
    if last := {p: o for p, o in pending.items() if p in owned}:
        commit(last)
    consumer.close()
    emit(ev="closed", ts=now())


if __name__ == "__main__":
    main()
