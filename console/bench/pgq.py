"""PgQ, the queue Skype built (Debian's `postgresql-15-pgq3`), which `courier bench cost` counts
beside Courier and pgmq where the server has the extension: how near the physical limit a
PostgreSQL queue gets when it trades per-message state for batches.

Producers call `pgq.insert_event()`; a ticker cuts the event stream into batches by transaction
snapshots; a consumer takes a whole batch (`next_batch`, `get_batch_events`, `finish_batch`, one
transaction) and keeps no state per event, and event tables are retired by rotation. So a batch
of the bench is one tick's events: the fill inserts a unit's messages, commits, and ticks (the
queue ticks on every new event here, `ticker_max_count` 1), and a consuming unit takes one batch
in one statement through a helper function, as a PgQ consumer does in one transaction.
"""

from __future__ import annotations

import psycopg

from sqlkit.connection import connect

QUEUE = "bench_cost"
CONSUMER = "bench"
TAKE_BATCH = """
CREATE OR REPLACE FUNCTION public.bench_pgq_take(p_queue text, p_consumer text) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_batch bigint := pgq.next_batch(p_queue, p_consumer);
    v_events integer;
BEGIN
    IF v_batch IS NULL THEN
        RETURN 0;
    END IF;
    SELECT count(*) INTO v_events FROM pgq.get_batch_events(v_batch);
    PERFORM pgq.finish_batch(v_batch);
    RETURN v_events;
END
$$"""


def available(conn: psycopg.Connection) -> bool:
    """The server has PgQ's extension files (installing it is the administrator's choice)."""
    found = conn.execute("SELECT EXISTS (SELECT FROM pg_available_extensions WHERE name = 'pgq')").fetchone()[0]
    conn.commit()
    return bool(found)


def version(conn: psycopg.Connection) -> str:
    found = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'pgq'").fetchone()
    conn.commit()
    return found[0] if found else ""


def install(dsn: str) -> bool:
    """PgQ in the database, its queue and the consuming helper (the consumer is registered by
    each fill); False (nothing done) where the server has no PgQ or the role may not create the
    extension."""
    with connect(dsn) as conn:
        if not available(conn):
            return False
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pgq")
            conn.commit()
        except psycopg.Error:
            conn.rollback()
            return False
        if not conn.execute("SELECT EXISTS (SELECT FROM pgq.queue WHERE queue_name = %s)", (QUEUE,)).fetchone()[0]:
            conn.execute("SELECT pgq.create_queue(%s)", (QUEUE,))
        conn.execute("SELECT pgq.set_queue_config(%s, 'ticker_max_count', '1')", (QUEUE,))
        conn.execute(TAKE_BATCH)
        conn.commit()
    return True


def fill(conn: psycopg.Connection, batches: int, per_batch: int) -> None:
    """Drop what the queue holds (a consumer registered again starts at the next tick), then make
    `batches` batches of `per_batch` events, each committed and ticked on its own."""
    conn.execute("SELECT pgq.unregister_consumer(%s, %s)", (QUEUE, CONSUMER))
    conn.execute("SELECT pgq.ticker(%s)", (QUEUE,))
    conn.commit()
    conn.execute("SELECT pgq.register_consumer(%s, %s)", (QUEUE, CONSUMER))
    conn.commit()
    for _ in range(batches):
        conn.execute("SELECT pgq.insert_event(%s, 'bench', jsonb_build_object('n', g)::text) "
                     "FROM generate_series(1, %s::int) g", (QUEUE, per_batch))
        conn.commit()
        conn.execute("SELECT pgq.ticker(%s)", (QUEUE,))
        conn.commit()
