"""Broker sessions on the active controller: which broker to fence, and when.

Sans-IO: the controller feeds it registrations, heartbeats, session streams opening and
closing, the answers of connection probes and the time; it answers which brokers to probe
and which to fence. A broker is fenced in one of two ways:

- **Its death is visible.** Each broker holds a session stream (a WebSocket) open to the
  active controller. When it closes, the controller asks the broker's HTTP port for
  /healthz; a refused connection (or one reset before any answer: a dying process's
  kernel closes its sockets one by one and may accept for a moment) means the broker's
  host answers but nothing serves there: the process is gone, and it is fenced at once.
  This only counts for a broker whose port was seen answering while it lived (a probe
  when its stream opened): a broker advertising an address the controller cannot
  connect to is never fenced by a refusal.
  A new active controller probes every broker once, since one that died with the old
  controller has no stream left to close; a refusal counts there if no stream and no
  heartbeat came from the broker within `GRACE_S`, as every running broker reconnects.
- **Silence.** No heartbeat for the session timeout. This is the only way a frozen, slow
  or cut-off broker is fenced: its kernel keeps its sockets and listening port, so a
  probe connects (or, cut off, times out) and proves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

GRACE_S = 1.0  # for a running broker to reconnect its stream to a new active controller


@dataclass(slots=True)
class _Session:
    incarnation: str
    deadline: float
    streams: int = 0  # session streams open from this incarnation
    armed: bool = False  # its port was seen answering: a refusal means it is gone
    unheard: bool = False  # from a new controller's reset, not heard from since


class BrokerSessions:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._s: dict[int, _Session] = {}

    def reset(self, brokers: dict[int, str], now: float) -> list[int]:
        """A new active controller: a fresh session for every broker, and all to probe."""
        self._s = {
            b: _Session(inc, now + self.timeout_s, unheard=True) for b, inc in brokers.items()
        }
        return sorted(self._s)

    def touch(self, bid: int, incarnation: str, now: float) -> None:
        """A registration or heartbeat from this incarnation: its session goes on."""
        s = self._s.get(bid)
        if s is None or s.incarnation != incarnation:
            s = self._s[bid] = _Session(incarnation, 0.0)
        s.deadline = now + self.timeout_s
        s.unheard = False

    def armed(self) -> list[int]:
        """Brokers whose death this controller would see at once: a session stream is
        open and their port was seen answering."""
        return sorted(b for b, s in self._s.items() if s.streams > 0 and s.armed)

    def live(self, bid: int, now: float) -> bool:
        s = self._s.get(bid)
        return s is not None and s.deadline > now

    def stream_opened(self, bid: int, incarnation: str) -> bool | None:
        """None: not the registered incarnation (the stream is refused). True: probe it
        now to arm the fast path; False: nothing to do."""
        s = self._s.get(bid)
        if s is None or s.incarnation != incarnation:
            return None
        s.streams += 1
        s.unheard = False
        return not s.armed

    def stream_closed(self, bid: int, incarnation: str) -> bool:
        """True: probe the broker now, its last stream is gone."""
        s = self._s.get(bid)
        if s is None or s.incarnation != incarnation:
            return False
        s.streams = max(0, s.streams - 1)
        return s.streams == 0 and s.armed

    def probe_connected(self, bid: int, incarnation: str) -> None:
        s = self._s.get(bid)
        if s is not None and s.incarnation == incarnation:
            s.armed = True

    def probe_refused(self, bid: int, incarnation: str) -> bool:
        """A probe found nothing listening. True: fence it now.

        Only with no stream open from it (a running broker keeps or reopens one), and
        only if its port was seen answering before, or (after a reset) if it has not been
        heard from at all: ask again after `GRACE_S` then.
        """
        s = self._s.get(bid)
        return (
            s is not None
            and s.incarnation == incarnation
            and s.streams == 0
            and (s.armed or s.unheard)
        )

    def needs_grace(self, bid: int) -> bool:
        s = self._s.get(bid)
        return s is not None and not s.armed

    def expired(self, now: float) -> list[int]:
        return sorted(b for b, s in self._s.items() if s.deadline <= now)

    def next_deadline(self) -> float | None:
        return min((s.deadline for s in self._s.values()), default=None)
