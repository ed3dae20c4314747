"""Typed API over publish/subscribe: event types, subscriptions and publish."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from . import exact_json, queries


@dataclass(frozen=True)
class EventType:
    id: int
    name: str
    description: str | None
    created_at: datetime
    subscriptions: list[dict[str, Any]]
    """Each subscriber as {"endpoint": name, "filter": {...}}, by endpoint name."""


def create_event_type(conn: psycopg.Connection, name: str, description: str | None = None) -> int:
    return queries.fetch_value(conn, "create_event_type", {"name": name, "description": description})


def drop_event_type(conn: psycopg.Connection, name: str, force: bool = False) -> None:
    """Drop the event type; with subscriptions left it is refused unless force removes them too."""
    queries.fetch_value(conn, "drop_event_type", {"name": name, "force": force})


def list_event_types(conn: psycopg.Connection) -> list[EventType]:
    return [EventType(**row) for row in queries.fetch_all(conn, "list_event_types")]


def subscribe(conn: psycopg.Connection, event_type: str, endpoint: str,
              filter: dict[str, Any] | None = None) -> int:
    """Subscribe endpoint to the events whose payload contains filter; returns the subscription
    id (the existing one when subscribed already with the same filter)."""
    return queries.fetch_value(conn, "subscribe", {"event_type": event_type, "endpoint": endpoint,
                                                   "filter": Jsonb(filter or {})})


def unsubscribe(conn: psycopg.Connection, event_type: str, endpoint: str) -> bool:
    """False when the endpoint was not subscribed."""
    return queries.fetch_value(conn, "unsubscribe", {"event_type": event_type, "endpoint": endpoint})


def publish(conn: psycopg.Connection, event_type: str, payload: Any, idempotency_key: str | None = None,
            correlation_id: UUID | None = None) -> int:
    """Fan the event out to every matching subscription; returns how many it is queued for."""
    return queries.fetch_value(conn, "publish", {
        "event_type": event_type, "payload": exact_json.jsonb(payload), "idempotency_key": idempotency_key,
        "correlation_id": correlation_id})


def publish_batch(conn: psycopg.Connection, event_type: str, payloads: Sequence[Any]) -> int:
    """Fan every event out with one INSERT and one NOTIFY; returns the number of messages queued."""
    return queries.fetch_value(conn, "publish_batch", {
        "event_type": event_type, "payloads": [exact_json.jsonb(p) for p in payloads]})
