"""`courier dlq ...`, `courier endpoint reset-circuit|health` and `courier worker`, as a user runs them."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from console.bench.scratch import with_dbname
from console.sink import WebhookSink
from tests.conftest import drop_database
from tests.helpers import report, scalar
from tests.test_cli import assert_ok, assert_one_line_error, run
from tests.workers import start_worker_process, wait_for


@pytest.fixture
def courier(dsn):
    return lambda *args, stdin="": run(*args, dsn=dsn, stdin=stdin)


@pytest.fixture
def dead(conn):
    """Five dead letters on endpoint 'billing' and two on 'shipping'."""
    for name, n in (("billing", 5), ("shipping", 2)):
        conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
        ids = scalar(conn, "SELECT courier.send_batch(%s, ARRAY(SELECT jsonb_build_object('n', g) "
                           "FROM generate_series(1, %s) g))", (name, n))
        endpoint = scalar(conn, "SELECT id FROM courier.endpoints WHERE name = %s", (name,))
        conn.execute("SELECT courier.claim_batch('w', 10, %s)", (endpoint,))
        report(conn, ids, ["permanent"] * n, ["[PERMANENT] HTTP 400"] * n)
    return conn


def test_dlq_list_show_and_summary(courier, dead):
    listed = assert_ok(courier("dlq", "list", "--endpoint", "billing", "--json")).json()
    assert len(listed) == 5 and {row["last_error"] for row in listed} == {"[PERMANENT] HTTP 400"}
    shown = assert_ok(courier("dlq", "show", str(listed[0]["id"]), "--json")).json()
    assert shown["payload"] == {"n": 5} and shown["error_history"][0]["error"] == "[PERMANENT] HTTP 400"
    assert "error history" in assert_ok(courier("dlq", "show", str(listed[0]["id"]))).out
    summary = assert_ok(courier("dlq", "summary", "--json")).json()
    assert [(s["endpoint_name"], s["failed_count"]) for s in summary] == [("billing", 5), ("shipping", 2)]
    assert_one_line_error(courier("dlq", "show", "999999"), "does not exist")


def test_dlq_redrive_one_an_endpoint_and_everything(courier, dead):
    first = assert_ok(courier("dlq", "list", "--endpoint", "billing", "--json")).json()[-1]["id"]
    assert assert_ok(courier("dlq", "redrive", str(first), "--json")).json()["redriven"] == 1
    assert_one_line_error(courier("dlq", "redrive", str(first)), "already redriven")
    endpoint = assert_ok(courier("dlq", "redrive", "--endpoint", "billing", "--yes"))
    assert "redrove 4 message(s) of endpoint billing" in endpoint.text
    everything = assert_ok(courier("dlq", "redrive", "--all", "--yes", "--json")).json()
    assert everything["redriven"] == 2
    assert scalar(dead, "SELECT count(*) FROM courier.queue WHERE status = 'pending'") == 7
    assert scalar(dead, "SELECT count(*) FROM courier.dlq WHERE status = 'redriven'") == 7


def test_dlq_redrive_asks_first_and_needs_a_scope(courier, dead):
    refused = courier("dlq", "redrive", "--endpoint", "billing", stdin="n\n")
    assert refused.code == 1 and "Redrive 5 failed message(s)" in refused.out
    assert scalar(dead, "SELECT count(*) FROM courier.dlq WHERE status = 'failed'") == 7
    assert courier("dlq", "redrive").code == 2
    assert courier("dlq", "redrive", "1", "--all").code == 2


def test_dlq_cleanup_asks_first_as_redrive_does(courier, dead):
    dead.execute("UPDATE courier.dlq SET failed_at = now() - interval '40 days' WHERE endpoint_name = 'shipping'")
    before = scalar(dead, "SELECT count(*) FROM courier.dlq")
    refused = courier("dlq", "cleanup", stdin="n\n")
    assert refused.code == 1 and "Delete 2 DLQ entries" in refused.out and "Traceback" not in refused.err
    assert scalar(dead, "SELECT count(*) FROM courier.dlq") == before  # nothing deleted
    assert "deleted 2 DLQ entries" in assert_ok(courier("dlq", "cleanup", stdin="y\n")).out
    dead.execute("UPDATE courier.dlq SET failed_at = now() - interval '40 days'")
    assert assert_ok(courier("dlq", "cleanup", "--yes", "--json")).json() == {"deleted": before - 2}
    assert "deleted 0 DLQ entries" in assert_ok(courier("dlq", "cleanup")).out  # nothing due: nothing to ask


def test_reset_circuit_and_health(courier, conn):
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    conn.execute("UPDATE courier.endpoints SET circuit_state = 'open', circuit_failure_count = 12")
    health = assert_ok(courier("endpoint", "health", "--json")).json()
    assert [(h["endpoint_name"], h["circuit_state"], h["circuit_failure_count"]) for h in health] == [
        ("billing", "open", 12)]
    assert "open" in assert_ok(courier("endpoint", "health", "billing")).out
    assert_ok(courier("endpoint", "reset-circuit", "billing"))
    assert scalar(conn, "SELECT circuit_state FROM courier.endpoints") == "closed"
    assert_one_line_error(courier("endpoint", "reset-circuit", "nope"), "does not exist", "P0002")
    assert_one_line_error(courier("endpoint", "health", "nope"), "does not exist")


def test_worker_delivers_and_reports_heartbeats(dsn, conn):
    with WebhookSink() as sink:
        conn.execute("SELECT courier.create_endpoint('hook', 'http', %s::jsonb)",
                     (json.dumps({"url": f"{sink.url}/healthy", "allow_internal": True}),))
        assert_ok(run("send", "hook", '{"order": 1}', dsn=dsn))
        worker = start_worker_process(dsn, "--concurrency", "4", "--worker-id", "test-worker")
        try:
            wait_for(lambda: sink.count() == 1)
            wait_for(lambda: scalar(conn, "SELECT count(*) FROM courier.workers") == 1)
            status = conn.execute("SELECT worker_id, state, alive FROM courier.get_worker_status()").fetchone()
            assert status == ("test-worker", "running", True)
        finally:
            worker.terminate()
            assert worker.wait(30) == 0


def test_worker_against_an_unreachable_database_is_one_line(courier):
    # Without --exit-if-unavailable it waits for the database (tests/test_worker_waits_for_database.py).
    result = run("worker", "--exit-if-unavailable", dsn="postgresql://postgres@127.0.0.1:1/x")
    assert_one_line_error(result, "cannot connect to PostgreSQL")


def test_dlq_show_redacts_producer_credentials(courier, conn):
    conn.execute("SELECT courier.create_endpoint('billing', 'noop', '{}')")
    message = scalar(conn, "SELECT courier.send_with_options('billing', '{\"n\": 1}', "
                           "p_headers := '{\"Authorization\": \"Bearer t0p-s3cret\", \"X-Tenant\": \"acme\"}')")
    conn.execute("SELECT courier.claim_batch('w', 1, 1)")
    report(conn, [message], ["permanent"], ["boom"])
    dlq_id = scalar(conn, "SELECT id FROM courier.dlq")
    for shown in (courier("dlq", "show", str(dlq_id)), courier("dlq", "show", str(dlq_id), "--json")):
        assert_ok(shown)
        assert "t0p-s3cret" not in shown.out and "acme" in shown.out


def test_demo_runs_producer_workers_and_the_live_view(courier, conn, server_dsn):
    # The demo works in a database of its own beside the one --dsn names; --keep keeps it to look at.
    database = "courier_demo_t_" + uuid.uuid4().hex[:10]
    try:
        shown = assert_ok(courier("demo", "--seconds", "6", "--rate", "80", "--keep", "--database", database))
        assert "Courier demo" in shown.out and "demo-down" in shown.out
        assert scalar(conn, "SELECT count(*) FROM courier.endpoints") == 0
        with psycopg.connect(with_dbname(server_dsn, database), autocommit=True) as kept:
            names = {n for (n,) in kept.execute("SELECT name FROM courier.endpoints")}
            assert names == {"demo-healthy", "demo-flaky", "demo-slow", "demo-down"}
            assert scalar(kept, "SELECT count(*) FROM courier.archive WHERE status = 'completed'") > 50
            assert scalar(kept, "SELECT count(*) FROM courier.queue WHERE status = 'processing'") == 0  # drained
            assert scalar(kept, "SELECT state FROM courier.workers WHERE worker_id LIKE 'console:%'") == "stopped"
    finally:
        drop_database(server_dsn, database)
