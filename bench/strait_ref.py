"""One StraitMQ broker process (combined with its controller) for benchmarks: the counterpart
of bench/kafka_ref.py's KafkaRef.

    from bench.strait_ref import StraitRef
    with StraitRef() as s:              # free loopback ports, data in a temp folder
        print(s.bootstrap, s.http)      # "127.0.0.1:40123", "http://127.0.0.1:40124"

`python -m straitmq.broker --data-dir WORKDIR/data --listen ... --http ...` started with
`python` (default: this interpreter; another checkout's venv python runs that checkout),
`interpreter_args` before `-m` (e.g. `-m cProfile -o FILE`), `broker_args` after the
defaults, `env` over this process's environment. Its output goes to WORKDIR/broker.log
(log=False: nowhere). Ready once GET /readyz answers 200, which the broker does only once
its Kafka listener accepts. start() after stop() or kill() starts it again on the same
ports and data.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from straitmq.cli.local_cluster import free_port

from bench.kafka_ref import stop_process

HOST = "127.0.0.1"


class StraitRef:
    """A StraitMQ broker process on 127.0.0.1, as a context manager.

    workdir:          data/ and broker.log go there (None: a new temp dir, removed on stop
                      unless keep); also the process's working directory, so that `-m` never
                      picks up a `straitmq` folder of whatever checkout the caller runs in
    python:           the interpreter (another venv's python: that checkout's broker)
    broker_args:      after the defaults (--data-dir, --listen, --http, --log-level)
    interpreter_args: between the interpreter and `-m straitmq.broker`
    env:              over this process's environment
    log_level:        --log-level (None: the broker's default)
    log:              output into workdir/broker.log (False: discarded)
    preexec_fn:       run in the child before exec (e.g. a resource limit)
    port, http_port:  the Kafka and HTTP ports (None: free ones)
    """

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        python: str = sys.executable,
        broker_args: Sequence[str] = (),
        interpreter_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_level: str | None = "warning",
        log: bool = True,
        preexec_fn: Callable[[], None] | None = None,
        port: int | None = None,
        http_port: int | None = None,
        keep: bool = False,
    ) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else None
        self.keep = keep
        self.python = python
        self.broker_args = list(broker_args)
        self.interpreter_args = list(interpreter_args)
        self.env = dict(env) if env is not None else None
        self.log_level = log_level
        self.log_output = log
        self.preexec_fn = preexec_fn
        self.port = port or free_port()
        self.http_port = http_port or free_port()
        while self.http_port == self.port:
            self.http_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # -- info ---------------------------------------------------------------
    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def http(self) -> str:
        """The base URL of its HTTP API (/readyz, /metrics, /api/v1/...)."""
        return f"http://{HOST}:{self.http_port}"

    @property
    def log_path(self) -> Path | None:
        return self.workdir / "broker.log" if self.workdir is not None and self.log_output else None

    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the broker is not started")
        return self.proc.pid

    def pids(self) -> list[int]:
        """The broker's process, while it runs (none otherwise)."""
        return [self.proc.pid] if self.proc is not None and self.proc.poll() is None else []

    def command(self) -> list[str]:
        assert self.workdir is not None
        level = ["--log-level", self.log_level] if self.log_level is not None else []
        return [
            self.python,
            *self.interpreter_args,
            "-m",
            "straitmq.broker",
            "--data-dir",
            str(self.workdir / "data"),
            "--listen",
            self.bootstrap,
            "--http",
            f"{HOST}:{self.http_port}",
            *level,
            *self.broker_args,
        ]

    # -- lifecycle ----------------------------------------------------------
    def start(self, timeout: float = 60.0) -> float:
        """Start the broker and wait until it is ready; the seconds that took."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("the broker is already running")
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="strait-ref-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._close_log()
        out: IO[bytes] | int = subprocess.DEVNULL
        if self.log_path is not None:
            out = self._log = open(self.log_path, "ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.command(),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=self.workdir,
            env=None if self.env is None else {**os.environ, **self.env},
            preexec_fn=self.preexec_fn,
        )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - t0

    def wait_ready(self, timeout: float) -> None:
        """Until GET /readyz answers 200 (bounded; fails at once if the process exits)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        last = "no answer"
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the broker exited with code {self.proc.returncode}"
                    + (f" (see {self.log_path})" if self.log_path else "")
                )
            try:
                with urllib.request.urlopen(f"{self.http}/readyz", timeout=1) as r:
                    if r.status == 200:
                        return
                    last = f"HTTP {r.status}"
            except urllib.error.HTTPError as e:  # 503 while it starts
                last = f"HTTP {e.code}"
            except OSError as e:
                last = repr(e)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.bootstrap} not ready after {timeout:.0f}s ({last})")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL (a crash: the data stays for the next start())."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self._close_log()

    def stop(self, grace_s: float = 30) -> None:
        """SIGTERM, SIGKILL after `grace_s`; its temp dir removed if it made one."""
        stop_process(self.proc, grace_s)
        self._close_log()
        if self._own_workdir and not self.keep and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> StraitRef:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
