"""The topic-config editor of the Endpoints pane under Pilot: a pull topic's limits set and
reverted to the global default (read back from courier.endpoints.config), and bad values
refused with the dialog left open."""

from __future__ import annotations

import psycopg
import pytest
from textual.widgets import Input, Static

from console.app.widgets.live_table import LiveTable
from console.app.widgets.topic_limits import LIMITS, TopicLimitsForm
from tests.console_driver import open_pane, run_console, wait_for
from tests.helpers import scalar


@pytest.fixture
def topic(conn: psycopg.Connection) -> str:
    conn.execute("SELECT courier.create_endpoint('orders', 'pull', '{\"max_depth\": 500, \"visibility_timeout\": 60}')")
    conn.execute("SELECT courier.create_endpoint('hook', 'noop', '{}')")
    return "orders"


def config(conn: psycopg.Connection, name: str = "orders") -> dict:
    return scalar(conn, "SELECT config FROM courier.endpoints WHERE name = %s", (name,))


async def open_limits(pilot, app, name: str = "orders") -> TopicLimitsForm:
    await open_pane(pilot, "endpoints")
    table = app.pane.query_one(LiveTable)
    table.move_cursor(row=table.get_row_index(name))
    await pilot.press("l")
    return await wait_for(pilot, lambda: isinstance(app.screen, TopicLimitsForm) and app.screen, what="the dialog")


def error_of(form: TopicLimitsForm) -> str:
    return str(form.query_one("#form-error", Static).render())


def test_the_dialog_shows_overrides_and_defaults(dsn, conn, topic):
    async def scenario(pilot, app):
        form = await open_limits(pilot, app)
        assert {limit.key for limit in LIMITS} == {
            "max_retries", "message_ttl_seconds", "max_depth", "throughput_limit", "dlq_threshold",
            "visibility_timeout"}
        assert form.query_one("#max_depth", Input).value == "500"
        assert form.query_one("#visibility_timeout", Input).value == "60"
        retries = form.query_one("#max_retries", Input)
        assert retries.value == "" and retries.placeholder == scalar(
            conn, "SELECT value FROM courier.settings WHERE name = 'default_max_retries'")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, TopicLimitsForm), what="the dialog to close")
    run_console(dsn, scenario)
    assert config(conn) == {"max_depth": 500, "visibility_timeout": 60}


def test_set_a_limit_then_revert_it_to_the_default(dsn, conn, topic):
    async def scenario(pilot, app):
        form = await open_limits(pilot, app)
        form.query_one("#max_retries", Input).value = "3"
        form.query_one("#throughput_limit", Input).value = "2.5"
        form.query_one("#max_depth", Input).value = ""  # back to the global default
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, TopicLimitsForm), what="the dialog to close")
        assert config(conn) == {"max_retries": 3, "throughput_limit": 2.5, "visibility_timeout": 60}

        form = await open_limits(pilot, app)
        assert form.query_one("#max_retries", Input).value == "3"
        assert form.query_one("#throughput_limit", Input).value == "2.5"
        form.query_one("#max_retries", Input).value = " "
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, TopicLimitsForm), what="the dialog to close")
    run_console(dsn, scenario)
    assert config(conn) == {"throughput_limit": 2.5, "visibility_timeout": 60}


def test_a_topics_delay_is_set_and_cleared_in_the_same_dialog(dsn, conn, topic):
    """delay_seconds (SQS delay queues, issue 42) has no global setting behind it: blank is none."""
    async def scenario(pilot, app):
        form = await open_limits(pilot, app)
        delay = form.query_one("#delay_seconds", Input)
        assert delay.value == "" and delay.placeholder == "0"
        delay.value = "45"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, TopicLimitsForm), what="the dialog to close")
        assert config(conn)["delay_seconds"] == 45
        form = await open_limits(pilot, app)
        assert form.query_one("#delay_seconds", Input).value == "45"
        form.query_one("#delay_seconds", Input).value = "901"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: "delay_seconds" in error_of(form), what="the error")
        form.query_one("#delay_seconds", Input).value = ""
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, TopicLimitsForm), what="the dialog to close")
    run_console(dsn, scenario)
    assert "delay_seconds" not in config(conn)


def test_bad_values_show_the_error_and_keep_the_dialog_open(dsn, conn, topic):
    async def scenario(pilot, app):
        form = await open_limits(pilot, app)
        form.query_one("#max_depth", Input).value = "lots"
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        assert "max_depth" in error_of(form) and "not a whole number" in error_of(form)
        assert app.screen is form
        form.query_one("#max_depth", Input).value = "500"
        form.query_one("#throughput_limit", Input).value = "1e3"
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        assert "throughput_limit" in error_of(form) and "not a number" in error_of(form)
        # A number the database refuses: its own message, and nothing stored.
        form.query_one("#throughput_limit", Input).value = ""
        form.query_one("#max_retries", Input).value = "5000"
        await pilot.press("ctrl+s")
        error = await wait_for(pilot, lambda: "5000" in error_of(form) and error_of(form), what="the database's error")
        assert "max_retries" in error
        assert app.screen is form and app.is_running
        form.query_one("#max_retries", Input).value = "7"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, TopicLimitsForm), what="the dialog to close")
    run_console(dsn, scenario)
    assert config(conn) == {"max_depth": 500, "visibility_timeout": 60, "max_retries": 7}


def test_a_push_endpoint_has_no_topic_limits(dsn, conn, topic):
    async def scenario(pilot, app):
        await open_pane(pilot, "endpoints")
        table = app.pane.query_one(LiveTable)
        table.move_cursor(row=table.get_row_index("hook"))
        await pilot.press("l")
        await pilot.pause(0.3)
        assert not isinstance(app.screen, TopicLimitsForm)
    run_console(dsn, scenario)
