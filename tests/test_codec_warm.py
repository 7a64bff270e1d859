"""The broker loads every served API version's schemas in a thread at start-up
(straitmq.protocol.codec.warm), so no first request of a version imports kio modules on
the event loop."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_warm_loads_every_version_so_a_first_request_imports_nothing() -> None:
    # A fresh interpreter: this one has imported schemas for other tests already.
    script = textwrap.dedent(
        """
        import struct, sys
        from straitmq.broker.api.versions import VERSIONS
        from straitmq.protocol import codec

        n = codec.warm({k: (v.min_version, v.max_version) for k, v in VERSIONS.items()})
        assert n == sum(v.max_version - v.min_version + 1 for v in VERSIONS.values()), n
        assert codec.request_schema.cache_info().currsize == n
        assert codec.response_schema.cache_info().currsize == n
        # A Metadata v0 request (the oldest a client may send; header v1, no topics) is
        # parsed and answered, importing nothing.
        frame = struct.pack(">hhih", 3, 0, 1, 1) + b"c" + struct.pack(">i", 0)
        before = set(sys.modules)
        codec.parse_request(memoryview(frame), 3, 0)
        codec.encode_response(3, 0, 1, codec.response_schema(3, 0)(brokers=(), topics=()))
        assert set(sys.modules) == before, sorted(set(sys.modules) - before)
        print("ok")
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
