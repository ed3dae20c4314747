"""GET /metrics: courier.metrics() in Prometheus text exposition, the families `courier
metrics --prometheus` prints, for a token that may monitor (read as courier_monitor), and this
server's own long polls; a token scoped to some topics sees only theirs."""

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
    """Every gauge and counter of courier.metrics() in the token's scope, for a Prometheus scrape.

    A token for every topic (`--topics '*'`, or admin) sees every series, as `courier metrics
    --prometheus` prints them. A scoped token sees the series labelled with a name it is scoped
    to (a pull topic among its topics, a push endpoint among its endpoints), and none of the
    series without such a label (the total depth by status, the oldest message's age, stale
    reports, workers, the maintenance leader, archive partitions, this server's long polls):
    those sum over or describe every topic, so even a count would tell a token for `orders`
    how busy the topics it may not see are."""
    require(token, "monitor")
    server = Server.of(request)
    async with server.session("monitor") as conn:
        pull_topics = (None if token.topics_for("monitor") is None
                       else {row["topic"] for row in await queries.fetch_all_async(conn, "http_topics")})
        rows = await queries.fetch_all_async(conn, "metrics")
    this_server = [Metric("serve_long_polls_waiting", server.wakeups.waiting, {}, "gauge"),
                   Metric("serve_long_polls_woken_total", server.wakeups.woken_total, {}, "counter")]
    shown = [metric for metric in [Metric(**row) for row in rows] + this_server
             if _in_scope(token, pull_topics, metric)]
    return web.Response(body=exposition(shown).encode(), headers={"Content-Type": CONTENT_TYPE_LATEST})


SCOPE_LABELS = ("endpoint", "topic")
"""The labels that name a pull topic or a push endpoint (one namespace: courier.endpoints)."""


def _in_scope(token: Token, pull_topics: set[str] | None, metric: Metric) -> bool:
    """Whether the token sees the series; pull_topics is None for a token that sees them all."""
    if pull_topics is None:
        return True
    names = [str(metric.labels[label]) for label in SCOPE_LABELS if label in metric.labels]
    return bool(names) and all(token.may("monitor", topic=name) if name in pull_topics
                               else token.may("monitor", endpoint=name) for name in names)
