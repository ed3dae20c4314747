"""Typed API for sending messages and for the worker-side claim/complete/fail primitives."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg

from . import exact_json, queries
from .errors import InvalidInput, NotFound

STATUSES = ("pending", "processing", "completed", "failed", "expired")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class SendOptions:
    """Everything send_with_options() accepts besides the endpoint and the payload."""

    priority: int = 0
    scheduled_at: datetime | None = None
    idempotency_key: str | None = None
    correlation_id: UUID | None = None
    expires_at: datetime | None = None
    ordering_key: str | None = None
    headers: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    max_retries: int | None = None
    """This message's own limit of retries (0-1000), over the endpoint's retry policy; None: the policy's."""
    unique_by_payload: bool = False
    """Deduplicate by the payload itself: the idempotency key is derived from it (River's unique jobs)."""
    unique_period_seconds: int | None = None
    """With unique_by_payload: uniqueness holds within each period of this many seconds."""


@dataclass(frozen=True)
class Message:
    id: int
    endpoint_name: str
    payload: Any
    headers: dict[str, Any]
    metadata: dict[str, Any]
    status: str
    priority: int
    retry_count: int
    next_retry_at: datetime | None
    scheduled_at: datetime | None
    expires_at: datetime | None
    idempotency_key: str | None
    correlation_id: UUID | None
    ordering_key: str | None
    last_error: str | None
    error_history: list[dict[str, Any]]
    created_at: datetime
    completed_at: datetime | None
    key: str | None = None
    lease: int | None = None
    """Pull messages: the lease of the current (or last) dequeue."""
    visible_at: datetime | None = None
    """Pull messages: when it is due, or while processing, when its visibility timeout ends."""

    @property
    def attempts(self) -> int:
        """The attempts made at it: retry_count counts the failed ones (and lapsed leases), so
        a completed message adds the one that succeeded."""
        return self.retry_count + (self.status == "completed")

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every attempt, as a detail shows it: error_history holds the failed ones only (what
        the analytics count as failures), so a completed message's last, successful attempt
        is added here. A message delivered after a 503 showed `completed`, attempts 1, and
        only the 503."""
        if self.status != "completed":
            return self.error_history
        return [*self.error_history, {"attempt": self.attempts, "outcome": "success",
                                      "at": self.completed_at and self.completed_at.isoformat(),
                                      "error": ""}]


@dataclass(frozen=True)
class MessageSummary:
    """One row of a message search: everything but the payload, headers and history."""

    id: int
    endpoint_name: str
    status: str
    priority: int
    retry_count: int
    ordering_key: str | None
    correlation_id: UUID | None
    created_at: datetime
    scheduled_at: datetime | None
    next_retry_at: datetime | None
    last_error: str | None


# Not frozen: a worker builds one for every message it claims, and a frozen dataclass sets each
# of its eighteen fields through object.__setattr__ (1.7 us a message against 0.2, an eighth of
# the worker's CPU draining no-op messages; BENCHMARKS.md, "A claim that readies only what the
# endpoint uses"). Nothing changes one after it is made.
@dataclass(slots=True)
class ClaimedMessage:
    """A message a worker now holds in processing and must complete or fail."""

    id: int
    endpoint_id: int
    endpoint_name: str
    protocol: str
    payload_json: str
    """The payload as JSON text, as stored: what a dispatcher sends."""
    headers: dict[str, Any]
    metadata: dict[str, Any]
    priority: int
    retry_count: int
    max_retries: int
    correlation_id: UUID | None
    ordering_key: str | None
    idempotency_key: str | None
    scheduled_at: datetime | None
    expires_at: datetime | None
    created_at: datetime
    lease: int = 0
    """This claim's lease: reports and releases name it, and are no-ops once it is stale."""
    database_id: UUID | None = None
    """The identity of the database the message lives in (courier.database_identity)."""

    @property
    def payload(self) -> Any:
        return json.loads(self.payload_json)

    @property
    def global_id(self) -> str:
        """The id brokers and receivers deduplicate on: the same for every attempt at this message,
        different for any other message of any database. The id alone repeats across databases
        (and in a restored backup whose sequence went back); the database's identity tells
        databases apart, and the creation time a copy of one database (a restored backup, a
        staging clone) from its original, which share the identity."""
        created = (self.created_at - _EPOCH) // _MICROSECOND
        return f"courier-{self.database_id}-{self.id}-{created}"


def send(conn: psycopg.Connection, endpoint: str, payload: Any,
         options: SendOptions | None = None) -> int:
    """Enqueue one message in the connection's current transaction; returns its id."""
    opts = options or SendOptions()
    return queries.fetch_value(conn, "send_with_options", {
        "endpoint": endpoint,
        "payload": exact_json.jsonb(payload),
        "priority": opts.priority,
        "scheduled_at": opts.scheduled_at,
        "idempotency_key": opts.idempotency_key,
        "correlation_id": opts.correlation_id,
        "expires_at": opts.expires_at,
        "ordering_key": opts.ordering_key,
        "headers": None if opts.headers is None else exact_json.jsonb(opts.headers),
        "metadata": None if opts.metadata is None else exact_json.jsonb(opts.metadata),
        "max_retries": opts.max_retries,
        "unique_by_payload": opts.unique_by_payload,
        "unique_period_seconds": opts.unique_period_seconds,
    })


def send_batch(conn: psycopg.Connection, endpoint: str, payloads: Sequence[Any],
               priority: int = 0) -> list[int]:
    """Enqueue many messages with one INSERT and one NOTIFY; returns their ids in order."""
    ids = queries.fetch_value(conn, "send_batch_with_priority", {
        "endpoint": endpoint, "payloads": [exact_json.jsonb(p) for p in payloads], "priority": priority,
    })
    return list(ids or [])


def get(conn: psycopg.Connection, message_id: int) -> Message:
    row = queries.fetch_one(conn, "get_message", {"id": message_id}, exact=True)  # shown: numbers as stored
    if row is None:
        raise NotFound(f"message {message_id} is not in the queue", "P0002")
    return Message(**row)


def search(conn: psycopg.Connection, *, endpoint: str | None = None, status: str | None = None,
           ordering_key: str | None = None, correlation_id: UUID | None = None,
           limit: int = 100) -> list[MessageSummary]:
    """Active messages (courier.queue) matching every filter given, at most `limit` of them.

    Results come in the order the queue works through them: in flight first (oldest claim
    first), then pending in claim order (priority DESC, then FIFO by id), then finished rows
    not archived yet, newest first. With an ordering key, its pending messages come FIFO, the
    order they will be delivered in. With a correlation id the search also covers the archive
    (one index probe per partition), so a conversation's delivered and dead-lettered messages
    show too, all in the order they were sent.

    Every filter combination is served by the queue's indexes, never by a scan of it (see
    tests/test_console_queries.py). Costs to know: without an ordering key or correlation id,
    pending messages cost one probe of `limit` rows per endpoint; a correlation id shared by
    N messages costs a sort of N (about 100 ms at N = 300k); and filters that an index does
    not serve (endpoint with an ordering key, say) are checked row by row along the index
    that is used. An unknown endpoint matches nothing.
    """
    if status is not None and status not in STATUSES:
        raise InvalidInput(f"unknown message status {status!r}", hint=f"Statuses are {', '.join(STATUSES)}")
    params = {"endpoint": endpoint, "status": status, "ordering_key": ordering_key,
              "correlation_id": correlation_id, "limit": limit}
    if correlation_id is not None:
        name = "search_messages_by_correlation_id"
    elif ordering_key is not None:
        name = "search_messages_by_ordering_key"
    else:
        name = "search_messages"
    return [MessageSummary(**row) for row in queries.fetch_all(conn, name, params)]


def claim_batch(conn: psycopg.Connection, worker_id: str, batch_size: int, endpoint_id: int) -> list[ClaimedMessage]:
    """Claim up to batch_size due messages of one endpoint, as a worker does (circuit breaker
    and rate limit included); each comes with the lease its report must name."""
    rows = queries.fetch_all(conn, "claim_for_endpoint", {
        "worker_id": worker_id, "batch_size": batch_size, "endpoint_id": endpoint_id})
    return [claimed_from_row(row) for row in rows]


CLAIM_COLUMNS = 18
"""The claim queries' first columns (claim_for_endpoint, report_and_claim), in ClaimedMessage's
field order: id to database_id."""
_CLAIM_NAMES = tuple(field.name for field in fields(ClaimedMessage))


def claimed_from_row(row: dict[str, Any]) -> ClaimedMessage:
    """A row of the claim_for_endpoint query, its headers and metadata decoded from JSON text;
    raises (ValueError, RecursionError, ...) for a message that cannot be decoded."""
    return claimed_from_values([row[name] for name in _CLAIM_NAMES])


def claimed_from_values(values: Sequence[Any]) -> ClaimedMessage:
    """The same from a row as a tuple, whose first CLAIM_COLUMNS values are the claim's (the
    worker's claims fetch tuples: a dict per row, then a lookup per field, cost it more than the
    rest of its decoding)."""
    (id_, endpoint_id, endpoint_name, protocol, payload_json, headers, metadata, priority, retry_count, max_retries,
     correlation_id, ordering_key, idempotency_key, scheduled_at, expires_at, created_at, lease,
     database_id) = values[:CLAIM_COLUMNS]
    return ClaimedMessage(id_, endpoint_id, endpoint_name, protocol, payload_json, _json_object(headers),
                          _json_object(metadata), priority, retry_count, max_retries, correlation_id, ordering_key,
                          idempotency_key, scheduled_at, expires_at, created_at, lease, database_id)


def _json_object(text: str) -> Any:
    # Most messages carry no headers or metadata: draining no-op messages, decoding two empty
    # objects per message was a fifth of the worker's CPU.
    return {} if text == "{}" else json.loads(text)


@dataclass(frozen=True)
class ReportCounts:
    delivered: int
    retried: int
    dead_lettered: int
    stale: int
    """Reports refused because the claim's lease had been recovered: no-ops."""


def report_outcomes(conn: psycopg.Connection, claimed: Sequence[ClaimedMessage], outcomes: Sequence[str],
                    errors: Sequence[str | None], retry_after: Sequence[int | None] | None = None) -> ReportCounts:
    """Record one outcome ('success', 'retryable', 'permanent' or 'disable') per claimed message."""
    row = queries.fetch_all(conn, "report_outcomes", {
        "ids": [m.id for m in claimed], "leases": [m.lease for m in claimed], "outcomes": list(outcomes),
        "errors": list(errors), "retry_after": None if retry_after is None else list(retry_after),
        "responses": None})[0]
    return ReportCounts(**row)
