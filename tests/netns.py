"""Network namespaces for partition tests: one namespace per broker, joined by a bridge.

    root namespace: bridge <pfx>br with 10.X.0.1/24 (the controllers bind there, and the
                    test's own clients reach every broker through it)
    namespace <pfx>n<i>: veth <pfx>v<i>n = 10.X.0.(10 + i)/24, its peer <pfx>v<i>h
                    plugged into the bridge

`isolate(i)` takes the bridge side of broker i's veth down: from then on nothing crosses
(packets are dropped, no resets, like a cut cable), so its clients, its followers and the
controllers stop hearing from it and it stops hearing from them. `heal(i)` plugs it back.
Needs root and iproute2 (`ip netns`, veth, bridge); no firewall.
"""

from __future__ import annotations

import os
import shutil
import subprocess


def unavailable() -> str | None:
    """None when namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's `ip`, which is not on PATH"
    name = f"smqp{os.getpid() % 100000}"
    r = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add {name}` failed: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def require_available() -> None:
    """For tests: fail loudly when namespaces cannot be made (CI runs as root with
    iproute2 and must not skip silently), or skip when STRAITMQ_NETNS_OPTIONAL=1."""
    import pytest

    reason = unavailable()
    if reason:
        if os.environ.get("STRAITMQ_NETNS_OPTIONAL") == "1":
            pytest.skip(reason)
        pytest.fail(f"{reason} (STRAITMQ_NETNS_OPTIONAL=1 skips instead)", pytrace=False)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


class BrokerNetwork:
    def __init__(self, brokers: int) -> None:
        tag = os.getpid() % 10000
        self.pfx = f"smq{tag}"  # interface names stay under 15 characters
        self.subnet = self._free_subnet(tag)
        self.brokers = brokers
        self.bridge = f"{self.pfx}br"
        self.gateway = f"10.{self.subnet}.0.1"

    @staticmethod
    def _free_subnet(tag: int) -> int:
        used = _ip("-4", "addr", "show").stdout
        for k in range(256):
            x = (tag + k) % 200 + 50
            if f" 10.{x}." not in used:
                return x
        raise RuntimeError("no free 10.X.0.0/24 subnet")

    def ns(self, i: int) -> str:
        return f"{self.pfx}n{i}"

    def host(self, i: int) -> str:
        return f"10.{self.subnet}.0.{10 + i}"

    def prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.ns(i)]

    def setup(self) -> None:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i in range(1, self.brokers + 1):
                ns, h, n = self.ns(i), f"{self.pfx}v{i}h", f"{self.pfx}v{i}n"
                _ip("netns", "add", ns)
                _ip("link", "add", h, "type", "veth", "peer", "name", n)
                _ip("link", "set", n, "netns", ns)
                _ip("link", "set", h, "master", self.bridge)
                _ip("link", "set", h, "up")
                _ip("-n", ns, "addr", "add", f"{self.host(i)}/24", "dev", n)
                _ip("-n", ns, "link", "set", n, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except Exception:
            self.teardown()
            raise

    def isolate(self, i: int) -> None:
        _ip("link", "set", f"{self.pfx}v{i}h", "down")

    def heal(self, i: int) -> None:
        _ip("link", "set", f"{self.pfx}v{i}h", "up")

    def teardown(self) -> None:
        for i in range(1, self.brokers + 1):
            _ip("netns", "del", self.ns(i), check=False)
            _ip("link", "del", f"{self.pfx}v{i}h", check=False)
        _ip("link", "del", self.bridge, check=False)
