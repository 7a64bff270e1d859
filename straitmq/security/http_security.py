"""The broker's HTTP API secured: TLS, who is calling, and what the ACLs let them do.

Settings (StraitMQ's names, beside Kafka's in `--properties`/`--override`):
  http.ssl.keystore.location    PEM file with the key and certificate chain: the HTTP
                                port speaks https (nothing else) when set
  http.ssl.key.password         the key's password, if it is encrypted
  http.ssl.truststore.location  CAs client certificates must chain to; also the CAs the
                                other brokers' HTTP certificates are checked against
                                when this broker calls them (default: ssl.truststore.location,
                                then the system's)
  http.ssl.client.auth          none (default) | requested | required
  http.ssl.reload.interval.ms   how often rotated files are picked up (default 10000)
  http.authentication           none (default: the API is open, as before) or a comma
                                list of: basic (HTTP Basic against the SCRAM users of the
                                metadata log and the PLAIN users of the JAAS configs),
                                mtls (the client certificate's subject, as the Kafka
                                listener maps it; needs http.ssl.client.auth)
  http.metrics.require.authentication  false (default): /metrics stays open
  controller.http.ssl.enabled   (brokers) the controllers' HTTP ports speak https: the
                                broker's calls to them (registration, heartbeats, the
                                metadata log, its session stream) go over https with the
                                identity it shows its peers

A controller process takes the same http.* settings (and super.users, authorizer.class.name,
ssl.endpoint.identification.algorithm) from its own --properties/--override: its port
speaks https, asks brokers and the other controllers for a certificate or Basic
credentials of a SCRAM user, and calls the other voters with its own certificate.

With authentication on, every request but /healthz and /readyz (and /metrics unless
required) carries a principal, and the broker's authorizer (authorizer.class.name, the
same ACLs as the Kafka listener) decides per route what Kafka decides for the equivalent
Kafka API (see `required`). A missing or wrong credential is a 401 with
`WWW-Authenticate`; a missing permission a 403 naming it.

Brokers call each other's HTTP API (a produce forwarded to a leader, lag, reassignment
progress) with their inter-broker identity: the HTTP certificate as a client certificate,
and the inter-broker listener's SASL user as Basic credentials. That principal needs to
be a super user or hold CLUSTER_ACTION on the cluster, as for replication.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import secrets
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from aiohttp import web

from straitmq.admin_client import AdminAuth

from .acls import (
    ALTER,
    ALTER_CONFIGS,
    CLUSTER,
    CLUSTER_ACTION,
    CLUSTER_NAME,
    CREATE,
    DELETE,
    DESCRIBE,
    DESCRIBE_CONFIGS,
    GROUP,
    READ,
    TOPIC,
    WRITE,
    Authorizer,
)
from .scram import MECHANISMS, keys_from_salted_password, salted_password
from .settings import default
from .tls import CLIENT_AUTH, TlsConfigError, TlsListener, TlsSettings, principal_from_cert

if TYPE_CHECKING:
    from straitmq.protocol.client import ClientSecurity

log = logging.getLogger("straitmq.security")


class _PlainUsers(Protocol):
    @property
    def plain_users(self) -> dict[str, str]: ...


class KafkaListener(Protocol):
    """What the HTTP port takes from a broker's Kafka listener
    (straitmq.broker.security.listeners.Listener): its PLAIN users, which Basic accepts
    too, and its client side, whose SASL user this node shows its peers. Declared here so
    the ground floor does not import the broker."""

    @property
    def sasl(self) -> _PlainUsers | None: ...

    @property
    def client(self) -> ClientSecurity | None: ...


METHODS = ("basic", "mtls")
OPEN_PATHS = frozenset({"/healthz", "/readyz"})  # the kubelet's probes: never closed
CACHE_TTL_S = 60.0  # a checked Basic credential is trusted this long (no PBKDF2 per request)
MAX_CACHED = 10_000
REALM = 'Basic realm="StraitMQ", charset="UTF-8"'
_OP_NAMES = {
    READ: "READ",
    WRITE: "WRITE",
    CREATE: "CREATE",
    DELETE: "DELETE",
    ALTER: "ALTER",
    DESCRIBE: "DESCRIBE",
    CLUSTER_ACTION: "CLUSTER_ACTION",
    DESCRIBE_CONFIGS: "DESCRIBE_CONFIGS",
    ALTER_CONFIGS: "ALTER_CONFIGS",
}
_TYPE_NAMES = {TOPIC: "TOPIC", GROUP: "GROUP", CLUSTER: "CLUSTER"}
PRINCIPAL = "straitmq.principal"  # request key: who is calling (absent: authentication off)


class HttpSecurityError(ValueError):
    """HTTP security settings that cannot work; the message says which."""


def _tls_settings(props: dict[str, str]) -> TlsSettings | None:
    """The http.ssl.* settings as a TlsSettings (None: plain HTTP)."""
    keystore = props.get("http.ssl.keystore.location")
    auth = (props.get("http.ssl.client.auth") or default("http.ssl.client.auth")).strip().lower()
    if auth not in CLIENT_AUTH:
        raise HttpSecurityError(f"http.ssl.client.auth {auth!r}: one of none, requested, required")
    if not keystore:
        others = sorted(k for k in props if k.startswith("http.ssl."))
        if others:
            raise HttpSecurityError(
                f"{', '.join(others)} without http.ssl.keystore.location: set it to the PEM "
                "file holding the HTTP port's private key and certificate chain"
            )
        return None
    truststore = props.get("http.ssl.truststore.location")
    if auth != "none" and not truststore:
        raise HttpSecurityError(
            f"http.ssl.client.auth={auth} needs http.ssl.truststore.location "
            "(the CAs client certificates are checked against)"
        )
    return TlsSettings(
        "HTTP",
        keystore,
        props.get("http.ssl.key.password"),
        truststore,
        auth,
        int(props.get("http.ssl.reload.interval.ms") or default("http.ssl.reload.interval.ms")),
    )


@dataclass(frozen=True, slots=True)
class Denied:
    status: int  # 401 or 403
    message: str


class HttpSecurity:
    """TLS, authentication and authorization of one broker's HTTP port."""

    def __init__(
        self,
        props: dict[str, str],
        authorizer: Authorizer,
        scram_lookup: Callable[[str], dict[str, dict] | None],
        listeners: Sequence[KafkaListener],
    ) -> None:
        settings = _tls_settings(props)
        try:
            self.tls = TlsListener(settings) if settings is not None else None
        except TlsConfigError as e:
            raise HttpSecurityError(str(e).replace("listener HTTP", "HTTP port")) from None
        raw = (props.get("http.authentication") or default("http.authentication")).strip().lower()
        methods = tuple(m.strip() for m in raw.split(",") if m.strip() and m.strip() != "none")
        for m in methods:
            if m not in METHODS:
                raise HttpSecurityError(
                    f"http.authentication {m!r}: none, or a comma list of {', '.join(METHODS)}"
                )
        if "mtls" in methods and (settings is None or settings.client_auth == "none"):
            raise HttpSecurityError(
                "http.authentication=mtls needs TLS with client certificates: set "
                "http.ssl.keystore.location, http.ssl.truststore.location and "
                "http.ssl.client.auth=required (or requested)"
            )
        self.methods = methods
        metrics = (
            props.get(
                "http.metrics.require.authentication",
                default("http.metrics.require.authentication"),
            )
            .strip()
            .lower()
        )
        if metrics not in ("true", "false"):
            raise HttpSecurityError("http.metrics.require.authentication: true or false")
        self.metrics_open = metrics == "false"
        self.authorizer = authorizer
        self._scram = scram_lookup  # user -> {mechanism: stored credential}
        self._plain: dict[str, str] = {}
        for ln in listeners:
            if ln.sasl is not None:
                self._plain.update(ln.sasl.plain_users)
        self._cache: dict[bytes, tuple[str, float, tuple]] = {}
        self._cache_key = secrets.token_bytes(32)
        controllers = (
            props.get("controller.http.ssl.enabled", default("controller.http.ssl.enabled"))
            .strip()
            .lower()
        )
        if controllers not in ("true", "false"):
            raise HttpSecurityError("controller.http.ssl.enabled: true or false")
        # How a broker reaches the controller processes (a controller reaches the other
        # voters with its own port's scheme: they share their settings).
        self.controller_scheme = "https" if controllers == "true" else "http"
        self.client = self._peer_auth(
            props,
            listeners,
            settings,
            "basic" in methods,
            settings is not None or controllers == "true",
        )
        if authorizer.enabled and not methods:
            log.warning(
                "the authorizer is on but the HTTP API is not authenticated: anyone who "
                "reaches the HTTP port may administer the cluster; set http.authentication"
            )

    @property
    def enabled(self) -> bool:
        return bool(self.methods)

    async def watch(self) -> None:
        """Pick up rotated certificate files: the served certificate (new connections) and
        the one shown to peers and controllers (their next connections)."""
        tls = self.tls
        if tls is None:
            return
        interval = max(tls.settings.reload_interval_ms, 50) / 1000
        while True:
            await asyncio.sleep(interval)
            if tls.check():
                self.reload_client()

    def reload_client(self) -> None:
        ctx = self.client.ssl_context if self.client is not None else None
        settings = self.tls.settings if self.tls is not None else None
        if ctx is None or settings is None:
            return
        try:  # replaces the certificate and key the context shows from now on
            ctx.load_cert_chain(settings.keystore, password=settings.key_password)
        except (OSError, ssl.SSLError) as e:
            log.warning(
                "rotated HTTP certificate does not load as a client certificate; "
                "keeping the previous one",
                extra={"reason": str(e)},
            )

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    # -- the calls this broker makes to its peers -----------------------------------

    @staticmethod
    def _peer_auth(
        props: dict[str, str],
        listeners: Sequence[KafkaListener],
        settings: TlsSettings | None,
        basic: bool,
        tls: bool,
    ) -> AdminAuth | None:
        """How this node calls its peers and the controllers: its HTTP certificate as a
        client certificate, its inter-broker SASL user as Basic credentials."""
        username = password = None
        inter = listeners[0].client if listeners else None
        if basic and inter is not None and inter.sasl is not None:
            username, password = inter.sasl.username, inter.sasl.password
        if not tls:
            return AdminAuth(username=username, password=password) if username else None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = (
            props.get(
                "ssl.endpoint.identification.algorithm",
                default("ssl.endpoint.identification.algorithm"),
            )
            != ""
        )
        ctx.verify_mode = ssl.CERT_REQUIRED
        ca = props.get("http.ssl.truststore.location") or props.get("ssl.truststore.location")
        try:
            if ca:
                ctx.load_verify_locations(cafile=ca)
            else:
                ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
            if settings is not None:
                ctx.load_cert_chain(settings.keystore, password=settings.key_password)
        except (OSError, ssl.SSLError) as e:
            raise HttpSecurityError(f"HTTP port: cannot load TLS files for peer calls: {e}") from e
        # With an https port, the password goes over https only (never to a plain
        # controller); a plain port's peers are plain too.
        return AdminAuth(
            ssl_context=ctx,
            username=username,
            password=password,
            basic_over_http=settings is None,
        )

    # -- authentication -------------------------------------------------------------

    async def authenticate(self, request: web.Request) -> str | Denied:
        if "mtls" in self.methods:
            peercert = request.transport.get_extra_info("peercert") if request.transport else None
            principal = principal_from_cert(peercert)
            if principal is not None:
                return principal
        header = request.headers.get("Authorization")
        if "basic" in self.methods and header is not None:
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "basic":
                return Denied(401, f"authentication scheme {scheme!r} is not accepted: use Basic")
            try:
                user, sep, password = (
                    base64.b64decode(token.strip(), validate=True).decode().partition(":")
                )
            except (binascii.Error, UnicodeDecodeError):
                return Denied(401, "malformed Basic credentials (base64 of user:password)")
            if not sep or not user:
                return Denied(401, "malformed Basic credentials (base64 of user:password)")
            if await self.check_password(user, password):
                return f"User:{user}"
            log.info("HTTP authentication failed", extra={"user": user, "remote": request.remote})
            return Denied(401, f"authentication failed for user {user!r}: wrong user or password")
        wanted = " or ".join(
            {"basic": "HTTP Basic credentials", "mtls": "a client certificate"}[m]
            for m in self.methods
        )
        return Denied(401, f"authentication required: send {wanted}")

    def _fingerprint(self, user: str) -> tuple:
        """What a cached success depends on: the user's current credentials. A changed or
        deleted credential no longer matches, so the cache never outlives it."""
        creds = self._scram(user) or {}
        scram = sorted((m, c["stored_key"]) for m, c in creds.items())
        return (*scram, ("PLAIN", self._plain.get(user)))

    async def check_password(self, user: str, password: str) -> bool:
        key = hmac.digest(self._cache_key, f"{user}\0{password}".encode(), "sha256")
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[1] > now and hit[2] == self._fingerprint(user):
            return True
        fingerprint = self._fingerprint(user)
        ok = await asyncio.to_thread(self._verify, user, password)
        if ok:
            if len(self._cache) >= MAX_CACHED:
                self._cache = {}
            self._cache[key] = (user, now + CACHE_TTL_S, fingerprint)
        return ok

    def _verify(self, user: str, password: str) -> bool:
        """The password against the user's SCRAM credentials (salted with the stored salt
        and iterations, compared as StoredKey) or PLAIN password; constant time."""
        plain = self._plain.get(user)
        if plain is not None and hmac.compare_digest(plain.encode(), password.encode()):
            return True
        creds = self._scram(user) or {}
        ok = False
        for mechanism, cred in sorted(creds.items()):
            if mechanism not in MECHANISMS:
                continue
            salted = salted_password(
                mechanism, password, base64.b64decode(cred["salt"]), int(cred["iterations"])
            )
            stored_key, _ = keys_from_salted_password(mechanism, salted)
            ok |= hmac.compare_digest(stored_key, base64.b64decode(cred["stored_key"]))
        if not creds:  # an unknown user costs as much as a known one
            hashlib.pbkdf2_hmac("sha512", password.encode(), b"straitmq-no-such-user", 4096)
        return ok

    # -- authorization --------------------------------------------------------------

    def permitted(self, request: web.Request, operation: int, rtype: int, name: str) -> bool:
        principal = request.get(PRINCIPAL)
        if principal is None:  # authentication off: the API is open, as before
            return True
        return self.authorizer.authorize(principal, request.remote or "", operation, rtype, name)

    async def required(self, request: web.Request) -> str | None:
        """What the route needs that the principal lacks (a sentence), or None. Each route
        asks what Kafka asks for its Kafka API; brokers calling each other (CLUSTER_ACTION)
        may read topics and reassignment progress and forward produces."""
        method = request.method
        route = request.match_info.route.resource
        path = route.canonical if route is not None else request.path

        def need(op: int, rtype: int, name: str, *alternatives: tuple[int, int, str]) -> str | None:
            for o, t, n in ((op, rtype, name), *alternatives):
                if self.permitted(request, o, t, n):
                    return None
            return _missing(request[PRINCIPAL], op, rtype, name, alternatives)

        broker_call = (CLUSTER_ACTION, CLUSTER, CLUSTER_NAME)
        name = request.match_info.get("name", "")
        if path in ("/raft", "/controller/session", "/controller/{op}"):
            return need(CLUSTER_ACTION, CLUSTER, CLUSTER_NAME)
        if path == "/api/v1/topics":
            if method == "GET":
                return None  # the handler lists only the topics the principal may DESCRIBE
            body = await _json_body(request)
            topic = body.get("name") if isinstance(body.get("name"), str) else None
            if topic is None:
                return need(CREATE, CLUSTER, CLUSTER_NAME)
            return need(CREATE, CLUSTER, CLUSTER_NAME, (CREATE, TOPIC, topic))
        if path == "/api/v1/topics/{name}":
            if method == "GET":
                return need(DESCRIBE, TOPIC, name, broker_call)
            if method == "DELETE":
                return need(DELETE, TOPIC, name)
            body = await _json_body(request)
            if "partitions" in body and (missing := need(ALTER, TOPIC, name)):
                return missing
            if "configs" in body:
                return need(ALTER_CONFIGS, TOPIC, name)
            return need(DESCRIBE, TOPIC, name)
        if path == "/api/v1/topics/{name}/records":
            return need(WRITE, TOPIC, name, broker_call)
        if path == "/api/v1/topics/{name}/partitions/{partition}/records":
            if missing := need(READ, TOPIC, name):
                return missing
            group = request.query.get("group")
            return need(READ, GROUP, group) if group else None
        if path == "/api/v1/groups":
            return None  # the handler lists only the groups the principal may DESCRIBE
        if path == "/api/v1/groups/{group}":
            group = request.match_info["group"]
            return need(DELETE if method == "DELETE" else DESCRIBE, GROUP, group)
        if path == "/api/v1/cluster/configs":
            op = DESCRIBE_CONFIGS if method == "GET" else ALTER_CONFIGS
            return need(op, CLUSTER, CLUSTER_NAME)
        if path in ("/api/v1/cluster", "/api/v1/quorum", "/metrics", "/api/v1/clients"):
            return need(DESCRIBE, CLUSTER, CLUSTER_NAME, broker_call)
        if path == "/api/v1/reassignments":
            if method == "GET":
                return need(DESCRIBE, CLUSTER, CLUSTER_NAME, broker_call)
            return need(ALTER, CLUSTER, CLUSTER_NAME)
        if path == "/api/v1/elect-preferred":
            return need(ALTER, CLUSTER, CLUSTER_NAME)
        if path == "/api/v1/quotas":  # as Describe/AlterClientQuotas
            op = DESCRIBE_CONFIGS if method == "GET" else ALTER_CONFIGS
            return need(op, CLUSTER, CLUSTER_NAME)
        if path in ("/api/v1/users", "/api/v1/users/{name}", "/api/v1/acls"):
            # As Describe/AlterUserScramCredentials and Describe/Create/DeleteAcls.
            return need(DESCRIBE if method == "GET" else ALTER, CLUSTER, CLUSTER_NAME)
        # A route not listed here: only for the cluster's own (a new route must be added
        # above to be reachable by anyone else).
        return need(ALTER, CLUSTER, CLUSTER_NAME, broker_call)

    # -- the middleware -------------------------------------------------------------

    def middleware(self) -> Any:
        @web.middleware
        async def secure(request: web.Request, handler: Any) -> web.StreamResponse:
            path = request.path
            if path in OPEN_PATHS or (path == "/metrics" and self.metrics_open):
                return await handler(request)
            who = await self.authenticate(request)
            if isinstance(who, Denied):
                return _refusal(who, self.methods)
            request[PRINCIPAL] = who
            if request.match_info.http_exception is not None:
                return await handler(request)  # 404/405 as usual, once authenticated
            missing = await self.required(request)
            if missing is not None:
                log.info(
                    "HTTP request denied",
                    extra={"principal": who, "path": path, "missing": missing},
                )
                return _refusal(Denied(403, missing), self.methods)
            return await handler(request)

        return secure


def with_scheme(voters: dict[int, str], scheme: str) -> dict[int, str]:
    """The voters' URLs (parse_voters gives http://) with `scheme`."""
    return {n: f"{scheme}://{url.partition('://')[2]}" for n, url in voters.items()}


async def _json_body(request: web.Request) -> dict:
    """The JSON body (aiohttp keeps it for the handler), {} if it is not an object."""
    try:
        body = orjson.loads(await request.read() or b"{}")
    except orjson.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


def _missing(
    principal: str, op: int, rtype: int, name: str, alternatives: tuple[tuple[int, int, str], ...]
) -> str:
    def one(o: int, t: int, n: str) -> str:
        return f"{_OP_NAMES.get(o, o)} on {_TYPE_NAMES.get(t, t)} '{n}'"

    wanted = " or ".join(one(*x) for x in ((op, rtype, name), *alternatives))
    return f"{principal} is not authorized: this needs an ACL allowing {wanted}"


def _refusal(denied: Denied, methods: tuple[str, ...]) -> web.Response:
    resp = web.Response(
        body=orjson.dumps({"error": denied.message}),
        status=denied.status,
        content_type="application/json",
    )
    if denied.status == 401:
        # RFC 9110: a 401 names a scheme; with certificates only there is none to retry
        # with, so the client is told what to send in the message.
        resp.headers["WWW-Authenticate"] = (
            REALM if "basic" in methods else 'Certificate realm="StraitMQ"'
        )
    return resp
