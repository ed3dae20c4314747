"""Small test helpers shared by several test modules."""

from __future__ import annotations

from typing import Any

import psycopg


def scalar(conn: psycopg.Connection, query: str, params: Any = None) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else row[0]


def queue_rows(conn: psycopg.Connection) -> int:
    return scalar(conn, "SELECT count(*) FROM courier.queue")


def claim(conn: psycopg.Connection, batch: int = 10, worker: str = "test") -> list[tuple]:
    """Claim across every endpoint with no circuit or rate limit (claim_batch's inside)."""
    return conn.execute("SELECT id, payload, priority, ordering_key FROM courier._claim_due(%s, %s)",
                        (worker, batch)).fetchall()


def leases(conn: psycopg.Connection, ids: list[int]) -> list[int]:
    """The current lease of each message, as its claim returned it (-1 for one not queued), in the
    queue or where a claim took it in the send stage (migration 0058)."""
    rows = dict(conn.execute("SELECT id, lease FROM courier.queue WHERE id = ANY (%(ids)s) UNION ALL "
                             "SELECT id, lease FROM courier.send_stage WHERE id = ANY (%(ids)s) AND lease IS NOT NULL",
                             {"ids": list(ids)}).fetchall())
    return [rows.get(i, -1) for i in ids]


def report(conn: psycopg.Connection, ids: list[int], outcomes: list[str], errors: list[str | None],
           retry_after: list[int | None] | None = None) -> tuple:
    """report_outcomes as the claim's holder: with the leases the messages hold now."""
    return conn.execute("SELECT * FROM courier.report_outcomes(%s, %s, %s, %s, %s)",
                        (list(ids), leases(conn, ids), outcomes, errors, retry_after)).fetchone()


def complete(conn: psycopg.Connection, ids: list[int]) -> tuple:
    return report(conn, ids, ["success"] * len(ids), [None] * len(ids))


def message_status(conn: psycopg.Connection, message_id: int) -> str | None:
    """A message's status wherever it is: the queue while active, the archive once finished, or
    the send stage (migrations 0054, 0057 and 0058), where it waits pending, or in processing once
    a claim or a dequeue took it there, until the leader moves it into the queue."""
    return scalar(conn, "SELECT status FROM courier.queue WHERE id = %(id)s "
                        "UNION ALL SELECT status FROM courier.archive WHERE id = %(id)s "
                        "UNION ALL SELECT CASE WHEN lease IS NULL THEN 'pending' ELSE 'processing' END "
                        "FROM courier.send_stage WHERE id = %(id)s", {"id": message_id})


def archived(conn: psycopg.Connection, status: str = "completed") -> int:
    return scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = %s", (status,))


def global_id(conn: psycopg.Connection, message_id: int) -> str:
    """The id a message carries for receivers to deduplicate on, as the test expects it:
    courier-<database identity>-<id>-<created_at in microseconds since the epoch>."""
    return scalar(conn, "SELECT format('courier-%%s-%%s-%%s', (SELECT id FROM courier.database_identity), m.id, "
                        "(extract(epoch FROM m.created_at) * 1000000)::bigint) "
                        "FROM (SELECT id, created_at FROM courier.queue UNION ALL "
                        "SELECT id, created_at FROM courier.archive) m WHERE m.id = %s", (message_id,))
