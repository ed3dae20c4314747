"""sqlkit's Python API: DSN resolution, the pools, the typed functions and error mapping."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import uuid4

import pytest

from sqlkit import endpoints, messages, observability, settings
from sqlkit.connection import AsyncDatabase, Database, connect
from sqlkit.dsn import resolve_dsn
from sqlkit.errors import (
    Backpressure,
    Conflict,
    DatabaseUnavailable,
    InvalidInput,
    NotFound,
    PermissionDenied,
    WrongState,
)
from sqlkit.messages import SendOptions


def test_dsn_resolution_order():
    env = {"COURIER_DSN": "courier", "DATABASE_URL": "url", "PGHOST": "h"}
    assert resolve_dsn("explicit", env).dsn == "explicit"
    assert resolve_dsn(None, env).source == "COURIER_DSN"
    assert resolve_dsn(None, {"DATABASE_URL": "url", "PGHOST": "h"}).dsn == "url"
    assert resolve_dsn(None, {"PGHOST": "h"}).source == "PG* environment"
    assert resolve_dsn(None, {}).is_embedded


def test_typed_api_round_trip(dsn):
    with Database(dsn) as db, db.connection() as conn:
        endpoint_id = endpoints.create(conn, "billing", "http", {"url": "https://api.test/hook"},
                                       {"max_retries": 3, "backoff": "linear"}, "billing hooks")
        billing = endpoints.get(conn, "billing")
        assert billing.id == endpoint_id
        assert (billing.retry_policy["max_retries"], billing.description) == (3, "billing hooks")

        correlation = uuid4()
        message_id = messages.send(conn, "billing", {"order": 1}, SendOptions(
            priority=8, ordering_key="c-1", idempotency_key="o-1", correlation_id=correlation,
            headers={"X-Tenant": "acme"}, metadata={"source": "test"},
            expires_at=datetime.now(UTC) + timedelta(hours=1)))
        assert messages.send(conn, "billing", {"order": 1}, SendOptions(idempotency_key="o-1")) == message_id
        batch_ids = messages.send_batch(conn, "billing", [{"n": 1}, {"n": 2}], priority=2)

        stored = messages.get(conn, message_id)
        assert (stored.priority, stored.correlation_id, stored.headers) == (8, correlation, {"X-Tenant": "acme"})

        claimed = messages.claim_batch(conn, "worker-1", 10, endpoint_id)
        assert [m.id for m in claimed] == [message_id, *batch_ids]
        assert claimed[0].max_retries == 3 and claimed[0].endpoint_name == "billing"
        assert all(m.lease > 0 for m in claimed) and len({m.lease for m in claimed}) == len(claimed)
        counts = messages.report_outcomes(conn, claimed, ["success", "retryable", "permanent"],
                                          [None, "[RETRYABLE] 503", "[PERMANENT] 400"])
        assert (counts.delivered, counts.retried, counts.dead_lettered, counts.stale) == (1, 1, 1, 0)
        assert messages.get(conn, batch_ids[0]).status == "pending"
        failed = messages.get(conn, batch_ids[1])
        assert failed.status == "failed" and failed.error_history[0]["error"] == "[PERMANENT] 400"
        # The same report again holds stale leases: nothing changes, and it is counted.
        assert messages.report_outcomes(conn, claimed[1:2], ["success"], [None]).stale == 1
        assert messages.get(conn, batch_ids[0]).status == "pending"

        depth = {(m.labels.get("status")): m.metric_value
                 for m in observability.metrics(conn) if m.metric_name == "queue_depth"}
        assert depth == {"pending": 1, "processing": 0, "completed": 0, "failed": 0, "expired": 0}
        (health,) = observability.endpoint_health(conn, "billing")
        assert health.pending_messages == 1

        assert settings.set_value(conn, "retry_base_delay", " 20 ") == "20"
        assert settings.get(conn, "retry_base_delay").value == "20"


@pytest.mark.parametrize(("call", "error"), [
    (lambda conn: messages.send(conn, "nope", {}), NotFound),
    (lambda conn: endpoints.create(conn, "x", "http", {"url": "ftp://x"}), InvalidInput),
    (lambda conn: settings.set_value(conn, "max_queue_size", "-1"), InvalidInput),
    (lambda conn: settings.get(conn, "no_such_setting"), NotFound),
    (lambda conn: messages.get(conn, 424242), NotFound),
])
def test_errors_map_to_courier_exceptions(conn, call, error):
    with pytest.raises(error) as caught:
        call(conn)
    assert caught.value.one_line()


def test_state_errors_carry_sqlstate_and_hint(conn, webhook):
    endpoints.disable(conn, "webhook")
    with pytest.raises(WrongState) as caught:
        messages.send(conn, "webhook", {})
    assert caught.value.sqlstate == "55000" and "enable" in caught.value.hint
    endpoints.enable(conn, "webhook")
    messages.send(conn, "webhook", {"a": 1}, SendOptions(idempotency_key="k"))
    with pytest.raises(Conflict):
        messages.send(conn, "webhook", {"a": 2}, SendOptions(idempotency_key="k"))
    settings.set_value(conn, "max_queue_size", "1")
    with pytest.raises(Backpressure) as full:
        messages.send(conn, "webhook", {})
    assert full.value.sqlstate == "53400"


def test_unreachable_database_is_database_unavailable():
    with pytest.raises(DatabaseUnavailable, match=r"cannot connect to PostgreSQL.*127\.0\.0\.1"):
        connect("postgresql://postgres@127.0.0.1:1/x", connect_timeout=2)


def test_permission_denied_is_mapped(conn, dsn):
    role = "courier_test_app_" + uuid4().hex[:8]
    conn.execute(f"CREATE ROLE {role} LOGIN IN ROLE courier_application")
    try:
        import psycopg.conninfo

        from console.bench.scratch import with_dbname  # noqa: F401 - same helper the CLI uses
        params = psycopg.conninfo.conninfo_to_dict(dsn) | {"user": role}
        with connect(psycopg.conninfo.make_conninfo("", **params)) as app, pytest.raises(PermissionDenied):
            endpoints.create(app, "x", "noop", {})
    finally:
        conn.execute(f"DROP ROLE {role}")


def test_async_pool_listens_for_new_messages(dsn, conn, webhook):
    async def scenario() -> list[str]:
        async with AsyncDatabase(dsn) as db, db.listen() as notifications:
            async with db.connection() as aconn:
                await aconn.execute("SELECT courier.send('webhook', '{}')")
            return [await asyncio.wait_for(anext(notifications), timeout=5)]

    endpoint_id = conn.execute("SELECT id FROM courier.endpoints WHERE name = 'webhook'").fetchone()[0]
    assert asyncio.run(scenario()) == [str(endpoint_id)]


def test_a_listener_gets_every_notification_of_a_burst_and_fails_when_its_session_ends(dsn, conn):
    """Notifications that arrive together are all read, in order; a LISTEN session the server
    ends fails the iterator at once with DatabaseUnavailable (the worker then listens anew),
    rather than leaving it waiting on a closed socket."""
    async def scenario() -> tuple[list[str], BaseException | None]:
        async with AsyncDatabase(dsn) as db, db.listen("courier_test_burst") as notifications:
            async with db.connection() as aconn:
                await aconn.set_autocommit(True)
                async with aconn.transaction():  # delivered together, at its commit
                    for n in range(5):
                        await aconn.execute("SELECT pg_notify('courier_test_burst', %s)", (str(n),))
                got = [await asyncio.wait_for(anext(notifications), timeout=5) for _ in range(5)]
                await aconn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE query = 'LISTEN \"courier_test_burst\"'")
            try:
                await asyncio.wait_for(anext(notifications), timeout=5)
            except DatabaseUnavailable as error:
                return got, error
            return got, None

    got, error = asyncio.run(scenario())
    assert got == ["0", "1", "2", "3", "4"]
    assert isinstance(error, DatabaseUnavailable)


def test_embedded_database_lifecycle(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k not in ("COURIER_DSN", "DATABASE_URL")}
    env["COURIER_DATA_DIR"] = str(tmp_path)
    courier = str(Path(sys.executable).parent / "courier")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([courier, *args], env=env, capture_output=True, text=True, timeout=120)

    assert run("db", "status").returncode == 1
    assert run("endpoint", "list").returncode == 1  # no database yet: one clear line
    try:
        assert run("db", "start").returncode == 0
        url = run("db", "url").stdout.strip()
        assert url.startswith("postgresql://") and str(tmp_path) in url
        assert run("migrate").returncode == 0
        assert run("endpoint", "create", "billing", "noop").returncode == 0
        assert run("send", "billing", '{"order": 1}').returncode == 0
        assert run("db", "status").returncode == 0
    finally:
        assert run("db", "stop").returncode == 0
    assert run("db", "status").returncode == 1
    restarted = run("db", "start")
    try:  # the data directory persists across restarts
        assert restarted.returncode == 0
        listed = run("endpoint", "list", "--json")
        assert [e["pending_messages"] for e in json.loads(listed.stdout)] == [1]
    finally:
        run("db", "stop")


def test_the_claim_queries_answer_in_the_order_the_worker_reads_them(conn, webhook):
    """The worker builds each claimed message from its row by position (claimed_from_values), and
    reads report_and_claim's counts and flags after them: a column moved in queries.sql would
    hand a dispatcher one field for another, so the order is held here."""
    from sqlkit import queries
    endpoint = conn.execute("SELECT id FROM courier.endpoints WHERE name = %s", (webhook,)).fetchone()[0]
    conn.execute("SELECT courier.send(%s, '{}')", (webhook,))
    claim = {"worker_id": "w", "batch_size": 1, "endpoint_id": endpoint}
    report = {"ids": [], "leases": [], "outcomes": [], "errors": [], "retry_after": None, "responses": None,
              "linger": False}
    for name, params, after in (
            ("claim_for_endpoint", claim, ()),
            ("report_and_claim", {**claim, **report},
             ("delivered", "retried", "dead_lettered", "stale", "busy", "committing"))):
        with conn.cursor() as cur:
            cur.execute(queries.query(name), params)
            assert tuple(column.name for column in cur.description) == messages._CLAIM_NAMES + after, name
            assert len(messages._CLAIM_NAMES) == messages.CLAIM_COLUMNS
