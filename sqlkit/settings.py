"""Typed API over courier.settings: the runtime settings with their defaults and ranges."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psycopg

from . import queries
from .errors import NotFound


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    default_value: str
    value_type: str
    min_value: int | None
    max_value: int | None
    unit: str | None
    description: str
    updated_at: datetime

    @property
    def allowed(self) -> str:
        if self.value_type == "boolean":
            return "true | false"
        if self.value_type == "cron":
            return "cron schedule (UTC) | empty"
        return f"{self.min_value} .. {self.max_value}"


def list_all(conn: psycopg.Connection) -> list[Setting]:
    return [Setting(**row) for row in queries.fetch_all(conn, "list_settings")]


def get(conn: psycopg.Connection, name: str) -> Setting:
    row = queries.fetch_one(conn, "get_setting", {"name": name})
    if row is None:
        raise NotFound(f'unknown setting "{name}"', "42704",
                       "List the settings with `courier config get`")
    return Setting(**row)


def set_value(conn: psycopg.Connection, name: str, value: str) -> str:
    """Validate and store a setting; returns the normalised value."""
    return queries.fetch_value(conn, "set_setting", {"name": name, "value": value})
