"""The aiohttp application: routes, the error middleware, start-up and shutdown, and run(),
which serves it."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

from aiohttp import http_exceptions, web

from sqlkit.errors import CourierError
from sqlkit.redaction import redact_shapes

from . import configs, messages, metrics, openapi, push, schedules, topics, verbs
from .auth import Authenticator
from .input import BODY_SECONDS, BODY_TIMEOUT, discard_body
from .problems import ApiError, from_courier_error
from .server import Server, role_pools
from .wakeups import TopicWakeups

log = logging.getLogger("courier.serve")

DEFAULT_MAX_BODY = 2 * 1024 * 1024
"""Largest request body (a 1 MiB payload, base64-encoded, with room to spare)."""

LINGER_SECONDS = 1.0
"""How long, at most, a connection answered before its body arrived (a 408, a 401, a 413) goes
on reading the rest so the client sees the answer, not a reset; never longer than
--client-timeout (aiohttp's default is 10 s more, past the timeout)."""


class Throttled:
    """A log of refusals that a client cannot flood: at most `burst` lines per `seconds`, and
    the first line after a pause says how many were not logged."""

    def __init__(self, logger: logging.Logger, burst: int = 10, seconds: float = 10.0) -> None:
        self._log, self._burst, self._seconds = logger, burst, seconds
        self._window, self._logged, self._held = 0.0, 0, 0

    def warning(self, message: str, **fields: Any) -> None:
        now = time.monotonic()
        if now - self._window >= self._seconds:
            self._window, self._logged = now, 0
        if self._logged >= self._burst:
            self._held += 1
            return
        self._logged += 1
        if self._held:
            fields["not_logged_before"], self._held = self._held, 0
        self._log.warning(message, extra=fields)


refusals = Throttled(log)
"""Requests refused before a handler ran (malformed) or for want of a token: one line each."""


def answer(error: ApiError) -> web.Response:
    """The JSON body of an ApiError, without anything in it shaped like a secret (a message
    may quote what the client sent)."""
    error.body = {key: redact_shapes(value) if isinstance(value, str) else value for key, value in error.body.items()}
    return error.response()


@web.middleware
async def answer_errors(request: web.Request, handler):  # type: ignore[no-untyped-def]
    """Every failure as a JSON body with its status; a stack trace only in the server's log."""
    try:
        return await handler(request)
    except ApiError as error:
        if error.status == 401:
            # Never the credentials: only whether there were any.
            refusals.warning("request refused", status=401, remote=request.remote, path=request.path,
                             reason="token refused" if "Authorization" in request.headers else "no token")
        return answer(error)
    except CourierError as error:
        problem = from_courier_error(error)
        if problem.status >= 500:
            log.error("request failed", extra={"path": request.path, "error": error.one_line()})
        return answer(problem)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        with contextlib.suppress(ApiError, ConnectionResetError):
            await discard_body(request)  # an unread corrupt compressed body would fail after the answer
        return answer(ApiError(error.status, error.reason.lower().replace(" ", "_"), error.reason))
    except asyncio.CancelledError:
        raise
    except ConnectionResetError:
        # The client went away (mid-body, say): there is no one to answer and nothing failed.
        log.debug("client gone", extra={"path": request.path})
        return web.Response(status=499)
    except Exception:
        log.exception("request failed", extra={"path": request.path})
        return answer(ApiError(500, "internal", "the request failed; the server's log says why"))


class Protocol(web.RequestHandler):
    """aiohttp's connection handler, answering what its HTTP parser refuses (an oversized or
    malformed header, not HTTP at all) as every other error is answered: JSON, and never an
    echo of the bytes sent, which may hold a token. aiohttp answers those in handle_error(),
    outside the application and its middlewares, in plain text quoting the raw header, and
    logs them with a traceback that quotes it too (aiohttp#3287 asks for a hook; there is
    none in 3.14), so this overrides handle_error()."""

    __slots__ = ()

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        problem = self._problem(status, exc)
        if problem.status >= 500:
            # A handler that failed past the middleware: the traceback, redacted by the log.
            log.error("request failed", exc_info=exc)
        else:
            refusals.warning("malformed request refused", status=problem.status, remote=request.remote,
                             problem=type(exc).__name__ if exc else "unknown")
        if request.writer.output_size > 0:  # a response is under way: cut the connection
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        response = answer(problem)
        response.force_close()
        return response

    def _problem(self, status: int, exc: BaseException | None) -> ApiError:
        if isinstance(exc, http_exceptions.LineTooLong):
            return ApiError(431, "header_too_large", f"a header, or the request line, is longer than "
                                                     f"{max(self.max_field_size, self.max_line_size)} bytes")
        if isinstance(exc, http_exceptions.BadStatusLine):
            return ApiError(400, "bad_request", "the request line is not HTTP/1.x")
        if isinstance(exc, http_exceptions.BadHttpMessage) and "header" in exc.message.lower():
            return ApiError(400, "bad_request", "the request's headers are malformed: each must be one line, "
                                                "a name, a colon and a value")
        if status < 500:
            return ApiError(status, "bad_request", "the request is malformed")
        if status == 504:
            return ApiError(504, "timeout", "the request took too long")
        return ApiError(500, "internal", "the request failed; the server's log says why")


class ProtocolServer(web.Server):
    """aiohttp's low-level server, making a Protocol per connection."""

    def __call__(self) -> web.RequestHandler:
        return Protocol(self, loop=self._loop, **self._kwargs)


class Runner(web.AppRunner):
    """web.AppRunner, but each connection is handled by a Protocol."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = ProtocolServer
        return server


class CannotListen(CourierError):
    """The address to serve on is taken, unknown or not ours."""


def run(app: web.Application, host: str, port: int, *, client_timeout: float, ssl_context: Any = None,
        shutdown_timeout: float = 30, serving: Callable[[], None] = lambda: None, reuse_port: bool = False) -> None:
    """Serve `app` on host:port until SIGTERM or SIGINT; requests in flight finish first (for up
    to shutdown_timeout). `serving` is called once the address is bound, and CannotListen is
    raised if it cannot be. With reuse_port, other processes may listen on the same address
    (SO_REUSEPORT: the kernel spreads new connections over them)."""
    asyncio.run(_run(app, host, port, client_timeout=client_timeout, ssl_context=ssl_context,
                     shutdown_timeout=shutdown_timeout, serving=serving, reuse_port=reuse_port))


async def _run(app: web.Application, host: str, port: int, *, client_timeout: float, ssl_context: Any,
               shutdown_timeout: float, serving: Callable[[], None], reuse_port: bool) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(number, stop.set)
    runner = Runner(app, handle_signals=False, access_log=None, shutdown_timeout=shutdown_timeout,
                    keepalive_timeout=client_timeout, lingering_time=min(LINGER_SECONDS, client_timeout))
    await runner.setup()
    try:
        if stop.is_set():  # stopped while the pools opened
            return
        try:
            await web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_port=reuse_port or None).start()
        except OSError as error:
            raise CannotListen(f"cannot listen on {_address(host, port)}: {_why(error)}",
                               hint="stop what serves there, or choose another --listen") from None
        serving()
        await stop.wait()
    finally:
        await runner.cleanup()
        # Stopping: a signal arriving while asyncio.run closes the loop would reach the loop's
        # self-pipe after it is closed, and Python prints "Exception ignored ... Bad file
        # descriptor" with a traceback. Another SIGTERM or SIGINT now changes nothing anyway.
        for number in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(number)
            signal.signal(number, signal.SIG_IGN)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _why(error: OSError) -> str:
    if isinstance(error, socket.gaierror):
        return f"cannot resolve the host ({error.strerror})"
    return {errno.EADDRINUSE: "the address is already in use",
            errno.EADDRNOTAVAIL: "no network interface here has that address",
            errno.EACCES: "permission denied (ports below 1024 need privileges)"}.get(
                error.errno, error.strerror or str(error))


routes = web.RouteTableDef()


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    """The process answers (no database call, no token)."""
    return web.json_response({"status": "ok"})


unready = Throttled(log, burst=1, seconds=60.0)
"""A load balancer probes every few seconds: one line a minute while the database is away."""


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    """Every role's pool lends a working connection and the schema is this Courier's (no token:
    for load balancers)."""
    ready, reason, detail = await Server.of(request).readiness()
    if not ready:
        if detail:  # anyone may call this: the database's address and the driver's words stay in the log
            unready.warning(f"not ready: {reason}", error=detail)
        return web.json_response({"status": "unavailable", "reason": reason}, status=503)
    return web.json_response({"status": "ready"})


def make_app(dsn: str, *, max_body: int = DEFAULT_MAX_BODY,
             client_timeout: float = BODY_SECONDS) -> web.Application:
    pools = role_pools(dsn)
    server = Server(pools, Authenticator(pools[None]), TopicWakeups(pools[None]))
    app = web.Application(client_max_size=max_body, middlewares=[answer_errors])
    app[Server.KEY] = server
    app[BODY_TIMEOUT] = client_timeout
    app.add_routes(routes)
    for module in (messages, topics, configs, push, verbs, schedules, metrics, openapi):
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
