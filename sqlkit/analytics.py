"""Typed reads and writes of the data pipeline's tables (analytics results, exports, the
replay/ingest ledger), over the named queries in sqlkit/pipeline.sql."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from .errors import translated
from .queries import _NAME


@functools.cache
def _all() -> dict[str, str]:
    text = resources.files("sqlkit").joinpath("pipeline.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def query(name: str, relation: tuple[str, str] | None = None, **parts: sql.Composable) -> sql.Composable:
    """The named query; {relation} is filled with a quoted schema-qualified table name, and
    any other {name} with the composed SQL given for it (e.g. a WHERE clause's conditions)."""
    text = sql.SQL(_all()[name])  # type: ignore[arg-type]
    if relation:
        parts = {**parts, "relation": sql.Identifier(*relation)}
    return text.format(**parts) if parts else text


def rows(conn: psycopg.Connection, name: str, params: Any = None,
         relation: tuple[str, str] | None = None, **parts: sql.Composable) -> list[dict[str, Any]]:
    with translated(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query(name, relation, **parts), params)
        return cur.fetchall() if cur.description else []


def value(conn: psycopg.Connection, name: str, params: Any = None,
          relation: tuple[str, str] | None = None, **parts: sql.Composable) -> Any:
    with translated(), conn.cursor() as cur:
        cur.execute(query(name, relation, **parts), params)
        row = cur.fetchone() if cur.description else None
        return None if row is None else row[0]


@dataclass(frozen=True)
class HourlyStats:
    """One endpoint's outcomes in one UTC hour, as the analytics job computed them."""
    endpoint_id: int
    endpoint: str
    hour: datetime
    delivered: int
    failed: int
    expired: int
    dead_lettered: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True)
class AnalyticsRun:
    id: int
    range_from: datetime | None
    range_to: datetime
    master: str
    rows_read: int
    endpoints: list[dict[str, Any]]
    started_at: datetime
    finished_at: datetime


@dataclass(frozen=True)
class ArchiveExport:
    month: datetime
    location: str
    rows: int
    checksum: str
    exported_at: datetime
    dropped_at: datetime | None


def hourly(conn: psycopg.Connection, since: datetime) -> list[HourlyStats]:
    """Every endpoint's hourly results from `since` on, oldest hour first."""
    return [HourlyStats(**row) for row in rows(conn, "analytics_hourly", {"since": since})]


def latest_run(conn: psycopg.Connection) -> AnalyticsRun | None:
    found = rows(conn, "latest_analytics_run")
    return AnalyticsRun(**found[0]) if found else None


def archive_export(conn: psycopg.Connection, month: datetime) -> ArchiveExport | None:
    found = rows(conn, "archive_export", {"month": month})
    return ArchiveExport(**found[0]) if found else None


def table_columns(conn: psycopg.Connection, relation: str) -> list[tuple[str, str]]:
    return [(row["name"], row["type"]) for row in rows(conn, "table_columns", {"relation": relation})]


def endpoint_names(conn: psycopg.Connection) -> dict[int, str]:
    return {row["id"]: row["name"] for row in rows(conn, "endpoint_names")}
