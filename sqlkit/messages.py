"""Typed API for sending messages and for the worker-side claim/complete/fail primitives."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from . import queries
from .errors import NotFound


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


@dataclass(frozen=True)
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

    @property
    def payload(self) -> Any:
        return json.loads(self.payload_json)


@dataclass(frozen=True)
class FailedAttempt:
    message_id: int
    error: str
    next_attempt_at: datetime | None = field(default=None)


def send(conn: psycopg.Connection, endpoint: str, payload: Any,
         options: SendOptions | None = None) -> int:
    """Enqueue one message in the connection's current transaction; returns its id."""
    opts = options or SendOptions()
    return queries.fetch_value(conn, "send_with_options", {
        "endpoint": endpoint,
        "payload": Jsonb(payload),
        "priority": opts.priority,
        "scheduled_at": opts.scheduled_at,
        "idempotency_key": opts.idempotency_key,
        "correlation_id": opts.correlation_id,
        "expires_at": opts.expires_at,
        "ordering_key": opts.ordering_key,
        "headers": None if opts.headers is None else Jsonb(opts.headers),
        "metadata": None if opts.metadata is None else Jsonb(opts.metadata),
    })


def send_batch(conn: psycopg.Connection, endpoint: str, payloads: Sequence[Any],
               priority: int = 0) -> list[int]:
    """Enqueue many messages with one INSERT and one NOTIFY; returns their ids in order."""
    ids = queries.fetch_value(conn, "send_batch_with_priority", {
        "endpoint": endpoint, "payloads": [Jsonb(p) for p in payloads], "priority": priority,
    })
    return list(ids or [])


def get(conn: psycopg.Connection, message_id: int) -> Message:
    row = queries.fetch_one(conn, "get_message", {"id": message_id})
    if row is None:
        raise NotFound(f"message {message_id} is not in the queue", "P0002")
    return Message(**row)


def claim_batch(conn: psycopg.Connection, worker_id: str, batch_size: int,
                endpoint_id: int | None = None) -> list[ClaimedMessage]:
    rows = queries.fetch_all(conn, "claim_batch", {
        "worker_id": worker_id, "batch_size": batch_size, "endpoint_id": endpoint_id,
    })
    return [ClaimedMessage(**row) for row in rows]


def complete_batch(conn: psycopg.Connection, message_ids: Sequence[int]) -> int:
    return queries.fetch_value(conn, "complete_batch", {"ids": list(message_ids)})


def fail_batch(conn: psycopg.Connection, attempts: Sequence[FailedAttempt]) -> int:
    return queries.fetch_value(conn, "fail_batch", {
        "ids": [a.message_id for a in attempts],
        "errors": [a.error for a in attempts],
        "next_attempt_at": [a.next_attempt_at for a in attempts],
    })
