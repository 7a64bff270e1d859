"""The first request of each API version has its schemas loaded in a thread
(straitmq.protocol.codec.load, called by the connection before parsing), so no request
imports kio modules on the event loop, and a broker start loads only what clients use."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_load_builds_a_version_so_its_requests_import_nothing() -> None:
    # A fresh interpreter: this one has imported schemas for other tests already.
    script = textwrap.dedent(
        """
        import struct, sys
        from straitmq.protocol import codec

        assert (3, 0) not in codec.LOADED
        codec.load(3, 0)
        assert (3, 0) in codec.LOADED and (3, 1) not in codec.LOADED
        # A Metadata v0 request (the oldest a client may send; header v1, no topics) is
        # parsed and answered, importing nothing.
        frame = struct.pack(">hhih", 3, 0, 1, 1) + b"c" + struct.pack(">i", 0)
        before = set(sys.modules)
        codec.parse_request(memoryview(frame), 3, 0)
        codec.encode_response(3, 0, 1, codec.response_schema(3, 0)(brokers=(), topics=()))
        assert set(sys.modules) == before, sorted(set(sys.modules) - before)
        # Another version is a module of its own: what the connection loads off the loop.
        codec.load(3, 12)
        assert len(set(sys.modules) - before) > 0
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
