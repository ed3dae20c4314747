"""Issue 42, item 6: a pause that keeps accepting (River's pause). A paused endpoint or topic
takes sends, batches, enqueues and publishes (up to max_depth), while no worker claims and no
consumer dequeues or receives; what is already claimed or leased finishes. Resume delivers the
rest. Against a real database, through SQL, a running pool, the CLI, HTTP and the console."""
# ruff: noqa: F811  (the `server` and `orders` fixtures come from test_serve, by import)

from __future__ import annotations

import psycopg
import pytest

from console.app.widgets.live_table import LiveTable
from tests.console_driver import open_pane, run_console, wait_for
from tests.helpers import claim, complete, scalar
from tests.test_cli import run
from tests.test_serve import b64, call, orders, server, token  # noqa: F401
from tests.workers import run_pool_until


def pending(conn, name: str) -> int:
    return scalar(conn, "SELECT coalesce(sum(d.messages), 0) FROM courier.queue_depth d "
                        "JOIN courier.endpoints e ON e.id = d.endpoint_id WHERE e.name = %s AND d.status = 'pending'",
                  (name,))


def paused_at(conn, name: str):
    return scalar(conn, "SELECT paused_at FROM courier.endpoints WHERE name = %s", (name,))


def test_pause_and_resume_are_idempotent_and_logged(conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop')")
    assert paused_at(conn, "hook") is None
    assert scalar(conn, "SELECT courier.pause_endpoint('hook')") is True
    assert paused_at(conn, "hook") is not None
    assert scalar(conn, "SELECT courier.pause_endpoint('hook')") is False
    assert scalar(conn, "SELECT courier.resume_endpoint('hook')") is True
    assert scalar(conn, "SELECT courier.resume_endpoint('hook')") is False
    assert paused_at(conn, "hook") is None
    events = conn.execute("SELECT event_type, details ->> 'name' FROM courier.event_log "
                          "WHERE event_type LIKE 'endpoint.%' ORDER BY id").fetchall()
    assert [e for e in events if e[0] in ("endpoint.paused", "endpoint.resumed")] == [
        ("endpoint.paused", "hook"), ("endpoint.resumed", "hook")]
    with pytest.raises(psycopg.errors.NoDataFound):
        conn.execute("SELECT courier.pause_endpoint('nowhere')")


def test_a_paused_endpoint_accepts_every_kind_of_send_and_claims_nothing(conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop')")
    conn.execute("SELECT courier.create_endpoint('other', 'noop')")
    conn.execute("SELECT courier.create_event_type('order.placed')")
    conn.execute("SELECT courier.subscribe('order.placed', 'hook')")
    conn.execute("SELECT courier.pause_endpoint('hook')")
    conn.execute("SELECT courier.send('hook', '{\"n\": 1}')")
    conn.execute("SELECT courier.send_with_options('hook', '{\"n\": 2}', p_priority := 9)")
    conn.execute("SELECT courier.send_batch('hook', ARRAY['{\"n\": 3}', '{\"n\": 4}']::jsonb[])")
    conn.execute("SELECT courier.publish('order.placed', '{\"n\": 5}')")
    conn.execute("SELECT courier.send('other', '{}')")
    assert pending(conn, "hook") == 5

    assert [row[1] for row in claim(conn, 100)] == [{}]  # only the other endpoint's
    hook = scalar(conn, "SELECT id FROM courier.endpoints WHERE name = 'hook'")
    assert conn.execute("SELECT * FROM courier.claim_batch('w', 100, %s)", (hook,)).fetchall() == []
    assert pending(conn, "hook") == 5

    conn.execute("SELECT courier.resume_endpoint('hook')")
    assert len(conn.execute("SELECT * FROM courier.claim_batch('w', 100, %s)", (hook,)).fetchall()) == 5


def test_a_claim_made_before_the_pause_finishes_normally(conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop')")
    ids = [scalar(conn, "SELECT courier.send('hook', '{}')") for _ in range(2)]
    claimed = [row[0] for row in claim(conn, 1)]
    conn.execute("SELECT courier.pause_endpoint('hook')")
    assert complete(conn, claimed)  # the report goes through
    assert scalar(conn, "SELECT status FROM courier.archive WHERE id = %s", (claimed[0],)) == "completed"
    assert claim(conn) == []
    assert scalar(conn, "SELECT status FROM courier.queue WHERE id = %s", (ids[1],)) == "pending"


def test_a_paused_topic_hands_out_nothing_and_its_leases_still_settle(conn):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull', '{\"max_depth\": 4}')")
    conn.execute("SELECT courier.enqueue('jobs', '{\"n\": 1}')")
    conn.execute("SELECT courier.enqueue('jobs', '{\"n\": 2}')")
    (first, lease), (second, lease2) = conn.execute("SELECT id, lease FROM courier.dequeue('jobs', 2, 60)").fetchall()
    assert scalar(conn, "SELECT courier.pause_endpoint('jobs')") is True

    conn.execute("SELECT courier.enqueue('jobs', '{\"n\": 3}')")
    conn.execute("SELECT courier.send_batch('jobs', ARRAY['{\"n\": 4}']::jsonb[])")
    with pytest.raises(psycopg.Error) as refused:  # max_depth still refuses past its limit
        conn.execute("SELECT courier.enqueue('jobs', '{\"n\": 5}')")
    assert refused.value.sqlstate == "53401"
    assert conn.execute("SELECT * FROM courier.dequeue('jobs', 10, 60)").fetchall() == []
    assert conn.execute("SELECT * FROM courier.receive('jobs', 10)").fetchall() == []
    assert scalar(conn, "SELECT courier.peek('jobs')") == 2  # peek still counts
    assert scalar(conn, "SELECT courier.ack(%s, %s)", (first, lease)) == "acked"
    assert scalar(conn, "SELECT courier.nack(%s, %s, 'later')", (second, lease2)) == "nacked"
    assert conn.execute("SELECT * FROM courier.dequeue('jobs', 10, 60)").fetchall() == []  # not even the nacked
    topic = conn.execute("SELECT paused, pending FROM courier.topics() WHERE topic = 'jobs'").fetchone()
    assert topic == (True, 3)

    conn.execute("SELECT courier.resume_endpoint('jobs')")
    assert len(conn.execute("SELECT * FROM courier.receive('jobs', 1)").fetchall()) == 1
    assert len(conn.execute("SELECT * FROM courier.dequeue('jobs', 10, 60)").fetchall()) == 2


def test_a_running_pool_delivers_nothing_while_paused_and_everything_after_resume(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop')")
    conn.execute("SELECT courier.pause_endpoint('hook')")
    conn.execute("SELECT courier.send_batch('hook', array_fill('{}'::jsonb, ARRAY[20]))")
    pool = run_pool_until(dsn, lambda: False, timeout=2.0)  # polls, wakes and refreshes meanwhile
    assert pool.stats.delivered == 0 and pending(conn, "hook") == 20

    def sent_while_running() -> bool:  # sends go on while the pool runs, and wake it
        if scalar(conn, "SELECT count(*) FROM courier.queue WHERE endpoint_id = "
                        "(SELECT id FROM courier.endpoints WHERE name = 'hook')") < 25:
            conn.execute("SELECT courier.send('hook', '{}')")
        return False
    pool = run_pool_until(dsn, sent_while_running, timeout=1.5)
    assert pool.stats.delivered == 0 and pending(conn, "hook") == 25

    conn.execute("SELECT courier.resume_endpoint('hook')")
    pool = run_pool_until(dsn, lambda: pending(conn, "hook") == 0, timeout=20)
    assert pool.stats.delivered == 25
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


def test_cli_pause_resume_and_the_state_in_list_and_status(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('hook', 'noop')")
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull')")
    done = run("endpoint", "pause", "hook", dsn=dsn)
    assert (done.code, done.out.strip()) == (0, "hook paused")
    assert run("endpoint", "pause", "hook", dsn=dsn).out.strip() == "hook was already paused"
    assert run("topic", "pause", "jobs", "--json", dsn=dsn).json() == {"name": "jobs", "paused": True,
                                                                        "changed": True}
    sent = run("send", "hook", '{"n": 1}', dsn=dsn)
    assert sent.code == 0  # sends go on
    listed = run("endpoint", "list", dsn=dsn)
    assert listed.code == 0 and "paused" in listed.out
    assert all(e["paused_at"] for e in run("endpoint", "list", "--json", dsn=dsn).json())
    assert "jobs (paused)" in run("topic", "list", dsn=dsn).out
    assert [t["paused"] for t in run("topic", "list", "--json", dsn=dsn).json()] == [True]
    status = run("status", dsn=dsn)
    assert status.code == 0 and "paused" in status.out
    assert run("status", "--json", dsn=dsn).json()["endpoints"][0]["paused"] is True

    assert run("endpoint", "resume", "hook", dsn=dsn).out.strip() == "hook resumed"
    assert run("topic", "resume", "jobs", dsn=dsn).out.strip() == "jobs resumed"
    assert run("topic", "resume", "jobs", dsn=dsn).out.strip() == "jobs was not paused"
    assert "paused" not in run("endpoint", "list", dsn=dsn).out

    unknown = run("endpoint", "pause", "nowhere", dsn=dsn)
    assert unknown.code == 1 and len(unknown.err.strip().splitlines()) == 1
    assert 'endpoint "nowhere" does not exist' in unknown.err and "P0002" in unknown.err


def test_http_pause_and_resume_for_admin_tokens_only(server, conn, orders):
    admin = token(conn, "ops", ["admin"])
    app = token(conn, "app", ["enqueue", "consume"])
    assert call(server, "POST", "/api/endpoints/orders/pause", app)[0] == 403
    status, body, _ = call(server, "POST", "/api/endpoints/orders/pause", admin)
    assert (status, body) == (200, {"name": "orders", "paused": True, "changed": True})
    assert call(server, "POST", "/api/topics/orders/pause", admin)[1]["changed"] is False

    assert call(server, "POST", "/api/messages", app, {"topic": "orders", "payload": b64(1)})[0] == 201
    status, body, _ = call(server, "POST", "/api/messages/dequeue", app, {"topic": "orders"})
    assert status == 200 and body["messages"] == []
    (topic,) = call(server, "GET", "/api/topics", app)[1]["topics"]
    assert (topic["topic"], topic["paused"], topic["pending"]) == ("orders", True, 1)

    status, body, _ = call(server, "POST", "/api/endpoints/orders/resume", admin)
    assert (status, body) == (200, {"name": "orders", "paused": False, "changed": True})
    assert len(call(server, "POST", "/api/messages/dequeue", app, {"topic": "orders"})[1]["messages"]) == 1
    assert call(server, "POST", "/api/endpoints/nowhere/pause", admin)[0] == 404
    paths = call(server, "GET", "/api/openapi.json", admin)[1]["paths"]
    assert "post" in paths["/api/endpoints/{name}/pause"] and "post" in paths["/api/endpoints/{name}/resume"]


def test_z_on_the_endpoints_pane_pauses_and_resumes(dsn, conn):
    conn.execute("SELECT courier.create_endpoint('alpha', 'noop')")

    async def scenario(pilot, app):
        await open_pane(pilot, "endpoints")
        table = app.pane.query_one(LiveTable)
        await wait_for(pilot, lambda: table.row_count == 1, what="the endpoint")
        await pilot.press("z")
        await wait_for(pilot, lambda: paused_at(conn, "alpha") is not None, what="the pause")
        await wait_for(pilot, lambda: "paused" in str(table.get_row_at(0)[1]), what="the state column")
        await pilot.press("z")
        await wait_for(pilot, lambda: paused_at(conn, "alpha") is None, what="the resume")
    run_console(dsn, scenario)
