"""GET /metrics: courier.metrics() in Prometheus text exposition, the families `courier
metrics --prometheus` prints, for a token that may monitor (read as courier_monitor), and this
server's own long polls."""

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
    server = Server.of(request)
    async with server.session("monitor") as conn:
        rows = await queries.fetch_all_async(conn, "metrics")
    this_server = [Metric("serve_long_polls_waiting", server.wakeups.waiting, {}, "gauge"),
                   Metric("serve_long_polls_woken_total", server.wakeups.woken_total, {}, "counter")]
    text = exposition([Metric(**row) for row in rows] + this_server)
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE_LATEST})
