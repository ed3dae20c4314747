"""Vacuum of the hot tables by the maintenance leader, between autovacuum's visits.

Every delivery leaves dead rows in courier.queue and its counter tables. Autovacuum visits a
table at most once per autovacuum_naptime (a minute by default), whatever the table's own
settings say, and not at all on a server where it is off; under sustained churn the queue grew
from 2.7 MB to 265 MB over a million deliveries. The leader therefore vacuums a hot table
itself once enough of it is dead, waiting at most lock_timeout for an autovacuum or DDL that
holds it (then it is left for the next run).
"""

from __future__ import annotations

import logging

import psycopg

from . import queries

log = logging.getLogger("courier.maintenance")

HOT_TABLES = ("queue", "queue_depth", "delivery_totals", "send_stage", "send_stage_batch")
DEAD_ROWS_THRESHOLD = 10_000
"""Dead rows a hot table may hold before the leader vacuums it (and at least a tenth of its
live rows, so that a queue behind a backlog of millions is not vacuumed for every 10k)."""


def vacuum_hot_tables(conn: psycopg.Connection) -> int:
    """VACUUM each hot table with enough dead rows; returns how many were vacuumed. `conn`
    must be in autocommit mode (VACUUM cannot run in a transaction)."""
    if not queries.fetch_value(conn, "may_vacuum_hot_tables"):
        return 0
    conn.execute(queries.query("short_lock_timeout"))
    vacuumed = 0
    for row in queries.fetch_all(conn, "hot_tables_to_vacuum", {"tables": list(HOT_TABLES),
                                                                 "threshold": DEAD_ROWS_THRESHOLD}):
        try:
            conn.execute(queries.query(f"vacuum_{row['table_name']}"))
        except psycopg.errors.LockNotAvailable:
            continue  # an autovacuum or a DDL holds it: next run
        vacuumed += 1
    return vacuumed
