"""The SQL API from a non-Python client (psql), and what each of Courier's three roles may do.

Role tests log in as fresh LOGIN roles made members of courier_application, courier_monitor
or courier_admin (the server trusts local connections), and drop them again afterwards:
roles belong to the whole cluster, not to the test's database.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.helpers import queue_rows, scalar

HOOK = '{"url": "http://127.0.0.1:9000/hook", "allow_internal": true}'
ENV = {key: value for key, value in os.environ.items()
       if not key.startswith("PG") and key not in ("COURIER_DSN", "DATABASE_URL")}


def _psql_binary() -> str:
    try:
        from sqlkit.embedded import client_binary
        path = client_binary("psql")
        if path.exists():
            return str(path)
    except Exception:  # pgserver missing or laid out differently: fall back to PATH
        pass
    found = shutil.which("psql")
    if found is None:
        pytest.skip("psql is not available")
    return found


def psql(dsn: str, *commands: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run psql unaligned and tuples-only (-At), stopping at the first error; -X skips any ~/.psqlrc."""
    args = [_psql_binary(), dsn, "-X", "-v", "ON_ERROR_STOP=1", "-At"]
    for command in commands:
        args += ["-c", command]
    return subprocess.run(args, input=stdin, capture_output=True, text=True, env=ENV, timeout=60)


def rows(output: str) -> list[list[str]]:
    return [line.split("|") for line in output.splitlines()]


# psql -------------------------------------------------------------------------------------


def test_psql_drives_the_sql_api(dsn, conn):
    created = psql(dsn, f"SELECT courier.create_endpoint('webhook', 'http', '{HOOK}')")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip().isdigit()

    sent = psql(dsn, """SELECT courier.send_with_options('webhook', '{"x":1}'::jsonb, p_priority := 10)""")
    assert sent.returncode == 0, sent.stderr
    message_id = int(sent.stdout)
    batch = psql(dsn, """SELECT courier.send_batch('webhook', ARRAY['{"n":1}', '{"n":2}']::jsonb[])""")
    assert batch.returncode == 0, batch.stderr
    batch_ids = [int(i) for i in batch.stdout.strip().strip("{}").split(",")]
    assert len(batch_ids) == 2 and message_id < batch_ids[0] < batch_ids[1]

    stored = conn.execute("SELECT id, payload, priority FROM courier.queue ORDER BY id").fetchall()
    assert stored == [(message_id, {"x": 1}, 10), (batch_ids[0], {"n": 1}, 0), (batch_ids[1], {"n": 2}, 0)]

    health = psql(dsn, "SELECT * FROM courier.get_endpoint_health()")
    assert health.returncode == 0, health.stderr
    [row] = rows(health.stdout)
    name, protocol, enabled, circuit, failures, _success, _failure, pending, oldest = row
    assert (name, protocol, enabled, circuit, failures, pending) == ("webhook", "http", "t", "closed", "0", "3")
    assert oldest  # the oldest pending message's time

    metrics = psql(dsn, "SELECT metric_name, metric_value, labels, metric_type FROM courier.metrics()")
    assert metrics.returncode == 0, metrics.stderr
    by_key = {(name, labels): (value, kind) for name, value, labels, kind in rows(metrics.stdout)}
    assert by_key[("queue_depth", '{"status": "pending"}')] == ("3", "gauge")
    assert by_key[("queue_depth_by_endpoint", '{"status": "pending", "endpoint": "webhook"}')] == ("3", "gauge")
    assert by_key[("endpoint_enabled", '{"endpoint": "webhook"}')] == ("1", "gauge")
    assert by_key[("messages_delivered_total", '{"endpoint": "webhook"}')] == ("0", "counter")


def test_psql_error_is_readable_and_exits_non_zero(dsn, conn, webhook):
    failed = psql(dsn, "SELECT courier.send('nope', '{}')")
    assert failed.returncode != 0
    assert failed.stdout == ""
    assert 'ERROR:  [courier] endpoint "nope" does not exist' in failed.stderr
    assert "HINT:  Create it with courier.create_endpoint() or `courier endpoint create`" in failed.stderr

    out_of_range = psql(dsn, "SELECT courier.send_with_options('webhook', '{}', p_priority := 11)")
    assert out_of_range.returncode != 0
    assert "priority must be between 0 and 10, got 11" in out_of_range.stderr
    assert queue_rows(conn) == 0


def test_psql_script_sends_in_one_transaction_with_fast_mode(dsn, conn, webhook):
    script = """
        BEGIN;
        SELECT courier.enable_fast_mode();
        SHOW synchronous_commit;
        SELECT courier.send('webhook', '{"step": 1}') > 0;
        SELECT courier.send('webhook', '{"step": 2}') > 0;
        COMMIT;
        SHOW synchronous_commit;
    """
    done = psql(dsn, stdin=script)
    assert done.returncode == 0, done.stderr
    # enable_fast_mode() prints an empty line (void); fast mode lasts only until COMMIT.
    assert done.stdout.split() == ["BEGIN", "off", "t", "t", "COMMIT", "on"]
    assert queue_rows(conn) == 2


def test_psql_script_stops_at_the_first_error_and_rolls_back(dsn, conn, webhook):
    script = """
        BEGIN;
        SELECT courier.send('webhook', '{"step": 1}');
        SELECT courier.send('missing', '{"step": 2}');
        COMMIT;
    """
    done = psql(dsn, stdin=script)
    assert done.returncode == 3  # psql's code for a script error under ON_ERROR_STOP
    assert 'endpoint "missing" does not exist' in done.stderr
    assert queue_rows(conn) == 0


# Roles ------------------------------------------------------------------------------------

LoginAs = Callable[[str], psycopg.Connection]


@pytest.fixture
def login_as(dsn: str, conn: psycopg.Connection) -> Iterator[LoginAs]:
    """login_as('courier_application') -> an autocommit connection as a new LOGIN member of that role."""
    roles: list[str] = []
    connections: list[psycopg.Connection] = []

    def login(group: str) -> psycopg.Connection:
        name = f"courier_test_{uuid.uuid4().hex[:12]}"
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(sql.Identifier(name), sql.Identifier(group)))
        roles.append(name)
        params = conninfo_to_dict(dsn)
        params.pop("password", None)
        params["user"] = name
        connections.append(psycopg.connect(make_conninfo("", **params), autocommit=True))
        return connections[-1]

    yield login
    for connection in connections:
        connection.close()
    for name in roles:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_application_role_can_send(conn, webhook, login_as):
    app = login_as("courier_application")
    assert scalar(app, "SELECT current_user").startswith("courier_test_")

    first = scalar(app, "SELECT courier.send('webhook', '{\"n\": 1}')")
    second = scalar(app, "SELECT courier.send_with_options('webhook', '{\"n\": 2}', p_priority := 5, "
                         "p_idempotency_key := 'k-1', p_headers := '{\"X-Tenant\": \"acme\"}')")
    batch = scalar(app, "SELECT courier.send_batch('webhook', ARRAY['{\"n\": 3}', '{\"n\": 4}']::jsonb[])")
    prioritized = scalar(app, "SELECT courier.send_batch_with_priority('webhook', ARRAY['{\"n\": 5}']::jsonb[], 9)")
    with app.transaction():
        app.execute("SELECT courier.enable_fast_mode()")
        assert scalar(app, "SHOW synchronous_commit") == "off"
        in_fast_mode = scalar(app, "SELECT courier.send('webhook', '{\"n\": 6}')")
    assert scalar(app, "SHOW synchronous_commit") == "on"

    stored = conn.execute("SELECT id, payload ->> 'n', priority FROM courier.queue ORDER BY id").fetchall()
    assert stored == [(first, "1", 0), (second, "2", 5), (batch[0], "3", 0), (batch[1], "4", 0),
                      (prioritized[0], "5", 9), (in_fast_mode, "6", 0)]


@pytest.mark.parametrize("statement", [
    "SELECT courier.create_endpoint('mine', 'noop')",
    "SELECT courier.set_setting('max_queue_size', '0')",
    "SELECT * FROM courier.claim_batch('thief', 10, 1)",
    "SELECT * FROM courier._claim_due('thief', 10)",
    "SELECT * FROM courier.queue",
    "INSERT INTO courier.queue (endpoint_id, payload) VALUES (1, '{}')",
], ids=["create_endpoint", "set_setting", "claim_batch", "_claim_due", "select-queue", "insert-queue"])
def test_application_role_cannot_administer_consume_or_touch_tables(conn, webhook, login_as, statement):
    app = login_as("courier_application")
    message_id = scalar(app, "SELECT courier.send('webhook', '{}')")

    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
        app.execute(statement)

    # Nothing changed: one endpoint, the default limit, and the message still pending.
    assert scalar(conn, "SELECT count(*) FROM courier.endpoints") == 1
    assert scalar(conn, "SELECT courier.get_setting('max_queue_size')") == "1000000"
    assert conn.execute("SELECT id, status FROM courier.queue").fetchall() == [(message_id, "pending")]


def test_monitor_role_reads_but_cannot_send_or_see_configs(conn, webhook, login_as):
    message_id = scalar(conn, "SELECT courier.send('webhook', '{\"n\": 1}')")
    monitor = login_as("courier_monitor")

    depth = {labels["status"]: value for _name, value, labels, _kind in monitor.execute(
        "SELECT * FROM courier.metrics() WHERE metric_name = 'queue_depth'")}
    assert depth["pending"] == 1
    health = monitor.execute("SELECT endpoint_name, pending_messages FROM courier.get_endpoint_health()").fetchall()
    assert health == [("webhook", 1)]
    assert monitor.execute("SELECT id, status FROM courier.queue").fetchall() == [(message_id, "pending")]
    assert monitor.execute("SELECT name, enabled FROM courier.endpoints").fetchall() == [("webhook", True)]

    for statement in ["SELECT courier.send('webhook', '{}')",
                      "SELECT config FROM courier.endpoints",
                      "SELECT * FROM courier.endpoints",
                      "SELECT courier.set_setting('max_queue_size', '0')"]:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            monitor.execute(statement)
    assert queue_rows(conn) == 1


def test_monitor_role_cannot_read_endpoint_credentials_through_the_event_log(conn, login_as):
    conn.execute("SELECT courier.create_endpoint('orders', 'amqp', "
                 "'{\"url\": \"amqp://app:s3cret@rabbit.internal:5672/orders\", \"routing_key\": \"orders\"}')")
    monitor = login_as("courier_monitor")
    # Event details hold configs (redacted) and payload-derived reasons: the monitor sees none.
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
        monitor.execute("SELECT details::text FROM courier.event_log")
    assert ("endpoint.created",) in monitor.execute("SELECT event_type FROM courier.event_log").fetchall()
    logged = conn.execute("SELECT details::text FROM courier.event_log WHERE event_type = 'endpoint.created'")
    assert "s3cret" not in " ".join(row[0] for row in logged)  # and an admin sees it redacted


def test_admin_role_creates_endpoints_and_is_named_in_the_event_log(conn, login_as):
    admin = login_as("courier_admin")
    admin_name = scalar(admin, "SELECT current_user")

    endpoint_id = scalar(admin, "SELECT courier.create_endpoint('billing', 'http', %s)", (HOOK,))
    assert scalar(admin, "SELECT courier.set_setting('max_queue_size', '5000')") == "5000"
    scalar(admin, "SELECT courier.send('billing', '{}')")
    assert len(admin.execute("SELECT * FROM courier.claim_batch('admin-worker', 10, %s)",
                             (endpoint_id,)).fetchall()) == 1

    assert scalar(conn, "SELECT name FROM courier.endpoints WHERE id = %s", (endpoint_id,)) == "billing"
    actors = conn.execute("SELECT event_type, actor FROM courier.event_log "
                          "WHERE event_type NOT LIKE 'archive.%' ORDER BY id").fetchall()
    assert actors == [("endpoint.created", admin_name), ("config.changed", admin_name)]
