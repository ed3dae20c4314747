"""Typed API for pull topics: the SQL functions of sqlkit/functions/pull.sql, one call each."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from . import exact_json
from .errors import translated

TOPIC_LIMITS = ("max_retries", "message_ttl_seconds", "max_depth", "throughput_limit", "visibility_timeout")
"""The per-topic overrides of a pull endpoint's config; each falls back to a global setting."""


@dataclass(frozen=True)
class LeasedMessage:
    """A dequeued message, held under its lease until visible_until."""

    id: int
    lease: int
    payload: Any
    payload_binary: bytes | None
    body: str | None
    metadata: dict[str, Any]
    key: str | None
    retry_count: int
    max_retries: int
    created_at: datetime
    visible_until: datetime


@dataclass(frozen=True)
class ReceivedMessage:
    """A message taken by a destructive receive: it is gone from the topic."""

    id: int
    payload: Any
    payload_binary: bytes | None
    body: str | None
    metadata: dict[str, Any]
    key: str | None
    created_at: datetime


@dataclass(frozen=True)
class LeaseResult:
    id: int
    result: str


@dataclass(frozen=True)
class Topic:
    topic: str
    enabled: bool
    pending: int
    leased: int
    dead_lettered: int
    next_visibility_deadline: datetime | None
    max_retries: int
    message_ttl_seconds: Decimal
    max_depth: Decimal
    throughput_limit: Decimal
    visibility_timeout: int
    dlq_threshold: Decimal
    paused: bool = False
    """Paused (pause_endpoint): enqueues accepted, dequeue and receive hand out nothing."""


TOPIC_LIMITS = ("max_retries", "message_ttl_seconds", "max_depth", "throughput_limit", "dlq_threshold",
                "visibility_timeout")
"""A topic's own limits (queue-ti's topic config); one left unset takes the global default."""


def create_topic(conn: psycopg.Connection, name: str, limits: dict[str, Any],
                 description: str | None = None) -> int:
    with translated():
        row = conn.execute("SELECT courier.create_endpoint(%s, 'pull', %s, '{}', %s)",
                           (name, Jsonb(limits), description)).fetchone()
    return int(row[0]) if row else 0


def alter_topic(conn: psycopg.Connection, name: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Set the topic's limits in `changes`; a None value reverts that one to the global
    default. Returns the topic's own limits as they are now."""
    with translated():
        row = conn.execute("SELECT courier.alter_topic(%s, %s)", (name, Jsonb(changes))).fetchone()
    return row[0] if row else {}


def topics(conn: psycopg.Connection) -> list[Topic]:
    with translated(), conn.cursor(row_factory=class_row(Topic)) as cur:
        return cur.execute("SELECT * FROM courier.topics()").fetchall()


def enqueue(conn: psycopg.Connection, topic: str, payload: Any, *, key: str | None = None,
            metadata: dict[str, Any] | None = None, payload_binary: bytes | None = None,
            body: str | None = None, scheduled_at: datetime | None = None,
            ttl_seconds: int | None = None, max_retries: int | None = None) -> int:
    """Add a message to the topic; its id. `max_retries` (0-1000) is the message's own limit of
    retries, over the topic's; without `scheduled_at` it is due after the topic's delay_seconds."""
    with translated():
        row = conn.execute(
            "SELECT courier.enqueue(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (topic, None if payload is None else exact_json.jsonb(payload), key,
             None if metadata is None else exact_json.jsonb(metadata), payload_binary, body, scheduled_at, ttl_seconds,
             max_retries),
        ).fetchone()
    return int(row[0]) if row else 0


def enqueue_batch(conn: psycopg.Connection, topic: str, payloads: Sequence[Any], *,
                  metadata: Sequence[dict[str, Any] | None] | None = None,
                  scheduled_at: Sequence[datetime | None] | None = None,
                  ttl_seconds: Sequence[int | None] | None = None,
                  max_retries: Sequence[int | None] | None = None) -> list[int]:
    """Add many messages to the topic in one statement, all or none; their ids, in order. Each
    option, when given, holds one value per payload (None: enqueue()'s default)."""
    with translated():
        row = conn.execute(
            "SELECT courier.enqueue_batch(%s, %s::jsonb[], NULL, %s::jsonb[], %s::timestamptz[], %s::integer[], "
            "%s::integer[])",
            (topic, [exact_json.jsonb(payload) for payload in payloads],
             None if metadata is None else [None if m is None else exact_json.jsonb(m) for m in metadata],
             None if scheduled_at is None else list(scheduled_at), None if ttl_seconds is None else list(ttl_seconds),
             None if max_retries is None else list(max_retries)),
        ).fetchone()
    return [int(i) for i in row[0]]


def dequeue(conn: psycopg.Connection, topic: str, count: int = 1,
            visibility_timeout: int | None = None) -> list[LeasedMessage]:
    """Up to `count` messages under a lease; payloads and metadata keep every number as stored
    (a JsonNumber where no float holds it; exact_json.read_exactly)."""
    with translated(), conn.cursor(row_factory=class_row(LeasedMessage)) as cur:
        exact_json.read_exactly(cur)
        return cur.execute("SELECT * FROM courier.dequeue(%s, %s, %s)",
                           (topic, count, visibility_timeout)).fetchall()


def dequeue_wait(conn: psycopg.Connection, topic: str, count: int = 1, visibility_timeout: int | None = None,
                 wait_seconds: int = 5) -> list[LeasedMessage]:
    """dequeue(), waiting up to `wait_seconds` (0-20) for a message: CALL courier.dequeue_wait,
    the long poll for clients that speak only SQL. It commits between its tries, so `conn` must
    be in autocommit mode (in a transaction, a wait above 0 fails with 2D000); a client that can
    LISTEN, as Consumer does, is woken sooner and polls less."""
    with translated(), conn.cursor() as cur:
        exact_json.read_exactly(cur)
        row = cur.execute("CALL courier.dequeue_wait(%s, %s, %s, %s)",
                          (topic, count, visibility_timeout, wait_seconds)).fetchone()
    return [LeasedMessage(**{**message,
                             "payload_binary": None if message["payload_binary"] is None
                             else base64.b64decode(message["payload_binary"]),
                             "created_at": datetime.fromisoformat(message["created_at"]),
                             "visible_until": datetime.fromisoformat(message["visible_until"])})
            for message in (row[0] if row else [])]


def ack(conn: psycopg.Connection, ids: Sequence[int], leases: Sequence[int]) -> list[LeaseResult]:
    with translated(), conn.cursor(row_factory=class_row(LeaseResult)) as cur:
        return cur.execute("SELECT * FROM courier.ack(%s::bigint[], %s::integer[])",
                           (list(ids), list(leases))).fetchall()


def nack(conn: psycopg.Connection, ids: Sequence[int], leases: Sequence[int],
         error: str | None = None, delay_seconds: int = 0) -> list[LeaseResult]:
    """Retry them (due again after `delay_seconds`), the attempt counted; or the DLQ once out of retries."""
    with translated(), conn.cursor(row_factory=class_row(LeaseResult)) as cur:
        return cur.execute("SELECT * FROM courier.nack(%s::bigint[], %s::integer[], %s, %s::integer)",
                           (list(ids), list(leases), error, delay_seconds)).fetchall()


def snooze(conn: psycopg.Connection, ids: Sequence[int], leases: Sequence[int],
           delay_seconds: int) -> list[LeaseResult]:
    """Back to be taken again after `delay_seconds`, no attempt counted and no error recorded."""
    with translated(), conn.cursor(row_factory=class_row(LeaseResult)) as cur:
        return cur.execute("SELECT id, result FROM courier.snooze(%s::bigint[], %s::integer[], %s::integer)",
                           (list(ids), list(leases), delay_seconds)).fetchall()


def receive(conn: psycopg.Connection, topic: str, count: int = 1) -> list[ReceivedMessage]:
    """Up to `count` messages, taken and deleted; numbers kept as stored, as dequeue() keeps them."""
    with translated(), conn.cursor(row_factory=class_row(ReceivedMessage)) as cur:
        exact_json.read_exactly(cur)
        return cur.execute("SELECT * FROM courier.receive(%s, %s)", (topic, count)).fetchall()


def peek(conn: psycopg.Connection, topic: str) -> int:
    with translated():
        row = conn.execute("SELECT courier.peek(%s)", (topic,)).fetchone()
    return int(row[0]) if row else 0


def requeue(conn: psycopg.Connection, dlq_id: int) -> int:
    with translated():
        row = conn.execute("SELECT courier.requeue(%s)", (dlq_id,)).fetchone()
    return int(row[0]) if row else 0


def dlq_topic(conn: psycopg.Connection, dlq_id: int) -> str | None:
    """The topic a DLQ entry was dead-lettered from (None for a push message's entry)."""
    with translated():
        row = conn.execute("SELECT original_topic FROM courier.dlq WHERE id = %s", (dlq_id,)).fetchone()
    return row[0] if row else None


def run_reaper(conn: psycopg.Connection, reaper: str, batch_size: int = 10_000) -> int:
    """Runs the expiry or delete reaper until it has nothing left; returns the total."""
    function = {"expiry": "courier.run_expiry_reaper", "delete": "courier.run_delete_reaper"}[reaper]
    total = 0
    while True:
        with translated():
            row = conn.execute(f"SELECT {function}(%s)", (batch_size,)).fetchone()
        done = int(row[0]) if row else 0
        total += done
        if done < batch_size:
            return total
