"""Typed API over the verbs users of other queues expect (issue 42): cancel a message (River's
JobCancel), purge an endpoint's pending messages or its DLQ (pgmq's purge_queue, SQS
PurgeQueue), and delete a message by id without a lease (pgmq's delete). Each is one call of
the SQL function of the same name in functions/verbs.sql, which decides everything.

`actor` says on whose behalf (a token's name, an operating-system user): it goes into the
event log's details as "by", beside the database role the event log records anyway."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from . import queries


@dataclass(frozen=True)
class Cancelled:
    """A message cancel took out of the queue (to the archive as cancelled)."""

    id: int
    endpoint_name: str
    was: str
    """Its state before: pending, scheduled, retrying or processing (its delivery was under way
    and its outcome will be discarded); cancelled when it had been cancelled before."""


def cancel(conn: psycopg.Connection, message_id: int, actor: str | None = None) -> Cancelled:
    """Cancel one message by id. NotFound for an unknown id, WrongState for one that finished."""
    row = queries.fetch_one(conn, "cancel_message", {"id": message_id, "actor": actor})
    assert row is not None  # the function returns a row or raises
    return Cancelled(**row)


def cancel_by_key(conn: psycopg.Connection, endpoint: str, key: str, actor: str | None = None) -> list[Cancelled]:
    """Cancel the active message of `endpoint` (a push endpoint or a pull topic) whose idempotency
    key or pull key is `key`. NotFound when there is none."""
    rows = queries.fetch_all(conn, "cancel_message_by_key", {"endpoint": endpoint, "key": key, "actor": actor})
    return [Cancelled(**row) for row in rows]


def delete(conn: psycopg.Connection, message_id: int, actor: str | None = None) -> str:
    """Delete one message outright, in any state but processing; returns its state before.
    Nothing is archived; the event log keeps the deletion (message.deleted)."""
    return str(queries.fetch_value(conn, "delete_message", {"id": message_id, "actor": actor}))


def purge_count(conn: psycopg.Connection, endpoint: str, dlq: bool = False) -> int:
    """How many messages purge() would take now (from the depth counters: no count(*))."""
    return int(queries.fetch_value(conn, "purge_queue_count", {"endpoint": endpoint, "dlq": dlq}) or 0)


def purge(conn: psycopg.Connection, endpoint: str, *, dlq: bool = False, archive: bool = True,
          actor: str | None = None) -> int:
    """Remove every pending message of `endpoint` (never one in processing), to the archive as
    purged, or dropped with archive=False; with dlq=True (or a name ending in .dlq) its DLQ's
    failed entries instead. Returns how many."""
    return int(queries.fetch_value(conn, "purge_queue", {"endpoint": endpoint, "dlq": dlq, "archive": archive,
                                                         "actor": actor}) or 0)
