"""Typed API over the endpoint functions: create, alter, drop, enable, disable, pause, resume,
list, and reset a circuit breaker."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from . import queries
from .errors import NotFound


@dataclass(frozen=True)
class Endpoint:
    """An endpoint as operators see it; config secrets are already redacted."""

    id: int
    name: str
    protocol: str
    config: dict[str, Any]
    retry_policy: dict[str, Any]
    description: str | None
    enabled: bool
    circuit_state: str
    circuit_failure_count: int
    last_success_at: datetime | None
    last_failure_at: datetime | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    pending_messages: int
    processing_messages: int
    next_lease_deadline: datetime | None = None
    """Pull topics: when the first visibility timeout still running ends."""
    paused_at: datetime | None = None
    """When it was paused (pause_endpoint): sends accepted, nothing claimed or dequeued."""

    @property
    def paused(self) -> bool:
        return self.paused_at is not None


def create(conn: psycopg.Connection, name: str, protocol: str, config: dict[str, Any],
           retry_policy: dict[str, Any] | None = None, description: str | None = None) -> int:
    return queries.fetch_value(conn, "create_endpoint", {
        "name": name, "protocol": protocol, "config": Jsonb(config),
        "retry_policy": Jsonb(retry_policy or {}), "description": description,
    })


def alter(conn: psycopg.Connection, name: str, config: dict[str, Any] | None = None,
          retry_policy: dict[str, Any] | None = None, description: str | None = None) -> None:
    queries.fetch_value(conn, "alter_endpoint", {
        "name": name,
        "config": None if config is None else Jsonb(config),
        "retry_policy": None if retry_policy is None else Jsonb(retry_policy),
        "description": description,
    })


def drop(conn: psycopg.Connection, name: str, force: bool = False) -> None:
    queries.fetch_value(conn, "drop_endpoint", {"name": name, "force": force})


def enable(conn: psycopg.Connection, name: str) -> bool:
    """Enable the endpoint; False if it was already enabled."""
    return queries.fetch_value(conn, "enable_endpoint", {"name": name})


def disable(conn: psycopg.Connection, name: str) -> bool:
    """Disable the endpoint; False if it was already disabled."""
    return queries.fetch_value(conn, "disable_endpoint", {"name": name})


def pause(conn: psycopg.Connection, name: str) -> bool:
    """Pause the endpoint or topic: sends go on, claims, dequeues and receives stop; False if
    it was already paused. NotFound for an unknown name."""
    return queries.fetch_value(conn, "pause_endpoint", {"name": name})


def resume(conn: psycopg.Connection, name: str) -> bool:
    """Resume a paused endpoint or topic; False if it was not paused."""
    return queries.fetch_value(conn, "resume_endpoint", {"name": name})


def reset_circuit(conn: psycopg.Connection, name: str) -> None:
    """Force the endpoint's circuit breaker back to closed (logged as circuit.reset); NotFound
    for an unknown endpoint."""
    queries.fetch_value(conn, "reset_circuit_breaker", {"name": name})


def validate_config(conn: psycopg.Connection, protocol: str, config: dict[str, Any]) -> None:
    """Raise InvalidInput with the database's reason unless config suits protocol."""
    queries.fetch_value(conn, "validate_endpoint_config", {"protocol": protocol, "config": Jsonb(config)})


def list_all(conn: psycopg.Connection) -> list[Endpoint]:
    return [Endpoint(**row) for row in queries.fetch_all(conn, "list_endpoints", {"name": None})]


def get(conn: psycopg.Connection, name: str) -> Endpoint:
    rows = queries.fetch_all(conn, "list_endpoints", {"name": name})
    if not rows:
        raise NotFound(f'endpoint "{name}" does not exist', "P0002",
                       "List endpoints with `courier endpoint list`")
    return Endpoint(**rows[0])
