"""Produce: validate batch headers and CRCs, check idempotent sequences, append.

No record is decoded: the bytes the client sent are what lands in the log. With
acks=all the answer waits until the ISR has the batches (the high watermark passes
them), and is refused up front when the ISR is smaller than min.insync.replicas.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..partition_write import begin_write
from .context import RequestContext


async def handle_produce(ctx: RequestContext, req: Any) -> dict | None:
    broker = ctx.broker
    acks = req.acks
    responses = []
    writes = []
    for topic in req.topic_data:
        parts = []
        for pd in topic.partition_data:
            w = begin_write(broker, topic.name, pd.index, memoryview(pd.records or b""), acks)
            writes.append(w)
            parts.append((pd.index, w))
        responses.append((topic.name, parts))
    if acks == 0:
        return None
    pending = [w.replicated(req.timeout.total_seconds()) for w in writes if w.pending]
    if pending:
        await asyncio.gather(*pending)
    return {
        "responses": [
            {
                "name": name,
                "partition_responses": [
                    {
                        "index": index,
                        "error_code": w.error_code,
                        "base_offset": w.base_offset,
                        "log_append_time": None,
                        "log_start_offset": w.log_start_offset,
                        "record_errors": [],
                        "error_message": w.error_message,
                    }
                    for index, w in parts
                ],
            }
            for name, parts in responses
        ],
        "throttle_time": 0,
    }
