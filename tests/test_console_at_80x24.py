"""What an 80x24 terminal shows: the text that explains a row is read without scrolling, and
enter opens a row whose cells are cut in a dialog that shows every value whole, as data."""

from __future__ import annotations

import io
import json

import psycopg
import pytest
from rich.console import Console
from rich.text import Text
from textual.widgets import Static

from console.app.widgets.detail import DetailModal
from console.app.widgets.keybar import KeyBar
from console.app.widgets.live_table import LiveTable
from tests.console_driver import open_pane, run_console, wait_for

# Brackets that Rich would read as markup, were the text not shown as data.
ERROR = "[RETRYABLE] [bold]connection refused[/bold]: inventory.example.com:443 after 3 tries in 30 s"
DETAILS = {"name": "[red]orders[/red]", "reason": "a reason far longer than any details column: " + "x" * 120}


@pytest.fixture
def explained(conn: psycopg.Connection) -> None:
    for name in ("billing", "inventory-eu-west"):
        conn.execute("SELECT courier.create_endpoint(%s, 'http', '{\"url\": \"https://example.com/hook\"}')",
                     (name,))
    conn.execute("UPDATE courier.endpoints SET circuit_state = 'open', circuit_failure_count = 7, last_error = %s "
                 "WHERE name = 'inventory-eu-west'", (ERROR,))
    conn.execute("INSERT INTO courier.event_log (event_type, endpoint_id, actor, details) "
                 "SELECT 'endpoint.created', id, 'ops', %s FROM courier.endpoints WHERE name = 'billing'",
                 (json.dumps(DETAILS),))


def shown(widget: Static, width: int = 200) -> str:
    """What a Static shows, as plain text (markup read, had any been)."""
    console = Console(width=width, record=True, file=io.StringIO())
    content = widget.content
    console.print(Text.from_markup(content) if isinstance(content, str) else content)
    return console.export_text()


def visible_columns(table: LiveTable) -> dict[str, tuple[int, int]]:
    """Each column's (start, end) cell on screen, for the columns that fit the table's width."""
    spans, x = {}, 0
    for key, column in table.columns.items():
        width = column.get_render_width(table)
        if x + width <= table.scrollable_content_region.width:
            spans[key.value] = (x, x + width)
        x += width
    return spans


def test_endpoints_show_the_last_error_beside_the_circuit_at_80_columns_and_enter_opens_it_whole(dsn, explained):
    async def scenario(pilot, app):
        await open_pane(pilot, "endpoints")
        table = app.pane.query_one(LiveTable)
        await wait_for(pilot, lambda: table.row_count == 2, what="the endpoints")
        await pilot.pause(0.3)
        columns = visible_columns(table)
        assert list(columns)[:5] == ["name", "circuit", "last_error", "failures", "pending"]
        start, end = columns["last_error"]
        assert end - start - 2 >= 30  # about thirty characters of the error, not `las`
        table.move_cursor(row=table.get_row_index("inventory-eu-west"))
        await pilot.press("enter")
        modal = await wait_for(pilot, lambda: isinstance(app.screen, DetailModal) and app.screen,
                               what="the endpoint's detail")
        fields = shown(modal.query_one("#detail-fields", Static))
        assert ERROR in fields  # whole, brackets and all
        assert "https://example.com/hook" in shown(modal.query_one("#detail-config", Static))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, DetailModal), what="the dialog to close")
    run_console(dsn, scenario, size=(80, 24))


def test_the_endpoints_key_bar_shows_pause_and_every_other_key_whole_at_80_columns(dsn, conn, explained):
    async def scenario(pilot, app):
        await open_pane(pilot, "endpoints")
        bar = app.screen.query_one(KeyBar)
        await wait_for(pilot, lambda: "Enable" in shown(bar), what="the endpoints' keys")
        text = shown(bar).strip()
        for key in ("e Enable", "d Disable", "c Reset", "p Retry", "l Limit", "n New", "z Pause", "? Help", "q Quit"):
            assert key in text, (key, text)
        assert len(text) <= bar.content_region.width == 78  # drawn whole, not cut at the edge
        table = app.pane.query_one(LiveTable)
        await wait_for(pilot, lambda: table.row_count == 2, what="the endpoints")
        table.move_cursor(row=table.get_row_index("billing"))
        await pilot.press("z")  # the key the bar names does what it says
        await wait_for(pilot, lambda: conn.execute("SELECT paused_at IS NOT NULL FROM courier.endpoints "
                                                   "WHERE name = 'billing'").fetchone()[0], what="billing to pause")
    run_console(dsn, scenario, size=(80, 24))


def test_enter_on_an_event_opens_its_details_whole(dsn, explained):
    async def scenario(pilot, app):
        await open_pane(pilot, "events")
        table = app.pane.query_one(LiveTable)
        await wait_for(pilot, lambda: table.row_count >= 1, what="the events")
        await pilot.pause(0.3)
        assert "details" in visible_columns(table)  # cut to the width left, with an ellipsis
        await pilot.press("enter")
        modal = await wait_for(pilot, lambda: isinstance(app.screen, DetailModal) and app.screen,
                               what="the event's detail")
        details = shown(modal.query_one("#detail-details", Static))
        assert '"[red]orders[/red]"' in details
        assert "x" * 60 in details.replace("\n", "").replace(" ", "")
        assert "endpoint.created" in shown(modal.query_one("#detail-fields", Static))
    run_console(dsn, scenario, size=(80, 24))


def test_the_config_example_is_a_placeholder_not_text_to_type_in_front_of(dsn):
    from textual.widgets import TextArea

    from console.app.widgets.endpoint_forms import CONFIG_EXAMPLES, CreateEndpointForm

    async def scenario(pilot, app):
        await open_pane(pilot, "endpoints")
        await pilot.press("n")
        form = await wait_for(pilot, lambda: isinstance(app.screen, CreateEndpointForm) and app.screen,
                              what="the form")
        config = form.query_one("#config", TextArea)
        assert config.text == ""
        assert str(config.placeholder) == CONFIG_EXAMPLES["http"]
        config.focus()
        await pilot.press(*"{}")
        assert config.text == "{}"
    run_console(dsn, scenario, size=(80, 24))


def test_the_analytics_empty_state_shows_no_stray_backslashes(dsn):
    async def scenario(pilot, app):
        await open_pane(pilot, "analytics")
        text = shown(app.pane.query_one("#analytics-empty", Static))
        assert "No analytics yet" in text
        assert "\\" not in text
    run_console(dsn, scenario, size=(80, 24))


def test_the_help_says_esc_closes_it(dsn):
    from console.app.widgets.help import HelpScreen

    async def scenario(pilot, app):
        await pilot.press("question_mark")
        screen = await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen, what="the help")
        assert "esc" in str(screen.query_one("VerticalScroll").border_subtitle)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), what="the help to close")
    run_console(dsn, scenario, size=(80, 24))


TOPICS = [f"warehouse-{region}-orders" for region in ("eu-west", "eu-central", "us-east", "us-west", "ap-south")]
WORKER = "[bold]ingest-host-eu-west-1.internal.example.com[/bold]:31337:7f3a2c9e"


def test_enter_on_a_token_opens_its_scopes_whole_and_never_its_secret(dsn, conn):
    from sqlkit import tokens

    secret = tokens.create_token(conn, "pickers", topics=TOPICS, endpoints=["billing"], actions=["consume"])
    stored_hash = conn.execute("SELECT secret_hash FROM courier.api_tokens WHERE name = 'pickers'").fetchone()[0]

    async def scenario(pilot, app):
        await open_pane(pilot, "tokens")
        table = app.pane.query_one(LiveTable)
        await wait_for(pilot, lambda: table.row_count == 1, what="the token")
        await pilot.pause(0.3)
        start, end = visible_columns(table).get("topics", (0, 0))
        assert end - start < len(", ".join(TOPICS))  # cut at 80 columns
        await pilot.press("enter")
        modal = await wait_for(pilot, lambda: isinstance(app.screen, DetailModal) and app.screen,
                               what="the token's detail")
        fields = shown(modal.query_one("#detail-fields", Static))
        assert ", ".join(TOPICS) in " ".join(fields.split())
        assert "consume" in fields and "billing" in fields and "never" in fields
        screen = app.export_screenshot()
        for leak in (secret, secret[len(tokens.PREFIX):], stored_hash.hex()):
            assert leak not in fields and leak not in screen
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, DetailModal), what="the dialog to close")
        await pilot.press("o")
        await wait_for(pilot, lambda: isinstance(app.screen, DetailModal), what="o to open it too")
    run_console(dsn, scenario, size=(80, 24))


def test_enter_on_a_worker_opens_it_whole_as_data(dsn, conn):
    conn.execute("INSERT INTO courier.workers (worker_id, hostname, pid, concurrency, in_flight, delivered, failed, "
                 "state, started_at, last_heartbeat) VALUES (%s, 'ingest-host-eu-west-1', 31337, 32, 3, 51234, 118, "
                 "'running', now() - interval '1 hour', now())", (WORKER,))

    async def scenario(pilot, app):
        await open_pane(pilot, "workers")
        table = app.pane.query_one(LiveTable)
        await wait_for(pilot, lambda: table.row_count == 1, what="the worker")
        await pilot.pause(0.3)
        assert table.columns["worker"].get_render_width(table) - 2 < len(WORKER) or \
            "seen" not in visible_columns(table)  # the id is cut, or pushes columns off the right edge
        await pilot.press("enter")
        modal = await wait_for(pilot, lambda: isinstance(app.screen, DetailModal) and app.screen,
                               what="the worker's detail")
        widget = modal.query_one("#detail-fields", Static)
        fields = shown(widget)
        assert WORKER in fields  # whole, brackets and all
        # and on screen: folded at the dialog's edge, not cut with an ellipsis
        assert WORKER in "".join(line.strip() for line in shown(widget, widget.content_region.width).splitlines())
        assert "ingest-host-eu-west-1" in fields and "31337" in fields and "51234" in fields
    run_console(dsn, scenario, size=(80, 24))


def test_enter_on_an_overview_endpoint_opens_its_row_whole(dsn, conn):
    name = "inventory-eu-west-1.warehouse.example.com-orders-and-returns"
    conn.execute("SELECT courier.create_endpoint(%s, 'http', '{\"url\": \"https://example.com/hook\"}')", (name,))

    async def scenario(pilot, app):
        await open_pane(pilot, "overview")
        table = app.pane.query_one("#overview-endpoints", LiveTable)
        await wait_for(pilot, lambda: table.row_count == 1, what="the endpoint")
        await pilot.pause(0.3)
        assert "rate" not in visible_columns(table)  # the name pushes the last columns off the right edge
        await pilot.press("enter")
        modal = await wait_for(pilot, lambda: isinstance(app.screen, DetailModal) and app.screen,
                               what="the endpoint's detail")
        fields = shown(modal.query_one("#detail-fields", Static))
        assert name in fields
        assert "http" in fields and "closed" in fields
    run_console(dsn, scenario, size=(80, 24))
