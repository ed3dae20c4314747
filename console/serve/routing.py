"""What every API route does first: authenticate the caller and check the JSON body where it
enters. A handler declares its body's fields once, with @api; /api/openapi.json is made from
the same declarations, so the document cannot drift from what the routes accept."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from sqlkit.tokens import Token

from .input import Check, discard_body, json_object
from .server import Server


def reply(data: Any, status: int = 200) -> web.Response:
    """A JSON answer, made with orjson (datetimes as ISO 8601): the hot routes' bodies."""
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


Handler = Callable[[web.Request, Token, dict[str, Any]], Awaitable[web.StreamResponse]]


def api(fields: dict[str, Check] | None = None, required: tuple[str, ...] = (),
        ok: int = 200) -> Callable[[Handler], Callable[[web.Request], Awaitable[web.StreamResponse]]]:
    """The handler is called with the request's live token (else a 401) and its body checked
    against `fields` (else a 400 naming the field; None: the route takes no body). `ok` is the
    status of its success, for the document."""
    def wrap(handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        @functools.wraps(handler)
        async def route(request: web.Request) -> web.StreamResponse:
            token = await Server.of(request).auth.token(request)
            if fields is None:
                await discard_body(request)  # a corrupt compressed body is a 400 here, not a traceback later
            body = await json_object(request, fields, required) if fields is not None else {}
            return await handler(request, token, body)

        route.api = {"fields": fields, "required": required, "ok": ok}  # type: ignore[attr-defined]
        return route
    return wrap
