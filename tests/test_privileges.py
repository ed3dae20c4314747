"""Escalations tried as each of Courier's roles, each refused: triggers, functions in pg_temp,
search_path games, COPY, direct table writes and reading secrets. And the ownership they rest
on: every Courier object belongs to courier_owner, a NOLOGIN role without superuser rights."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from tests import test_roles_and_psql
from tests.helpers import scalar

login_as = test_roles_and_psql.login_as  # the fixture: logs in as a new member of a role

SECRET_CONFIG = ('{"url": "https://hooks.example.com/in", "auth": {"type": "bearer", "token": "tok-s3cret"}, '
                 '"signing": {"secret": "whsec_c2VjcmV0"}}')


@pytest.fixture
def billing(conn) -> int:
    endpoint = scalar(conn, "SELECT courier.create_endpoint('billing', 'http', %s::jsonb)", (SECRET_CONFIG,))
    conn.execute("SELECT courier.send_with_options('billing', '{\"card\": \"4111\"}', "
                 "p_headers := '{\"X-Token\": \"hdr-s3cret\"}', p_metadata := '{\"ssn\": \"123\"}')")
    return endpoint


# Ownership ---------------------------------------------------------------------------------


def test_every_courier_object_belongs_to_a_nologin_owner_without_superuser(conn):
    owner = conn.execute("SELECT rolsuper, rolcanlogin, rolcreaterole, rolcreatedb, rolbypassrls "
                         "FROM pg_roles WHERE rolname = 'courier_owner'").fetchone()
    assert owner == (False, False, False, False, False)
    owners = conn.execute("""
        SELECT 'schema', pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'courier'
        UNION SELECT 'relation', pg_get_userbyid(relowner) FROM pg_class WHERE relnamespace = 'courier'::regnamespace
        UNION SELECT 'function', pg_get_userbyid(proowner) FROM pg_proc WHERE pronamespace = 'courier'::regnamespace
        UNION SELECT 'type', pg_get_userbyid(typowner) FROM pg_type WHERE typnamespace = 'courier'::regnamespace
    """).fetchall()
    assert {who for _, who in owners} == {"courier_owner"}, owners


def test_no_function_is_executable_by_public_and_definers_pin_their_search_path(conn):
    public = conn.execute("""
        SELECT p.oid::regprocedure::text FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
        WHERE p.pronamespace = 'courier'::regnamespace AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'
    """).fetchall()
    assert public == []
    unpinned = conn.execute("""
        SELECT proname FROM pg_proc WHERE pronamespace = 'courier'::regnamespace AND prosecdef
          AND NOT coalesce('search_path=pg_catalog, courier, pg_temp' = ANY (proconfig), false)
    """).fetchall()
    assert unpinned == []


def test_an_archive_partition_made_later_belongs_to_the_owner_and_hides_payloads(conn, login_as):
    conn.execute("SELECT courier.maintain_archive_partitions(30)")  # as the maintenance leader does
    newest = scalar(conn, "SELECT max(c.relname) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                          "WHERE i.inhparent = 'courier.archive'::regclass AND c.relname ~ '^archive_[0-9]'")
    owner = scalar(conn, "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = %s", (newest,))
    assert owner == "courier_owner"
    monitor = login_as("courier_monitor")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        monitor.execute(f"SELECT payload FROM courier.{newest}")


# courier_admin -----------------------------------------------------------------------------

ADMIN_ESCALATIONS = [
    # The reported path: a trigger of the admin's own on a Courier table, fired inside a
    # SECURITY DEFINER function, ran as its (superuser) owner.
    "CREATE FUNCTION pg_temp.evil() RETURNS trigger LANGUAGE plpgsql AS "
    "'BEGIN EXECUTE ''ALTER ROLE '' || session_user || '' SUPERUSER''; RETURN NEW; END'; "
    "CREATE TRIGGER evil BEFORE INSERT ON courier.queue FOR EACH ROW EXECUTE FUNCTION pg_temp.evil()",
    "CREATE TRIGGER evil BEFORE INSERT ON courier.endpoints FOR EACH ROW "
    "EXECUTE FUNCTION courier._validate_endpoint_row()",
    "TRUNCATE courier.queue",
    "TRUNCATE courier.archive",
    "CREATE TABLE courier.mine (id int)",
    "CREATE FUNCTION courier.now() RETURNS timestamptz LANGUAGE sql AS 'SELECT ''2000-01-01''::timestamptz'",
    "CREATE OR REPLACE FUNCTION courier._log_event(text, integer, jsonb) RETURNS void LANGUAGE sql AS ''",
    "ALTER FUNCTION courier.send(text, jsonb) SECURITY INVOKER",
    "ALTER TABLE courier.queue DISABLE TRIGGER ALL",
    "ALTER TABLE courier.endpoints ADD COLUMN x int",
    "DROP TABLE courier.event_log",
    "CREATE TABLE public_ref (id bigint REFERENCES courier.queue (id))",
    "SET ROLE courier_owner",
    "GRANT courier_owner TO CURRENT_USER",
    "COPY courier.endpoints TO PROGRAM 'cat'",
    "COPY courier.settings FROM '/etc/passwd'",
    "SELECT pg_read_file('postgresql.conf')",
]


@pytest.mark.parametrize("statement", ADMIN_ESCALATIONS, ids=[f"admin-{n:02d}" for n in range(len(ADMIN_ESCALATIONS))])
def test_admin_escalations_are_refused(conn, billing, login_as, statement):
    admin = login_as("courier_admin")
    with pytest.raises(psycopg.Error) as caught:
        admin.execute(statement)
    assert caught.value.sqlstate in ("42501", "42P17", "0LP01", "42883"), caught.value
    assert not scalar(conn, "SELECT rolsuper FROM pg_roles WHERE rolname = %s",
                      (scalar(admin, "SELECT session_user"),))
    assert scalar(conn, "SELECT count(*) FROM pg_trigger WHERE tgname = 'evil'") == 0


def test_functions_in_pg_temp_never_shadow_courier_or_catalog_functions(conn, billing, login_as):
    """SECURITY DEFINER functions search pg_catalog, courier, pg_temp: an admin's temporary
    look-alikes are never what they call."""
    admin = login_as("courier_admin")
    admin.execute("CREATE TABLE pg_temp.calls (who text)")
    for signature, returns in (("_log_event(text, integer, jsonb)", "void"), ("now()", "timestamptz"),
                               ("_setting_int(text)", "bigint")):
        admin.execute(f"CREATE FUNCTION pg_temp.{signature.split('(')[0]}({signature.split('(')[1]} "
                      f"RETURNS {returns} LANGUAGE sql AS "
                      f"'INSERT INTO pg_temp.calls VALUES (current_user); SELECT NULL::{returns}'")
    admin.execute("SET search_path = pg_temp, courier, pg_catalog")
    admin.execute("SELECT courier.set_setting('max_queue_size', '5000')")
    admin.execute("SELECT courier.send('billing', '{}')")
    assert admin.execute("SELECT count(*) FROM pg_temp.calls").fetchone()[0] == 0


def test_admin_runs_courier_through_its_rows_and_functions(conn, billing, login_as):
    admin = login_as("courier_admin")
    assert scalar(admin, "SELECT count(*) FROM courier.queue") == 1
    admin.execute("UPDATE courier.endpoints SET description = 'payments' WHERE name = 'billing'")
    assert admin.execute("SELECT * FROM courier.claim_batch('w', 10, %s)", (billing,)).fetchall()
    assert scalar(admin, "SELECT courier.recover_stale_messages()") == 0


# courier_application ---------------------------------------------------------------------------

APPLICATION_ESCALATIONS = [
    "SELECT * FROM courier.queue",
    "SELECT config FROM courier.endpoints",
    "UPDATE courier.queue SET priority = 10",
    "DELETE FROM courier.queue",
    "INSERT INTO courier.endpoints (name, protocol) VALUES ('x', 'noop')",
    "COPY courier.queue TO STDOUT",
    "SELECT * FROM courier.claim_batch('thief', 10, 1)",
    "SELECT * FROM courier._claim_due('thief', 10)",
    "SELECT courier._dead_letter(ARRAY[1::bigint])",
    "SELECT courier.redrive_all()",
    "SELECT courier.recover_stale_messages(0)",
    "SELECT courier.set_setting('max_queue_size', '0')",
    "SELECT courier.create_endpoint('mine', 'noop')",
    "SELECT courier.metrics()",
    "CREATE TRIGGER evil BEFORE INSERT ON courier.queue FOR EACH ROW EXECUTE FUNCTION courier._count_queue_insert()",
]


@pytest.mark.parametrize("statement", APPLICATION_ESCALATIONS,
                         ids=[f"application-{n:02d}" for n in range(len(APPLICATION_ESCALATIONS))])
def test_application_escalations_are_refused(conn, billing, login_as, statement):
    app = login_as("courier_application")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        app.execute(statement)
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'pending'") == 1


# courier_monitor -------------------------------------------------------------------------------

MONITOR_REFUSED = [
    "SELECT payload FROM courier.queue",
    "SELECT headers FROM courier.queue",
    "SELECT metadata FROM courier.queue",
    "SELECT last_error FROM courier.queue",
    "SELECT * FROM courier.queue",
    "COPY courier.queue TO STDOUT",
    "SELECT payload FROM courier.dlq",
    "SELECT error_history FROM courier.dlq",
    "SELECT payload FROM courier.archive",
    "SELECT response FROM courier.archive",
    "SELECT payload FROM courier.archive_default",
    "SELECT config FROM courier.endpoints",
    "SELECT details FROM courier.event_log",
    "SELECT courier._redact(config) FROM courier.endpoints",
    "SELECT courier.send('billing', '{}')",
    "UPDATE courier.settings SET value = '0' WHERE name = 'max_queue_size'",
    "SELECT courier.claim_batch('m', 1, 1)",
]


@pytest.mark.parametrize("statement", MONITOR_REFUSED, ids=[f"monitor-{n:02d}" for n in range(len(MONITOR_REFUSED))])
def test_monitor_never_reads_payloads_headers_secrets_or_bodies(conn, billing, login_as, statement):
    monitor = login_as("courier_monitor")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        monitor.execute(statement)


def test_monitor_sees_counts_states_and_health(conn, billing, login_as):
    monitor = login_as("courier_monitor")
    assert monitor.execute("SELECT status, count(*) FROM courier.queue GROUP BY status").fetchall() == [("pending", 1)]
    assert monitor.execute("SELECT name, circuit_state FROM courier.endpoints").fetchall() == [("billing", "closed")]
    assert scalar(monitor, "SELECT count(*) FROM courier.metrics()") > 0
    assert scalar(monitor, "SELECT count(*) FROM courier.health_check()") > 0
    assert scalar(monitor, "SELECT pending_messages FROM courier.get_endpoint_health('billing')") == 1
    everything = " ".join(str(row) for row in monitor.execute(
        "SELECT * FROM courier.metrics() UNION ALL SELECT check_name, 0, to_jsonb(detail), status "
        "FROM courier.health_check()").fetchall())
    assert "s3cret" not in everything and "4111" not in everything


CARD = "4111111111111111"


def test_an_application_settles_one_message_at_a_time_whatever_its_search_path(conn, login_as):
    """ack, nack and snooze of one message run as their caller (they pass it to the array forms,
    which run as the owner): an application with look-alikes first on its search_path still
    settles through Courier's own functions, and gains no right it did not have."""
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    app = login_as("courier_application")
    app.execute("SELECT courier.enqueue_batch('orders', array_fill('{}'::jsonb, ARRAY[3]))")
    app.execute("CREATE TABLE pg_temp.calls (who text)")
    app.execute("CREATE FUNCTION pg_temp.ack(bigint[], integer[]) RETURNS TABLE (id bigint, result text) "
                "LANGUAGE sql AS $$ INSERT INTO pg_temp.calls VALUES (current_user) RETURNING 0::bigint, 'forged' $$")
    app.execute("SET search_path = pg_temp, public")
    taken = app.execute("SELECT id, lease FROM courier.dequeue('orders', 3) ORDER BY id").fetchall()
    results = [scalar(app, "SELECT courier.ack(%s::bigint, %s::integer)", taken[0]),
               scalar(app, "SELECT courier.nack(%s::bigint, %s::integer, 'later')", taken[1]),
               scalar(app, "SELECT courier.snooze(%s::bigint, %s::integer, 60)", taken[2])]
    assert results == ["acked", "nacked", "snoozed"]
    assert scalar(app, "SELECT count(*) FROM pg_temp.calls") == 0
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'pending'") == 2
    assert scalar(app, "SELECT courier.ack(%s::bigint, %s::integer)", taken[0]) == "not_found"
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        app.execute("DELETE FROM courier.queue")


def test_monitor_reads_no_text_an_application_wrote(conn, login_as):
    """Issue 23, item 11: error classes were the first 80 characters of each error, and a pull
    consumer's nack error is the application's own text. Every column and function the
    monitor can read, after the analytics have run, holds none of it."""
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    app = login_as("courier_application")
    app.execute("SELECT courier.enqueue('orders', '{\"n\": 1}')")
    taken = app.execute("SELECT id, lease FROM courier.dequeue('orders', 1)").fetchone()
    app.execute("SELECT * FROM courier.nack(%s, %s, %s)",
                (taken[0], taken[1], f"card {CARD} of Jane Roe declined: insufficient funds"))
    again = app.execute("SELECT id, lease FROM courier.dequeue('orders', 1)").fetchone()
    app.execute("SELECT * FROM courier.nack(%s, %s, %s)", (again[0], again[1], f"Jane Roe, {CARD}"))
    history = scalar(conn, "SELECT error_history FROM courier.queue WHERE id = %s", (taken[0],))
    assert CARD in str(history)  # the consumer's text is kept, for those allowed to read it
    # Archived as it will be, next to a push delivery's failure whose reason quotes a body.
    pushed = [{"outcome": "permanent", "error": f"[PERMANENT] HTTP 422 {CARD}: Jane Roe"}]
    conn.execute("INSERT INTO courier.archive (id, endpoint_id, payload, status, error_history, completed_at, "
                 "created_at) "
                 "VALUES (9001, 1, '{}', 'completed', %s, now(), now()), (9002, 2, '{}', 'failed', %s, now(), now())",
                 (Jsonb(history), Jsonb(pushed)))
    from sqlkit import analytics as store

    found = store.rows(conn, "sql_analytics_errors", {"from": None, "to": "2100-01-01", "top": 5})
    for row in found:  # as the analytics job stores them (tests/test_pipeline.py: Spark agrees)
        conn.execute("INSERT INTO courier.analytics_errors VALUES (%(endpoint_id)s, %(hour)s, %(error_class)s, "
                     "%(occurrences)s)", row)
    assert {row["error_class"] for row in found} == {"nack", "HTTP 422"}

    monitor = login_as("courier_monitor")
    readable = conn.execute("""
        SELECT c.relname, string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
        FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        WHERE c.relnamespace = 'courier'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
          AND has_column_privilege('courier_monitor', c.oid, a.attnum, 'SELECT')
        GROUP BY c.relname""").fetchall()
    assert "analytics_errors" in {name for name, _ in readable}
    seen = [str(monitor.execute(f"SELECT {columns} FROM courier.{name}").fetchall()) for name, columns in readable]
    for function in ("metrics()", "health_check()", "dlq_summary()", "get_worker_status()", "topics()",
                     "get_endpoint_health(NULL)", "archive_partitions()"):
        seen.append(str(monitor.execute(f"SELECT * FROM courier.{function}").fetchall()))
    everything = " ".join(seen)
    assert CARD not in everything and "Jane" not in everything
