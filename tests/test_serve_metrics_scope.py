"""GET /metrics within the token's scope (issue 40, item 6): a monitor token scoped to topic
`orders` sees only the series of `orders`, never another topic's or endpoint's name or counts,
nor the series that sum over every topic; a token for every topic sees them all. A real server
process on loopback and the test's own database."""
# ruff: noqa: F811  (the `server` and `orders` fixtures come from test_serve, by import)

from __future__ import annotations

import asyncio
import json

import aiohttp
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sqlkit import tokens
from tests.test_serve import orders, server  # noqa: F401

GLOBAL = {"courier_queue_depth", "courier_oldest_message_age_seconds", "courier_stale_reports",
          "courier_workers_alive", "courier_maintenance_leader_present", "courier_archive_partitions",
          "courier_serve_long_polls_waiting", "courier_serve_long_polls_woken"}


def scrape(base: str, secret: str) -> tuple[str, dict[str, list[tuple[dict[str, str], float]]]]:
    """The exposition, and its samples by family: (labels, value) each."""
    async def get() -> str:
        async with aiohttp.ClientSession() as session, session.get(
                base + "/metrics", headers={"Authorization": f"Bearer {secret}"}) as response:
            assert response.status == 200
            return await response.text()
    text = asyncio.run(get())
    return text, {family.name: [(sample.labels, sample.value) for sample in family.samples]
                  for family in text_string_to_metric_families(text)}


def names_in(families: dict[str, list[tuple[dict[str, str], float]]]) -> set[str]:
    return {labels["endpoint"] for samples in families.values() for labels, _ in samples if "endpoint" in labels}


def test_a_token_scoped_to_a_topic_sees_only_that_topics_series(server, conn: psycopg.Connection, orders):
    conn.execute("SELECT courier.create_endpoint('invoices', 'pull', '{}')")
    conn.execute("SELECT courier.create_endpoint('billing', 'http', %s::jsonb)",
                 (json.dumps({"url": "http://127.0.0.1:9/hook", "allow_internal": True}),))
    conn.execute("SELECT courier.enqueue('orders', '{}')")
    for _ in range(3):
        conn.execute("SELECT courier.enqueue('invoices', '{}')")
    conn.execute("SELECT courier.send('billing', '{}')")

    scoped = tokens.create_token(conn, "orders-monitor", topics=["orders"], endpoints=[], actions=["monitor"])
    text, families = scrape(server, scoped)
    assert names_in(families) == {"orders"}
    assert "invoices" not in text and "billing" not in text
    assert not GLOBAL & set(families), "series over every topic tell of the others"
    assert ({"endpoint": "orders", "status": "pending"}, 1.0) in families["courier_queue_depth_by_endpoint"]
    assert {labels["endpoint"] for labels, _ in families["courier_messages_delivered"]} == {"orders"}

    # A push endpoint is scoped by the token's endpoints, not its topics.
    pusher = tokens.create_token(conn, "billing-monitor", topics=[], endpoints=["billing"], actions=["monitor"])
    assert names_in(scrape(server, pusher)[1]) == {"billing"}
    named_as_topic = tokens.create_token(conn, "mislabelled", topics=["billing"], endpoints=[], actions=["monitor"])
    assert scrape(server, named_as_topic)[0] == ""

    # Every topic, or admin: everything, as `courier metrics --prometheus` prints it.
    for secret in (tokens.create_token(conn, "prometheus", topics=["*"], endpoints=[], actions=["monitor"]),
                   tokens.create_token(conn, "root", topics=[], endpoints=[], actions=["admin"])):
        _, everything = scrape(server, secret)
        assert names_in(everything) == {"orders", "invoices", "billing"}
        assert set(everything) >= GLOBAL
        assert ({"status": "pending"}, 5.0) in everything["courier_queue_depth"]


def test_the_history_of_samples_over_http_is_scoped_like_metrics(server, conn: psycopg.Connection, orders):
    """POST /api/metrics/history (issue 41, item 4): what the leader sampled, as `courier status
    --history` shows it; a token scoped to `orders` sees only its per-endpoint samples."""
    from tests.test_metric_samples import sample_at
    from tests.test_serve import call, token

    conn.execute("SELECT courier.create_endpoint('payroll', 'pull', '{}')")
    conn.execute("SELECT courier.enqueue('orders', '{\"n\": 1}')")
    for seconds_ago in (30, 20, 10):
        sample_at(conn, seconds_ago)
    everything = token(conn, "ops", ["monitor"])
    status, body, _ = call(server, "POST", "/api/metrics/history", everything, {"minutes": 5})
    assert status == 200 and body["minutes"] == 5
    assert [s["endpoint_name"] for s in body["samples"]] == [None, None, None]
    assert body["samples"][-1]["pending"] == 1 and body["samples"][-1]["seconds"] == pytest.approx(10, abs=1)
    status, body, _ = call(server, "POST", "/api/metrics/history", everything, {"per_endpoint": True})
    assert {s["endpoint_name"] for s in body["samples"]} == {"orders", "payroll"}

    scoped = token(conn, "orders-watch", ["monitor"], ["orders"])
    status, body, _ = call(server, "POST", "/api/metrics/history", scoped, {"per_endpoint": True})
    assert status == 200 and {s["endpoint_name"] for s in body["samples"]} == {"orders"}
    status, body, _ = call(server, "POST", "/api/metrics/history", scoped, {})
    assert status == 200 and body["samples"] == []  # the whole queue's sums over topics it may not see
    status, body, _ = call(server, "POST", "/api/metrics/history", everything, {"minutes": 0})
    assert status == 400 and body.get("field") == "minutes"
    producer = token(conn, "producer", ["enqueue"])
    assert call(server, "POST", "/api/metrics/history", producer, {})[0] == 403
