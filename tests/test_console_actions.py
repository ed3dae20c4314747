"""Every console action, driven by keys under Pilot, with its effect asserted in PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from textual.widgets import Checkbox, Input, Select, TextArea

from console.app.panes.dlq import DlqPane
from console.app.widgets.confirm import ConfirmModal
from console.app.widgets.detail import DetailModal
from console.app.widgets.endpoint_forms import CreateEndpointForm, RetryPolicyForm
from console.app.widgets.live_table import LiveTable
from console.app.widgets.replay_wizard import ReplayWizard
from tests.console_driver import dead_letter, open_pane, run_console, wait_for
from tests.helpers import scalar


@pytest.fixture
def noop_endpoints(conn: psycopg.Connection) -> list[str]:
    for name in ("alpha", "beta"):
        conn.execute("SELECT courier.create_endpoint(%s, 'noop', '{}')", (name,))
    return ["alpha", "beta"]


def failed_in_dlq(conn, endpoint: str | None = None) -> int:
    return scalar(conn, "SELECT count(*) FROM courier.dlq WHERE status = 'failed' "
                        "AND (%(e)s::text IS NULL OR endpoint_name = %(e)s::text)", {"e": endpoint})


def move_cursor_to(table: LiveTable, key: str) -> None:
    table.move_cursor(row=table.get_row_index(key))


async def confirm(pilot, expected_text: str) -> None:
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ConfirmModal), what="the confirmation")
    assert expected_text in pilot.app.screen.question
    await pilot.press("y")


# DLQ -----------------------------------------------------------------------------------

def test_redrive_one_dlq_entry(dsn, conn, noop_endpoints):
    dlq_ids = dead_letter(conn, "alpha", 3)

    async def scenario(pilot, app):
        await open_pane(pilot, "dlq")
        move_cursor_to(app.pane.query_one(LiveTable), str(dlq_ids[1]))
        await pilot.press("R")
        await confirm(pilot, "1 message")
        await wait_for(pilot, lambda: failed_in_dlq(conn) == 2, what="one redrive")
    run_console(dsn, scenario)
    assert scalar(conn, "SELECT status FROM courier.dlq WHERE id = %s", (dlq_ids[1],)) == "redriven"
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'pending'") == 1


def test_redrive_a_selection(dsn, conn, noop_endpoints):
    dlq_ids = dead_letter(conn, "alpha", 4)

    async def scenario(pilot, app):
        await open_pane(pilot, "dlq")
        table = app.pane.query_one(LiveTable)
        for chosen in (dlq_ids[0], dlq_ids[2]):
            move_cursor_to(table, str(chosen))
            await pilot.press("space")
        assert app.pane.selected == {dlq_ids[0], dlq_ids[2]}
        await pilot.press("S")
        await confirm(pilot, "2 selected")
        await wait_for(pilot, lambda: failed_in_dlq(conn) == 2, what="the selection's redrive")
    run_console(dsn, scenario)
    redriven = {row[0] for row in conn.execute("SELECT id FROM courier.dlq WHERE status = 'redriven'")}
    assert redriven == {dlq_ids[0], dlq_ids[2]}


def test_redrive_an_endpoint_states_the_count_and_spares_the_others(dsn, conn, noop_endpoints):
    alpha = dead_letter(conn, "alpha", 3)
    dead_letter(conn, "beta", 2)

    async def scenario(pilot, app):
        await open_pane(pilot, "dlq")
        move_cursor_to(app.pane.query_one(LiveTable), str(alpha[0]))
        await pilot.press("E")
        await confirm(pilot, "all 3 failed DLQ entries of endpoint alpha")
        await wait_for(pilot, lambda: failed_in_dlq(conn, "alpha") == 0, what="alpha's redrive")
    run_console(dsn, scenario)
    assert failed_in_dlq(conn, "beta") == 2


def test_redrive_everything_and_cancelling_touches_nothing(dsn, conn, noop_endpoints):
    dead_letter(conn, "alpha", 3)
    dead_letter(conn, "beta", 2)

    async def scenario(pilot, app):
        await open_pane(pilot, "dlq")
        await pilot.press("A")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmModal), what="the confirmation")
        assert "all 5 failed DLQ entries of every endpoint" in app.screen.question
        await pilot.press("n")
        await pilot.pause(0.3)
        assert failed_in_dlq(conn) == 5
        await pilot.press("A")
        await confirm(pilot, "all 5")
        await wait_for(pilot, lambda: failed_in_dlq(conn) == 0, what="the redrive of everything")
    run_console(dsn, scenario)
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 5


def test_dlq_details_show_redacted_headers(dsn, conn, noop_endpoints):
    [dlq_id] = dead_letter(conn, "alpha", 1)
    conn.execute("UPDATE courier.dlq SET headers = '{\"Authorization\": \"Bearer s3cr3t\", \"X-Tenant\": \"acme\"}'")

    async def scenario(pilot, app):
        await open_pane(pilot, "dlq")
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailModal), what="the detail view")
        shown = str(app.screen.headers)
        assert "s3cr3t" not in shown and "acme" in shown
        assert app.screen.title_text == f"Dead letter {dlq_id}"
    run_console(dsn, scenario)


# Endpoints -----------------------------------------------------------------------------

def test_disable_enable_and_reset_circuit(dsn, conn, noop_endpoints):
    conn.execute("UPDATE courier.endpoints SET circuit_state = 'open', circuit_failure_count = 9, "
                 "circuit_opened_at = now() WHERE name = 'beta'")

    def endpoint(column: str):
        return scalar(conn, f"SELECT {column} FROM courier.endpoints WHERE name = 'beta'")

    async def scenario(pilot, app):
        await open_pane(pilot, "endpoints")
        move_cursor_to(app.pane.query_one(LiveTable), "beta")
        await pilot.press("d")
        await wait_for(pilot, lambda: endpoint("enabled") is False, what="disable")
        await pilot.press("e")
        await wait_for(pilot, lambda: endpoint("enabled") is True, what="enable")
        await pilot.press("c")
        await wait_for(pilot, lambda: endpoint("circuit_state") == "closed", what="the circuit reset")
    run_console(dsn, scenario)
    assert endpoint("circuit_failure_count") == 0
    assert scalar(conn, "SELECT enabled FROM courier.endpoints WHERE name = 'alpha'") is True


def test_purge_an_endpoints_pending_messages_names_the_count_first(dsn, conn, noop_endpoints):
    """Issue 42: P on the Endpoints pane purges the pending messages after a confirmation that
    names how many; a message in processing stays, and the other endpoint is untouched."""
    conn.execute("SELECT courier.send_batch('beta', ARRAY['{}', '{}', '{}']::jsonb[])")
    conn.execute("SELECT courier.send('alpha', '{}')")
    conn.execute("SELECT courier.claim_batch('w', 1, (SELECT id FROM courier.endpoints WHERE name = 'beta'))")

    def pending(name: str) -> int:
        return scalar(conn, "SELECT count(*) FROM courier.queue q JOIN courier.endpoints e ON e.id = q.endpoint_id "
                            "WHERE e.name = %s AND q.status = 'pending'", (name,))

    async def scenario(pilot, app):
        await open_pane(pilot, "endpoints")
        move_cursor_to(app.pane.query_one(LiveTable), "beta")
        await pilot.press("P")
        await confirm(pilot, "Purge the 2 pending message(s) of beta?")
        await wait_for(pilot, lambda: pending("beta") == 0, what="beta's purge")
    run_console(dsn, scenario)
    assert scalar(conn, "SELECT count(*) FROM courier.archive WHERE status = 'purged'") == 2
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE status = 'processing'") == 1
    assert pending("alpha") == 1


def test_create_endpoint_with_a_bad_config_shows_the_error_and_stores_nothing(dsn, conn):
    async def scenario(pilot, app):
        await open_pane(pilot, "endpoints")
        await pilot.press("n")
        await wait_for(pilot, lambda: isinstance(app.screen, CreateEndpointForm), what="the form")
        form = app.screen
        form.query_one("#name", Input).value = "orders"
        form.query_one("#config", TextArea).text = '{"url": "ftp://example.com/hook"}'
        await pilot.press("ctrl+s")
        error = await wait_for(pilot, lambda: str(form.query_one("#form-error").render()), what="the inline error")
        assert "url" in error.lower()
        assert isinstance(app.screen, CreateEndpointForm)  # still open, to fix the config
        form.query_one("#config", TextArea).text = '{"url": '
        await pilot.press("ctrl+s")
        await pilot.pause(0.2)
        assert "config: not valid JSON" in str(form.query_one("#form-error").render())
        assert scalar(conn, "SELECT count(*) FROM courier.endpoints") == 0
        form.query_one("#config", TextArea).text = '{"url": "https://example.com/hook"}'
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, CreateEndpointForm), what="the form to close")
    run_console(dsn, scenario)
    assert scalar(conn, "SELECT protocol FROM courier.endpoints WHERE name = 'orders'") == "http"


def test_the_config_example_is_a_placeholder_each_protocol_brings(dsn, conn):
    """The config starts empty with its protocol's example as the placeholder (nothing to type in
    front of); choosing a protocol changes the example, never what the operator typed."""
    async def scenario(pilot, app):
        await open_pane(pilot, "endpoints")
        await pilot.press("n")
        form = await wait_for(pilot, lambda: isinstance(app.screen, CreateEndpointForm) and app.screen,
                              what="the form")
        config = form.query_one("#config", TextArea)
        assert config.text == ""
        assert "https://example.com/hook" in str(config.placeholder)
        form.query_one("#protocol", Select).value = "pull"
        await wait_for(pilot, lambda: "visibility_timeout" in str(config.placeholder), what="the pull example")
        assert config.text == ""
        config.focus()
        await pilot.press(*'{"visibility_timeout": 60}')
        form.query_one("#protocol", Select).value = "noop"
        await wait_for(pilot, lambda: str(config.placeholder) == "{}", what="the noop example")
        form.query_one("#protocol", Select).value = "pull"
        await pilot.pause(0.2)
        assert config.text == '{"visibility_timeout": 60}'
        form.query_one("#name", Input).value = "picks"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, CreateEndpointForm), what="the form to close")
    run_console(dsn, scenario)
    assert scalar(conn, "SELECT protocol FROM courier.endpoints WHERE name = 'picks'") == "pull"
    assert scalar(conn, "SELECT config->>'visibility_timeout' FROM courier.endpoints WHERE name = 'picks'") == "60"


def test_edit_retry_policy_validates_in_place(dsn, conn, noop_endpoints):
    async def scenario(pilot, app):
        await open_pane(pilot, "endpoints")
        move_cursor_to(app.pane.query_one(LiveTable), "alpha")
        await pilot.press("p")
        await wait_for(pilot, lambda: isinstance(app.screen, RetryPolicyForm), what="the policy form")
        form = app.screen
        form.query_one(TextArea).text = '{"backoff": "sometimes"}'
        await pilot.press("ctrl+s")
        error = await wait_for(pilot, lambda: str(form.query_one("#form-error").render()), what="the inline error")
        assert "backoff" in error
        form.query_one(TextArea).text = '{"max_retries": 3, "backoff": "fixed"}'
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, RetryPolicyForm), what="the form to close")
    run_console(dsn, scenario)
    assert scalar(conn, "SELECT retry_policy FROM courier.endpoints WHERE name = 'alpha'") == {
        "max_retries": 3, "backoff": "fixed"}


# Messages ------------------------------------------------------------------------------

def test_message_search_and_detail(dsn, conn, noop_endpoints):
    wanted = uuid.uuid4()
    conn.execute("SELECT courier.send_with_options('alpha', '{\"n\": 1}'::jsonb, p_ordering_key := 'cust-1')")
    conn.execute("SELECT courier.send_with_options('beta', '{\"n\": 2}'::jsonb, p_ordering_key := 'cust-2')")
    target = scalar(conn, "SELECT courier.send_with_options('beta', '{\"n\": 3, \"deep\": {\"x\": [1, 2]}}'::jsonb, "
                          "p_correlation_id := %s, p_headers := '{\"Authorization\": \"Bearer nope\"}')", (wanted,))

    def shown_ids(app) -> set[str]:
        return {row.value for row in app.pane.query_one(LiveTable).rows}

    async def scenario(pilot, app):
        await open_pane(pilot, "messages")
        assert len(shown_ids(app)) == 3
        await pilot.press("slash")
        await pilot.press(*"beta", "enter")
        await wait_for(pilot, lambda: len(shown_ids(app)) == 2, what="the endpoint filter")
        app.pane.query_one("#search-endpoint", Input).value = ""
        app.pane.query_one("#search-ordering-key", Input).value = "cust-1"
        app.pane.poll_now()
        await wait_for(pilot, lambda: len(shown_ids(app)) == 1, what="the ordering-key filter")
        app.pane.query_one("#search-ordering-key", Input).value = ""
        app.pane.query_one("#search-correlation-id", Input).value = str(wanted)
        app.pane.poll_now()
        await wait_for(pilot, lambda: shown_ids(app) == {str(target)}, what="the correlation filter")
        app.pane.query_one("#search-correlation-id", Input).value = ""
        app.pane.query_one("#search-status", Select).value = "processing"
        await wait_for(pilot, lambda: shown_ids(app) == set(), what="the status filter")
        app.pane.query_one("#search-status", Select).clear()
        app.pane.query_one("#search-correlation-id", Input).value = str(wanted)
        app.pane.poll_now()
        await wait_for(pilot, lambda: shown_ids(app) == {str(target)}, what="the correlation filter again")
        app.pane.query_one(LiveTable).focus()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailModal), what="the message detail")
        detail = app.screen
        assert detail.payload == {"n": 3, "deep": {"x": [1, 2]}}
        assert "nope" not in str(detail.headers)
    run_console(dsn, scenario)


# Archive -------------------------------------------------------------------------------

def archive_rows(conn, endpoint: str, n: int) -> None:
    conn.execute("""
        INSERT INTO courier.archive (id, endpoint_id, payload, status, completed_at, created_at)
        SELECT 900000 + g, e.id, jsonb_build_object('g', g), CASE WHEN g %% 2 = 0 THEN 'failed' ELSE 'completed' END,
               now() - interval '1 hour', now() - interval '2 hours'
        FROM generate_series(1, %s) g, courier.endpoints e WHERE e.name = %s""", (n, endpoint))


async def fill_wizard(pilot, app, endpoint: str, status: str | None) -> ReplayWizard:
    await open_pane(pilot, "archive")
    await pilot.press("p")
    await wait_for(pilot, lambda: isinstance(app.screen, ReplayWizard), what="the replay wizard")
    wizard = app.screen
    now = datetime.now(UTC)
    wizard.query_one("#replay-endpoint", Select).value = endpoint
    wizard.query_one("#replay-from", Input).value = (now - timedelta(days=1)).strftime("%Y-%m-%d %H:%M")
    wizard.query_one("#replay-to", Input).value = (now + timedelta(minutes=1)).strftime("%Y-%m-%d %H:%M")
    if status:
        wizard.query_one("#replay-status", Select).value = status
    await pilot.pause()
    return wizard


def test_replay_wizard_dry_run_then_cancel_enqueues_nothing(dsn, conn, noop_endpoints):
    archive_rows(conn, "alpha", 6)

    async def scenario(pilot, app):
        wizard = await fill_wizard(pilot, app, "alpha", "failed")
        await pilot.press("ctrl+d")
        text = await wait_for(pilot, lambda: "dry run" in str(wizard.query_one("#replay-count").render())
                              and str(wizard.query_one("#replay-count").render()), what="the dry-run count")
        assert "3 message(s) would be replayed" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ReplayWizard), what="the wizard to close")
    run_console(dsn, scenario)
    assert scalar(conn, "SELECT count(*) FROM courier.queue") == 0


def test_replay_wizard_replays_with_progress(dsn, conn, noop_endpoints):
    archive_rows(conn, "alpha", 6)

    async def scenario(pilot, app):
        wizard = await fill_wizard(pilot, app, "alpha", None)
        await pilot.press("ctrl+d")
        await wait_for(pilot, lambda: not wizard.query_one("#replay").disabled, what="the count")
        wizard.confirm_replay()
        await confirm(pilot, "Replay 6 archived message(s) of alpha")
        await wait_for(pilot, lambda: "replayed 6" in str(wizard.query_one("#replay-count").render()),
                       what="the result")
        assert wizard.query_one("#replay-progress").progress == 6
    run_console(dsn, scenario)
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE metadata ? 'replayed_from'") == 6


def test_the_wizard_replays_a_message_once_unless_fresh_copies_are_asked_for(dsn, conn, noop_endpoints):
    archive_rows(conn, "alpha", 6)
    conn.execute("SELECT courier.replay_range(e.id, now() - interval '1 day', now()) FROM courier.endpoints e "
                 "WHERE e.name = 'alpha'")  # `courier archive replay` ran first

    def count_text(wizard) -> str:
        return str(wizard.query_one("#replay-count").render())

    async def scenario(pilot, app):
        wizard = await fill_wizard(pilot, app, "alpha", None)
        await pilot.press("ctrl+d")
        text = await wait_for(pilot, lambda: "dry run" in count_text(wizard) and count_text(wizard),
                              what="the dry-run count")
        assert "0 message(s) would be replayed; 6 replayed before, skipped" in text
        assert wizard.query_one("#replay").disabled
        wizard.query_one("#replay-again", Checkbox).value = True
        await pilot.pause()
        await pilot.press("ctrl+d")
        text = await wait_for(pilot, lambda: "dry run" in count_text(wizard) and count_text(wizard),
                              what="the second count")
        assert "6 message(s) would be replayed; 6 replayed before, copied again" in text
        wizard.confirm_replay()
        await confirm(pilot, "Replay 6 archived message(s) of alpha")
        await wait_for(pilot, lambda: "replayed 6" in count_text(wizard), what="the result")
    run_console(dsn, scenario)
    assert scalar(conn, "SELECT count(*) FROM courier.queue WHERE metadata ? 'replayed_from'") == 12


# Navigation ----------------------------------------------------------------------------

def test_every_pane_is_reachable_by_number_colon_and_palette(dsn, noop_endpoints):
    async def scenario(pilot, app):
        for key, pane in zip("123456789", ("overview", "endpoints", "messages", "dlq", "archive", "events",
                                           "workers", "analytics", "tokens"), strict=True):
            await pilot.press(key)
            await pilot.pause()
            assert app.current_pane == pane
        await pilot.press("colon", *"dlq", "enter")
        await pilot.pause()
        assert isinstance(app.pane, DlqPane)
        await pilot.press("question_mark")
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
    run_console(dsn, scenario)


def test_slash_filters_the_dlq_and_escape_clears_it(dsn, conn, noop_endpoints):
    dead_letter(conn, "alpha", 2)
    dead_letter(conn, "beta", 3)

    def shown(app) -> int:
        return app.pane.query_one(LiveTable).row_count

    async def scenario(pilot, app):
        await open_pane(pilot, "dlq")
        assert shown(app) == 5
        await pilot.press("slash", *"alpha")
        await pilot.pause()
        assert shown(app) == 2
        await pilot.press("enter", "2", "4")  # the table has the focus again: digits switch panes
        await pilot.pause()
        assert shown(app) == 2  # the filter stays
        app.pane.query_one("#dlq-filter").focus()
        await pilot.press("escape")
        await pilot.pause()
        assert shown(app) == 5
    run_console(dsn, scenario)
