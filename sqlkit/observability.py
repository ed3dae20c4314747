"""Typed API over metrics() and get_endpoint_health()."""

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
