"""Issue 42's verbs over HTTP, for admin tokens (as courier_admin): cancel a message by id or by
key, delete one by id without a lease, and purge a topic's or endpoint's pending messages or
its DLQ. Each is one call of the SQL function of functions/verbs.sql, which records the token's
name in the event log as on whose behalf."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from sqlkit import queries
from sqlkit.tokens import Token

from .auth import require
from .input import described, message_id, text
from .problems import bad_request
from .routing import api, reply
from .server import Server

routes = web.RouteTableDef()


@described({"type": "boolean"})
def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise bad_request(name, "must be true or false")
    return value


def _actor(token: Token) -> str:
    return f"http:{token.name}"  # not "token:", which the redaction rule reads as a secret


def _cancelled(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": str(row["id"]), "endpoint": row["endpoint_name"], "was": row["was"], "result": "cancelled"}


@routes.post("/api/messages/{id}/cancel")
@api()
async def cancel(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Cancel a pending, scheduled or processing message: it leaves the queue for the archive as
    cancelled, and a delivery under way has its outcome discarded. `was`: its state before."""
    require(token, "admin")
    async with Server.of(request).session("admin") as conn:
        (row,) = await queries.fetch_all_async(conn, "cancel_message",
                                               {"id": message_id(request), "actor": _actor(token)})
    return reply(_cancelled(row))


@routes.post("/api/messages/cancel")
@api({"endpoint": text(), "key": text(255)}, required=("endpoint", "key"))
async def cancel_by_key(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Cancel the active message of an endpoint or topic whose idempotency key or pull key is `key`."""
    require(token, "admin")
    async with Server.of(request).session("admin") as conn:
        rows = await queries.fetch_all_async(conn, "cancel_message_by_key",
                                             {"endpoint": body["endpoint"], "key": body["key"],
                                              "actor": _actor(token)})
    return reply({"cancelled": [_cancelled(row) for row in rows]})


@routes.delete("/api/messages/{id}")
@api()
async def delete(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Delete a message outright, without a lease, in any state but processing (nothing is
    archived; the event log keeps the deletion). `was`: its state before."""
    require(token, "admin")
    ident = message_id(request)
    async with Server.of(request).session("admin") as conn:
        was = await queries.fetch_value_async(conn, "delete_message", {"id": ident, "actor": _actor(token)})
    return reply({"id": str(ident), "was": was, "result": "deleted"})


@routes.post("/api/topics/{name}/purge")
@api({"dlq": flag, "archive": flag})
async def purge(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Remove every pending message of a topic or push endpoint (never one in processing), to the
    archive as purged unless `archive` is false; with `dlq` (or a name ending in .dlq), its DLQ's
    failed entries instead. `purged`: how many."""
    require(token, "admin")
    name = request.match_info["name"]
    dlq = bool(body["dlq"])
    archive = body["archive"] is not False
    async with Server.of(request).session("admin") as conn:
        purged = await queries.fetch_value_async(conn, "purge_queue", {"endpoint": name, "dlq": dlq,
                                                                       "archive": archive, "actor": _actor(token)})
    return reply({"topic": name, "purged": purged, "dlq": dlq or name.endswith(".dlq"),
                  "archived": archive and not (dlq or name.endswith(".dlq"))})
