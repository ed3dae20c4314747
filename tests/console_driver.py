"""Driving the console under Textual's Pilot against a real database, for the console tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC
from typing import Any

import psycopg
from textual.pilot import Pilot

from console.app import CourierApp, make_app
from console.app.showcase import open_pane
from tests.helpers import report

__all__ = ["dead_letter", "open_pane", "run_console", "wait_for"]


def run_console(dsn: str, scenario: Callable[[Pilot, CourierApp], Awaitable[None]], *,
                size: tuple[int, int] = (120, 40), **options: Any) -> None:
    """Run the app headless and play the scenario in it; fail the test on any app error."""
    app = make_app(dsn, tz=UTC, **options)

    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await scenario(pilot, app)
    asyncio.run(main())


async def wait_for(pilot: Pilot, check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll check() (a database query, say) until it is truthy, letting the app run between polls."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value {value!r}")
        await pilot.pause(0.1)


def dead_letter(conn: psycopg.Connection, endpoint: str, count: int) -> list[int]:
    """Send count messages to a noop endpoint and dead-letter them through the real claim and
    report path; returns their DLQ ids, oldest first."""
    endpoint_id = conn.execute("SELECT id FROM courier.endpoints WHERE name = %s", (endpoint,)).fetchone()[0]
    conn.execute("SELECT courier.send_batch(%s, ARRAY(SELECT jsonb_build_object('n', g) "
                 "FROM generate_series(1, %s) g))", (endpoint, count))
    ids = [row[0] for row in conn.execute("SELECT id FROM courier.claim_batch('t', %s, %s)",
                                          (count, endpoint_id))]
    report(conn, ids, ["permanent"] * len(ids), ["[PERMANENT] HTTP 422"] * len(ids))
    return [row[0] for row in conn.execute(
        "SELECT id FROM courier.dlq WHERE endpoint_name = %s AND original_message_id = ANY(%s) ORDER BY id",
        (endpoint, ids))]
