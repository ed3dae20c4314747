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
from .input import flag, integer
from .routing import api, reply
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


@routes.post("/api/metrics/history")
@api({"minutes": integer(1, 24 * 60), "per_endpoint": flag})
async def history(request: web.Request, token: Token, body: dict[str, Any]) -> web.Response:
    """The maintenance leader's samples of the last `minutes` (60 by default), oldest first, as
    `courier status --history` prints them: depth by status, and what was delivered, failed and
    dead-lettered since the sample before, with rates; `gap` marks a sample after a time no
    leader sampled (draw no line across it). With `per_endpoint`, each endpoint's samples.

    A POST, so that its two inputs are checked and documented as every other route's body is.
    Scoped as /metrics is: a token scoped to some topics sees only their per-endpoint samples,
    and no whole-queue ones."""
    require(token, "monitor")
    minutes = body.get("minutes") or 60
    async with Server.of(request).session("monitor") as conn:
        pull_topics = (None if token.topics_for("monitor") is None
                       else {row["topic"] for row in await queries.fetch_all_async(conn, "http_topics")})
        rows = await queries.fetch_all_async(conn, "metric_history", {
            "minutes": minutes, "per_endpoint": bool(body.get("per_endpoint"))})
    samples = [row for row in rows if _sample_in_scope(token, pull_topics, row["endpoint_name"])]
    return reply({"minutes": minutes, "samples": samples})


def _sample_in_scope(token: Token, pull_topics: set[str] | None, name: str | None) -> bool:
    if pull_topics is None:
        return True
    if name is None:  # the whole queue's: a sum over topics the token may not see
        return False
    return token.may("monitor", topic=name) if name in pull_topics else token.may("monitor", endpoint=name)


SCOPE_LABELS = ("endpoint", "topic")
"""The labels that name a pull topic or a push endpoint (one namespace: courier.endpoints)."""


def _in_scope(token: Token, pull_topics: set[str] | None, metric: Metric) -> bool:
    """Whether the token sees the series; pull_topics is None for a token that sees them all."""
    if pull_topics is None:
        return True
    names = [str(metric.labels[label]) for label in SCOPE_LABELS if label in metric.labels]
    return bool(names) and all(token.may("monitor", topic=name) if name in pull_topics
                               else token.may("monitor", endpoint=name) for name in names)
