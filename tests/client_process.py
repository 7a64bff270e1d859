"""A Kafka client run as a process for a test: it prints one JSON object a line on stdout
(its events), reads "stop" on stdin to close, and can be killed with SIGKILL. Used by the
KIP-848 (tests/test_consumer_protocol.py) and share-group (tests/test_share_groups.py)
client tests; what each event means is the client's (its file's header says)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path


class ClientProcess:
    def __init__(self, name: str, cmd: list[str], logs: Path) -> None:
        self.name = name
        self.stderr = open(logs / f"{name}.err", "wb")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True
        )
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def exited(self) -> str | None:
        """Why it is no longer running (its exit code and stderr's tail), or None."""
        if self.proc.poll() is None:
            return None
        self.stderr.flush()
        err = Path(self.stderr.name).read_text()[-3000:]
        return f"{self.name} exited with {self.proc.returncode}: {err}"

    def stop(self) -> None:
        """Ask it to close (it leaves its group) and wait until it has."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("stop\n")
        self.proc.stdin.close()
        self.proc.wait(60)
        self._reader.join(10)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
