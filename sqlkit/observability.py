"""Typed API over what an operator watches: metrics(), endpoint health, health checks,
worker heartbeats and the event log."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from . import queries


@dataclass(frozen=True)
class Metric:
    metric_name: str
    metric_value: float
    labels: dict[str, Any]
    metric_type: str


@dataclass(frozen=True)
class EndpointHealth:
    endpoint_name: str
    protocol: str
    enabled: bool
    circuit_state: str
    circuit_failure_count: int
    last_success_at: datetime | None
    last_failure_at: datetime | None
    pending_messages: int
    oldest_pending_message: datetime | None


def metrics(conn: psycopg.Connection) -> list[Metric]:
    return [Metric(**row) for row in queries.fetch_all(conn, "metrics")]


def endpoint_health(conn: psycopg.Connection, name: str | None = None) -> list[EndpointHealth]:
    return [EndpointHealth(**row) for row in queries.fetch_all(conn, "endpoint_health", {"name": name})]


@dataclass(frozen=True)
class HealthCheck:
    check_name: str
    status: str
    value: float
    detail: str


@dataclass(frozen=True)
class WorkerStatus:
    worker_id: str
    hostname: str
    pid: int
    state: str
    concurrency: int
    in_flight: int
    delivered: int
    failed: int
    started_at: datetime
    last_heartbeat: datetime
    alive: bool
    maintenance_leader: bool


@dataclass(frozen=True)
class Event:
    id: int
    created_at: datetime
    event_type: str
    endpoint: str | None
    actor: str
    details: dict[str, Any]


def health_check(conn: psycopg.Connection) -> list[HealthCheck]:
    return [HealthCheck(**row) for row in queries.fetch_all(conn, "health_check")]


def worker_status(conn: psycopg.Connection) -> list[WorkerStatus]:
    return [WorkerStatus(**row) for row in queries.fetch_all(conn, "worker_status")]


def latest_events(conn: psycopg.Connection, limit: int, event_type: str | None = None,
                  endpoint: str | None = None) -> list[Event]:
    """The newest `limit` events (oldest of them first); event_type matches as a prefix."""
    params = {"limit": limit, "event_type": event_type, "endpoint": endpoint}
    return [Event(**row) for row in queries.fetch_all(conn, "latest_events", params)]


def events_after(conn: psycopg.Connection, after: int, event_type: str | None = None,
                 endpoint: str | None = None, limit: int = 1000) -> list[Event]:
    params = {"after": after, "limit": limit, "event_type": event_type, "endpoint": endpoint}
    return [Event(**row) for row in queries.fetch_all(conn, "events_after", params)]
