"""The aiohttp application: routes, the error middleware, start-up and shutdown."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from sqlkit import migrate
from sqlkit.connection import connect
from sqlkit.errors import CourierError

from . import configs, messages, metrics, openapi, push, topics
from .auth import Authenticator
from .input import BODY_SECONDS, BODY_TIMEOUT
from .problems import ApiError, from_courier_error
from .server import Server, role_pools
from .wakeups import TopicWakeups

log = logging.getLogger("courier.serve")

DEFAULT_MAX_BODY = 2 * 1024 * 1024
"""Largest request body (a 1 MiB payload, base64-encoded, with room to spare)."""


@web.middleware
async def answer_errors(request: web.Request, handler):  # type: ignore[no-untyped-def]
    """Every failure as a JSON body with its status; a stack trace only in the server's log."""
    try:
        return await handler(request)
    except ApiError as error:
        return error.response()
    except CourierError as error:
        answer = from_courier_error(error)
        if answer.status >= 500:
            log.error("request failed", extra={"path": request.path, "error": error.one_line()})
        return answer.response()
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return ApiError(error.status, error.reason.lower().replace(" ", "_"), error.reason).response()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("request failed", extra={"path": request.path})
        return ApiError(500, "internal", "the request failed; the server's log says why").response()


routes = web.RouteTableDef()


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    """The process answers (no database call, no token)."""
    return web.json_response({"status": "ok"})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    """The database answers and its schema is this Courier's (no token: for load balancers)."""
    dsn = Server.of(request).dsn

    def check() -> bool:
        with connect(dsn, connect_timeout=5) as conn:
            return migrate.status(conn).up_to_date

    try:
        current = await asyncio.to_thread(check)
    except CourierError as error:
        return web.json_response({"status": "unavailable", "reason": error.one_line()}, status=503)
    if not current:
        return web.json_response({"status": "unavailable", "reason": "the schema needs `courier migrate`"},
                                 status=503)
    return web.json_response({"status": "ready"})


def make_app(dsn: str, *, max_body: int = DEFAULT_MAX_BODY,
             client_timeout: float = BODY_SECONDS) -> web.Application:
    pools = role_pools(dsn)
    server = Server(pools, Authenticator(pools[None]), TopicWakeups(pools[None]))
    app = web.Application(client_max_size=max_body, middlewares=[answer_errors])
    app[Server.KEY] = server
    app[BODY_TIMEOUT] = client_timeout
    app.add_routes(routes)
    for module in (messages, topics, configs, push, metrics, openapi):
        app.add_routes(module.routes)

    async def start(app: web.Application) -> None:
        await server.open()
        server.wakeups.start()

    async def stop_polls(app: web.Application) -> None:
        # Before the server waits for requests in flight: a long poll answers now, empty.
        server.closing = True
        await server.wakeups.stop()

    async def stop(app: web.Application) -> None:
        await server.close()

    app.on_startup.append(start)
    app.on_shutdown.append(stop_polls)
    app.on_cleanup.append(stop)
    return app
