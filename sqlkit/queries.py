"""Named SQL queries, loaded from queries.sql (`-- name: x` blocks) inside the package."""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

import psycopg
from psycopg.rows import dict_row

from .errors import translated
from .exact_json import read_exactly

_NAME = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)


@functools.cache
def all_queries() -> dict[str, str]:
    text = resources.files("sqlkit").joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def query(name: str) -> str:
    try:
        return all_queries()[name]
    except KeyError:
        raise KeyError(f"no query named {name!r} in sqlkit/queries.sql") from None


def fetch_one(conn: psycopg.Connection, name: str, params: Any = None, *,
              exact: bool = False) -> dict[str, Any] | None:
    """The first row of query `name`. exact: read its json and jsonb columns keeping every
    number as stored (exact_json.read_exactly), for a path that shows them."""
    with translated(), conn.cursor(row_factory=dict_row) as cur:
        if exact:
            read_exactly(cur)
        cur.execute(query(name), params)
        return cur.fetchone()


def fetch_all(conn: psycopg.Connection, name: str, params: Any = None) -> list[dict[str, Any]]:
    with translated(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query(name), params)
        return cur.fetchall()


def fetch_value(conn: psycopg.Connection, name: str, params: Any = None) -> Any:
    with translated(), conn.cursor() as cur:
        cur.execute(query(name), params)
        row = cur.fetchone()
        return None if row is None else row[0]


async def fetch_all_async(conn: psycopg.AsyncConnection, name: str,
                          params: Any = None) -> list[dict[str, Any]]:
    with translated():
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query(name), params)
            return await cur.fetchall()


async def fetch_tuples_async(conn: psycopg.AsyncConnection, name: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Rows as tuples, for a caller that reads many by position (the worker's claims)."""
    with translated():
        async with conn.cursor() as cur:
            await cur.execute(query(name), params)
            return await cur.fetchall()


async def fetch_value_async(conn: psycopg.AsyncConnection, name: str, params: Any = None) -> Any:
    with translated():
        async with conn.cursor() as cur:
            await cur.execute(query(name), params)
            row = await cur.fetchone()
            return None if row is None else row[0]


async def fetch_values_many_async(conn: psycopg.AsyncConnection, name: str, params: list[Any]) -> list[Any]:
    """The one value query `name` returns for each of `params`, run as one pipelined batch
    (one round trip, not one per item)."""
    with translated():
        async with conn.cursor() as cur:
            await cur.executemany(query(name), params, returning=True)
            values = []
            while True:
                row = await cur.fetchone()
                values.append(None if row is None else row[0])
                if not cur.nextset():
                    return values
