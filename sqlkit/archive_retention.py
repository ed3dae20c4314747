"""Archive retention that does not stall delivery.

cleanup_old_archive_partitions() never waits long for a lock (see its comment in
functions/archive.sql): a partition a long reader holds is reported busy and kept. This drives
it: it calls again after a pause while partitions past retention remain, until `budget`
seconds have passed, and leaves the rest for the next run.
"""

from __future__ import annotations

import time

import psycopg

from . import queries

LOCK_NOT_AVAILABLE = "55P03"


def drop_expired_partitions(conn: psycopg.Connection, retention_months: int | None = None, *,
                            budget: float = 30.0, pause: float = 0.5) -> int:
    """Drop the archive partitions past retention (default: the setting); returns how many."""
    params = {"retention_months": retention_months}
    deadline = time.monotonic() + budget
    dropped = 0
    while True:
        dropped += int(queries.fetch_value(conn, "cleanup_old_archive_partitions_for", params) or 0)
        if not queries.fetch_all(conn, "archive_partitions_past_retention", params) \
                or time.monotonic() + pause > deadline:
            return dropped
        time.sleep(pause)
