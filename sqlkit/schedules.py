"""Periodic schedules (issue 42): a cron expression read in a time zone, the endpoint or topic
it sends to, and the message each tick sends. The SQL functions in functions/schedules.sql
decide everything, checks included; the maintenance leader sends the ticks
(courier.run_due_schedules()). A tick's message carries the tick's time in its metadata as
courier_tick (and the schedule's name as courier_schedule)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import psycopg
from psycopg.types.json import Jsonb

from . import exact_json, queries
from .errors import NotFound

LATE_AFTER = timedelta(seconds=90)
"""How overdue a running schedule's next tick may be before it is late: courier._schedule_late_after(),
for a reader with a clock of its own (the console's; a test checks the two agree)."""


@dataclass(frozen=True)
class Schedule:
    name: str
    endpoint_name: str
    protocol: str
    cron: str
    time_zone: str
    catch_up: str
    """skip: after an outage at most the latest missed tick, if no older than grace_seconds;
    all: every missed tick, oldest first, at most catch_up_limit."""
    catch_up_limit: int
    grace_seconds: int
    description: str | None
    paused_at: datetime | None
    next_run_at: datetime
    last_tick_at: datetime | None
    last_sent_at: datetime | None
    last_message_id: int | None
    sent_ticks: int
    skipped_ticks: int
    last_error: str | None
    last_error_at: datetime | None
    late: bool
    """Running, and its next tick is overdue: no worker runs the maintenance leader, or every
    attempt fails (last_error)."""
    created_at: datetime

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def state(self) -> str:
        if self.paused:
            return "paused"
        if self.late:
            return "failing" if self.last_error else "late"
        return "running"

    def late_at(self, now: datetime) -> bool:
        """Whether it is late by the clock `now` (`late` is the database's judgement at its now)."""
        return not self.paused and self.next_run_at < now - LATE_AFTER

    def shown_state(self, now: datetime) -> str:
        """state, judged by the clock `now`: the console asks with its own clock, as it does of workers."""
        if self.paused:
            return "paused"
        if self.late_at(now):
            return "failing" if self.last_error else "late"
        return "running"


@dataclass(frozen=True)
class LateSchedule(Schedule):
    """A late (or failing) schedule as `courier status` shows it, with how late by the database's clock."""

    late_seconds: float


def create(conn: psycopg.Connection, name: str, cron: str, endpoint: str, payload: Any = None, *,
           time_zone: str = "UTC", headers: dict[str, str] | None = None, metadata: dict[str, Any] | None = None,
           priority: int = 0, ordering_key: str | None = None, catch_up: str = "skip", catch_up_limit: int = 100,
           grace_seconds: int = 600, description: str | None = None, replace: bool = False) -> int:
    """Create schedule `name` (or with replace=True change it); returns its id."""
    body = exact_json.jsonb({} if payload is None else payload)
    return int(queries.fetch_value(conn, "create_schedule", {
        "name": name, "cron": cron, "endpoint": endpoint, "payload": body,
        "time_zone": time_zone, "headers": Jsonb(headers) if headers is not None else None,
        "metadata": exact_json.jsonb(metadata) if metadata is not None else None, "priority": priority,
        "ordering_key": ordering_key, "catch_up": catch_up, "catch_up_limit": catch_up_limit,
        "grace_seconds": grace_seconds, "description": description, "replace": replace}))


def list_all(conn: psycopg.Connection) -> list[Schedule]:
    return [Schedule(**row) for row in queries.fetch_all(conn, "list_schedules")]


def late(conn: psycopg.Connection) -> list[LateSchedule]:
    """The running schedules whose next tick is overdue, most overdue first."""
    return [LateSchedule(**row) for row in queries.fetch_all(conn, "late_schedules")]


def get(conn: psycopg.Connection, name: str) -> Schedule:
    for schedule in list_all(conn):
        if schedule.name == name:
            return schedule
    raise NotFound(f'schedule "{name}" does not exist', hint="List them with: courier schedule list")


def message(conn: psycopg.Connection, name: str) -> dict[str, Any]:
    """The payload, headers, metadata, priority and ordering key each tick sends."""
    row = queries.fetch_one(conn, "schedule_message", {"name": name}, exact=True)
    if row is None:
        raise NotFound(f'schedule "{name}" does not exist', hint="List them with: courier schedule list")
    return row


def drop(conn: psycopg.Connection, name: str, if_exists: bool = False) -> bool:
    return bool(queries.fetch_value(conn, "drop_schedule", {"name": name, "if_exists": if_exists}))


def pause(conn: psycopg.Connection, name: str) -> bool:
    """Pause it; False if it was paused already."""
    return bool(queries.fetch_value(conn, "pause_schedule", {"name": name}))


def resume(conn: psycopg.Connection, name: str) -> bool:
    """Resume it from its next tick after now; False if it was running."""
    return bool(queries.fetch_value(conn, "resume_schedule", {"name": name}))


def next_runs(conn: psycopg.Connection, cron: str, time_zone: str = "UTC", count: int = 5,
              after: datetime | None = None) -> list[datetime]:
    """The next `count` times `cron` names in `time_zone` after `after` (default: the database's
    now), checked as create() checks it."""
    return [row["at"] for row in queries.fetch_all(conn, "cron_next_runs",
                                                   {"cron": cron, "time_zone": time_zone, "count": count,
                                                    "after": after})]


def on_its_clock(at: datetime | None, time_zone: str, fmt: str = "%Y-%m-%d %H:%M:%S %Z") -> str:
    """A time as the schedule's own clock shows it (cron's 03:00 in Europe/Berlin reads 03:00 CET)."""
    if at is None:
        return "-"
    try:
        return at.astimezone(ZoneInfo(time_zone)).strftime(fmt)
    except (ZoneInfoNotFoundError, ValueError, OverflowError):  # a zone this Python does not know; 'infinity'
        return at.strftime(fmt) if at.year < 9999 else "never"
