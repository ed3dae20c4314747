"""The push side over HTTP, for producers that cannot call SQL: a message to a push endpoint
with ulak's send options (courier.send_with_options), and an event published to its
subscribers (courier.publish). Both as courier_application; a token is scoped to the push
endpoints it may send to, and to the event types (in its topics) it may publish."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

from aiohttp import web
from psycopg.types.json import Jsonb

from sqlkit import exact_json, queries
from sqlkit.tokens import Token

from .auth import require
from .input import described, flag, header_map, integer, json_map, text, timestamp
from .problems import ApiError, bad_request
from .routing import api
from .server import Server

routes = web.RouteTableDef()


@described({"description": "any JSON value but null"})
def any_json(name: str, value: Any) -> Any:
    """A JSON payload: any JSON value but null (already parsed)."""
    return value


@described({"type": "string", "format": "uuid"})
def uuid_text(name: str, value: Any) -> uuid.UUID:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return uuid.UUID(value)
    raise bad_request(name, "must be a UUID, e.g. 0f8fad5b-d9cb-469f-a165-70867728950e")


SEND = {"payload": any_json, "priority": integer(0, 10), "ordering_key": text(255), "idempotency_key": text(255),
        "scheduled_at": timestamp, "expires_at": timestamp, "correlation_id": uuid_text, "headers": header_map,
        "metadata": json_map, "max_retries": integer(0, 1000), "unique_by_payload": flag,
        "unique_period_seconds": integer(1, 31_536_000)}
PUBLISH = {"payload": any_json, "idempotency_key": text(255), "correlation_id": uuid_text}


@routes.post("/api/endpoints/{name}/messages")
@api(SEND, required=("payload",), ok=201)
async def send(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Queue a message for delivery to the push endpoint; its id (a retried idempotency key: the
    first message's id)."""
    server = Server.of(request)
    endpoint = request.match_info["name"]
    require(token, "enqueue", endpoint=endpoint)
    params = {**body, "endpoint": endpoint, "payload": exact_json.jsonb(body["payload"]),
              "priority": body["priority"] or 0, "headers": _jsonb(body["headers"]),
              "metadata": _jsonb(body["metadata"]), "topics": token.topics_for("enqueue"),
              "unique_by_payload": bool(body["unique_by_payload"])}
    if all(body[name] is None for name in SEND if name != "payload"):  # a plain send: written with others
        new_id = await server.sends.send(params)
    else:
        async with server.session("application") as conn:
            new_id = await queries.fetch_value_async(conn, "send_to_endpoint", params)
    if new_id is None:  # a pull topic (it takes sends, for priorities and ordering keys) outside the token's topics
        raise ApiError(403, "forbidden", f"token {token.name!r} may not enqueue on topic {endpoint!r}")
    return web.json_response({"id": str(new_id)}, status=201)


@routes.post("/api/events/{type}")
@api(PUBLISH, required=("payload",), ok=201)
async def publish(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Publish an event: one message per matching subscription; how many."""
    server = Server.of(request)
    event_type = request.match_info["type"]
    require(token, "publish", topic=event_type)
    params = {**body, "event_type": event_type, "payload": exact_json.jsonb(body["payload"])}
    async with server.session("application") as conn:
        fanned_out = await queries.fetch_value_async(conn, "publish_event", params)
    return web.json_response({"event_type": event_type, "messages": fanned_out}, status=201)


def _jsonb(value: dict[str, Any] | None) -> Jsonb | None:
    return exact_json.jsonb(value) if value is not None else None
