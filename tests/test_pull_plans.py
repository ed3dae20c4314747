"""Every dequeue, receive and peek of a pull topic is served by queue_pull_due_idx (pending
messages) and queue_pull_leased_idx (leases, lapsed or not), never a scan, with 100k messages
scheduled for the future in the same topic (at every priority) and 100k due in another
(LonnyMQ). The candidates come one priority level at a time, a range of each index.

Two proofs: the plans of the functions' candidate queries (generic, as plpgsql runs them after a
few calls, and with their actual row counts), and the server's own scan counters across real
calls of the functions, which follow the functions whatever their text becomes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.helpers import scalar

DUE = 1000
FUTURE = 100_000
OTHER = 100_000


def _range(status: str, alias: str) -> str:
    return f"""SELECT * FROM (
            SELECT q.id, q.visible_at AS due FROM courier.queue q
            WHERE q.endpoint_id = $1 AND q.priority = p.priority
              AND q.visible_at <= now() AND q.visible_at IS NOT NULL AND {status}
              AND (q.expires_at IS NULL OR q.expires_at > now())
            ORDER BY q.visible_at, q.id
            LIMIT $2
            FOR UPDATE SKIP LOCKED) {alias}"""


# Pending messages from queue_pull_due_idx and lapsed leases from queue_pull_leased_idx (migration
# 0059), merged in due order, per priority level: dequeue's and receive's candidates.
CANDIDATES = f"""
    SELECT c.id FROM generate_series(10, 0, -1) AS p(priority)
    CROSS JOIN LATERAL (
        SELECT m.* FROM ({_range("q.status = 'pending'", "due")}
                         UNION ALL {_range("q.status = 'processing' AND q.processing_started_at IS NULL", "lapsed")}) m
        ORDER BY m.due, m.id
        LIMIT $2) c
    LIMIT $2"""


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def plan_of(conn: psycopg.Connection, statement: str) -> list[dict[str, Any]]:
    plan = scalar(conn, statement)
    plan = plan if isinstance(plan, list) else json.loads(plan)
    return list(nodes(plan[0]["Plan"]))


@pytest.fixture(scope="module")
def big_topic(server_dsn, template_name) -> Iterator[str]:
    """One database for the module: 'orders' with 100k scheduled for tomorrow (priorities 0-10)
    and 1k due (priority 0), 'other' with 100k due, and 50k finished rows; analyzed."""
    from tests.conftest import create_database, drop_database

    name = "courier_plans_" + template_name[-10:]
    dsn = create_database(server_dsn, name, template=template_name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT courier.set_setting('max_queue_size', '0')")
        conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{}')")
        conn.execute("SELECT courier.create_endpoint('other', 'pull', '{}')")
        conn.execute(f"""INSERT INTO courier.queue (endpoint_id, payload, scheduled_at, visible_at, priority)
                         SELECT 1, jsonb_build_object('n', g), t, t, g % 11
                         FROM generate_series(1, {FUTURE}) g,
                              LATERAL (SELECT now() + interval '1 day' + g * interval '1 ms' AS t) s""")
        conn.execute(f"""INSERT INTO courier.queue (endpoint_id, payload, visible_at)
                         SELECT 2, jsonb_build_object('n', g), now() - interval '1 hour'
                         FROM generate_series(1, {OTHER}) g""")
        conn.execute("""INSERT INTO courier.queue (endpoint_id, payload, status, visible_at)
                        SELECT 1, '{}', 'completed', now() - interval '2 hours' FROM generate_series(1, 50000)""")
        conn.execute(f"""INSERT INTO courier.queue (endpoint_id, payload, visible_at)
                         SELECT 1, jsonb_build_object('due', g), now() - interval '1 minute'
                         FROM generate_series(1, {DUE}) g""")
        conn.execute("VACUUM ANALYZE courier.queue")
    yield dsn
    drop_database(server_dsn, name)


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
def test_the_candidate_query_walks_the_due_index(big_topic, mode):
    with psycopg.connect(big_topic) as conn:
        conn.execute(f"SET plan_cache_mode = {mode}")
        conn.execute(f"PREPARE candidates(integer, integer) AS {CANDIDATES}")
        plan = plan_of(conn, "EXPLAIN (FORMAT JSON) EXECUTE candidates(1, 100)")
        on_queue = [n for n in plan if n.get("Relation Name") == "queue"]
        assert [n["Node Type"] for n in on_queue] == ["Index Scan", "Index Scan"]
        assert [n["Index Name"] for n in on_queue] == ["queue_pull_due_idx", "queue_pull_leased_idx"]
        for scan in on_queue:  # each range stops at now(): tomorrow's rows unread
            assert "visible_at" in scan["Index Cond"]
        conn.rollback()


def test_future_messages_are_never_read(big_topic):
    with psycopg.connect(big_topic) as conn:
        plan = plan_of(conn, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                             + CANDIDATES.replace("$1", "1").replace("$2", "100"))
        due, lapsed = [n for n in plan if n.get("Relation Name") == "queue"]
        assert plan[0]["Actual Rows"] == 100
        for scan in (due, lapsed):
            assert scan["Actual Loops"] == 11  # one range per priority level, highest first
            assert scan.get("Rows Removed by Filter", 0) == 0  # no level stepped over tomorrow's rows
        assert lapsed["Actual Rows"] == 0  # nothing is leased
        assert due["Shared Hit Blocks"] + due.get("Shared Read Blocks", 0) < 200  # of thousands of pages
        conn.rollback()


def _queue_scans(conn: psycopg.Connection) -> tuple[int, int]:
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("""SELECT t.seq_scan, i.idx_scan FROM pg_stat_user_tables t
                          JOIN pg_stat_user_indexes i ON i.relid = t.relid AND i.indexrelname = 'queue_pull_due_idx'
                          WHERE t.relid = 'courier.queue'::regclass""").fetchone()
    return int(row[0]), int(row[1])


def _queue_scans_over_calls(conn: psycopg.Connection, call: str) -> tuple[int, int]:
    """Sequential and queue_pull_due_idx scans of courier.queue over eight calls of `call` (past
    plpgsql's switch to a generic plan), in a transaction rolled back after."""
    if scalar(conn, "SELECT current_setting('server_version_num')::int") < 150000:
        pytest.skip("pg_stat_force_next_flush() needs PostgreSQL 15")
    seq_before, idx_before = _queue_scans(conn)
    with conn.transaction(force_rollback=True):
        for _ in range(8):
            assert scalar(conn, call) > 0
    seq_after, idx_after = _queue_scans(conn)
    return seq_after - seq_before, idx_after - idx_before


@pytest.mark.parametrize("call", [
    "SELECT count(*) FROM courier.dequeue('orders', 100)",
    "SELECT count(*) FROM courier.dequeue('other', 100)",
    "SELECT count(*) FROM courier.receive('orders', 100)",
    # ack finds its rows by primary key; the dequeue before it walks the due index
    "WITH d AS MATERIALIZED (SELECT id, lease FROM courier.dequeue('other', 100)) "
    "SELECT count(*) FROM courier.ack((SELECT array_agg(id) FROM d), (SELECT array_agg(lease) FROM d)) "
    "WHERE result = 'acked'",
    "SELECT courier.peek('orders')",
    "SELECT courier.peek('other')",
])
def test_the_functions_never_scan_the_queue(big_topic, call):
    with psycopg.connect(big_topic, autocommit=True) as conn:
        seq_scans, index_scans = _queue_scans_over_calls(conn, call)
        assert seq_scans == 0
        assert index_scans >= 8


def _index_scans(conn: psycopg.Connection, index: str) -> int:
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(scalar(conn, "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = %s", (index,)))


@pytest.mark.parametrize("settle", ["ack", "nack", "extend_lease", "release", "snooze"])
def test_settling_looks_the_ids_up_whatever_the_statistics_say(big_topic, settle):
    """The module's statistics were taken with nothing in processing, so the planner expects no
    row to match `status = 'processing'`. An ack (nack, lease extension, release, snooze: each
    finds its leases as ack does, in a plan made once) must still look its ids up, never read
    the in-flight push index (it did: every leased message of every topic)."""
    args = {"ack": "", "nack": ", 'e'", "extend_lease": ", 60", "release": "", "snooze": ", 5"}[settle]
    with psycopg.connect(big_topic, autocommit=True) as conn:
        if scalar(conn, "SELECT current_setting('server_version_num')::int") < 150000:
            pytest.skip("pg_stat_force_next_flush() needs PostgreSQL 15")
        before = _index_scans(conn, "queue_processing_started_idx")
        with conn.transaction(force_rollback=True):
            for _ in range(8):  # past plpgsql's switch to a generic plan
                ids, leases = conn.execute("SELECT array_agg(id), array_agg(lease) "
                                           "FROM courier.dequeue('other', 100)").fetchone()
                results = conn.execute(f"SELECT result FROM courier.{settle}(%s, %s{args})", (ids, leases)).fetchall()
                assert len(results) == 100 and len({r[0] for r in results}) == 1
        assert _index_scans(conn, "queue_processing_started_idx") == before
        # The same statement as ack's, as the planner sees it with these statistics.
        plan = plan_of(conn, "EXPLAIN (FORMAT JSON) DELETE FROM courier.queue q WHERE q.id = ANY ('{1,2,3}'::bigint[]) "
                             "AND q.status = 'processing' AND q.visible_at IS NOT NULL "
                             "AND q.lease = ('{}'::jsonb ->> q.id::text)::integer")
        [scan] = [n for n in plan if n.get("Relation Name") == "queue" and "Scan" in n["Node Type"]]
        assert scan.get("Index Name") in ("queue_pkey", "queue_pull_leased_idx") and "id" in scan["Index Cond"]


@pytest.mark.parametrize("call", [
    "SELECT count(*) FROM courier.dequeue('small', 1)",
    "SELECT count(*) FROM courier.receive('small', 1)",
    "WITH d AS MATERIALIZED (SELECT id, lease FROM courier.dequeue('small', 2)) "
    "SELECT count(*) FROM courier.nack((SELECT array_agg(id) FROM d), (SELECT array_agg(lease) FROM d), 'e')",
    "WITH d AS MATERIALIZED (SELECT id, lease FROM courier.dequeue('small', 2)) "
    "SELECT count(*) FROM courier.extend_lease((SELECT array_agg(id) FROM d), (SELECT array_agg(lease) FROM d), 60)",
    # every lease wrong: lease_lost, which looks the ids up again
    "WITH d AS MATERIALIZED (SELECT id, lease FROM courier.dequeue('small', 2)) "
    "SELECT count(*) FROM courier.ack((SELECT array_agg(id) FROM d), (SELECT array_agg(lease # 1) FROM d))",
    "WITH d AS MATERIALIZED (SELECT id, lease FROM courier.dequeue('small', 2)) "
    "SELECT count(*) FROM courier.release((SELECT array_agg(id) FROM d), (SELECT array_agg(lease) FROM d))",
    "WITH d AS MATERIALIZED (SELECT id, lease FROM courier.dequeue('small', 2)) "
    "SELECT count(*) FROM courier.snooze((SELECT array_agg(id) FROM d), (SELECT array_agg(lease) FROM d), 5)",
    "SELECT courier.peek('small')",
])
def test_a_small_queue_is_not_scanned_either(dsn, call):
    """A queue of a few hundred rows, as a drained topic's often is: the planner would rather
    read its few pages than look the batch's rows up by TID or id, and the generic plan it makes
    then is kept for the session, however far the queue grows before the next ANALYZE. Each
    such scan also read every row of the table (a sixth of a receive(1)'s instructions)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT courier.create_endpoint('small', 'pull', '{}')")
        conn.execute("SELECT courier.enqueue('small', jsonb_build_object('n', g)) FROM generate_series(1, 300) g")
        conn.execute("ANALYZE courier.queue")
        seq_scans, _ = _queue_scans_over_calls(conn, call)
        assert seq_scans == 0


def test_the_expiry_reaper_reads_only_messages_with_an_expiry(big_topic):
    """The expiry reapers (pending messages of every endpoint, leased pull messages) find what
    has expired by index: never a scan of the 250k rows beside them, finished ones included;
    and a message they mark is not marked again."""
    with psycopg.connect(big_topic, autocommit=True) as conn:
        if scalar(conn, "SELECT current_setting('server_version_num')::int") < 150000:
            pytest.skip("pg_stat_force_next_flush() needs PostgreSQL 15")
        seq_before, _ = _queue_scans(conn)
        expiry_before = _index_scans(conn, "queue_expiry_idx")
        with conn.transaction(force_rollback=True):
            leased = [r[0] for r in conn.execute("SELECT id FROM courier.dequeue('other', 2)")]
            pending = [r[0] for r in conn.execute(
                "SELECT id FROM courier.queue WHERE endpoint_id = 2 AND priority = 0 AND visible_at <= now() "
                "AND visible_at IS NOT NULL AND status = 'pending' ORDER BY visible_at, id LIMIT 3")]
            conn.execute("UPDATE courier.queue SET expires_at = now() - interval '1 second' WHERE id = ANY (%s)",
                         (leased + pending,))
            assert scalar(conn, "SELECT courier.run_expiry_reaper()") == 5
            assert scalar(conn, "SELECT courier.run_expiry_reaper()") == 0
            assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'expired'") == 5
        assert _queue_scans(conn)[0] == seq_before
        # The pending reaper, once a run; the leased one may read queue_pull_leased_idx instead.
        assert _index_scans(conn, "queue_expiry_idx") >= expiry_before + 2


@pytest.mark.parametrize("settle", ["ack", "nack", "extend_lease", "release", "snooze"])
def test_a_settle_is_planned_once_a_session_whatever_the_statistics(dsn, settle):
    """A topic whose queue was never analyzed, as a new one's often is: left to choose, plpgsql
    planned ack's statement again in every call (a custom plan looked cheaper than the generic
    one), 142 us of planning in an ack of one that ran in 59. The server prints every plan it
    makes (debug_print_plan): after the first calls of a session, a settle makes none."""
    args = {"ack": "", "nack": ", 'e'", "extend_lease": ", 60", "release": "", "snooze": ", 5"}[settle]
    # Unprepared: the statement that calls the settle is planned in each call, and only it.
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("SELECT courier.create_endpoint('fresh', 'pull', '{}')")
        conn.execute("SELECT courier.enqueue('fresh', jsonb_build_object('n', g)) FROM generate_series(1, 40) g")
        planned: list[str] = []
        conn.add_notice_handler(lambda notice: planned.append(notice.message_primary or ""))

        def settle_one(counted: bool) -> None:
            ids, leases = conn.execute("SELECT array_agg(id), array_agg(lease) "
                                       "FROM courier.dequeue('fresh', 1)").fetchone()
            if counted:
                conn.execute("SET debug_print_plan = on; SET client_min_messages = log")
            assert scalar(conn, f"SELECT count(*) FROM courier.{settle}(%s, %s{args})", (ids, leases)) == 1
            conn.execute("RESET debug_print_plan; RESET client_min_messages")

        for _ in range(8):  # past plpgsql's first plans and its choice between custom and generic
            settle_one(counted=False)
        planned.clear()
        for _ in range(10):
            settle_one(counted=True)
        assert len([p for p in planned if p.startswith("plan")]) == 10
