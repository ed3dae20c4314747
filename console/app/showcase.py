"""The showcase: a deterministic queue for screenshots and snapshot tests, and the fixed
clock and time zone the console is shown with, so every picture is the same each time.

The queue has a recent past too (showcase_history.sql): the maintenance leader's samples of its
last five minutes (seed writes them, step by step), which the Overview's charts and rates are
drawn from; play_history walks the console through those minutes, poll by poll, so the rates
the other panes measure themselves are drawn from what they read, as they are in use."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from importlib import resources

import psycopg
from psycopg import sql

from sqlkit.connection import connect

NOW = datetime(2026, 11, 2, 12, 0, 0, tzinfo=UTC)
ARCHIVE_MONTHS = ((2026, 9), (2026, 10), (2026, 11), (2026, 12))
HISTORY_STEPS = 30  # polls of the recent past, HISTORY_STEP apart, the last at NOW
HISTORY_STEP = timedelta(seconds=10)
SAMPLING_GAP = range(19, 23)  # steps without a sample: none between 11:56:10 and 11:57:00


def fixed_clock() -> datetime:
    return NOW


def seed(dsn: str) -> None:
    """Replace everything in this (scratch!) database's courier schema with the showcase."""
    with connect(dsn) as conn:
        with conn.transaction():
            conn.execute(resources.files("console.app").joinpath("showcase.sql").read_text(encoding="utf-8"))
            _archive(conn)
        _samples(conn)
        # Fixed sizes and row estimates for the archive pane: no autovacuum may change them later.
        conn.execute("VACUUM ANALYZE courier.archive")


def _samples(conn: psycopg.Connection) -> None:
    """The maintenance leader's samples of the recent past, one per step (at the showcase
    clock's times: record_metric_samples() would stamp them now), ending with the showcase
    as seeded. None was taken for SAMPLING_GAP: the workers were being restarted, and the
    charts show the gap."""
    conn.execute("DELETE FROM courier.metric_samples")
    # The steps add and remove messages: the queue's next id must stay the showcase's own.
    sequence = sql.SQL(conn.execute("SELECT pg_get_serial_sequence('courier.queue', 'id')").fetchone()[0])
    last_id, called = conn.execute(sql.SQL("SELECT last_value, is_called FROM {}").format(sequence)).fetchone()
    for n in range(HISTORY_STEPS, -1, -1):
        rewind(conn, n)
        if n in SAMPLING_GAP:
            continue
        conn.execute("INSERT INTO courier.metric_samples (sampled_at, endpoint_id, interval_seconds, pending, "
                     "processing, dlq, delivered, failed, dead_lettered) "
                     "SELECT %s, r.endpoint_id, %s, r.pending, r.processing, r.dlq, r.delivered, r.failed, "
                     "r.dead_lettered FROM courier._metric_sample_rows() r",
                     (NOW - n * HISTORY_STEP, HISTORY_STEP.total_seconds()))
    conn.execute("SELECT setval(pg_get_serial_sequence('courier.queue', 'id'), %s, %s)", (last_id, called))


def _archive(conn: psycopg.Connection) -> None:
    """Monthly partitions of fixed months (a real install's depend on today's date)."""
    partitions = conn.execute("SELECT inhrelid::regclass::text FROM pg_inherits "
                              "WHERE inhparent = 'courier.archive'::regclass").fetchall()
    for (name,) in partitions:
        if not name.endswith("archive_default"):
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.SQL(name)))
    conn.execute("TRUNCATE courier.archive_default")
    for year, month in ARCHIVE_MONTHS:
        start = datetime(year, month, 1, tzinfo=UTC)
        end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
        conn.execute(sql.SQL("CREATE TABLE courier.{} PARTITION OF courier.archive FOR VALUES FROM ({}) TO ({})")
                     .format(sql.Identifier(f"archive_{year}_{month:02d}"), sql.Literal(start), sql.Literal(end)))
    conn.execute("""
        INSERT INTO courier.archive (id, endpoint_id, payload, status, priority, retry_count, completed_at,
                                     created_at, archived_at, last_error)
        SELECT 100000 + g, 1 + g % 3, jsonb_build_object('order_id', g, 'total', g % 500),
               CASE WHEN g % 20 = 0 THEN 'failed' WHEN g % 50 = 1 THEN 'expired' ELSE 'completed' END,
               0, CASE WHEN g % 20 = 0 THEN 5 ELSE 0 END,
               '2026-09-01 00:00+00'::timestamptz + g * interval '3 minutes' + interval '2 seconds',
               '2026-09-01 00:00+00'::timestamptz + g * interval '3 minutes',
               '2026-09-01 00:00+00'::timestamptz + g * interval '3 minutes' + interval '5 seconds',
               CASE WHEN g % 20 = 0 THEN '[RETRYABLE] HTTP 503 Service Unavailable (max retries exceeded)' END
        FROM generate_series(0, 29000) g""")


def rewind(conn: psycopg.Connection, steps: int) -> None:
    """Put the queue where it stood steps * HISTORY_STEP before NOW (0: the showcase itself)."""
    with psycopg.ClientCursor(conn) as cursor:  # several statements, one set of parameters
        cursor.execute(resources.files("console.app").joinpath("showcase_history.sql").read_text(encoding="utf-8"),
                       {"n": steps, "now": NOW})
    conn.commit()


async def play_history(pilot, dsn: str, steps: int = HISTORY_STEPS, timeout: float = 15.0) -> None:
    """Poll the pane on display once per step of the showcase's recent past, its clock at each
    step's moment, ending at NOW with the showcase as seeded."""
    import asyncio

    app = pilot.app
    pane = app.pane
    clock = app.clock
    loop = asyncio.get_running_loop()
    try:
        with connect(dsn) as conn:
            for n in range(steps, -1, -1):
                rewind(conn, n)
                moment = NOW - n * HISTORY_STEP
                app.clock = lambda moment=moment: moment
                pane.poll_now()
                deadline = loop.time() + timeout
                while pane.polling:
                    if loop.time() > deadline:
                        raise TimeoutError(f"pane {pane.id} did not poll within {timeout} s")
                    await pilot.pause(0.01)
    finally:
        app.clock = clock
    await pilot.pause(0.05)
    await pilot.wait_for_scheduled_animations()


async def open_pane(pilot, name: str, timeout: float = 15.0) -> None:
    """Switch the app under Pilot to a pane and wait until its first poll is on screen."""
    import asyncio

    app = pilot.app
    await pilot.pause()
    app.action_show_pane(name)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not app.pane.loaded:
        if loop.time() > deadline:
            raise TimeoutError(f"pane {name} did not load within {timeout} s")
        await pilot.pause(0.05)
    # Tables size their columns on the refresh after rows arrive: let those run too.
    from textual.widgets import DataTable

    # (DataTable measures new rows when it next goes idle; the flag is its own.)
    def settled() -> bool:
        return not any(t._require_update_dimensions or t._updated_cells for t in app.pane.query(DataTable))
    while not settled() and loop.time() < deadline:
        await pilot.pause(0.05)
    await pilot.pause(0.05)
    await pilot.wait_for_scheduled_animations()


async def steady(pilot) -> None:
    """Stop cursors blinking on the current screen, so a picture of it is the same every time."""
    from textual.widgets import Input, TextArea

    for widget in pilot.app.screen.query("Input, TextArea"):
        if isinstance(widget, Input | TextArea):
            widget.cursor_blink = False
    await pilot.pause(0.05)
