"""The Schedules pane under Pilot: every schedule with its state (late and failing by the console's
clock), its next run and last tick on its own clock, its counts and last error; z pauses and
resumes, x drops after a confirmation that names it, enter opens it whole with its next runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from textual.widgets import Static

from console.app.widgets.confirm import ConfirmModal
from console.app.widgets.detail import DetailModal
from console.app.widgets.live_table import LiveTable
from sqlkit import schedules
from tests.console_driver import open_pane, run_console, wait_for
from tests.helpers import scalar
from tests.test_console_at_80x24 import shown, visible_columns
from tests.test_console_tokens import table_text

ERROR = '[courier] endpoint "closed" is disabled [bold]and[/bold] more'


@pytest.fixture
def scheduled(conn):
    conn.execute("SELECT courier.create_endpoint('jobs', 'pull')")
    conn.execute("SELECT courier.create_endpoint('closed', 'pull')")
    conn.execute("SELECT courier.create_schedule('nightly', '0 3 * * *', 'jobs', p_time_zone => 'Europe/Berlin')")
    conn.execute("SELECT courier.create_schedule('minutely', '* * * * *', 'jobs')")
    conn.execute("SELECT courier.create_schedule('broken', '*/5 * * * *', 'closed')")
    conn.execute("UPDATE courier.schedules SET next_run_at = now() - interval '7 minutes', last_error = %s, "
                 "last_error_at = now(), sent_ticks = 12, skipped_ticks = 3 WHERE name = 'broken'", (ERROR,))
    conn.execute("UPDATE courier.schedules SET next_run_at = now() - interval '5 minutes' WHERE name = 'minutely'")
    return conn


def row_of(app, name: str) -> str:
    table = app.pane.query_one(LiveTable)
    return " ".join(getattr(cell, "plain", str(cell)) for cell in table.get_row(name))


def test_late_failing_and_running_schedules_are_told_apart(dsn, scheduled):
    async def scenario(pilot, app):
        await open_pane(pilot, "schedules")
        table = app.pane.query_one(LiveTable)
        await wait_for(pilot, lambda: table.row_count == 3, what="the schedules")
        assert [table.get_row_at(n)[0].plain for n in range(3)] == ["broken", "minutely", "nightly"]
        assert row_of(app, "broken").split()[1] == "failing" and "12/3" in row_of(app, "broken")
        assert ERROR in row_of(app, "broken")  # literally: its markup is text
        assert row_of(app, "minutely").split()[1] == "late"
        nightly = row_of(app, "nightly")
        assert nightly.split()[1] == "running" and "0 3 * * * Europe/Berlin" in nightly
        assert " 03:00 CE" in nightly  # the next run on its own clock (CET or CEST), not the console's UTC
        colors = app.get_css_variables()
        state = table.get_row("broken")[1]
        assert colors["text-error"] in str(state.style) and "bold" in str(state.style)
        assert colors["text-error"] in str(table.get_row("minutely")[1].style)
    run_console(dsn, scenario)


def test_the_state_follows_the_consoles_clock(dsn, scheduled):
    """A console shown at another time (the showcase's) judges lateness by its own clock, as it does workers."""
    def an_hour_ago() -> datetime:
        return datetime.now(UTC) - timedelta(hours=1)

    async def scenario(pilot, app):
        await open_pane(pilot, "schedules")
        await wait_for(pilot, lambda: app.pane.query_one(LiveTable).row_count == 3, what="the schedules")
        assert row_of(app, "minutely").split()[1] == "running"
    run_console(dsn, scenario, clock=an_hour_ago)


def test_z_pauses_and_resumes(dsn, scheduled):
    def paused() -> bool:
        return scalar(scheduled, "SELECT paused_at IS NOT NULL FROM courier.schedules WHERE name = 'nightly'")

    async def scenario(pilot, app):
        await open_pane(pilot, "schedules")
        table = app.pane.query_one(LiveTable)
        await wait_for(pilot, lambda: table.row_count == 3, what="the schedules")
        table.move_cursor(row=table.get_row_index("nightly"))
        await pilot.press("z")
        await wait_for(pilot, paused, what="the pause")
        await wait_for(pilot, lambda: row_of(app, "nightly").split()[1] == "paused", what="the list to say so")
        assert row_of(app, "nightly").split()[2] == "-"  # no next run while paused
        await pilot.press("z")
        await wait_for(pilot, lambda: not paused(), what="the resume")
        await wait_for(pilot, lambda: row_of(app, "nightly").split()[1] == "running", what="the list to say so")
    run_console(dsn, scenario)


def test_x_drops_after_a_confirmation_naming_it(dsn, scheduled):
    def names() -> set[str]:
        return {row[0] for row in scheduled.execute("SELECT name FROM courier.schedules")}

    async def scenario(pilot, app):
        await open_pane(pilot, "schedules")
        table = app.pane.query_one(LiveTable)
        await wait_for(pilot, lambda: table.row_count == 3, what="the schedules")
        table.move_cursor(row=table.get_row_index("minutely"))
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the confirmation")
        assert "Drop schedule minutely (* * * * *, UTC, to jobs)?" in app.screen.question
        await pilot.press("n")
        await pilot.pause(0.3)
        assert "minutely" in names()
        await pilot.press("x")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the confirmation")
        await pilot.press("y")
        await wait_for(pilot, lambda: "minutely" not in names(), what="the drop")
        await wait_for(pilot, lambda: table.row_count == 2, what="the row to go")
        assert "minutely" not in table_text(app)
    run_console(dsn, scenario)
    assert names() == {"broken", "nightly"}


def test_enter_opens_it_whole_with_its_next_runs_at_80x24(dsn, scheduled):
    expected = [at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
                for at in schedules.next_runs(scheduled, "*/5 * * * *", "UTC", 5)]

    async def scenario(pilot, app):
        await open_pane(pilot, "schedules")
        table = app.pane.query_one(LiveTable)
        await wait_for(pilot, lambda: table.row_count == 3, what="the schedules")
        await pilot.pause(0.3)
        assert list(visible_columns(table))[:4] == ["name", "state", "next_run", "last_error"]
        start, end = visible_columns(table)["last_error"]
        assert end - start - 2 >= 30  # the reason is read at 80 columns, not `las`
        table.move_cursor(row=table.get_row_index("broken"))
        await pilot.press("enter")
        modal = await wait_for(pilot, lambda: isinstance(app.screen, DetailModal) and app.screen,
                               what="the schedule's detail")
        fields = " ".join(shown(modal.query_one("#detail-fields", Static)).split())
        assert ERROR in fields  # whole, brackets and all
        assert "failing" in fields and "late)" in fields and "12 sent, 3 skipped" in fields
        assert "closed (pull)" in fields and "*/5 * * * * (UTC)" in fields
        assert all(at in fields for at in expected[1:5]), (expected, fields)  # a tick may pass meanwhile
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, DetailModal), what="the dialog to close")
        await pilot.press("o")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailModal), what="o to open it too")
    run_console(dsn, scenario, size=(80, 24))


def test_the_pane_is_reached_by_0_and_by_name(dsn, scheduled):
    from console.app.widgets.jump import resolve_pane

    assert resolve_pane(":cron") == resolve_pane("sched") == "schedules"

    async def scenario(pilot, app):
        await pilot.press("0")
        await wait_for(pilot, lambda: app.current_pane == "schedules" and app.pane.loaded, what="the pane")
    run_console(dsn, scenario)


def test_late_after_agrees_with_the_database(conn):
    assert scalar(conn, "SELECT extract(epoch FROM courier._schedule_late_after())") == \
        schedules.LATE_AFTER.total_seconds()
