"""GET /metrics: courier.metrics() in Prometheus text exposition, the families `courier
metrics --prometheus` prints, for a token that may monitor (read as courier_monitor)."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from console.prometheus import exposition
from sqlkit import queries
from sqlkit.observability import Metric
from sqlkit.tokens import Token

from .auth import require
from .routing import api
from .server import Server

routes = web.RouteTableDef()


@routes.get("/metrics")
@api()
async def metrics(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """Every gauge and counter of courier.metrics(), for a Prometheus scrape."""
    require(token, "monitor")
    async with Server.of(request).session("monitor") as conn:
        rows = await queries.fetch_all_async(conn, "metrics")
    text = exposition([Metric(**row) for row in rows])
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE_LATEST})
