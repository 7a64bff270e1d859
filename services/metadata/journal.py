"""A durable, append-only metadata log for a single node: one JSON record per line.

Each append is fsynced before it is applied. A torn last line (crash mid-write) is cut
off at startup. The clustered controller replaces this with the Raft log.
"""

from __future__ import annotations

import logging
import os

import orjson

from .image import MetadataImage, Record

log = logging.getLogger("straitmq.metadata")


class MetadataJournal:
    def __init__(self, path: str) -> None:
        self.path = path
        self.image = MetadataImage()
        good = 0
        if os.path.exists(path):
            with open(path, "rb") as f:
                data = f.read()
            for line in data.splitlines(keepends=True):
                if not line.endswith(b"\n"):
                    break
                try:
                    self.image.apply(orjson.loads(line))
                except (orjson.JSONDecodeError, KeyError, ValueError):
                    break
                good += len(line)
            if good != len(data):
                log.warning("metadata journal: cut a torn tail", extra={"bytes": len(data) - good})
                with open(path, "r+b") as f:
                    f.truncate(good)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def append(self, records: list[Record]) -> None:
        data = b"".join(orjson.dumps(r) + b"\n" for r in records)
        os.write(self._fd, data)
        os.fsync(self._fd)
        for r in records:
            self.image.apply(r)

    def close(self) -> None:
        os.close(self._fd)
