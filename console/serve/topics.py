"""Topics and the dead-letter queue over HTTP: each topic's depth by status, oldest deadline,
DLQ and limits (read as courier_monitor, and only the topics the token is scoped to), and
requeue of a `<topic>.dlq` message (admin, as courier_admin, as the SQL API allows)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from aiohttp import web

from sqlkit import queries
from sqlkit.tokens import Token

from .auth import require
from .input import message_id
from .problems import ApiError
from .routing import api
from .server import Server

routes = web.RouteTableDef()


@routes.get("/api/topics")
@api()
async def list_topics(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """The topics the token may use, each with its depth by status, DLQ and limits."""
    server = Server.of(request)
    async with server.session("monitor") as conn:
        rows = await queries.fetch_all_async(conn, "http_topics")
    return web.json_response({"topics": [_topic(row) for row in rows if _sees(token, row["topic"])]})


@routes.get("/api/topics/{topic}")
@api()
async def one_topic(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """One topic's depth by status, oldest visibility deadline, DLQ and limits."""
    server = Server.of(request)
    name = request.match_info["topic"]
    if not _sees(token, name):
        raise ApiError(403, "forbidden", f"token {token.name!r} is not scoped to topic {name!r}")
    async with server.session("monitor") as conn:
        rows = await queries.fetch_all_async(conn, "http_topics")
    found = [row for row in rows if row["topic"] == name]
    if not found:
        raise ApiError(404, "not_found", f"topic {name!r} does not exist")
    return web.json_response(_topic(found[0]))


@routes.post("/api/messages/{id}/requeue")
@api()
async def requeue(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """A `<topic>.dlq` message (its DLQ id) back on its topic, retries restored: admin only."""
    server = Server.of(request)
    require(token, "admin")
    async with server.session("admin") as conn:
        new_id = await queries.fetch_value_async(conn, "requeue_dead_letter", {"id": message_id(request)})
    return web.json_response({"id": str(new_id)})


def _sees(token: Token, topic: str) -> bool:
    """A token sees the topics it may enqueue to, consume from or monitor."""
    return any(token.may(action, topic=topic) for action in ("enqueue", "consume", "monitor"))


def _topic(row: dict[str, Any]) -> dict[str, Any]:
    return {key: _plain(value) for key, value in row.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value
