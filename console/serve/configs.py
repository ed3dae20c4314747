"""queue-ti's topic configs and reapers, for admins: a topic's own limits read, replaced
(PUT: a field left out or null reverts to the global default, as queue-ti) and cleared, and
the expiry and delete reapers run on demand. All as courier_admin."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from psycopg.types.json import Jsonb

from sqlkit import queries
from sqlkit.tokens import Token

from .auth import require
from .input import integer, number
from .problems import ApiError
from .routing import api
from .server import Server

routes = web.RouteTableDef()

LIMITS = {"max_retries": integer(0, 1000), "message_ttl_seconds": integer(0, 31_536_000),
          "max_depth": integer(0, 2_147_483_647), "throughput_limit": number(0, 1_000_000),
          "dlq_threshold": integer(0, 1000), "visibility_timeout": integer(1, 43_200)}
"""Each limit a topic may set (sqlkit.pull.TOPIC_LIMITS), with the range
courier.validate_endpoint_config() takes."""
OWN_SETTINGS = {"delay_seconds": integer(0, 900)}
"""A topic's settings with no global default behind them: delay_seconds (SQS delay queues),
absent or null meaning none."""

REAPER_BATCH = 10_000
REAPER_BATCHES = 100
"""One request reaps at most a million messages; a client calls again for the rest."""


@routes.get("/api/topic-configs")
@api()
async def list_configs(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Every topic's own limits (null: the global default)."""
    server = Server.of(request)
    require(token, "admin")
    async with server.session("admin") as conn:
        rows = await queries.fetch_all_async(conn, "topic_config", {"topic": None})
    return web.json_response({"topic_configs": [_config(row["topic"], row["config"]) for row in rows]})


@routes.get("/api/topic-configs/{topic}")
@api()
async def get_config(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """The topic's own limits (null: the global default)."""
    server = Server.of(request)
    require(token, "admin")
    topic = request.match_info["topic"]
    async with server.session("admin") as conn:
        rows = await queries.fetch_all_async(conn, "topic_config", {"topic": topic})
    if not rows:
        raise ApiError(404, "not_found", f"topic {topic!r} does not exist")
    return web.json_response(_config(topic, rows[0]["config"]))


@routes.put("/api/topic-configs/{topic}")
@api(LIMITS | OWN_SETTINGS)
async def put_config(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Replace the topic's limits and delay_seconds: each field given is set, each left out or null
    reverts to the default (none, for delay_seconds)."""
    require(token, "admin")
    return await _alter(Server.of(request), request.match_info["topic"], body)


@routes.delete("/api/topic-configs/{topic}")
@api()
async def delete_config(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Every limit of the topic back to the global default."""
    require(token, "admin")
    return await _alter(Server.of(request), request.match_info["topic"], dict.fromkeys(LIMITS | OWN_SETTINGS))


async def _alter(server: Server, topic: str, changes: dict[str, Any]) -> web.Response:
    async with server.session("admin") as conn:
        config = await queries.fetch_value_async(conn, "alter_topic", {"topic": topic, "changes": Jsonb(changes)})
    return web.json_response(_config(topic, config))


def _config(topic: str, config: dict[str, Any]) -> dict[str, Any]:
    return {"topic": topic, **{name: config.get(name) for name in LIMITS | OWN_SETTINGS}}


@routes.post("/api/admin/expiry-reaper/run")
@api()
async def run_expiry_reaper(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Mark every message whose TTL has passed as expired now; how many."""
    require(token, "admin")
    return web.json_response({"expired": await _reap(Server.of(request), "run_expiry_reaper")})


@routes.post("/api/admin/delete-reaper/run")
@api()
async def run_delete_reaper(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Delete every expired pull message now; how many."""
    require(token, "admin")
    return web.json_response({"deleted": await _reap(Server.of(request), "run_delete_reaper")})


async def _reap(server: Server, query: str) -> int:
    """Batch after batch, each its own transaction, so locks are held for one batch only."""
    total = 0
    for _ in range(REAPER_BATCHES):
        async with server.session("admin") as conn:
            done = await queries.fetch_value_async(conn, query, {"batch_size": REAPER_BATCH})
        total += done
        if done < REAPER_BATCH:
            break
    return total
