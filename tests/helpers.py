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
    return conn.execute("SELECT id, payload, priority, ordering_key FROM courier.claim_batch_v1(%s, %s)",
                        (worker, batch)).fetchall()


def message_status(conn: psycopg.Connection, message_id: int) -> str | None:
    """A message's status wherever it is: the queue while active, the archive once finished."""
    return scalar(conn, "SELECT status FROM courier.queue WHERE id = %(id)s "
                        "UNION ALL SELECT status FROM courier.archive WHERE id = %(id)s", {"id": message_id})


def archived(conn: psycopg.Connection, status: str = "completed") -> int:
    return scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = %s", (status,))
