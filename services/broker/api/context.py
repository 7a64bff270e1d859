"""What a request handler gets, and what it may return."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..broker import Broker
    from ..security.sasl import ConnectionSecurity
    from ..storage.log import ReadSlice


@dataclass(slots=True)
class RequestContext:
    broker: Broker
    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    client_host: str
    # The listener the request came in on (Metadata answers with its endpoints) and the
    # connection's security state (principal, SASL exchange); None outside a connection.
    listener: str = ""
    security: ConnectionSecurity | None = None


@dataclass(slots=True)
class RawResponse:
    """A response written piece by piece: bytes, then file ranges sent with sendfile."""

    pieces: list[bytes | ReadSlice] = field(default_factory=list)
    size: int = 0

    def add(self, piece: Any, size: int) -> None:
        self.pieces.append(piece)
        self.size += size
