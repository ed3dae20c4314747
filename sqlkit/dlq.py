"""Typed API over the dead-letter queue: browse, summarise, redrive and clean up."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg

from . import queries
from .errors import NotFound


@dataclass(frozen=True)
class DlqEntry:
    """One row of a DLQ listing: what failed, where, when, and whether it was redriven."""

    id: int
    original_message_id: int
    endpoint_name: str
    status: str
    retry_count: int
    last_error: str | None
    correlation_id: UUID | None
    original_created_at: datetime
    failed_at: datetime
    redriven_at: datetime | None
    redriven_message_id: int | None


@dataclass(frozen=True)
class DlqDetail:
    """One DLQ entry in full: the message as it was, and every attempt's error. Producer
    headers are already redacted."""

    id: int
    original_message_id: int
    endpoint_id: int
    endpoint_name: str
    payload: Any
    headers: dict[str, Any]
    metadata: dict[str, Any]
    priority: int
    ordering_key: str | None
    idempotency_key: str | None
    correlation_id: UUID | None
    scheduled_at: datetime | None
    expires_at: datetime | None
    retry_count: int
    last_error: str | None
    error_history: list[dict[str, Any]]
    status: str
    original_created_at: datetime
    failed_at: datetime
    redriven_at: datetime | None
    redriven_message_id: int | None
    # A pull topic's dead letter (<topic>.dlq); None for a push endpoint's.
    original_topic: str | None = None
    dlq_moved_at: datetime | None = None
    max_retries: int | None = None
    key: str | None = None


@dataclass(frozen=True)
class DlqSummary:
    endpoint_name: str
    failed_count: int
    redriven_count: int
    oldest_failure: datetime | None
    newest_failure: datetime | None


def list_entries(conn: psycopg.Connection, endpoint: str | None = None, status: str | None = None,
                 limit: int = 50, after: int | None = None) -> list[DlqEntry]:
    """The newest `limit` entries, optionally of one endpoint and/or status (failed, redriven);
    with `after` (the id the previous page ended with), the `limit` entries listed after it,
    that is older than it: a keyset page, which entries arriving meanwhile do not shift.

    Failed entries come from an index per endpoint that has any (`limit` rows each at most);
    one endpoint's entries from its own index; everything else walks the primary key, so
    `status="redriven"` alone costs as many rows as are newer than the newest redriven one.
    A caller that must know whether more entries follow asks for limit + 1 (see
    list_entries_page).
    """
    params = {"endpoint": endpoint, "status": status, "limit": limit, "after": after}
    if status == "failed":
        name = "list_failed_dlq_page"
    elif endpoint is not None:
        name = "list_dlq_of_endpoint_page"
    else:
        name = "list_dlq_page"
    return [DlqEntry(**row) for row in queries.fetch_all(conn, name, params)]


def list_entries_page(conn: psycopg.Connection, endpoint: str | None = None, status: str | None = None,
                      limit: int = 50, after: int | None = None) -> tuple[list[DlqEntry], bool]:
    """list_entries, and whether more entries follow the page: it reads limit + 1 rows (no
    count of the whole DLQ) and returns `limit` of them."""
    rows = list_entries(conn, endpoint, status, limit + 1, after)
    return rows[:limit], len(rows) > limit


def get(conn: psycopg.Connection, dlq_id: int) -> DlqDetail:
    """One entry in full. Its payload, headers and metadata keep every number as stored: one
    no float holds is a JsonNumber (print them with exact_json.dumps_like)."""
    row = queries.fetch_one(conn, "get_dlq", {"id": dlq_id}, exact=True)
    if row is None:
        raise NotFound(f"DLQ entry {dlq_id} does not exist", "P0002", "List entries with `courier dlq list`")
    return DlqDetail(**row)


def summary(conn: psycopg.Connection) -> list[DlqSummary]:
    """Failed and redriven counts per endpoint name, with the oldest and newest failure."""
    return [DlqSummary(**row) for row in queries.fetch_all(conn, "dlq_summary")]


def failed_count(conn: psycopg.Connection, endpoint: str | None = None) -> int:
    """Entries awaiting redrive, of one endpoint or all, from the maintained dlq_depth counters."""
    return int(queries.fetch_value(conn, "dlq_failed_count", {"endpoint": endpoint}) or 0)


def redrive_message(conn: psycopg.Connection, dlq_id: int) -> int:
    """Queue one failed entry again; returns the new message's id. NotFound for an unknown
    id, WrongState if it was already redriven or its endpoint is gone."""
    return int(queries.fetch_value(conn, "redrive_message", {"id": dlq_id}))


def redrive_batch(conn: psycopg.Connection, endpoint: str | None, batch_size: int = 1000) -> int:
    """Redrive at most batch_size failed entries of one endpoint (None: of every endpoint),
    oldest first, in one short transaction; returns how many. 0 means nothing is left."""
    if endpoint is None:
        done = queries.fetch_value(conn, "redrive_all", {"batch_size": batch_size})
    else:
        done = queries.fetch_value(conn, "redrive_endpoint", {"name": endpoint, "batch_size": batch_size})
    return int(done or 0)


def redrive_everything(conn: psycopg.Connection, endpoint: str | None, batch_size: int = 1000,
                       progress: Callable[[int], None] | None = None) -> int:
    """Redrive batch after batch until none is left, so the queue is never locked for long;
    calls progress(total so far) after each batch and returns the total. On an autocommit
    connection each batch commits on its own, so an interrupted run keeps what it did."""
    total = 0
    while done := redrive_batch(conn, endpoint, batch_size):
        total += done
        if progress is not None:
            progress(total)
    return total


def cleanup_due(conn: psycopg.Connection) -> int:
    """How many entries cleanup() would delete now."""
    return int(queries.fetch_value(conn, "dlq_cleanup_due") or 0)


def cleanup(conn: psycopg.Connection) -> int:
    """Delete entries older than dlq_retention_days; returns how many."""
    return int(queries.fetch_value(conn, "cleanup_dlq") or 0)
