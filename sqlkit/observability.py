"""Typed API over what an operator watches: metrics(), delivery totals, endpoint health,
health checks, worker heartbeats and the event log."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

import psycopg

from . import queries, schedules
from .schedules import LateSchedule


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
class DeliveryTotals:
    """An endpoint's cumulative outcomes since installation; rates are deltas between reads."""

    delivered: int
    failed_attempts: int
    dead_lettered: int
    expired: int
    replayed: int


def delivery_totals(conn: psycopg.Connection) -> dict[str, DeliveryTotals]:
    """Every endpoint's outcome counters, keyed by endpoint name, from the maintained
    courier.delivery_totals rows: a few rows per endpoint however busy the queue is."""
    return {row.pop("endpoint_name"): DeliveryTotals(**row) for row in queries.fetch_all(conn, "delivery_totals")}


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
    connected: bool | None = None
    """Whether one of its database sessions is still there (None: not known); a killed worker
    has none, long before its heartbeat is old."""

    HEARTBEAT_SECONDS: ClassVar[int] = 30
    """A heartbeat older than this is a worker no longer heard from, as get_worker_status() says."""

    def shown_state(self, now: datetime) -> str:
        """The state as `now` sees it: 'lost' once its sessions are gone (or the database found
        them gone), 'stale' once its heartbeat is old; else the state it reported. The console
        asks with its own clock; `alive` is the same judgement by the database's."""
        if self.state == "lost" or (self.connected is False and self.state in ("running", "draining")):
            return "lost"
        heard = (now - self.last_heartbeat).total_seconds()
        if self.state in ("running", "draining") and heard > self.HEARTBEAT_SECONDS:
            return "stale"
        return self.state

    def alive_at(self, now: datetime) -> bool:
        return self.shown_state(now) in ("running", "draining")


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


def worker_protocols(conn: psycopg.Connection) -> tuple[dict[str, int], int]:
    """The protocols live workers can deliver, with how many can each, and how many live
    workers said (0: nothing is known, e.g. none is running)."""
    rows = conn.execute("SELECT protocol, workers, known FROM courier.worker_protocols()").fetchall()
    return {protocol: workers for protocol, workers, _ in rows}, (rows[0][2] if rows else 0)


def worker_status(conn: psycopg.Connection) -> list[WorkerStatus]:
    return [WorkerStatus(**row) for row in queries.fetch_all(conn, "worker_status")]


def latest_events(conn: psycopg.Connection, limit: int, event_type: str | None = None,
                  endpoint: str | None = None) -> list[Event]:
    """The newest `limit` events (oldest of them first); event_type matches as a prefix."""
    params = {"limit": limit, "event_type": event_type, "endpoint": endpoint}
    return [Event(**row) for row in queries.fetch_all(conn, "latest_events", params)]


def latest_events_page(conn: psycopg.Connection, limit: int, event_type: str | None = None,
                       endpoint: str | None = None) -> tuple[list[Event], bool]:
    """latest_events, and whether older events match too (read as one more row, not counted)."""
    rows = latest_events(conn, limit + 1, event_type, endpoint)
    return rows[-limit:], len(rows) > limit


def events_after(conn: psycopg.Connection, after: int, event_type: str | None = None,
                 endpoint: str | None = None, limit: int = 1000) -> list[Event]:
    """The first `limit` events after id `after`, oldest first: a keyset page of the log."""
    params = {"after": after, "limit": limit, "event_type": event_type, "endpoint": endpoint}
    return [Event(**row) for row in queries.fetch_all(conn, "events_after", params)]


def events_after_page(conn: psycopg.Connection, after: int, limit: int, event_type: str | None = None,
                      endpoint: str | None = None) -> tuple[list[Event], bool]:
    """events_after, and whether more events follow the page (read as one more row)."""
    rows = events_after(conn, after, event_type, endpoint, limit + 1)
    return rows[:limit], len(rows) > limit


CIRCUIT_STATES = {0: "closed", 1: "half_open", 2: "open"}


@dataclass
class EndpointDepth:
    endpoint: str
    enabled: bool = True
    circuit: str = "closed"
    pending: int = 0
    processing: int = 0
    dlq_failed: int = 0
    paused: bool = False


@dataclass(frozen=True)
class QueueStatus:
    """What `courier status` shows: one metrics() read plus health checks, heartbeats and the
    periodic schedules that are late."""

    queue_depth: dict[str, int]
    oldest_pending_age_seconds: float
    dlq_depth: int
    endpoints: list[EndpointDepth]
    workers: list[WorkerStatus]
    health: list[HealthCheck] = field(default_factory=list)
    late_schedules: list[LateSchedule] = field(default_factory=list)


def queue_status(conn: psycopg.Connection) -> QueueStatus:
    depth_by_status: dict[str, int] = {}
    by_endpoint: dict[str, EndpointDepth] = {}
    oldest = 0.0
    for m in metrics(conn):
        name = m.labels.get("endpoint")
        endpoint = by_endpoint.setdefault(name, EndpointDepth(name)) if name is not None else None
        status = m.labels.get("status")
        if m.metric_name == "queue_depth":
            depth_by_status[status] = int(m.metric_value)
        elif m.metric_name == "queue_depth_by_endpoint" and status in ("pending", "processing"):
            setattr(endpoint, status, int(m.metric_value))
        elif m.metric_name == "dlq_depth" and status == "failed":
            endpoint.dlq_failed = int(m.metric_value)
        elif m.metric_name == "endpoint_circuit_state":
            endpoint.circuit = CIRCUIT_STATES.get(int(m.metric_value), "?")
        elif m.metric_name == "endpoint_enabled":
            endpoint.enabled = bool(m.metric_value)
        elif m.metric_name == "endpoint_paused":
            endpoint.paused = bool(m.metric_value)
        elif m.metric_name == "oldest_message_age_seconds":
            oldest = m.metric_value
    endpoints = sorted(by_endpoint.values(), key=lambda e: e.endpoint)
    return QueueStatus(depth_by_status, oldest, sum(e.dlq_failed for e in endpoints), endpoints,
                       worker_status(conn), health_check(conn), schedules.late(conn))
