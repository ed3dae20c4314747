"""Issue 42's verbs over HTTP, for admin tokens (as courier_admin): cancel a message by id or by
key, delete one by id without a lease, purge a topic's or endpoint's pending messages or its
DLQ, and pause or resume an endpoint or topic. Each is one call of a SQL function (cancel,
delete and purge those of functions/verbs.sql, which record the token's name in the event log
as on whose behalf)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from sqlkit import queries
from sqlkit.tokens import Token

from .auth import require
from .input import flag, message_id, text
from .problems import bad_request
from .routing import api, reply
from .server import Server

routes = web.RouteTableDef()


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
    if not archive and (dlq or name.endswith(".dlq")):
        # As the CLI refuses --dlq --no-archive: a DLQ's entries are deleted, never archived.
        raise bad_request("archive", "means nothing for a DLQ, whose purged entries are deleted (their messages "
                                     "stay in the archive as failed); leave it out")
    async with Server.of(request).session("admin") as conn:
        purged = await queries.fetch_value_async(conn, "purge_queue", {"endpoint": name, "dlq": dlq,
                                                                       "archive": archive, "actor": _actor(token)})
    return reply({"topic": name, "purged": purged, "dlq": dlq or name.endswith(".dlq"),
                  "archived": archive and not (dlq or name.endswith(".dlq"))})


async def _pause_or_resume(request: web.Request, token: Token, pause: bool) -> web.Response:
    require(token, "admin")
    name = request.match_info["name"]
    async with Server.of(request).session("admin") as conn:
        changed = await queries.fetch_value_async(conn, "pause_endpoint" if pause else "resume_endpoint",
                                                  {"name": name})
    return reply({"name": name, "paused": pause, "changed": changed})


@routes.post("/api/endpoints/{name}/pause")
@routes.post("/api/topics/{name}/pause")
@api()
async def pause(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Pause an endpoint or topic (River's pause): sends, enqueues and publishes are still
    accepted, up to max_depth, but nothing is claimed, dequeued or received until it is resumed;
    what is already claimed or leased finishes. `changed`: false when it was already paused."""
    return await _pause_or_resume(request, token, True)


@routes.post("/api/endpoints/{name}/resume")
@routes.post("/api/topics/{name}/resume")
@api()
async def resume(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Resume a paused endpoint or topic. `changed`: false when it was not paused."""
    return await _pause_or_resume(request, token, False)
