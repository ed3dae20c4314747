"""Dequeue, receive, peek and the push claim walk only the priority levels an endpoint has used
(migration 0039): a topic whose messages are all priority 0 is read in one index range, not
eleven, and a level is walked from the first message that brings it."""

from __future__ import annotations

import psycopg

from sqlkit import migrate

PRIORITIES = "SELECT priorities FROM courier.endpoints WHERE name = %s"


def _plan(conn: psycopg.Connection, statement: str) -> list[dict]:
    with conn.transaction(force_rollback=True):
        plan = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}").fetchone()[0]
    return plan[0]["Plan"]


def _buffers(conn: psycopg.Connection, statement: str) -> int:
    top = _plan(conn, statement)
    return top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)


def test_a_topic_of_priority_zero_messages_is_read_in_one_range(conn: psycopg.Connection):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull', '{}')")
    conn.execute("SELECT courier.send_batch('jobs', array_agg(jsonb_build_object('n', g))) "
                 "FROM generate_series(1, 50) g")
    assert conn.execute(PRIORITIES, ("jobs",)).fetchone()[0] == 1
    for _ in range(3):  # plans cached, catalogs read
        conn.execute("SELECT count(*) FROM courier.receive('jobs', 1)")
    one_level = _buffers(conn, "SELECT * FROM courier.receive('jobs', 1)")
    conn.execute("UPDATE courier.endpoints SET priorities = 2047 WHERE name = 'jobs'")  # as before: all eleven
    every_level = _buffers(conn, "SELECT * FROM courier.receive('jobs', 1)")
    assert one_level + 5 <= every_level, (one_level, every_level)  # a descent or more per empty level


def test_a_new_level_is_walked_from_its_first_message(conn: psycopg.Connection):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull', '{}')")
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    conn.execute("SELECT courier.send('jobs', '{\"p\": 0}')")
    conn.execute("SELECT courier.send_with_options('jobs', '{\"p\": 7}', p_priority := 7)")
    conn.execute("SELECT courier.send_batch_with_priority('jobs', ARRAY['{\"p\": 3}'::jsonb], 3)")
    conn.execute("SELECT courier.send_with_options('hook', '{}', p_priority := 9, "
                 "p_scheduled_at := now() - interval '1 second')")
    assert conn.execute(PRIORITIES, ("jobs",)).fetchone()[0] == 1 | 1 << 7 | 1 << 3
    assert conn.execute(PRIORITIES, ("hook",)).fetchone()[0] == 1 | 1 << 9
    assert conn.execute("SELECT courier.peek('jobs')").fetchone()[0] == 3
    taken = conn.execute("SELECT payload ->> 'p' FROM courier.dequeue('jobs', 2, 60)").fetchall()
    assert [p for (p,) in taken] == ["7", "3"]
    assert [p for (p,) in conn.execute("SELECT payload ->> 'p' FROM courier.receive('jobs', 5)")] == ["0"]
    # The push claim's due range of level 9 (a scheduled message is claimed from queue_due_idx).
    claimed = conn.execute("SELECT priority FROM courier.claim_batch('w', 10, "
                           "(SELECT id FROM courier.endpoints WHERE name = 'hook'))").fetchall()
    assert claimed == [(9,)]


def test_migrating_marks_the_levels_messages_already_use(empty_dsn: str):
    migrate.migrate(empty_dsn, target=38)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:  # the tables only: functions come with the head
        conn.execute("INSERT INTO courier.endpoints (name, protocol) VALUES ('jobs', 'pull'), ('plain', 'pull')")
        conn.execute("INSERT INTO courier.queue (endpoint_id, payload, priority, visible_at) "
                     "SELECT id, '{}', CASE name WHEN 'jobs' THEN 4 ELSE 0 END, now() FROM courier.endpoints")
    migrate.migrate(empty_dsn)
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert conn.execute(PRIORITIES, ("jobs",)).fetchone()[0] == 1 | 1 << 4
        assert conn.execute(PRIORITIES, ("plain",)).fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM courier.receive('jobs', 5)").fetchone()[0] == 1
