"""What a request handler gets about its request, and what it may return.

A RequestContext holds the facts of one request (API, version, correlation id, client,
listener, connection security) and the authorizer that `allowed` asks; what a handler
works with (the metadata view, the replicas, the group coordinator...) it is given once
by the composition root (see dispatch.py), never through the context."""

from __future__ import annotations

from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from straitmq.security.acls import CLUSTER, CLUSTER_NAME, operations_bitfield

if TYPE_CHECKING:
    from straitmq.security.acls import Authorizer

    from ..security.sasl import ConnectionSecurity
    from ..storage.log import ReadSlice


@dataclass(slots=True)
class RequestContext:
    api_key: int
    version: int
    correlation_id: int
    client_id: str | None
    client_host: str
    # The listener the request came in on (Metadata answers with its endpoints) and the
    # connection's security state (principal, SASL exchange); None outside a connection.
    listener: str = ""
    security: ConnectionSecurity | None = None
    # The broker's authorizer (`allowed` asks it); None for an in-process caller.
    authorizer: Authorizer | None = None
    # The client's quota allowances (straitmq.broker.quotas: one per quota kind, None
    # where no quota applies), set by the listener when the cluster has client quotas.
    quotas: tuple | None = None

    def allowed(self, operation: int, resource_type: int, name: str) -> bool:
        """May this connection's principal do `operation` on the resource? Always yes
        with the authorizer off (one attribute read on the hot path)."""
        authorizer = self.authorizer
        if authorizer is None or not authorizer.enabled or self.security is None:
            return True  # no connection: an in-process caller, not a client
        return authorizer.authorize(
            self.security.principal, self.acl_host, operation, resource_type, name
        )

    @property
    def acl_host(self) -> str:
        # client_host is Kafka's "/1.2.3.4" form (JoinGroup shows it); bindings name the
        # bare address.
        return self.client_host.removeprefix("/")

    def cluster_allowed(self, operation: int) -> bool:
        return self.allowed(operation, CLUSTER, CLUSTER_NAME)

    def authorized_operations(self, resource_type: int, name: str) -> int:
        """The authorized_operations bitfield Describe* answers carry when asked."""
        return operations_bitfield(resource_type, lambda op: self.allowed(op, resource_type, name))


@dataclass(slots=True)
class RawResponse:
    """A response written piece by piece: bytes, then file ranges sent with sendfile."""

    pieces: list[bytes | ReadSlice] = field(default_factory=list)
    size: int = 0
    throttle_ms: int = 0  # a quota's throttle, written into the answer by the listener

    def add(self, piece: Any, size: int) -> None:
        self.pieces.append(piece)
        self.size += size


@dataclass(slots=True)
class Deferred:
    """An answer that is not ready yet: an acks=all Produce waiting for its in-sync
    replicas. The listener may read and append the connection's next Produce meanwhile
    (its answers still go out in request order), so a producer's pipelined batches
    replicate together instead of one replication round trip each."""

    answer: Coroutine[Any, Any, Any]
