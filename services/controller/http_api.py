"""The controller's HTTP endpoints: Raft RPC, controller RPCs and quorum status.

`add_routes` mounts them on any aiohttp app, so a combined node serves them beside the
broker's API on one port. `owner.quorum` and `owner.active` are read per request: a
combined node creates them after its HTTP port is bound.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from aiohttp import web
from kio.schema.errors import ErrorCode

from .active import handlers
from .errors import ControllerError, NotController

log = logging.getLogger("straitmq.controller")


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def add_routes(app: web.Application, owner: Any) -> None:
    async def raft(request: web.Request) -> web.Response:
        quorum = owner.quorum
        try:
            body = orjson.loads(await request.read())
            reply = await quorum.handle_request(body)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            return _json({"error": f"bad raft message: {e}"}, 400)
        if reply is None:
            return web.Response(status=204)
        return _json(reply)

    async def rpc(request: web.Request) -> web.Response:
        op = request.match_info["op"]
        quorum, active = owner.quorum, owner.active
        if active is None:
            return _json(
                {"error_code": ErrorCode.not_controller, "message": "not a controller"}, 404
            )
        handler = handlers(active).get(op)
        if handler is None:
            return _json(
                {"error_code": ErrorCode.invalid_request, "message": f"no such call {op}"}, 404
            )
        try:
            body = orjson.loads(await request.read() or b"{}")
            if not isinstance(body, dict):
                raise TypeError("the body must be a JSON object")
            return _json(await handler(body))
        except NotController as e:
            url = quorum.voters.get(e.leader_id) if e.leader_id is not None else None
            return _json(
                {
                    "error_code": e.code,
                    "message": e.message,
                    "leader_id": e.leader_id,
                    "leader_url": url,
                },
                409,
            )
        except ControllerError as e:
            return _json({"error_code": e.code, "message": e.message}, 400)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            return _json(
                {"error_code": ErrorCode.invalid_request, "message": f"bad request: {e}"}, 400
            )

    async def session(request: web.Request) -> web.StreamResponse:
        """A broker's session stream: open while the broker lives; its close is news.

        The broker sends nothing and the controller nothing; the controller closes it when
        it stops being active. See `sessions.py`.
        """
        active = owner.active
        try:
            bid = int(request.query["id"])
            incarnation = request.query["incarnation"]
        except (KeyError, ValueError):
            return _json(
                {"error_code": ErrorCode.invalid_request, "message": "needs ?id=&incarnation="},
                400,
            )
        if active is None:
            return _json(
                {"error_code": ErrorCode.not_controller, "message": "not a controller"}, 404
            )
        ws = web.WebSocketResponse(heartbeat=None, autoping=True)
        try:
            active.stream_opened(bid, incarnation, ws)
        except NotController as e:
            return _json(
                {"error_code": e.code, "message": e.message, "leader_id": e.leader_id}, 409
            )
        except ControllerError as e:
            return _json({"error_code": e.code, "message": e.message}, 400)
        try:
            await ws.prepare(request)
            async for _ in ws:
                pass  # nothing is expected; a message is ignored
        finally:
            active.stream_closed(bid, incarnation, ws)
        return ws

    async def quorum_status(request: web.Request) -> web.Response:
        quorum, active = owner.quorum, owner.active
        st = quorum.status()
        st["active_controller"] = active is not None and active.active
        st["cluster_id"] = quorum.image.cluster_id
        if st["active_controller"]:
            st["fast_fencing_armed"] = active.sessions.armed()
        return _json(st)

    app.router.add_post("/raft", raft)
    app.router.add_get("/controller/session", session)
    app.router.add_post("/controller/{op}", rpc)
    app.router.add_get("/api/v1/quorum", quorum_status)
