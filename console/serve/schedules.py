"""Periodic schedules over HTTP (issue 42, item 1): list them (a monitor token, within its scope,
as courier_monitor reads list_schedules(): no payload), and for admin tokens read one whole with
the message its ticks send and its next runs, create or replace one, pause, resume and drop one.
Each is a call of a SQL function of functions/schedules.sql, which checks what it is given and
names the field it refuses."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from aiohttp import web
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from sqlkit import exact_json, queries
from sqlkit.errors import translated
from sqlkit.exact_json import read_exactly
from sqlkit.schedules import Schedule
from sqlkit.tokens import Token

from .auth import require
from .input import described, flag, header_map, integer, json_map, text
from .problems import ApiError, bad_request
from .routing import api, reply
from .server import Server

routes = web.RouteTableDef()


def choice(*allowed: str):
    @described({"type": "string", "enum": list(allowed)})
    def check(name: str, value: Any) -> str:
        if value not in allowed:
            raise bad_request(name, f"must be one of {', '.join(allowed)}")
        return value
    return check


@described({"description": "any JSON value but null; {} when left out"})
def any_json(name: str, value: Any) -> Any:
    return value


SCHEDULE = {"name": text(128), "cron": text(255), "endpoint": text(), "payload": any_json, "time_zone": text(64),
            "headers": header_map, "metadata": json_map, "priority": integer(0, 10), "ordering_key": text(255),
            "catch_up": choice("skip", "all"), "catch_up_limit": integer(1, 10_000),
            "grace_seconds": integer(1, 86_400), "description": text(1000), "replace": flag}
"""courier.create_schedule()'s arguments; `endpoint` is the push endpoint or pull topic each tick
sends to. The SQL function checks the rest (the name's form, the cron expression, the time
zone) and names the field it refuses."""


def _shown(s: Schedule) -> dict[str, Any]:
    return {**dataclasses.asdict(s), "state": s.state}


def _visible(token: Token, s: Schedule) -> bool:
    """A scoped monitor token sees the schedules of the topics and endpoints it is scoped to."""
    if s.protocol == "pull":
        return token.may("monitor", topic=s.endpoint_name)
    return token.may("monitor", endpoint=s.endpoint_name)


async def _list(conn) -> list[Schedule]:
    return [Schedule(**row) for row in await queries.fetch_all_async(conn, "list_schedules")]


async def _one(conn, name: str) -> Schedule:
    for s in await _list(conn):
        if s.name == name:
            return s
    raise ApiError(404, "not_found", f'schedule "{name}" does not exist', field="name")


@routes.get("/api/schedules")
@api()
async def list_schedules(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Every schedule the token may monitor, by name: its state (running, paused, late or
    failing), cron and time zone, target, next run, last tick, ticks sent and skipped, and last
    error; never the message its ticks send."""
    require(token, "monitor")
    async with Server.of(request).session("monitor") as conn:
        found = await _list(conn)
    return reply({"schedules": [_shown(s) for s in found if _visible(token, s)]})


@routes.get("/api/schedules/{name}")
@api()
async def get_schedule(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """One schedule whole: what the list shows, the message each tick sends (payload, headers,
    metadata, priority, ordering key) and its next five runs (none while paused)."""
    require(token, "admin")
    name = request.match_info["name"]
    async with Server.of(request).session("admin") as conn:
        found = await _one(conn, name)
        async with conn.cursor(row_factory=dict_row) as cur:
            read_exactly(cur)  # the payload as stored: no number rounded, none too big to write
            with translated():
                await cur.execute(queries.query("schedule_message"), {"name": name})
                message = await cur.fetchone()
        runs = [] if found.paused else [row["at"] for row in await queries.fetch_all_async(
            conn, "cron_next_runs", {"cron": found.cron, "time_zone": found.time_zone, "count": 5, "after": None})]
    if message is None:  # dropped between the two reads
        raise ApiError(404, "not_found", f'schedule "{name}" does not exist', field="name")
    data = {**_shown(found), "message": message, "next_runs": runs}
    return web.Response(text=exact_json.dumps_like(data, default=_iso), content_type="application/json")


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


@routes.post("/api/schedules")
@api(SCHEDULE, required=("name", "cron", "endpoint"), ok=201)
async def create_schedule(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Create a schedule: on every tick of `cron` (five fields, or @hourly, @daily, @weekly,
    @monthly, @yearly), read in `time_zone` (IANA, default UTC), send `payload` to `endpoint`, a
    push endpoint or pull topic. With `replace`, change the schedule of that name instead. The
    schedule as the list shows it."""
    require(token, "admin")
    params = {
        "name": body["name"], "cron": body["cron"], "endpoint": body["endpoint"],
        "payload": exact_json.jsonb({} if body["payload"] is None else body["payload"]),
        "time_zone": body["time_zone"] or "UTC",
        "headers": Jsonb(body["headers"]) if body["headers"] is not None else None,
        "metadata": exact_json.jsonb(body["metadata"]) if body["metadata"] is not None else None,
        "priority": body["priority"] or 0, "ordering_key": body["ordering_key"],
        "catch_up": body["catch_up"] or "skip", "catch_up_limit": body["catch_up_limit"] or 100,
        "grace_seconds": body["grace_seconds"] or 600, "description": body["description"],
        "replace": bool(body["replace"])}
    async with Server.of(request).session("admin") as conn:
        await queries.fetch_value_async(conn, "create_schedule", params)
        found = await _one(conn, body["name"])
    return reply(_shown(found), status=201)


async def _pause_or_resume(request: web.Request, token: Token, pause: bool) -> web.Response:
    require(token, "admin")
    name = request.match_info["name"]
    async with Server.of(request).session("admin") as conn:
        changed = await queries.fetch_value_async(conn, "pause_schedule" if pause else "resume_schedule",
                                                  {"name": name})
        found = await _one(conn, name)
    return reply({"name": name, "paused": pause, "changed": changed, "state": found.state,
                  "next_run_at": None if found.paused else found.next_run_at})


@routes.post("/api/schedules/{name}/pause")
@api()
async def pause_schedule(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Pause a schedule: no tick is sent until it is resumed, and the ticks meanwhile are not made
    up. `changed`: false when it was paused already."""
    return await _pause_or_resume(request, token, True)


@routes.post("/api/schedules/{name}/resume")
@api()
async def resume_schedule(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Resume a paused schedule from its next tick after now. `changed`: false when it was not paused."""
    return await _pause_or_resume(request, token, False)


@routes.delete("/api/schedules/{name}")
@api()
async def drop_schedule(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Drop a schedule; the messages its ticks sent stay."""
    require(token, "admin")
    name = request.match_info["name"]
    async with Server.of(request).session("admin") as conn:
        await queries.fetch_value_async(conn, "drop_schedule", {"name": name, "if_exists": False})
    return reply({"name": name, "dropped": True})
